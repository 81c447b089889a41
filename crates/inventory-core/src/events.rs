//! Events: what the outbox records about each committed state change, as the stream delivers
//! it.

use std::time::SystemTime;

use uuid::Uuid;

use crate::domain::{OrderId, ReservationId, ReservationLine, ReservationState, Sku, StockLevel};

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
        /// The SKU's total right after.
        level: StockLevel,
        /// The changed location's level right after; `None` in events stored before
        /// locations existed.
        location_level: Option<StockLevel>,
    },
    /// Units moved between two locations; the SKU's total did not change.
    StockTransferred {
        sku: Sku,
        quantity: i64,
        reason: String,
        /// The SKU's total right after.
        level: StockLevel,
        /// Both locations' levels right after: from, then to.
        from: StockLevel,
        to: StockLevel,
    },
    /// Units of a reservation moved (`what`); it is in `state` after the change.
    Reservation {
        reservation_id: ReservationId,
        order_id: OrderId,
        what: ReservationEvent,
        state: ReservationState,
        lines: Vec<ReservationLine>,
        /// The moved SKUs' totals (`location: None`) and the moved locations' levels, right
        /// after the change.
        levels: Vec<StockLevel>,
        /// When a hold expires; `None` for other states and for events stored before it was
        /// recorded.
        expires_at: Option<SystemTime>,
    },
    /// A change took the SKU's `available` to 0 (`out_of_stock`) or from 0 to more.
    Availability {
        sku: Sku,
        out_of_stock: bool,
        level: StockLevel,
    },
    /// A hold's expiry moved; no stock changed.
    ReservationExtended {
        reservation_id: ReservationId,
        order_id: OrderId,
        lines: Vec<ReservationLine>,
        expires_at: SystemTime,
    },
}

/// What moved a reservation's units. The change that ends a hold is named by what ended it;
/// one that leaves units held is partial.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReservationEvent {
    Held,
    Confirmed,
    Released,
    Expired,
    PartiallyConfirmed,
    PartiallyReleased,
}

impl ReservationEvent {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "RESERVATION_HELD",
            Self::Confirmed => "RESERVATION_CONFIRMED",
            Self::Released => "RESERVATION_RELEASED",
            Self::Expired => "RESERVATION_EXPIRED",
            Self::PartiallyConfirmed => "RESERVATION_PARTIALLY_CONFIRMED",
            Self::PartiallyReleased => "RESERVATION_PARTIALLY_RELEASED",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        [
            Self::Held,
            Self::Confirmed,
            Self::Released,
            Self::Expired,
            Self::PartiallyConfirmed,
            Self::PartiallyReleased,
        ]
        .into_iter()
        .find(|event| event.as_str() == raw)
    }
}

/// Where a consumer's cursor stands against what the stream still holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamBounds {
    /// Highest position handed out so far (0 before the first event).
    pub head: i64,
    /// Events up to and including this position were pruned by retention.
    pub pruned_through: i64,
}
