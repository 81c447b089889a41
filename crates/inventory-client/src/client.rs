//! [`InventoryClient`]: one method per RPC, each retried by the rules of [`crate::retry`]
//! within one budget, with the same idempotency key on every attempt.

use std::{
    future::Future,
    time::{Duration, Instant},
};

use inventory_proto::{
    AckEventsRequest, AdjustStockRequest, BatchSetStockRequest, BatchSetStockResponse,
    CancelOrderRequest, CancelOrderResponse, CancelReceiptRequest, ConfirmReservationRequest,
    CreateSubscriptionRequest, DeleteSubscriptionRequest, DeleteSubscriptionResponse, Event,
    EventFilter, ExpectStockRequest, ExtendReservationRequest, GetReservationRequest,
    GetStockRequest, GetStockResponse, ListLocationsRequest, ListLocationsResponse,
    ListReceiptsRequest, ListReceiptsResponse, ListReservationsRequest, ListReservationsResponse,
    ListStockMovementsRequest, ListStockMovementsResponse, ListSubscriptionsRequest,
    ListSubscriptionsResponse, Location, MoveStockStateRequest, Receipt, ReceiveStockRequest,
    ReleaseReservationRequest, Reservation, ReserveRequest, SetStockPolicyRequest, SetStockRequest,
    StockLevel, Subscription, TransferStockRequest, TransferStockResponse, UpsertLocationRequest,
    WatchEventsRequest, inventory_service_client::InventoryServiceClient,
};
use opentelemetry::trace::TraceContextExt as _;
use secrecy::{ExposeSecret as _, SecretSlice, SecretString};
use tonic::{
    Code, Request, Response, Status, Streaming,
    metadata::{AsciiMetadataValue, MetadataMap},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::{
    EventCursor,
    error::{Error, FieldViolation},
    retry::{self, Kind, RetryPolicy, Verdict},
};

/// TLS towards the server.
#[derive(Clone, Debug, Default)]
pub struct TlsOptions {
    /// PEM of the CA that signed the server's certificate. Required: it is the only root
    /// trusted.
    pub ca_pem: Vec<u8>,
    /// For mutual TLS: the client's certificate chain and key, PEM.
    pub identity: Option<(Vec<u8>, SecretSlice<u8>)>,
    /// The name the server's certificate must carry, when it is not the endpoint's host.
    pub domain: Option<String>,
}

/// Where the server is and how to talk to it.
#[derive(Clone, Debug, Default)]
pub struct ClientConfig {
    /// `http://host:50051`, or `https://...` with `tls` (one without the other is refused).
    pub endpoint: String,
    pub tls: Option<TlsOptions>,
    /// Bearer token sent as `authorization: Bearer <token>` on every call.
    pub token: Option<SecretString>,
    pub retry: RetryPolicy,
}

impl ClientConfig {
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            ..Self::default()
        }
    }
}

/// A client of `inventory.v1.InventoryService`. Cheap to clone; clones share the connection.
#[derive(Clone, Debug)]
pub struct InventoryClient {
    grpc: InventoryServiceClient<Channel>,
    authorization: Option<AsciiMetadataValue>,
    policy: RetryPolicy,
}

impl InventoryClient {
    /// Connects now: an unreachable endpoint or bad TLS material is an error here.
    pub async fn connect(config: ClientConfig) -> Result<Self, Error> {
        let (endpoint, authorization) = endpoint(&config)?;
        let channel = endpoint.connect().await?;
        Ok(Self::over(channel, authorization, config.retry))
    }

    /// Connects on the first call (and again after a connection is lost).
    pub fn connect_lazy(config: ClientConfig) -> Result<Self, Error> {
        let (endpoint, authorization) = endpoint(&config)?;
        Ok(Self::over(
            endpoint.connect_lazy(),
            authorization,
            config.retry,
        ))
    }

    fn over(
        channel: Channel,
        authorization: Option<AsciiMetadataValue>,
        policy: RetryPolicy,
    ) -> Self {
        Self {
            grpc: InventoryServiceClient::new(channel),
            authorization,
            policy,
        }
    }

    /// The same client with another budget for each call (every attempt and wait included):
    /// the part of the caller's own deadline it can give this call.
    #[must_use]
    pub fn with_budget(&self, budget: Duration) -> Self {
        let mut client = self.clone();
        client.policy.budget = budget;
        client
    }

    /// The same client with another retry policy.
    #[must_use]
    pub fn with_policy(&self, policy: RetryPolicy) -> Self {
        let mut client = self.clone();
        client.policy = policy;
        client
    }

    /// Holds stock for an order. Without an `idempotency_key`, one is generated (UUIDv7) and
    /// used for every attempt; an `OutcomeUnknown` error carries it.
    pub async fn reserve(&self, mut request: ReserveRequest) -> Result<Reservation, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.reserve(r).await
        })
        .await
    }

    /// Confirms a hold, or some of its units (`lines`). A key is generated when none is given.
    pub async fn confirm_reservation(
        &self,
        mut request: ConfirmReservationRequest,
    ) -> Result<Reservation, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.confirm_reservation(r).await
        })
        .await
    }

    /// Releases a hold, or some of its units. A key is generated when none is given.
    pub async fn release_reservation(
        &self,
        mut request: ReleaseReservationRequest,
    ) -> Result<Reservation, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.release_reservation(r).await
        })
        .await
    }

    /// Moves a live hold's expiry to `ttl` from now. Repeating it is harmless (it has no key).
    pub async fn extend_reservation(
        &self,
        request: ExtendReservationRequest,
    ) -> Result<Reservation, Error> {
        self.call(Kind::Write, None, request, |mut grpc, r| async move {
            grpc.extend_reservation(r).await
        })
        .await
    }

    /// Releases an order's live holds and refuses its later Reserves: the compensation of a
    /// saga. A key is generated when none is given.
    pub async fn cancel_order(
        &self,
        mut request: CancelOrderRequest,
    ) -> Result<CancelOrderResponse, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.cancel_order(r).await
        })
        .await
    }

    pub async fn get_reservation(
        &self,
        request: GetReservationRequest,
    ) -> Result<Reservation, Error> {
        self.call(Kind::Read, None, request, |mut grpc, r| async move {
            grpc.get_reservation(r).await
        })
        .await
    }

    pub async fn list_reservations(
        &self,
        request: ListReservationsRequest,
    ) -> Result<ListReservationsResponse, Error> {
        self.call(Kind::Read, None, request, |mut grpc, r| async move {
            grpc.list_reservations(r).await
        })
        .await
    }

    pub async fn get_stock(&self, request: GetStockRequest) -> Result<GetStockResponse, Error> {
        self.call(Kind::Read, None, request, |mut grpc, r| async move {
            grpc.get_stock(r).await
        })
        .await
    }

    pub async fn list_stock_movements(
        &self,
        request: ListStockMovementsRequest,
    ) -> Result<ListStockMovementsResponse, Error> {
        self.call(Kind::Read, None, request, |mut grpc, r| async move {
            grpc.list_stock_movements(r).await
        })
        .await
    }

    /// Adds to or takes from `on_hand`. A key is generated when none is given.
    pub async fn adjust_stock(&self, mut request: AdjustStockRequest) -> Result<StockLevel, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.adjust_stock(r).await
        })
        .await
    }

    /// Sets `on_hand` to a count (compare-and-set with `expected_version`). A key is
    /// generated when none is given.
    pub async fn set_stock(&self, mut request: SetStockRequest) -> Result<StockLevel, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.set_stock(r).await
        })
        .await
    }

    /// Up to 1,000 counts in one transaction. A key is generated when none is given.
    pub async fn batch_set_stock(
        &self,
        mut request: BatchSetStockRequest,
    ) -> Result<BatchSetStockResponse, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.batch_set_stock(r).await
        })
        .await
    }

    /// Moves available units between two locations. A key is generated when none is given.
    pub async fn transfer_stock(
        &self,
        mut request: TransferStockRequest,
    ) -> Result<TransferStockResponse, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.transfer_stock(r).await
        })
        .await
    }

    /// Sets a (SKU, location)'s safety stock and backorder limit (an unset one stays). A key
    /// is generated when none is given.
    pub async fn set_stock_policy(
        &self,
        mut request: SetStockPolicyRequest,
    ) -> Result<StockLevel, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.set_stock_policy(r).await
        })
        .await
    }

    /// Moves units between states at one location (sellable, damaged, quality control). A
    /// key is generated when none is given.
    pub async fn move_stock_state(
        &self,
        mut request: MoveStockStateRequest,
    ) -> Result<StockLevel, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.move_stock_state(r).await
        })
        .await
    }

    /// Records an incoming receipt (a purchase order line). A key is generated when none is
    /// given.
    pub async fn expect_stock(&self, mut request: ExpectStockRequest) -> Result<Receipt, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.expect_stock(r).await
        })
        .await
    }

    /// Units of an open receipt arrived (they fill its pre-orders first). A key is generated
    /// when none is given: with it, a retry after a lost answer never receives twice.
    pub async fn receive_stock(&self, mut request: ReceiveStockRequest) -> Result<Receipt, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.receive_stock(r).await
        })
        .await
    }

    /// An open receipt will not come (its pre-orders wait on, at risk). A key is generated
    /// when none is given.
    pub async fn cancel_receipt(
        &self,
        mut request: CancelReceiptRequest,
    ) -> Result<Receipt, Error> {
        let key = ensure_key(&mut request.idempotency_key);
        self.call(Kind::Write, Some(key), request, |mut grpc, r| async move {
            grpc.cancel_receipt(r).await
        })
        .await
    }

    /// Receipts (of one SKU, or every one), by id, a page at a time.
    pub async fn list_receipts(
        &self,
        request: ListReceiptsRequest,
    ) -> Result<ListReceiptsResponse, Error> {
        self.call(Kind::Read, None, request, |mut grpc, r| async move {
            grpc.list_receipts(r).await
        })
        .await
    }

    /// Creates a location or sets its priority and whether it is active; repeating it
    /// changes nothing more, so it needs no key.
    pub async fn upsert_location(&self, request: UpsertLocationRequest) -> Result<Location, Error> {
        self.call(Kind::Write, None, request, |mut grpc, r| async move {
            grpc.upsert_location(r).await
        })
        .await
    }

    /// Every location, in allocation order.
    pub async fn list_locations(&self) -> Result<ListLocationsResponse, Error> {
        let request = ListLocationsRequest {};
        self.call(Kind::Read, None, request, |mut grpc, r| async move {
            grpc.list_locations(r).await
        })
        .await
    }

    /// The event stream after `cursor` (see [`EventCursor`] for what to do when it is
    /// refused with `CURSOR_NOT_IN_HISTORY`). Not retried: when the stream ends or fails,
    /// open it again from the cursor of the last event processed. Turn an error item of the
    /// stream into an [`Error`] with [`Error::from_stream`].
    pub async fn watch_events_from(&self, cursor: &EventCursor) -> Result<Streaming<Event>, Error> {
        self.watch_events(cursor.request()).await
    }

    /// The event stream from `after_sequence` (and `epoch`: prefer
    /// [`Self::watch_events_from`]). Not retried: when the stream ends or fails, open it
    /// again from the last `sequence` received, with its `epoch`.
    pub async fn watch_events(
        &self,
        request: WatchEventsRequest,
    ) -> Result<Streaming<Event>, Error> {
        let mut grpc = self.grpc.clone();
        let mut request = Request::new(request);
        self.decorate(request.metadata_mut());
        grpc.watch_events(request)
            .await
            .map(Response::into_inner)
            .map_err(Error::from_stream)
    }

    /// The event stream after `cursor`, only what `filter` passes, with heartbeats
    /// (`EVENT_TYPE_HEARTBEAT`) that carry the sequence scanned through: advance the cursor
    /// on those too, so a rare filter never resumes from far behind. The stream's opening
    /// heartbeat is checked and taken (see [`Self::watch_subscription`]).
    pub async fn watch_filtered_from(
        &self,
        cursor: &EventCursor,
        filter: EventFilter,
    ) -> Result<Streaming<Event>, Error> {
        let mut request = cursor.request();
        request.filter = Some(filter);
        opened(self.watch_events(request).await?).await
    }

    /// Reads a named subscription from its last acknowledged sequence, taking it over from
    /// any other reader (whose stream then ends with `SUBSCRIPTION_TAKEN_OVER`).
    /// Acknowledge with [`Self::ack_events`] what was processed, heartbeats included.
    ///
    /// A filtered or subscription stream opens with a heartbeat; a replica of a release
    /// before filters (in a rollout) ignores them and streams every event from the oldest
    /// kept instead. This checks the opening heartbeat and answers `Error::Unavailable` when
    /// it is missing: open the stream again (it reaches another replica).
    pub async fn watch_subscription(&self, name: &str) -> Result<Streaming<Event>, Error> {
        let stream = self
            .watch_events(WatchEventsRequest {
                subscription: name.to_owned(),
                ..WatchEventsRequest::default()
            })
            .await?;
        opened(stream).await
    }

    /// Creates a named subscription (or answers the one of that name with the same filter).
    pub async fn create_subscription(
        &self,
        name: &str,
        filter: EventFilter,
        from_oldest: bool,
    ) -> Result<Subscription, Error> {
        let request = CreateSubscriptionRequest {
            name: name.to_owned(),
            filter: Some(filter),
            from_oldest,
        };
        self.call(Kind::Read, None, request, |mut grpc, r| async move {
            grpc.create_subscription(r).await
        })
        .await
    }

    /// Acknowledges every event of the subscription up to `event` (an event or a heartbeat).
    pub async fn ack_events(&self, name: &str, event: &Event) -> Result<Subscription, Error> {
        let request = AckEventsRequest {
            subscription: name.to_owned(),
            sequence: event.sequence,
            epoch: event.epoch.clone(),
        };
        self.call(Kind::Read, None, request, |mut grpc, r| async move {
            grpc.ack_events(r).await
        })
        .await
    }

    /// Every subscription of the caller's tenant, with its lag.
    pub async fn list_subscriptions(&self) -> Result<Vec<Subscription>, Error> {
        self.call(
            Kind::Read,
            None,
            ListSubscriptionsRequest {},
            |mut grpc, r| async move { grpc.list_subscriptions(r).await },
        )
        .await
        .map(|list: ListSubscriptionsResponse| list.subscriptions)
    }

    /// Deletes a subscription; one that is not there counts as deleted, so a retry after a
    /// lost answer succeeds.
    pub async fn delete_subscription(&self, name: &str) -> Result<(), Error> {
        let request = DeleteSubscriptionRequest {
            name: name.to_owned(),
            allow_missing: true,
        };
        self.call(Kind::Read, None, request, |mut grpc, r| async move {
            grpc.delete_subscription(r).await
        })
        .await
        .map(|_: DeleteSubscriptionResponse| ())
    }

    /// The bearer token and the current span's W3C trace context.
    fn decorate(&self, metadata: &mut MetadataMap) {
        if let Some(authorization) = &self.authorization {
            metadata.insert("authorization", authorization.clone());
        }
        if let Some(traceparent) = traceparent() {
            metadata.insert("traceparent", traceparent);
        }
    }

    /// Sends `request` until a definite answer, the attempts or the budget run out.
    async fn call<Q, A, F, Fut>(
        &self,
        kind: Kind,
        idempotency_key: Option<String>,
        request: Q,
        send: F,
    ) -> Result<A, Error>
    where
        Q: Clone,
        F: Fn(InventoryServiceClient<Channel>, Request<Q>) -> Fut,
        Fut: Future<Output = Result<Response<A>, Status>>,
    {
        let policy = self.policy;
        let started = Instant::now();
        let deadline = started + policy.budget;
        // No attempt is started with less than this left: it could only time out.
        let least = policy.attempt_timeout.min(MIN_ATTEMPT);
        let mut attempts = 0;
        // Whether some attempt of a write may have been applied.
        let mut maybe_applied = false;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let timeout = remaining.min(policy.attempt_timeout);
            let mut attempt = Request::new(request.clone());
            // The server learns the attempt's deadline (`grpc-timeout`) and stops in time.
            attempt.set_timeout(timeout);
            self.decorate(attempt.metadata_mut());
            attempts += 1;
            let answer =
                tokio::time::timeout(timeout + TIMER_SLACK, send(self.grpc.clone(), attempt))
                    .await
                    .unwrap_or_else(|_| Err(Status::deadline_exceeded("the attempt timed out")));
            let status = match answer {
                Ok(response) => return Ok(response.into_inner()),
                // This client never cancels its own calls: a CANCELLED here is tonic giving up
                // at the attempt's `grpc-timeout` ("Timeout expired").
                Err(status) if status.code() == Code::Cancelled => Status::deadline_exceeded(
                    format!("the attempt timed out: {}", status.message()),
                ),
                Err(status) => status,
            };
            maybe_applied |= kind == Kind::Write && retry::outcome_unknown(status.code());
            let verdict = retry::verdict(&status);
            let wait = retry::wait(
                &policy,
                attempts - 1,
                retry::server_delay(&status),
                retry::jitter(),
            );
            let time_left = Instant::now() + wait + least <= deadline;
            if verdict == Verdict::Retry && attempts < policy.max_attempts && time_left {
                tracing::debug!(code = ?status.code(), attempts, ?wait, "retrying with the same key");
                tokio::time::sleep(wait).await;
                continue;
            }
            // A definite answer settles the call. After an attempt that may have been applied,
            // only a refusal the server decides after looking the key up does: had that
            // attempt been applied, this one would have been its replay. Without a key,
            // nothing settles it.
            let settled = verdict == Verdict::Final
                && !retry::outcome_unknown(status.code())
                && (!maybe_applied || (idempotency_key.is_some() && retry::settles_key(&status)));
            return Err(if settled {
                Error::definite(status)
            } else if maybe_applied {
                Error::OutcomeUnknown {
                    idempotency_key,
                    attempts,
                    last: status,
                }
            } else {
                Error::Unavailable {
                    attempts,
                    elapsed: started.elapsed(),
                    last: status,
                }
            });
        }
    }
}

/// The shortest attempt worth starting.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);
/// Lets tonic's own timer (`grpc-timeout`) fire first; ours is the backstop.
const TIMER_SLACK: Duration = Duration::from_millis(20);

/// Fills an empty key with a new UUIDv7 (time-ordered, so keys of one client sort by time)
/// and returns it.
fn ensure_key(key: &mut String) -> String {
    if key.is_empty() {
        *key = uuid::Uuid::now_v7().to_string();
    }
    key.clone()
}

fn endpoint(config: &ClientConfig) -> Result<(Endpoint, Option<AsciiMetadataValue>), Error> {
    // tonic applies TLS only to `https` URIs: TLS material with `http` would connect in
    // plaintext and send the token in the clear.
    let https = config.endpoint.starts_with("https://");
    if https != config.tls.is_some() {
        return Err(Error::Invalid {
            message: "an https:// endpoint needs `tls` (the server's CA), and `tls` needs an https:// endpoint".into(),
            violations: vec![FieldViolation {
                field: "endpoint".into(),
                description: format!("{} with tls {}", config.endpoint, if config.tls.is_some() { "set" } else { "unset" }),
            }],
        });
    }
    let mut endpoint = Endpoint::from_shared(config.endpoint.clone())?
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    if let Some(tls) = &config.tls {
        let mut settings =
            ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
        if let Some((cert, key)) = &tls.identity {
            settings = settings.identity(Identity::from_pem(cert, key.expose_secret()));
        }
        if let Some(domain) = &tls.domain {
            settings = settings.domain_name(domain.clone());
        }
        endpoint = endpoint.tls_config(settings)?;
    }
    let authorization = config
        .token
        .as_ref()
        .map(|token| {
            format!("Bearer {}", token.expose_secret())
                .parse::<AsciiMetadataValue>()
                .map(|mut value| {
                    // Kept out of Debug output and HPACK's compression table.
                    value.set_sensitive(true);
                    value
                })
        })
        .transpose()
        .map_err(|_| Error::Invalid {
            message: "the token is not printable ASCII".into(),
            violations: Vec::new(),
        })?;
    Ok((endpoint, authorization))
}

/// The current span's context as a W3C `traceparent`, when there is one (a tracing
/// subscriber with the OpenTelemetry layer, inside a span).
fn traceparent() -> Option<AsciiMetadataValue> {
    let context = tracing::Span::current().context();
    let span = context.span();
    let span_context = span.span_context();
    if !span_context.is_valid() {
        return None;
    }
    format!(
        "00-{}-{}-{:02x}",
        span_context.trace_id(),
        span_context.span_id(),
        span_context.trace_flags().to_u8()
    )
    .parse()
    .ok()
}

/// How long a filtered stream may take to send its opening heartbeat.
const OPENING_WAIT: Duration = Duration::from_secs(10);

/// A filtered stream after its opening heartbeat; `Unavailable` if it did not open with one
/// (the replica that answered ignored the filter).
async fn opened(mut stream: Streaming<Event>) -> Result<Streaming<Event>, Error> {
    let unavailable = |why: &str| Error::Unavailable {
        attempts: 1,
        elapsed: Duration::ZERO,
        last: Status::unavailable(why.to_owned()),
    };
    // A replica that knows filters sends the heartbeat at once; one that does not may send
    // nothing for a long while (a cursor at the head).
    let first = tokio::time::timeout(OPENING_WAIT, stream.message()).await;
    let Ok(first) = first else {
        return Err(unavailable(
            "no opening heartbeat: the replica that answered may not know filters (a release \
             before them, in a rollout): open the stream again",
        ));
    };
    match first {
        Ok(Some(first)) if first.r#type == inventory_proto::EventType::Heartbeat as i32 => {
            Ok(stream)
        }
        Ok(Some(_)) => Err(unavailable(
            "the replica that answered ignored the filter (a release before filters, in a \
             rollout): open the stream again",
        )),
        Ok(None) => Err(unavailable("the stream ended before it opened")),
        Err(status) => Err(Error::from_stream(status)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_key_becomes_a_uuid_v7_and_a_given_one_stays() {
        let mut key = String::new();
        let generated = ensure_key(&mut key);
        assert_eq!(key, generated);
        assert_eq!(uuid::Uuid::parse_str(&key).unwrap().get_version_num(), 7);
        let mut given = "order-42-reserve".to_owned();
        assert_eq!(ensure_key(&mut given), "order-42-reserve");
    }

    #[test]
    fn a_token_becomes_a_bearer_header() {
        let mut config = ClientConfig::new("http://127.0.0.1:1");
        config.token = Some("s3cret".into());
        let (_, authorization) = endpoint(&config).unwrap();
        assert_eq!(authorization.unwrap(), "Bearer s3cret");
        config.token = Some("bad\ntoken".into());
        assert!(endpoint(&config).is_err());
        assert!(
            !format!("{config:?}").contains("bad"),
            "the token is redacted"
        );
    }

    #[test]
    fn the_client_key_is_redacted() {
        let key = b"-----BEGIN PRIVATE KEY-----".to_vec();
        let tls = TlsOptions {
            identity: Some((b"cert".to_vec(), key.clone().into())),
            ..TlsOptions::default()
        };
        assert!(!format!("{tls:?}").contains(&format!("{key:?}")[1..20]));
    }

    #[test]
    fn tls_and_https_come_together() {
        let mut config = ClientConfig::new("http://127.0.0.1:1");
        config.tls = Some(TlsOptions::default());
        assert!(matches!(endpoint(&config), Err(Error::Invalid { .. })));
        config.endpoint = "https://127.0.0.1:1".into();
        config.tls = None;
        assert!(matches!(endpoint(&config), Err(Error::Invalid { .. })));
    }
}
