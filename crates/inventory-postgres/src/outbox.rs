//! SQL for the `outbox` table. Events are inserted by the transaction that makes the change
//! they describe, so an event exists exactly when its change committed.

use deadpool_postgres::Transaction;
use inventory_core::domain::{Reservation, ReservationState, Sku, StockLevel};
use serde_json::json;
use uuid::Uuid;

const APPEND_SKU_EVENT: &str = "
    INSERT INTO outbox (event_id, event_type, sku, payload) VALUES ($1, $2, $3, $4)";

const APPEND_RESERVATION_EVENT: &str = "
    INSERT INTO outbox (event_id, event_type, reservation_id, payload) VALUES ($1, $2, $3, $4)";

pub(crate) const STOCK_ADJUSTED: &str = "STOCK_ADJUSTED";

/// The event type recording a reservation's move to `state`.
pub(crate) fn reservation_event(state: ReservationState) -> &'static str {
    match state {
        ReservationState::Held => "RESERVATION_HELD",
        ReservationState::Confirmed => "RESERVATION_CONFIRMED",
        ReservationState::Released => "RESERVATION_RELEASED",
        ReservationState::Expired => "RESERVATION_EXPIRED",
    }
}

/// Appends the event of `reservation` entering its current state, with the levels of its
/// SKUs right after the change.
pub(crate) async fn append_reservation_event(
    tx: &Transaction<'_>,
    reservation: &Reservation,
    levels: &[StockLevel],
) -> Result<(), tokio_postgres::Error> {
    let payload = reservation_payload(reservation, levels);
    let statement = tx.prepare_cached(APPEND_RESERVATION_EVENT).await?;
    tx.execute(
        &statement,
        &[
            &Uuid::new_v4(),
            &reservation_event(reservation.state),
            &reservation.id.as_uuid(),
            &payload,
        ],
    )
    .await?;
    Ok(())
}

/// The payload of a reservation event: the reservation as it now is and its SKUs' levels
/// right after the change.
pub(crate) fn reservation_payload(
    reservation: &Reservation,
    levels: &[StockLevel],
) -> serde_json::Value {
    json!({
        "order_id": reservation.order_id.as_str(),
        "state": reservation.state.as_str(),
        "lines": reservation.lines.iter().map(|line| json!({
            "sku": line.sku.as_str(),
            "quantity": line.quantity.get(),
        })).collect::<Vec<_>>(),
        "levels": levels.iter().map(|level| json!({
            "sku": level.sku.as_str(),
            "on_hand": level.on_hand,
            "reserved": level.reserved,
            "version": level.version,
        })).collect::<Vec<_>>(),
    })
}

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
