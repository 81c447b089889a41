//! Filling waiting holds: the last step of every write that can leave units free at a
//! (SKU, location) where holds wait for stock (units arriving, released, passed out of
//! quality control, a safety stock lowered). It runs in the writer's transaction, under the
//! SKU rows the writer locked, so the units it hands out are the ones the writer just freed.
//!
//! It costs nothing unless a level it is given has waiting units and free units. Then it reads
//! the waiting lines there, oldest reservation first, locking their reservations but skipping
//! one another transaction holds (a confirm or release in flight, which locks its reservation
//! first and the SKU rows after: waiting for it here could deadlock). Such a hold is filled
//! by its own transaction's fill (a settle ends with one too), by the next write that frees
//! units there, or else by the sweeper's refill pass ([`PgStore::refill`]), which looks for
//! units free where holds wait and fills them: no skipped fill waits for new stock.

use std::collections::HashMap;

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    domain::{LocationId, MovementKind, ReceiptId, ReservationId, Sku, States, StockLevel},
    events::ReservationEvent,
    rules::{self, Waiting},
};

use crate::{
    PgStore,
    plumbing::error::{from_db, from_pool},
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

/// Where units are free while holds wait there: each (SKU, location) with a waiting line
/// (the partial index of waiting lines finds them) whose row has units free, with how many
/// are free and how many wait.
const FREE_WHILE_WAITING: &str = "
    SELECT s.sku, s.location_id,
           s.on_hand - s.reserved - s.damaged - s.quality_control - s.safety_stock,
           s.backordered + s.preordered
    FROM (SELECT DISTINCT sku, location_id FROM reservation_lines
          WHERE backordered > 0 OR preordered > 0) w
    JOIN stock_locations s USING (sku, location_id)
    WHERE s.on_hand - s.reserved - s.damaged - s.quality_control - s.safety_stock > 0
      AND s.backordered + s.preordered > 0
    ORDER BY s.sku COLLATE \"C\", s.location_id COLLATE \"C\"
    LIMIT $1";

impl PgStore {
    /// The sweeper's refill pass: up to `batch` places (SKU, location) where units are free
    /// while holds wait, each filled in a transaction of its own under its SKU's row lock, as
    /// the write that freed them would have (a fill skips a hold another transaction has
    /// locked, and nothing else comes back for it). Records what it found as
    /// `inventory_stock_free_while_waiting_units`; answers how many units it filled.
    pub async fn refill(&self, batch: usize) -> Result<u64, Error> {
        let places = self
            .bounded(async {
                let client = self.pool().get().await.map_err(from_pool)?;
                let statement = client
                    .prepare_cached(FREE_WHILE_WAITING)
                    .await
                    .map_err(from_db)?;
                let limit = i64::try_from(batch).unwrap_or(i64::MAX);
                let rows = client.query(&statement, &[&limit]).await.map_err(from_db)?;
                rows.iter()
                    .map(|row| {
                        let invalid =
                            |problem: String| Error::internal(format!("stored value: {problem}"));
                        let sku = Sku::parse(row.try_get(0).map_err(Error::internal)?)
                            .map_err(invalid)?;
                        let location = LocationId::parse(row.try_get(1).map_err(Error::internal)?)
                            .map_err(invalid)?;
                        let free: i64 = row.try_get(2).map_err(Error::internal)?;
                        let waiting: i64 = row.try_get(3).map_err(Error::internal)?;
                        Ok((sku, location, free.min(waiting)))
                    })
                    .collect::<Result<Vec<_>, Error>>()
            })
            .await?;
        let found: i64 = places.iter().map(|(.., units)| units).sum();
        crate::plumbing::metrics::store()
            .free_while_waiting
            .record(u64::try_from(found).unwrap_or(0), self.tenant_attribute());
        // Place by place: one that fails (a lock wait past the bound behind a busy SKU) is
        // tried again next pass, and keeps none of the others from their fill.
        let mut filled = 0;
        let mut failed = None;
        for (sku, location, _) in &places {
            match self.bounded(self.refill_at(sku, location)).await {
                Ok(0) => {}
                Ok(units) => {
                    filled += units;
                    crate::plumbing::metrics::store()
                        .refilled
                        .add(units, self.tenant_attribute());
                    self.outbox_written();
                }
                Err(error) => {
                    tracing::warn!(%error, %sku, %location, "cannot refill holds waiting here");
                    failed = Some(error);
                }
            }
        }
        match failed {
            Some(error) if filled == 0 => Err(error),
            _ => Ok(filled),
        }
    }

    /// One place of [`refill`](Self::refill): its SKU's row locked, its row read, and the
    /// fill every writer ends with.
    async fn refill_at(&self, sku: &Sku, location: &LocationId) -> Result<u64, Error> {
        let mut client = self.pool().get().await.map_err(from_pool)?;
        let tx = client.transaction().await.map_err(from_db)?;
        if stock::lock(&tx, sku).await.map_err(from_db)?.is_none() {
            return Ok(0);
        }
        let Some(level) = stock::read_at(&tx, sku, location).await.map_err(from_db)? else {
            return Ok(0);
        };
        let before = level.states.waiting();
        let after = fill(&tx, std::slice::from_ref(&level), None, Cause::default()).await?;
        if after.is_empty() {
            return Ok(0);
        }
        let now = stock::read_at(&tx, sku, location)
            .await
            .map_err(from_db)?
            .map_or(before, |l| l.states.waiting());
        tx.commit().await.map_err(from_db)?;
        Ok(u64::try_from(before - now).unwrap_or(0))
    }
}
