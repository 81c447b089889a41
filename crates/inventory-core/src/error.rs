//! Every failure a caller can observe. Each variant asks for a different reaction from the
//! client (fix the request, wait for stock, retry, ...); the gRPC layer maps them to status
//! codes in one exhaustive `match`.

use std::{fmt, sync::Arc};

use std::time::{Duration, SystemTime};

use crate::domain::{Caller, LocationId, OrderId, ReservationId, ReservationState, Sku, Tenant};
use crate::quota::Quota;

/// A line that could not be held: what was asked and what was left.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub sku: Sku,
    pub requested: i64,
    pub available: i64,
}

/// A line of a partial confirm or release that asks for more than is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotHeld {
    /// The line's position in the request.
    pub index: usize,
    pub sku: Sku,
    pub requested: i64,
    /// What the reservation still holds of the SKU; `None` if it has no such line.
    pub held: Option<i64>,
}

/// What became of one line of a reservation that was confirmed only in part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    pub sku: Sku,
    /// The units first reserved.
    pub quantity: i64,
    pub confirmed: i64,
    /// Released, expired or cancelled: back in stock, possibly sold again since.
    pub released: i64,
}

/// A gRPC status as another replica answered it: code, message and encoded details.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relayed {
    pub code: i32,
    pub message: String,
    pub details: Vec<u8>,
}

pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A cause kept behind an `Arc`, so an error can be cloned: every request of a batch that
/// failed as a whole gets the same error, cause included.
pub type SharedError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// One invalid field of a request, named by its path in the request (`lines[2].sku`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldViolation {
    pub field: String,
    pub description: String,
}

impl FieldViolation {
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            description: description.into(),
        }
    }
}

/// An external system the service needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dependency {
    Postgres,
    Redis,
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Postgres => "PostgreSQL",
            Self::Redis => "Redis",
        })
    }
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed; nothing was changed.
    #[error("invalid request: {}", describe_violations(.0))]
    InvalidArgument(Vec<FieldViolation>),

    /// The named SKUs do not exist.
    #[error("unknown SKU: {}", join(.0))]
    UnknownSkus(Vec<Sku>),

    /// The location does not exist (`UpsertLocation` creates it).
    #[error("unknown location {0}")]
    UnknownLocation(LocationId),

    /// The reservation does not exist.
    #[error("unknown reservation {0}")]
    UnknownReservation(ReservationId),

    /// Not enough units are available for these lines; nothing was reserved.
    #[error("not enough stock for {}", shortfall_skus(.0))]
    InsufficientStock(Vec<Shortfall>),

    /// The reservation is in a state the requested transition cannot leave from.
    #[error("cannot {action} reservation {id}: it is {state}")]
    WrongState {
        id: ReservationId,
        state: ReservationState,
        action: &'static str,
    },

    /// Lines of a partial confirm or release ask for units the reservation does not hold;
    /// nothing changed.
    #[error("reservation {id} does not hold what lines {} ask for", not_held_lines(.lines))]
    NotHeld {
        id: ReservationId,
        lines: Vec<NotHeld>,
    },

    /// A whole confirm of a reservation that was confirmed only in part: the rest went back
    /// to stock (released or expired). Confirming "everything" cannot be answered OK, since
    /// some units are no longer the caller's; nothing changed.
    #[error("reservation {id} was confirmed only in part: {} of its units went back to stock", released_units(.lines))]
    PartlyReleased {
        id: ReservationId,
        lines: Vec<Settled>,
    },

    /// The order was cancelled (`CancelOrder`): no stock is held for it any more.
    #[error("order {} was cancelled", order_id.as_str())]
    OrderCancelled { order_id: OrderId },

    /// The hold would end more than `MAX_HOLD` after it was made; nothing changed.
    #[error("reservation {id} may be held for at most MAX_HOLD from when it was made")]
    MaxHoldExceeded {
        id: ReservationId,
        /// `created_at + MAX_HOLD`.
        latest: SystemTime,
    },

    /// No lease for the SKU could be obtained within the request's budget; nothing changed.
    #[error("{sku} is busy: no lease within {waited:?}")]
    LeaseBusy { sku: Sku, waited: Duration },

    /// Too many requests are already waiting for this SKU's lease in this replica.
    #[error("too many requests are waiting for {sku}")]
    TooManyWaiters { sku: Sku },

    /// A forwarded `Reserve` reached a replica that no longer holds its SKU's lease (another
    /// replica does); the sender runs it itself. Only replicas hear this.
    #[error("this replica does not hold the lease on {sku}")]
    NotHolder { sku: Sku },

    /// The answer of the replica that ran a forwarded call, passed on as it was given.
    #[error("{}", .0.message)]
    Relayed(Relayed),

    /// The server is at its limit of calls in flight.
    #[error("the server is at its limit of calls in flight")]
    Saturated,

    /// The caller has its limit of calls in flight in this replica (its `max_in_flight`).
    #[error("caller {} has its limit of {limit} calls in flight", .caller.as_str())]
    CallerSaturated { caller: Caller, limit: u32 },

    /// The reservation would take its caller past a cap on what it holds; nothing was
    /// reserved.
    #[error("caller {} would pass its {quota} of {limit} (it holds {current})", .caller.as_str())]
    QuotaExceeded {
        caller: Caller,
        quota: Quota,
        limit: u64,
        current: u64,
    },

    /// The caller's tenant has its limit of calls in flight in this replica (the tenant's
    /// `max_in_flight`, shared by all its callers).
    #[error("tenant {tenant} has its limit of {limit} calls in flight")]
    TenantSaturated { tenant: Tenant, limit: u32 },

    /// The reservation would take the caller's tenant past a cap on what all its callers
    /// hold together; nothing was reserved.
    #[error("tenant {tenant} would pass its {quota} of {limit} (it holds {current})")]
    TenantQuotaExceeded {
        tenant: Tenant,
        quota: Quota,
        limit: u64,
        current: u64,
    },

    /// The caller's tenant is not served here: its data lives in another cell.
    #[error("tenant {tenant} is not served by this cell{}", .cell.as_ref().map(|c| format!(" (its cell: {c})")).unwrap_or_default())]
    TenantNotServed {
        tenant: Tenant,
        cell: Option<String>,
    },

    /// The replica is at its limit of open event streams (`MAX_WATCHERS`).
    #[error("the server is at its limit of open event streams")]
    TooManyWatchers,

    /// The tenant has as many subscriptions as it may (`TENANT_MAX_SUBSCRIPTIONS`).
    #[error("the tenant has {limit} subscriptions, as many as it may: delete one first")]
    TooManySubscriptions { limit: u32 },

    /// The caller's deadline passed (or cannot be met) before the call finished. A mutating
    /// call may still have taken effect: retry with the same idempotency key to find out.
    #[error("the deadline passed before the call finished")]
    DeadlineExceeded,

    /// The lease expired or passed to another holder before the write, and the write was
    /// refused by its fencing token; nothing changed.
    #[error("the lease on {sku} was lost before the write")]
    LeaseLost { sku: Sku },

    /// Removing the units would take `on_hand` below what reservations hold.
    #[error("cannot remove {requested} units of {sku}: on_hand {on_hand}, reserved {reserved}")]
    BelowReserved {
        sku: Sku,
        requested: i64,
        on_hand: i64,
        reserved: i64,
    },

    /// The SKU is no longer at the version the caller expected: something changed it since
    /// the caller looked. Nothing changed.
    #[error("{sku} is at version {current}, not the expected {expected}")]
    VersionMismatch {
        sku: Sku,
        expected: i64,
        /// 0 when the SKU does not exist.
        current: i64,
    },

    /// An absolute count below the units reservations hold.
    #[error("cannot count {sku} at {requested}: {reserved} units are reserved")]
    CountBelowReserved {
        sku: Sku,
        requested: i64,
        reserved: i64,
    },

    /// Adding the units would take `on_hand` above the largest level a SKU may hold.
    #[error("adding {requested} units of {sku} would exceed the stock limit of {limit}")]
    StockLimit {
        sku: Sku,
        requested: i64,
        limit: i64,
    },

    /// The consumer's cursor is older than what retention keeps; events after it are gone.
    #[error("events after {requested} were pruned; the oldest kept follows {pruned_through}")]
    CursorPruned { requested: i64, pruned_through: i64 },

    /// No subscription of this name in the tenant.
    #[error("no subscription named {0}")]
    SubscriptionNotFound(crate::events::SubscriptionName),

    /// A subscription of this name exists with another filter.
    #[error("subscription {0} exists with another filter")]
    SubscriptionExists(crate::events::SubscriptionName),

    /// Another reader took the subscription over; this one ends.
    #[error("another reader took subscription {0} over")]
    SubscriptionTakenOver(crate::events::SubscriptionName),

    /// Retention removed events the subscription had not acknowledged.
    #[error("subscription {name} is lost: {reason}")]
    SubscriptionLost {
        name: crate::events::SubscriptionName,
        acked: i64,
        reason: String,
    },

    /// The consumer's cursor is not in the stream's history as it is now: past the head, or
    /// in an epoch this history does not have or left before that position (a restore or a
    /// promotion cut the history there). Events it read may never have happened here; it
    /// starts over from a snapshot.
    #[error("the cursor {after} (epoch {requested}) is not in the stream's current history (epoch {}, head {head})", current.id)]
    CursorNotInHistory {
        after: i64,
        /// The epoch the consumer named, or "unknown".
        requested: String,
        current: crate::events::Epoch,
        head: i64,
    },

    /// No receipt with this id.
    #[error("no receipt {0}")]
    UnknownReceipt(crate::domain::ReceiptId),

    /// A receipt with this id exists already.
    #[error("receipt {0} exists")]
    ReceiptExists(crate::domain::ReceiptId),

    /// The receipt is received or cancelled: it brings nothing more.
    #[error("receipt {id} is {}: it brings nothing more", state.as_str())]
    ReceiptClosed {
        id: crate::domain::ReceiptId,
        state: crate::domain::ReceiptState,
    },

    /// The idempotency key was already used for a different request.
    #[error("idempotency key was already used for a different request")]
    IdempotencyKeyReused,

    /// The schema moved on past this replica's release: a migration raised the floor (the
    /// oldest release that may still write) above it, since this release would corrupt the
    /// new schema. Nothing changed; a replica of a newer release can serve the call.
    #[error(
        "the schema no longer accepts writes from release {release}: its floor is release {floor}"
    )]
    SchemaTooNew { release: i32, floor: i32 },

    /// A dependency cannot be reached; the request changed nothing and may be retried.
    #[error("{dependency} is unavailable")]
    Unavailable {
        dependency: Dependency,
        #[source]
        source: SharedError,
    },

    /// A bug or an unexpected reply; the cause goes to the logs only.
    #[error("internal error")]
    Internal(#[source] SharedError),
}

impl Error {
    /// Whether a `Reserve` that ended in this error was decided in PostgreSQL under its
    /// idempotency key (a refusal is stored with the key), so a copy of the call that reaches
    /// PostgreSQL later replays it instead of writing. The others ended before the key was
    /// claimed (or on a release the schema moved past), and say nothing about a copy of the
    /// call sent elsewhere. Exhaustive on purpose: a new error must be placed here.
    pub fn decided_with_key(&self) -> bool {
        match self {
            Self::InvalidArgument(_)
            | Self::UnknownSkus(_)
            | Self::UnknownLocation(_)
            | Self::UnknownReservation(_)
            | Self::InsufficientStock(_)
            | Self::WrongState { .. }
            | Self::NotHeld { .. }
            | Self::PartlyReleased { .. }
            | Self::OrderCancelled { .. }
            | Self::MaxHoldExceeded { .. }
            | Self::BelowReserved { .. }
            | Self::VersionMismatch { .. }
            | Self::CountBelowReserved { .. }
            | Self::StockLimit { .. }
            | Self::CursorPruned { .. }
            | Self::CursorNotInHistory { .. }
            | Self::SubscriptionNotFound(_)
            | Self::SubscriptionExists(_)
            | Self::SubscriptionTakenOver(_)
            | Self::SubscriptionLost { .. }
            | Self::UnknownReceipt(_)
            | Self::ReceiptExists(_)
            | Self::ReceiptClosed { .. }
            | Self::IdempotencyKeyReused => true,
            Self::LeaseBusy { .. }
            | Self::TooManyWaiters { .. }
            | Self::NotHolder { .. }
            | Self::Relayed(_)
            | Self::Saturated
            | Self::CallerSaturated { .. }
            | Self::QuotaExceeded { .. }
            | Self::TenantSaturated { .. }
            | Self::TenantQuotaExceeded { .. }
            | Self::TenantNotServed { .. }
            | Self::TooManyWatchers
            | Self::TooManySubscriptions { .. }
            | Self::DeadlineExceeded
            | Self::LeaseLost { .. }
            | Self::SchemaTooNew { .. }
            | Self::Unavailable { .. }
            | Self::Internal(_) => false,
        }
    }

    pub fn unavailable(dependency: Dependency, source: impl Into<BoxError>) -> Self {
        Self::Unavailable {
            dependency,
            source: Arc::from(source.into()),
        }
    }

    pub fn internal(source: impl Into<BoxError>) -> Self {
        Self::Internal(Arc::from(source.into()))
    }
}

fn join(skus: &[Sku]) -> String {
    skus.iter().map(Sku::as_str).collect::<Vec<_>>().join(", ")
}

fn shortfall_skus(shortfalls: &[Shortfall]) -> String {
    shortfalls
        .iter()
        .map(|s| s.sku.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

fn not_held_lines(lines: &[NotHeld]) -> String {
    lines
        .iter()
        .map(|line| line.index.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn released_units(lines: &[Settled]) -> i64 {
    lines.iter().map(|line| line.released).sum()
}

fn describe_violations(violations: &[FieldViolation]) -> String {
    violations
        .iter()
        .map(|v| format!("{}: {}", v.field, v.description))
        .collect::<Vec<_>>()
        .join("; ")
}
