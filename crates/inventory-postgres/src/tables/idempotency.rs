//! SQL for the `idempotency_keys` table.
//!
//! Invariant relied on: the primary key `(caller, key)`. The claim is an insert that blocks
//! while another open transaction holds the same key, so two requests with one key never both
//! execute: the second waits for the first to commit (then replays its outcome) or to roll
//! back (then executes itself).

use std::collections::{HashMap, HashSet};

use deadpool_postgres::Transaction;
use inventory_core::{
    Dependency, Error,
    command::Fingerprint,
    domain::IdempotencyKey,
    pause::{PausePoint, PausePoints},
};

use tokio_postgres::types::Json;

use crate::plumbing::error::from_db;

pub(crate) mod outcome;

const CLAIM: &str = "
    INSERT INTO idempotency_keys (caller, key, operation, fingerprint)
    VALUES ($1, $2, $3, $4)
    ON CONFLICT (caller, key) DO NOTHING";

const READ: &str = "
    SELECT fingerprint, outcome FROM idempotency_keys WHERE caller = $1 AND key = $2";

const RECORD_OUTCOME: &str = "
    UPDATE idempotency_keys SET outcome = $3 WHERE caller = $1 AND key = $2";

pub(crate) const CLAIM_MANY: &str = "
    INSERT INTO idempotency_keys (caller, key, operation, fingerprint)
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bytea[])
    ON CONFLICT (caller, key) DO NOTHING
    RETURNING caller, key";

/// Outcomes committed by earlier requests; this transaction's own claims have none yet.
pub(crate) const READ_STORED_MANY: &str = "
    SELECT k.caller, k.key, k.fingerprint, k.outcome
    FROM idempotency_keys k
    JOIN unnest($1::text[], $2::text[]) AS u(caller, key) USING (caller, key)
    WHERE k.outcome IS NOT NULL";

pub(crate) const UNCLAIM_MANY: &str = "
    DELETE FROM idempotency_keys k USING unnest($1::text[], $2::text[]) AS u(caller, key)
    WHERE k.caller = u.caller AND k.key = u.key";

pub(crate) const RECORD_OUTCOMES_MANY: &str = "
    UPDATE idempotency_keys k SET outcome = u.outcome
    FROM unnest($1::text[], $2::text[], $3::jsonb[]) AS u(caller, key, outcome)
    WHERE k.caller = u.caller AND k.key = u.key";

/// A key as `(caller, key)`.
pub(crate) type Key = (String, String);

/// A committed record: the request's fingerprint and its stored outcome.
pub(crate) type Stored = (Vec<u8>, serde_json::Value);

/// What claiming a key came to.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The key was free: this transaction executes, then must [`record`].
    Claimed,
    /// The same request already ran: its stored outcome, to replay.
    Replay(serde_json::Value),
}

impl Claim {
    /// The stored outcome to replay, read as the operation stored it; `None` when the key was
    /// free and the request executes.
    pub(crate) fn stored<T: serde::de::DeserializeOwned>(self) -> Result<Option<T>, Error> {
        match self {
            Self::Claimed => Ok(None),
            Self::Replay(outcome) => serde_json::from_value(outcome)
                .map(Some)
                .map_err(crate::tables::idempotency::outcome::unreadable),
        }
    }
}

/// Claims the key for this transaction, or finds the committed record holding it. A record of
/// a different request (other fingerprint) is [`Error::IdempotencyKeyReused`].
pub(crate) async fn claim(
    tx: &Transaction<'_>,
    pauses: &PausePoints,
    caller: &str,
    key: &IdempotencyKey,
    operation: &'static str,
    fingerprint: &Fingerprint,
) -> Result<Claim, Error> {
    let claim = tx.prepare_cached(CLAIM).await.map_err(from_db)?;
    let read = tx.prepare_cached(READ).await.map_err(from_db)?;
    let fingerprint: &[u8] = fingerprint.as_bytes();
    // The record that kept the claim from inserting can be pruned (past retention) before it
    // is read: the key is free again then, so claim it again. Twice in a row would need a
    // record to appear and vanish within one round trip, twice.
    let mut attempts = 0;
    let row = loop {
        let inserted = tx
            .execute(&claim, &[&caller, &key.as_str(), &operation, &fingerprint])
            .await
            .map_err(from_db)?;
        if inserted == 1 {
            return Ok(Claim::Claimed);
        }
        pauses.reach(PausePoint::KeyTaken).await;
        if let Some(row) = tx
            .query_opt(&read, &[&caller, &key.as_str()])
            .await
            .map_err(from_db)?
        {
            break row;
        }
        attempts += 1;
        if attempts == 3 {
            return Err(Error::unavailable(
                Dependency::Postgres,
                "an idempotency record kept vanishing while it was claimed",
            ));
        }
    };
    let stored: Vec<u8> = row.try_get(0).map_err(Error::internal)?;
    let metrics = crate::plumbing::metrics::store();
    if stored != fingerprint {
        metrics
            .conflicts
            .add(1, &crate::plumbing::metrics::operation(operation));
        return Err(Error::IdempotencyKeyReused);
    }
    metrics
        .replays
        .add(1, &crate::plumbing::metrics::operation(operation));
    tracing::debug!(operation, "replaying stored outcome");
    // Another transaction sees the row only after it committed with its outcome set.
    Ok(Claim::Replay(row.try_get(1).map_err(Error::internal)?))
}

/// Stores `outcome` on the key this transaction claimed: what a retry with the key gets back.
pub(crate) async fn record(
    tx: &Transaction<'_>,
    caller: &str,
    key: &IdempotencyKey,
    outcome: &(impl serde::Serialize + std::fmt::Debug + Sync),
) -> Result<(), Error> {
    let statement = tx.prepare_cached(RECORD_OUTCOME).await.map_err(from_db)?;
    tx.execute(&statement, &[&caller, &key.as_str(), &Json(outcome)])
        .await
        .map_err(from_db)?;
    Ok(())
}

/// Claims many keys at once (`keys`: caller, key, fingerprint; sorted, the order their row
/// locks are taken in); returns the keys this transaction claimed.
pub(crate) async fn claim_many(
    tx: &Transaction<'_>,
    keys: &[(&str, &str, &[u8])],
    operation: &'static str,
) -> Result<HashSet<Key>, Error> {
    let statement = tx.prepare_cached(CLAIM_MANY).await.map_err(from_db)?;
    let callers: Vec<&str> = keys.iter().map(|k| k.0).collect();
    let names: Vec<&str> = keys.iter().map(|k| k.1).collect();
    let fingerprints: Vec<&[u8]> = keys.iter().map(|k| k.2).collect();
    let operations = vec![operation; keys.len()];
    let rows = tx
        .query(&statement, &[&callers, &names, &operations, &fingerprints])
        .await
        .map_err(from_db)?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(Error::internal)
}

/// The committed records of whichever of `keys` have one.
pub(crate) async fn read_stored_many(
    tx: &Transaction<'_>,
    keys: &[(&str, &str, &[u8])],
) -> Result<HashMap<Key, Stored>, Error> {
    let statement = tx.prepare_cached(READ_STORED_MANY).await.map_err(from_db)?;
    let callers: Vec<&str> = keys.iter().map(|k| k.0).collect();
    let names: Vec<&str> = keys.iter().map(|k| k.1).collect();
    let rows = tx
        .query(&statement, &[&callers, &names])
        .await
        .map_err(from_db)?;
    rows.iter()
        .map(|row| {
            Ok((
                (row.try_get(0)?, row.try_get(1)?),
                (row.try_get(2)?, row.try_get(3)?),
            ))
        })
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(Error::internal)
}

/// Gives claimed keys up again (a fenced group must leave no trace).
pub(crate) async fn unclaim_many(
    tx: &Transaction<'_>,
    keys: &[(&str, &str)],
) -> Result<u64, tokio_postgres::Error> {
    if keys.is_empty() {
        return Ok(0);
    }
    let statement = tx.prepare_cached(UNCLAIM_MANY).await?;
    let callers: Vec<&str> = keys.iter().map(|k| k.0).collect();
    let names: Vec<&str> = keys.iter().map(|k| k.1).collect();
    tx.execute(&statement, &[&callers, &names]).await
}

/// Stores the outcome of every request this transaction executed (serialized as they are
/// sent, with no JSON tree built first).
pub(crate) async fn record_outcomes_many<T: serde::Serialize + std::fmt::Debug + Sync>(
    tx: &Transaction<'_>,
    records: &[(&str, &str, Json<T>)],
) -> Result<u64, tokio_postgres::Error> {
    if records.is_empty() {
        return Ok(0);
    }
    let statement = tx.prepare_cached(RECORD_OUTCOMES_MANY).await?;
    let callers: Vec<&str> = records.iter().map(|r| r.0).collect();
    let names: Vec<&str> = records.iter().map(|r| r.1).collect();
    let outcomes: Vec<&Json<T>> = records.iter().map(|r| &r.2).collect();
    tx.execute(&statement, &[&callers, &names, &outcomes]).await
}
