//! SQL for the `cancelled_orders` table, and the order locks that make a cancel and a
//! `Reserve` of the same order exclude each other.
//!
//! The lock is a transaction-scoped advisory lock on a hash of the order id (whoever's it is):
//! every `Reserve` takes it shared (reserves of one order never wait on each other) before it
//! reads the tombstones and before it locks any stock row; `CancelOrder` takes it exclusive
//! before it writes its tombstone. So a `Reserve` either committed before the cancel took the
//! lock (and the cancel releases its hold) or reads the tombstone the cancel committed (and is
//! refused): no hold can appear after a cancel, whatever order the calls arrive in. A caller's
//! cancel writes `(caller, order_id)`; the admin's writes `('*', order_id)`, which every
//! caller's `Reserve` of that order id reads (no caller name can be `*`), so it also stops a
//! caller whose first `Reserve` of the order is still in flight. No row exists per live order,
//! so nothing grows with orders that are never cancelled; order ids that are equal across
//! callers, or whose hashes collide, only wait on each other's cancels.
//!
//! Lock order, as everywhere: idempotency keys, then order locks (by key value), then rows.

use std::collections::HashSet;

use deadpool_postgres::Transaction;
use inventory_core::{Error, domain::OrderId};
use sha2::{Digest, Sha256};

use crate::{plumbing::error::from_db, plumbing::plans};

pub(crate) const LOCK_SHARED: &str = "SELECT pg_advisory_xact_lock_shared($1)";
const LOCK_EXCLUSIVE: &str = "SELECT pg_advisory_xact_lock($1)";

/// The tombstones that stop these `(caller, order_id)` pairs: their own, or the admin's.
pub(crate) const CANCELLED_AMONG: &str = "
    SELECT u.caller, u.order_id FROM unnest($1::text[], $2::text[]) AS u(caller, order_id)
    WHERE EXISTS (SELECT 1 FROM cancelled_orders c
                  WHERE c.order_id = u.order_id AND c.caller IN (u.caller, '*'))";

/// The caller name of the admin's tombstones: it stops every caller's orders of that id.
pub(crate) const EVERY_CALLER: &str = "*";

const TOMBSTONE: &str = "
    INSERT INTO cancelled_orders (caller, order_id, reason) VALUES ($1, $2, $3)
    ON CONFLICT (caller, order_id) DO NOTHING";

/// The advisory lock key of an order id in a tenant's namespace. Advisory locks belong to the
/// whole database, so a named tenant's orders are locked under keys of its own (the same
/// order id in two tenants never waits on the other); tenant `default` (`None`) keeps the
/// key of releases before tenants, which a rolling upgrade's old replicas take.
pub(crate) fn lock_key(space: Option<&str>, order_id: &str) -> i64 {
    let mut hash = Sha256::new();
    for part in ["inventory.order"]
        .into_iter()
        .chain(space)
        .chain([order_id])
    {
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
    space: Option<&str>,
    orders: &[(&str, &str)],
) -> Result<HashSet<(String, String)>, Error> {
    let mut keys: Vec<i64> = orders.iter().map(|(_, o)| lock_key(space, o)).collect();
    keys.sort_unstable();
    keys.dedup();
    // Both prepared at once, in one round: the locks then go out in the same poll as the
    // other step-2 statements of a batch, before its stock rows are locked.
    let (lock, read) = tokio::try_join!(
        biased;
        tx.prepare_cached(LOCK_SHARED),
        tx.prepare_cached(CANCELLED_AMONG),
    )
    .map_err(from_db)?;
    // One statement per order, then the read, all sent in one go: PostgreSQL runs them in
    // order, so the locks are taken in key order and the read sees every cancel that held one.
    let params: Vec<[&(dyn tokio_postgres::types::ToSql + Sync); 1]> =
        keys.iter().map(|key| [key as _]).collect();
    let callers: Vec<&str> = orders.iter().map(|(c, _)| *c).collect();
    let order_ids: Vec<&str> = orders.iter().map(|(_, o)| *o).collect();
    let read_params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&callers, &order_ids];
    let (_, rows) = tokio::try_join!(
        biased;
        futures::future::try_join_all(params.iter().map(|p| tx.query_one(&lock, p))),
        plans::generic(tx, tx.query(&read, &read_params)),
    )
    .map_err(from_db)?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect::<Result<_, tokio_postgres::Error>>()
        .map_err(Error::internal)
}

/// Takes the order's lock exclusively, then writes the tombstone of `caller` (a caller name,
/// or [`EVERY_CALLER`]).
pub(crate) async fn cancel(
    tx: &Transaction<'_>,
    space: Option<&str>,
    caller: &str,
    order_id: &OrderId,
    reason: &str,
) -> Result<(), tokio_postgres::Error> {
    let lock = tx.prepare_cached(LOCK_EXCLUSIVE).await?;
    tx.query_one(&lock, &[&lock_key(space, order_id.as_str())])
        .await?;
    let tombstone = tx.prepare_cached(TOMBSTONE).await?;
    tx.execute(&tombstone, &[&caller, &order_id.as_str(), &reason])
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_tenants_order_locks_are_its_own_and_defaults_are_as_before() {
        // The key of releases before tenants: the order id after a length-prefixed domain.
        let mut hash = Sha256::new();
        for part in ["inventory.order", "order-7"] {
            hash.update((part.len() as u64).to_be_bytes());
            hash.update(part.as_bytes());
        }
        let before = i64::from_be_bytes(hash.finalize()[..8].try_into().unwrap());
        assert_eq!(lock_key(None, "order-7"), before);
        assert_ne!(lock_key(Some("brand_a"), "order-7"), before);
        assert_ne!(
            lock_key(Some("brand_a"), "order-7"),
            lock_key(Some("brand_b"), "order-7")
        );
    }
}
