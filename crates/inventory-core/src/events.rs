//! Events: what the outbox records about each committed state change, as the stream delivers
//! it.

use std::time::SystemTime;

use uuid::Uuid;

use crate::domain::{Line, OrderId, ReservationId, ReservationState, Sku, StockLevel};

/// One committed state change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Position in the stream: dense, strictly increasing in the order consumers see events.
    pub position: i64,
    /// Stable across deliveries: a consumer deduplicates on it.
    pub id: Uuid,
    pub occurred_at: SystemTime,
    pub change: Change,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    StockAdjusted {
        sku: Sku,
        delta: i64,
        reason: String,
        level: StockLevel,
    },
    /// A reservation entered `state`.
    Reservation {
        reservation_id: ReservationId,
        order_id: OrderId,
        state: ReservationState,
        lines: Vec<Line>,
        levels: Vec<StockLevel>,
        /// When a hold expires; `None` for other states and for events stored before it was
        /// recorded.
        expires_at: Option<SystemTime>,
    },
    /// A hold's expiry moved; no stock changed.
    ReservationExtended {
        reservation_id: ReservationId,
        order_id: OrderId,
        lines: Vec<Line>,
        expires_at: SystemTime,
    },
}

/// Where a consumer's cursor stands against what the stream still holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamBounds {
    /// Highest position handed out so far (0 before the first event).
    pub head: i64,
    /// Events up to and including this position were pruned by retention.
    pub pruned_through: i64,
}
