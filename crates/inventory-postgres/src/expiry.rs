//! The sweeper's side in storage: holds past their expiry are marked `EXPIRED` and their
//! units return to `available`, a batch per transaction, one event per reservation.
//!
//! Readers never wait for this: a hold past `expires_at` already reads as expired (see
//! `reservations`); sweeping only settles the stock and records the event.

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    domain::{Reservation, ReservationState, Sku, StockLevel},
};

use crate::{
    PgStore,
    error::{from_db, from_pool},
    outbox, reservations, stock,
};

impl PgStore {
    /// Expires up to `batch` holds past their expiry in one transaction and returns their
    /// stock; several replicas sweep at once without waiting on each other.
    #[tracing::instrument(name = "sql.sweep", skip_all, fields(expired))]
    pub(crate) async fn expire(&self, batch: usize) -> Result<usize, Error> {
        self.bounded(async {
            let mut client = self.pool().get().await.map_err(from_pool)?;
            let tx = client.transaction().await.map_err(from_db)?;
            let batch = i64::try_from(batch).unwrap_or(i64::MAX);
            let mut due = reservations::lock_due(&tx, batch).await?;
            if due.is_empty() {
                return Ok(0);
            }
            end_holds(&tx, &mut due, ReservationState::Expired).await?;
            tx.commit().await.map_err(from_db)?;
            self.outbox_written();
            let metrics = crate::metrics::store();
            metrics.swept.add(due.len() as u64, &[]);
            metrics.reservations.add(
                due.len() as u64,
                &[opentelemetry::KeyValue::new("outcome", "EXPIRED")],
            );
            Ok(due.len())
        })
        .await
    }
}

/// Ends locked holds: their stock goes back to `available`, SKU by SKU in one fixed order as
/// every other writer does, they move to `state` (`Expired` or `Released`), and each gets its
/// own event with the level its own change produced.
pub(crate) async fn end_holds(
    tx: &Transaction<'_>,
    holds: &mut [Reservation],
    state: ReservationState,
) -> Result<(), Error> {
    let mut per_sku: Vec<(Sku, i64, i64)> = Vec::new();
    for line in holds.iter().flat_map(|r| &r.lines) {
        match per_sku.iter_mut().find(|(sku, _, _)| sku == &line.sku) {
            Some((_, units, count)) => {
                *units += line.quantity.get();
                *count += 1;
            }
            None => per_sku.push((line.sku.clone(), line.quantity.get(), 1)),
        }
    }
    per_sku.sort_by(|a, b| a.0.as_str().cmp(b.0.as_str()));
    // Each SKU's level before the batch; every hold then moves it by its own lines and one
    // version, so each event carries the level its own change produced.
    let mut running = Vec::with_capacity(per_sku.len());
    for (sku, units, count) in &per_sku {
        let after = stock::unreserve(tx, sku, *units, *count)
            .await
            .map_err(from_db)?;
        running.push(StockLevel {
            reserved: after.reserved + units,
            version: after.version - count,
            ..after
        });
    }
    let ids: Vec<uuid::Uuid> = holds.iter().map(|r| r.id.as_uuid()).collect();
    reservations::end_many(tx, &ids, state)
        .await
        .map_err(from_db)?;
    for reservation in holds.iter_mut() {
        reservation.state = state;
        let mut own = Vec::with_capacity(reservation.lines.len());
        for line in &reservation.lines {
            let level = running
                .iter_mut()
                .find(|level| level.sku == line.sku)
                .expect("every line's SKU was unreserved");
            level.reserved -= line.quantity.get();
            level.version += 1;
            own.push(level.clone());
        }
        outbox::append_reservation_event(tx, reservation, &own)
            .await
            .map_err(from_db)?;
    }
    Ok(())
}
