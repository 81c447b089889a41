//! Events: what the outbox records about each committed state change, as the stream delivers
//! it.

mod filter;
mod subscription;

use std::time::SystemTime;

use uuid::Uuid;

pub use filter::{EventFilter, EventKind, MAX_FILTER_VALUES};
pub use subscription::{
    AckEvents, CreateSubscription, MAX_SUBSCRIPTION_NAME_LEN, Subscription, SubscriptionName,
};

use crate::domain::{
    MovementKind, OrderId, ReservationId, ReservationLine, ReservationState, Sku, StockLevel,
    StockState,
};

/// One committed state change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Position in the stream: dense, strictly increasing in the order consumers see events.
    pub position: i64,
    /// Stable across deliveries: a consumer deduplicates on it.
    pub id: Uuid,
    pub occurred_at: SystemTime,
    pub change: Change,
    /// The epoch the position belongs to.
    pub epoch: Epoch,
}

/// A stretch of the stream's history: the positions after `starts_after`, up to the next
/// epoch's. A new epoch begins wherever the history can have been cut (a restore, a promotion
/// that lost a tail, a reset by hand): a cursor is a position within an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epoch {
    pub id: EpochId,
    pub starts_after: i64,
}

/// An epoch's random id, never reused: as text, 16 hex digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EpochId(pub i64);

impl EpochId {
    /// 1 to 16 hex digits.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() || raw.len() > 16 {
            return Err("must be 1 to 16 hex digits".into());
        }
        u64::from_str_radix(raw, 16)
            .ok()
            .and_then(|id| i64::try_from(id).ok())
            .map(Self)
            .ok_or_else(|| "must be an epoch as the server sent it (16 hex digits)".into())
    }
}

impl std::fmt::Display for EpochId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
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
    /// A (SKU, location)'s states changed: policy, units between states, a receipt.
    StockStateChanged {
        sku: Sku,
        /// What changed, as the ledger names it.
        kind: MovementKind,
        reason: String,
        /// The SKU's total right after.
        level: StockLevel,
        /// The location's level right after.
        location_level: StockLevel,
        /// A state move's units and states (0 and `None` otherwise).
        quantity: i64,
        from: Option<StockState>,
        to: Option<StockState>,
        /// The receipt the change is about.
        receipt_id: Option<String>,
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
    /// Waiting units became held as stock arrived.
    Filled,
    /// The receipt pre-ordered units wait for was cancelled.
    PreorderAtRisk,
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
            Self::Filled => "RESERVATION_FILLED",
            Self::PreorderAtRisk => "RESERVATION_PREORDER_AT_RISK",
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
            Self::Filled,
            Self::PreorderAtRisk,
        ]
        .into_iter()
        .find(|event| event.as_str() == raw)
    }
}

/// An event on its way to a sink (see [`crate::ports::EventSink`]), encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    pub id: Uuid,
    pub position: i64,
    pub epoch: EpochId,
    pub kind: EventKind,
    /// The one SKU the event is about; `None` for a reservation of several.
    pub sku: Option<Sku>,
    /// The API's `Event` message, encoded.
    pub payload: Vec<u8>,
}

/// What one sequencer run did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Positioned {
    /// This many events got positions (possibly zero).
    Moved(u64),
    /// Another replica's sequencer was running; it will position what is ready.
    Busy,
}

/// Where a consumer's cursor stands against what the stream still holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamBounds {
    /// Highest position handed out so far (0 before the first event).
    pub head: i64,
    /// Events up to and including this position were pruned by retention.
    pub pruned_through: i64,
    /// Every epoch, oldest first; the last is the current one.
    pub epochs: Vec<Epoch>,
}

impl StreamBounds {
    /// The epoch events are positioned in now.
    pub fn current_epoch(&self) -> Epoch {
        self.epochs.last().copied().unwrap_or(Epoch {
            id: EpochId(0),
            starts_after: 0,
        })
    }

    /// The epoch `position` belongs to in this history: the latest that began before it.
    pub fn epoch_at(&self, position: i64) -> Option<EpochId> {
        self.epochs
            .iter()
            .rev()
            .find(|e| e.starts_after < position)
            .map(|e| e.id)
    }

    /// Whether a consumer that read up to `after` in `epoch` may go on from there: `after` is
    /// within the stream as it is now (not past the head), and, for another epoch than the
    /// current one, one this history has and no later than where the epoch after it began
    /// (what the consumer read is then shared by the history that went on). `None`: the
    /// consumer did not say its epoch (clients from before epochs); only the head is checked.
    pub fn admits(&self, epoch: Option<EpochId>, after: i64) -> bool {
        if after > self.head {
            return false;
        }
        let Some(epoch) = epoch else {
            return true;
        };
        match self.epochs.iter().position(|e| e.id == epoch) {
            None => false,
            Some(index) => self
                .epochs
                .get(index + 1)
                .is_none_or(|next| after <= next.starts_after),
        }
    }
}
