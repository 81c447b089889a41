//! The load under faults: shoppers that reserve across the replicas and then confirm, release
//! (whole or in part), extend, cancel the order (and try to reserve for it again) or let the
//! hold expire, retrying every keyed call of unknown outcome with the same key; a stocker that
//! snapshots and restocks; and a live event watcher that reconnects wherever it can. Every
//! call goes into the [`Recorder`].
//!
//! Each tenant of the run has a stocker and a watcher of its own, and the shoppers take turns
//! among the tenants (shopper `i` is tenant `i mod n`'s), so the tenants' calls interleave on
//! every replica. A tenant's shoppers use the same SKU names, idempotency keys and order ids
//! as every other tenant's: the `k`-th shopper of each tenant sends `<run>-c<k>-<n>`.

mod promiser;

pub use promiser::{BACKORDER_LIMIT, WAITING_SKU, waits};

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use inventory_proto::{
    AdjustStockRequest, AllocationStrategy, CancelOrderRequest, CancelOrderResponse,
    ConfirmReservationRequest, Event, EventType, ExtendReservationRequest, GetStockRequest,
    ReleaseReservationRequest, Reservation, ReservationLine, ReservationState, ReserveRequest,
    WatchEventsRequest, event, inventory_service_client::InventoryServiceClient,
};
use rand::{Rng as _, SeedableRng as _, rngs::StdRng, seq::IndexedRandom as _};
use tokio::{sync::watch, task::JoinHandle};
use tonic::{Code, transport::Channel};

use crate::{
    history::{Line, Op, OpKind, Outcome, Phase, Recorder, SeenEvent, Snapshot},
    tenants::{Credentials, TenantCallers},
};

#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub run_id: String,
    /// Shoppers of all tenants together, dealt to the tenants in turn.
    pub clients: usize,
    /// The tenants and their callers; each stocks, sells and watches the same SKU names.
    pub tenants: Vec<TenantCallers>,
    pub skus: Vec<String>,
    /// Units a SKU starts with, and the restock step.
    pub stock: i64,
    pub seed: u64,
    /// The client's deadline for one call.
    pub call_timeout: Duration,
    /// Attempts of one keyed call (`Reserve`, a partial confirm or release, `CancelOrder`; the
    /// same key each time) before the outcome is left unknown.
    pub attempts: usize,
}

impl WorkloadConfig {
    fn caller<'a>(
        &'a self,
        tenant: &'a TenantCallers,
        endpoints: &'a Endpoints,
        recorder: &'a Recorder,
    ) -> Caller<'a> {
        Caller {
            tenant,
            endpoints,
            recorder,
            phase: Phase::Load,
            timeout: self.call_timeout,
            attempts: self.attempts,
        }
    }
}

/// One lazily connected channel per replica; tonic reconnects after a restart.
#[derive(Clone, Debug)]
pub struct Endpoints(Vec<Channel>);

impl Endpoints {
    pub fn new(addrs: &[String]) -> anyhow::Result<Self> {
        let channels = addrs
            .iter()
            .map(|addr| {
                Ok(Channel::from_shared(addr.clone())?
                    .connect_timeout(Duration::from_millis(500))
                    .connect_lazy())
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self(channels))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn client(&self, replica: usize) -> InventoryServiceClient<Channel> {
        InventoryServiceClient::new(self.0[replica % self.0.len()].clone())
    }
}

/// A call's result reduced to what the history keeps.
struct Answer {
    code: Code,
    message: String,
    reservation_id: Option<String>,
    state: Option<String>,
    /// (sku, held, confirmed, released) of the answered lines.
    units: Vec<(String, i64, i64, i64)>,
}

impl Answer {
    /// An answer that carries a status and nothing else.
    fn status(code: Code, message: String) -> Self {
        Self {
            code,
            message,
            reservation_id: None,
            state: None,
            units: Vec::new(),
        }
    }

    fn of_reservation(reservation: Reservation) -> Self {
        Self {
            code: Code::Ok,
            message: String::new(),
            state: state_name(reservation.state),
            units: units_of(&reservation),
            reservation_id: Some(reservation.reservation_id),
        }
    }

    /// A `CancelOrder` answer: the first reservation's id and state, every reservation's units.
    fn of_cancel(reservations: Vec<Reservation>) -> Self {
        Self {
            code: Code::Ok,
            message: String::new(),
            reservation_id: reservations.first().map(|r| r.reservation_id.clone()),
            state: reservations.first().and_then(|r| state_name(r.state)),
            units: reservations.iter().flat_map(units_of).collect(),
        }
    }
}

fn units_of(reservation: &Reservation) -> Vec<(String, i64, i64, i64)> {
    reservation
        .lines
        .iter()
        .map(|l| (l.sku.clone(), l.held, l.confirmed, l.released))
        .collect()
}

fn state_name(state: i32) -> Option<String> {
    ReservationState::try_from(state).ok().map(|s| {
        s.as_str_name()
            .trim_start_matches("RESERVATION_STATE_")
            .to_owned()
    })
}

/// Runs one call as `as_caller`, with a client-side deadline as well as the `grpc-timeout` the
/// server sees, so a paused server cannot hold a client forever; `ok` reduces a success.
async fn call<T, R, F>(
    (timeout, as_caller): (Duration, &Credentials),
    message: T,
    f: F,
    ok: impl FnOnce(R) -> Answer,
) -> Answer
where
    F: AsyncFnOnce(tonic::Request<T>) -> Result<tonic::Response<R>, tonic::Status>,
{
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    as_caller.authorize(&mut request);
    match tokio::time::timeout(timeout + Duration::from_millis(200), f(request)).await {
        Ok(Ok(response)) => ok(response.into_inner()),
        Ok(Err(status)) => Answer::status(status.code(), status.message().to_owned()),
        Err(_) => Answer::status(Code::DeadlineExceeded, "client deadline".into()),
    }
}

fn proto_lines(lines: &[Line]) -> Vec<ReservationLine> {
    lines
        .iter()
        .map(|l| ReservationLine {
            sku: l.sku.clone(),
            quantity: l.quantity,
            ..Default::default()
        })
        .collect()
}

fn proto_duration(ms: u64) -> prost_types::Duration {
    prost_types::Duration {
        seconds: (ms / 1000) as i64,
        nanos: ((ms % 1000) * 1_000_000) as i32,
    }
}

/// The locations the run's stock is kept at: `default` and two more. Seeds, restocks and
/// allocation spread over them.
pub const LOCATIONS: [&str; 3] = ["default", "chaos-east", "chaos-west"];

/// A number of the key, the same on every send: what a keyed call's location or allocation
/// is derived from, so a retry sends exactly the same request.
fn key_number(key: &str) -> usize {
    key.bytes()
        .fold(0usize, |n, b| n.wrapping_mul(31).wrapping_add(b as usize))
}

/// The location an `AdjustStock` with this key changes: the one the key names after `@`,
/// else one picked by the key.
pub fn location_of(key: &str) -> &str {
    match key.rsplit_once('@') {
        Some((_, location)) => location,
        None => LOCATIONS[key_number(key) % LOCATIONS.len()],
    }
}

/// A `Reserve` request as the history keeps it, enough to send it again with the same key:
/// a quarter of the keys each get one of the two strategies, with or without split.
pub fn reserve_request(key: &str, order_id: &str, lines: &[Line], ttl_ms: u64) -> ReserveRequest {
    let n = key_number(key);
    let strategy = if n.is_multiple_of(2) {
        AllocationStrategy::Priority
    } else {
        AllocationStrategy::MostAvailable
    };
    ReserveRequest {
        idempotency_key: key.to_owned(),
        order_id: order_id.to_owned(),
        lines: proto_lines(lines),
        ttl: Some(proto_duration(ttl_ms)),
        strategy: strategy.into(),
        allow_split: (n / 2).is_multiple_of(2),
        ..Default::default()
    }
}

/// Ends the load's tasks.
#[derive(Debug)]
pub struct Running {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Starts the shoppers, and each tenant's stocker and watcher; they run until
/// [`Running::stop`].
pub fn start(config: WorkloadConfig, endpoints: Endpoints, recorder: Recorder) -> Running {
    let (stop, stopped) = watch::channel(false);
    let config = Arc::new(config);
    let mut tasks = Vec::new();
    // Each task gets its own handles to the shared pieces.
    let handles = || {
        (
            config.clone(),
            endpoints.clone(),
            recorder.clone(),
            stopped.clone(),
        )
    };
    for client in 0..config.clients {
        let (config, endpoints, recorder, stopped) = handles();
        tasks.push(tokio::spawn(async move {
            shopper(client, &config, &endpoints, &recorder, stopped).await;
        }));
    }
    if !config.tenants.is_empty() {
        let (config, endpoints, recorder, stopped) = handles();
        tasks.push(tokio::spawn(async move {
            promiser::promiser(&config, &endpoints, &recorder, stopped).await;
        }));
    }
    for tenant in 0..config.tenants.len() {
        let (config, endpoints, recorder, stopped) = handles();
        tasks.push(tokio::spawn(async move {
            stocker(&config, tenant, &endpoints, &recorder, stopped).await;
        }));
        let (config, endpoints, recorder, stopped) = handles();
        tasks.push(tokio::spawn(async move {
            let tenant = &config.tenants[tenant];
            watcher(tenant, endpoints, recorder, stopped).await;
        }));
    }
    Running { stop, tasks }
}

/// How calls are made in one phase: as which tenant's callers, through which replicas,
/// recorded where, with what deadline and how many attempts under one key.
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a> {
    /// Shoppers' calls go as its `reserver`, `AdjustStock` as its `admin`.
    pub tenant: &'a TenantCallers,
    pub endpoints: &'a Endpoints,
    pub recorder: &'a Recorder,
    pub phase: Phase,
    pub timeout: Duration,
    pub attempts: usize,
}

/// One request of any kind the workload sends.
#[derive(Clone, Debug)]
enum Request {
    Reserve(ReserveRequest),
    Confirm(ConfirmReservationRequest),
    Release(ReleaseReservationRequest),
    Extend(ExtendReservationRequest),
    Cancel(CancelOrderRequest),
    Adjust(AdjustStockRequest),
}

impl Caller<'_> {
    /// Sends one request to one replica.
    async fn attempt(&self, replica: usize, request: Request) -> Answer {
        let mut grpc = self.endpoints.client(replica);
        let as_caller = match request {
            Request::Adjust(_) => &self.tenant.admin,
            _ => &self.tenant.shopper,
        };
        let how = (self.timeout, as_caller);
        match request {
            Request::Reserve(m) => {
                let f = async |r| grpc.reserve(r).await;
                call(how, m, f, Answer::of_reservation).await
            }
            Request::Confirm(m) => {
                let f = async |r| grpc.confirm_reservation(r).await;
                call(how, m, f, Answer::of_reservation).await
            }
            Request::Release(m) => {
                let f = async |r| grpc.release_reservation(r).await;
                call(how, m, f, Answer::of_reservation).await
            }
            Request::Extend(m) => {
                let f = async |r| grpc.extend_reservation(r).await;
                call(how, m, f, Answer::of_reservation).await
            }
            Request::Cancel(m) => {
                let f = async |r| grpc.cancel_order(r).await;
                call(how, m, f, |c: CancelOrderResponse| {
                    Answer::of_cancel(c.reservations)
                })
                .await
            }
            Request::Adjust(m) => {
                let f = async |r| grpc.adjust_stock(r).await;
                call(how, m, f, |_| Answer::status(Code::Ok, String::new())).await
            }
        }
    }

    /// Sends one request up to `tries` times, while its outcome is unknown (a keyed call, so a
    /// repeat acts at most once), each attempt to the next replica from `replica`; records
    /// every attempt as `op` with its own answer. Returns the last answer.
    async fn send(&self, replica: usize, tries: usize, op: Op, request: Request) -> Answer {
        let mut n = 0;
        loop {
            let replica = (replica + n) % self.endpoints.len();
            let invoked_ms = self.recorder.now_ms();
            let answer = self.attempt(replica, request.clone()).await;
            let outcome = Outcome::of(answer.code);
            self.recorder.op(Op {
                replica,
                phase: self.phase,
                reservation_id: answer
                    .reservation_id
                    .clone()
                    .or_else(|| op.reservation_id.clone()),
                invoked_ms,
                completed_ms: self.recorder.now_ms(),
                outcome,
                code: format!("{:?}", answer.code),
                state: answer.state.clone(),
                units: answer.units.clone(),
                message: answer.message.clone(),
                ..op.clone()
            });
            n += 1;
            if outcome != Outcome::Unknown || n >= tries {
                return answer;
            }
            backoff(n - 1).await;
        }
    }

    /// Sends a `Reserve` until it gets a definite answer or runs out of attempts, each attempt
    /// to the next replica; returns the reservation when it succeeded.
    pub async fn reserve(
        &self,
        client: usize,
        key: &str,
        order_id: &str,
        lines: &[Line],
        ttl_ms: u64,
    ) -> (Outcome, Option<String>) {
        let op = Op {
            key: Some(key.to_owned()),
            order_id: Some(order_id.to_owned()),
            lines: lines.to_vec(),
            ttl_ms: Some(ttl_ms),
            ..self.op(client, OpKind::Reserve)
        };
        let request = Request::Reserve(reserve_request(key, order_id, lines, ttl_ms));
        let answer = self.send(client, self.attempts, op, request).await;
        match Outcome::of(answer.code) {
            Outcome::Ok => (Outcome::Ok, answer.reservation_id),
            outcome => (outcome, None),
        }
    }

    /// A whole confirm or release (no lines, no key): one attempt.
    pub async fn settle(&self, client: usize, replica: usize, kind: OpKind, id: &str) -> Outcome {
        self.settle_lines(client, replica, kind, id, None).await
    }

    /// A partial confirm or release of `lines` under `key`, retried with the key while its
    /// outcome is unknown.
    pub async fn settle_part(
        &self,
        client: usize,
        replica: usize,
        kind: OpKind,
        id: &str,
        (key, lines): (&str, &[Line]),
    ) -> Outcome {
        self.settle_lines(client, replica, kind, id, Some((key, lines)))
            .await
    }

    /// A confirm or release, whole or (with a key and lines) in part.
    async fn settle_lines(
        &self,
        client: usize,
        replica: usize,
        kind: OpKind,
        id: &str,
        part: Option<(&str, &[Line])>,
    ) -> Outcome {
        let (key, lines) = part.unzip();
        let lines = lines.unwrap_or_default();
        let op = Op {
            key: key.map(str::to_owned),
            reservation_id: Some(id.to_owned()),
            lines: lines.to_vec(),
            ..self.op(client, kind)
        };
        let reservation_id = id.to_owned();
        let idempotency_key = key.unwrap_or_default().to_owned();
        let lines = proto_lines(lines);
        let request = if kind == OpKind::Confirm {
            Request::Confirm(ConfirmReservationRequest {
                reservation_id,
                lines,
                idempotency_key,
            })
        } else {
            Request::Release(ReleaseReservationRequest {
                reservation_id,
                lines,
                idempotency_key,
            })
        };
        // A whole call carries no key: it is sent once.
        let tries = if part.is_some() { self.attempts } else { 1 };
        Outcome::of(self.send(replica, tries, op, request).await.code)
    }

    /// Moves a hold's expiry to `ttl_ms` from now: one attempt (a repeat would move it again).
    pub async fn extend(&self, client: usize, replica: usize, id: &str, ttl_ms: u64) -> Outcome {
        let op = Op {
            reservation_id: Some(id.to_owned()),
            ttl_ms: Some(ttl_ms),
            ..self.op(client, OpKind::Extend)
        };
        let request = Request::Extend(ExtendReservationRequest {
            reservation_id: id.to_owned(),
            ttl: Some(proto_duration(ttl_ms)),
        });
        Outcome::of(self.send(replica, 1, op, request).await.code)
    }

    /// Cancels an order under `key`, retried with the key while its outcome is unknown.
    pub async fn cancel(
        &self,
        client: usize,
        replica: usize,
        key: &str,
        order_id: &str,
    ) -> Outcome {
        let op = Op {
            key: Some(key.to_owned()),
            order_id: Some(order_id.to_owned()),
            ..self.op(client, OpKind::Cancel)
        };
        let request = Request::Cancel(CancelOrderRequest {
            order_id: order_id.to_owned(),
            idempotency_key: key.to_owned(),
            reason: "chaos cancel".into(),
        });
        Outcome::of(self.send(replica, self.attempts, op, request).await.code)
    }

    /// An operation of this phase with nothing filled in yet.
    fn op(&self, client: usize, kind: OpKind) -> Op {
        Op {
            tenant: self.tenant.tenant.clone(),
            client,
            replica: 0,
            kind,
            phase: self.phase,
            key: None,
            reservation_id: None,
            order_id: None,
            lines: Vec::new(),
            ttl_ms: None,
            invoked_ms: 0.0,
            completed_ms: 0.0,
            outcome: Outcome::Unknown,
            code: String::new(),
            state: None,
            units: Vec::new(),
            message: String::new(),
        }
    }

    /// An `AdjustStock` with retries under one key, recorded like a `Reserve`.
    pub async fn adjust(&self, key: &str, sku: &str, delta: i64) -> Outcome {
        let op = Op {
            key: Some(key.to_owned()),
            lines: vec![Line {
                sku: sku.to_owned(),
                quantity: delta,
            }],
            ..self.op(usize::MAX, OpKind::Adjust)
        };
        let request = Request::Adjust(AdjustStockRequest {
            sku: sku.to_owned(),
            delta,
            idempotency_key: key.to_owned(),
            reason: "chaos restock".into(),
            location_id: location_of(key).to_owned(),
            ..Default::default()
        });
        Outcome::of(self.send(0, self.attempts, op, request).await.code)
    }
}

async fn backoff(attempt: usize) {
    tokio::time::sleep(Duration::from_millis(100 * (attempt as u64 + 1))).await;
}

/// What a shopper does with a hold it got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    Confirm,
    Release,
    /// Confirm or release some units of one line first.
    Part,
    Extend,
    /// Cancel the order, then try to reserve for it again.
    Cancel,
    Expire,
}

impl Plan {
    /// Of 100 holds: 25 confirmed, 15 released, 15 settled in parts, 10 extended, 10
    /// cancelled, 25 left to expire.
    fn pick(rng: &mut StdRng) -> Self {
        match rng.random_range(0..100) {
            0..25 => Plan::Confirm,
            25..40 => Plan::Release,
            40..55 => Plan::Part,
            55..65 => Plan::Extend,
            65..75 => Plan::Cancel,
            _ => Plan::Expire,
        }
    }
}

/// Shopper `client` of all: tenant `client mod n`'s, and within it shopper `client / n`, whose
/// keys are those of the same shopper of every other tenant.
async fn shopper(
    client: usize,
    config: &WorkloadConfig,
    endpoints: &Endpoints,
    recorder: &Recorder,
    stopped: watch::Receiver<bool>,
) {
    let mut rng =
        StdRng::seed_from_u64(config.seed ^ (client as u64 + 1).wrapping_mul(0x9e37_79b9));
    let tenants = config.tenants.len();
    let caller = config.caller(&config.tenants[client % tenants], endpoints, recorder);
    let own = client / tenants;
    for n in 0.. {
        if *stopped.borrow() {
            return;
        }
        // Mostly one line; one cart in six has two SKUs.
        let mut skus: Vec<&String> = config.skus.choose_multiple(&mut rng, 2).collect();
        if rng.random_range(0..6) != 0 {
            skus.truncate(1);
        }
        let lines: Vec<Line> = skus
            .into_iter()
            .map(|sku| Line {
                sku: sku.clone(),
                quantity: rng.random_range(1..=3),
            })
            .collect();
        let key = format!("{}-c{own}-{n}", config.run_id);
        let order_id = format!("order-{key}");
        let ttl_ms = rng.random_range(1_000..=3_000);
        let (_, reservation) = caller
            .reserve(client, &key, &order_id, &lines, ttl_ms)
            .await;
        if let Some(id) = reservation {
            let hold = Hold {
                client,
                replica: (client + n) % endpoints.len(),
                key: &key,
                order_id: &order_id,
                id: &id,
                lines: &lines,
                ttl_ms,
            };
            hold.follow_up(&caller, &mut rng).await;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
    }
}

/// A hold a shopper got, and what it asked for.
struct Hold<'a> {
    client: usize,
    /// Where its calls after the `Reserve` go first.
    replica: usize,
    key: &'a str,
    order_id: &'a str,
    id: &'a str,
    lines: &'a [Line],
    ttl_ms: u64,
}

impl Hold<'_> {
    /// Follows a plan picked with `rng`; every choice is drawn before the calls it leads to.
    async fn follow_up(&self, caller: &Caller<'_>, rng: &mut StdRng) {
        let pause = rng.random_range(0..300);
        let mut plan = Plan::pick(rng);
        // A part needs a line of two units or more: some stay held.
        let splittable: Vec<&Line> = self.lines.iter().filter(|l| l.quantity >= 2).collect();
        let part = splittable.choose(rng).map(|line| Line {
            sku: line.sku.clone(),
            quantity: rng.random_range(1..line.quantity),
        });
        if plan == Plan::Part && part.is_none() {
            plan = Plan::Confirm;
        }
        sleep_ms(pause).await;
        match plan {
            Plan::Confirm => self.settle(caller, OpKind::Confirm).await,
            Plan::Release => self.settle(caller, OpKind::Release).await,
            Plan::Part => {
                let kind = if rng.random_bool(0.5) {
                    OpKind::Confirm
                } else {
                    OpKind::Release
                };
                let then = match rng.random_range(0..3) {
                    0 => Some(OpKind::Confirm),
                    1 => Some(OpKind::Release),
                    _ => None,
                };
                let pause = rng.random_range(0..300);
                let part = part.expect("a line to split");
                let key = format!("{}-part", self.key);
                let part = (key.as_str(), std::slice::from_ref(&part));
                caller
                    .settle_part(self.client, self.replica, kind, self.id, part)
                    .await;
                if let Some(then) = then {
                    sleep_ms(pause).await;
                    self.settle(caller, then).await;
                }
            }
            Plan::Extend => {
                let ttl_ms = rng.random_range(2_000..=4_000);
                // Half are confirmed up to 1.5 s later: at times past the first expiry, always
                // within the new one.
                let confirm_after = rng.random_bool(0.5).then(|| rng.random_range(0..1_500));
                caller
                    .extend(self.client, self.replica, self.id, ttl_ms)
                    .await;
                if let Some(pause) = confirm_after {
                    sleep_ms(pause).await;
                    self.settle(caller, OpKind::Confirm).await;
                }
            }
            Plan::Cancel => {
                let key = format!("{}-cancel", self.key);
                let cancelled = caller
                    .cancel(self.client, self.replica, &key, self.order_id)
                    .await;
                if cancelled == Outcome::Ok {
                    // Must be refused: the order is cancelled for good.
                    let key = format!("{}-late", self.key);
                    caller
                        .reserve(self.client, &key, self.order_id, self.lines, self.ttl_ms)
                        .await;
                }
            }
            Plan::Expire => {}
        }
    }

    /// A whole confirm or release.
    async fn settle(&self, caller: &Caller<'_>, kind: OpKind) {
        caller
            .settle(self.client, self.replica, kind, self.id)
            .await;
    }
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Snapshots every SKU's level of one tenant every 200 ms and restocks a SKU that runs low.
async fn stocker(
    config: &WorkloadConfig,
    tenant: usize,
    endpoints: &Endpoints,
    recorder: &Recorder,
    stopped: watch::Receiver<bool>,
) {
    let tenant = &config.tenants[tenant];
    let caller = config.caller(tenant, endpoints, recorder);
    let mut restocks = 0;
    for tick in 0usize.. {
        if *stopped.borrow() {
            return;
        }
        let mut grpc = endpoints.client(tick);
        let mut request = tonic::Request::new(GetStockRequest {
            skus: config.skus.clone(),
            ..Default::default()
        });
        request.set_timeout(config.call_timeout);
        tenant.admin.authorize(&mut request);
        let levels = match tokio::time::timeout(config.call_timeout, grpc.get_stock(request)).await
        {
            Ok(Ok(response)) => response.into_inner().levels,
            _ => Vec::new(),
        };
        let at_ms = recorder.now_ms();
        for level in levels {
            recorder.snapshot(Snapshot {
                tenant: tenant.tenant.clone(),
                at_ms,
                sku: level.sku.clone(),
                on_hand: level.on_hand,
                reserved: level.reserved,
                available: level.available,
            });
            if level.available < config.stock / 4 {
                restocks += 1;
                let key = format!("{}-restock-{restocks}", config.run_id);
                caller.adjust(&key, &level.sku, config.stock / 2).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Follows one tenant's `WatchEvents` live; on any break it resumes after the last event it
/// saw, on the next replica.
async fn watcher(
    tenant: &TenantCallers,
    endpoints: Endpoints,
    recorder: Recorder,
    mut stopped: watch::Receiver<bool>,
) {
    let (mut after, mut epoch) = (0, String::new());
    for replica in 0.. {
        if *stopped.borrow() {
            return;
        }
        let mut grpc = endpoints.client(replica);
        let follow = async {
            let mut request = tonic::Request::new(WatchEventsRequest {
                after_sequence: after,
                epoch: epoch.clone(),
                ..Default::default()
            });
            tenant.admin.authorize(&mut request);
            let mut stream = grpc.watch_events(request).await?.into_inner();
            while let Some(event) = stream.message().await? {
                after = event.sequence;
                epoch.clone_from(&event.epoch);
                recorder.event(seen(&tenant.tenant, event));
            }
            Ok::<_, tonic::Status>(())
        };
        tokio::select! {
            _ = follow => {}
            _ = stopped.changed() => return,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// An event of `tenant`'s stream reduced to what the checker compares.
pub fn seen(tenant: &str, event: Event) -> SeenEvent {
    let mut seen = SeenEvent {
        tenant: tenant.to_owned(),
        sequence: event.sequence,
        event_id: event.event_id,
        event_type: EventType::try_from(event.r#type)
            .map(|t| t.as_str_name().trim_start_matches("EVENT_TYPE_").to_owned())
            .unwrap_or_default(),
        reservation_id: None,
        sku: None,
        delta: None,
        state: None,
        lines: Vec::new(),
        units: Vec::new(),
        levels: Vec::new(),
        steps: Vec::new(),
        promised: Vec::new(),
    };
    match event.subject {
        Some(event::Subject::ReservationId(id)) => seen.reservation_id = Some(id),
        Some(event::Subject::Sku(sku)) => seen.sku = Some(sku),
        None => {}
    }
    let mut located = Vec::new();
    let levels = match event.payload {
        Some(event::Payload::StockAdjusted(adjusted)) => {
            seen.delta = Some(adjusted.delta);
            located.extend(adjusted.location_level);
            adjusted.level.into_iter().collect()
        }
        Some(event::Payload::StockTransferred(transferred)) => {
            located = transferred.location_levels;
            transferred.level.into_iter().collect()
        }
        Some(event::Payload::StockStateChanged(changed)) => {
            located.extend(changed.location_level);
            changed.level.into_iter().collect()
        }
        Some(event::Payload::ReservationChanged(changed)) => {
            located = changed.location_levels;
            seen.state = state_name(changed.state);
            seen.units = changed
                .lines
                .iter()
                .map(|l| (l.held, l.confirmed, l.released))
                .collect();
            seen.lines = changed
                .lines
                .into_iter()
                .map(|l| Line {
                    sku: l.sku,
                    quantity: l.quantity,
                })
                .collect();
            changed.levels
        }
        // The level is the one the change that crossed 0 already carried: repeating it would
        // count one version twice.
        Some(event::Payload::Availability(_)) | None => Vec::new(),
    };
    seen.promised = levels
        .iter()
        .chain(&located)
        .map(|l| {
            (
                l.sku.clone(),
                l.on_hand,
                l.reserved,
                l.backordered,
                l.backorder_limit,
                l.unsellable,
            )
        })
        .collect();
    seen.levels = levels
        .into_iter()
        .map(|l| (l.sku, l.on_hand, l.reserved, l.version))
        .collect();
    // Each location the change moved is one movement: one version of its SKU.
    for level in located {
        match seen.steps.iter_mut().find(|(sku, _)| *sku == level.sku) {
            Some((_, steps)) => *steps += 1,
            None => seen.steps.push((level.sku, 1)),
        }
    }
    seen
}

/// Reads one tenant's whole stream from the start until `head`, from whichever replica
/// answers.
pub async fn read_stream(
    endpoints: &Endpoints,
    tenant: &TenantCallers,
    head: i64,
) -> anyhow::Result<Vec<SeenEvent>> {
    let mut events: Vec<SeenEvent> = Vec::new();
    let mut epoch = String::new();
    let started = Instant::now();
    let mut replica = 0;
    while events.last().map_or(0, |e| e.sequence) < head {
        if started.elapsed() > Duration::from_secs(60) {
            anyhow::bail!(
                "tenant {}'s event stream stopped at {} of {head}",
                tenant.tenant,
                events.last().map_or(0, |e| e.sequence)
            );
        }
        let mut grpc = endpoints.client(replica);
        replica += 1;
        let after = events.last().map_or(0, |e| e.sequence);
        let mut request = tonic::Request::new(WatchEventsRequest {
            after_sequence: after,
            epoch: epoch.clone(),
            ..Default::default()
        });
        tenant.admin.authorize(&mut request);
        let Ok(response) = grpc.watch_events(request).await else {
            continue;
        };
        let mut stream = response.into_inner();
        while let Ok(Ok(Some(event))) =
            tokio::time::timeout(Duration::from_secs(5), stream.message()).await
        {
            let done = event.sequence >= head;
            epoch.clone_from(&event.epoch);
            events.push(seen(&tenant.tenant, event));
            if done {
                return Ok(events);
            }
        }
    }
    Ok(events)
}
