-- CancelOrder leaves a tombstone: from its commit on, a Reserve for the order is refused.
-- Kept at least as long as idempotency keys (pruned with them, by `cancelled_at`).
CREATE TABLE cancelled_orders (
    caller        text        NOT NULL,
    order_id      text        NOT NULL CHECK (length(order_id) BETWEEN 1 AND 128),
    reason        text        NOT NULL,
    cancelled_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (caller, order_id)
);
CREATE INDEX cancelled_orders_by_time ON cancelled_orders (cancelled_at);
