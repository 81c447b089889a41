//! The failure lab (`make lab`): the incident this service exists for, replayed step by step
//! against real PostgreSQL and Redis, once the naive way and three times the service's way.
//!
//! 1. **Naive**: a lease without a fencing token, then check-then-decrement. Worker A takes the
//!    lease, pauses past its TTL (a GC, a stalled VM), B takes the lease and sells the last
//!    unit, A resumes and sells it again.
//! 2. **Conditional update**: the same, but the decrement is one statement that only succeeds
//!    while stock remains: A's sale is refused.
//! 3. **Fencing**: two units, so A's stale sale would pass any stock check. The service's
//!    fencing token is what refuses it: B's write stored a newer token.
//! 4. **Redis forgets**: Redis restarts empty between A and B, so its counter starts over below
//!    the token PostgreSQL stored; PostgreSQL refuses B's first token and the service raises
//!    the counter to the stored fence, then B's sale goes through, once.
//!
//! Each scenario is printed as a timeline (who holds the lease, the token, the stock, the
//! sales) and drawn in `target/lab/index.html`. The naive worker is this file's own SQL on a
//! table of its own; it is never part of the server. Scenarios 3 and 4 run two replicas of the
//! real service in this process, with the pause points the tests use to stop one mid-call.
//!
//! Needs `DATABASE_URL` (a role that may create databases) and `REDIS_URL`, as `make test`
//! has them; `make lab` starts both.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use clap::Parser as _;
use fred::interfaces::{ClientLike as _, KeysInterface as _};
use inventory_core::pause::PausePoint;
use inventory_server::{
    config::{Cli, Command, Settings},
    proto::{
        AdjustStockRequest, ConfirmReservationRequest, ReservationLine, ReserveRequest,
        inventory_service_client::InventoryServiceClient,
    },
    startup::Application,
};
use inventory_testkit::{postgres::TemplateDatabases, redis::RedisNode};

/// How long a lease lives in the lab: short, so a pause outlives it quickly.
const LEASE_TTL: Duration = Duration::from_millis(300);
/// How long worker A stalls: longer than the lease.
const PAUSE: Duration = Duration::from_millis(450);
/// Scenario 4's lease: nothing pauses there, so long enough that no holder loses it on a
/// slow machine.
const STEADY_LEASE_TTL: Duration = Duration::from_secs(10);
/// Grants Redis's counter had made before scenario 4 (earlier sales of the SKU).
const EARLIER_GRANTS: i64 = 100;
/// The longest the lab waits for a call to reach a pause point.
const REACH: Duration = Duration::from_secs(10);

/// One line of a timeline.
#[derive(Clone, Debug)]
pub struct Step {
    pub at: Duration,
    pub actor: &'static str,
    pub what: String,
    /// Who holds the SKU's lease right after the step, as Redis says.
    pub lease: String,
    /// The token the actor holds, if any.
    pub token: Option<i64>,
    /// Units left to sell after the step (`on_hand - reserved` for the service).
    pub stock: i64,
    /// Sales the workers were told succeeded, so far.
    pub sold: u32,
}

/// What one scenario came to.
#[derive(Debug)]
pub struct Outcome {
    pub number: u8,
    pub title: &'static str,
    pub steps: Vec<Step>,
    /// Units there were to sell.
    pub units: i64,
    /// Sales the workers were told succeeded.
    pub sold: u32,
    pub lesson: String,
    /// What the scenario observed, by name, for [`check`].
    pub facts: Vec<(&'static str, i64)>,
}

impl Outcome {
    pub fn oversold(&self) -> bool {
        i64::from(self.sold) > self.units
    }

    pub fn fact(&self, name: &str) -> Option<i64> {
        self.facts.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
}

/// Whether the lab showed what it exists to show: the naive worker sells the last unit
/// twice, the conditional UPDATE refuses the stale sale, the token refuses it with stock to
/// spare, and a counter Redis forgot heals from the stored token. `make lab` fails otherwise.
pub fn check(outcomes: &[Outcome]) -> anyhow::Result<()> {
    let [naive, conditional, fenced, forgets] = outcomes else {
        anyhow::bail!("expected four scenarios, got {}", outcomes.len());
    };
    anyhow::ensure!(
        (naive.units, naive.sold) == (1, 2),
        "scenario 1: the naive worker should sell its 1 poster twice, sold {}",
        naive.sold
    );
    anyhow::ensure!(
        (conditional.units, conditional.sold) == (1, 1),
        "scenario 2: the conditional UPDATE should let exactly 1 sale through, sold {}",
        conditional.sold
    );
    anyhow::ensure!(
        fenced.sold == 1 && fenced.fact("a_lease_lost") == Some(1),
        "scenario 3: A should be refused with LEASE_LOST and B sell once (sold {})",
        fenced.sold
    );
    anyhow::ensure!(
        fenced.fact("available_when_a_resumed").unwrap_or(0) >= 1,
        "scenario 3: A should resume with stock to spare"
    );
    let (a, first, b) = (
        forgets.fact("token_a").unwrap_or(0),
        forgets.fact("first_grant_b").unwrap_or(i64::MAX),
        forgets.fact("token_b").unwrap_or(0),
    );
    anyhow::ensure!(
        forgets.sold == 2 && forgets.fact("counter_after_restart") == Some(0),
        "scenario 4: both should sell once after Redis lost its counter (sold {})",
        forgets.sold
    );
    anyhow::ensure!(
        first < a && b == a + 1,
        "scenario 4: B's first grant ({first}) should reuse a token below A's ({a}), and B write with the healed one ({b} = {a} + 1)"
    );
    Ok(())
}

struct Recorder {
    started: Instant,
    steps: Vec<Step>,
    sold: u32,
}

impl Recorder {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            steps: Vec::new(),
            sold: 0,
        }
    }

    fn step(
        &mut self,
        actor: &'static str,
        what: impl Into<String>,
        lease: &str,
        token: Option<i64>,
        stock: i64,
    ) {
        self.steps.push(Step {
            at: self.started.elapsed(),
            actor,
            what: what.into(),
            lease: lease.to_owned(),
            token,
            stock,
            sold: self.sold,
        });
    }
}

/// The lab's connections: an admin role for fresh databases, and a Redis.
#[derive(Debug)]
pub struct Lab {
    databases: TemplateDatabases,
    redis_url: String,
    run: String,
}

impl Lab {
    pub fn new(database_url: &str, redis_url: &str) -> anyhow::Result<Self> {
        Ok(Self {
            databases: TemplateDatabases::new(database_url.parse()?),
            redis_url: redis_url.to_owned(),
            run: format!("lab{}", std::process::id()),
        })
    }

    /// All four scenarios, in order; their databases are dropped afterwards.
    pub async fn run(&self) -> anyhow::Result<Vec<Outcome>> {
        let outcomes = async {
            Ok::<_, anyhow::Error>(vec![
                self.naive(false).await?,
                self.naive(true).await?,
                self.fenced().await?,
                self.redis_forgets().await?,
            ])
        }
        .await;
        let mut dropped = Ok(());
        for name in ["naive", "conditional", "fenced", "forgets"] {
            let result = self
                .databases
                .drop_database(&format!("{}_{name}", self.run))
                .await;
            dropped = dropped.and(result);
        }
        let outcomes = outcomes?;
        dropped?;
        Ok(outcomes)
    }

    async fn database(
        &self,
        name: &str,
    ) -> anyhow::Result<(
        tokio_postgres::Client,
        inventory_testkit::postgres::PgConfig,
    )> {
        let name = format!("{}_{name}", self.run);
        let config = self.databases.create(&name).await?;
        let client = inventory_testkit::postgres::connect(&config).await?;
        Ok((client, config))
    }

    /// Scenarios 1 and 2: a lease without a token, and the lab's own SQL.
    async fn naive(&self, conditional: bool) -> anyhow::Result<Outcome> {
        let (db, _) = self
            .database(if conditional { "conditional" } else { "naive" })
            .await?;
        db.batch_execute(
            "CREATE TABLE lab_stock (sku text PRIMARY KEY, quantity int NOT NULL);
             INSERT INTO lab_stock VALUES ('POSTER', 1);",
        )
        .await?;
        let redis = fred::types::Builder::from_config(fred::types::config::Config::from_url(
            &self.redis_url,
        )?)
        .build()?;
        redis.init().await?;
        let lease = format!("{}:naive:{conditional}:lease", self.run);
        // Who holds the lease, as Redis says: the worker whose name the key carries.
        let holder = || async {
            let value: Option<String> = redis.get(&lease).await.ok().flatten();
            value.map_or_else(|| "nobody".into(), |v| v.replace("worker-", ""))
        };
        let quantity = || async {
            db.query_one("SELECT quantity FROM lab_stock WHERE sku = 'POSTER'", &[])
                .await
                .map(|row| i64::from(row.get::<_, i32>(0)))
        };
        // The decrement: blind after a check (naive), or guarded in one statement.
        let sell = || async {
            let sql = if conditional {
                "UPDATE lab_stock SET quantity = quantity - 1 WHERE sku = 'POSTER' AND quantity >= 1"
            } else {
                "UPDATE lab_stock SET quantity = quantity - 1 WHERE sku = 'POSTER'"
            };
            db.execute(sql, &[]).await.map(|rows| rows == 1)
        };
        let take = |who: &'static str| {
            let redis = redis.clone();
            let lease = lease.clone();
            async move {
                let granted: Option<String> = redis
                    .set(
                        &lease,
                        format!("worker-{who}"),
                        Some(fred::types::Expiration::PX(LEASE_TTL.as_millis() as i64)),
                        Some(fred::types::SetOptions::NX),
                        false,
                    )
                    .await?;
                anyhow::Ok(granted.is_some())
            }
        };

        let mut r = Recorder::new();
        r.step(
            "-",
            "1 poster in stock",
            &holder().await,
            None,
            quantity().await?,
        );
        anyhow::ensure!(take("A").await?, "A could not take a free lease");
        r.step(
            "A",
            "takes the lease (no token)",
            &holder().await,
            None,
            quantity().await?,
        );
        let seen = quantity().await?;
        r.step(
            "A",
            format!("checks the stock: {seen} left"),
            &holder().await,
            None,
            seen,
        );
        r.step(
            "A",
            format!("pauses for {} ms (a GC, a stalled VM)", PAUSE.as_millis()),
            &holder().await,
            None,
            seen,
        );
        tokio::time::sleep(PAUSE).await;
        r.step(
            "-",
            format!("A's lease expired after {} ms", LEASE_TTL.as_millis()),
            &holder().await,
            None,
            quantity().await?,
        );
        anyhow::ensure!(take("B").await?, "B could not take the expired lease");
        r.step(
            "B",
            "takes the lease",
            &holder().await,
            None,
            quantity().await?,
        );
        let seen = quantity().await?;
        r.step(
            "B",
            format!("checks the stock: {seen} left"),
            &holder().await,
            None,
            seen,
        );
        if seen >= 1 && sell().await? {
            r.sold += 1;
            r.step(
                "B",
                "sells the poster: the buyer is told yes",
                &holder().await,
                None,
                quantity().await?,
            );
        }
        // A wakes up believing what it saw before its pause, and writes.
        if sell().await? {
            r.sold += 1;
            r.step(
                "A",
                "resumes and sells the poster it checked: its buyer is told yes too",
                &holder().await,
                None,
                quantity().await?,
            );
        } else {
            r.step(
                "A",
                "resumes; its guarded UPDATE matches no row: its buyer is told no",
                &holder().await,
                None,
                quantity().await?,
            );
        }
        let left = quantity().await?;
        let _ = redis.del::<i64, _>(&lease).await;
        let _ = redis.quit().await;
        let outcome = Outcome {
            number: if conditional { 2 } else { 1 },
            title: if conditional {
                "A lease without fencing, and a conditional UPDATE"
            } else {
                "A lease without fencing, then check-then-decrement"
            },
            units: 1,
            sold: r.sold,
            lesson: if conditional {
                format!(
                    "Sold {} of 1: the UPDATE itself checks the stock, so the stale worker's sale is refused (quantity {left}).",
                    r.sold
                )
            } else {
                format!(
                    "Sold {} of 1 (quantity {left}): the lease expired while A paused, and nothing stopped A's write.",
                    r.sold
                )
            },
            facts: Vec::new(),
            steps: r.steps,
        };
        Ok(outcome)
    }

    /// Scenario 3: the service, two replicas, two units; A paused past its lease.
    async fn fenced(&self) -> anyhow::Result<Outcome> {
        let (db, database) = self.database("fenced").await?;
        let prefix = format!("{}:fenced", self.run);
        let a = Replica::start(&database, &self.redis_url, &prefix, LEASE_TTL).await?;
        let b = Replica::start(&database, &self.redis_url, &prefix, LEASE_TTL).await?;
        let redis = redis_client(&self.redis_url).await?;
        let keys = Keys::new(&prefix, "POSTER");
        let mut r = Recorder::new();
        a.stock("POSTER", 2).await?;
        r.step(
            "-",
            "2 posters in stock",
            &keys.holder(&redis, "nobody").await,
            None,
            available(&db).await?,
        );

        let mut held = a.pauses.arm(PausePoint::LeaseGranted);
        let call = tokio::spawn(a.reserve("a-1", "order-a", "POSTER"));
        tokio::time::timeout(REACH, held.reached())
            .await
            .map_err(|_| anyhow::anyhow!("A's Reserve never reached its lease"))?;
        let token_a = keys.counter(&redis).await;
        r.step(
            "A",
            "takes the lease: token from Redis's counter",
            &keys.holder(&redis, "A").await,
            token_a,
            available(&db).await?,
        );
        r.step(
            "A",
            format!("pauses for {} ms before writing", PAUSE.as_millis()),
            &keys.holder(&redis, "A").await,
            token_a,
            available(&db).await?,
        );
        tokio::time::sleep(PAUSE).await;
        r.step(
            "-",
            format!("A's lease expired after {} ms", LEASE_TTL.as_millis()),
            &keys.holder(&redis, "nobody").await,
            None,
            available(&db).await?,
        );

        let sold_b = b.reserve("b-1", "order-b", "POSTER").await;
        let token_b = stored_fence(&db).await?;
        match &sold_b {
            Ok(reservation) => {
                b.confirm(&reservation.reservation_id).await?;
                r.sold += 1;
                r.step(
                    "B",
                    "takes the lease, holds one poster with a newer token and confirms it",
                    &keys.holder(&redis, "B").await,
                    Some(token_b),
                    available(&db).await?,
                );
            }
            Err(status) => r.step(
                "B",
                format!("is refused: {}", status.message()),
                &keys.holder(&redis, "B").await,
                None,
                available(&db).await?,
            ),
        }
        let left = available(&db).await?;
        r.step(
            "A",
            format!("resumes: {left} poster(s) still available, so a stock check alone would let it sell"),
            &keys.holder(&redis, "A").await,
            token_a,
            left,
        );
        held.resume();
        let answer = call.await?;
        let mut lease_lost = 0;
        match answer {
            Ok(reservation) => {
                a.confirm(&reservation.reservation_id).await?;
                r.sold += 1;
                r.step(
                    "A",
                    "sells: its stale write went through",
                    &keys.holder(&redis, "A").await,
                    token_a,
                    available(&db).await?,
                );
            }
            Err(status) if reason(&status) == "LEASE_LOST" => {
                lease_lost = 1;
                r.step(
                    "A",
                    format!(
                        "is refused (ABORTED, LEASE_LOST): PostgreSQL stored token {token_b}, A's is older; nothing written"
                    ),
                    &keys.holder(&redis, "A").await,
                    token_a,
                    available(&db).await?,
                );
            }
            Err(status) => r.step(
                "A",
                format!(
                    "is refused for another reason ({:?}, {}): {}",
                    status.code(),
                    reason(&status),
                    status.message()
                ),
                &keys.holder(&redis, "A").await,
                token_a,
                available(&db).await?,
            ),
        }
        let _ = redis.quit().await;
        let lesson = if lease_lost == 1 && r.sold == 1 {
            "Sold 1 of 2, and only by the current holder: each write carries the lease's token, and PostgreSQL takes only one newer than the stored one.".to_owned()
        } else {
            format!(
                "Sold {} of 2; A was not refused by its token, so this run did not show fencing.",
                r.sold
            )
        };
        let outcome = Outcome {
            number: 3,
            title: "The service: a stale holder with stock to spare, refused by its token",
            units: 2,
            sold: r.sold,
            lesson,
            facts: vec![
                ("a_lease_lost", lease_lost),
                ("available_when_a_resumed", left),
            ],
            steps: r.steps,
        };
        a.stop().await;
        b.stop().await;
        Ok(outcome)
    }

    /// Scenario 4: the service on a Redis of its own, which restarts empty between A and B.
    async fn redis_forgets(&self) -> anyhow::Result<Outcome> {
        let (db, database) = self.database("forgets").await?;
        let mut node = RedisNode::start_scratch().await?;
        let prefix = format!("{}:forgets", self.run);
        let a = Replica::start(&database, &node.url(), &prefix, STEADY_LEASE_TTL).await?;
        let b = Replica::start(&database, &node.url(), &prefix, STEADY_LEASE_TTL).await?;
        let keys = Keys::new(&prefix, "POSTER");
        let mut r = Recorder::new();
        a.stock("POSTER", 2).await?;
        a.stock("PROBE", 1_000).await?;
        let redis = redis_client(&node.url()).await?;
        // Earlier sales moved the counter on: where it would stand after 100 grants.
        redis
            .set::<(), _, _>(&keys.counter, EARLIER_GRANTS, None, None, false)
            .await?;
        r.step(
            "-",
            format!(
                "2 posters in stock; Redis's counter stands at {EARLIER_GRANTS} from earlier sales"
            ),
            "nobody",
            keys.counter(&redis).await,
            available(&db).await?,
        );

        let held = a.reserve("a-1", "order-a", "POSTER").await?;
        a.confirm(&held.reservation_id).await?;
        r.sold += 1;
        let token_a = stored_fence(&db).await?;
        r.step(
            "A",
            "holds and confirms one poster; PostgreSQL stores its token",
            "nobody",
            Some(token_a),
            available(&db).await?,
        );
        let _ = redis.quit().await;

        node.kill().await?;
        node.restart().await?;
        let redis = redis_client(&node.url()).await?;
        let after_restart = keys.counter(&redis).await;
        r.step(
            "-",
            "Redis restarts empty: its token counter is gone",
            "nobody",
            after_restart,
            available(&db).await?,
        );

        // B's replica reconnects by itself: a Reserve of another SKU tells when it has.
        inventory_testkit::process::eventually_ok(
            "B reaches the restarted Redis",
            Duration::from_secs(15),
            || b.reserve("probe", "probe", "PROBE"),
        )
        .await?;
        // B is held at its first grant for the poster, to read the token Redis gave it.
        let mut held_b = b.pauses.arm(PausePoint::LeaseGranted);
        let call = tokio::spawn(b.reserve("b-1", "order-b", "POSTER"));
        tokio::time::timeout(REACH, held_b.reached())
            .await
            .map_err(|_| anyhow::anyhow!("B's Reserve never reached its lease"))?;
        let first_grant = keys.counter(&redis).await;
        r.step(
            "B",
            format!(
                "takes the lease: the emptied counter starts over at {}, below the {token_a} PostgreSQL stored",
                first_grant.map_or_else(|| "nothing".into(), |t| t.to_string())
            ),
            "B",
            first_grant,
            available(&db).await?,
        );
        held_b.resume();
        let mut token_b = 0;
        let healed = match call.await? {
            Ok(reservation) => {
                b.confirm(&reservation.reservation_id).await?;
                r.sold += 1;
                token_b = stored_fence(&db).await?;
                let healed = first_grant.unwrap_or(i64::MAX) < token_a && token_b == token_a + 1;
                r.step(
                    "B",
                    if healed {
                        "PostgreSQL refused the reused token; the service raised the counter to the stored token, took the next one and wrote once".to_owned()
                    } else {
                        "writes".to_owned()
                    },
                    "nobody",
                    Some(token_b),
                    available(&db).await?,
                );
                healed
            }
            Err(status) => {
                r.step(
                    "B",
                    format!("is refused ({:?}, {})", status.code(), reason(&status)),
                    "nobody",
                    None,
                    available(&db).await?,
                );
                false
            }
        };
        r.step(
            "-",
            "Redis's counter now",
            "nobody",
            keys.counter(&redis).await,
            available(&db).await?,
        );
        let _ = redis.quit().await;
        let lesson = if healed && r.sold == 2 {
            "Sold 2 of 2, each once: correctness never rested on Redis's counter; the stored token is the floor it healed from.".to_owned()
        } else {
            format!(
                "Sold {} of 2; this run did not show the counter healing.",
                r.sold
            )
        };
        let outcome = Outcome {
            number: 4,
            title: "The service: Redis forgets its counter between two holders",
            units: 2,
            sold: r.sold,
            lesson,
            facts: vec![
                ("token_a", token_a),
                ("counter_after_restart", after_restart.unwrap_or(0)),
                ("first_grant_b", first_grant.unwrap_or(i64::MAX)),
                ("token_b", token_b),
            ],
            steps: r.steps,
        };
        a.stop().await;
        b.stop().await;
        Ok(outcome)
    }
}

/// The lease and counter keys of a SKU, as the service names them.
struct Keys {
    lease: String,
    counter: String,
}

impl Keys {
    fn new(prefix: &str, sku: &str) -> Self {
        Self {
            lease: format!("{prefix}:{{{sku}}}:lease"),
            counter: format!("{prefix}:{{{sku}}}:fence"),
        }
    }

    /// Redis's token counter for the SKU (`None` when it has none).
    async fn counter(&self, redis: &fred::clients::Client) -> Option<i64> {
        redis
            .get::<Option<i64>, _>(&self.counter)
            .await
            .ok()
            .flatten()
    }

    /// `taker` while Redis still has the SKU's lease, `nobody` once it expired or was released
    /// (holder ids are random: the lab knows who took it, Redis knows whether it lives).
    async fn holder(&self, redis: &fred::clients::Client, taker: &str) -> String {
        let held: bool = redis.exists(&self.lease).await.unwrap_or(0i64) > 0;
        if held {
            taker.to_owned()
        } else {
            "nobody".into()
        }
    }
}

async fn redis_client(url: &str) -> anyhow::Result<fred::clients::Client> {
    let client =
        fred::types::Builder::from_config(fred::types::config::Config::from_url(url)?).build()?;
    client.init().await?;
    Ok(client)
}

async fn available(db: &tokio_postgres::Client) -> anyhow::Result<i64> {
    Ok(db
        .query_opt(
            "SELECT on_hand - reserved FROM stock WHERE sku = 'POSTER'",
            &[],
        )
        .await?
        .map_or(0, |row| row.get(0)))
}

async fn stored_fence(db: &tokio_postgres::Client) -> anyhow::Result<i64> {
    Ok(db
        .query_one("SELECT fence_token FROM stock WHERE sku = 'POSTER'", &[])
        .await?
        .get(0))
}

fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt as _;
    status
        .get_details_error_info()
        .map_or_else(|| format!("{:?}", status.code()), |info| info.reason)
}

/// One replica of the service, in this process, serving on a free port.
struct Replica {
    client: InventoryServiceClient<tonic::transport::Channel>,
    pauses: inventory_core::pause::PausePoints,
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Replica {
    async fn start(
        database: &inventory_testkit::postgres::PgConfig,
        redis_url: &str,
        prefix: &str,
        lease_ttl: Duration,
    ) -> anyhow::Result<Self> {
        let settings = settings(database, redis_url, prefix, lease_ttl)?;
        let application = Application::build(settings).await?;
        let addr = application.local_addr();
        let pauses = application.pause_points();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(application.run_until_stopped(async {
            let _ = stopped.await;
        }));
        let client = InventoryServiceClient::new(
            tonic::transport::Channel::from_shared(format!("http://{addr}"))?.connect_lazy(),
        );
        Ok(Self {
            client,
            pauses,
            stop,
            server,
        })
    }

    async fn stock(&self, sku: &str, units: i64) -> anyhow::Result<()> {
        self.client
            .clone()
            .adjust_stock(AdjustStockRequest {
                sku: sku.into(),
                delta: units,
                idempotency_key: format!("stock-{sku}"),
                reason: "lab".into(),
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    fn reserve(
        &self,
        key: &str,
        order: &str,
        sku: &str,
    ) -> impl Future<Output = Result<inventory_server::proto::Reservation, tonic::Status>> + use<>
    {
        let mut client = self.client.clone();
        let request = ReserveRequest {
            idempotency_key: key.into(),
            order_id: order.into(),
            lines: vec![ReservationLine {
                sku: sku.into(),
                quantity: 1,
                ..Default::default()
            }],
            ttl: None,
            ..Default::default()
        };
        async move {
            client
                .reserve(request)
                .await
                .map(tonic::Response::into_inner)
        }
    }

    async fn confirm(&self, reservation_id: &str) -> anyhow::Result<()> {
        self.client
            .clone()
            .confirm_reservation(ConfirmReservationRequest {
                reservation_id: reservation_id.into(),
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.server.await;
    }
}

/// A replica's settings: the lab's database and Redis, the given lease, plaintext gRPC on a
/// free port, no other listener, no credentials. Parsed as the server parses its flags, then
/// set where the environment must not reach (a `TLS_CERT_FILE` or `ADMIN_LISTEN_ADDR` of the
/// shell running the lab).
fn settings(
    database: &inventory_testkit::postgres::PgConfig,
    redis_url: &str,
    prefix: &str,
    lease_ttl: Duration,
) -> anyhow::Result<Settings> {
    let lease_ttl = format!("{}ms", lease_ttl.as_millis());
    let database_url = inventory_testkit::postgres::url(database);
    let cli = Cli::try_parse_from([
        "inventory-server",
        "serve",
        "--database-url",
        &database_url,
        "--redis-url",
        redis_url,
        "--redis-key-prefix",
        prefix,
        "--listen-addr",
        "127.0.0.1:0",
        "--auth-disabled",
        "--lease-ttl",
        &lease_ttl,
        "--lease-wait",
        "2s",
    ])?;
    let Command::Serve(args) = cli.command else {
        unreachable!("parsed as serve")
    };
    let mut settings = Settings::from_args(&args)?;
    settings.database.config = database.clone();
    settings.server.tls = None;
    settings.server.health_listen_addr = None;
    settings.server.admin_listen_addr = None;
    Ok(settings)
}

/// The timelines as text, for the terminal.
pub fn text(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    for o in outcomes {
        let _ = writeln!(out, "\nScenario {}: {}", o.number, o.title);
        let _ = writeln!(
            out,
            "  {:>6}  {:<5} {:<7} {:>5} {:>5} {:>4}  step",
            "ms", "who", "lease", "token", "stock", "sold"
        );
        for s in &o.steps {
            let _ = writeln!(
                out,
                "  {:>6}  {:<5} {:<7} {:>5} {:>5} {:>4}  {}",
                s.at.as_millis(),
                s.actor,
                s.lease,
                s.token.map_or_else(|| "-".into(), |t| t.to_string()),
                s.stock,
                s.sold,
                s.what
            );
        }
        let _ = writeln!(
            out,
            "  => {} {}",
            if o.oversold() {
                "OVERSOLD."
            } else {
                "No oversell."
            },
            o.lesson
        );
    }
    out
}

/// The timelines as one HTML page with an SVG per scenario: a lane per worker, a dot per
/// step, sales in green, a red band where more was sold than there was.
pub fn html(outcomes: &[Outcome]) -> String {
    use inventory_testkit::svg::escape;
    let mut page = String::from(
        "<!doctype html><meta charset=\"utf-8\"><title>Failure lab</title>\
         <style>body{font:14px system-ui,sans-serif;margin:2em;max-width:70em}\
         table{border-collapse:collapse;margin:.5em 0 2em}td,th{padding:2px 8px;text-align:left;border-bottom:1px solid #ddd}\
         .bad{color:#b00020;font-weight:bold}.good{color:#1b5e20;font-weight:bold}</style>\
         <h1>Failure lab: selling the last unit twice</h1>",
    );
    for o in outcomes {
        let end = o.steps.last().map_or(1, |s| s.at.as_millis().max(1)) as f64;
        let (width, left) = (900.0, 60.0);
        let x = |at: Duration| left + (at.as_millis() as f64 / end) * (width - left - 20.0);
        let lane = |actor: &str| match actor {
            "A" => 40.0,
            "B" => 80.0,
            _ => 120.0,
        };
        let mut svg = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"150\" style=\"background:#fff\">\
             <text x=\"10\" y=\"44\">A</text><text x=\"10\" y=\"84\">B</text><text x=\"10\" y=\"124\">world</text>"
        );
        for y in [40.0, 80.0, 120.0] {
            let _ = write!(
                svg,
                "<line x1=\"{left}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"#ccc\"/>",
                width - 20.0
            );
        }
        let mut sold = 0;
        for s in &o.steps {
            let color = if s.sold > sold { "#2e7d32" } else { "#1565c0" };
            if i64::from(s.sold) > o.units {
                let _ = write!(
                    svg,
                    "<rect x=\"{:.1}\" y=\"20\" width=\"12\" height=\"115\" fill=\"#ffcdd2\"/>",
                    x(s.at) - 6.0
                );
            }
            sold = s.sold;
            let _ = write!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{}\" r=\"6\" fill=\"{color}\"><title>{} ms: {}</title></circle>",
                x(s.at),
                lane(s.actor),
                s.at.as_millis(),
                escape(&s.what)
            );
        }
        svg.push_str("</svg>");
        let _ = write!(
            page,
            "<h2>{}. {}</h2>{svg}<table><tr><th>ms</th><th>who</th><th>lease</th><th>token</th><th>stock</th><th>sold</th><th>step</th></tr>",
            o.number,
            escape(o.title)
        );
        for s in &o.steps {
            let _ = write!(
                page,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                s.at.as_millis(),
                escape(s.actor),
                escape(&s.lease),
                s.token.map_or_else(|| "-".into(), |t| t.to_string()),
                s.stock,
                s.sold,
                escape(&s.what)
            );
        }
        let _ = write!(
            page,
            "</table><p class=\"{}\">{} {}</p>",
            if o.oversold() { "bad" } else { "good" },
            if o.oversold() {
                "Oversold."
            } else {
                "No oversell."
            },
            escape(&o.lesson)
        );
    }
    page
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let database_url = std::env::var("DATABASE_URL")
        .map_err(|_| anyhow::anyhow!("DATABASE_URL is not set (run it through `make lab`)"))?;
    let redis_url = std::env::var("REDIS_URL")
        .map_err(|_| anyhow::anyhow!("REDIS_URL is not set (run it through `make lab`)"))?;
    let outcomes = Lab::new(&database_url, &redis_url)?.run().await?;
    print!("{}", text(&outcomes));
    let out = PathBuf::from("target/lab");
    write_page(&out, &outcomes)?;
    println!("\nwrote {}", out.join("index.html").display());
    // The lab's point: the naive worker oversells, the service never does, for its reasons.
    check(&outcomes)
}

fn write_page(out: &Path, outcomes: &[Outcome]) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("index.html"), html(outcomes))?;
    Ok(())
}
