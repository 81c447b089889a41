//! The forms a `Reserve` takes on the hop between replicas: the decoded call back into its
//! request message (the peer decodes it again, for the caller named beside it), and the peer's
//! reservation message back into the domain, so the replica that took the call answers it
//! as if it had written it.

use std::time::SystemTime;

use inventory_core::{
    Error,
    command::Reserve,
    domain::{
        Allocation, AllocationStrategy, LocationId, OrderId, Quantity, Reservation, ReservationId,
        ReservationLine, ReservationState, Sku,
    },
};

use crate::proto;

/// The request a client would have sent for `command` (its caller travels beside it).
pub fn reserve_request(command: &Reserve) -> proto::ReserveRequest {
    proto::ReserveRequest {
        idempotency_key: command.idempotency_key.as_str().to_owned(),
        order_id: command.order_id.as_str().to_owned(),
        lines: command
            .lines()
            .iter()
            .map(|line| proto::ReservationLine {
                sku: line.sku.as_str().to_owned(),
                quantity: line.quantity.get(),
                location_id: line
                    .location
                    .as_ref()
                    .map(|l| l.as_str().to_owned())
                    .unwrap_or_default(),
                ..Default::default()
            })
            .collect(),
        ttl: command
            .ttl
            .and_then(|ttl| prost_types::Duration::try_from(ttl.get()).ok()),
        strategy: match command.allocation.strategy {
            AllocationStrategy::Priority => proto::AllocationStrategy::Priority,
            AllocationStrategy::MostAvailable => proto::AllocationStrategy::MostAvailable,
        }
        .into(),
        allow_split: command.allocation.allow_split,
        allow_backorder: command.allocation.allow_backorder,
        allow_preorder: command.allocation.allow_preorder,
    }
}

/// A reservation as a peer encoded it. Anything that does not decode is a peer's bug (or a
/// release skew), and an internal error: the call is then run here under its key.
pub fn reservation(message: proto::Reservation) -> Result<Reservation, Error> {
    let bad = |what: &str, problem: String| {
        Error::internal(format!("peer reservation {what}: {problem}"))
    };
    let state = match proto::ReservationState::try_from(message.state) {
        Ok(proto::ReservationState::Held) => ReservationState::Held,
        Ok(proto::ReservationState::Confirmed) => ReservationState::Confirmed,
        Ok(proto::ReservationState::Released) => ReservationState::Released,
        Ok(proto::ReservationState::Expired) => ReservationState::Expired,
        _ => return Err(bad("state", message.state.to_string())),
    };
    let time = |what: &str, at: Option<prost_types::Timestamp>| {
        at.ok_or_else(|| "missing".to_owned())
            .and_then(|at| SystemTime::try_from(at).map_err(|e| e.to_string()))
            .map_err(|problem| bad(what, problem))
    };
    let lines = message
        .lines
        .into_iter()
        .map(|line| {
            Ok(ReservationLine {
                sku: Sku::parse(&line.sku).map_err(|p| bad("sku", p))?,
                quantity: Quantity::parse(line.quantity).map_err(|p| bad("quantity", p))?,
                held: line.held,
                confirmed: line.confirmed,
                released: line.released,
                backordered: line.backordered,
                preordered: line.preordered,
                allocations: line
                    .allocations
                    .into_iter()
                    .map(|a| {
                        Ok(Allocation {
                            location: LocationId::parse(&a.location_id)
                                .map_err(|p| bad("location", p))?,
                            quantity: a.quantity,
                            held: a.held,
                            confirmed: a.confirmed,
                            released: a.released,
                            // A forwarded Reserve never waits: lines that may wait are
                            // placed where the call arrived.
                            backordered: 0,
                            preordered: 0,
                            receipt: None,
                        })
                    })
                    .collect::<Result<_, Error>>()?,
            })
        })
        .collect::<Result<_, Error>>()?;
    Ok(Reservation {
        id: ReservationId::parse(&message.reservation_id).map_err(|p| bad("id", p))?,
        order_id: OrderId::parse(&message.order_id).map_err(|p| bad("order id", p))?,
        state,
        lines,
        created_at: time("created_at", message.created_at)?,
        expires_at: time("expires_at", message.expires_at)?,
    })
}
