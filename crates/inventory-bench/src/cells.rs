//! Cells side by side: does capacity add up across cells?
//!
//! A cell is a complete copy of the service: its own PostgreSQL cluster, its own
//! `redis-server` and its own `inventory-server`, sharing nothing with another cell. Each round
//! runs one cell alone under the load, then two cells side by side, each driven by a load of its
//! own with the same clients as the lone cell, at the same time. For every cell it takes the
//! reservations per second and the CPU per reservation of its own PostgreSQL (the postmaster
//! and every backend), its own server and its own Redis, told apart by process, and divides
//! each by the lone cell's of the same round.
//!
//! Two cells on machines of their own each get what the lone cell had; here they share the same
//! cores, so their combined rate cannot be twice the lone cell's. What carries over is the cost
//! of a reservation: if each cell's CPU per reservation beside the other equals the lone
//! cell's, nothing one cell does makes the other's reservations dearer, and a second cell on
//! machines of its own adds what the first one makes.
//!
//! Each cell serves tenant `default` with authentication off, as every other bench server does:
//! the tenant's name changes no process's work, and a cell is an independent deployment
//! whatever tenants it serves.
//!
//! The lone run goes first in the first round, second in the next, and so on, and the lone
//! cell alternates between A and B, so that drift over the run and any difference between the
//! two clusters fall on both sides alike. Every run gets fresh databases, stocked before the
//! measured window, and is audited for oversell (and `inventory-server verify`) afterwards.

use std::{net::SocketAddr, time::Duration};

use anyhow::Context as _;
use futures::future::try_join_all;
use inventory_testkit::{
    Scratch, free_port,
    postgres::{PgConfig, Postgres, PostgresOptions, TemplateDatabases, connect, url},
    redis::RedisNode,
    server::ServerProcess,
};
use serde::Serialize;

use crate::{
    audit,
    load::{self, LoadConfig, Scenario},
    profile::{self, CpuSnapshot, Profile},
    report::{RunResult, svg, us},
    stats::median,
    suite::{LONG_HOLD, SuiteConfig, rate, ratio, server_env, spread},
};

/// The load every cell gets: uniform over the suite's SKUs (the load PostgreSQL's CPU bounds,
/// which capacity is sized from), at the suite's most clients.
const SCENARIO: Scenario = Scenario::Uniform;

/// One cell's PostgreSQL cluster and Redis, started once for every round.
struct Cell {
    name: &'static str,
    databases: TemplateDatabases,
    /// The cluster's postmaster: its backends are its children.
    postmaster: u32,
    redis_pid: u32,
    redis: RedisNode,
    postgres: Postgres,
    /// Last: removed once the processes above are gone.
    _scratch: Scratch,
}

impl Cell {
    /// A cluster durable like the suite's own (fsync and synchronous commit on) and a Redis
    /// that keeps nothing on disk, like the suite's; the template database migrated.
    async fn start(name: &'static str) -> anyhow::Result<Self> {
        let scratch = Scratch::new(&format!("bench-cell-{}", name.to_lowercase()));
        let options = PostgresOptions {
            settings: [("fsync", "on"), ("synchronous_commit", "on")]
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .to_vec(),
            ..PostgresOptions::default()
        };
        let postgres = Postgres::start_with(&scratch.0.join("postgres"), &options)
            .await
            .with_context(|| format!("start cell {name}'s PostgreSQL"))?;
        let admin = postgres.admin_config()?;
        let fsync: String = connect(&admin)
            .await?
            .query_one("SHOW fsync", &[])
            .await?
            .get(0);
        anyhow::ensure!(
            fsync == "on",
            "cell {name}'s PostgreSQL runs with fsync {fsync}"
        );
        let pid_file = postgres.data_dir().join("postmaster.pid");
        let postmaster = std::fs::read_to_string(&pid_file)
            .with_context(|| format!("read {}", pid_file.display()))?
            .lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .with_context(|| format!("no process id in {}", pid_file.display()))?;
        let redis = RedisNode::start(scratch.0.join("redis"), Vec::new())
            .await
            .with_context(|| format!("start cell {name}'s Redis"))?;
        let redis_pid = redis
            .cli(&["info", "server"])
            .await?
            .lines()
            .find_map(|line| line.trim().strip_prefix("process_id:")?.parse().ok())
            .context("no process_id in Redis's INFO")?;
        let databases = TemplateDatabases::new(admin);
        databases.template().await?;
        Ok(Self {
            name,
            databases,
            postmaster,
            redis_pid,
            redis,
            postgres,
            _scratch: scratch,
        })
    }
}

/// One cell serving one run: a fresh database and a server on it, with the load it gets.
struct Serving<'a> {
    cell: &'a Cell,
    label: String,
    database: String,
    db_config: PgConfig,
    server: ServerProcess,
    server_pid: u32,
    admin_addr: SocketAddr,
    load: LoadConfig,
}

impl<'a> Serving<'a> {
    async fn start(
        config: &SuiteConfig,
        cell: &'a Cell,
        label: String,
        serial: usize,
        clients: usize,
        seed: u64,
    ) -> anyhow::Result<Self> {
        let database = format!("bench_cell_{serial}");
        let db_config = cell.databases.create(&database).await?;
        let admin_addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let env = server_env(
            url(&db_config),
            cell.redis.url(),
            format!("bench:{database}"),
            admin_addr,
            clients,
            64,
        )?;
        let log = config.out.join(format!("{label}.server.log"));
        let server = ServerProcess::start(&config.server, env, log).await?;
        let server_pid = server_pid(server.port)?;
        let load = LoadConfig {
            addr: server.addr(),
            scenario: SCENARIO,
            clients,
            connections: clients.clamp(1, 4),
            duration: config.duration,
            quantity: 1,
            ttl: LONG_HOLD,
            skus: config.skus,
            stock: 1_000_000,
            zipf_exponent: 1.1,
            shoppers: 5_000,
            confirm_share: 0.3,
            release_share: 0.3,
            run_id: format!("c{serial}"),
            token: None,
            seed,
            locations: 1,
        };
        Ok(Self {
            cell,
            label,
            database,
            db_config,
            server,
            server_pid,
            admin_addr,
            load,
        })
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        self.server.stop(Duration::from_secs(30)).await;
        self.cell.databases.drop_database(&self.database).await
    }
}

/// The process id of the `inventory-server` listening on `port`: the one whose environment
/// names it as its `LISTEN_ADDR`.
fn server_pid(port: u16) -> anyhow::Result<u32> {
    let wanted = format!("LISTEN_ADDR=127.0.0.1:{port}");
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if environ.split(|b| *b == 0).any(|v| v == wanted.as_bytes()) {
            return Ok(pid);
        }
    }
    anyhow::bail!("no process has {wanted}")
}

/// One cell's run, as the table shows it.
#[derive(Debug, Serialize)]
pub struct CellRun {
    pub label: String,
    pub cell: &'static str,
    pub reservations: u64,
    pub reservations_per_s: f64,
    pub p99_us: u64,
    /// Mean requests per coalesced transaction.
    pub batch: f64,
    /// CPU seconds over the run of the cell's PostgreSQL, server and Redis.
    pub postgres_s: f64,
    pub server_s: f64,
    pub redis_s: f64,
    /// Share of the machine's CPU time that was busy over the run (every process on it).
    pub machine_busy: f64,
    pub audit_passed: bool,
}

impl CellRun {
    fn per_reservation(&self, seconds: f64) -> f64 {
        seconds / (self.reservations as f64).max(1.0) * 1e6
    }

    pub fn postgres_us(&self) -> f64 {
        self.per_reservation(self.postgres_s)
    }

    pub fn server_us(&self) -> f64 {
        self.per_reservation(self.server_s)
    }

    pub fn redis_us(&self) -> f64 {
        self.per_reservation(self.redis_s)
    }
}

/// One round: a cell alone, and both cells side by side.
#[derive(Debug, Serialize)]
pub struct Round {
    pub clients: usize,
    pub alone: CellRun,
    /// Cell A, then cell B.
    pub beside: [CellRun; 2],
}

impl Round {
    pub fn audits_passed(&self) -> bool {
        self.alone.audit_passed && self.beside.iter().all(|r| r.audit_passed)
    }

    /// The round's ratios, one line.
    fn print(&self, round: usize) {
        let alone = &self.alone;
        let mut line = format!(
            "cells, round {}: alone {:.0} r/s, PG {:.0} µs, server {:.0} µs per reservation",
            round + 1,
            alone.reservations_per_s,
            alone.postgres_us(),
            alone.server_us()
        );
        for cell in &self.beside {
            line.push_str(&format!(
                "; {} beside: {:.0} r/s, PG {:.0} µs ({}), server {:.0} µs ({})",
                cell.cell,
                cell.reservations_per_s,
                cell.postgres_us(),
                ratio(cell.postgres_us() / alone.postgres_us().max(1e-9)),
                cell.server_us(),
                ratio(cell.server_us() / alone.server_us().max(1e-9)),
            ));
        }
        let together: f64 = self.beside.iter().map(|c| c.reservations_per_s).sum();
        line.push_str(&format!(
            "; together {together:.0} r/s ({} of alone)",
            ratio(together / alone.reservations_per_s.max(1e-9))
        ));
        println!("{line}");
    }
}

/// Every round of the cells row.
pub async fn run(config: &SuiteConfig, serial: &mut usize) -> anyhow::Result<Vec<Round>> {
    let clients = config.clients.iter().copied().max().unwrap_or(64);
    println!("== cells: starting two cells (a PostgreSQL cluster and a Redis each)");
    let cells = [Cell::start("A").await?, Cell::start("B").await?];
    let mut rounds = Vec::new();
    for round in 0..config.rounds {
        println!("== cells, round {} of {}", round + 1, config.rounds);
        // The same calls in every run of the round.
        let seed = 1_000 + round as u64;
        let lone = &cells[round % 2];
        let mut alone = None;
        let mut beside = None;
        let lone_first = round.is_multiple_of(2);
        for lone_now in [lone_first, !lone_first] {
            if lone_now {
                *serial += 1;
                let label = format!("cells-alone-{}-r{round}", lone.name.to_lowercase());
                let serving = Serving::start(config, lone, label, *serial, clients, seed).await?;
                let [run] = measure(config, [serving]).await?;
                alone = Some(run);
            } else {
                let label =
                    |cell: &Cell| format!("cells-beside-{}-r{round}", cell.name.to_lowercase());
                let [a, b] = &cells;
                *serial += 2;
                let a = Serving::start(config, a, label(a), *serial - 1, clients, seed).await?;
                let b = Serving::start(config, b, label(b), *serial, clients, seed).await?;
                beside = Some(measure(config, [a, b]).await?);
            }
        }
        let (Some(alone), Some(beside)) = (alone, beside) else {
            unreachable!("both sides ran");
        };
        let measured = Round {
            clients,
            alone,
            beside,
        };
        measured.print(round);
        rounds.push(measured);
    }
    for cell in &cells {
        cell.postgres.stop().await;
    }
    Ok(rounds)
}

/// Stocks each cell's SKUs, then drives every cell's load at once and takes the CPU of each
/// cell's processes over the window; then audits each cell and stops its server.
async fn measure<const N: usize>(
    config: &SuiteConfig,
    serving: [Serving<'_>; N],
) -> anyhow::Result<[CellRun; N]> {
    let prepared = try_join_all(serving.iter().map(|s| load::prepare(s.load.clone()))).await?;
    let addrs: Vec<[SocketAddr; 1]> = serving.iter().map(|s| [s.admin_addr]).collect();
    let mut pages = Vec::new();
    for addr in &addrs {
        pages.push(crate::suite::scrape_all(addr).await);
    }
    let before = CpuSnapshot::take();
    let observed = try_join_all(prepared.into_iter().map(load::drive)).await?;
    let after = CpuSnapshot::take();
    let window = observed
        .iter()
        .map(|o| o.elapsed.as_secs_f64())
        .fold(0.0, f64::max);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let machine_busy = after
        .since(&before)
        .iter()
        .filter(|(k, _)| k.as_str() != "server (busiest)")
        .map(|(_, v)| v)
        .sum::<f64>()
        / (window.max(1e-9) * cores);
    let mut runs = Vec::new();
    for ((serving, observed), (page, addr)) in serving
        .into_iter()
        .zip(observed)
        .zip(pages.into_iter().zip(&addrs))
    {
        let cell = serving.cell;
        let postgres_s = after.tree_since(&before, cell.postmaster);
        let server_s = after.tree_since(&before, serving.server_pid);
        let redis_s = after.tree_since(&before, cell.redis_pid);
        let steps = profile::steps(&page, &crate::suite::scrape_all(addr).await);
        let outcome = async {
            let database_url = url(&serving.db_config);
            let mut audit = audit::audit(&serving.load, &observed, Some(&database_url)).await?;
            audit.verify_ledger(&config.server, &database_url).await?;
            let mut result = RunResult::new(
                &serving.label,
                SCENARIO,
                serving.load.clients,
                &observed,
                Some(audit),
            );
            let reservations = observed.held.len() as f64;
            let mut profile = Profile::new(
                [
                    ("postgres", postgres_s),
                    ("server", server_s),
                    ("server (busiest)", server_s),
                    ("redis", redis_s),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect(),
                observed.elapsed.as_secs_f64(),
                reservations,
                steps,
            );
            // The machine's, not the cell's: how much of the cores were left.
            profile.cpu_busy = machine_busy;
            result.profile = Some(profile);
            std::fs::write(
                config.out.join(format!("{}.json", serving.label)),
                serde_json::to_vec_pretty(&result)?,
            )?;
            std::fs::write(
                config.out.join(format!("{}.svg", serving.label)),
                svg(&result),
            )?;
            Ok::<_, anyhow::Error>(result)
        }
        .await;
        let label = serving.label.clone();
        serving.stop().await?;
        let result = outcome?;
        result.print();
        runs.push(CellRun {
            label,
            cell: cell.name,
            reservations: result.reservations,
            reservations_per_s: result.reservations_per_s,
            p99_us: result.latency.p99_us,
            batch: result
                .profile
                .as_ref()
                .map_or(0.0, |p| p.steps.requests_per_transaction),
            postgres_s,
            server_s,
            redis_s,
            machine_busy,
            audit_passed: result.audit.as_ref().is_some_and(|a| a.passed),
        });
    }
    runs.try_into()
        .map_err(|_| anyhow::anyhow!("one run per cell"))
}

/// The cells table: the lone cell, each cell beside the other, and both together, each figure
/// the median (min–max) of the rounds, each ratio taken within a round.
pub fn table(rounds: &[Round]) -> String {
    let Some(first) = rounds.first() else {
        return String::new();
    };
    let mut table = format!(
        "\n| cells, uniform ({} rounds; lone cell A, B alternating) | clients per cell | r/s | \
         r/s vs alone | p99 | batch | PG CPU µs | PG vs alone | server CPU µs | server vs alone | \
         Redis CPU µs | machine busy | audits |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
        rounds.len()
    );
    let of = |f: &dyn Fn(&Round) -> f64| rounds.iter().map(f).collect::<Vec<_>>();
    let percent = |v: f64| format!("{:.0} %", v * 100.0);
    let whole = |v: f64| format!("{v:.0}");
    let passed = |ok: bool| if ok { "passed" } else { "FAILED" };
    table.push_str(&format!(
        "| one cell alone | {} | {} | 1.00x | {} | {} | {} | 1.00x | {} | 1.00x | {} | {} | {} |\n",
        first.clients,
        spread(&of(&|r| r.alone.reservations_per_s), rate),
        us(median(&of(&|r| r.alone.p99_us as f64)) as u64),
        spread(&of(&|r| r.alone.batch), whole),
        spread(&of(&|r| r.alone.postgres_us()), whole),
        spread(&of(&|r| r.alone.server_us()), whole),
        spread(&of(&|r| r.alone.redis_us()), whole),
        spread(&of(&|r| r.alone.machine_busy), percent),
        passed(rounds.iter().all(|r| r.alone.audit_passed)),
    ));
    for (i, (name, other)) in [("A", "B"), ("B", "A")].into_iter().enumerate() {
        table.push_str(&format!(
            "| cell {name}, beside cell {other} | {} | {} | {} | {} | {} | {} | **{}** | {} | **{}** | {} | {} | {} |\n",
            first.clients,
            spread(&of(&|r| r.beside[i].reservations_per_s), rate),
            spread(
                &of(&|r| r.beside[i].reservations_per_s / r.alone.reservations_per_s.max(1e-9)),
                ratio
            ),
            us(median(&of(&|r| r.beside[i].p99_us as f64)) as u64),
            spread(&of(&|r| r.beside[i].batch), whole),
            spread(&of(&|r| r.beside[i].postgres_us()), whole),
            spread(
                &of(&|r| r.beside[i].postgres_us() / r.alone.postgres_us().max(1e-9)),
                ratio
            ),
            spread(&of(&|r| r.beside[i].server_us()), whole),
            spread(
                &of(&|r| r.beside[i].server_us() / r.alone.server_us().max(1e-9)),
                ratio
            ),
            spread(&of(&|r| r.beside[i].redis_us()), whole),
            spread(&of(&|r| r.beside[i].machine_busy), percent),
            passed(rounds.iter().all(|r| r.beside[i].audit_passed)),
        ));
    }
    // Both cells as one: their CPU over their reservations together.
    let together = |r: &Round, f: fn(&CellRun) -> f64| {
        let reservations: u64 = r.beside.iter().map(|c| c.reservations).sum();
        r.beside.iter().map(f).sum::<f64>() / (reservations as f64).max(1.0) * 1e6
    };
    let rate_together = |r: &Round| r.beside.iter().map(|c| c.reservations_per_s).sum::<f64>();
    table.push_str(&format!(
        "| both cells together | {} | {} | **{}** | — | — | {} | **{}** | {} | **{}** | {} | {} | {} |\n",
        first.clients * 2,
        spread(&of(&rate_together), rate),
        spread(
            &of(&|r| rate_together(r) / r.alone.reservations_per_s.max(1e-9)),
            ratio
        ),
        spread(&of(&|r| together(r, |c| c.postgres_s)), whole),
        spread(
            &of(&|r| together(r, |c| c.postgres_s) / r.alone.postgres_us().max(1e-9)),
            ratio
        ),
        spread(&of(&|r| together(r, |c| c.server_s)), whole),
        spread(
            &of(&|r| together(r, |c| c.server_s) / r.alone.server_us().max(1e-9)),
            ratio
        ),
        spread(&of(&|r| together(r, |c| c.redis_s)), whole),
        spread(&of(&|r| r.beside[0].machine_busy), percent),
        passed(rounds.iter().all(Round::audits_passed)),
    ));
    table
}
