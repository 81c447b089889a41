//! Answers as the model compares them: every field the model can know, nothing it cannot
//! (ids the server makes, times, versions). The runner turns the server's messages into these
//! with the `from_*` functions; the model builds its own from its state.

use std::{collections::BTreeMap, fmt};

use inventory_proto as proto;

use crate::call::Namespace;

/// A gRPC status code (the numbers are gRPC's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Code {
    Ok = 0,
    InvalidArgument = 3,
    NotFound = 5,
    AlreadyExists = 6,
    FailedPrecondition = 9,
    Aborted = 10,
    /// Transient: the call may be retried under its key (the model predicts none of these).
    DeadlineExceeded = 4,
    ResourceExhausted = 8,
    Unavailable = 14,
    /// Any other code (the model never predicts it: it always diverges).
    Other = 2,
}

impl Code {
    pub fn from_i32(code: i32) -> Code {
        match code {
            0 => Code::Ok,
            3 => Code::InvalidArgument,
            5 => Code::NotFound,
            6 => Code::AlreadyExists,
            9 => Code::FailedPrecondition,
            10 => Code::Aborted,
            4 => Code::DeadlineExceeded,
            8 => Code::ResourceExhausted,
            14 => Code::Unavailable,
            _ => Code::Other,
        }
    }
}

/// What a call answered (or must answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// A refusal: its code and `ErrorInfo` reason (empty when it had none).
    Refused {
        code: Code,
        reason: String,
    },
    Level(Level),
    Reservation(ReservationView),
    Reservations(Vec<ReservationView>),
    Receipt(ReceiptView),
    Location(LocationView),
}

impl Answer {
    pub fn refused(code: Code, reason: &str) -> Answer {
        Answer::Refused {
            code,
            reason: reason.to_owned(),
        }
    }

    pub fn code(&self) -> Code {
        match self {
            Answer::Refused { code, .. } => *code,
            _ => Code::Ok,
        }
    }

    /// A failure that leaves nothing changed and asks for a retry under the same key: the
    /// server unavailable or saturated, a lease not had in time. No rule of the model gives
    /// one; the runner retries it.
    pub fn is_transient(&self) -> bool {
        match self {
            Answer::Refused { code, reason } => match code {
                Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded => true,
                Code::Aborted => reason == "LEASE_BUSY" || reason == "LEASE_LOST",
                _ => false,
            },
            _ => false,
        }
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:#?}")
    }
}

/// A stock level: a SKU's total (`location` empty) or one location's.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Level {
    pub sku: String,
    pub location: String,
    pub on_hand: i64,
    pub reserved: i64,
    pub available: i64,
    pub safety_stock: i64,
    pub unsellable: i64,
    pub damaged: i64,
    pub quality_control: i64,
    pub incoming: i64,
    pub backorder_limit: i64,
    pub backordered: i64,
    pub preordered: i64,
    /// `(day of January 2030, quantity, max_line_quantity)`: `available_to_promise`, in
    /// GetStock only.
    pub promise: Vec<(i64, i64, i64)>,
}

impl Level {
    /// Nothing at all: a location row that may as well not be there.
    pub fn is_empty(&self) -> bool {
        self.on_hand == 0
            && self.reserved == 0
            && self.safety_stock == 0
            && self.unsellable == 0
            && self.incoming == 0
            && self.backorder_limit == 0
            && self.backordered == 0
            && self.preordered == 0
    }
}

/// A reservation: its state and lines (not its id or times).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationView {
    pub order: String,
    pub state: &'static str,
    pub lines: Vec<LineView>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineView {
    pub sku: String,
    pub quantity: i64,
    pub held: i64,
    pub confirmed: i64,
    pub released: i64,
    pub backordered: i64,
    pub preordered: i64,
    pub receipt: String,
    /// The day of 2030 `receipt` is due (`preorder_expected_at`), while units wait for it.
    pub expected_day: Option<i64>,
    /// Every unit's location, or empty when the line was split.
    pub location: String,
    pub allocations: Vec<AllocationView>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllocationView {
    pub location: String,
    pub quantity: i64,
    pub held: i64,
    pub confirmed: i64,
    pub released: i64,
    pub backordered: i64,
    pub preordered: i64,
    pub receipt: String,
    pub expected_day: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceiptView {
    pub receipt: String,
    pub sku: String,
    pub location: String,
    pub quantity: i64,
    pub received: i64,
    pub preordered: i64,
    pub remainder: i64,
    pub state: &'static str,
    /// The day of 2030 it is due.
    pub day: i64,
    /// The SKU's total after the call (in answers to the receipt calls).
    pub level: Option<Level>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocationView {
    pub location: String,
    pub priority: i32,
    pub active: bool,
}

/// The day of 2030 a timestamp falls on (1: 1 January; the model's receipts are all due
/// at midnight in 2030).
pub fn day_of(at: &prost_types::Timestamp) -> i64 {
    (at.seconds - crate::call::due(1).seconds).div_euclid(86_400) + 1
}

pub fn from_level(ns: &Namespace, level: &proto::StockLevel) -> Level {
    Level {
        sku: ns.strip(&level.sku).to_owned(),
        location: if level.location_id.is_empty() {
            String::new()
        } else {
            ns.strip_location(&level.location_id).to_owned()
        },
        on_hand: level.on_hand,
        reserved: level.reserved,
        available: level.available,
        safety_stock: level.safety_stock,
        unsellable: level.unsellable,
        damaged: level.damaged,
        quality_control: level.quality_control,
        incoming: level.incoming,
        backorder_limit: level.backorder_limit,
        backordered: level.backordered,
        preordered: level.preordered,
        promise: level
            .available_to_promise
            .iter()
            .map(|step| {
                (
                    step.at.as_ref().map_or(0, day_of),
                    step.quantity,
                    step.max_line_quantity,
                )
            })
            .collect(),
    }
}

pub fn state_name(state: i32) -> &'static str {
    match proto::ReservationState::try_from(state) {
        Ok(proto::ReservationState::Held) => "HELD",
        Ok(proto::ReservationState::Confirmed) => "CONFIRMED",
        Ok(proto::ReservationState::Released) => "RELEASED",
        Ok(proto::ReservationState::Expired) => "EXPIRED",
        _ => "UNSPECIFIED",
    }
}

pub fn receipt_state_name(state: i32) -> &'static str {
    match proto::ReceiptState::try_from(state) {
        Ok(proto::ReceiptState::Open) => "OPEN",
        Ok(proto::ReceiptState::Received) => "RECEIVED",
        Ok(proto::ReceiptState::Cancelled) => "CANCELLED",
        _ => "UNSPECIFIED",
    }
}

pub fn from_reservation(ns: &Namespace, reservation: &proto::Reservation) -> ReservationView {
    ReservationView {
        order: ns.strip(&reservation.order_id).to_owned(),
        state: state_name(reservation.state),
        lines: reservation
            .lines
            .iter()
            .map(|line| LineView {
                sku: ns.strip(&line.sku).to_owned(),
                quantity: line.quantity,
                held: line.held,
                confirmed: line.confirmed,
                released: line.released,
                backordered: line.backordered,
                preordered: line.preordered,
                receipt: ns.strip(&line.receipt_id).to_owned(),
                expected_day: line.preorder_expected_at.as_ref().map(day_of),
                location: if line.location_id.is_empty() {
                    String::new()
                } else {
                    ns.strip_location(&line.location_id).to_owned()
                },
                allocations: line
                    .allocations
                    .iter()
                    .map(|a| AllocationView {
                        location: ns.strip_location(&a.location_id).to_owned(),
                        quantity: a.quantity,
                        held: a.held,
                        confirmed: a.confirmed,
                        released: a.released,
                        backordered: a.backordered,
                        preordered: a.preordered,
                        receipt: ns.strip(&a.receipt_id).to_owned(),
                        expected_day: a.expected_at.as_ref().map(day_of),
                    })
                    .collect(),
            })
            .collect(),
    }
}

pub fn from_receipt(ns: &Namespace, receipt: &proto::Receipt) -> ReceiptView {
    ReceiptView {
        receipt: ns.strip(&receipt.receipt_id).to_owned(),
        sku: ns.strip(&receipt.sku).to_owned(),
        location: ns.strip_location(&receipt.location_id).to_owned(),
        quantity: receipt.quantity,
        received: receipt.received,
        preordered: receipt.preordered,
        remainder: receipt.remainder,
        state: receipt_state_name(receipt.state),
        day: receipt.expected_at.as_ref().map_or(0, day_of),
        level: receipt
            .level
            .as_ref()
            .map(|l| without_promise(from_level(ns, l))),
    }
}

pub fn from_location(ns: &Namespace, location: &proto::Location) -> LocationView {
    LocationView {
        location: ns.strip_location(&location.location_id).to_owned(),
        priority: location.priority,
        active: location.active,
    }
}

/// A level as written answers carry it: without `available_to_promise`, which only GetStock
/// fills in.
pub fn without_promise(mut level: Level) -> Level {
    level.promise.clear();
    level
}

/// Every level GetStock answered, by (SKU, location), the SKU's total under location "".
pub fn levels_by_key(
    ns: &Namespace,
    response: &proto::GetStockResponse,
) -> BTreeMap<(String, String), Level> {
    response
        .levels
        .iter()
        .chain(&response.location_levels)
        .map(|level| {
            let level = from_level(ns, level);
            ((level.sku.clone(), level.location.clone()), level)
        })
        .collect()
}
