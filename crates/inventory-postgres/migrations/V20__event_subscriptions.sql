-- floor: 15 (additive: a new table no earlier release reads)
--
-- Named subscriptions: a filter and a cursor kept for a consumer of the event stream. Events
-- stay until every subscription that is not idle acknowledged them (retention.rs). `reader`
-- is bumped by each reader that takes the subscription over: the reader before sees it move
-- and ends. A relay holds its subscription under a lease (`holder`, `held_until`), and each
-- of its acknowledgements names the `reader` it took, so a relay that lost the lease can no
-- longer move the cursor.
CREATE TABLE event_subscriptions (
    name text PRIMARY KEY,
    filter jsonb NOT NULL,
    acked_position bigint NOT NULL CHECK (acked_position >= 0),
    acked_epoch bigint,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    acked_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    reader bigint NOT NULL DEFAULT 0,
    holder text,
    held_until timestamptz,
    lost text
);
