//! The `inventory.v1.InventoryService` implementation. Every unary call takes one path:
//! [`InventoryApi::begin`] (authorize, find the caller's tenant, admit, the call's
//! [`Budget`], decode for the caller),
//! the core use case within the budget (in the handler, or for `Reserve` on a task of its
//! own), then [`respond`] (encode, or map the error). No rule and no protobuf type is built
//! here.

use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    time::{Duration, Instant},
};

use inventory_core::{Error, budget::Budget, quota::HoldCaps};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_stream::{Stream, wrappers::ReceiverStream};
use tonic::{Request, Response, Status, metadata::MetadataMap};
use tracing::Instrument as _;

use crate::{
    Service,
    access::Subject,
    auth::{Action, CallerPermit, Gate, Principal},
    proto,
    status::to_status,
    tenants::{TenantCore, Tenants},
    wire::{Decode, Encode},
};

#[derive(Debug)]
pub struct InventoryApi {
    tenants: Tenants,
    auth: Gate,
    /// Calls in flight (streams excepted); none left means `RESOURCE_EXHAUSTED` at once.
    in_flight: Arc<Semaphore>,
}

impl InventoryApi {
    pub fn new(tenants: Tenants, auth: Gate, admission: &crate::metrics::Admission) -> Self {
        Self {
            tenants,
            auth,
            in_flight: Arc::clone(&admission.permits),
        }
    }

    /// Load shedding: a saturated server refuses at once instead of queueing without bound.
    fn admit(&self) -> Result<OwnedSemaphorePermit, Status> {
        Arc::clone(&self.in_flight)
            .try_acquire_owned()
            .map_err(|_| to_status(Error::Saturated))
    }

    /// What every unary call does before its use case runs: authorize, admit, set the call's
    /// [`Budget`] from its deadline, decode the request for the caller.
    fn begin<R: Decode + Subject>(
        &self,
        request: Request<R>,
        action: Action,
    ) -> Result<Call<R::Command>, Status> {
        let principal = self.auth.authorize(&request, action)?;
        let core = self.core(&principal)?;
        let admitted = self.admit()?;
        let tenant_admitted = core.admit().map_err(to_status)?;
        let caller_admitted = self.auth.admit(&principal).map_err(to_status)?;
        let budget = Budget::from_timeout(client_timeout(request.metadata()), Instant::now());
        let caps = principal.limits().caps;
        let command = request
            .into_inner()
            .into_command(&principal)
            .map_err(to_status)?;
        Ok(Call {
            inventory: Arc::clone(&core.inventory),
            command,
            budget,
            caps,
            admitted: (admitted, tenant_admitted, caller_admitted),
        })
    }

    /// The core of the principal's tenant (so every later step works in that tenant's data
    /// alone), recorded on the call's span; an operator's choice of tenant is logged.
    fn core(&self, principal: &Principal) -> Result<&Arc<TenantCore>, Status> {
        let span = tracing::Span::current();
        span.record("tenant", principal.tenant().as_str());
        if principal.is_operator() {
            span.record("operator", principal.caller().as_str());
            tracing::info!(
                tenant = %principal.tenant(),
                operator = principal.caller().as_str(),
                "operator call in a tenant it chose"
            );
        }
        self.tenants.core(principal.tenant()).map_err(to_status)
    }

    /// A unary call whose use case runs in the handler, within its budget: a caller that
    /// gives up ends it (an abandoned transaction rolls back), and its permit and connection
    /// are free at once.
    async fn unary<R, T, Fut>(
        &self,
        request: Request<R>,
        action: Action,
        call: impl FnOnce(Arc<Service>, R::Command, Budget) -> Fut,
    ) -> Result<Response<T::Message>, Status>
    where
        R: Decode + Subject,
        Fut: Future<Output = Result<T, Error>>,
        T: Encode,
    {
        let Call {
            inventory,
            command,
            budget,
            admitted,
            ..
        } = self.begin(request, action)?;
        let answer = budget.run(call(inventory, command, budget)).await;
        drop(admitted);
        respond(answer)
    }

    /// A unary call whose use case runs to completion on a task of its own, holding the
    /// in-flight permit, whatever the caller does. A client that gives up (deadline,
    /// disconnect) drops the handler, which would otherwise cancel a `Reserve` between a lease
    /// and its release, leaving the SKU blocked for a whole lease TTL. The work finishes
    /// either way, and a retry with the same idempotency key gets its outcome; a flood of
    /// calls that give up early still never runs more than `MAX_IN_FLIGHT` at once. The caller
    /// hears `DEADLINE_EXCEEDED` when its budget ends.
    async fn unary_detached<R, T, Fut>(
        &self,
        request: Request<R>,
        action: Action,
        call: impl FnOnce(Arc<Service>, R::Command, Budget, HoldCaps) -> Fut,
    ) -> Result<Response<T::Message>, Status>
    where
        R: Decode + Subject,
        Fut: Future<Output = Result<T, Error>> + Send + 'static,
        T: Encode + Send + 'static,
    {
        let Call {
            inventory,
            command,
            budget,
            caps,
            admitted,
        } = self.begin(request, action)?;
        // Boxed: the use case's future is large, and spawning copies whatever is spawned.
        let work = Box::pin(call(inventory, command, budget, caps));
        let work = tokio::spawn(
            async move {
                let _admitted = admitted;
                work.await
            }
            .instrument(tracing::Span::current()),
        );
        let answer = budget
            .run(async {
                work.await
                    .unwrap_or_else(|error| Err(Error::internal(error)))
            })
            .await;
        respond(answer)
    }
}

/// A unary call, admitted and decoded.
struct Call<C> {
    /// The core of the caller's tenant.
    inventory: Arc<Service>,
    command: C,
    budget: Budget,
    /// The caller's caps on what it holds (checked by `Reserve`).
    caps: HoldCaps,
    /// Its place among the replica's calls in flight, its tenant's and its caller's.
    admitted: (
        OwnedSemaphorePermit,
        Option<OwnedSemaphorePermit>,
        CallerPermit,
    ),
}

/// The use case's answer on the wire: a message, or the status its error maps to.
fn respond<T: Encode>(answer: Result<T, Error>) -> Result<Response<T::Message>, Status> {
    Ok(Response::new(answer.map_err(to_status)?.into_message()))
}

/// The `grpc-timeout` header (`<digits><unit>`, unit one of H M S m u n), if present and valid.
pub(crate) fn client_timeout(metadata: &MetadataMap) -> Option<Duration> {
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

type EventStream = Pin<Box<dyn Stream<Item = Result<proto::Event, Status>> + Send>>;

#[tonic::async_trait]
impl proto::inventory_service_server::InventoryService for InventoryApi {
    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "AdjustStock"))]
    async fn adjust_stock(
        &self,
        request: Request<proto::AdjustStockRequest>,
    ) -> Result<Response<proto::StockLevel>, Status> {
        self.unary(
            request,
            Action::Adjust,
            |inventory, command, _| async move { inventory.adjust_stock(&command).await },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "SetStock"))]
    async fn set_stock(
        &self,
        request: Request<proto::SetStockRequest>,
    ) -> Result<Response<proto::StockLevel>, Status> {
        self.unary(
            request,
            Action::Adjust,
            |inventory, command, _| async move { inventory.set_stock(&command).await },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "BatchSetStock"))]
    async fn batch_set_stock(
        &self,
        request: Request<proto::BatchSetStockRequest>,
    ) -> Result<Response<proto::BatchSetStockResponse>, Status> {
        self.unary(
            request,
            Action::Adjust,
            |inventory, command, _| async move {
                inventory
                    .batch_set_stock(&command)
                    .await
                    .map(crate::wire::BatchLevels)
            },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "ListStockMovements"))]
    async fn list_stock_movements(
        &self,
        request: Request<proto::ListStockMovementsRequest>,
    ) -> Result<Response<proto::ListStockMovementsResponse>, Status> {
        self.unary(request, Action::Watch, |inventory, query, _| async move {
            inventory.list_movements(&query).await
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "TransferStock"))]
    async fn transfer_stock(
        &self,
        request: Request<proto::TransferStockRequest>,
    ) -> Result<Response<proto::TransferStockResponse>, Status> {
        self.unary(
            request,
            Action::Adjust,
            |inventory, command, _| async move { inventory.transfer_stock(&command).await },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "SetStockPolicy"))]
    async fn set_stock_policy(
        &self,
        request: Request<proto::SetStockPolicyRequest>,
    ) -> Result<Response<proto::StockLevel>, Status> {
        self.unary(
            request,
            Action::Adjust,
            |inventory, command, _| async move { inventory.set_stock_policy(&command).await },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "MoveStockState"))]
    async fn move_stock_state(
        &self,
        request: Request<proto::MoveStockStateRequest>,
    ) -> Result<Response<proto::StockLevel>, Status> {
        self.unary(
            request,
            Action::Adjust,
            |inventory, command, _| async move { inventory.move_stock_state(&command).await },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "ExpectStock"))]
    async fn expect_stock(
        &self,
        request: Request<proto::ExpectStockRequest>,
    ) -> Result<Response<proto::Receipt>, Status> {
        self.unary(
            request,
            Action::Adjust,
            |inventory, command, _| async move { inventory.expect_stock(&command).await },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "ReceiveStock"))]
    async fn receive_stock(
        &self,
        request: Request<proto::ReceiveStockRequest>,
    ) -> Result<Response<proto::Receipt>, Status> {
        self.unary(
            request,
            Action::Adjust,
            |inventory, command, _| async move { inventory.receive_stock(&command).await },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "CancelReceipt"))]
    async fn cancel_receipt(
        &self,
        request: Request<proto::CancelReceiptRequest>,
    ) -> Result<Response<proto::Receipt>, Status> {
        self.unary(
            request,
            Action::Adjust,
            |inventory, command, _| async move { inventory.cancel_receipt(&command).await },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "ListReceipts"))]
    async fn list_receipts(
        &self,
        request: Request<proto::ListReceiptsRequest>,
    ) -> Result<Response<proto::ListReceiptsResponse>, Status> {
        self.unary(request, Action::Read, |inventory, query, _| async move {
            inventory.list_receipts(&query).await
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "UpsertLocation"))]
    async fn upsert_location(
        &self,
        request: Request<proto::UpsertLocationRequest>,
    ) -> Result<Response<proto::Location>, Status> {
        self.unary(
            request,
            Action::Adjust,
            |inventory, location, _| async move { inventory.upsert_location(&location).await },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "ListLocations"))]
    async fn list_locations(
        &self,
        request: Request<proto::ListLocationsRequest>,
    ) -> Result<Response<proto::ListLocationsResponse>, Status> {
        self.unary(request, Action::Read, |inventory, (), _| async move {
            inventory.list_locations().await
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "GetStock"))]
    async fn get_stock(
        &self,
        request: Request<proto::GetStockRequest>,
    ) -> Result<Response<proto::GetStockResponse>, Status> {
        self.unary(request, Action::Read, |inventory, query, _| async move {
            inventory.get_stock(&query).await
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "Reserve"))]
    async fn reserve(
        &self,
        request: Request<proto::ReserveRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        self.unary_detached(
            request,
            Action::Reserve,
            |inventory, command, budget, caps| async move {
                inventory.reserve_capped(&command, caps, budget).await
            },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "ConfirmReservation"))]
    async fn confirm_reservation(
        &self,
        request: Request<proto::ConfirmReservationRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        self.unary(
            request,
            Action::Reserve,
            |inventory, command, _| async move { inventory.settle(&command).await },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "ReleaseReservation"))]
    async fn release_reservation(
        &self,
        request: Request<proto::ReleaseReservationRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        self.unary(
            request,
            Action::Reserve,
            |inventory, command, _| async move { inventory.settle(&command).await },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "GetReservation"))]
    async fn get_reservation(
        &self,
        request: Request<proto::GetReservationRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        self.unary(request, Action::Read, |inventory, target, _| async move {
            inventory.get_reservation(target).await
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "ExtendReservation"))]
    async fn extend_reservation(
        &self,
        request: Request<proto::ExtendReservationRequest>,
    ) -> Result<Response<proto::Reservation>, Status> {
        self.unary(
            request,
            Action::Reserve,
            |inventory, command, _| async move { inventory.extend(&command).await },
        )
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "ListReservations"))]
    async fn list_reservations(
        &self,
        request: Request<proto::ListReservationsRequest>,
    ) -> Result<Response<proto::ListReservationsResponse>, Status> {
        self.unary(request, Action::Read, |inventory, query, _| async move {
            inventory.list_reservations(&query).await
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "CancelOrder"))]
    async fn cancel_order(
        &self,
        request: Request<proto::CancelOrderRequest>,
    ) -> Result<Response<proto::CancelOrderResponse>, Status> {
        self.unary(
            request,
            Action::Reserve,
            |inventory, command, _| async move { inventory.cancel_order(&command).await },
        )
        .await
    }

    type WatchEventsStream = EventStream;

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "WatchEvents"))]
    async fn watch_events(
        &self,
        request: Request<proto::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        let action = subscription_action(&request.get_ref().subscription);
        let principal = self.auth.authorize(&request, action)?;
        let core = self.core(&principal)?;
        let command = request
            .into_inner()
            .into_command(&principal)
            .map_err(to_status)?;
        let events = core.events.watch(command).await.map_err(to_status)?;
        Ok(Response::new(Box::pin(ReceiverStream::new(events))))
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "CreateSubscription"))]
    async fn create_subscription(
        &self,
        request: Request<proto::CreateSubscriptionRequest>,
    ) -> Result<Response<proto::Subscription>, Status> {
        let action = subscription_action(&request.get_ref().name);
        self.unary(request, action, |inventory, command, _| async move {
            inventory.create_subscription(&command).await
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "AckEvents"))]
    async fn ack_events(
        &self,
        request: Request<proto::AckEventsRequest>,
    ) -> Result<Response<proto::Subscription>, Status> {
        let action = subscription_action(&request.get_ref().subscription);
        self.unary(request, action, |inventory, command, _| async move {
            inventory.ack_events(&command).await
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "ListSubscriptions"))]
    async fn list_subscriptions(
        &self,
        request: Request<proto::ListSubscriptionsRequest>,
    ) -> Result<Response<proto::ListSubscriptionsResponse>, Status> {
        self.unary(request, Action::Watch, |inventory, (), _| async move {
            inventory.list_subscriptions().await
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(tenant = tracing::field::Empty, operator = tracing::field::Empty, rpc = "DeleteSubscription"))]
    async fn delete_subscription(
        &self,
        request: Request<proto::DeleteSubscriptionRequest>,
    ) -> Result<Response<proto::DeleteSubscriptionResponse>, Status> {
        let action = subscription_action(&request.get_ref().name);
        self.unary(
            request,
            action,
            |inventory, (name, allow_missing), _| async move {
                match inventory.delete_subscription(&name).await {
                    Ok(()) => Ok(crate::wire::Deleted),
                    Err(Error::SubscriptionNotFound(_)) if allow_missing => {
                        Ok(crate::wire::Deleted)
                    }
                    Err(error) => Err(error),
                }
            },
        )
        .await
    }
}

/// What a call on the subscription `name` needs: a watcher's role, but an admin's for the
/// event relay's own (`relay.*`), whose position decides what retention may remove before the
/// relay published it.
fn subscription_action(name: &str) -> Action {
    if name.starts_with(crate::relay::SUBSCRIPTION_PREFIX) {
        Action::Adjust
    } else {
        Action::Watch
    }
}

#[cfg(test)]
mod tests;
