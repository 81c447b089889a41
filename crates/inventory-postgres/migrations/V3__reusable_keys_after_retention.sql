-- An idempotency key is guarded by `idempotency_keys` alone. Once retention prunes a key, the
-- same key is a new request (and may make a new reservation), so the reservation's copy of
-- the key is kept for tracing only, not as a second uniqueness rule.
ALTER TABLE reservations DROP CONSTRAINT reservations_caller_idempotency_key_key;
CREATE INDEX reservations_by_idempotency_key ON reservations (caller, idempotency_key);
