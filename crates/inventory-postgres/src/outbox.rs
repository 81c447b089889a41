//! SQL for the `outbox` table. Events are inserted by the transaction that makes the change
//! they describe, so an event exists exactly when its change committed.

use deadpool_postgres::Transaction;
use inventory_core::domain::Sku;
use uuid::Uuid;

const APPEND_SKU_EVENT: &str = "
    INSERT INTO outbox (event_id, event_type, sku, payload) VALUES ($1, $2, $3, $4)";

pub(crate) const STOCK_ADJUSTED: &str = "STOCK_ADJUSTED";

pub(crate) async fn append_sku_event(
    tx: &Transaction<'_>,
    event_type: &str,
    sku: &Sku,
    payload: &serde_json::Value,
) -> Result<(), tokio_postgres::Error> {
    let statement = tx.prepare_cached(APPEND_SKU_EVENT).await?;
    tx.execute(
        &statement,
        &[&Uuid::new_v4(), &event_type, &sku.as_str(), payload],
    )
    .await?;
    Ok(())
}
