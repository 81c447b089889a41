//! Answers out: core values become protobuf messages here, and nowhere else.

use std::time::SystemTime;

use inventory_core::{
    command::{MovementList, ReservationList},
    domain::{Movement, MovementKind, Reservation, ReservationLine, ReservationState, StockLevel},
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
        proto::StockLevel {
            available: self.available(),
            sku: self.sku.as_str().to_owned(),
            on_hand: self.on_hand,
            reserved: self.reserved,
            version: self.version,
        }
    }
}

/// The levels of a `GetStock`, in request order.
impl Encode for Vec<StockLevel> {
    type Message = proto::GetStockResponse;

    fn into_message(self) -> proto::GetStockResponse {
        proto::GetStockResponse {
            levels: self.into_iter().map(Encode::into_message).collect(),
        }
    }
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
            sku: self.sku.as_str().to_owned(),
            quantity: self.quantity.get(),
            held: self.held,
            confirmed: self.confirmed,
            released: self.released,
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

impl Encode for Movement {
    type Message = proto::StockMovement;

    fn into_message(self) -> proto::StockMovement {
        let kind = match self.kind {
            MovementKind::Opening => proto::MovementKind::Opening,
            MovementKind::Adjusted => proto::MovementKind::Adjusted,
            MovementKind::Set => proto::MovementKind::Set,
            MovementKind::Held => proto::MovementKind::Held,
            MovementKind::Confirmed => proto::MovementKind::Confirmed,
            MovementKind::Released => proto::MovementKind::Released,
            MovementKind::Expired => proto::MovementKind::Expired,
        };
        proto::StockMovement {
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
            } => (
                proto::EventType::StockAdjusted,
                Subject::Sku(sku.as_str().to_owned()),
                Payload::StockAdjusted(proto::StockAdjusted {
                    delta,
                    reason,
                    level: Some(level.into_message()),
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
                    ReservationEvent::PartiallyReleased => {
                        proto::EventType::ReservationPartiallyReleased
                    }
                },
                Subject::ReservationId(reservation_id.to_string()),
                Payload::ReservationChanged(proto::ReservationChanged {
                    order_id: order_id.as_str().to_owned(),
                    state: state.into_message().into(),
                    lines: lines.into_iter().map(Encode::into_message).collect(),
                    levels: levels.into_iter().map(Encode::into_message).collect(),
                    expires_at: expires_at.map(timestamp),
                }),
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
        }
    }
}

fn timestamp(time: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(time)
}
