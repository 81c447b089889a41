-- Every change to a SKU's stock bumps its version. Events of conflicting transactions can
-- reach the stream in another order than they committed (positions follow transaction ids,
-- which are taken at a transaction's first write); the version tells a consumer which of two
-- levels of one SKU is the newer one.
ALTER TABLE stock ADD COLUMN version bigint NOT NULL DEFAULT 1 CHECK (version >= 1);
