//! One run: a fresh database migrated for every tenant, Redis in one topology, three server
//! replicas serving the tenants, the load of every tenant, the seeded faults, then the resolve
//! phase, the checker (per tenant, then across tenants) and the report.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use inventory_testkit::{
    audit,
    postgres::{PgConfig, Postgres, TemplateDatabases, connect},
    postgres_ha::Formation,
    process::{eventually, eventually_ok},
    proxy::Proxy,
    redis::{self, Redis},
    server::ServerProcess,
};

use crate::{
    checker::{self, Facts, Heal, Outage, OutboxRow, ReceiptRow, StockRow, TenantRows},
    history::{History, Op, OpKind, Outcome, Phase, Recorder, SeenEvent},
    report::{self, Applied, RunReport},
    schedule::{self, Fault, Release},
    tenants::{self, Tenancy, TenantCallers},
    topology::Topology,
    workload::{self, Caller, Endpoints, WorkloadConfig},
};

/// The server replicas of every run.
pub const REPLICAS: usize = 3;
/// The replicas' lease TTL: short, so a pause outlasts it quickly.
pub const LEASE_TTL: Duration = Duration::from_secs(1);
/// What the replicas sign forwarded calls with.
const PEER_SECRET: &str = "the fault suite's peer secret, 32+ bytes";
/// A client's deadline for one call.
const CALL_TIMEOUT: Duration = Duration::from_millis(1500);
/// How long a replica may drain when stopped at the end of a run.
const STOP_GRACE: Duration = Duration::from_secs(10);

#[derive(Clone, Debug)]
pub struct RunConfig {
    pub topology: Topology,
    pub seed: u64,
    /// How long the load (and the faults) run.
    pub duration: Duration,
    /// The `inventory-server` binary.
    pub server: PathBuf,
    /// The previous release's `inventory-server`, which a rolling upgrade starts from.
    pub previous: Option<PathBuf>,
    /// This run's folder: logs, Redis data, history, report.
    pub out: PathBuf,
    pub clients: usize,
    pub skus: usize,
    pub stock: i64,
    /// The tenants the replicas serve, each with the same SKU names and callers of its own
    /// (`tenants::TENANTS` by default). A rolling upgrade serves tenant `default` alone,
    /// whatever this says: the release it starts from may predate tenants.
    pub tenants: Vec<String>,
}

impl RunConfig {
    /// The tenants this run serves.
    pub fn tenancy(&self) -> anyhow::Result<Tenancy> {
        if self.topology.rolls() {
            return Ok(Tenancy::unauthenticated());
        }
        anyhow::ensure!(!self.tenants.is_empty(), "a run serves one tenant at least");
        Ok(Tenancy::with_tokens(&self.tenants))
    }

    /// The command that runs this schedule, and these shoppers' choices, again.
    pub fn replay(&self) -> String {
        format!(
            "target/release/inventory-chaos --topologies {} --seed {} --duration {}s \
             --clients {} --skus {} --stock {}{}{}",
            self.topology.name(),
            self.seed,
            self.duration.as_secs(),
            self.clients,
            self.skus,
            self.stock,
            if self.tenants == tenants::TENANTS {
                String::new()
            } else {
                format!(" --tenants {}", self.tenants.join(","))
            },
            self.previous
                .as_ref()
                .map(|p| format!(" --previous-server {}", p.display()))
                .unwrap_or_default()
        )
    }
}

/// The PostgreSQL of a run: the suite's one instance behind a fault proxy, or a formation of
/// the run's own that fails over.
enum Database<'p> {
    Single {
        postgres: &'p Postgres,
        proxy: Proxy,
    },
    Formation(Box<Formation>),
}

impl Database<'_> {
    /// Settings of the `postgres` database, for `TemplateDatabases`.
    fn admin_config(&self) -> anyhow::Result<PgConfig> {
        match self {
            Database::Single { postgres, .. } => postgres.admin_config(),
            Database::Formation(formation) => formation.admin_config(),
        }
    }

    /// The `DATABASE_URL` of the replicas: through the fault proxies.
    fn service_url(&self, database: &str) -> String {
        match self {
            Database::Single { postgres, proxy } => postgres.url_via(proxy.addr(), database),
            Database::Formation(formation) => formation.url(database),
        }
    }

    /// A URL of `database` for the harness's own tools.
    fn url(&self, database: &str) -> String {
        match self {
            Database::Single { postgres, .. } => postgres.url(database),
            Database::Formation(formation) => formation.url(database),
        }
    }

    fn single(&self) -> anyhow::Result<(&Postgres, &Proxy)> {
        match self {
            Database::Single { postgres, proxy } => Ok((postgres, proxy)),
            Database::Formation(_) => bail!("a fault for one PostgreSQL instance, on a formation"),
        }
    }

    fn formation(&mut self) -> anyhow::Result<&mut Formation> {
        match self {
            Database::Formation(formation) => Ok(formation),
            Database::Single { .. } => bail!("a failover fault, on one PostgreSQL instance"),
        }
    }
}

/// What the faults act on.
struct Targets<'a, 'p> {
    database: &'a mut Database<'p>,
    redis: &'a mut Redis,
    replicas: &'a mut [ServerProcess],
    skus: &'a [String],
    key_prefix: &'a str,
    /// The tenants served: each has its own lease and fence keys of every SKU name.
    tenancy: &'a Tenancy,
    /// Faults on a lease holder so far: each looks first at the next tenant's leases.
    holder_faults: usize,
    /// Each replica's peer port, to tell from a lease which replica holds it.
    peer_ports: &'a [u16],
    /// The two releases of a rolling upgrade (the previous one only there), and the URL
    /// their `migrate` runs against.
    current: &'a Path,
    previous: Option<&'a Path>,
    database_url: String,
}

/// One run. `postgres` is the suite's PostgreSQL instance; a topology that fails over starts a
/// formation of its own in the run's folder instead, and stops it at the end.
pub async fn run(config: &RunConfig, postgres: Option<&Postgres>) -> anyhow::Result<RunReport> {
    std::fs::create_dir_all(&config.out)?;
    let mut database = if config.topology.fails_over() {
        Database::Formation(Box::new(
            Formation::start(&config.out.join("postgres")).await?,
        ))
    } else {
        let postgres = postgres.context("no PostgreSQL instance for the run")?;
        Database::Single {
            postgres,
            proxy: Proxy::start(postgres.addr()).await?,
        }
    };
    let report = run_on(config, &mut database).await;
    if let Database::Formation(formation) = &mut database {
        formation.stop().await;
    }
    report
}

async fn run_on(config: &RunConfig, db: &mut Database<'_>) -> anyhow::Result<RunReport> {
    let run_id = format!("{}{}", &config.topology.name()[..2], config.seed);
    let database = format!(
        "chaos_{}_{}",
        config.topology.name().replace('-', "_"),
        config.seed
    );
    let databases = TemplateDatabases::new(db.admin_config()?);
    // A rolling upgrade begins on the schema of the release it upgrades from.
    let first = if config.topology.rolls() {
        config
            .previous
            .as_deref()
            .context("a rolling upgrade needs the previous release (--previous-server)")?
    } else {
        config.server.as_path()
    };
    let tenancy = config.tenancy()?;
    // The template holds tenant `default`'s schema; `migrate` adds every other tenant's.
    let database_config = if config.topology.rolls() {
        databases.create_empty(&database).await?
    } else {
        databases.create(&database).await?
    };
    migrate(first, &db.url(&database), &tenancy).await?;
    let credentials = config.out.join("credentials");
    std::fs::write(&credentials, tenancy.credentials_file())?;

    let mut redis = Redis::start(config.topology.redis(), &config.out.join("redis")).await?;
    let key_prefix = format!("chaos:{run_id}");
    let env: Vec<(String, String)> = [
        ("DATABASE_URL", db.service_url(&database)),
        ("DATABASE_POOL_SIZE", "8".into()),
        ("DATABASE_TIMEOUT", "1s".into()),
        ("DATABASE_STATEMENT_TIMEOUT", "2s".into()),
        ("REDIS_URL", redis.url()),
        ("REDIS_KEY_PREFIX", key_prefix.clone()),
        (
            "LEASE_TTL",
            humantime::format_duration(LEASE_TTL).to_string(),
        ),
        ("LEASE_WAIT", "500ms".into()),
        ("SWEEP_INTERVAL", "250ms".into()),
        ("SHUTDOWN_GRACE", "2s".into()),
        ("RUST_LOG", "warn".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .chain(tenancy.env(&credentials))
    .collect();
    let mut replicas = Vec::new();
    // Forwarding on: each replica's peer port, which its leases name.
    let mut peer_ports = Vec::new();
    for i in 0..REPLICAS {
        let log = config.out.join(format!("replica-{i}.log"));
        let port = inventory_testkit::ports::free_port()?;
        let mut env = env.clone();
        env.extend([
            ("PEER_LISTEN_ADDR".to_owned(), format!("127.0.0.1:{port}")),
            ("PEER_SECRET".to_owned(), PEER_SECRET.to_owned()),
        ]);
        replicas.push(ServerProcess::start(first, env, log).await?);
        peer_ports.push(port);
    }
    let endpoints = Endpoints::new(&replicas.iter().map(ServerProcess::addr).collect::<Vec<_>>())?;
    let skus: Vec<String> = (0..config.skus)
        .map(|i| format!("CH-{run_id}-{i}"))
        .collect();

    let started = Instant::now();
    let recorder = Recorder::new(started);
    for tenant in &tenancy.tenants {
        stock_up(config, &run_id, tenant, &skus, (&endpoints, &recorder)).await?;
    }

    let workload = workload::start(
        WorkloadConfig {
            run_id: run_id.clone(),
            clients: config.clients,
            tenants: tenancy.tenants.clone(),
            skus: skus.clone(),
            stock: config.stock,
            seed: config.seed,
            call_timeout: CALL_TIMEOUT,
            attempts: 3,
        },
        endpoints.clone(),
        recorder.clone(),
    );
    let planned = schedule::plan(config.seed, config.topology, config.duration, LEASE_TTL);
    let database_url = db.url(&database);
    let mut targets = Targets {
        database: db,
        redis: &mut redis,
        replicas: &mut replicas,
        skus: &skus,
        key_prefix: &key_prefix,
        tenancy: &tenancy,
        holder_faults: 0,
        peer_ports: &peer_ports,
        current: &config.server,
        previous: config.previous.as_deref(),
        database_url,
    };
    let mut applied = Vec::new();
    let mut outages = Vec::new();
    let mut fault_error = None;
    // A fault that could not start on time (an earlier one took long to heal) still runs,
    // late; one that would start too near the end is left out, so every fault heals while
    // the load runs.
    let last_start_ms = config.duration.as_millis() as f64 - 4_000.0;
    for p in &planned {
        let due = started + Duration::from_millis(p.at_ms);
        tokio::time::sleep_until(due.into()).await;
        let started_ms = recorder.now_ms();
        if started_ms > last_start_ms {
            break;
        }
        match apply(&p.fault, &mut targets, &recorder).await {
            Ok(Effect {
                down,
                promoted_ms,
                holder,
            }) => {
                let healed_ms = recorder.now_ms();
                if let Some(down) = down {
                    outages.push(RunOutage {
                        fault: p.fault.name().into(),
                        start_ms: started_ms,
                        end_ms: down.until_ms,
                        skus: down.skus,
                    });
                }
                applied.push(Applied {
                    fault: p.fault.clone(),
                    started_ms,
                    late_ms: started_ms - p.at_ms as f64,
                    healed_ms,
                    promoted_ms,
                    unavailable_ms: None,
                    reserve_codes: Default::default(),
                    holder: holder.map(|(replica, held)| {
                        let (tenant, sku) = held.unzip();
                        report::HolderFault {
                            replica,
                            tenant,
                            sku,
                            sold_again_ms: None,
                        }
                    }),
                });
            }
            Err(error) => {
                fault_error = Some(error.context(format!("applying {:?}", p.fault)));
                break;
            }
        }
    }
    tokio::time::sleep_until((started + config.duration).into()).await;
    workload.stop().await;
    let load_end_ms = recorder.now_ms();
    if let Some(error) = fault_error {
        return Err(error);
    }

    // Everything serves again; calls still in flight on a resumed replica finish.
    targets.redis.wait_healthy().await?;
    tokio::time::sleep(LEASE_TTL + CALL_TIMEOUT + Duration::from_secs(1)).await;
    let unknown_after_load = resolve(&endpoints, &tenancy, &recorder).await;

    // Each tenant's rows, from its own schema, and its own stream.
    let client = connect(&database_config).await?;
    let mut facts: BTreeMap<String, Facts> = BTreeMap::new();
    let mut streams: BTreeMap<String, Vec<SeenEvent>> = BTreeMap::new();
    for tenant in &tenancy.tenants {
        client
            .batch_execute(&format!("SET search_path = {}", tenant.schema()))
            .await?;
        wait_quiet(&client)
            .await
            .with_context(|| format!("tenant {}", tenant.tenant))?;
        let rows = read_facts(&client).await?;
        let stream = workload::read_stream(&endpoints, tenant, rows.head).await?;
        facts.insert(tenant.tenant.clone(), rows);
        streams.insert(tenant.tenant.clone(), stream);
    }
    let history = recorder.take();
    let failovers: Vec<Outage> = applied
        .iter()
        .filter(|a| a.fault.fails_over())
        .map(|a| Outage {
            fault: a.fault.name().to_owned(),
            start_ms: a.started_ms,
            end_ms: a.healed_ms,
            skus: None,
        })
        .collect();
    let mut checks = Vec::new();
    let mut isolation = Vec::new();
    for tenant in &tenancy.tenants {
        let name = tenant.tenant.as_str();
        let (facts, stream) = (&facts[name], &streams[name]);
        let its_outages: Vec<Outage> = outages.iter().map(|o| o.of_tenant(name)).collect();
        let its_heals = heals(&applied, &its_outages);
        checks.extend(checker::check_tenant(
            name,
            &history,
            stream,
            facts,
            (&its_outages, &its_heals),
            &failovers,
            load_end_ms,
        ));
        isolation.push(TenantRows {
            tenant: name,
            callers: tenant.caller_names(),
            facts,
            stream,
        });
    }
    checks.push(checker::tenants_isolated(&history, &isolation, &skus));
    let (verified, report) = inventory_testkit::server::verify_tenants(
        &config.server,
        &targets.database.url(&database),
        &tenancy.names(),
    )
    .await?;
    checks.push(checker::Check {
        name: "ledger_verified",
        tenant: None,
        passed: verified,
        examined: facts.values().map(|f| f.stock.len()).sum(),
        detail: verify_summary(&report),
    });
    if !verified {
        eprintln!("inventory-server verify found drift:\n{report}");
    }
    for a in &mut applied {
        a.reserve_codes = report::reserve_codes(&history, a.started_ms, a.healed_ms);
        if let Some(holder) = &mut a.holder {
            holder.sold_again_ms = match (&holder.tenant, &holder.sku) {
                (Some(tenant), Some(sku)) => {
                    report::sold_again_ms(&history, tenant, sku, a.started_ms)
                }
                _ => None,
            };
        }
        if a.fault.fails_over() {
            a.unavailable_ms = Some(report::longest_without_reserve(
                &history,
                a.started_ms,
                a.healed_ms,
            ));
        }
    }
    let passed = checks.iter().all(|c| c.passed);
    let report = RunReport {
        topology: config.topology,
        seed: config.seed,
        duration_s: config.duration.as_secs_f64(),
        clients: config.clients,
        skus: config.skus,
        tenants: tenancy.tenant_names(),
        schedule: planned,
        applied,
        counts: report::counts(&history),
        holds_by_tenant: report::holds_by_tenant(&history, &tenancy.tenant_names()),
        unknown_after_load,
        events: streams.values().map(Vec::len).sum(),
        checks,
        passed,
        replay: config.replay(),
    };
    write_files(config, &report, &history, &streams, &facts)?;
    for replica in &mut replicas {
        replica.stop(STOP_GRACE).await;
    }
    drop(client);
    if passed {
        databases.drop_database(&database).await?;
    }
    Ok(report)
}

/// SKU names of each tenant, by tenant.
type TenantSkus = BTreeMap<String, Vec<String>>;

/// A span during which Redis could not grant a lease for these SKUs of each tenant (all, when
/// `None`).
struct RunOutage {
    fault: String,
    start_ms: f64,
    end_ms: f64,
    skus: Option<TenantSkus>,
}

impl RunOutage {
    /// The outage as one tenant's checks see it: its SKUs only.
    fn of_tenant(&self, tenant: &str) -> Outage {
        Outage {
            fault: self.fault.clone(),
            start_ms: self.start_ms,
            end_ms: self.end_ms,
            skus: self
                .skus
                .as_ref()
                .map(|skus| skus.get(tenant).cloned().unwrap_or_default()),
        }
    }
}

/// When each fault healed, with the SKUs that must sell again (those of a killed Cluster
/// node, from one tenant's `outages`), and when the next failover began.
fn heals(applied: &[Applied], outages: &[Outage]) -> Vec<Heal> {
    applied
        .iter()
        .enumerate()
        .map(|(i, a)| Heal {
            next_failover_ms: applied[i + 1..]
                .iter()
                .find(|next| next.fault.fails_over())
                .map(|next| next.started_ms),
            fault: a.fault.name().to_owned(),
            healed_ms: a.healed_ms,
            // After a Cluster node comes back, it is its own SKUs that must sell again.
            skus: outages
                .iter()
                .find(|o| o.start_ms == a.started_ms)
                .and_then(|o| o.skus.clone()),
        })
        .collect()
}

/// While a fault lasted, Redis could not grant a lease for these SKUs of each tenant (all,
/// when `None`).
struct Down {
    skus: Option<TenantSkus>,
    /// The moment the harness began to heal it (a restarted process may answer at once).
    until_ms: f64,
}

/// What a fault did, beyond what it was asked to.
#[derive(Default)]
struct Effect {
    /// Redis could grant no lease meanwhile.
    down: Option<Down>,
    /// When the monitor had promoted the standby (a failover), from the start of the load.
    promoted_ms: Option<f64>,
    /// A fault on a lease holder: the replica and the tenant and SKU whose lease it held
    /// (`None`s: none was found).
    holder: Option<Holder>,
}

/// The replica holding a lease, and the tenant and SKU the lease is of.
type Holder = (Option<usize>, Option<(String, String)>);

/// The replica holding a lease of one of the run's SKUs of any tenant (each tenant's lease key
/// of a SKU is its own, `tenants::redis_key`), as the lease's value names its peer port
/// (`<token>@127.0.0.1:<port>`), and that tenant and SKU. Under load one is almost always
/// held; a few looks, 10 ms apart, cover a moment between two holds. `(None, None)`: none was.
/// Each fault looks at the next tenant's leases first, so the faults take turns among them.
async fn lease_holder(t: &mut Targets<'_, '_>) -> anyhow::Result<Holder> {
    use fred::interfaces::{ClientLike as _, KeysInterface as _};
    let config = fred::types::config::Config::from_url(&t.redis.url())?;
    let client = fred::types::Builder::from_config(config)
        .with_performance_config(|p| p.default_command_timeout = Duration::from_secs(1))
        .build()?;
    client.init().await?;
    let mut found = (None, None);
    let (tenants, skus) = (&t.tenancy.tenants, t.skus);
    let first = t.holder_faults % tenants.len();
    t.holder_faults += 1;
    let leases: Vec<(&str, &String)> = tenants[first..]
        .iter()
        .chain(&tenants[..first])
        .flat_map(|c| skus.iter().map(move |sku| (c.tenant.as_str(), sku)))
        .collect();
    'looking: for _ in 0..100 {
        for &(tenant, sku) in &leases {
            let key = tenants::redis_key(t.key_prefix, tenant, sku, "lease");
            let value: Option<String> = client.get(key).await?;
            let port = value
                .as_deref()
                .and_then(|v| v.rsplit_once(':'))
                .and_then(|(_, port)| port.parse::<u16>().ok());
            if let Some(replica) = port.and_then(|p| t.peer_ports.iter().position(|&q| q == p)) {
                found = (Some(replica), Some((tenant.to_owned(), sku.clone())));
                break 'looking;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let _ = client.quit().await;
    Ok(found)
}

/// Applies one fault and heals it.
async fn apply(
    fault: &Fault,
    t: &mut Targets<'_, '_>,
    recorder: &Recorder,
) -> anyhow::Result<Effect> {
    let ms = Duration::from_millis;
    announce(recorder, fault);
    if fault.fails_over() {
        let promoted_ms = fail_over(fault, t.database.formation()?, recorder).await?;
        return Ok(Effect {
            promoted_ms: Some(promoted_ms),
            ..Effect::default()
        });
    }
    let down = match *fault {
        Fault::MigrateSchema => {
            let printed = migrate(t.current, &t.database_url, t.tenancy).await?;
            eprintln!(
                "  {:>7.1} s  migrate: {}",
                recorder.now_ms() / 1000.0,
                printed.replace('\n', " | ")
            );
            None
        }
        Fault::ReplaceReplica { replica, release } => {
            let binary = match release {
                Release::Current => t.current,
                Release::Previous => t.previous.context("no previous release")?,
            };
            t.replicas[replica].replace(binary, STOP_GRACE).await?;
            None
        }
        Fault::PauseReplica { replica, for_ms } => {
            t.replicas[replica].pause().await?;
            tokio::time::sleep(ms(for_ms)).await;
            t.replicas[replica].resume().await?;
            None
        }
        Fault::KillReplica { replica, down_ms } => {
            t.replicas[replica].kill().await?;
            tokio::time::sleep(ms(down_ms)).await;
            t.replicas[replica].restart().await?;
            None
        }
        Fault::PauseHolder { for_ms } => {
            let (replica, sku) = lease_holder(t).await?;
            let target = replica.unwrap_or(0);
            t.replicas[target].pause().await?;
            tokio::time::sleep(ms(for_ms)).await;
            t.replicas[target].resume().await?;
            return Ok(Effect {
                holder: Some((replica, sku)),
                ..Effect::default()
            });
        }
        Fault::KillHolder { down_ms } => {
            let (replica, sku) = lease_holder(t).await?;
            let target = replica.unwrap_or(0);
            t.replicas[target].kill().await?;
            tokio::time::sleep(ms(down_ms)).await;
            t.replicas[target].restart().await?;
            return Ok(Effect {
                holder: Some((replica, sku)),
                ..Effect::default()
            });
        }
        Fault::RedisPause { node, for_ms } => {
            let node = match t.redis.topology {
                redis::Topology::Single => 0,
                redis::Topology::Sentinel => t.redis.sentinel_primary().await?,
                redis::Topology::Cluster => node,
            };
            t.redis.nodes[node].pause().await?;
            tokio::time::sleep(ms(for_ms)).await;
            t.redis.nodes[node].resume().await?;
            // A pause past Sentinel's down-after time ends in a failover; wait it out.
            t.redis.wait_healthy().await?;
            None
        }
        Fault::RedisRestartEmpty { down_ms } => {
            t.redis.nodes[0].kill().await?;
            tokio::time::sleep(ms(down_ms)).await;
            let until_ms = recorder.now_ms();
            t.redis.nodes[0].restart().await?;
            Some(Down {
                skus: None,
                until_ms,
            })
        }
        Fault::RedisCut { for_ms } => {
            let proxy = t.redis.proxy.as_ref().context("no Redis proxy")?;
            proxy.set_cut(true);
            tokio::time::sleep(ms(for_ms)).await;
            let until_ms = recorder.now_ms();
            proxy.set_cut(false);
            Some(Down {
                skus: None,
                until_ms,
            })
        }
        Fault::RedisSlow { latency_ms, for_ms } => {
            let proxy = t.redis.proxy.as_ref().context("no Redis proxy")?;
            proxy.set_latency(ms(latency_ms));
            tokio::time::sleep(ms(for_ms)).await;
            proxy.set_latency(Duration::ZERO);
            None
        }
        Fault::SentinelFailover { down_ms } => {
            let old = t.redis.sentinel_primary().await?;
            t.redis.nodes[old].kill().await?;
            let redis = &*t.redis;
            eventually(
                "Sentinel did not promote the replica",
                Duration::from_secs(30),
                || async { redis.sentinel_primary().await.ok() != Some(old) },
            )
            .await?;
            tokio::time::sleep(ms(down_ms)).await;
            // Back empty; Sentinel turns it into a replica of the new primary.
            t.redis.nodes[old].restart().await?;
            t.redis.wait_healthy().await?;
            None
        }
        Fault::ClusterNodeKill { node, down_ms } => {
            t.redis.nodes[node].kill().await?;
            tokio::time::sleep(ms(down_ms)).await;
            let until_ms = recorder.now_ms();
            t.redis.nodes[node].restart().await?;
            t.redis.wait_healthy().await?;
            // Each tenant's own lease keys: the slot is the SKU's hash tag's, whatever the
            // tenant, but it is the tenant's key that the replicas use.
            let skus = t
                .tenancy
                .tenants
                .iter()
                .map(|c| {
                    let on_node = t.skus.iter().filter(|sku| {
                        let key = tenants::redis_key(t.key_prefix, &c.tenant, sku, "lease");
                        t.redis
                            .cluster_node_of_slot(fred::util::redis_keyslot(key.as_bytes()))
                            == node
                    });
                    (c.tenant.clone(), on_node.cloned().collect())
                })
                .collect();
            Some(Down {
                skus: Some(skus),
                until_ms,
            })
        }
        Fault::PostgresRestart => {
            t.database.single()?.0.restart_fast().await?;
            None
        }
        Fault::PostgresCut { for_ms } => {
            let proxy = t.database.single()?.1;
            proxy.set_cut(true);
            tokio::time::sleep(ms(for_ms)).await;
            proxy.set_cut(false);
            None
        }
        Fault::PostgresSlow { latency_ms, for_ms } => {
            let proxy = t.database.single()?.1;
            proxy.set_latency(ms(latency_ms));
            tokio::time::sleep(ms(for_ms)).await;
            proxy.set_latency(Duration::ZERO);
            None
        }
        Fault::PgPrimaryKill { .. }
        | Fault::PgPrimaryPause { .. }
        | Fault::PgPrimaryCut { .. }
        | Fault::PgSwitchover => unreachable!("failovers are applied above"),
    };
    Ok(Effect {
        down,
        ..Effect::default()
    })
}

/// Moves the PostgreSQL primary to the standby (killed, frozen, cut off or switched over),
/// then waits until the old primary has rejoined as the new one's synchronous standby.
/// Returns when the monitor had promoted the standby.
async fn fail_over(fault: &Fault, f: &mut Formation, recorder: &Recorder) -> anyhow::Result<f64> {
    let ms = Duration::from_millis;
    let old = f.wait_stable().await?;
    let promoted_ms = match *fault {
        Fault::PgPrimaryKill { down_ms } => {
            f.kill(old).await?;
            f.wait_promoted(old).await?;
            let promoted_ms = recorder.now_ms();
            tokio::time::sleep(ms(down_ms)).await;
            f.restart(old).await?;
            promoted_ms
        }
        // Healed whether or not the promotion came, so a failed run leaves nothing frozen.
        Fault::PgPrimaryPause { after_ms } => {
            f.pause(old).await?;
            let promoted = f.wait_promoted(old).await.map(|_| recorder.now_ms());
            if promoted.is_ok() {
                tokio::time::sleep(ms(after_ms)).await;
            }
            f.resume(old).await?;
            promoted?
        }
        Fault::PgPrimaryCut { after_ms } => {
            f.set_cut(old, true);
            let promoted = f.wait_promoted(old).await.map(|_| recorder.now_ms());
            if promoted.is_ok() {
                tokio::time::sleep(ms(after_ms)).await;
            }
            f.set_cut(old, false);
            promoted?
        }
        Fault::PgSwitchover => {
            f.switchover().await?;
            recorder.now_ms()
        }
        _ => bail!("{fault:?} is not a failover"),
    };
    let new = f.wait_stable().await?;
    anyhow::ensure!(new != old, "the primary is where it was before {fault:?}");
    Ok(promoted_ms)
}

fn announce(recorder: &Recorder, fault: &Fault) {
    eprintln!("  {:>7.1} s  {fault:?}", recorder.now_ms() / 1000.0);
}

/// Sends every `Reserve` and `AdjustStock` whose outcome is still unknown again, with its key,
/// as its tenant's caller, until it gets a definite answer: the answer says whether the first
/// attempt took effect. Returns how many keys needed it.
async fn resolve(endpoints: &Endpoints, tenancy: &Tenancy, recorder: &Recorder) -> usize {
    use futures::StreamExt as _;
    let ops = recorder.ops();
    // The same key in two tenants is two keys.
    let mut by_key: BTreeMap<(&str, &str), Vec<&Op>> = BTreeMap::new();
    for op in ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Reserve | OpKind::Adjust))
    {
        by_key
            .entry((op.tenant.as_str(), op.key.as_deref().unwrap_or("")))
            .or_default()
            .push(op);
    }
    let pending: Vec<&Op> = by_key
        .values()
        .filter(|ops| {
            !ops.iter().any(|o| o.outcome == Outcome::Ok)
                && !ops.iter().all(|o| o.outcome == Outcome::Fail)
        })
        .map(|ops| ops[0])
        .collect();
    let callers: BTreeMap<&str, Caller> = tenancy
        .tenants
        .iter()
        .map(|tenant| {
            let caller = Caller {
                tenant,
                endpoints,
                recorder,
                phase: Phase::Resolve,
                timeout: Duration::from_secs(5),
                attempts: 5,
            };
            (tenant.tenant.as_str(), caller)
        })
        .collect();
    // Eight keys at a time, within one minute in all: a key still unknown after that fails
    // the checker rather than hanging the run.
    let deadline = Instant::now() + Duration::from_secs(60);
    futures::stream::iter(&pending)
        .for_each_concurrent(8, |op| async {
            match callers.get(op.tenant.as_str()) {
                Some(caller) => resolve_key(caller, op, deadline).await,
                None => eprintln!(
                    "{} of tenant {}, not served",
                    op.key.as_deref().unwrap_or(""),
                    op.tenant
                ),
            }
        })
        .await;
    pending.len()
}

/// Sends one key again until its answer settles it, or the deadline passes.
async fn resolve_key(caller: &Caller<'_>, op: &Op, deadline: Instant) {
    let key = op.key.as_deref().unwrap_or("");
    while Instant::now() < deadline {
        let outcome = match op.kind {
            OpKind::Reserve => {
                let ttl_ms = op.ttl_ms.unwrap_or(1_000);
                caller
                    .reserve(0, key, &op.order(), &op.lines, ttl_ms)
                    .await
                    .0
            }
            _ => {
                let line = &op.lines[0];
                caller.adjust(key, &line.sku, line.quantity).await
            }
        };
        // ABORTED or RESOURCE_EXHAUSTED refuse only this attempt (another with the key was in
        // progress, the lease was busy): they say nothing of the outcome, so ask again.
        let settled = caller
            .recorder
            .last_code_of(&op.tenant, key)
            .is_some_and(|code| Outcome::settles(&code));
        if outcome == Outcome::Ok || (outcome == Outcome::Fail && settled) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Waits for the quiet end of a run in the schema `client` works in (one tenant's): every hold
/// of a few seconds swept (one that waited for stock lasts until the wait horizon, at least an
/// hour after it was made, where no run reaches); no units free where holds wait (the refill
/// pass fills them); and every event positioned. Nothing changes after that, so rows and
/// stream can be read in turn.
async fn wait_quiet(client: &tokio_postgres::Client) -> anyhow::Result<()> {
    eventually_ok(
        "holds still unswept or events unpositioned",
        Duration::from_secs(60),
        || async {
            let row = client
                .query_one(
                    "SELECT (SELECT count(*) FROM reservations WHERE state = 'HELD'
                               AND expires_at < created_at + interval '1 hour')
                          + (SELECT count(*) FROM stock_locations
                             WHERE (backordered > 0 OR preordered > 0)
                               AND on_hand - reserved - damaged - quality_control
                                   - safety_stock > 0)
                          + (SELECT count(*) FROM outbox WHERE position IS NULL)",
                    &[],
                )
                .await?;
            match row.get::<_, i64>(0) {
                0 => Ok(()),
                left => Err(anyhow::anyhow!("{left} left")),
            }
        },
    )
    .await
}

/// The rows of the schema `client` works in (one tenant's), all from one snapshot.
async fn read_facts(client: &tokio_postgres::Client) -> anyhow::Result<Facts> {
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let facts = read_rows(client).await;
    client.batch_execute("COMMIT").await?;
    facts
}

async fn read_rows(client: &tokio_postgres::Client) -> anyhow::Result<Facts> {
    let mut facts = Facts {
        reservations: audit::reservations(client, None).await?,
        level_mismatches: audit::reserved_against_holds(client, None).await?,
        ..Facts::default()
    };
    for row in client
        .query(
            "SELECT sku, on_hand, reserved, version FROM stock ORDER BY sku",
            &[],
        )
        .await?
    {
        facts.stock.push(StockRow {
            sku: row.get(0),
            on_hand: row.get(1),
            reserved: row.get(2),
            version: row.get(3),
        });
    }
    for row in client
        .query(
            "SELECT position, event_id::text, event_type, tx_id::text FROM outbox ORDER BY position",
            &[],
        )
        .await?
    {
        facts.outbox.push(OutboxRow {
            position: row.get(0),
            event_id: row.get(1),
            event_type: row.get(2),
            tx_id: row.get(3),
        });
    }
    facts.head = client
        .query_one("SELECT head FROM event_stream", &[])
        .await?
        .get(0);
    facts.cancel_violations = cancel_violations(client).await?;
    for row in client
        .query(
            "SELECT DISTINCT idempotency_key FROM stock_movements
             WHERE kind = 'ADJUSTED' AND idempotency_key IS NOT NULL",
            &[],
        )
        .await?
    {
        facts.adjust_keys.push(row.get(0));
    }
    for row in client
        .query("SELECT DISTINCT order_id FROM cancelled_orders", &[])
        .await?
    {
        facts.cancelled_orders.push(row.get(0));
    }
    for row in client
        .query(
            "SELECT caller FROM reservations
             UNION SELECT caller FROM idempotency_keys
             UNION SELECT caller FROM cancelled_orders WHERE caller <> '*'
             UNION SELECT actor FROM stock_movements WHERE actor <> ''
             ORDER BY 1",
            &[],
        )
        .await?
    {
        facts.callers.push(row.get(0));
    }
    for row in client
        .query(
            "SELECT e.receipt_id, e.quantity, e.received, e.preordered,
                    coalesce(p.pegged, 0)::bigint
             FROM receipts e LEFT JOIN (
                 SELECT l.receipt_id, sum(l.preordered) AS pegged
                 FROM reservation_lines l JOIN reservations r USING (reservation_id)
                 WHERE r.state = 'HELD' AND l.preordered > 0 GROUP BY l.receipt_id) p
                 USING (receipt_id)
             ORDER BY e.receipt_id",
            &[],
        )
        .await?
    {
        facts.receipts.push(ReceiptRow {
            receipt_id: row.get(0),
            quantity: row.get(1),
            received: row.get(2),
            preordered: row.get(3),
            pegged: row.get(4),
        });
    }
    for row in client
        .query(
            "SELECT s.sku, s.reserved, s.backordered,
                    coalesce((SELECT sum(l.preordered)
                              FROM reservation_lines l
                              JOIN reservations r USING (reservation_id)
                              JOIN receipts e ON e.receipt_id = l.receipt_id
                              WHERE r.state = 'HELD' AND l.sku = s.sku
                                AND e.state = 'OPEN'), 0)::bigint,
                    s.on_hand, s.backorder_limit, s.incoming
             FROM stock s WHERE s.backordered > 0 OR s.preordered > 0 OR s.incoming > 0
             ORDER BY s.sku",
            &[],
        )
        .await?
    {
        facts.demand.push(crate::checker::DemandRow {
            sku: row.get(0),
            held: row.get(1),
            backordered: row.get(2),
            preordered_open: row.get(3),
            on_hand: row.get(4),
            backorder_limit: row.get(5),
            incoming: row.get(6),
        });
    }
    Ok(facts)
}

/// Reservations of a cancelled order that the tombstone should have stopped or the cancel
/// should have released: created after the cancel, or still stored `HELD` with an expiry past
/// it (a hold live at the cancel that it left). A tombstone covers its caller's reservations,
/// or every caller's when the admin cancelled (`*`). Read after the quiet end, when the
/// sweeper has ended every hold, the second half finds nothing; a hold the cancel missed shows
/// in the history instead, as units held in the cancel's answer.
async fn cancel_violations(client: &tokio_postgres::Client) -> anyhow::Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT r.reservation_id::text, r.order_id, r.state, r.created_at > c.cancelled_at
             FROM reservations r
             JOIN cancelled_orders c
                 ON c.order_id = r.order_id AND (c.caller = r.caller OR c.caller = '*')
             WHERE r.created_at > c.cancelled_at
                OR (r.state = 'HELD' AND r.expires_at > c.cancelled_at)
             ORDER BY r.reservation_id",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| {
            let (id, order, state): (String, String, String) = (row.get(0), row.get(1), row.get(2));
            if row.get::<_, bool>(3) {
                format!("{id} of cancelled order {order}: created after the cancel ({state})")
            } else {
                format!("{id} of cancelled order {order}: still held after the cancel")
            }
        })
        .collect())
}

/// The run's files; `events.json` has each tenant's stream and `facts.json` each tenant's rows,
/// by tenant.
fn write_files(
    config: &RunConfig,
    report: &RunReport,
    history: &History,
    streams: &BTreeMap<String, Vec<SeenEvent>>,
    facts: &BTreeMap<String, Facts>,
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut ops = std::io::BufWriter::new(std::fs::File::create(config.out.join("history.jsonl"))?);
    for op in &history.ops {
        serde_json::to_writer(&mut ops, op)?;
        ops.write_all(b"\n")?;
    }
    ops.flush()?;
    std::fs::write(
        config.out.join("events.json"),
        serde_json::to_vec(&serde_json::json!({
            "streams": streams,
            "live": history.live_events,
            "snapshots": history.snapshots,
        }))?,
    )?;
    std::fs::write(config.out.join("facts.json"), serde_json::to_vec(facts)?)?;
    std::fs::write(
        config.out.join("report.json"),
        serde_json::to_vec_pretty(report)?,
    )?;
    std::fs::write(config.out.join("report.txt"), report.summary())?;
    std::fs::write(
        config.out.join("timeline.svg"),
        report::svg(report, history),
    )?;
    Ok(())
}

/// Creates the locations of one tenant and stocks each SKU name at each, as the tenant's
/// admin: every `Reserve` allocates among them.
async fn stock_up(
    config: &RunConfig,
    run_id: &str,
    tenant: &TenantCallers,
    skus: &[String],
    (endpoints, recorder): (&Endpoints, &Recorder),
) -> anyhow::Result<()> {
    let name = &tenant.tenant;
    let seeder = Caller {
        tenant,
        endpoints,
        recorder,
        phase: Phase::Load,
        timeout: CALL_TIMEOUT,
        attempts: 20,
    };
    let mut grpc = endpoints.client(0);
    for (priority, location) in workload::LOCATIONS.iter().enumerate().skip(1) {
        let mut request = tonic::Request::new(inventory_proto::UpsertLocationRequest {
            location_id: (*location).to_owned(),
            priority: priority as i32,
            active: true,
        });
        tenant.admin.authorize(&mut request);
        grpc.upsert_location(request)
            .await
            .with_context(|| format!("could not create location {location} of tenant {name}"))?;
    }
    let share = config.stock / workload::LOCATIONS.len() as i64;
    for sku in skus {
        for (i, location) in workload::LOCATIONS.iter().enumerate() {
            let key = format!("{run_id}-seed-{sku}@{location}");
            let units = if i == 0 {
                config.stock - share * (workload::LOCATIONS.len() as i64 - 1)
            } else {
                share
            };
            if seeder.adjust(&key, sku, units).await != Outcome::Ok {
                bail!("could not stock {sku} of tenant {name} at {location} before the run");
            }
        }
    }
    Ok(())
}

/// `binary migrate` for every tenant of the run (`TENANTS`): tenant `default`'s schema, and a
/// schema of its own created and migrated for every other. What it printed.
async fn migrate(binary: &Path, database_url: &str, tenancy: &Tenancy) -> anyhow::Result<String> {
    inventory_testkit::server::migrate_tenants(binary, database_url, &tenancy.names()).await
}

/// `verify`'s last line of each tenant (`[tenant <name>: ]verified <n> SKUs ...`, the tenant
/// named here for `default` too), or its last line when it printed none (it failed).
fn verify_summary(report: &str) -> String {
    let lines: Vec<String> = report
        .lines()
        .filter_map(|l| match l.find("verified ") {
            Some(0) => Some(format!("tenant default: {l}")),
            Some(_) => Some(l.to_owned()),
            None => None,
        })
        .collect();
    if lines.is_empty() {
        report.lines().last().unwrap_or_default().to_owned()
    } else {
        lines.join("; ")
    }
}
