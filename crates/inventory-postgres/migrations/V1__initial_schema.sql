-- Stock, reservations, idempotency records and the outbox.
--
-- The constraints here are the last line of defence: whatever the service gets wrong,
-- PostgreSQL refuses a row with negative availability.

CREATE TABLE stock (
    sku          text        PRIMARY KEY
                 CHECK (sku ~ '^[A-Za-z0-9._:-]{1,64}$'),
    on_hand      bigint      NOT NULL CHECK (on_hand BETWEEN 0 AND 1000000000000),
    reserved     bigint      NOT NULL DEFAULT 0 CHECK (reserved >= 0),
    -- Highest fencing token a lease holder has written with. A write carrying a token that is
    -- not strictly greater is from a stale holder and changes nothing.
    fence_token  bigint      NOT NULL DEFAULT 0 CHECK (fence_token >= 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT stock_reserved_within_on_hand CHECK (reserved <= on_hand)
);

-- One row per idempotency key and caller. The row is claimed (inserted) at the start of the
-- transaction that does the work, so a concurrent request with the same key blocks on the
-- primary key until the first commits, then reads its outcome. Only final outcomes are
-- stored; a transaction that fails transiently rolls back its claim with everything else.
CREATE TABLE idempotency_keys (
    caller       text        NOT NULL DEFAULT '',
    key          text        NOT NULL CHECK (length(key) BETWEEN 1 AND 128),
    operation    text        NOT NULL,
    fingerprint  bytea       NOT NULL CHECK (length(fingerprint) = 32),
    -- The stored outcome, replayed on retry. NULL only inside the claiming transaction.
    outcome      jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (caller, key)
);
CREATE INDEX idempotency_keys_created_at ON idempotency_keys (created_at);

CREATE TABLE reservations (
    reservation_id   uuid        PRIMARY KEY,
    order_id         text        NOT NULL CHECK (length(order_id) BETWEEN 1 AND 128),
    state            text        NOT NULL
                     CHECK (state IN ('HELD', 'CONFIRMED', 'RELEASED', 'EXPIRED')),
    caller           text        NOT NULL DEFAULT '',
    idempotency_key  text        NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    expires_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CHECK (expires_at > created_at),
    UNIQUE (caller, idempotency_key)
);
-- The sweeper's work list: only holds, oldest expiry first.
CREATE INDEX reservations_held_by_expiry ON reservations (expires_at) WHERE state = 'HELD';

CREATE TABLE reservation_lines (
    reservation_id  uuid    NOT NULL REFERENCES reservations ON DELETE CASCADE,
    sku             text    NOT NULL REFERENCES stock,
    quantity        bigint  NOT NULL CHECK (quantity BETWEEN 1 AND 1000000),
    -- The fencing token this line's stock change was accepted with.
    fence_token     bigint  NOT NULL,
    PRIMARY KEY (reservation_id, sku)
);
CREATE INDEX reservation_lines_sku ON reservation_lines (sku);

-- Events written in the same transaction as the change they describe. `tx_id` records the
-- writing transaction so readers can hold back events of transactions still in flight
-- (sequences are allocated before commit and may become visible out of order).
CREATE TABLE outbox (
    sequence        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id        uuid        NOT NULL UNIQUE,
    event_type      text        NOT NULL CHECK (event_type IN (
                        'STOCK_ADJUSTED', 'RESERVATION_HELD', 'RESERVATION_CONFIRMED',
                        'RESERVATION_RELEASED', 'RESERVATION_EXPIRED')),
    reservation_id  uuid,
    sku             text,
    payload         jsonb       NOT NULL,
    occurred_at     timestamptz NOT NULL DEFAULT now(),
    tx_id           xid8        NOT NULL DEFAULT pg_current_xact_id(),
    CHECK ((reservation_id IS NULL) <> (sku IS NULL))
);
CREATE INDEX outbox_occurred_at ON outbox (occurred_at);
