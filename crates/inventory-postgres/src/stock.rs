//! SQL for the `stock` table.
//!
//! Invariant relied on: `0 <= reserved <= on_hand <= MAX_ON_HAND` is enforced by CHECK
//! constraints, so every statement here may assume it and none can break it.

use deadpool_postgres::Transaction;
use inventory_core::domain::{FenceToken, MAX_ON_HAND, Sku, StockLevel};
use tokio_postgres::Row;

/// Adds units, creating the SKU on its first positive adjustment. The `WHERE` on the conflict
/// branch keeps `on_hand` within the limit: no row comes back when it would not be.
const ADD: &str = "
    INSERT INTO stock AS s (sku, on_hand) VALUES ($1, $2)
    ON CONFLICT (sku) DO UPDATE
        SET on_hand = s.on_hand + EXCLUDED.on_hand, version = s.version + 1, updated_at = now()
        WHERE s.on_hand + EXCLUDED.on_hand <= $3
    RETURNING s.on_hand, s.reserved, s.version";

/// Removes units only while what is left still covers the reserved units; no row comes back
/// when the SKU is unknown or the removal would cut into reservations.
const REMOVE: &str = "
    UPDATE stock SET on_hand = on_hand - $2, version = version + 1, updated_at = now()
    WHERE sku = $1 AND on_hand - $2 >= reserved
    RETURNING on_hand, reserved, version";

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

const READ_ONE: &str = "SELECT on_hand, reserved, version FROM stock WHERE sku = $1";

const READ_MANY: &str = "SELECT sku, on_hand, reserved, version FROM stock WHERE sku = ANY($1)";

/// `Some(level)` if the units were added, `None` if that would exceed [`MAX_ON_HAND`].
pub(crate) async fn add(
    tx: &Transaction<'_>,
    sku: &Sku,
    units: i64,
) -> Result<Option<StockLevel>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(ADD).await?;
    let row = tx
        .query_opt(&statement, &[&sku.as_str(), &units, &MAX_ON_HAND])
        .await?;
    Ok(row.map(|row| level(sku, &row)))
}

/// `Some(level)` if the units were removed, `None` if the SKU is unknown or too few unreserved
/// units are left (tell them apart with [`read`]).
pub(crate) async fn remove(
    tx: &Transaction<'_>,
    sku: &Sku,
    units: i64,
) -> Result<Option<StockLevel>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(REMOVE).await?;
    let row = tx.query_opt(&statement, &[&sku.as_str(), &units]).await?;
    Ok(row.map(|row| level(sku, &row)))
}

pub(crate) async fn read(
    tx: &Transaction<'_>,
    sku: &Sku,
) -> Result<Option<StockLevel>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(READ_ONE).await?;
    let row = tx.query_opt(&statement, &[&sku.as_str()]).await?;
    Ok(row.map(|row| level(sku, &row)))
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
