//! SQL for the `stock` table.
//!
//! Invariant relied on: `0 <= reserved <= on_hand <= MAX_ON_HAND` is enforced by CHECK
//! constraints, so every statement here may assume it and none can break it.

use std::collections::HashMap;

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    domain::{FenceToken, MAX_ON_HAND, Sku, StockLevel},
    rules::LockedStock,
};
use tokio_postgres::Row;

use crate::error::from_db;

const LOCK_ONE: &str = "SELECT on_hand, reserved, version FROM stock WHERE sku = $1 FOR UPDATE";

/// A SKU's first stock. Nothing comes back when another transaction created it meanwhile.
const CREATE: &str = "
    INSERT INTO stock (sku, on_hand) VALUES ($1, $2) ON CONFLICT (sku) DO NOTHING
    RETURNING on_hand, reserved, version";

/// Applies a decided adjustment. The guards repeat the rule that decided it (never below the
/// reserved units, never above the limit): should they not hold, nothing comes back.
const ADJUST: &str = "
    UPDATE stock SET on_hand = on_hand + $2, version = version + 1, updated_at = now()
    WHERE sku = $1 AND on_hand + $2 >= reserved AND on_hand + $2 <= $3
    RETURNING on_hand, reserved, version";

/// Rows are locked as the sort returns them: in SKU order, like every other writer. Byte
/// order (`COLLATE "C"`), as Rust sorts SKUs, whatever the database's collation.
/// The clock is read per row once its lock is held (outside the locking scan), so a hold
/// that waited for the lock is dated from when it could act.
const LOCK_MANY: &str = "
    WITH locked AS MATERIALIZED (
        SELECT sku, on_hand, reserved, version, fence_token FROM stock
        WHERE sku = ANY($1) ORDER BY sku COLLATE \"C\" FOR UPDATE)
    SELECT sku, clock_timestamp(), on_hand, reserved, version, fence_token FROM locked
    ORDER BY sku COLLATE \"C\"";

/// Every hold of a coalesced batch, one row per SKU. The guards repeat what the locked rows
/// showed: should they ever not hold, fewer rows change and the transaction is abandoned.
const HOLD_MANY: &str = "
    UPDATE stock s
    SET reserved = s.reserved + u.units, fence_token = u.fence, version = s.version + u.holds,
        updated_at = clock_timestamp()
    FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) AS u(sku, units, fence, holds)
    WHERE s.sku = u.sku AND s.fence_token < u.fence AND s.on_hand - s.reserved >= u.units";

/// Holds units for a lease holder: only while enough is available, and only with a fencing
/// token strictly above the last accepted one, which it then becomes. Strictly: after a Redis
/// failover two holders can be handed the same number, and only one of them may write.
const RESERVE: &str = "
    UPDATE stock
    SET reserved = reserved + $2, fence_token = $3, version = version + 1, updated_at = now()
    WHERE sku = $1 AND fence_token < $3 AND on_hand - reserved >= $2
    RETURNING on_hand, reserved, version";

const READ_WITH_FENCE: &str =
    "SELECT on_hand, reserved, version, fence_token FROM stock WHERE sku = $1";

/// Confirmed units leave the stock: both columns drop, so `available` is unchanged.
const SHIP: &str = "
    UPDATE stock
    SET on_hand = on_hand - $2, reserved = reserved - $2, version = version + 1, updated_at = now()
    WHERE sku = $1
    RETURNING on_hand, reserved, version";

/// Released or expired units go back to `available`: $2 units of $3 reservations, one
/// version each.
const UNRESERVE: &str = "
    UPDATE stock SET reserved = reserved - $2, version = version + $3, updated_at = now()
    WHERE sku = $1
    RETURNING on_hand, reserved, version";

/// Decided counts, one row each; the guard repeats the rule (never below the reserved units).
const SET_MANY: &str = "
    UPDATE stock s SET on_hand = u.on_hand, version = s.version + 1, updated_at = now()
    FROM unnest($1::text[], $2::bigint[]) AS u(sku, on_hand)
    WHERE s.sku = u.sku AND u.on_hand >= s.reserved
    RETURNING s.sku, s.on_hand, s.reserved, s.version";

const READ_MANY: &str = "SELECT sku, on_hand, reserved, version FROM stock WHERE sku = ANY($1)";

/// The SKU's row, locked until the transaction ends; `None` if there is no such SKU.
pub(crate) async fn lock(
    tx: &Transaction<'_>,
    sku: &Sku,
) -> Result<Option<StockLevel>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(LOCK_ONE).await?;
    let row = tx.query_opt(&statement, &[&sku.as_str()]).await?;
    Ok(row.map(|row| level(sku, &row)))
}

/// Creates the SKU with `on_hand` units; `None` if another transaction created it first.
pub(crate) async fn create(
    tx: &Transaction<'_>,
    sku: &Sku,
    on_hand: i64,
) -> Result<Option<StockLevel>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(CREATE).await?;
    let row = tx.query_opt(&statement, &[&sku.as_str(), &on_hand]).await?;
    Ok(row.map(|row| level(sku, &row)))
}

/// Adds `delta` units (negative: removes) to a locked row; `None` if the guards refused.
pub(crate) async fn adjust(
    tx: &Transaction<'_>,
    sku: &Sku,
    delta: i64,
) -> Result<Option<StockLevel>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(ADJUST).await?;
    let row = tx
        .query_opt(&statement, &[&sku.as_str(), &delta, &MAX_ON_HAND])
        .await?;
    Ok(row.map(|row| level(sku, &row)))
}

/// Locks the rows of `skus` in SKU order; each with the clock read once its lock was held.
pub(crate) async fn lock_many(
    tx: &Transaction<'_>,
    skus: &[&str],
) -> Result<HashMap<String, LockedStock>, Error> {
    let statement = tx.prepare_cached(LOCK_MANY).await.map_err(from_db)?;
    let rows = tx.query(&statement, &[&skus]).await.map_err(from_db)?;
    let mut locked = HashMap::with_capacity(rows.len());
    for row in &rows {
        let sku: String = row.try_get(0).map_err(Error::internal)?;
        let level = StockLevel {
            sku: Sku::parse(&sku).map_err(Error::internal)?,
            on_hand: row.try_get(2).map_err(Error::internal)?,
            reserved: row.try_get(3).map_err(Error::internal)?,
            version: row.try_get(4).map_err(Error::internal)?,
        };
        let entry = LockedStock {
            now: row.try_get(1).map_err(Error::internal)?,
            level,
            fence: FenceToken::new(row.try_get(5).map_err(Error::internal)?),
        };
        locked.insert(sku, entry);
    }
    Ok(locked)
}

/// Writes the holds of a coalesced batch, one `(sku, units, fence, holds)` per SKU; returns
/// how many rows the guards let through.
pub(crate) async fn hold_many(
    tx: &Transaction<'_>,
    per_sku: &[(&str, i64, i64, i64)],
) -> Result<u64, tokio_postgres::Error> {
    if per_sku.is_empty() {
        return Ok(0);
    }
    let statement = tx.prepare_cached(HOLD_MANY).await?;
    let skus: Vec<&str> = per_sku.iter().map(|p| p.0).collect();
    let units: Vec<i64> = per_sku.iter().map(|p| p.1).collect();
    let fences: Vec<i64> = per_sku.iter().map(|p| p.2).collect();
    let holds: Vec<i64> = per_sku.iter().map(|p| p.3).collect();
    tx.execute(&statement, &[&skus, &units, &fences, &holds])
        .await
}

/// `Some(level)` if the units were held under `fence`; `None` if the SKU is unknown, too few
/// units are available or the fence is stale (tell them apart with [`read_with_fence`]).
pub(crate) async fn reserve(
    tx: &Transaction<'_>,
    sku: &Sku,
    units: i64,
    fence: FenceToken,
) -> Result<Option<StockLevel>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(RESERVE).await?;
    let row = tx
        .query_opt(&statement, &[&sku.as_str(), &units, &fence.get()])
        .await?;
    Ok(row.map(|row| level(sku, &row)))
}

pub(crate) async fn read_with_fence(
    tx: &Transaction<'_>,
    sku: &Sku,
) -> Result<Option<(StockLevel, FenceToken)>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(READ_WITH_FENCE).await?;
    let row = tx.query_opt(&statement, &[&sku.as_str()]).await?;
    Ok(row.map(|row| (level(sku, &row), FenceToken::new(row.get(3)))))
}

/// Takes confirmed units out of stock. The CHECK constraints make an impossible request
/// (more than is reserved) an error instead of a wrong level.
pub(crate) async fn ship(
    tx: &Transaction<'_>,
    sku: &Sku,
    units: i64,
) -> Result<StockLevel, tokio_postgres::Error> {
    let statement = tx.prepare_cached(SHIP).await?;
    let row = tx.query_one(&statement, &[&sku.as_str(), &units]).await?;
    Ok(level(sku, &row))
}

/// Returns the held units of `holds` reservations to `available`; the version moves by one
/// per reservation, so each one's event can carry its own level.
pub(crate) async fn unreserve(
    tx: &Transaction<'_>,
    sku: &Sku,
    units: i64,
    holds: i64,
) -> Result<StockLevel, tokio_postgres::Error> {
    let statement = tx.prepare_cached(UNRESERVE).await?;
    let row = tx
        .query_one(&statement, &[&sku.as_str(), &units, &holds])
        .await?;
    Ok(level(sku, &row))
}

/// The stored levels of whichever of `skus` exist, in no particular order.
pub(crate) async fn read_many(
    client: &deadpool_postgres::Client,
    skus: &[Sku],
) -> Result<Vec<StockLevel>, tokio_postgres::Error> {
    let statement = client.prepare_cached(READ_MANY).await?;
    let names: Vec<&str> = skus.iter().map(Sku::as_str).collect();
    let rows = client.query(&statement, &[&names]).await?;
    rows.iter()
        .map(|row| {
            let sku: &str = row.try_get(0)?;
            Ok(StockLevel {
                // The CHECK constraint on `stock.sku` matches `Sku::parse`, and the value was
                // asked for by an equal `Sku`.
                sku: skus
                    .iter()
                    .find(|s| s.as_str() == sku)
                    .cloned()
                    .expect("row for a requested SKU"),
                on_hand: row.try_get(1)?,
                reserved: row.try_get(2)?,
                version: row.try_get(3)?,
            })
        })
        .collect()
}

fn level(sku: &Sku, row: &Row) -> StockLevel {
    StockLevel {
        sku: sku.clone(),
        on_hand: row.get(0),
        reserved: row.get(1),
        version: row.get(2),
    }
}

/// Writes decided counts of locked rows (`(sku, on_hand)`); returns the levels written, in no
/// particular order.
pub(crate) async fn set_many(
    tx: &Transaction<'_>,
    counts: &[(&str, i64)],
) -> Result<Vec<StockLevel>, Error> {
    if counts.is_empty() {
        return Ok(Vec::new());
    }
    let statement = tx.prepare_cached(SET_MANY).await.map_err(from_db)?;
    let skus: Vec<&str> = counts.iter().map(|c| c.0).collect();
    let on_hands: Vec<i64> = counts.iter().map(|c| c.1).collect();
    let rows = tx
        .query(&statement, &[&skus, &on_hands])
        .await
        .map_err(from_db)?;
    rows.iter()
        .map(|row| {
            let sku: &str = row.try_get(0).map_err(Error::internal)?;
            Ok(StockLevel {
                sku: Sku::parse(sku).map_err(Error::internal)?,
                on_hand: row.try_get(1).map_err(Error::internal)?,
                reserved: row.try_get(2).map_err(Error::internal)?,
                version: row.try_get(3).map_err(Error::internal)?,
            })
        })
        .collect()
}
