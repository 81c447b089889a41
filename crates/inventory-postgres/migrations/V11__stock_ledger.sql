-- The stock ledger: one movement per change of a SKU's level, written in the transaction that
-- makes the change, kept for LEDGER_RETENTION (forever by default). A SKU's versions are
-- exactly its movements, and each movement's level is the previous one's plus its deltas.
CREATE TABLE stock_movements (
    sku              text        NOT NULL,
    version          bigint      NOT NULL CHECK (version >= 1),
    kind             text        NOT NULL CHECK (kind IN (
                         'OPENING', 'ADJUSTED', 'SET', 'HELD', 'CONFIRMED', 'RELEASED',
                         'EXPIRED')),
    on_hand_delta    bigint      NOT NULL,
    reserved_delta   bigint      NOT NULL,
    on_hand          bigint      NOT NULL,
    reserved         bigint      NOT NULL,
    reason           text        NOT NULL DEFAULT '',
    actor            text        NOT NULL DEFAULT '',
    reservation_id   uuid,
    order_id         text,
    idempotency_key  text,
    occurred_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (sku, version)
);
-- Retention deletes the oldest first.
CREATE INDEX stock_movements_by_time ON stock_movements (occurred_at);

-- Every SKU that exists already opens its ledger at its current level and version: the sum
-- of every change before the ledger began.
INSERT INTO stock_movements
    (sku, version, kind, on_hand_delta, reserved_delta, on_hand, reserved, reason)
SELECT sku, version, 'OPENING', on_hand, reserved, on_hand, reserved, 'ledger opened'
FROM stock WHERE version >= 1;

-- Availability events: a change that takes `available` to 0, or from 0 to more.
ALTER TABLE outbox DROP CONSTRAINT outbox_event_type_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_event_type_check CHECK (event_type IN (
    'STOCK_ADJUSTED', 'RESERVATION_HELD', 'RESERVATION_CONFIRMED',
    'RESERVATION_RELEASED', 'RESERVATION_EXPIRED', 'RESERVATION_EXTENDED',
    'RESERVATION_PARTIALLY_CONFIRMED', 'RESERVATION_PARTIALLY_RELEASED',
    'OUT_OF_STOCK', 'BACK_IN_STOCK')) NOT VALID;
