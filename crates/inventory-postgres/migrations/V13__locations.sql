-- Stock at several locations. `stock` keeps each SKU's total, its lease fence and its version
-- (one per movement, whatever location it moved); `stock_locations` keeps the SKU's units at
-- each location, and the totals are their sums. A SKU's `stock` row is the lock of all its
-- location rows: every writer locks it before it reads or changes any of them.
--
-- The tables this changes are locked up front, all at once, so the upgrade cannot deadlock
-- with a request that reads one of them and then writes another (the operations guide says
-- to stop every replica first; this holds even if one was left running).
LOCK TABLE stock, reservation_lines, stock_movements, outbox IN ACCESS EXCLUSIVE MODE;

CREATE TABLE locations (
    location_id  text        PRIMARY KEY CHECK (location_id ~ '^[a-z0-9-]{1,32}$'),
    priority     integer     NOT NULL DEFAULT 0,
    active       boolean     NOT NULL DEFAULT true,
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);
INSERT INTO locations (location_id) VALUES ('default');

CREATE TABLE stock_locations (
    sku          text        NOT NULL REFERENCES stock,
    location_id  text        NOT NULL REFERENCES locations,
    on_hand      bigint      NOT NULL CHECK (on_hand BETWEEN 0 AND 1000000000000),
    reserved     bigint      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    -- The SKU's version of the last change at this location.
    version      bigint      NOT NULL CHECK (version >= 1),
    -- The fencing token of the last Reserve that held units here (never above the SKU's).
    fence_token  bigint      NOT NULL DEFAULT 0 CHECK (fence_token >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT stock_locations_reserved_within_on_hand CHECK (reserved <= on_hand),
    PRIMARY KEY (sku, location_id)
);

-- Everything stocked so far was at the one location there was.
INSERT INTO stock_locations (sku, location_id, on_hand, reserved, version, fence_token)
SELECT sku, 'default', on_hand, reserved, version, fence_token FROM stock;

-- A reservation line has one row per location its units come from.
ALTER TABLE reservation_lines ADD COLUMN location_id text NOT NULL DEFAULT 'default';
ALTER TABLE reservation_lines DROP CONSTRAINT reservation_lines_pkey;
ALTER TABLE reservation_lines ADD PRIMARY KEY (reservation_id, sku, location_id);

-- Each movement is one location's change; the ledger's `on_hand`/`reserved` are that
-- location's level. Every movement before this upgrade was at `default`.
ALTER TABLE stock_movements ADD COLUMN location_id text NOT NULL DEFAULT 'default';
ALTER TABLE stock_movements DROP CONSTRAINT stock_movements_kind_check;
ALTER TABLE stock_movements ADD CONSTRAINT stock_movements_kind_check CHECK (kind IN (
    'OPENING', 'ADJUSTED', 'SET', 'HELD', 'CONFIRMED', 'RELEASED', 'EXPIRED', 'TRANSFERRED'))
    NOT VALID;

ALTER TABLE outbox DROP CONSTRAINT outbox_event_type_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_event_type_check CHECK (event_type IN (
    'STOCK_ADJUSTED', 'RESERVATION_HELD', 'RESERVATION_CONFIRMED',
    'RESERVATION_RELEASED', 'RESERVATION_EXPIRED', 'RESERVATION_EXTENDED',
    'RESERVATION_PARTIALLY_CONFIRMED', 'RESERVATION_PARTIALLY_RELEASED',
    'OUT_OF_STOCK', 'BACK_IN_STOCK', 'STOCK_TRANSFERRED')) NOT VALID;

-- The planner's statistics for the new table, before the first Reserve reads it.
ANALYZE stock_locations;
