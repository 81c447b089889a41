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
//! Every forwarded call is signed with the fleet's shared secret: HMAC-SHA256 over the time
//! it was signed and the encoded call (`x-inventory-peer-signature: <unix ms>.<hex>`). The
//! secret never travels, so a lease value pointing somewhere else (anyone who can write Redis
//! could write one) leaks nothing but that call, which only its own key can replay, and only
//! within [`MAX_CLOCK_SKEW`].

use std::{
    collections::HashMap,
    net::SocketAddr,
    pin::Pin,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use inventory_core::{
    Error, FieldViolation,
    budget::Budget,
    command::Reserve,
    domain::Caller,
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
    Service,
    auth::{Principal, Role},
    proto::{
        self,
        inventory::peer::v1::{
            ForwardedAnswer, ForwardedReserve, NotHolder, RelayedStatus, forwarded_answer::Answer,
            peer_service_client::PeerServiceClient, peer_service_server::PeerService,
        },
    },
    status::to_status,
    wire::{Decode as _, Encode as _, relay},
};

/// The metadata key of a forwarded call's signature.
const SIGNATURE: &str = "x-inventory-peer-signature";

/// How far a signature's time may be from the receiver's clock.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(30);

/// A peer that does not accept a connection within this is treated as gone: the call runs
/// here instead (a dead peer must not cost a TCP timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_millis(250);

/// Less time than this left: not worth a hop; the call runs here.
const MIN_HOP_BUDGET: Duration = Duration::from_millis(5);

/// Most peers a replica keeps a connection to; past it, the connections start over.
const MAX_PEERS: usize = 256;

/// The fleet's shared peer secret, as an HMAC key.
#[derive(Clone, Debug)]
pub struct PeerSecret(hmac::Key);

impl PeerSecret {
    pub fn new(secret: &[u8]) -> Self {
        Self(hmac::Key::new(hmac::HMAC_SHA256, secret))
    }

    /// What is signed: the method, the signing time and the encoded call.
    fn signed(at_ms: u64, call: &ForwardedReserve) -> Vec<u8> {
        let mut bytes = b"inventory.peer.v1.PeerService/Reserve\n".to_vec();
        bytes.extend_from_slice(&at_ms.to_be_bytes());
        call.encode(&mut bytes).expect("a Vec grows as needed");
        bytes
    }

    /// The signature header's value for `call`, signed now.
    fn sign(&self, call: &ForwardedReserve) -> String {
        let at_ms = unix_ms(SystemTime::now());
        let tag = hmac::sign(&self.0, &Self::signed(at_ms, call));
        format!("{at_ms}.{}", hex(tag.as_ref()))
    }

    /// Whether `metadata` carries a valid, recent signature of `call`.
    fn verify(&self, metadata: &MetadataMap, call: &ForwardedReserve) -> Result<(), Status> {
        let refused = |why: &str| Status::unauthenticated(format!("peer call refused: {why}"));
        let value = metadata
            .get(SIGNATURE)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| refused("no signature"))?;
        let (at, tag) = value
            .split_once('.')
            .ok_or_else(|| refused("malformed signature"))?;
        let at_ms: u64 = at.parse().map_err(|_| refused("malformed signature"))?;
        let tag = unhex(tag).ok_or_else(|| refused("malformed signature"))?;
        let skew = unix_ms(SystemTime::now()).abs_diff(at_ms);
        if u128::from(skew) > MAX_CLOCK_SKEW.as_millis() {
            return Err(refused("signature too old or from the future"));
        }
        hmac::verify(&self.0, &Self::signed(at_ms, call), &tag)
            .map_err(|_| refused("bad signature"))
    }
}

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The sending side: hands calls to peers over the internal port.
#[derive(Debug)]
pub struct PeerForwarder {
    secret: PeerSecret,
    clients: Mutex<HashMap<SocketAddr, PeerServiceClient<Channel>>>,
}

impl PeerForwarder {
    pub fn new(secret: PeerSecret) -> Self {
        Self {
            secret,
            clients: Mutex::default(),
        }
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

    async fn hop(&self, peer: &Peer, command: &Reserve, deadline: Instant) -> Forwarded {
        // Leases name an `ip:port`; anything else in one is not a peer of ours.
        let Ok(addr) = peer.0.parse::<SocketAddr>() else {
            return Forwarded::Failed {
                error: Error::internal(format!("lease names {peer}, which is not an ip:port")),
                sent: false,
            };
        };
        let left = deadline.saturating_duration_since(Instant::now());
        if left < MIN_HOP_BUDGET {
            return Forwarded::Failed {
                error: Error::DeadlineExceeded,
                sent: false,
            };
        }
        let call = ForwardedReserve {
            request: Some(relay::reserve_request(command)),
            caller: command.caller.as_str().to_owned(),
        };
        let signature = self.secret.sign(&call);
        let mut request = Request::new(call);
        request.set_timeout(left);
        if let Ok(value) = MetadataValue::try_from(signature) {
            request.metadata_mut().insert(SIGNATURE, value);
        }
        let context = tracing::Span::current().context();
        global::get_text_map_propagator(|propagator| {
            propagator.inject_context(&context, &mut MetadataInjector(request.metadata_mut()));
        });
        match self.client(addr).reserve(request).await {
            Ok(answer) => match answer.into_inner().answer {
                Some(Answer::Reservation(reservation)) => match relay::reservation(reservation) {
                    Ok(reservation) => Forwarded::Answered(Ok(reservation)),
                    // It was written there; running it here replays it.
                    Err(error) => Forwarded::Failed { error, sent: true },
                },
                Some(Answer::Error(status)) => Forwarded::Answered(Err(Error::Relayed(Relayed {
                    code: status.code,
                    message: status.message,
                    details: status.details,
                }))),
                Some(Answer::NotHolder(NotHolder {})) => Forwarded::NotHolder,
                // A later release's answer this one cannot read: it ran there.
                None => Forwarded::Failed {
                    error: Error::internal("the peer's answer was empty"),
                    sent: true,
                },
            },
            // Even a refused connection is counted as sent: the transport does not say
            // reliably how far a call got, and a wrong "not sent" could turn a write into a
            // refusal.
            Err(status) => Forwarded::Failed {
                error: Error::internal(format!(
                    "forward to {peer}: {} {}",
                    status.code(),
                    status.message()
                )),
                sent: true,
            },
        }
    }
}

impl Forwarder for PeerForwarder {
    fn forward<'a>(
        &'a self,
        peer: &'a Peer,
        command: &'a Reserve,
        deadline: Instant,
    ) -> Pin<Box<dyn Future<Output = Forwarded> + Send + 'a>> {
        let span = tracing::info_span!("reserve.forward", peer = %peer);
        Box::pin(self.hop(peer, command, deadline).instrument(span))
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
    inventory: Arc<Service>,
    secret: PeerSecret,
    /// The API's admission: forwarded calls count against the same limit.
    in_flight: Arc<Semaphore>,
}

impl PeerApi {
    pub fn new(inventory: Arc<Service>, secret: PeerSecret, in_flight: Arc<Semaphore>) -> Self {
        Self {
            inventory,
            secret,
            in_flight,
        }
    }
}

/// The command a forwarded call carries, for the caller the sender authenticated.
fn command(call: ForwardedReserve) -> Result<Reserve, Error> {
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
    request.into_command(&Principal::new(caller, Role::Reserver))
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
        request: Request<ForwardedReserve>,
    ) -> Result<Response<ForwardedAnswer>, Status> {
        self.secret.verify(request.metadata(), request.get_ref())?;
        let admitted = Arc::clone(&self.in_flight)
            .try_acquire_owned()
            .map_err(|_| to_status(Error::Saturated))?;
        let budget = Budget::from_timeout(
            crate::grpc::client_timeout(request.metadata()),
            Instant::now(),
        );
        let command = match command(request.into_inner()) {
            Ok(command) => command,
            Err(error) => return Ok(Response::new(answer(Err(error)))),
        };
        // On a task of its own, as the API runs a Reserve: a sender that gives up must not
        // cancel it between a lease and its release.
        let inventory = Arc::clone(&self.inventory);
        let work = tokio::spawn(
            async move {
                let _admitted = admitted;
                inventory.reserve_forwarded(&command, budget).await
            }
            .instrument(tracing::Span::current()),
        );
        let result = budget
            .run(async { work.await.unwrap_or_else(|e| Err(Error::internal(e))) })
            .await;
        Ok(Response::new(answer(result)))
    }
}

/// The peer service, ready to serve.
pub fn service(
    api: PeerApi,
) -> proto::inventory::peer::v1::peer_service_server::PeerServiceServer<PeerApi> {
    proto::inventory::peer::v1::peer_service_server::PeerServiceServer::new(api)
}

#[cfg(test)]
mod tests;
