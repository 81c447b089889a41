-- Events are positioned in `sequence` order among committed ones (see events.rs): a writer
-- takes its sequence after locking the stock rows it changes, so for every SKU sequence order
-- is commit order. Transaction ids are not: a transaction gets its xid at its first write,
-- which can come before a rival that commits earlier on the same SKU. This relies on the
-- identity behind `outbox.sequence` handing out values in call order across sessions, which
-- it does with its default `CACHE 1` (V1 sets no cache); a per-session cache would break it.
DROP INDEX outbox_awaiting_position;
CREATE INDEX outbox_awaiting_position ON outbox (sequence) WHERE position IS NULL;
