//! Filling waiting holds: the last step of every write that can leave units free at a
//! (SKU, location) where holds wait for stock (units arriving, released, passed out of
//! quality control, a safety stock lowered). It runs in the writer's transaction, under the
//! SKU rows the writer locked, so the units it hands out are the ones the writer just freed.
//!
//! It costs nothing unless a level it is given has waiting units and free units. Then it reads
//! the waiting lines there, oldest reservation first, locking their reservations but skipping
//! one another transaction holds (a confirm or release in flight, which locks its reservation
//! first and the SKU rows after: waiting for it here could deadlock). Such a hold is filled
//! by the next arrival, or by its own transaction's fill (a settle ends with one too).

use std::collections::HashMap;

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    domain::{MovementKind, ReceiptId, ReservationId, States, StockLevel},
    events::ReservationEvent,
    rules::{self, Waiting},
};

use crate::{
    plumbing::error::from_db,
    tables::ledger::{self, Cause, NewMovement},
    tables::outbox,
    tables::receipts,
    tables::reservations,
    tables::stock::{self, StockMove},
};

/// Fills what can be filled at the locations of `levels` (location levels right after the
/// writer's change, later ones of a location winning). `received`: units of a receipt the
/// writer just received, for its pre-orders first. Answers the SKUs' totals after the fills
/// (the last of each SKU; none when nothing was filled), for the writer's answer.
pub(crate) async fn fill(
    tx: &Transaction<'_>,
    levels: &[StockLevel],
    received: Option<(&ReceiptId, i64)>,
    cause: Cause<'_>,
) -> Result<Vec<StockLevel>, Error> {
    let mut latest: Vec<StockLevel> = Vec::new();
    for level in levels.iter().filter(|l| l.location.is_some()) {
        match latest
            .iter_mut()
            .find(|l| l.sku == level.sku && l.location == level.location)
        {
            Some(l) if l.version <= level.version => *l = level.clone(),
            Some(_) => {}
            None => latest.push(level.clone()),
        }
    }
    latest.retain(|level| rules::may_fill(level, received));
    if latest.is_empty() {
        return Ok(Vec::new());
    }
    let waiting = reservations::lock_waiting(tx, &latest).await?;
    let plan = rules::fill_plan(&latest, &waiting, received);
    if plan.is_empty() {
        return Ok(Vec::new());
    }
    // One movement per line filled, in fill order: reserved up, waiting down.
    let deltas: Vec<States> = plan
        .iter()
        .map(|fill| States {
            backordered: -fill.backordered,
            preordered: -fill.preordered,
            ..States::default()
        })
        .collect();
    let moves: Vec<StockMove<'_>> = plan
        .iter()
        .zip(&deltas)
        .map(|(fill, delta)| {
            let w = &waiting[fill.index];
            StockMove {
                sku: &w.sku,
                location: &w.location,
                on_hand: 0,
                reserved: fill.units(),
                states: *delta,
            }
        })
        .collect();
    let moved = stock::apply(tx, &moves, &[], true).await?;
    let filled: Vec<(&Waiting, i64, i64)> = plan
        .iter()
        .map(|fill| {
            let w = &waiting[fill.index];
            (w, fill.backordered, fill.preordered)
        })
        .collect();
    reservations::fill_lines(tx, &filled).await?;
    let mut unpegged: Vec<(&ReceiptId, i64)> = Vec::new();
    for (w, _, preordered) in &filled {
        if let (Some(receipt), true) = (&w.receipt, *preordered > 0) {
            unpegged.push((receipt, *preordered));
        }
    }
    receipts::unpeg(tx, &unpegged).await?;

    // Each filled reservation's event, with the levels its fills left, then the movements.
    let mut order: Vec<ReservationId> = Vec::new();
    for (w, ..) in &filled {
        if !order.contains(&w.reservation) {
            order.push(w.reservation);
        }
    }
    let after = reservations::by_ids(tx, &order).await?;
    let mut levels_of: HashMap<ReservationId, Vec<stock::Moved>> = HashMap::new();
    for ((w, ..), m) in filled.iter().zip(&moved) {
        levels_of.entry(w.reservation).or_default().push(m.clone());
    }
    let events: Vec<_> = after
        .iter()
        .map(|r| {
            (
                ReservationEvent::Filled,
                r,
                stock::levels_after(levels_of.get(&r.id).map_or(&[][..], Vec::as_slice)),
            )
        })
        .collect();
    outbox::append_reservation_events(tx, &events)
        .await
        .map_err(from_db)?;
    let movements: Vec<NewMovement<'_>> = filled
        .iter()
        .zip(&moved)
        .zip(&deltas)
        .map(|(((w, ..), m), delta)| {
            let order_id = after
                .iter()
                .find(|r| r.id == w.reservation)
                .map(|r| &r.order_id);
            let mut cause = cause;
            if let Some(order_id) = order_id {
                cause = cause.of_reservation(w.reservation, order_id);
            }
            let mut movement = NewMovement::new(MovementKind::Filled, m, 0, -delta.waiting())
                .with_states(*delta)
                .because(cause);
            if let Some(receipt) = &w.receipt {
                movement = movement.of_receipt(receipt.as_str());
            }
            movement
        })
        .collect();
    ledger::append(tx, &movements).await.map_err(from_db)?;
    let mut totals: Vec<StockLevel> = Vec::new();
    for m in &moved {
        match totals.iter_mut().find(|t| t.sku == m.total.sku) {
            Some(t) => *t = m.total.clone(),
            None => totals.push(m.total.clone()),
        }
    }
    Ok(totals)
}

/// `total` as the fills after it left it.
pub(crate) fn after_fills(total: StockLevel, filled: &[StockLevel]) -> StockLevel {
    filled
        .iter()
        .find(|t| t.sku == total.sku)
        .cloned()
        .unwrap_or(total)
}

/// The pre-ordered units `moves` give up, by receipt.
pub(crate) fn unpegged(moves: &[rules::Move]) -> Vec<(&ReceiptId, i64)> {
    moves
        .iter()
        .filter_map(|m| Some((m.receipt.as_ref()?, m.waiting.preordered)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// The movement of held units leaving (`kind`: confirmed, released, expired) and of waiting
/// units given up with them.
pub(crate) fn settled<'a>(
    kind: MovementKind,
    moved: &stock::Moved,
    m: &'a rules::Move,
) -> NewMovement<'a> {
    let movement = NewMovement::of_units(kind, moved, m.units).with_states(m.waiting.negated());
    match &m.receipt {
        Some(receipt) => movement.of_receipt(receipt.as_str()),
        None => movement,
    }
}

/// The location levels among what a write moved.
pub(crate) fn location_levels(moved: &[stock::Moved]) -> Vec<StockLevel> {
    moved.iter().map(|m| m.level.clone()).collect()
}
