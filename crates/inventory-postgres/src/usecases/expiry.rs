//! The sweeper's side in storage: holds past their expiry are marked `EXPIRED` and their
//! units return to `available`, a batch per transaction, one event per reservation.
//!
//! Readers never wait for this: a hold past `expires_at` already reads as expired (see
//! `reservations`); sweeping only settles the stock and records the event.

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    domain::{MovementKind, Reservation, ReservationState},
    rules::{self, UnitMove},
};

use crate::{
    PgStore,
    plumbing::error::{from_db, from_pool},
    tables::ledger::{self, Cause, NewMovement},
    tables::outbox,
    tables::reservations,
    tables::stock::{self, StockMove},
};

pub use inventory_core::upkeep::{HeldTotals, OVERDUE_GRACE};

impl PgStore {
    /// Counts what is held now and records it as `inventory_reservations_held`,
    /// `inventory_reservations_overdue` and `inventory_stock_reserved_units`. Two scans (the HELD index, the stock table): the
    /// sweeper calls it now and then, not per call.
    pub async fn refresh_held_gauges(&self) -> Result<HeldTotals, Error> {
        let totals = self
            .bounded(async {
                let client = self.pool().get().await.map_err(from_pool)?;
                let row = client
                    .query_one(
                        "SELECT count(*),
                                count(*) FILTER (
                                    WHERE expires_at <= now() - make_interval(secs => $1)),
                                (SELECT coalesce(sum(reserved), 0)::bigint FROM stock)
                         FROM reservations WHERE state = 'HELD'",
                        &[&OVERDUE_GRACE.as_secs_f64()],
                    )
                    .await
                    .map_err(from_db)?;
                Ok(HeldTotals {
                    reservations: row.get(0),
                    overdue: row.get(1),
                    units: row.get(2),
                })
            })
            .await?;
        let metrics = crate::plumbing::metrics::store();
        metrics
            .held_reservations
            .record(u64::try_from(totals.reservations).unwrap_or(0), &[]);
        metrics
            .overdue_reservations
            .record(u64::try_from(totals.overdue).unwrap_or(0), &[]);
        metrics
            .held_units
            .record(u64::try_from(totals.units).unwrap_or(0), &[]);
        Ok(totals)
    }

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
            end_holds(&tx, &mut due, ReservationState::Expired, Cause::default()).await?;
            tx.commit().await.map_err(from_db)?;
            self.outbox_written();
            let metrics = crate::plumbing::metrics::store();
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

/// Ends locked holds: what each still holds goes back to `available`, SKU by SKU in one
/// fixed order as every other writer does; each ends in the state the core gives it
/// (`ended`, or `CONFIRMED` if some of its units were confirmed before) and gets its own
/// event with the level its own change produced, and one movement per SKU it moved (with
/// `cause`: the cancel's caller, reason and key; none for expiry). `holds` become the
/// reservations as ended.
pub(crate) async fn end_holds(
    tx: &Transaction<'_>,
    holds: &mut [Reservation],
    ended: ReservationState,
    cause: Cause<'_>,
) -> Result<(), Error> {
    let changes: Vec<UnitMove> = holds.iter().map(|r| rules::end_hold(r, ended)).collect();
    // One movement per hold and location, in the holds' order: each hold's event carries the
    // levels its own change produced. The SKU rows are locked in SKU order first.
    let moves: Vec<StockMove<'_>> = changes
        .iter()
        .flat_map(|c| &c.moves)
        .map(|m| StockMove {
            sku: &m.sku,
            location: &m.location,
            on_hand: 0,
            reserved: -m.units,
        })
        .collect();
    let moved = stock::apply(tx, &moves, &[], false).await?;
    let ended_now: Vec<&Reservation> = changes.iter().map(|c| &c.after).collect();
    reservations::end_many(tx, &ended_now)
        .await
        .map_err(from_db)?;
    let rewritten: Vec<&Reservation> = changes
        .iter()
        .filter(|c| c.write_lines)
        .map(|c| &c.after)
        .collect();
    reservations::update_lines(tx, &rewritten)
        .await
        .map_err(from_db)?;
    let kind = match ended {
        ReservationState::Expired => MovementKind::Expired,
        _ => MovementKind::Released,
    };
    let mut offset = 0;
    for change in &changes {
        let own = &moved[offset..offset + change.moves.len()];
        offset += change.moves.len();
        outbox::append_reservation_event(
            tx,
            change.event,
            &change.after,
            &stock::levels_after(own),
        )
        .await
        .map_err(from_db)?;
        let cause = cause.of_reservation(change.after.id, &change.after.order_id);
        let movements: Vec<NewMovement<'_>> = own
            .iter()
            .zip(&change.moves)
            .map(|(m, units)| NewMovement::of_units(kind, m, units.units).because(cause))
            .collect();
        ledger::append(tx, &movements).await.map_err(from_db)?;
    }
    for (hold, change) in holds.iter_mut().zip(changes) {
        *hold = change.after;
    }
    Ok(())
}
