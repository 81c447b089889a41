//! SQL for the `idempotency_keys` table.
//!
//! Invariant relied on: the primary key `(caller, key)`. The claim is an insert that blocks
//! while another open transaction holds the same key, so two requests with one key never both
//! execute: the second waits for the first to commit (then replays its outcome) or to roll
//! back (then executes itself).

use deadpool_postgres::Transaction;
use inventory_core::{command::Fingerprint, domain::IdempotencyKey};

const CLAIM: &str = "
    INSERT INTO idempotency_keys (caller, key, operation, fingerprint)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (caller, key) DO NOTHING";

const READ: &str = "
    SELECT fingerprint, outcome FROM idempotency_keys WHERE caller = $1 AND key = $2";

const RECORD_OUTCOME: &str = "
    UPDATE idempotency_keys SET outcome = $3 WHERE caller = $1 AND key = $2";

/// The record a key already has.
#[derive(Debug)]
pub(crate) struct Existing {
    pub fingerprint: Vec<u8>,
    pub outcome: serde_json::Value,
}

/// Claims the key for this transaction; `Ok(None)` when the key was free (the caller now
/// executes and must [`record_outcome`]), or the committed record that holds it.
pub(crate) async fn claim(
    tx: &Transaction<'_>,
    caller: &str,
    key: &IdempotencyKey,
    operation: &str,
    fingerprint: &Fingerprint,
) -> Result<Option<Existing>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(CLAIM).await?;
    let fingerprint: &[u8] = fingerprint.as_bytes();
    let inserted = tx
        .execute(
            &statement,
            &[&caller, &key.as_str(), &operation, &fingerprint],
        )
        .await?;
    if inserted == 1 {
        return Ok(None);
    }
    let statement = tx.prepare_cached(READ).await?;
    let row = tx.query_one(&statement, &[&caller, &key.as_str()]).await?;
    Ok(Some(Existing {
        fingerprint: row.try_get(0)?,
        // Another transaction sees the row only after it committed with its outcome set.
        outcome: row.try_get(1)?,
    }))
}

pub(crate) async fn record_outcome(
    tx: &Transaction<'_>,
    caller: &str,
    key: &IdempotencyKey,
    outcome: &serde_json::Value,
) -> Result<(), tokio_postgres::Error> {
    let statement = tx.prepare_cached(RECORD_OUTCOME).await?;
    tx.execute(&statement, &[&caller, &key.as_str(), outcome])
        .await?;
    Ok(())
}
