//! Upkeep, one loop per replica: every interval it notes how long the oldest overdue hold has
//! waited, expires overdue holds (their stock goes back to `available`), fills holds waiting
//! where units are free (a fill skipped), then prunes events, idempotency keys and final reservations past
//! their retention; every 30 s it counts what is held, for the held gauges. Several replicas run it at once without waiting on each other.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use inventory_core::upkeep::{Pruned, Retention};

use crate::Service;

/// How often the sweeper counts what is held (`inventory_reservations_held`,
/// `inventory_stock_reserved_units`).
pub const HELD_GAUGES_EVERY: Duration = Duration::from_secs(30);

/// How often the sweeper's refill pass looks for units free where holds wait.
pub const REFILL_EVERY: Duration = Duration::from_secs(5);

/// What the loop does each round.
#[derive(Clone, Copy, Debug)]
pub struct Upkeep {
    pub interval: Duration,
    /// Rows per transaction, for expiry and for each table pruned.
    pub batch: usize,
    pub retention: Retention,
}

/// The sweeper, one per replica. Every interval it expires overdue holds in batches until
/// none is left (replicas sweeping at once take disjoint rows, `SKIP LOCKED`), then prunes
/// events and idempotency keys past their retention.
pub async fn run(
    inventory: Arc<Service>,
    upkeep: Upkeep,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let Upkeep {
        interval, batch, ..
    } = upkeep;
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut counted: Option<Instant> = None;
    let mut refilled: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stopped.changed() => return,
        }
        // Before the sweep, when it is oldest: how far behind expiry runs.
        if let Err(error) = inventory.oldest_overdue().await {
            tracing::warn!(%error, "cannot read the oldest overdue hold; its gauge keeps its last value");
        }
        loop {
            match inventory.expire_due(batch).await {
                Ok(expired) if expired > 0 => {
                    tracing::info!(expired, "expired holds returned their stock");
                    if expired < batch {
                        break;
                    }
                }
                Ok(_) => break,
                Err(error) => {
                    tracing::warn!(%error, "expiry sweep failed; retrying next interval");
                    break;
                }
            }
        }
        // Units free where holds wait (a fill skipped a hold another transaction had
        // locked): filled within seconds, not at the next arrival. Not every round: the pass
        // reads every place where holds wait.
        if refilled.is_none_or(|at| at.elapsed() >= REFILL_EVERY) {
            refilled = Some(Instant::now());
            match inventory.refill_waiting(batch).await {
                Ok(0) => {}
                Ok(units) => tracing::info!(units, "refilled holds a fill had skipped"),
                Err(error) => tracing::warn!(%error, "refill pass failed; retrying next round"),
            }
        }
        // The held gauges, after the sweep: a count over the holds and the stock rows, so
        // not every round.
        if counted.is_none_or(|at| at.elapsed() >= HELD_GAUGES_EVERY) {
            counted = Some(Instant::now());
            if let Err(error) = inventory.count_held().await {
                tracing::warn!(%error, "cannot count held reservations; the held gauges keep their last value");
            }
        }
        // Pass after pass while one came back full: the backlog shrinks whatever the write
        // rate, instead of by one batch per interval.
        // Bounded per round, so expiring holds (which frees stock) never waits long behind a
        // large pruning backlog; the next round carries on.
        let budget = Instant::now() + interval / 2;
        let mut total = Pruned::default();
        loop {
            match inventory.prune(&upkeep.retention, batch).await {
                Ok(pruned) => {
                    total.add(pruned);
                    if !pruned.was_full(batch) || *stopped.borrow() || Instant::now() >= budget {
                        break;
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "pruning failed; retrying next interval");
                    break;
                }
            }
        }
        if !total.is_empty() {
            tracing::info!(
                events = total.events,
                keys = total.idempotency_keys,
                cancelled_orders = total.cancelled_orders,
                reservations = total.reservations,
                "pruned past retention"
            );
        }
    }
}
