-- floor: 13 (additive: release 13 positions events as before, without looking at epochs)
--
-- Stream epochs. Every event position belongs to an epoch, which changes whenever the
-- stream's history can have been cut: a restore to an earlier point, a standby promoted
-- without the primary's last commits, a copy into another cluster, or by hand
-- (`inventory-server new-stream-epoch`). Positions go on from the head the restored
-- database has, so without an epoch a consumer whose cursor is past that head would take the
-- new events at the positions it already passed for the ones it saw, and skip them.
--
-- An epoch is known by a random id (never reused, whichever history a database continues)
-- and covers the positions after `starts_after` up to the next epoch's `starts_after`. The
-- sequencer, under the event stream's row lock and before it positions anything, compares
-- the cluster's system identifier and current timeline (a promotion and the end of a
-- point-in-time recovery both start a new timeline) with the ones recorded for the current
-- epoch, and starts a new epoch at the head when they differ. NULL: not recorded yet; the
-- first sequencer run adopts the values it finds.
CREATE TABLE stream_epochs (
    seq                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    epoch              bigint      NOT NULL UNIQUE CHECK (epoch > 0),
    starts_after       bigint      NOT NULL CHECK (starts_after >= 0),
    system_identifier  bigint,
    timeline           integer,
    reason             text        NOT NULL,
    started_at         timestamptz NOT NULL DEFAULT now()
);

INSERT INTO stream_epochs (epoch, starts_after, reason)
SELECT ('x' || substr(md5(gen_random_uuid()::text), 1, 15))::bit(60)::bigint + 1, 0, 'first';

-- The cluster as it is now: its system identifier and the timeline of the WAL being written.
-- NULLs where the server does not let this user read them (some managed services): the
-- sequencer then positions as before and cannot see a cut by itself.
CREATE FUNCTION inventory_cluster(OUT system_identifier bigint, OUT timeline integer)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    SELECT c.system_identifier INTO system_identifier FROM pg_control_system() c;
    timeline := ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int;
EXCEPTION WHEN OTHERS THEN
    system_identifier := NULL;
    timeline := NULL;
END
$$;
