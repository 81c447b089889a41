//! The load: workers that call the service over gRPC and record every call.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;
use futures::future::join_all;
use hdrhistogram::Histogram;
use inventory_proto::{
    AdjustStockRequest, ConfirmReservationRequest, ReleaseReservationRequest, ReservationLine,
    ReserveRequest, UpsertLocationRequest, inventory_service_client::InventoryServiceClient,
};
use inventory_testkit::outcome;
use rand::{Rng as _, SeedableRng as _, rngs::SmallRng};
use rand_distr::{Distribution as _, Zipf};
use tonic::{Code, transport::Channel};

/// Which SKUs the shoppers go for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Every call picks one of `skus` SKUs uniformly.
    Uniform,
    /// Every call goes for the same SKU: a flash sale.
    Hot,
    /// Calls pick SKUs by a Zipf law: a few very hot, a long cold tail.
    Zipf,
    /// `shoppers` calls race for `stock` units of one SKU; then a share is confirmed and a
    /// share released.
    Race,
}

#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// `http://host:port` of the service; several, comma-separated, for replicas (the
    /// connections go to each in turn).
    pub addr: String,
    pub scenario: Scenario,
    /// Calls in flight at once.
    pub clients: usize,
    /// HTTP/2 connections the calls are spread over.
    pub connections: usize,
    /// How long `uniform`, `hot` and `zipf` run.
    pub duration: Duration,
    pub quantity: i64,
    pub ttl: Duration,
    /// SKUs of `uniform` and `zipf`.
    pub skus: usize,
    /// Units each SKU starts with.
    pub stock: i64,
    pub zipf_exponent: f64,
    /// Calls of `race`.
    pub shoppers: usize,
    /// Shares of `race`'s holds that are confirmed, then released (the rest stay held).
    pub confirm_share: f64,
    pub release_share: f64,
    /// Names the run's SKUs, keys and orders, so runs against one database never mix.
    pub run_id: String,
    /// Bearer token, when the service requires one.
    pub token: Option<String>,
    pub seed: u64,
    /// Locations the stock is spread over (`bench-1`, `bench-2`, ...); with more than one,
    /// every Reserve may be split across them. 1: everything at `default`, as before locations.
    pub locations: usize,
}

impl LoadConfig {
    /// The locations a SKU's stock is spread over.
    pub fn location_ids(&self) -> Vec<String> {
        match self.locations {
            0 | 1 => vec![String::new()],
            n => (1..=n).map(|i| format!("bench-{i}")).collect(),
        }
    }
}

/// One finished call.
#[derive(Clone, Debug)]
pub struct Call {
    /// Since the load started.
    pub at: Duration,
    pub latency: Duration,
    pub code: Code,
}

/// A `Reserve` whose answer was success: what the audit expects to find.
#[derive(Clone, Debug)]
pub struct Held {
    pub reservation_id: String,
    pub idempotency_key: String,
    pub sku: String,
    pub quantity: i64,
    /// What the run did with it afterwards.
    pub fate: Fate,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Held,
    Confirmed,
    Released,
}

/// Everything one load run observed.
#[derive(Debug, Default)]
pub struct Observed {
    pub calls: Vec<Call>,
    pub held: Vec<Held>,
    /// Keys of calls whose outcome is unknown (deadline, unavailable, internal): each may or
    /// may not have reserved.
    pub indeterminate: Vec<String>,
    pub elapsed: Duration,
    pub skus: Vec<String>,
}

impl Observed {
    pub fn latency_histogram(&self) -> Histogram<u64> {
        let mut histogram = Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).expect("bounds");
        for call in &self.calls {
            histogram.saturating_record(call.latency.as_micros() as u64);
        }
        histogram
    }

    pub fn status_counts(&self) -> BTreeMap<String, u64> {
        let mut counts = BTreeMap::new();
        for call in &self.calls {
            *counts.entry(code_name(call.code)).or_insert(0) += 1;
        }
        counts
    }
}

pub fn code_name(code: Code) -> String {
    format!("{code:?}")
}

/// What a worker needs to know to shop.
struct Shop {
    config: LoadConfig,
    skus: Vec<String>,
    zipf: Option<Zipf<f64>>,
    clients: Vec<InventoryServiceClient<Channel>>,
    started: Instant,
    /// `race`: calls handed out so far.
    next_shopper: AtomicUsize,
}

pub async fn connect(config: &LoadConfig) -> anyhow::Result<Vec<InventoryServiceClient<Channel>>> {
    let mut clients = Vec::new();
    let addrs: Vec<&str> = config.addr.split(',').map(str::trim).collect();
    for i in 0..config.connections.max(1) {
        let addr = addrs[i % addrs.len()];
        let channel = Channel::from_shared(addr.to_owned())
            .context("invalid address")?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .with_context(|| format!("cannot connect to {addr}"))?;
        clients.push(InventoryServiceClient::new(channel));
    }
    Ok(clients)
}

fn request<T>(token: &Option<String>, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(Duration::from_secs(10));
    if let Some(token) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("a valid header"),
        );
    }
    request
}

pub fn sku_names(config: &LoadConfig) -> Vec<String> {
    let count = match config.scenario {
        Scenario::Hot | Scenario::Race => 1,
        Scenario::Uniform | Scenario::Zipf => config.skus.max(1),
    };
    (0..count)
        .map(|i| format!("B-{}-{i}", config.run_id))
        .collect()
}

/// Gives every SKU of the run its starting stock, `parallel` calls at a time.
pub async fn seed(
    clients: &[InventoryServiceClient<Channel>],
    config: &LoadConfig,
    skus: &[String],
) -> anyhow::Result<()> {
    let locations = config.location_ids();
    if config.locations > 1 {
        let mut client = clients[0].clone();
        for (priority, location) in locations.iter().enumerate() {
            client
                .upsert_location(request(
                    &config.token,
                    UpsertLocationRequest {
                        location_id: location.clone(),
                        priority: priority as i32,
                        active: true,
                    },
                ))
                .await
                .with_context(|| format!("cannot create location {location}"))?;
        }
    }
    // Spread evenly; the first location takes the remainder.
    let share = config.stock / locations.len() as i64;
    let first_share = config.stock - share * (locations.len() as i64 - 1);
    let next = AtomicUsize::new(0);
    let locations = &locations;
    let workers = (0..32.min(skus.len())).map(|w| {
        let mut client = clients[w % clients.len()].clone();
        let next = &next;
        async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(sku) = skus.get(i) else {
                    return Ok::<_, anyhow::Error>(());
                };
                for (index, location) in locations.iter().enumerate() {
                    let delta = if index == 0 { first_share } else { share };
                    if delta == 0 {
                        continue;
                    }
                    client
                        .adjust_stock(request(
                            &config.token,
                            AdjustStockRequest {
                                sku: sku.clone(),
                                delta,
                                idempotency_key: format!("{}-seed-{sku}-{location}", config.run_id),
                                reason: "benchmark stock".into(),
                                location_id: location.clone(),
                                ..Default::default()
                            },
                        ))
                        .await
                        .with_context(|| format!("cannot stock {sku} at {location:?}"))?;
                }
            }
        }
    });
    for result in join_all(workers).await {
        result?;
    }
    Ok(())
}

/// Seeds the run's SKUs, runs the load, then (for `race`) confirms and releases shares.
pub async fn run(config: LoadConfig) -> anyhow::Result<Observed> {
    drive(prepare(config).await?).await
}

/// A run with its SKUs stocked, ready to [`drive`].
#[derive(Debug)]
pub struct Prepared {
    config: LoadConfig,
    clients: Vec<InventoryServiceClient<Channel>>,
    skus: Vec<String>,
}

pub async fn prepare(config: LoadConfig) -> anyhow::Result<Prepared> {
    let clients = connect(&config).await?;
    let skus = sku_names(&config);
    seed(&clients, &config, &skus).await?;
    Ok(Prepared {
        config,
        clients,
        skus,
    })
}

/// The load itself, then (for `race`) the confirms and releases.
pub async fn drive(prepared: Prepared) -> anyhow::Result<Observed> {
    let Prepared {
        config,
        clients,
        skus,
    } = prepared;
    let zipf = match config.scenario {
        Scenario::Zipf => Some(Zipf::new(skus.len() as f64, config.zipf_exponent)?),
        _ => None,
    };
    let shop = Arc::new(Shop {
        config: config.clone(),
        skus: skus.clone(),
        zipf,
        clients,
        started: Instant::now(),
        next_shopper: AtomicUsize::new(0),
    });
    let workers = (0..config.clients.max(1)).map(|worker| {
        let shop = shop.clone();
        tokio::spawn(async move { shop.work(worker).await })
    });
    let mut observed = Observed {
        skus,
        ..Observed::default()
    };
    for result in join_all(workers).await {
        let (calls, held, indeterminate) = result?;
        observed.calls.extend(calls);
        observed.held.extend(held);
        observed.indeterminate.extend(indeterminate);
    }
    observed.elapsed = shop.started.elapsed();
    observed.calls.sort_by_key(|c| c.at);
    if config.scenario == Scenario::Race {
        settle(&shop, &mut observed.held).await?;
    }
    Ok(observed)
}

type WorkerLog = (Vec<Call>, Vec<Held>, Vec<String>);

impl Shop {
    async fn work(&self, worker: usize) -> WorkerLog {
        let config = &self.config;
        let mut client = self.clients[worker % self.clients.len()].clone();
        let mut rng = SmallRng::seed_from_u64(config.seed ^ (worker as u64).wrapping_mul(0x9e37));
        let until = self.started + config.duration;
        let (mut calls, mut held, mut indeterminate) = (Vec::new(), Vec::new(), Vec::new());
        for n in 0.. {
            if config.scenario == Scenario::Race {
                if self.next_shopper.fetch_add(1, Ordering::Relaxed) >= config.shoppers {
                    break;
                }
            } else if Instant::now() >= until {
                break;
            }
            let sku = match config.scenario {
                Scenario::Hot | Scenario::Race => &self.skus[0],
                Scenario::Uniform => &self.skus[rng.random_range(0..self.skus.len())],
                Scenario::Zipf => {
                    let rank = self.zipf.as_ref().expect("zipf").sample(&mut rng) as usize;
                    &self.skus[rank.clamp(1, self.skus.len()) - 1]
                }
            };
            let key = format!("{}-{worker}-{n}", config.run_id);
            let message = ReserveRequest {
                idempotency_key: key.clone(),
                order_id: format!("{}-order-{worker}-{n}", config.run_id),
                lines: vec![ReservationLine {
                    sku: sku.clone(),
                    quantity: config.quantity,
                    ..Default::default()
                }],
                ttl: Some(prost_types::Duration {
                    seconds: config.ttl.as_secs() as i64,
                    nanos: 0,
                }),
                allow_split: config.locations > 1,
                ..Default::default()
            };
            let sent = Instant::now();
            let result = client.reserve(request(&config.token, message)).await;
            let latency = sent.elapsed();
            let code = match &result {
                Ok(_) => Code::Ok,
                Err(status) => status.code(),
            };
            calls.push(Call {
                at: sent.duration_since(self.started),
                latency,
                code,
            });
            match result {
                Ok(response) => held.push(Held {
                    reservation_id: response.into_inner().reservation_id,
                    idempotency_key: key,
                    sku: sku.clone(),
                    quantity: config.quantity,
                    fate: Fate::Held,
                }),
                Err(status) if outcome::is_unknown(status.code()) => indeterminate.push(key),
                Err(_) => {}
            }
        }
        (calls, held, indeterminate)
    }
}

/// `race`: confirms the first share of the holds and releases the next.
async fn settle(shop: &Shop, held: &mut [Held]) -> anyhow::Result<()> {
    let config = &shop.config;
    let confirm = (held.len() as f64 * config.confirm_share).round() as usize;
    let release = ((held.len() as f64 * config.release_share).round() as usize)
        .min(held.len() - confirm.min(held.len()));
    let mut client = shop.clients[0].clone();
    for (i, hold) in held.iter_mut().enumerate() {
        let id = hold.reservation_id.clone();
        if i < confirm {
            client
                .confirm_reservation(request(
                    &config.token,
                    ConfirmReservationRequest {
                        reservation_id: id,
                        ..Default::default()
                    },
                ))
                .await
                .context("confirm")?;
            hold.fate = Fate::Confirmed;
        } else if i < confirm + release {
            client
                .release_reservation(request(
                    &config.token,
                    ReleaseReservationRequest {
                        reservation_id: id,
                        ..Default::default()
                    },
                ))
                .await
                .context("release")?;
            hold.fate = Fate::Released;
        }
    }
    Ok(())
}
