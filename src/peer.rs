//! Forwarding between replicas: the calls for a hot SKU meet in one batch, wherever they
//! arrive.
//!
//! A replica's leases name its internal address (`PEER_ADVERTISE_ADDR`). When a leader finds
//! its SKU's lease held by another replica, the core hands the single-line `Reserve` calls of
//! its queue to that replica through [`PeerForwarder`], which calls `PeerService/Reserve` on
//! the internal port ([`PeerApi`]). The receiver runs the call as if the caller had called it,
//! in its own batch, and never forwards it again; the answer (reservation or status) travels
//! back unchanged. One hop at most: a forward that is refused (`not_holder`) or fails runs at
//! the sender, whose idempotency key makes that safe even when the peer did write it.
//!
//! Calls and answers travel signed with the fleet's shared secret (`SignedMessage`: the exact
//! bytes, when they were signed, HMAC-SHA256). A call's signature names the replica it is for
//! (its advertised address), and a receiver takes each signature once within
//! [`MAX_CLOCK_SKEW`], so a captured call cannot be played again, here or at another replica.
//! An answer's signature covers the call's, so only the replica that was asked can answer. The
//! secret never travels: a lease value pointing somewhere else (anyone who can write Redis
//! could write one) gets that one call and cannot answer it.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use inventory_core::{
    Error, FieldViolation,
    budget::Budget,
    command::Reserve,
    domain::{Caller, Tenant},
    error::Relayed,
    ports::{Forwarded, Forwarder, Peer},
};
use opentelemetry::{global, propagation::Injector};
use prost::Message as _;
use ring::hmac;
use tokio::sync::Semaphore;
use tonic::{
    Request, Response, Status,
    metadata::{MetadataKey, MetadataMap, MetadataValue},
    transport::{Channel, Endpoint},
};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::{
    auth::{Principal, Role},
    proto::{
        self,
        inventory::peer::v2::{
            ForwardedAnswer, ForwardedReserve, NotHolder, RelayedStatus, SignedMessage,
            forwarded_answer::Answer, peer_service_client::PeerServiceClient,
            peer_service_server::PeerService,
        },
    },
    status::to_status,
    tenants::Tenants,
    wire::{Decode as _, Encode as _, forward},
};

/// How far a signature's time may be from the receiver's clock; a call signed earlier is
/// refused, and each signature is taken once within it.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(10);

/// A peer that does not accept a connection within this is treated as gone: the call runs
/// here instead (a dead peer must not cost a TCP timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);

/// Less time than this left: not worth a hop; the call runs here.
const MIN_HOP_BUDGET: Duration = Duration::from_millis(5);

/// A call whose caller set no deadline: how long the hop may take past the lease wait, for the
/// peer's batch to be written (as the statement timeout bounds it here), before the peer
/// counts as stalled.
const HOP_WRITE_ALLOWANCE: Duration = Duration::from_secs(5);

/// Most peers a replica keeps a connection to; past it, the connections start over.
const MAX_PEERS: usize = 256;

/// What a call's signature covers besides its body: the method, and the replica it is for.
fn call_context(to: &str) -> Vec<u8> {
    format!("inventory.peer.v2.PeerService/Reserve call to {to}\n").into_bytes()
}

/// What an answer's signature covers besides its body: the call's signature.
fn answer_context(call_signature: &[u8]) -> Vec<u8> {
    let mut context = b"inventory.peer.v2.PeerService/Reserve answer\n".to_vec();
    context.extend_from_slice(call_signature);
    context
}

/// The fleet's shared peer secret, as an HMAC key.
#[derive(Clone, Debug)]
pub struct PeerSecret(hmac::Key);

impl PeerSecret {
    pub fn new(secret: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    fn signed_bytes(context: &[u8], at_ms: i64, body: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(context.len() + 8 + body.len());
        bytes.extend_from_slice(context);
        bytes.extend_from_slice(&at_ms.to_be_bytes());
        bytes.extend_from_slice(body);
        bytes
    }

    /// `message`, encoded and signed now under `context`.
    fn sign(&self, context: &[u8], message: &impl prost::Message) -> SignedMessage {
        let body = message.encode_to_vec();
        let signed_at_ms = unix_ms(SystemTime::now());
        let signature = hmac::sign(&self.0, &Self::signed_bytes(context, signed_at_ms, &body));
        SignedMessage {
            body,
            signed_at_ms,
            signature: signature.as_ref().to_vec(),
        }
    }

    /// Whether `message` was signed with this secret under `context`.
    fn verify(&self, context: &[u8], message: &SignedMessage) -> bool {
        hmac::verify(
            &self.0,
            &Self::signed_bytes(context, message.signed_at_ms, &message.body),
            &message.signature,
        )
        .is_ok()
    }
}

fn unix_ms(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The call signatures a receiver took within the last [`MAX_CLOCK_SKEW`]: each is taken
/// once. Older ones are refused by their time, so they need not be kept.
#[derive(Debug, Default)]
struct Seen {
    signatures: HashSet<Vec<u8>>,
    /// In the order they were taken, with their signing time.
    order: VecDeque<(i64, Vec<u8>)>,
}

impl Seen {
    /// `false` if `signature` was taken before.
    fn take(&mut self, signature: &[u8], signed_at_ms: i64, now_ms: i64) -> bool {
        let window = i64::try_from(MAX_CLOCK_SKEW.as_millis()).unwrap_or(i64::MAX);
        while let Some((at, _)) = self.order.front() {
            if *at >= now_ms.saturating_sub(window) {
                break;
            }
            let (_, old) = self.order.pop_front().expect("a front exists");
            self.signatures.remove(&old);
        }
        if !self.signatures.insert(signature.to_vec()) {
            return false;
        }
        // Kept as long as its signing time could still pass the skew check.
        self.order
            .push_back((signed_at_ms.max(now_ms), signature.to_vec()));
        true
    }
}

/// The sending side: hands calls to peers over the internal port.
#[derive(Debug)]
pub struct PeerForwarder {
    secret: PeerSecret,
    clients: Mutex<HashMap<SocketAddr, PeerServiceClient<Channel>>>,
    /// The tenant whose calls this forwarder carries.
    tenant: Tenant,
}

impl PeerForwarder {
    pub fn new(secret: PeerSecret) -> Self {
        Self {
            secret,
            clients: Mutex::default(),
            tenant: Tenant::default_tenant(),
        }
    }

    /// The same, carrying `tenant`'s calls (one forwarder per tenant's core).
    pub fn for_tenant(mut self, tenant: Tenant) -> Self {
        self.tenant = tenant;
        self
    }

    /// A client for `addr`, over one connection kept per peer (made on first use, remade
    /// after it breaks).
    fn client(&self, addr: SocketAddr) -> PeerServiceClient<Channel> {
        let mut clients = self.clients.lock().expect("peer clients lock");
        if let Some(client) = clients.get(&addr) {
            return client.clone();
        }
        if clients.len() >= MAX_PEERS {
            clients.clear();
        }
        let channel = Endpoint::from(
            tonic::transport::Uri::builder()
                .scheme("http")
                .authority(addr.to_string())
                .path_and_query("/")
                .build()
                .expect("a socket address is a valid authority"),
        )
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_lazy();
        let client = PeerServiceClient::new(channel);
        clients.insert(addr, client.clone());
        client
    }

    async fn hop(
        &self,
        peer: &Peer,
        command: &Reserve,
        lease_wait_until: Instant,
        answer_by: Option<Instant>,
    ) -> Forwarded {
        // Leases name an `ip:port`; anything else in one is not a peer of ours.
        let Ok(addr) = peer.0.parse::<SocketAddr>() else {
            return Forwarded::Failed {
                error: Error::internal(format!("lease names {peer}, which is not an ip:port")),
                sent: false,
            };
        };
        let now = Instant::now();
        let lease_wait = lease_wait_until.saturating_duration_since(now);
        let left = match answer_by {
            Some(by) => by.saturating_duration_since(now),
            None => lease_wait + HOP_WRITE_ALLOWANCE,
        };
        if left < MIN_HOP_BUDGET {
            return Forwarded::Failed {
                error: Error::DeadlineExceeded,
                sent: false,
            };
        }
        let call = self.secret.sign(
            &call_context(&peer.0),
            &ForwardedReserve {
                request: Some(forward::reserve_request(command)),
                caller: command.caller.as_str().to_owned(),
                lease_wait: prost_types::Duration::try_from(lease_wait).ok(),
                tenant: if self.tenant.is_default() {
                    String::new()
                } else {
                    self.tenant.as_str().to_owned()
                },
            },
        );
        let call_signature = call.signature.clone();
        let mut request = Request::new(call);
        request.set_timeout(left);
        let context = tracing::Span::current().context();
        global::get_text_map_propagator(|propagator| {
            propagator.inject_context(&context, &mut MetadataInjector(request.metadata_mut()));
        });
        let failed = |error: Error| Forwarded::Failed { error, sent: true };
        let signed = match self.client(addr).reserve(request).await {
            Ok(answer) => answer.into_inner(),
            // A replica of a release that speaks another version of this protocol (a
            // rollout) does not know the method: the call ran nowhere, so it is run here like
            // any call that was never sent. Forged, this answer could only make the call run
            // here too, where its key decides.
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                return Forwarded::Failed {
                    error: Error::internal(format!(
                        "forward to {peer}: it speaks another version of the peer protocol"
                    )),
                    sent: false,
                };
            }
            // The peer refuses these before it runs anything, but they come unsigned: even
            // they count as sent, or a forged one could turn a write into a refusal.
            Err(status) => {
                return failed(Error::internal(format!(
                    "forward to {peer}: {} {}",
                    status.code(),
                    status.message()
                )));
            }
        };
        if !self
            .secret
            .verify(&answer_context(&call_signature), &signed)
        {
            return failed(Error::internal(format!(
                "forward to {peer}: the answer is not signed for this call"
            )));
        }
        let answer = match ForwardedAnswer::decode(signed.body.as_slice()) {
            Ok(answer) => answer,
            Err(error) => return failed(Error::internal(format!("forward to {peer}: {error}"))),
        };
        match answer.answer {
            Some(Answer::Reservation(reservation)) => match forward::reservation(reservation) {
                Ok(reservation) => Forwarded::Answered(Ok(reservation)),
                // It was written there; running it here replays it.
                Err(error) => failed(error),
            },
            Some(Answer::Error(status)) => Forwarded::Answered(Err(Error::Relayed(Relayed {
                code: status.code,
                message: status.message,
                details: status.details,
            }))),
            Some(Answer::NotHolder(NotHolder {})) => Forwarded::NotHolder,
            // A later release's answer this one cannot read: it ran there.
            None => failed(Error::internal("the peer's answer was empty")),
        }
    }
}

impl Forwarder for PeerForwarder {
    fn forward<'a>(
        &'a self,
        peer: &'a Peer,
        command: &'a Reserve,
        lease_wait_until: Instant,
        answer_by: Option<Instant>,
    ) -> Pin<Box<dyn Future<Output = Forwarded> + Send + 'a>> {
        let span = tracing::info_span!("reserve.forward", peer = %peer);
        Box::pin(
            self.hop(peer, command, lease_wait_until, answer_by)
                .instrument(span),
        )
    }
}

/// Writes the trace context into a call's metadata.
struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value),
        ) {
            self.0.insert(key, value);
        }
    }
}

/// The receiving side: `PeerService` on the internal port.
#[derive(Debug)]
pub struct PeerApi {
    tenants: Tenants,
    secret: PeerSecret,
    /// What calls for this replica are signed for: its advertised address.
    call_context: Vec<u8>,
    seen: Mutex<Seen>,
    /// The API's admission: forwarded calls count against the same limit.
    in_flight: Arc<Semaphore>,
}

impl PeerApi {
    pub fn new(
        tenants: Tenants,
        secret: PeerSecret,
        advertised: SocketAddr,
        in_flight: Arc<Semaphore>,
    ) -> Self {
        Self {
            tenants,
            secret,
            call_context: call_context(&advertised.to_string()),
            seen: Mutex::default(),
            in_flight,
        }
    }

    /// The call in `signed`, if it is signed for this replica, recent, and not seen before.
    fn open(&self, signed: &SignedMessage) -> Result<ForwardedReserve, Status> {
        let refused = |why: &str| Status::unauthenticated(format!("peer call refused: {why}"));
        if !self.secret.verify(&self.call_context, signed) {
            return Err(refused("bad signature"));
        }
        let now_ms = unix_ms(SystemTime::now());
        if u128::from(now_ms.abs_diff(signed.signed_at_ms)) > MAX_CLOCK_SKEW.as_millis() {
            return Err(refused("signed too long ago, or in the future"));
        }
        if !self.seen.lock().expect("seen lock").take(
            &signed.signature,
            signed.signed_at_ms,
            now_ms,
        ) {
            return Err(refused("already taken"));
        }
        ForwardedReserve::decode(signed.body.as_slice())
            .map_err(|error| Status::invalid_argument(format!("peer call: {error}")))
    }
}

/// The tenant a forwarded call runs in (empty: `default`).
fn tenant(call: &ForwardedReserve) -> Result<Tenant, Error> {
    if call.tenant.is_empty() {
        return Ok(Tenant::default_tenant());
    }
    Tenant::parse(&call.tenant)
        .map_err(|problem| Error::InvalidArgument(vec![FieldViolation::new("tenant", problem)]))
}

/// The command a forwarded call carries, for the caller the sender authenticated, and how
/// long it may wait for the lease.
fn command(call: ForwardedReserve) -> Result<(Reserve, Option<Duration>), Error> {
    let lease_wait = call
        .lease_wait
        .and_then(|wait| Duration::try_from(wait).ok());
    let caller = if call.caller.is_empty() {
        Caller::anonymous()
    } else {
        Caller::parse(&call.caller).map_err(|problem| {
            Error::InvalidArgument(vec![FieldViolation::new("caller", problem)])
        })?
    };
    let request = call.request.ok_or_else(|| {
        Error::InvalidArgument(vec![FieldViolation::new("request", "must be set")])
    })?;
    Ok((
        request.into_command(&Principal::new(caller, Role::Reserver))?,
        lease_wait,
    ))
}

/// The answer as it travels back: the reservation, `not_holder`, or the status the caller
/// would have seen here.
fn answer(result: Result<inventory_core::domain::Reservation, Error>) -> ForwardedAnswer {
    let answer = match result {
        Ok(reservation) => Answer::Reservation(reservation.into_message()),
        Err(Error::NotHolder { .. }) => Answer::NotHolder(NotHolder {}),
        Err(error) => {
            let status = to_status(error);
            Answer::Error(RelayedStatus {
                code: status.code() as i32,
                message: status.message().to_owned(),
                details: status.details().to_vec(),
            })
        }
    };
    ForwardedAnswer {
        answer: Some(answer),
    }
}

#[tonic::async_trait]
impl PeerService for PeerApi {
    #[tracing::instrument(skip_all, fields(rpc = "PeerReserve"))]
    async fn reserve(
        &self,
        request: Request<SignedMessage>,
    ) -> Result<Response<SignedMessage>, Status> {
        let call = self.open(request.get_ref())?;
        let call_signature = request.get_ref().signature.clone();
        let budget = Budget::from_timeout(
            crate::grpc::client_timeout(request.metadata()),
            Instant::now(),
        );
        let result = match Arc::clone(&self.in_flight).try_acquire_owned() {
            // Signed like any answer: a definite refusal, relayed as it is.
            Err(_) => Err(Error::Saturated),
            Ok(admitted) => match tenant(&call)
                .and_then(|tenant| Ok(Arc::clone(&self.tenants.core(&tenant)?.inventory)))
                .and_then(|inventory| Ok((inventory, command(call)?)))
            {
                Err(error) => Err(error),
                Ok((inventory, (command, lease_wait))) => {
                    // On a task of its own, as the API runs a Reserve: a sender that gives up
                    // must not cancel it between a lease and its release.
                    let work = tokio::spawn(
                        async move {
                            let _admitted = admitted;
                            inventory
                                .reserve_forwarded(&command, budget, lease_wait)
                                .await
                        }
                        .instrument(tracing::Span::current()),
                    );
                    budget
                        .run(async { work.await.unwrap_or_else(|e| Err(Error::internal(e))) })
                        .await
                }
            },
        };
        Ok(Response::new(
            self.secret
                .sign(&answer_context(&call_signature), &answer(result)),
        ))
    }
}

/// The peer service, ready to serve.
pub fn service(
    api: PeerApi,
) -> proto::inventory::peer::v2::peer_service_server::PeerServiceServer<PeerApi> {
    proto::inventory::peer::v2::peer_service_server::PeerServiceServer::new(api)
}

#[cfg(test)]
mod tests;
