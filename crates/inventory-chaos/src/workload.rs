//! The load under faults: shoppers that reserve, confirm and release across the replicas and
//! retry unknown outcomes with the same key, a stocker that snapshots and restocks, and a live
//! event watcher that reconnects wherever it can. Every call goes into the [`Recorder`].

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use inventory_proto::{
    AdjustStockRequest, ConfirmReservationRequest, Event, EventType, GetStockRequest,
    ReleaseReservationRequest, ReservationLine, ReservationState, ReserveRequest,
    WatchEventsRequest, event, inventory_service_client::InventoryServiceClient,
};
use rand::{Rng as _, SeedableRng as _, rngs::StdRng, seq::IndexedRandom as _};
use tokio::{sync::watch, task::JoinHandle};
use tonic::{Code, transport::Channel};

use crate::history::{Line, Op, OpKind, Outcome, Phase, Recorder, SeenEvent, Snapshot};

#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub run_id: String,
    pub clients: usize,
    pub skus: Vec<String>,
    /// Units a SKU starts with, and the restock step.
    pub stock: i64,
    pub seed: u64,
    /// The client's deadline for one call.
    pub call_timeout: Duration,
    /// Attempts of one `Reserve` (the same key each time) before the outcome is left unknown.
    pub attempts: usize,
}

impl WorkloadConfig {
    fn caller<'a>(&self, endpoints: &'a Endpoints, recorder: &'a Recorder) -> Caller<'a> {
        Caller {
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
}

fn state_name(state: i32) -> Option<String> {
    ReservationState::try_from(state).ok().map(|s| {
        s.as_str_name()
            .trim_start_matches("RESERVATION_STATE_")
            .to_owned()
    })
}

/// Runs one call with a client-side deadline as well as the `grpc-timeout` the server sees,
/// so a paused server cannot hold a client forever.
async fn call<T, F>(timeout: Duration, message: T, f: F) -> Answer
where
    F: AsyncFnOnce(
        tonic::Request<T>,
    ) -> Result<tonic::Response<inventory_proto::Reservation>, tonic::Status>,
{
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    match tokio::time::timeout(timeout + Duration::from_millis(200), f(request)).await {
        Ok(Ok(response)) => {
            let reservation = response.into_inner();
            Answer {
                code: Code::Ok,
                message: String::new(),
                reservation_id: Some(reservation.reservation_id),
                state: state_name(reservation.state),
            }
        }
        Ok(Err(status)) => Answer {
            code: status.code(),
            message: status.message().to_owned(),
            reservation_id: None,
            state: None,
        },
        Err(_) => Answer {
            code: Code::DeadlineExceeded,
            message: "client deadline".into(),
            reservation_id: None,
            state: None,
        },
    }
}

/// A `Reserve` request as the history keeps it, enough to send it again with the same key.
pub fn reserve_request(key: &str, lines: &[Line], ttl_ms: u64) -> ReserveRequest {
    ReserveRequest {
        idempotency_key: key.to_owned(),
        order_id: format!("order-{key}"),
        lines: lines
            .iter()
            .map(|l| ReservationLine {
                sku: l.sku.clone(),
                quantity: l.quantity,
                ..Default::default()
            })
            .collect(),
        ttl: Some(prost_types::Duration {
            seconds: (ttl_ms / 1000) as i64,
            nanos: ((ttl_ms % 1000) * 1_000_000) as i32,
        }),
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

/// Starts shoppers, the stocker and the watcher; they run until [`Running::stop`].
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
    {
        let (config, endpoints, recorder, stopped) = handles();
        tasks.push(tokio::spawn(async move {
            stocker(&config, &endpoints, &recorder, stopped).await;
        }));
    }
    tasks.push(tokio::spawn(watcher(endpoints, recorder, stopped)));
    Running { stop, tasks }
}

/// How calls are made in one phase: through which replicas, recorded where, with what
/// deadline and how many attempts under one key.
#[derive(Clone, Copy, Debug)]
pub struct Caller<'a> {
    pub endpoints: &'a Endpoints,
    pub recorder: &'a Recorder,
    pub phase: Phase,
    pub timeout: Duration,
    pub attempts: usize,
}

impl Caller<'_> {
    /// Sends a `Reserve` until it gets a definite answer or runs out of attempts, each attempt
    /// to the next replica; returns the reservation when it succeeded.
    pub async fn reserve(
        &self,
        client: usize,
        key: &str,
        lines: &[Line],
        ttl_ms: u64,
    ) -> (Outcome, Option<String>) {
        let mut outcome = Outcome::Unknown;
        for attempt in 0..self.attempts {
            let replica = (client + attempt) % self.endpoints.len();
            let invoked_ms = self.recorder.now_ms();
            let mut grpc = self.endpoints.client(replica);
            let answer = call(
                self.timeout,
                reserve_request(key, lines, ttl_ms),
                async |r| grpc.reserve(r).await,
            )
            .await;
            outcome = Outcome::of(answer.code);
            self.recorder.op(Op {
                client,
                replica,
                kind: OpKind::Reserve,
                phase: self.phase,
                key: Some(key.to_owned()),
                reservation_id: answer.reservation_id.clone(),
                lines: lines.to_vec(),
                ttl_ms: Some(ttl_ms),
                invoked_ms,
                completed_ms: self.recorder.now_ms(),
                outcome,
                code: format!("{:?}", answer.code),
                state: answer.state,
                message: answer.message,
            });
            match outcome {
                Outcome::Ok => return (outcome, answer.reservation_id),
                Outcome::Fail => return (outcome, None),
                Outcome::Unknown => backoff(attempt).await,
            }
        }
        (outcome, None)
    }

    /// An `AdjustStock` with retries under one key, recorded like a `Reserve`.
    pub async fn adjust(&self, key: &str, sku: &str, delta: i64) -> Outcome {
        let mut outcome = Outcome::Unknown;
        for attempt in 0..self.attempts {
            let replica = attempt % self.endpoints.len();
            let invoked_ms = self.recorder.now_ms();
            let mut request = tonic::Request::new(AdjustStockRequest {
                sku: sku.to_owned(),
                delta,
                idempotency_key: key.to_owned(),
                reason: "chaos restock".into(),
            });
            request.set_timeout(self.timeout);
            let mut grpc = self.endpoints.client(replica);
            let code = match tokio::time::timeout(self.timeout, grpc.adjust_stock(request)).await {
                Ok(Ok(_)) => Code::Ok,
                Ok(Err(status)) => status.code(),
                Err(_) => Code::DeadlineExceeded,
            };
            outcome = Outcome::of(code);
            self.recorder.op(Op {
                client: usize::MAX,
                replica,
                kind: OpKind::Adjust,
                phase: self.phase,
                key: Some(key.to_owned()),
                reservation_id: None,
                lines: vec![Line {
                    sku: sku.to_owned(),
                    quantity: delta,
                }],
                ttl_ms: None,
                invoked_ms,
                completed_ms: self.recorder.now_ms(),
                outcome,
                code: format!("{code:?}"),
                state: None,
                message: String::new(),
            });
            if outcome != Outcome::Unknown {
                return outcome;
            }
            backoff(attempt).await;
        }
        outcome
    }
}

async fn backoff(attempt: usize) {
    tokio::time::sleep(Duration::from_millis(100 * (attempt as u64 + 1))).await;
}

async fn shopper(
    client: usize,
    config: &WorkloadConfig,
    endpoints: &Endpoints,
    recorder: &Recorder,
    stopped: watch::Receiver<bool>,
) {
    let mut rng =
        StdRng::seed_from_u64(config.seed ^ (client as u64 + 1).wrapping_mul(0x9e37_79b9));
    let caller = config.caller(endpoints, recorder);
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
        let key = format!("{}-c{client}-{n}", config.run_id);
        let ttl_ms = rng.random_range(1_000..=3_000);
        let (_, reservation) = caller.reserve(client, &key, &lines, ttl_ms).await;
        if let Some(id) = reservation {
            // About a third confirmed, a quarter released, the rest left to expire.
            let roll = rng.random_range(0..100);
            let kind = match roll {
                0..35 => Some(OpKind::Confirm),
                35..60 => Some(OpKind::Release),
                _ => None,
            };
            if let Some(kind) = kind {
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..300))).await;
                let replica = (client + n) % endpoints.len();
                settle(client, replica, kind, &id, config, endpoints, recorder).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..20))).await;
    }
}

async fn settle(
    client: usize,
    replica: usize,
    kind: OpKind,
    id: &str,
    config: &WorkloadConfig,
    endpoints: &Endpoints,
    recorder: &Recorder,
) {
    let invoked_ms = recorder.now_ms();
    let mut grpc = endpoints.client(replica);
    let answer = match kind {
        OpKind::Confirm => {
            let message = ConfirmReservationRequest {
                reservation_id: id.to_owned(),
                ..Default::default()
            };
            call(config.call_timeout, message, async |r| {
                grpc.confirm_reservation(r).await
            })
            .await
        }
        _ => {
            let message = ReleaseReservationRequest {
                reservation_id: id.to_owned(),
                ..Default::default()
            };
            call(config.call_timeout, message, async |r| {
                grpc.release_reservation(r).await
            })
            .await
        }
    };
    recorder.op(Op {
        client,
        replica,
        kind,
        phase: Phase::Load,
        key: None,
        reservation_id: Some(id.to_owned()),
        lines: Vec::new(),
        ttl_ms: None,
        invoked_ms,
        completed_ms: recorder.now_ms(),
        outcome: Outcome::of(answer.code),
        code: format!("{:?}", answer.code),
        state: answer.state,
        message: answer.message,
    });
}

/// Snapshots every SKU's level every 200 ms and restocks a SKU that runs low.
async fn stocker(
    config: &WorkloadConfig,
    endpoints: &Endpoints,
    recorder: &Recorder,
    stopped: watch::Receiver<bool>,
) {
    let caller = config.caller(endpoints, recorder);
    let mut restocks = 0;
    for tick in 0usize.. {
        if *stopped.borrow() {
            return;
        }
        let mut grpc = endpoints.client(tick);
        let mut request = tonic::Request::new(GetStockRequest {
            skus: config.skus.clone(),
        });
        request.set_timeout(config.call_timeout);
        let levels = match tokio::time::timeout(config.call_timeout, grpc.get_stock(request)).await
        {
            Ok(Ok(response)) => response.into_inner().levels,
            _ => Vec::new(),
        };
        let at_ms = recorder.now_ms();
        for level in levels {
            recorder.snapshot(Snapshot {
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

/// Follows `WatchEvents` live; on any break it resumes after the last event it saw, on the
/// next replica.
async fn watcher(endpoints: Endpoints, recorder: Recorder, mut stopped: watch::Receiver<bool>) {
    let mut after = 0;
    for replica in 0.. {
        if *stopped.borrow() {
            return;
        }
        let mut grpc = endpoints.client(replica);
        let follow = async {
            let mut stream = grpc
                .watch_events(WatchEventsRequest {
                    after_sequence: after,
                })
                .await?
                .into_inner();
            while let Some(event) = stream.message().await? {
                after = event.sequence;
                recorder.event(seen(event));
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

/// An event reduced to what the checker compares.
pub fn seen(event: Event) -> SeenEvent {
    let mut seen = SeenEvent {
        sequence: event.sequence,
        event_id: event.event_id,
        event_type: EventType::try_from(event.r#type)
            .map(|t| t.as_str_name().trim_start_matches("EVENT_TYPE_").to_owned())
            .unwrap_or_default(),
        reservation_id: None,
        sku: None,
        delta: None,
        lines: Vec::new(),
        levels: Vec::new(),
    };
    match event.subject {
        Some(event::Subject::ReservationId(id)) => seen.reservation_id = Some(id),
        Some(event::Subject::Sku(sku)) => seen.sku = Some(sku),
        None => {}
    }
    let levels = match event.payload {
        Some(event::Payload::StockAdjusted(adjusted)) => {
            seen.delta = Some(adjusted.delta);
            adjusted.level.into_iter().collect()
        }
        Some(event::Payload::ReservationChanged(changed)) => {
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
        None => Vec::new(),
    };
    seen.levels = levels
        .into_iter()
        .map(|l| (l.sku, l.on_hand, l.reserved, l.version))
        .collect();
    seen
}

/// Reads the whole stream from the start until `head`, from whichever replica answers.
pub async fn read_stream(endpoints: &Endpoints, head: i64) -> anyhow::Result<Vec<SeenEvent>> {
    let mut events: Vec<SeenEvent> = Vec::new();
    let started = Instant::now();
    let mut replica = 0;
    while events.last().map_or(0, |e| e.sequence) < head {
        if started.elapsed() > Duration::from_secs(60) {
            anyhow::bail!(
                "the event stream stopped at {} of {head}",
                events.last().map_or(0, |e| e.sequence)
            );
        }
        let mut grpc = endpoints.client(replica);
        replica += 1;
        let after = events.last().map_or(0, |e| e.sequence);
        let Ok(response) = grpc
            .watch_events(WatchEventsRequest {
                after_sequence: after,
            })
            .await
        else {
            continue;
        };
        let mut stream = response.into_inner();
        while let Ok(Ok(Some(event))) =
            tokio::time::timeout(Duration::from_secs(5), stream.message()).await
        {
            let done = event.sequence >= head;
            events.push(seen(event));
            if done {
                return Ok(events);
            }
        }
    }
    Ok(events)
}
