-- ListReservations pages by (created_at, reservation_id) within an order, or within a
-- caller's reservations. `IF NOT EXISTS`: on a large table, build them first by hand with
-- CREATE INDEX CONCURRENTLY under these names, and this migration finds them done
-- (docs/operations.md).
CREATE INDEX IF NOT EXISTS reservations_by_order
    ON reservations (order_id, created_at, reservation_id);
CREATE INDEX IF NOT EXISTS reservations_by_caller
    ON reservations (caller, created_at, reservation_id);
