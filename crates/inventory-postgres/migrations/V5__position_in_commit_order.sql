-- Events are positioned in `sequence` order among committed ones (see events.rs): a writer
-- takes its sequence after locking the stock rows it changes, so for every SKU sequence order
-- is commit order. Transaction ids are not: a transaction gets its xid at its first write,
-- which can come before a rival that commits earlier on the same SKU.
DROP INDEX outbox_awaiting_position;
CREATE INDEX outbox_awaiting_position ON outbox (sequence) WHERE position IS NULL;
