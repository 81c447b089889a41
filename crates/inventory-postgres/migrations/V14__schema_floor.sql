-- floor: 13 (additive: release 13 neither reads nor writes what this adds)
--
-- The schema compatibility contract. `schema_floor` holds the oldest release (a release is
-- known by the newest migration it carries) that may still write. `inventory-server migrate`
-- raises it to what its newest migration declares before applying anything, and never
-- lowers it. Every statement that moves or creates stock calls `inventory_writer_gate` with
-- its release, so a replica below the floor is refused by PostgreSQL itself, in the same
-- statement, whatever it believed when it started (SQLSTATE IV001, answered as
-- FAILED_PRECONDITION SCHEMA_TOO_NEW). Releases before this one do not call the gate: they
-- are held back by the floor of 13 they are all at or below, which is the operators' to keep
-- (see the operations guide).
CREATE TABLE schema_floor (
    singleton  boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    floor      integer     NOT NULL CHECK (floor >= 1),
    raised_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO schema_floor (floor) VALUES (13);

CREATE FUNCTION inventory_writer_gate(writer integer) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
DECLARE
    current_floor integer;
BEGIN
    SELECT floor INTO current_floor FROM schema_floor;
    IF writer < current_floor THEN
        RAISE EXCEPTION 'release % may not write: the schema floor is release %',
            writer, current_floor
            USING ERRCODE = 'IV001', DETAIL = current_floor::text,
                  HINT = 'roll this replica forward: the schema changed in a way its release would corrupt';
    END IF;
    RETURN true;
END
$$;
