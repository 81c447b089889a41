//! The sweeper's side in storage: holds past their expiry are marked `EXPIRED` and their
//! units return to `available`, in set operations (one update per SKU however many of its
//! holds expire), one event per reservation.
//!
//! Readers never wait for this: a hold past `expires_at` already reads as expired (see
//! `reservations`); sweeping only settles the stock and records the event. A hold with units
//! waiting for stock is the exception: it is made to last until the wait horizon
//! (`rules::committed`), and one made otherwise (by a release before this one) reads as held
//! past its checkout expiry until the sweeper moves that expiry to the horizon (`wait_on`).

use std::{
    collections::HashSet,
    time::{Duration, SystemTime},
};

use deadpool_postgres::Transaction;
use futures::StreamExt as _;
use inventory_core::{
    Error,
    domain::{MovementKind, Reservation, ReservationState},
    pause::PausePoint,
    rules::{self, UnitMove},
};

use crate::{
    PgStore,
    plumbing::error::{from_db, from_pool},
    tables::ledger::{self, Cause},
    tables::outbox,
    tables::reservations,
    tables::stock::{self, StockMove},
};

pub use inventory_core::upkeep::{HeldTotals, OVERDUE_GRACE};

/// Seconds since the oldest hold still held expired; 0 when none has.
const OLDEST_OVERDUE: &str = "
    SELECT coalesce(extract(epoch FROM clock_timestamp() - min(expires_at))::float8, 0)
    FROM reservations WHERE state = 'HELD' AND expires_at <= clock_timestamp()";

impl PgStore {
    /// Counts what is held now and records it as `inventory_reservations_held`,
    /// `inventory_reservations_overdue` and `inventory_stock_reserved_units` (and the open
    /// receipts past their date as `inventory_receipts_late`). Two scans (the HELD index, the stock table): the
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
                                (SELECT coalesce(sum(reserved), 0)::bigint FROM stock),
                                (SELECT count(*) FROM receipts
                                 WHERE state = 'OPEN' AND expected_at < now())
                         FROM reservations WHERE state = 'HELD'",
                        &[&OVERDUE_GRACE.as_secs_f64()],
                    )
                    .await
                    .map_err(from_db)?;
                let late: i64 = row.get(3);
                crate::plumbing::metrics::store()
                    .late_receipts
                    .record(u64::try_from(late).unwrap_or(0), self.tenant_attribute());
                Ok(HeldTotals {
                    reservations: row.get(0),
                    overdue: row.get(1),
                    units: row.get(2),
                })
            })
            .await?;
        let metrics = crate::plumbing::metrics::store();
        metrics.held_reservations.record(
            u64::try_from(totals.reservations).unwrap_or(0),
            self.tenant_attribute(),
        );
        metrics.overdue_reservations.record(
            u64::try_from(totals.overdue).unwrap_or(0),
            self.tenant_attribute(),
        );
        metrics.held_units.record(
            u64::try_from(totals.units).unwrap_or(0),
            self.tenant_attribute(),
        );
        Ok(totals)
    }

    /// How long the oldest hold past its expiry has waited (zero: none), recorded as
    /// `inventory_reservations_oldest_overdue_seconds`. The first entry of the expiry index.
    pub async fn refresh_oldest_overdue(&self) -> Result<Duration, Error> {
        let seconds: f64 = self
            .bounded(async {
                let client = self.pool().get().await.map_err(from_pool)?;
                let row = client
                    .query_one(OLDEST_OVERDUE, &[])
                    .await
                    .map_err(from_db)?;
                Ok(row.get(0))
            })
            .await?;
        let seconds = seconds.max(0.0);
        crate::plumbing::metrics::store()
            .oldest_overdue
            .record(seconds, self.tenant_attribute());
        Ok(Duration::from_secs_f64(seconds))
    }

    /// Expires up to `batch` holds past their expiry and returns their stock; several
    /// replicas sweep at once without waiting on each other. Returns how many it expired.
    ///
    /// Never holds one SKU's row while waiting for another's, so a sweep does not stall a hot
    /// SKU's `Reserve` batches behind the other SKUs it touches:
    /// 1. One transaction locks the due holds (oldest first) and, of their SKUs, the rows no
    ///    writer holds at this moment, and ends every hold whose SKUs it got.
    /// 2. The holds of SKUs a writer held (a hot SKU's batches hold its row most of the
    ///    time) are ended SKU by SKU, a transaction each, up to [`BUSY_AT_ONCE`] at once: each
    ///    waits its turn for its own SKU's row, as one more batch would, and takes its holds
    ///    again first, judged at that moment (another replica's sweep may have ended them in
    ///    between; a confirm cannot, as they are past their expiry).
    #[tracing::instrument(name = "sql.sweep", skip_all, fields(expired))]
    pub(crate) async fn expire(&self, batch: usize) -> Result<usize, Error> {
        let (mut expired, busy) = self.bounded(self.expire_free(batch)).await?;
        if !busy.is_empty() {
            self.pauses.reach(PausePoint::ExpiryDeferred).await;
            let mut groups: Vec<(Vec<&str>, Vec<uuid::Uuid>)> = Vec::new();
            for hold in &busy {
                let skus = skus_of(hold);
                match groups.iter_mut().find(|(of, _)| *of == skus) {
                    Some((_, ids)) => ids.push(hold.id.as_uuid()),
                    None => groups.push((skus, vec![hold.id.as_uuid()])),
                }
            }
            let groups: Vec<Vec<uuid::Uuid>> = groups.into_iter().map(|(_, ids)| ids).collect();
            let mut ended = futures::stream::iter(groups)
                .map(|ids| self.bounded(self.expire_among(ids)))
                .buffer_unordered(BUSY_AT_ONCE);
            while let Some(count) = ended.next().await {
                expired += count?;
            }
        }
        tracing::Span::current().record("expired", expired);
        Ok(expired)
    }

    /// Step 1 of [`expire`](Self::expire): what it ended, and the holds it left to step 2.
    async fn expire_free(&self, batch: usize) -> Result<(usize, Vec<Reservation>), Error> {
        let mut client = self.pool().get().await.map_err(from_pool)?;
        let tx = client.transaction().await.map_err(from_db)?;
        let batch = i64::try_from(batch).unwrap_or(i64::MAX);
        let due = reservations::lock_due(&tx, batch).await?;
        if due.is_empty() {
            return Ok((0, Vec::new()));
        }
        let (due, waited) = self.wait_on(&tx, due).await?;
        if due.is_empty() {
            tx.commit().await.map_err(from_db)?;
            self.outbox_written();
            return Ok((waited, Vec::new()));
        }
        let mut skus: Vec<&str> = due.iter().flat_map(skus_of).collect();
        skus.sort_unstable();
        skus.dedup();
        let free = stock::lock_free(&tx, &skus).await.map_err(from_db)?;
        let free: HashSet<&str> = free.iter().map(String::as_str).collect();
        let (mut ready, busy): (Vec<Reservation>, Vec<Reservation>) = due
            .into_iter()
            .partition(|hold| skus_of(hold).iter().all(|sku| free.contains(sku)));
        if ready.is_empty() {
            // Awaited, not left to the drop (which sends the rollback without waiting for it):
            // the due holds' row locks must be gone before step 2, or before another
            // replica's sweep, which skips locked holds, looks for them.
            if waited > 0 {
                tx.commit().await.map_err(from_db)?;
                self.outbox_written();
            } else {
                tx.rollback().await.map_err(from_db)?;
            }
            return Ok((waited, busy));
        }
        end_holds(
            &tx,
            &mut ready,
            ReservationState::Expired,
            Cause::default(),
            true,
        )
        .await?;
        tx.commit().await.map_err(from_db)?;
        self.expired(&ready);
        Ok((ready.len() + waited, busy))
    }

    /// Step 2 of [`expire`](Self::expire): ends those of `ids` still due, waiting for their
    /// SKUs' rows.
    async fn expire_among(&self, ids: Vec<uuid::Uuid>) -> Result<usize, Error> {
        let mut client = self.pool().get().await.map_err(from_pool)?;
        let tx = client.transaction().await.map_err(from_db)?;
        let due = reservations::lock_due_among(&tx, &ids).await?;
        if due.is_empty() {
            return Ok(0);
        }
        let (mut due, waited) = self.wait_on(&tx, due).await?;
        if due.is_empty() {
            tx.commit().await.map_err(from_db)?;
            self.outbox_written();
            return Ok(waited);
        }
        end_holds(
            &tx,
            &mut due,
            ReservationState::Expired,
            Cause::default(),
            false,
        )
        .await?;
        tx.commit().await.map_err(from_db)?;
        self.expired(&due);
        Ok(due.len() + waited)
    }

    /// Of `due` (locked, past their expiry), each hold with units waiting made less than the
    /// wait horizon ago waits on: waiting demand is a commitment, not a checkout hold. This
    /// release makes such holds last until the horizon already (`rules::committed`); one a
    /// release before it made with its checkout `ttl` has its expiry moved to the horizon
    /// here (a `RESERVATION_EXTENDED` event each) and keeps every unit, held ones included,
    /// until then, or until it is confirmed, released or cancelled. At the horizon it expires
    /// like any hold. Answers the others, and how many waited on.
    async fn wait_on(
        &self,
        tx: &Transaction<'_>,
        due: Vec<Reservation>,
    ) -> Result<(Vec<Reservation>, usize), Error> {
        if due.iter().all(|r| r.waiting() == 0) {
            return Ok((due, 0));
        }
        // The database's clock, which chose the holds due (and dates `created_at`): with the
        // replica's, a hold past its horizon by one and not by the other would be moved to a
        // horizon already past, and announced again at every sweep until the clocks agree.
        let now: SystemTime = tx
            .query_one("SELECT now()", &[])
            .await
            .map_err(from_db)?
            .try_get(0)
            .map_err(Error::internal)?;
        let horizon = |r: &Reservation| r.created_at + self.wait_horizon;
        let (mut waiting, rest): (Vec<Reservation>, Vec<Reservation>) = due
            .into_iter()
            .partition(|r| r.waiting() > 0 && horizon(r) > now);
        if waiting.is_empty() {
            return Ok((rest, 0));
        }
        for hold in &mut waiting {
            hold.expires_at = horizon(hold);
        }
        reservations::wait_on_many(tx, &waiting)
            .await
            .map_err(from_db)?;
        for hold in &waiting {
            outbox::append_extended_event(tx, hold)
                .await
                .map_err(from_db)?;
        }
        Ok((rest, waiting.len()))
    }

    /// After a sweep's commit: wakes the sequencer and counts the holds it expired.
    fn expired(&self, holds: &[Reservation]) {
        self.outbox_written();
        let metrics = crate::plumbing::metrics::store();
        metrics.swept.add(holds.len() as u64, &[]);
        metrics.reservations.add(
            holds.len() as u64,
            &[opentelemetry::KeyValue::new("outcome", "EXPIRED")],
        );
        let now = SystemTime::now();
        for hold in holds {
            let late = now.duration_since(hold.expires_at).unwrap_or_default();
            metrics.expiry_lateness.record(late.as_secs_f64(), &[]);
        }
    }
}

/// Transactions of step 2 of a sweep that run at once (each takes a connection).
pub const BUSY_AT_ONCE: usize = 4;

/// The SKUs a hold holds units of, in SKU order.
fn skus_of(hold: &Reservation) -> Vec<&str> {
    let mut skus: Vec<&str> = hold.lines.iter().map(|line| line.sku.as_str()).collect();
    skus.sort_unstable();
    skus.dedup();
    skus
}

/// Ends locked holds: what each still holds goes back to `available`, SKU by SKU in one
/// fixed order as every other writer does; each ends in the state the core gives it
/// (`ended`, or `CONFIRMED` if some of its units were confirmed before) and gets its own
/// event with the levels its own change produced, and one movement per SKU and location it
/// moved (with `cause`: the cancel's caller, reason and key; none for expiry). `holds` become
/// the reservations as ended. `locked`: the caller holds the SKUs' rows locked already.
///
/// Set operations throughout, like the coalesced `Reserve`: one update of each SKU's rows
/// however many of its holds end, then one statement per table for every hold, in two round
/// trips, so a sweep of hundreds of holds keeps a hot SKU's row locked no longer than a batch
/// of `Reserve`s does.
pub(crate) async fn end_holds(
    tx: &Transaction<'_>,
    holds: &mut [Reservation],
    ended: ReservationState,
    cause: Cause<'_>,
    locked: bool,
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
            states: m.waiting.negated(),
        })
        .collect();
    let ended_now: Vec<&Reservation> = changes.iter().map(|c| &c.after).collect();
    let rewritten: Vec<&Reservation> = changes
        .iter()
        .filter(|c| c.write_lines)
        .map(|c| &c.after)
        .collect();
    // The reservations are locked already (the caller's `FOR UPDATE`): their updates go with
    // the stock's, `biased` so the stock rows are locked first, as by every writer.
    let (moved, (), ()) = tokio::try_join!(
        biased;
        stock::apply(tx, &moves, &[], locked),
        async { reservations::end_many(tx, &ended_now).await.map_err(from_db) },
        async { reservations::update_lines(tx, &rewritten).await.map_err(from_db) },
    )?;
    let unpegged: Vec<_> = changes
        .iter()
        .flat_map(|c| super::fill::unpegged(&c.moves))
        .collect();
    crate::tables::receipts::unpeg(tx, &unpegged).await?;
    let kind = match ended {
        ReservationState::Expired => MovementKind::Expired,
        _ => MovementKind::Released,
    };
    let mut events = Vec::with_capacity(changes.len());
    let mut movements = Vec::with_capacity(moved.len());
    let mut offset = 0;
    for change in &changes {
        let own = &moved[offset..offset + change.moves.len()];
        offset += change.moves.len();
        events.push((change.event, &change.after, stock::levels_after(own)));
        let cause = cause.of_reservation(change.after.id, &change.after.order_id);
        movements.extend(
            own.iter()
                .zip(&change.moves)
                .map(|(m, units)| super::fill::settled(kind, m, units).because(cause)),
        );
    }
    // Every event before the movements (and the availability events they cause), as the
    // coalesced `Reserve` writes them.
    tokio::try_join!(
        biased;
        async { outbox::append_reservation_events(tx, &events).await.map_err(from_db) },
        async { ledger::append(tx, &movements).await.map_err(from_db) },
    )?;
    // What they held goes to holds waiting there.
    let _ = super::fill::fill(tx, &super::fill::location_levels(&moved), None, cause).await?;
    for (hold, change) in holds.iter_mut().zip(changes) {
        *hold = change.after;
    }
    Ok(())
}
