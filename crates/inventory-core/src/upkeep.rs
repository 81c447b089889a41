//! What the upkeep of the stock store works with: how long each kind of row is kept, what a
//! pruning pass deleted, what is held, and what a verification of the ledger found. The
//! [`Upkeep`](crate::ports::Upkeep) port carries them; the sweeper and `verify` use them.

use std::{fmt, time::Duration};

/// How long past its expiry an unswept hold may be before it counts as overdue: many sweep
/// intervals, so a busy but healthy sweeper never shows any.
pub const OVERDUE_GRACE: Duration = Duration::from_secs(60);

/// How long each kind of row is kept.
#[derive(Clone, Copy, Debug)]
pub struct Retention {
    pub events: Duration,
    /// A subscription without an acknowledgement this long no longer holds events back.
    pub subscription_idle: Duration,
    pub idempotency_keys: Duration,
    /// Final reservations (confirmed, released, expired), from their last change.
    pub reservations: Duration,
    /// Stock movements; `None` keeps the ledger forever. A SKU's latest movement is always
    /// kept.
    pub ledger: Option<Duration>,
}

/// What one pass deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    pub events: u64,
    pub idempotency_keys: u64,
    pub reservations: u64,
    /// Tombstones of cancelled orders, kept as long as final reservations.
    pub cancelled_orders: u64,
    pub movements: u64,
}

impl Pruned {
    /// Whether any table had a full batch: more may be waiting.
    pub fn was_full(&self, batch: usize) -> bool {
        let batch = batch as u64;
        self.events >= batch
            || self.idempotency_keys >= batch
            || self.reservations >= batch
            || self.cancelled_orders >= batch
            || self.movements >= batch
    }

    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Adds another pass's counts.
    pub fn add(&mut self, pass: Pruned) {
        self.events += pass.events;
        self.idempotency_keys += pass.idempotency_keys;
        self.reservations += pass.reservations;
        self.cancelled_orders += pass.cancelled_orders;
        self.movements += pass.movements;
    }
}

/// What is held across every SKU, for the saturation gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeldTotals {
    /// Reservations in state `HELD` (overdue ones included until swept).
    pub reservations: i64,
    /// Of those, the ones more than [`OVERDUE_GRACE`] past their expiry that no sweep has
    /// returned yet (a hold that expired since the last sweep is not overdue).
    pub overdue: i64,
    /// Units reserved across every SKU.
    pub units: i64,
}

/// One disagreement between the stock rows, the ledger and the live holds, named by SKU
/// (and version, for a broken chain).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    pub sku: String,
    pub problem: String,
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.sku, self.problem)
    }
}

/// What a verification examined and found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub skus: i64,
    pub movements: i64,
    pub drifts: Vec<Drift>,
}
