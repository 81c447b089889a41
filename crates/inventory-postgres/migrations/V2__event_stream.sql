-- The event stream's positions, assigned after commit.
--
-- `outbox.sequence` is allocated when a row is inserted, so a transaction that inserted
-- sequence 100 may commit after the one that inserted 101: a consumer reading "after 100"
-- would skip it forever. Instead, a sequencer gives each committed event a `position`, only
-- once every transaction that could still add an earlier event has finished (its xid is below
-- the oldest running one), in (tx_id, sequence) order. Positions are dense and only ever
-- handed out above the current head, so "after my cursor" never misses an event.

ALTER TABLE outbox ADD COLUMN position bigint UNIQUE;
CREATE INDEX outbox_awaiting_position ON outbox (tx_id, sequence) WHERE position IS NULL;

-- One row: the highest position handed out, and how far retention has pruned. Its row lock
-- also makes sure one sequencer runs at a time across all replicas.
CREATE TABLE event_stream (
    id              int     PRIMARY KEY CHECK (id = 1),
    head            bigint  NOT NULL CHECK (head >= 0),
    pruned_through  bigint  NOT NULL CHECK (pruned_through >= 0 AND pruned_through <= head)
);
INSERT INTO event_stream (id, head, pruned_through) VALUES (1, 0, 0);
