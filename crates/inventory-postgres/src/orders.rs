//! SQL for the `cancelled_orders` table, and the order locks that make a cancel and a
//! `Reserve` of the same order exclude each other.
//!
//! The lock is a transaction-scoped advisory lock on a hash of `(caller, order_id)`: every
//! `Reserve` takes it shared (reserves of one order never wait on each other) before it reads
//! the tombstone and before it locks any stock row; `CancelOrder` takes it exclusive before it
//! writes the tombstone. So a `Reserve` either committed before the cancel took the lock (and
//! the cancel releases its hold) or reads the tombstone the cancel committed (and is refused):
//! no hold can appear after a cancel, whatever order the calls arrive in. No row exists per
//! live order, so nothing grows with orders that are never cancelled. Two orders whose hashes
//! collide only wait on each other's cancels.
//!
//! Lock order, as everywhere: idempotency keys, then order locks (by key value), then rows.

use std::collections::HashSet;

use deadpool_postgres::Transaction;
use inventory_core::{Error, domain::OrderId};
use sha2::{Digest, Sha256};

use crate::error::from_db;

const LOCK_SHARED: &str = "SELECT pg_advisory_xact_lock_shared($1)";
const LOCK_EXCLUSIVE: &str = "SELECT pg_advisory_xact_lock($1)";

const CANCELLED_AMONG: &str = "
    SELECT c.caller, c.order_id FROM cancelled_orders c
    JOIN unnest($1::text[], $2::text[]) AS u(caller, order_id) USING (caller, order_id)";

const TOMBSTONE: &str = "
    INSERT INTO cancelled_orders (caller, order_id, reason) VALUES ($1, $2, $3)
    ON CONFLICT (caller, order_id) DO NOTHING";

/// The advisory lock key of an order.
pub(crate) fn lock_key(caller: &str, order_id: &str) -> i64 {
    let mut hash = Sha256::new();
    for part in ["inventory.order", caller, order_id] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    let digest = hash.finalize();
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// Takes the shared lock of each order (in key order, each once), then returns those of them
/// that were cancelled. Statements are pipelined in order: the read runs after every lock.
pub(crate) async fn lock_and_read_cancelled(
    tx: &Transaction<'_>,
    orders: &[(&str, &str)],
) -> Result<HashSet<(String, String)>, Error> {
    let mut keys: Vec<i64> = orders.iter().map(|(c, o)| lock_key(c, o)).collect();
    keys.sort_unstable();
    keys.dedup();
    let lock = tx.prepare_cached(LOCK_SHARED).await.map_err(from_db)?;
    let read = tx.prepare_cached(CANCELLED_AMONG).await.map_err(from_db)?;
    // One statement per order, pipelined: they run (and take their locks) in key order.
    let params: Vec<[&(dyn tokio_postgres::types::ToSql + Sync); 1]> =
        keys.iter().map(|key| [key as _]).collect();
    futures::future::try_join_all(params.iter().map(|p| tx.query_one(&lock, p)))
        .await
        .map_err(from_db)?;
    let callers: Vec<&str> = orders.iter().map(|(c, _)| *c).collect();
    let order_ids: Vec<&str> = orders.iter().map(|(_, o)| *o).collect();
    let rows = tx
        .query(&read, &[&callers, &order_ids])
        .await
        .map_err(from_db)?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(Error::internal)
}

/// Takes the exclusive lock of each of `callers`' order `order_id` (in key order) and
/// writes their tombstones.
pub(crate) async fn cancel(
    tx: &Transaction<'_>,
    callers: &[&str],
    order_id: &OrderId,
    reason: &str,
) -> Result<(), tokio_postgres::Error> {
    let mut keyed: Vec<(i64, &str)> = callers
        .iter()
        .map(|caller| (lock_key(caller, order_id.as_str()), *caller))
        .collect();
    keyed.sort_unstable();
    let lock = tx.prepare_cached(LOCK_EXCLUSIVE).await?;
    for (key, _) in &keyed {
        tx.query_one(&lock, &[key]).await?;
    }
    let tombstone = tx.prepare_cached(TOMBSTONE).await?;
    for (_, caller) in &keyed {
        tx.execute(&tombstone, &[caller, &order_id.as_str(), &reason])
            .await?;
    }
    Ok(())
}
