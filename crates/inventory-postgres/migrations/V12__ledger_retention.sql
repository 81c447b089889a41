-- With LEDGER_RETENTION, the oldest movements of a SKU are pruned; this records through which
-- version, so the verifier still proves the rest of the ledger dense (a lost movement is never
-- taken for a pruned one).
CREATE TABLE ledger_pruned (
    sku              text   PRIMARY KEY,
    through_version  bigint NOT NULL CHECK (through_version >= 1)
);
