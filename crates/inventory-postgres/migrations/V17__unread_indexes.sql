-- floor: 15 (additive: no statement of release 15 or later reads these indexes)
--
-- Every reservation wrote an entry into each of them, and the outbox's twice (the row is
-- written again when the sequencer positions it). No query looks events up by `event_id` (a
-- random UUID, unique without an index) or by `occurred_at` (retention walks events in
-- position order), nor reservations by their idempotency key (kept on the row for tracing:
-- the key itself is guarded by `idempotency_keys`, V3).
ALTER TABLE outbox DROP CONSTRAINT outbox_event_id_key;
DROP INDEX outbox_occurred_at;
DROP INDEX reservations_by_idempotency_key;
