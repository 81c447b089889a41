//! Answers out: core values become protobuf messages here, and nowhere else.

use std::time::SystemTime;

use inventory_core::{
    command::{
        MovementList, Promise, ReceiptChanged, ReceiptList, ReservationList, StockLevels,
        Transferred,
    },
    domain::{
        Allocation, Location, Movement, MovementKind, Receipt, ReceiptState, Reservation,
        ReservationLine, ReservationState, StockLevel, StockState,
    },
    events::{Change, Event, ReservationEvent},
};

use crate::proto;

/// A core value as the message that carries it on the wire.
pub trait Encode {
    type Message;

    fn into_message(self) -> Self::Message;
}

impl Encode for StockLevel {
    type Message = proto::StockLevel;

    fn into_message(self) -> proto::StockLevel {
        let states = self.states;
        proto::StockLevel {
            available: self.available(),
            sku: self.sku.as_str().to_owned(),
            on_hand: self.on_hand,
            reserved: self.reserved,
            version: self.version,
            location_id: self
                .location
                .map(|l| l.as_str().to_owned())
                .unwrap_or_default(),
            safety_stock: states.safety_stock,
            unsellable: states.unsellable(),
            incoming: states.incoming,
            backorder_limit: states.backorder_limit,
            backordered: states.backordered,
            damaged: states.damaged,
            quality_control: states.quality_control,
            preordered: states.preordered,
            available_to_promise: Vec::new(),
        }
    }
}

/// The levels of a `GetStock`: the totals in request order, and the locations' if asked.
impl Encode for StockLevels {
    type Message = proto::GetStockResponse;

    fn into_message(self) -> proto::GetStockResponse {
        let with_promises = |levels: Vec<StockLevel>, promises: Vec<Vec<Promise>>| {
            let mut promises = promises.into_iter();
            levels
                .into_iter()
                .map(|level| proto::StockLevel {
                    available_to_promise: promises
                        .next()
                        .unwrap_or_default()
                        .into_iter()
                        .map(|step| proto::AvailableToPromise {
                            at: Some(timestamp(step.at)),
                            quantity: step.units,
                            max_line_quantity: step.one_line,
                        })
                        .collect(),
                    ..level.into_message()
                })
                .collect()
        };
        proto::GetStockResponse {
            levels: with_promises(self.totals, self.promises),
            location_levels: with_promises(self.by_location, self.location_promises),
        }
    }
}

impl Encode for Receipt {
    type Message = proto::Receipt;

    fn into_message(self) -> proto::Receipt {
        let state = match self.state {
            ReceiptState::Open => proto::ReceiptState::Open,
            ReceiptState::Received => proto::ReceiptState::Received,
            ReceiptState::Cancelled => proto::ReceiptState::Cancelled,
        };
        proto::Receipt {
            late: self.late(SystemTime::now()),
            remainder: self.remainder(),
            receipt_id: self.id.as_str().to_owned(),
            sku: self.sku.as_str().to_owned(),
            location_id: self.location.as_str().to_owned(),
            quantity: self.quantity,
            received: self.received,
            preordered: self.preordered,
            expected_at: Some(timestamp(self.expected_at)),
            state: state.into(),
            created_at: Some(timestamp(self.created_at)),
            level: None,
        }
    }
}

impl Encode for ReceiptChanged {
    type Message = proto::Receipt;

    fn into_message(self) -> proto::Receipt {
        proto::Receipt {
            level: Some(self.level.into_message()),
            ..self.receipt.into_message()
        }
    }
}

impl Encode for ReceiptList {
    type Message = proto::ListReceiptsResponse;

    fn into_message(self) -> proto::ListReceiptsResponse {
        proto::ListReceiptsResponse {
            receipts: self
                .receipts
                .into_iter()
                .map(Encode::into_message)
                .collect(),
            next_page_token: self.next_page_token,
        }
    }
}

impl Encode for Transferred {
    type Message = proto::TransferStockResponse;

    fn into_message(self) -> proto::TransferStockResponse {
        proto::TransferStockResponse {
            level: Some(self.total.into_message()),
            location_levels: vec![self.from.into_message(), self.to.into_message()],
        }
    }
}

impl Encode for Location {
    type Message = proto::Location;

    fn into_message(self) -> proto::Location {
        proto::Location {
            location_id: self.id.as_str().to_owned(),
            priority: self.priority,
            active: self.active,
        }
    }
}

/// Every location, in allocation order.
impl Encode for Vec<Location> {
    type Message = proto::ListLocationsResponse;

    fn into_message(self) -> proto::ListLocationsResponse {
        proto::ListLocationsResponse {
            locations: self.into_iter().map(Encode::into_message).collect(),
        }
    }
}

impl Encode for Allocation {
    type Message = proto::Allocation;

    fn into_message(self) -> proto::Allocation {
        proto::Allocation {
            location_id: self.location.as_str().to_owned(),
            quantity: self.quantity,
            held: self.held,
            confirmed: self.confirmed,
            released: self.released,
            backordered: self.backordered,
            preordered: self.preordered,
            receipt_id: self
                .receipt
                .as_ref()
                .map(|p| p.receipt.as_str().to_owned())
                .unwrap_or_default(),
            expected_at: self.receipt.map(|p| timestamp(p.expected_at)),
        }
    }
}

/// The totals (`location: None`) and the locations' levels among `levels`.
fn split_levels(levels: Vec<StockLevel>) -> (Vec<proto::StockLevel>, Vec<proto::StockLevel>) {
    let (totals, at): (Vec<StockLevel>, Vec<StockLevel>) =
        levels.into_iter().partition(|l| l.location.is_none());
    (
        totals.into_iter().map(Encode::into_message).collect(),
        at.into_iter().map(Encode::into_message).collect(),
    )
}

impl Encode for ReservationState {
    type Message = proto::ReservationState;

    fn into_message(self) -> proto::ReservationState {
        match self {
            ReservationState::Held => proto::ReservationState::Held,
            ReservationState::Confirmed => proto::ReservationState::Confirmed,
            ReservationState::Released => proto::ReservationState::Released,
            ReservationState::Expired => proto::ReservationState::Expired,
        }
    }
}

impl Encode for ReservationLine {
    type Message = proto::ReservationLine;

    fn into_message(self) -> proto::ReservationLine {
        proto::ReservationLine {
            location_id: self
                .single_location()
                .map(|l| l.as_str().to_owned())
                .unwrap_or_default(),
            sku: self.sku.as_str().to_owned(),
            quantity: self.quantity.get(),
            held: self.held,
            confirmed: self.confirmed,
            released: self.released,
            backordered: self.backordered,
            preordered: self.preordered,
            preorder_expected_at: self
                .allocations
                .iter()
                .filter_map(|a| a.receipt.as_ref().filter(|_| a.preordered > 0))
                .map(|p| timestamp(p.expected_at))
                .next(),
            receipt_id: self
                .allocations
                .iter()
                .filter_map(|a| a.receipt.as_ref().filter(|_| a.preordered > 0))
                .map(|p| p.receipt.as_str().to_owned())
                .next()
                .unwrap_or_default(),
            allocations: self
                .allocations
                .into_iter()
                .map(Encode::into_message)
                .collect(),
        }
    }
}

impl Encode for Reservation {
    type Message = proto::Reservation;

    fn into_message(self) -> proto::Reservation {
        proto::Reservation {
            reservation_id: self.id.to_string(),
            order_id: self.order_id.as_str().to_owned(),
            state: self.state.into_message().into(),
            lines: self.lines.into_iter().map(Encode::into_message).collect(),
            created_at: Some(timestamp(self.created_at)),
            expires_at: Some(timestamp(self.expires_at)),
        }
    }
}

/// The reservations of a cancelled order.
impl Encode for Vec<Reservation> {
    type Message = proto::CancelOrderResponse;

    fn into_message(self) -> proto::CancelOrderResponse {
        proto::CancelOrderResponse {
            reservations: self.into_iter().map(Encode::into_message).collect(),
        }
    }
}

/// The levels after a batch of counts, in request order.
#[derive(Debug)]
pub struct BatchLevels(pub Vec<StockLevel>);

impl Encode for BatchLevels {
    type Message = proto::BatchSetStockResponse;

    fn into_message(self) -> proto::BatchSetStockResponse {
        proto::BatchSetStockResponse {
            levels: self.0.into_iter().map(Encode::into_message).collect(),
        }
    }
}

pub fn movement_kind(kind: MovementKind) -> proto::MovementKind {
    match kind {
        MovementKind::Opening => proto::MovementKind::Opening,
        MovementKind::Adjusted => proto::MovementKind::Adjusted,
        MovementKind::Set => proto::MovementKind::Set,
        MovementKind::Held => proto::MovementKind::Held,
        MovementKind::Confirmed => proto::MovementKind::Confirmed,
        MovementKind::Released => proto::MovementKind::Released,
        MovementKind::Expired => proto::MovementKind::Expired,
        MovementKind::Transferred => proto::MovementKind::Transferred,
        MovementKind::PolicySet => proto::MovementKind::PolicySet,
        MovementKind::StateMoved => proto::MovementKind::StateMoved,
        MovementKind::ReceiptExpected => proto::MovementKind::ReceiptExpected,
        MovementKind::Received => proto::MovementKind::Received,
        MovementKind::ReceiptCancelled => proto::MovementKind::ReceiptCancelled,
        MovementKind::Filled => proto::MovementKind::Filled,
    }
}

pub fn stock_state(state: Option<StockState>) -> proto::StockState {
    match state {
        None => proto::StockState::Unspecified,
        Some(StockState::Sellable) => proto::StockState::Sellable,
        Some(StockState::Damaged) => proto::StockState::Damaged,
        Some(StockState::QualityControl) => proto::StockState::QualityControl,
    }
}

impl Encode for Movement {
    type Message = proto::StockMovement;

    fn into_message(self) -> proto::StockMovement {
        let kind = movement_kind(self.kind);
        let d = self.states_delta;
        proto::StockMovement {
            damaged_delta: d.damaged,
            quality_control_delta: d.quality_control,
            safety_stock_delta: d.safety_stock,
            backorder_limit_delta: d.backorder_limit,
            backordered_delta: d.backordered,
            preordered_delta: d.preordered,
            incoming_delta: d.incoming,
            receipt_id: self.receipt_id.unwrap_or_default(),
            location_id: self
                .level
                .location
                .as_ref()
                .map(|l| l.as_str().to_owned())
                .unwrap_or_default(),
            sku: self.level.sku.as_str().to_owned(),
            version: self.level.version,
            kind: kind.into(),
            occurred_at: Some(timestamp(self.occurred_at)),
            on_hand_delta: self.on_hand_delta,
            reserved_delta: self.reserved_delta,
            level: Some(self.level.into_message()),
            reason: self.reason,
            actor: self.actor,
            reservation_id: self
                .reservation_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            order_id: self
                .order_id
                .map(|id| id.as_str().to_owned())
                .unwrap_or_default(),
            idempotency_key: self.idempotency_key.unwrap_or_default(),
        }
    }
}

impl Encode for MovementList {
    type Message = proto::ListStockMovementsResponse;

    fn into_message(self) -> proto::ListStockMovementsResponse {
        proto::ListStockMovementsResponse {
            movements: self
                .movements
                .into_iter()
                .map(Encode::into_message)
                .collect(),
            next_page_token: self.next_page_token,
        }
    }
}

impl Encode for ReservationList {
    type Message = proto::ListReservationsResponse;

    fn into_message(self) -> proto::ListReservationsResponse {
        proto::ListReservationsResponse {
            reservations: self
                .reservations
                .into_iter()
                .map(Encode::into_message)
                .collect(),
            next_page_token: self.next_page_token,
        }
    }
}

impl Encode for Event {
    type Message = proto::Event;

    fn into_message(self) -> proto::Event {
        use proto::event::{Payload, Subject};
        let (kind, subject, payload) = match self.change {
            Change::StockAdjusted {
                sku,
                delta,
                reason,
                level,
                location_level,
            } => (
                proto::EventType::StockAdjusted,
                Subject::Sku(sku.as_str().to_owned()),
                Payload::StockAdjusted(proto::StockAdjusted {
                    delta,
                    reason,
                    level: Some(level.into_message()),
                    location_level: location_level.map(Encode::into_message),
                }),
            ),
            Change::StockStateChanged {
                sku,
                kind,
                reason,
                level,
                location_level,
                quantity,
                from,
                to,
                receipt_id,
            } => (
                proto::EventType::StockStateChanged,
                Subject::Sku(sku.as_str().to_owned()),
                Payload::StockStateChanged(proto::StockStateChanged {
                    kind: movement_kind(kind).into(),
                    reason,
                    level: Some(level.into_message()),
                    location_level: Some(location_level.into_message()),
                    quantity,
                    from_state: stock_state(from).into(),
                    to_state: stock_state(to).into(),
                    receipt_id: receipt_id.unwrap_or_default(),
                }),
            ),
            Change::StockTransferred {
                sku,
                quantity,
                reason,
                level,
                from,
                to,
            } => (
                proto::EventType::StockTransferred,
                Subject::Sku(sku.as_str().to_owned()),
                Payload::StockTransferred(proto::StockTransferred {
                    from_location_id: from
                        .location
                        .as_ref()
                        .map(|l| l.as_str().to_owned())
                        .unwrap_or_default(),
                    to_location_id: to
                        .location
                        .as_ref()
                        .map(|l| l.as_str().to_owned())
                        .unwrap_or_default(),
                    quantity,
                    reason,
                    level: Some(level.into_message()),
                    location_levels: vec![from.into_message(), to.into_message()],
                }),
            ),
            Change::Reservation {
                reservation_id,
                order_id,
                what,
                state,
                lines,
                levels,
                expires_at,
            } => (
                match what {
                    ReservationEvent::Held => proto::EventType::ReservationHeld,
                    ReservationEvent::Confirmed => proto::EventType::ReservationConfirmed,
                    ReservationEvent::Released => proto::EventType::ReservationReleased,
                    ReservationEvent::Expired => proto::EventType::ReservationExpired,
                    ReservationEvent::PartiallyConfirmed => {
                        proto::EventType::ReservationPartiallyConfirmed
                    }
                    ReservationEvent::Filled => proto::EventType::ReservationFilled,
                    ReservationEvent::PreorderAtRisk => proto::EventType::ReservationPreorderAtRisk,
                    ReservationEvent::PartiallyReleased => {
                        proto::EventType::ReservationPartiallyReleased
                    }
                },
                Subject::ReservationId(reservation_id.to_string()),
                {
                    let (levels, location_levels) = split_levels(levels);
                    Payload::ReservationChanged(proto::ReservationChanged {
                        order_id: order_id.as_str().to_owned(),
                        state: state.into_message().into(),
                        lines: lines.into_iter().map(Encode::into_message).collect(),
                        levels,
                        expires_at: expires_at.map(timestamp),
                        location_levels,
                    })
                },
            ),
            Change::Availability {
                sku,
                out_of_stock,
                level,
            } => (
                if out_of_stock {
                    proto::EventType::OutOfStock
                } else {
                    proto::EventType::BackInStock
                },
                Subject::Sku(sku.as_str().to_owned()),
                Payload::Availability(proto::AvailabilityChanged {
                    level: Some(level.into_message()),
                }),
            ),
            Change::ReservationExtended {
                reservation_id,
                order_id,
                lines,
                expires_at,
            } => (
                proto::EventType::ReservationExtended,
                Subject::ReservationId(reservation_id.to_string()),
                Payload::ReservationChanged(proto::ReservationChanged {
                    order_id: order_id.as_str().to_owned(),
                    state: proto::ReservationState::Held.into(),
                    lines: lines.into_iter().map(Encode::into_message).collect(),
                    levels: Vec::new(),
                    expires_at: Some(timestamp(expires_at)),
                    location_levels: Vec::new(),
                }),
            ),
        };
        proto::Event {
            sequence: self.position,
            event_id: self.id.hyphenated().to_string(),
            r#type: kind.into(),
            occurred_at: Some(timestamp(self.occurred_at)),
            subject: Some(subject),
            payload: Some(payload),
            epoch: self.epoch.id.to_string(),
        }
    }
}

pub(super) fn timestamp(time: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(time)
}
