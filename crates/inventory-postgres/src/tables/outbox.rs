//! SQL for the `outbox` table. Events are inserted by the transaction that makes the change
//! they describe, so an event exists exactly when its change committed.

use deadpool_postgres::Transaction;
use inventory_core::{
    domain::{Allocation, Reservation, ReservationLine, ReservationState, Sku, StockLevel},
    events::ReservationEvent,
};
use serde::{Serialize, Serializer};
use serde_json::json;
use tokio_postgres::types::Json;
use uuid::Uuid;

const APPEND_SKU_EVENT: &str = "
    INSERT INTO outbox (event_id, event_type, sku, payload) VALUES ($1, $2, $3, $4)";

const APPEND_RESERVATION_EVENT: &str = "
    INSERT INTO outbox (event_id, event_type, reservation_id, payload) VALUES ($1, $2, $3, $4)";

pub(crate) const APPEND_RESERVATION_EVENTS: &str = "
    INSERT INTO outbox (event_id, event_type, reservation_id, payload)
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::uuid[], $4::jsonb[])";

pub(crate) const STOCK_ADJUSTED: &str = "STOCK_ADJUSTED";
pub(crate) const STOCK_TRANSFERRED: &str = "STOCK_TRANSFERRED";
pub(crate) const STOCK_STATE_CHANGED: &str = "STOCK_STATE_CHANGED";
pub(crate) const RESERVATION_EXTENDED: &str = "RESERVATION_EXTENDED";

/// Appends the event of a change (`what`) that left `reservation` as it now is, with the
/// levels of the SKUs it moved right after the change.
pub(crate) async fn append_reservation_event(
    tx: &Transaction<'_>,
    what: ReservationEvent,
    reservation: &Reservation,
    levels: &[StockLevel],
) -> Result<(), tokio_postgres::Error> {
    append_event_of(tx, what.as_str(), reservation, levels).await
}

/// Appends the event of a hold whose expiry moved: no stock changed, so no levels.
pub(crate) async fn append_extended_event(
    tx: &Transaction<'_>,
    reservation: &Reservation,
) -> Result<(), tokio_postgres::Error> {
    append_event_of(tx, RESERVATION_EXTENDED, reservation, &[]).await
}

async fn append_event_of(
    tx: &Transaction<'_>,
    event_type: &str,
    reservation: &Reservation,
    levels: &[StockLevel],
) -> Result<(), tokio_postgres::Error> {
    let payload = reservation_payload(reservation, levels);
    let statement = tx.prepare_cached(APPEND_RESERVATION_EVENT).await?;
    tx.execute(
        &statement,
        &[
            &Uuid::new_v4(),
            &event_type,
            &reservation.id.as_uuid(),
            &payload,
        ],
    )
    .await?;
    Ok(())
}

/// The payload of a reservation event: the reservation as it now is and its SKUs' levels
/// right after the change; a hold's expiry as microseconds since the epoch. Serialized
/// straight from the reservation (no JSON tree is built first): it is written with every
/// event of the hot path.
pub(crate) fn reservation_payload<'a>(
    reservation: &'a Reservation,
    levels: &'a [StockLevel],
) -> Json<ReservationPayload<'a>> {
    Json(ReservationPayload {
        order_id: reservation.order_id.as_str(),
        state: reservation.state.as_str(),
        lines: Lines(&reservation.lines),
        levels: Levels(levels),
        expires_at_micros: (reservation.state == ReservationState::Held)
            .then(|| inventory_core::domain::micros(reservation.expires_at)),
    })
}

#[derive(Debug, Serialize)]
pub(crate) struct ReservationPayload<'a> {
    order_id: &'a str,
    state: &'a str,
    lines: Lines<'a>,
    levels: Levels<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at_micros: Option<i64>,
}

#[derive(Debug)]
struct Lines<'a>(&'a [ReservationLine]);

impl Serialize for Lines<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|line| LinePayload {
            sku: line.sku.as_str(),
            quantity: line.quantity.get(),
            held: line.held,
            confirmed: line.confirmed,
            released: line.released,
            allocations: Allocations(&line.allocations),
        }))
    }
}

#[derive(Serialize)]
struct LinePayload<'a> {
    sku: &'a str,
    quantity: i64,
    held: i64,
    confirmed: i64,
    released: i64,
    allocations: Allocations<'a>,
}

struct Allocations<'a>(&'a [Allocation]);

impl Serialize for Allocations<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|a| {
            AllocationPayload {
                location_id: a.location.as_str(),
                quantity: a.quantity,
                held: a.held,
                confirmed: a.confirmed,
                released: a.released,
                backordered: a.backordered,
                preordered: a.preordered,
                receipt_id: a.receipt.as_ref().map(|p| p.receipt.as_str()),
                expected_at_micros: a
                    .receipt
                    .as_ref()
                    .map(|p| inventory_core::domain::micros(p.expected_at)),
            }
        }))
    }
}

#[derive(Serialize)]
struct AllocationPayload<'a> {
    location_id: &'a str,
    quantity: i64,
    held: i64,
    confirmed: i64,
    released: i64,
    #[serde(skip_serializing_if = "is_zero")]
    backordered: i64,
    #[serde(skip_serializing_if = "is_zero")]
    preordered: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    receipt_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expected_at_micros: Option<i64>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

#[derive(Debug)]
struct Levels<'a>(&'a [StockLevel]);

impl Serialize for Levels<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|level| LevelPayload {
            sku: level.sku.as_str(),
            on_hand: level.on_hand,
            reserved: level.reserved,
            version: level.version,
            location_id: level.location.as_ref().map(|l| l.as_str()),
            states: (!level.states.is_zero()).then(|| level.states.to_array()),
            apart: level.apart,
        }))
    }
}

#[derive(Serialize)]
struct LevelPayload<'a> {
    sku: &'a str,
    on_hand: i64,
    reserved: i64,
    version: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    location_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    states: Option<[i64; 7]>,
    /// A total's `apart`, while not 0.
    #[serde(skip_serializing_if = "is_zero")]
    apart: i64,
}

/// A level in an event's payload; a location's carries its `location_id`.
pub(crate) fn level_payload(level: &StockLevel) -> serde_json::Value {
    let mut payload = json!({
        "sku": level.sku.as_str(),
        "on_hand": level.on_hand,
        "reserved": level.reserved,
        "version": level.version,
    });
    if let Some(location) = &level.location {
        payload["location_id"] = json!(location.as_str());
    }
    if !level.states.is_zero() {
        payload["states"] = json!(level.states.to_array());
    }
    if level.apart != 0 {
        payload["apart"] = json!(level.apart);
    }
    payload
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

/// Appends one event per change (`what` left the reservation as it now is, with its SKUs'
/// levels right after the change: the total, then each location's), in their order, in one
/// statement.
pub(crate) async fn append_reservation_events(
    tx: &Transaction<'_>,
    changes: &[(ReservationEvent, &Reservation, Vec<StockLevel>)],
) -> Result<u64, tokio_postgres::Error> {
    if changes.is_empty() {
        return Ok(0);
    }
    let statement = tx.prepare_cached(APPEND_RESERVATION_EVENTS).await?;
    let event_ids: Vec<Uuid> = changes.iter().map(|_| Uuid::new_v4()).collect();
    let types: Vec<&str> = changes.iter().map(|(what, ..)| what.as_str()).collect();
    let ids: Vec<Uuid> = changes.iter().map(|(_, r, _)| r.id.as_uuid()).collect();
    let payloads: Vec<Json<ReservationPayload<'_>>> = changes
        .iter()
        .map(|(_, r, levels)| reservation_payload(r, levels))
        .collect();
    tx.execute(&statement, &[&event_ids, &types, &ids, &payloads])
        .await
}

#[cfg(test)]
mod tests;
