-- The service's coalesced Reserve transaction (crates/inventory-postgres/src/batch.rs) for a
-- batch of :batch single-unit requests on one SKU, for pgbench: the batched-SQL ceiling, the
-- same work done by PostgreSQL with nothing in between (no lease, no queue, no gRPC). Like
-- the service: every key claimed, the SKU's rows locked and the locations read, one
-- conditional UPDATE of the total and one of the location row for the batch, then
-- each request's reservation, line, event, movement and stored outcome, in array inserts.
--   pgbench -n -M prepared -D skus=N -D batch=B -f reserve_batch.sql
\set n random(0, :skus - 1)
\set k random(1, 1000000000000)
BEGIN;
INSERT INTO idempotency_keys (caller, key, operation, fingerprint)
    SELECT 'pgbench', 'k' || :client_id::text || '-' || :k::text || '-' || i::text, 'Reserve',
           sha256(('k' || :k::text || '-' || i::text)::bytea)
    FROM generate_series(1, :batch) AS i
    ON CONFLICT (caller, key) DO NOTHING;
SELECT on_hand, reserved, version, fence_token FROM stock
    WHERE sku = 'P-' || :n::text FOR UPDATE;
SELECT sku, location_id, on_hand, reserved, version FROM stock_locations
    WHERE sku = 'P-' || :n::text FOR UPDATE;
SELECT location_id, priority, active FROM locations;
UPDATE stock
    SET reserved = reserved + :batch, fence_token = fence_token + 1, version = version + :batch,
        updated_at = now()
    WHERE sku = 'P-' || :n::text AND on_hand - reserved >= :batch
    RETURNING on_hand AS s_on_hand, reserved AS s_reserved, version AS s_version \gset
UPDATE stock_locations
    SET reserved = reserved + :batch, fence_token = fence_token + 1, version = :s_version,
        updated_at = now()
    WHERE sku = 'P-' || :n::text AND location_id = 'default' AND on_hand - reserved >= :batch;
WITH batch AS (
    SELECT i, gen_random_uuid() AS rid,
           'k' || :client_id::text || '-' || :k::text || '-' || i::text AS key,
           'o-' || :k::text || '-' || i::text AS order_id
    FROM generate_series(1, :batch) AS i
), held AS (
    INSERT INTO reservations (reservation_id, order_id, state, caller, idempotency_key, expires_at)
    SELECT rid, order_id, 'HELD', 'pgbench', key, now() + make_interval(secs => 3600) FROM batch
    RETURNING 1
), lines AS (
    INSERT INTO reservation_lines (reservation_id, sku, location_id, quantity, fence_token)
    SELECT rid, 'P-' || :n::text, 'default', 1, 1 FROM batch
    RETURNING 1
), events AS (
    INSERT INTO outbox (event_id, event_type, reservation_id, payload)
    SELECT gen_random_uuid(), 'RESERVATION_HELD', rid,
           jsonb_build_object('order_id', order_id, 'state', 'HELD',
               'lines', jsonb_build_array(jsonb_build_object('sku', 'P-' || :n::text, 'quantity', 1,
                   'held', 1, 'confirmed', 0, 'released', 0)),
               'levels', jsonb_build_array(jsonb_build_object('sku', 'P-' || :n::text,
                   'on_hand', :s_on_hand::bigint, 'reserved', :s_reserved::bigint - :batch + i,
                   'version', :s_version::bigint - :batch + i)))
    FROM batch
    RETURNING 1
), movements AS (
    INSERT INTO stock_movements
        (sku, version, kind, on_hand_delta, reserved_delta, on_hand, reserved, reason, actor,
         reservation_id, order_id, idempotency_key, location_id)
    SELECT 'P-' || :n::text, :s_version::bigint - :batch + i, 'HELD', 0, 1, :s_on_hand::bigint,
           :s_reserved::bigint - :batch + i, '', 'pgbench', rid, order_id, key, 'default'
    FROM batch
    RETURNING 1
), outcomes AS (
    UPDATE idempotency_keys AS k
    SET outcome = jsonb_build_object('outcome', 'held', 'reservation', jsonb_build_object(
        'reservation_id', b.rid, 'order_id', b.order_id,
        'lines', jsonb_build_array(jsonb_build_array('P-' || :n::text, 1)),
        'created_at_micros', 0, 'expires_at_micros', 0))
    FROM batch AS b
    WHERE k.caller = 'pgbench' AND k.key = b.key
    RETURNING 1
)
SELECT (SELECT count(*) FROM held) + (SELECT count(*) FROM lines) + (SELECT count(*) FROM events)
       + (SELECT count(*) FROM movements) + (SELECT count(*) FROM outcomes) AS written;
COMMIT;
