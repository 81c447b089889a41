-- The service's one-request Reserve transaction (crates/inventory-postgres/src/reserve.rs),
-- statement for statement, for pgbench: the raw-SQL ceiling the service is measured
-- against. No lease, no gRPC: only what PostgreSQL must do for one reservation (locking
-- the SKU's total and its location rows, reading the locations, moving both rows).
--   pgbench -n -M prepared -D skus=N -f reserve_one.sql
\set n random(0, :skus - 1)
\set k random(1, 1000000000000)
BEGIN;
INSERT INTO idempotency_keys (caller, key, operation, fingerprint)
    VALUES ('pgbench', 'k' || :client_id::text || '-' || :k::text, 'Reserve', sha256(('k' || :k::text)::bytea))
    ON CONFLICT (caller, key) DO NOTHING;
SAVEPOINT lines;
SELECT on_hand, reserved, version, fence_token FROM stock
    WHERE sku = 'P-' || :n::text FOR UPDATE;
SELECT sku, location_id, on_hand, reserved, version FROM stock_locations
    WHERE sku = 'P-' || :n::text FOR UPDATE;
SELECT location_id, priority, active FROM locations;
UPDATE stock
    SET reserved = reserved + 1, fence_token = fence_token + 1, version = version + 1, updated_at = now()
    WHERE sku = 'P-' || :n::text AND on_hand - reserved >= 1
    RETURNING on_hand AS s_on_hand, reserved AS s_reserved, version AS s_version \gset
UPDATE stock_locations
    SET reserved = reserved + 1, fence_token = fence_token + 1, version = :s_version, updated_at = now()
    WHERE sku = 'P-' || :n::text AND location_id = 'default' AND on_hand - reserved >= 1;
RELEASE SAVEPOINT lines;
INSERT INTO reservations (reservation_id, order_id, state, caller, idempotency_key, expires_at)
    VALUES (gen_random_uuid(), 'o-' || :k::text, 'HELD', 'pgbench', 'k' || :client_id::text || '-' || :k::text,
            now() + make_interval(secs => 3600))
    RETURNING reservation_id AS rid, created_at, expires_at \gset
INSERT INTO reservation_lines (reservation_id, sku, location_id, quantity, fence_token)
    SELECT :rid::uuid, * FROM unnest(ARRAY['P-' || :n::text], ARRAY['default'], ARRAY[1::bigint],
        ARRAY[1::bigint]);
INSERT INTO outbox (event_id, event_type, reservation_id, payload)
    VALUES (gen_random_uuid(), 'RESERVATION_HELD', :rid::uuid,
            jsonb_build_object('order_id', 'o-' || :k::text, 'state', 'HELD',
                'lines', jsonb_build_array(jsonb_build_object('sku', 'P-' || :n::text, 'quantity', 1,
                    'held', 1, 'confirmed', 0, 'released', 0)),
                'levels', jsonb_build_array(jsonb_build_object('sku', 'P-' || :n::text, 'on_hand', 1000000000,
                    'reserved', 1, 'version', 1))));
INSERT INTO stock_movements
    (sku, version, kind, on_hand_delta, reserved_delta, on_hand, reserved, reason, actor,
     reservation_id, order_id, idempotency_key, location_id)
    SELECT * FROM unnest(ARRAY['P-' || :n::text], ARRAY[:s_version::bigint], ARRAY['HELD'],
        ARRAY[0::bigint], ARRAY[1::bigint], ARRAY[:s_on_hand::bigint], ARRAY[:s_reserved::bigint],
        ARRAY[''], ARRAY['pgbench'], ARRAY[:rid::uuid], ARRAY['o-' || :k::text],
        ARRAY['k' || :client_id::text || '-' || :k::text], ARRAY['default']);
UPDATE idempotency_keys
    SET outcome = jsonb_build_object('outcome', 'held', 'reservation', jsonb_build_object(
        'reservation_id', :rid::uuid, 'order_id', 'o-' || :k::text, 'lines', jsonb_build_array(jsonb_build_array('P-' || :n::text, 1)),
        'created_at_micros', 0, 'expires_at_micros', 0))
    WHERE caller = 'pgbench' AND key = 'k' || :client_id::text || '-' || :k::text;
COMMIT;
