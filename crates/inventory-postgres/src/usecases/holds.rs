//! The write of what `Reserve` decided, shared by both of its paths: the one-request
//! transaction (`reserve`, a cart of any size) and the coalesced one (`batch`, many
//! single-line requests). Whatever path decided them, new holds are written by the same set
//! statements, in one round trip: the stock rows moved under each line's fence, the
//! reservations and their lines, one event per hold, one movement per placement, and the
//! outcome stored on every key that executed.

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    allocation::Placement,
    command::Reserve,
    domain::{FenceToken, MovementKind, Reservation, Sku, StockLevel},
    events::ReservationEvent,
};
use tokio_postgres::types::Json;

use crate::{
    plumbing::error::from_db,
    tables::idempotency::{self, outcome::ReserveOutcome},
    tables::ledger::{self, Cause, NewMovement},
    tables::outbox,
    tables::reservations,
    tables::stock::{self, StockMove},
};

/// The statements of [`write`], in the order it sends them.
pub(crate) const WRITES: [&str; 7] = [
    stock::APPLY,
    reservations::INSERT_MANY,
    reservations::INSERT_LINES_MANY,
    outbox::APPEND_RESERVATION_EVENTS,
    ledger::APPEND,
    idempotency::RECORD_OUTCOMES_MANY,
    idempotency::UNCLAIM_MANY,
];

/// A hold decided by the core, to be written.
pub(crate) struct Hold<'a> {
    pub command: &'a Reserve,
    pub reservation: Reservation,
    /// The lease token of each of the reservation's lines, in the order of its lines.
    pub fences: Vec<FenceToken>,
    /// Where its units went, line by line, with the levels right after each placement.
    pub placements: Vec<Placement>,
}

/// An executed request's outcome, to be stored on its key: `(caller, key, outcome)`.
pub(crate) type Record<'a> = (&'a str, &'a str, Json<ReserveOutcome>);

/// Every write of a `Reserve` transaction, sent together: `holds` written, `records` stored
/// on their keys, and the claims of `unclaim` given up (a fenced batch must leave no trace).
pub(crate) async fn write(
    tx: &Transaction<'_>,
    holds: &[Hold<'_>],
    records: &[Record<'_>],
    unclaim: &[(&str, &str)],
) -> Result<(), Error> {
    // Every statement prepared before any is sent (no round trip once the connection has
    // them), so they reach PostgreSQL in the order they are polled below: a hold's event
    // before the availability events its movements may append.
    futures::future::try_join_all(WRITES.iter().map(|sql| tx.prepare_cached(sql)))
        .await
        .map_err(from_db)?;
    let moves: Vec<StockMove<'_>> = holds
        .iter()
        .flat_map(|h| &h.placements)
        .map(StockMove::held)
        .collect();
    let mut fences: Vec<(&Sku, FenceToken)> = Vec::new();
    for h in holds {
        debug_assert_eq!(
            h.fences.len(),
            h.reservation.lines.len(),
            "a fence per line"
        );
        for (line, fence) in h.reservation.lines.iter().zip(&h.fences) {
            if !fences.iter().any(|(s, _)| *s == &line.sku) {
                fences.push((&line.sku, *fence));
            }
        }
    }
    let new: Vec<(&Reservation, &str, &str, &[FenceToken])> = holds
        .iter()
        .map(|h| {
            (
                &h.reservation,
                h.command.caller.as_str(),
                h.command.idempotency_key.as_str(),
                h.fences.as_slice(),
            )
        })
        .collect();
    // Decided on the locked rows: the levels each placement leaves are known already, and
    // the statements' guards repeat the decision.
    let events: Vec<(ReservationEvent, &Reservation, Vec<StockLevel>)> = holds
        .iter()
        .map(|h| {
            let moved: Vec<stock::Moved> = h
                .placements
                .iter()
                .map(|p| stock::Moved {
                    level: p.level.clone(),
                    total: p.total.clone(),
                    active: true,
                })
                .collect();
            (
                ReservationEvent::Held,
                &h.reservation,
                stock::levels_after(&moved),
            )
        })
        .collect();
    let moved: Vec<(stock::Moved, &Hold<'_>, &Placement)> = holds
        .iter()
        .flat_map(|h| {
            h.placements.iter().map(move |p| {
                // Units are placed at active locations only.
                let m = stock::Moved {
                    level: p.level.clone(),
                    total: p.total.clone(),
                    active: true,
                };
                (m, h, p)
            })
        })
        .collect();
    let movements: Vec<NewMovement<'_>> = moved
        .iter()
        .map(|(m, h, placement)| {
            let cause = Cause::call(
                h.command.caller.as_str(),
                "",
                Some(h.command.idempotency_key.as_str()),
            )
            .of_reservation(h.reservation.id, &h.reservation.order_id);
            let movement = NewMovement::of_units(MovementKind::Held, m, placement.units)
                .with_states(placement.waiting)
                .because(cause);
            match &placement.receipt {
                Some(peg) => movement.of_receipt(peg.receipt.as_str()),
                None => movement,
            }
        })
        .collect();
    // Pre-ordered units taken from their receipts (only a Reserve that may pre-order has
    // any: the coalesced path never does).
    let pegged: Vec<(&inventory_core::domain::ReceiptId, i64)> = moved
        .iter()
        .filter_map(|(_, _, p)| Some((&p.receipt.as_ref()?.receipt, p.waiting.preordered)))
        .collect();
    if !pegged.is_empty() {
        crate::tables::receipts::peg(tx, &pegged).await?;
    }
    // `biased`: sent in this order (reservations before their lines inside `insert_many`;
    // each hold's event before its movement and any availability event).
    let (applied, ..) = tokio::try_join!(
        biased;
        stock::apply_summed(tx, &moves, &fences, true),
        async { reservations::insert_many(tx, &new).await.map_err(from_db) },
        async { outbox::append_reservation_events(tx, &events).await.map_err(from_db) },
        async { ledger::append(tx, &movements).await.map_err(from_db) },
        async { idempotency::record_outcomes_many(tx, records).await.map_err(from_db) },
        async { idempotency::unclaim_many(tx, unclaim).await.map_err(from_db) },
    )?;
    debug_assert!(
        applied
            .iter()
            .zip(&moved)
            .all(|(a, (m, ..))| a.level == m.level && a.total == m.total.summed()),
        "the stored levels are the decided ones"
    );
    Ok(())
}
