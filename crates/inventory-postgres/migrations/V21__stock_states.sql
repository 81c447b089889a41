-- floor: 15 (additive: constant-default columns, a new table, wider kind and event checks;
-- the checks added here refuse what a release before them could get wrong once stock states
-- are in use, instead of letting it through)
--
-- Stock states: beside `on_hand` and `reserved`, each (SKU, location) keeps its unsellable
-- units (`damaged`, `quality_control`, part of `on_hand`), its policy (`safety_stock`, a
-- level kept back from sale, and `backorder_limit`, how many units may be promised beyond
-- what is on hand), and its waiting demand: `backordered` (units of held lines waiting for
-- stock) and `preordered` (units of held lines pegged to an incoming receipt), and
-- `incoming` (the open remainder of its receipts). `stock` keeps each SKU's sums, as for
-- `on_hand` and `reserved`.
--
-- A release before this one reads none of it. What it could get wrong is refused by checks:
-- holding or removing an unsellable unit (`*_sound_units`), settling a reservation that still
-- waits for units (`reservations_waiting_only_while_held`), releasing or confirming waiting
-- units as if they were held (`reservation_lines_waiting_within_quantity`). It may sell into
-- a safety stock while it runs; the operations guide says to set policies once a rollout is
-- done.
LOCK TABLE stock, stock_locations, reservations, reservation_lines, stock_movements, outbox
    IN ACCESS EXCLUSIVE MODE;

ALTER TABLE stock
    ADD COLUMN damaged         bigint NOT NULL DEFAULT 0 CHECK (damaged >= 0),
    ADD COLUMN quality_control bigint NOT NULL DEFAULT 0 CHECK (quality_control >= 0),
    ADD COLUMN safety_stock    bigint NOT NULL DEFAULT 0 CHECK (safety_stock >= 0),
    ADD COLUMN backorder_limit bigint NOT NULL DEFAULT 0 CHECK (backorder_limit >= 0),
    ADD COLUMN backordered     bigint NOT NULL DEFAULT 0 CHECK (backordered >= 0),
    ADD COLUMN preordered      bigint NOT NULL DEFAULT 0 CHECK (preordered >= 0),
    ADD COLUMN incoming        bigint NOT NULL DEFAULT 0 CHECK (incoming >= 0);
ALTER TABLE stock ADD CONSTRAINT stock_sound_units
    CHECK (reserved + damaged + quality_control <= on_hand) NOT VALID;

ALTER TABLE stock_locations
    ADD COLUMN damaged         bigint NOT NULL DEFAULT 0 CHECK (damaged >= 0),
    ADD COLUMN quality_control bigint NOT NULL DEFAULT 0 CHECK (quality_control >= 0),
    ADD COLUMN safety_stock    bigint NOT NULL DEFAULT 0 CHECK (safety_stock >= 0),
    ADD COLUMN backorder_limit bigint NOT NULL DEFAULT 0 CHECK (backorder_limit >= 0),
    ADD COLUMN backordered     bigint NOT NULL DEFAULT 0 CHECK (backordered >= 0),
    ADD COLUMN preordered      bigint NOT NULL DEFAULT 0 CHECK (preordered >= 0),
    ADD COLUMN incoming        bigint NOT NULL DEFAULT 0 CHECK (incoming >= 0);
-- Held units are sound units: a damaged unit is never reserved, and a held one never moved
-- out of sellable.
ALTER TABLE stock_locations ADD CONSTRAINT stock_locations_sound_units
    CHECK (reserved + damaged + quality_control <= on_hand) NOT VALID;

-- Incoming receipts (purchase order lines). `preordered` units of held lines are pegged to
-- a receipt: at most what it had still to bring when they were pegged (a Reserve checks
-- that), never more than its quantity (checked here). Received units fill them first; a
-- cancelled receipt keeps its pegged units (at risk) until they are filled from other stock
-- or released.
CREATE TABLE receipts (
    receipt_id   text        PRIMARY KEY CHECK (receipt_id ~ '^[A-Za-z0-9._:-]{1,64}$'),
    sku          text        NOT NULL REFERENCES stock,
    location_id  text        NOT NULL REFERENCES locations,
    quantity     bigint      NOT NULL CHECK (quantity BETWEEN 1 AND 1000000000),
    received     bigint      NOT NULL DEFAULT 0 CHECK (received >= 0),
    preordered   bigint      NOT NULL DEFAULT 0 CHECK (preordered >= 0),
    expected_at  timestamptz NOT NULL,
    state        text        NOT NULL DEFAULT 'OPEN'
                 CHECK (state IN ('OPEN', 'RECEIVED', 'CANCELLED')),
    reason       text        NOT NULL DEFAULT '',
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT receipts_preordered_within_quantity CHECK (preordered <= quantity)
);
-- Pre-orders take open receipts earliest first; ATP reads them by SKU.
CREATE INDEX receipts_open_by_sku ON receipts (sku, location_id, expected_at)
    WHERE state = 'OPEN';
CREATE INDEX receipts_by_sku ON receipts (sku, receipt_id);

-- Waiting units of a line at a location: backordered (no receipt) or pre-ordered (pegged to
-- `receipt_id`). A line's units are `held + confirmed + released + backordered +
-- preordered = quantity`; a reservation's `waiting` is its lines' waiting units.
ALTER TABLE reservation_lines
    ADD COLUMN backordered bigint NOT NULL DEFAULT 0 CHECK (backordered >= 0),
    ADD COLUMN preordered  bigint NOT NULL DEFAULT 0 CHECK (preordered >= 0),
    ADD COLUMN receipt_id  text;
ALTER TABLE reservation_lines ADD CONSTRAINT reservation_lines_waiting_within_quantity
    CHECK (confirmed + released + backordered + preordered <= quantity) NOT VALID;
-- The fill queue: waiting lines of a (SKU, location). `IF NOT EXISTS`: on a large table,
-- build it first by hand with `CREATE INDEX CONCURRENTLY` (the same definition), and this
-- migration finds it there.
CREATE INDEX IF NOT EXISTS reservation_lines_waiting ON reservation_lines (sku, location_id)
    WHERE backordered > 0 OR preordered > 0;

ALTER TABLE reservations ADD COLUMN waiting bigint NOT NULL DEFAULT 0 CHECK (waiting >= 0);
ALTER TABLE reservations ADD CONSTRAINT reservations_waiting_only_while_held
    CHECK (state = 'HELD' OR waiting = 0) NOT VALID;

-- The ledger: each movement's state deltas, and the location's state levels right after
-- it. Levels are NULL in movements written before this migration (every state was 0 then);
-- a release before this one writes none, and `inventory_movement_states` fills them from
-- the location's row, which such a release never moves (its state deltas are 0).
ALTER TABLE stock_movements
    ADD COLUMN damaged_delta         bigint NOT NULL DEFAULT 0,
    ADD COLUMN quality_control_delta bigint NOT NULL DEFAULT 0,
    ADD COLUMN safety_stock_delta    bigint NOT NULL DEFAULT 0,
    ADD COLUMN backorder_limit_delta bigint NOT NULL DEFAULT 0,
    ADD COLUMN backordered_delta     bigint NOT NULL DEFAULT 0,
    ADD COLUMN preordered_delta      bigint NOT NULL DEFAULT 0,
    ADD COLUMN incoming_delta        bigint NOT NULL DEFAULT 0,
    ADD COLUMN damaged               bigint,
    ADD COLUMN quality_control       bigint,
    ADD COLUMN safety_stock          bigint,
    ADD COLUMN backorder_limit       bigint,
    ADD COLUMN backordered           bigint,
    ADD COLUMN preordered            bigint,
    ADD COLUMN incoming              bigint,
    ADD COLUMN receipt_id            text;

CREATE FUNCTION inventory_movement_states() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
BEGIN
    SELECT l.damaged, l.quality_control, l.safety_stock, l.backorder_limit, l.backordered,
           l.preordered, l.incoming
    INTO NEW.damaged, NEW.quality_control, NEW.safety_stock, NEW.backorder_limit,
         NEW.backordered, NEW.preordered, NEW.incoming
    FROM stock_locations l WHERE l.sku = NEW.sku AND l.location_id = NEW.location_id;
    RETURN NEW;
END $$;
-- Fires only for a writer that does not know states: this release always writes them.
CREATE TRIGGER stock_movements_states BEFORE INSERT ON stock_movements
    FOR EACH ROW WHEN (NEW.damaged IS NULL) EXECUTE FUNCTION inventory_movement_states();

ALTER TABLE stock_movements DROP CONSTRAINT stock_movements_kind_check;
ALTER TABLE stock_movements ADD CONSTRAINT stock_movements_kind_check CHECK (kind IN (
    'OPENING', 'ADJUSTED', 'SET', 'HELD', 'CONFIRMED', 'RELEASED', 'EXPIRED', 'TRANSFERRED',
    'POLICY_SET', 'STATE_MOVED', 'RECEIPT_EXPECTED', 'RECEIVED', 'RECEIPT_CANCELLED',
    'FILLED')) NOT VALID;

ALTER TABLE outbox DROP CONSTRAINT outbox_event_type_check;
ALTER TABLE outbox ADD CONSTRAINT outbox_event_type_check CHECK (event_type IN (
    'STOCK_ADJUSTED', 'RESERVATION_HELD', 'RESERVATION_CONFIRMED',
    'RESERVATION_RELEASED', 'RESERVATION_EXPIRED', 'RESERVATION_EXTENDED',
    'RESERVATION_PARTIALLY_CONFIRMED', 'RESERVATION_PARTIALLY_RELEASED',
    'OUT_OF_STOCK', 'BACK_IN_STOCK', 'STOCK_TRANSFERRED', 'STOCK_STATE_CHANGED',
    'RESERVATION_FILLED', 'RESERVATION_PREORDER_AT_RISK')) NOT VALID;
