-- floor: 15 (additive: storage parameters only; every release reads and writes as before)
--
-- Two tables write each row twice in quick succession: a claimed idempotency key gets its
-- outcome in the same transaction, and an outbox event gets its position from the sequencer
-- a few milliseconds later. With full pages the second version went to another page, which
-- PostgreSQL logs as a lock on the old version plus the whole new row. With room left on the
-- page it stays there: the key's update is then a HOT update (no new index entries), and the
-- update of either is logged as only the bytes that changed. Applies to pages written from
-- now on; taking the lock (SHARE UPDATE EXCLUSIVE) does not stop reads or writes.
--
-- The outbox keeps half of each page free (an event and its positioned version are the same
-- size); a key's stored outcome is several times its claim, so its table keeps 70 % free.
ALTER TABLE outbox SET (fillfactor = 50);
ALTER TABLE idempotency_keys SET (fillfactor = 30);
