//! The `inventory.v1.InventoryService` implementation: parse the request, call the core, map
//! the answer. No rule lives here.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant, SystemTime},
};

use inventory_core::{
    Error,
    command::{AdjustStock, GetStock, Reserve, WatchEvents},
    domain::{Line, Reservation, ReservationState, StockLevel},
    events::{Change, Event},
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, metadata::MetadataMap};
use tracing::Instrument as _;

use crate::{
    auth::{Action, Gate},
    events::EventHub,
    parse::reservation_ref,
    proto,
    startup::Service,
    status::to_status,
};

#[derive(Debug)]
pub struct InventoryApi {
    inventory: Arc<Service>,
    auth: Gate,
    events: EventHub,
    /// Longest a `Reserve` waits for busy leases, whatever the client's deadline.
    lease_wait: Duration,
    /// Calls in flight (streams excepted); none left means `RESOURCE_EXHAUSTED` at once.
    in_flight: Arc<Semaphore>,
}

impl InventoryApi {
    pub fn new(
        inventory: Arc<Service>,
        auth: Gate,
        events: EventHub,
        lease_wait: Duration,
        max_in_flight: usize,
    ) -> Self {
        Self {
            inventory,
            auth,
            events,
            lease_wait,
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
        }
    }

    /// Load shedding: a saturated server refuses at once instead of queueing without bound.
    fn admit(&self) -> Result<OwnedSemaphorePermit, Status> {
        Arc::clone(&self.in_flight)
            .try_acquire_owned()
            .map_err(|_| to_status(Error::Saturated))
    }
}

/// When a call must have answered: the client's deadline less a margin for the answer to
/// travel, so the client hears `DEADLINE_EXCEEDED` from us rather than giving up on its own.
fn answer_by(metadata: &MetadataMap) -> Option<Instant> {
    let timeout = client_timeout(metadata)?;
    let margin = (timeout / 5).clamp(Duration::from_millis(5), Duration::from_millis(100));
    Some(Instant::now() + timeout.saturating_sub(margin))
}

/// Runs `work` within the caller's deadline, if it set one.
async fn within<T>(
    answer_by: Option<Instant>,
    work: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match answer_by {
        None => work.await,
        Some(deadline) => tokio::time::timeout_at(deadline.into(), work)
            .await
            .unwrap_or(Err(Error::DeadlineExceeded)),
    }
}

/// The `grpc-timeout` header (`<digits><unit>`, unit one of H M S m u n), if present and valid.
fn client_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let raw = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = raw.split_at(raw.len().checked_sub(1)?);
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value.saturating_mul(3600)),
        "M" => Duration::from_secs(value.saturating_mul(60)),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

impl From<StockLevel> for proto::StockLevel {
    fn from(level: StockLevel) -> Self {
        Self {
            available: level.available(),
            sku: level.sku.as_str().to_owned(),
            on_hand: level.on_hand,
            reserved: level.reserved,
            version: level.version,
        }
    }
}

impl From<ReservationState> for proto::ReservationState {
    fn from(state: ReservationState) -> Self {
        match state {
            ReservationState::Held => Self::Held,
            ReservationState::Confirmed => Self::Confirmed,
            ReservationState::Released => Self::Released,
            ReservationState::Expired => Self::Expired,
        }
    }
}

fn lines(lines: Vec<Line>) -> Vec<proto::ReservationLine> {
    lines
        .into_iter()
        .map(|line| proto::ReservationLine {
            sku: line.sku.as_str().to_owned(),
            quantity: line.quantity.get(),
        })
        .collect()
}

impl From<Event> for proto::Event {
    fn from(event: Event) -> Self {
        use proto::event::{Payload, Subject};
        let (kind, subject, payload) = match event.change {
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
                    level: Some(level.into()),
                }),
            ),
            Change::Reservation {
                reservation_id,
                order_id,
                state,
                lines: changed,
                levels,
            } => (
                match state {
                    ReservationState::Held => proto::EventType::ReservationHeld,
                    ReservationState::Confirmed => proto::EventType::ReservationConfirmed,
                    ReservationState::Released => proto::EventType::ReservationReleased,
                    ReservationState::Expired => proto::EventType::ReservationExpired,
                },
                Subject::ReservationId(reservation_id.to_string()),
                Payload::ReservationChanged(proto::ReservationChanged {
                    order_id: order_id.as_str().to_owned(),
                    state: proto::ReservationState::from(state).into(),
                    lines: lines(changed),
                    levels: levels.into_iter().map(Into::into).collect(),
                }),
            ),
        };
        Self {
            sequence: event.position,
            event_id: event.id.hyphenated().to_string(),
            r#type: kind.into(),
            occurred_at: Some(timestamp(event.occurred_at)),
            subject: Some(subject),
            payload: Some(payload),
        }
    }
}

impl From<Reservation> for proto::Reservation {
    fn from(reservation: Reservation) -> Self {
        Self {
            reservation_id: reservation.id.to_string(),
            order_id: reservation.order_id.as_str().to_owned(),
            state: proto::ReservationState::from(reservation.state).into(),
            lines: lines(reservation.lines),
            created_at: Some(timestamp(reservation.created_at)),
            expires_at: Some(timestamp(reservation.expires_at)),
        }
    }
}

fn timestamp(time: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(time)
}

type EventStream = Pin<Box<dyn Stream<Item = Result<proto::Event, Status>> + Send>>;

#[tonic::async_trait]
impl proto::inventory_service_server::InventoryService for InventoryApi {
    #[tracing::instrument(skip_all, fields(rpc = "AdjustStock"))]
    async fn adjust_stock(
        &self,
        request: Request<proto::AdjustStockRequest>,
    ) -> Result<Response<proto::StockLevel>, Status> {
        let principal = self.auth.authorize(&request, Action::Adjust)?;
        let _admitted = self.admit()?;
        let answer_by = answer_by(request.metadata());
        let mut command = AdjustStock::try_from(request.into_inner()).map_err(to_status)?;
        command.caller = principal.caller().clone();
        let level = within(answer_by, self.inventory.adjust_stock(&command))
            .await
            .map_err(to_status)?;
        Ok(Response::new(level.into()))
    }

    #[tracing::instrument(skip_all, fields(rpc = "GetStock"))]
    async fn get_stock(
        &self,
        request: Request<proto::GetStockRequest>,
    ) -> Result<Response<proto::GetStockResponse>, Status> {
        self.auth.authorize(&request, Action::Read)?;
        let _admitted = self.admit()?;
        let answer_by = answer_by(request.metadata());
        let query = GetStock::try_from(request.into_inner()).map_err(to_status)?;
        let levels = within(answer_by, self.inventory.get_stock(&query))
            .await
            .map_err(to_status)?;
        Ok(Response::new(proto::GetStockResponse {
            levels: levels.into_iter().map(Into::into).collect(),
        }))
    }

    #[tracing::instrument(skip_all, fields(rpc = "Reserve"))]
    async fn reserve(
        &self,
        request: Request<proto::ReserveRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        let principal = self.auth.authorize(&request, Action::Reserve)?;
        // Moves into the task below: the permit counts the work, which may outlive the answer.
        let admitted = self.admit()?;
        let answer_by = answer_by(request.metadata());
        let server_bound = Instant::now() + self.lease_wait;
        // Leases are waited for until the server's bound or the caller's deadline, whichever
        // comes first; which one ran out decides between ABORTED and DEADLINE_EXCEEDED.
        let lease_deadline = answer_by.map_or(server_bound, |by| by.min(server_bound));
        let deadline_binds = answer_by.is_some_and(|by| by < server_bound);
        let mut command = Reserve::try_from(request.into_inner()).map_err(to_status)?;
        command.caller = principal.caller().clone();
        // Runs on its own task: a client that gives up (deadline, disconnect) drops this
        // handler, and would otherwise cancel the work between lease and release, leaving the
        // SKU blocked for a whole lease TTL. The reservation finishes and releases either way;
        // a retry with the same key then gets its outcome. The in-flight permit goes with it,
        // so a flood of calls that give up early still never runs more than MAX_IN_FLIGHT
        // reservations at once.
        let inventory = Arc::clone(&self.inventory);
        let work = tokio::spawn(
            async move {
                let _admitted = admitted;
                inventory.reserve(&command, lease_deadline).await
            }
            .instrument(tracing::Span::current()),
        );
        let outcome = within(answer_by, async {
            work.await
                .unwrap_or_else(|error| Err(Error::internal(error)))
        })
        .await;
        let reservation = match outcome {
            Err(Error::LeaseBusy { .. }) if deadline_binds => Err(Error::DeadlineExceeded),
            other => other,
        }
        .map_err(to_status)?;
        Ok(Response::new(reservation.into()))
    }

    #[tracing::instrument(skip_all, fields(rpc = "ConfirmReservation"))]
    async fn confirm_reservation(
        &self,
        request: Request<proto::ConfirmReservationRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        let principal = self.auth.authorize(&request, Action::Reserve)?;
        let _admitted = self.admit()?;
        let answer_by = answer_by(request.metadata());
        let target = reservation_ref(&request.get_ref().reservation_id, principal.write_scope())
            .map_err(to_status)?;
        let reservation = within(answer_by, self.inventory.confirm(target))
            .await
            .map_err(to_status)?;
        Ok(Response::new(reservation.into()))
    }

    #[tracing::instrument(skip_all, fields(rpc = "ReleaseReservation"))]
    async fn release_reservation(
        &self,
        request: Request<proto::ReleaseReservationRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        let principal = self.auth.authorize(&request, Action::Reserve)?;
        let _admitted = self.admit()?;
        let answer_by = answer_by(request.metadata());
        let target = reservation_ref(&request.get_ref().reservation_id, principal.write_scope())
            .map_err(to_status)?;
        let reservation = within(answer_by, self.inventory.release(target))
            .await
            .map_err(to_status)?;
        Ok(Response::new(reservation.into()))
    }

    #[tracing::instrument(skip_all, fields(rpc = "GetReservation"))]
    async fn get_reservation(
        &self,
        request: Request<proto::GetReservationRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        let principal = self.auth.authorize(&request, Action::Read)?;
        let _admitted = self.admit()?;
        let answer_by = answer_by(request.metadata());
        let target = reservation_ref(&request.get_ref().reservation_id, principal.read_scope())
            .map_err(to_status)?;
        let reservation = within(answer_by, self.inventory.get_reservation(target))
            .await
            .map_err(to_status)?;
        Ok(Response::new(reservation.into()))
    }

    type WatchEventsStream = EventStream;

    #[tracing::instrument(skip_all, fields(rpc = "WatchEvents"))]
    async fn watch_events(
        &self,
        request: Request<proto::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        self.auth.authorize(&request, Action::Watch)?;
        let command = WatchEvents::try_from(request.into_inner()).map_err(to_status)?;
        let events = self.events.watch(command).await.map_err(to_status)?;
        Ok(Response::new(Box::pin(ReceiverStream::new(events))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(timeout: &str) -> MetadataMap {
        let mut metadata = MetadataMap::new();
        metadata.insert("grpc-timeout", timeout.parse().unwrap());
        metadata
    }

    #[test]
    fn grpc_timeout_header_is_parsed_in_every_unit() {
        assert_eq!(
            client_timeout(&metadata("2S")),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            client_timeout(&metadata("50m")),
            Some(Duration::from_millis(50))
        );
        assert_eq!(
            client_timeout(&metadata("1H")),
            Some(Duration::from_secs(3600))
        );
        assert_eq!(
            client_timeout(&metadata("7u")),
            Some(Duration::from_micros(7))
        );
        assert_eq!(client_timeout(&metadata("x")), None);
        assert_eq!(client_timeout(&metadata("10q")), None);
        assert_eq!(client_timeout(&MetadataMap::new()), None);
    }
}
