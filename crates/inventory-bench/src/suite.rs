//! `make bench`: the raw-SQL ceiling (pgbench running the service's own one-request
//! transaction), the service without coalescing (a lease and a transaction per request) and
//! the service as shipped, at the same concurrency, in one run; for a hot SKU also the
//! batched-SQL ceiling (pgbench running the coalesced transaction with the batch size the
//! service reached); then a table of ratios. Every point is measured in several rounds, the
//! variants' order rotating, and the table gives each figure's median and range. Then
//! [`crate::cells`]: one complete copy of the service alone against two side by side.
//! `BENCH_SECTIONS` picks the parts that run ([`Section`]).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    time::Duration,
};

use anyhow::{Context as _, bail};
use inventory_testkit::{
    free_port,
    postgres::{PgConfig, TemplateDatabases, connect, url},
    server::ServerProcess,
};
use serde::Serialize;
use tokio::process::Command;

use crate::{
    audit, cells,
    load::{self, LoadConfig, Scenario},
    profile::{self, CpuSnapshot, Profile},
    report::{RunResult, Storage, svg, us},
    stats::{median, range},
};

/// The service's one-request Reserve transaction, statement for statement.
const RESERVE_SQL: &str = include_str!("../sql/reserve_one.sql");
/// The service's coalesced transaction for a batch on one SKU: the batched-SQL ceiling.
/// The hold of every row but the abandonment one: nothing expires during a run.
pub(crate) const LONG_HOLD: Duration = Duration::from_secs(3600);
/// The abandonment row's hold: every hold expires during the run and the sweeper returns it.
const ABANDONED_HOLD: Duration = Duration::from_secs(2);

const RESERVE_BATCH_SQL: &str = include_str!("../sql/reserve_batch.sql");

#[derive(Clone, Debug)]
pub struct SuiteConfig {
    /// A role that may create databases; each run gets a fresh one.
    pub database_url: String,
    pub redis_url: String,
    pub server: PathBuf,
    pub pgbench: PathBuf,
    pub duration: Duration,
    pub clients: Vec<usize>,
    pub skus: usize,
    /// Times every point is measured; the table gives the medians.
    pub rounds: usize,
    pub out: PathBuf,
    /// The parts of the suite that run.
    pub sections: Vec<Section>,
}

/// The parts of the suite (`BENCH_SECTIONS`; all of them by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Section {
    /// pgbench's raw-SQL ceiling against the service at each concurrency, with the hot SKU
    /// at several locations, several replicas, abandoned holds, the race and `verify`'s
    /// speed.
    Ratios,
    /// One cell (its own PostgreSQL, Redis and server) alone, against two side by side.
    Cells,
}

impl Section {
    pub const ALL: [Section; 2] = [Section::Ratios, Section::Cells];
}

/// One point of the table (a scenario at a concurrency), measured once per round.
#[derive(Debug, Serialize)]
struct Row {
    scenario: Scenario,
    clients: usize,
    rounds: Vec<Round>,
}

/// Every variant of one point, measured in one round.
#[derive(Debug, Serialize)]
struct Round {
    raw_tps: f64,
    raw_latency_ms: f64,
    lease_only: Measured,
    coalesced: Measured,
    /// Hot SKU only: the coalesced transaction run by pgbench with the service's batch size.
    batched: Option<Batched>,
}

/// The batched-SQL ceiling of a hot-SKU round.
#[derive(Debug, Serialize)]
struct Batched {
    /// Requests per transaction: the mean batch the service reached in the same round.
    batch: usize,
    reservations_per_s: f64,
    /// The service (coalesced) over this ceiling: the number to push toward 1.0.
    coalesced_ratio: f64,
}

#[derive(Clone, Debug, Serialize)]
struct Measured {
    reservations_per_s: f64,
    p99_us: u64,
    ratio_to_raw: f64,
    errors: u64,
    audit_passed: bool,
    /// Mean requests per coalesced transaction, rounded (none without coalesced writes).
    batch: Option<usize>,
    /// CPU µs per reservation of PostgreSQL and of the server(s).
    cpu_us: Option<(f64, f64)>,
    /// CPU µs per reservation of Redis and of the busiest server process.
    fleet_cpu_us: Option<(f64, f64)>,
    /// WAL bytes and rows written per reservation.
    storage: Option<Storage>,
}

impl Measured {
    fn of(result: &RunResult, raw_tps: f64) -> Self {
        let batch = result
            .profile
            .as_ref()
            .map(|p| p.steps.requests_per_transaction.round() as usize)
            .filter(|b| *b >= 1);
        Self {
            reservations_per_s: result.reservations_per_s,
            p99_us: result.latency.p99_us,
            ratio_to_raw: result.reservations_per_s / raw_tps.max(1e-9),
            errors: result.calls - result.reservations,
            audit_passed: result.audit.as_ref().is_some_and(|a| a.passed),
            batch,
            cpu_us: result.profile.as_ref().map(|p| {
                let of = |k: &str| p.cpu_us_per_reservation.get(k).copied().unwrap_or(0.0);
                (of("postgres"), of("server"))
            }),
            fleet_cpu_us: result.profile.as_ref().map(|p| {
                let of = |k: &str| p.cpu_us_per_reservation.get(k).copied().unwrap_or(0.0);
                (of("redis"), of("server (busiest)"))
            }),
            storage: result.storage,
        }
    }
}

/// What a round measures at one point. The order rotates from round to round, so no variant
/// always runs first (on a cold cache) or last (after the others warmed the machine); the
/// batched-SQL ceiling always follows the coalesced run whose batch size it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Raw,
    LeaseOnly,
    Coalesced,
}

impl Variant {
    fn order(round: usize) -> [Self; 3] {
        let mut order = [Self::Raw, Self::LeaseOnly, Self::Coalesced];
        let count = order.len();
        order.rotate_left(round % count);
        order
    }
}

/// The scripts pgbench runs, written into the run's folder.
struct Scripts {
    one: PathBuf,
    batch: PathBuf,
}

pub async fn run(config: SuiteConfig) -> anyhow::Result<bool> {
    std::fs::create_dir_all(&config.out)?;
    let scripts = Scripts {
        one: config.out.join("reserve_one.sql"),
        batch: config.out.join("reserve_batch.sql"),
    };
    std::fs::write(&scripts.one, RESERVE_SQL)?;
    std::fs::write(&scripts.batch, RESERVE_BATCH_SQL)?;
    let databases = TemplateDatabases::new(config.database_url.parse()?);
    let points: Vec<(Scenario, usize)> = [Scenario::Uniform, Scenario::Hot]
        .into_iter()
        .flat_map(|scenario| config.clients.iter().map(move |&c| (scenario, c)))
        .collect();
    let mut rows: Vec<Row> = points
        .iter()
        .map(|&(scenario, clients)| Row {
            scenario,
            clients,
            rounds: Vec::new(),
        })
        .collect();
    let mut located = Vec::new();
    let mut replicated: Vec<Replicated> = Vec::new();
    let mut abandoned: Vec<Abandoned> = Vec::new();
    let mut all_audits_passed = true;
    let mut serial = 0;
    let ratios = config.sections.contains(&Section::Ratios);
    let ratio_rounds = if ratios { config.rounds } else { 0 };
    // Every point once per round, rather than each point's rounds back to back: a slow spell
    // of the machine then falls on several points once, not on one point every time.
    for round in 0..ratio_rounds {
        println!("== round {} of {}", round + 1, config.rounds);
        for row in &mut rows {
            let measured = point(
                &config,
                &databases,
                &scripts,
                &mut serial,
                row.scenario,
                row.clients,
                round,
            )
            .await?;
            all_audits_passed &=
                measured.lease_only.audit_passed && measured.coalesced.audit_passed;
            row.rounds.push(measured);
        }
        // The hot SKU with its stock spread over three locations, every Reserve allowed to
        // split, at the most clients: against the raw one-request transaction and the
        // one-location service of the same round.
        if let Some(hot) = rows
            .iter()
            .filter(|r| r.scenario == Scenario::Hot)
            .max_by_key(|r| r.clients)
        {
            let same_round = hot.rounds.last().expect("measured in this round");
            serial += 1;
            let run = ServiceRun {
                server: &config.server,
                verify: true,
                label: format!("coalesced-hot-{}-3-locations-r{round}", hot.clients),
                serial,
                scenario: Scenario::Hot,
                clients: hot.clients,
                replicas: 1,
                max_batch: 64,
                locations: LOCATIONS,
                ttl: LONG_HOLD,
            };
            let result = service(&config, &databases, run).await?;
            result.print();
            let measured = Measured::of(&result, same_round.raw_tps);
            all_audits_passed &= measured.audit_passed;
            located.push(Located {
                clients: hot.clients,
                locations: LOCATIONS,
                vs_one_location: measured.reservations_per_s
                    / same_round.coalesced.reservations_per_s.max(1e-9),
                measured,
            });
        }
        // Replicas sharing the database and the leases, forwarding each hot SKU's calls to
        // the replica holding its lease, at the most clients: against the one-replica service
        // of the same round.
        let most = config.clients.iter().copied().max().unwrap_or(0);
        for row in rows.iter().filter(|r| r.clients == most) {
            let same_round = row.rounds.last().expect("measured in this round");
            for replicas in REPLICAS {
                serial += 1;
                let run = ServiceRun {
                    server: &config.server,
                    verify: true,
                    label: format!(
                        "coalesced-{:?}-{}-{replicas}-replicas-r{round}",
                        row.scenario, row.clients
                    )
                    .to_lowercase(),
                    serial,
                    scenario: row.scenario,
                    clients: row.clients,
                    replicas,
                    max_batch: 64,
                    locations: 1,
                    ttl: LONG_HOLD,
                };
                let result = service(&config, &databases, run).await?;
                result.print();
                let measured = Measured::of(&result, same_round.raw_tps);
                all_audits_passed &= measured.audit_passed;
                replicated.push(Replicated {
                    scenario: row.scenario,
                    clients: row.clients,
                    replicas,
                    vs_one_replica: measured.reservations_per_s
                        / same_round.coalesced.reservations_per_s.max(1e-9),
                    p99_vs_one_replica: measured.p99_us as f64
                        / (same_round.coalesced.p99_us as f64).max(1.0),
                    measured,
                });
            }
            replicated.push(Replicated {
                scenario: row.scenario,
                clients: row.clients,
                replicas: 1,
                vs_one_replica: 1.0,
                p99_vs_one_replica: 1.0,
                measured: same_round.coalesced.clone(),
            });
        }
        // Abandonment: Zipf at the most clients, every hold expiring, against long holds.
        abandoned.push(abandonment(&config, &databases, &mut serial, most, round).await?);
        all_audits_passed &= abandoned
            .last()
            .is_some_and(|a| a.long.audit_passed && a.expiring.audit_passed);
    }
    if ratios {
        serial += 1;
        let run = ServiceRun {
            server: &config.server,
            verify: true,
            label: "coalesced-race".into(),
            serial,
            scenario: Scenario::Race,
            clients: 64,
            replicas: 1,
            max_batch: 64,
            locations: 1,
            ttl: LONG_HOLD,
        };
        let race = service(&config, &databases, run).await?;
        race.print();
        all_audits_passed &= race.audit.as_ref().is_some_and(|a| a.passed);
        all_audits_passed &= verify_speed(&config, &databases).await?;
    }
    let cell_rounds = if config.sections.contains(&Section::Cells) {
        cells::run(&config, &mut serial).await?
    } else {
        Vec::new()
    };
    all_audits_passed &= cell_rounds.iter().all(cells::Round::audits_passed);

    let mut table = String::new();
    if ratios {
        table.push_str(&format!(
            "{} rounds per point, variants rotating; median (min–max) of each round's figure, \
             ratios within the same round\n\n{}",
            config.rounds,
            self::table(&rows)
        ));
    }
    table.push_str(&located_table(&located));
    table.push_str(&replicated_table(&replicated));
    table.push_str(&abandoned_table(&abandoned));
    table.push_str(&cells::table(&cell_rounds));
    println!("\n{table}");
    std::fs::write(config.out.join("summary.md"), &table)?;
    std::fs::write(
        config.out.join("summary.json"),
        serde_json::to_vec_pretty(&serde_json::json!({
            "rows": rows,
            "located": located,
            "replicated": replicated,
            "abandoned": abandoned,
            "cells": cell_rounds,
        }))?,
    )?;
    println!(
        "results: {} (one JSON and one SVG per run, summary.md, summary.json)",
        config.out.display()
    );
    Ok(all_audits_passed)
}

/// One round of one point: pgbench's one-request transaction, the lease-only and the
/// coalesced service, in this round's order, and for a hot SKU the batched-SQL ceiling.
async fn point(
    config: &SuiteConfig,
    databases: &TemplateDatabases,
    scripts: &Scripts,
    serial: &mut usize,
    scenario: Scenario,
    clients: usize,
    round: usize,
) -> anyhow::Result<Round> {
    let skus = if scenario == Scenario::Hot {
        1
    } else {
        config.skus
    };
    let mut raw_run = None;
    let mut results = Vec::new();
    let mut batched_run = None;
    for variant in Variant::order(round) {
        *serial += 1;
        if variant == Variant::Raw {
            let (tps, latency) = raw(
                config,
                databases,
                &scripts.one,
                *serial,
                skus,
                clients,
                None,
            )
            .await
            .with_context(|| format!("pgbench {scenario:?} {clients}"))?;
            println!(
                "raw SQL  {scenario:?} {clients:>2} clients: {tps:.0} tx/s, mean {latency:.2} ms"
            );
            raw_run = Some((tps, latency));
            continue;
        }
        let (name, max_batch) = match variant {
            Variant::LeaseOnly => ("lease-only", 1),
            _ => ("coalesced", 64),
        };
        let run = ServiceRun {
            server: &config.server,
            verify: true,
            label: format!("{name}-{scenario:?}-{clients}-r{round}").to_lowercase(),
            serial: *serial,
            scenario,
            clients,
            replicas: 1,
            max_batch,
            locations: 1,
            ttl: LONG_HOLD,
        };
        let result = service(config, databases, run).await?;
        result.print();
        if variant == Variant::Coalesced
            && scenario == Scenario::Hot
            && let Some(batch) = Measured::of(&result, 1.0).batch
        {
            *serial += 1;
            let (tps, _) = raw(
                config,
                databases,
                &scripts.batch,
                *serial,
                skus,
                clients,
                Some(batch),
            )
            .await
            .with_context(|| format!("pgbench batched {clients}"))?;
            let reservations_per_s = tps * batch as f64;
            println!(
                "batched SQL  Hot {clients:>2} clients, {batch} per transaction: {reservations_per_s:.0} reservations/s"
            );
            batched_run = Some((batch, reservations_per_s));
        }
        results.push((variant, result));
    }
    let (raw_tps, raw_latency_ms) = raw_run.expect("every round runs pgbench");
    let of = |wanted: Variant| {
        let (_, result) = results
            .iter()
            .find(|(variant, _)| *variant == wanted)
            .expect("every round runs both services");
        Measured::of(result, raw_tps)
    };
    let coalesced = of(Variant::Coalesced);
    let batched = batched_run.map(|(batch, reservations_per_s)| Batched {
        batch,
        reservations_per_s,
        coalesced_ratio: coalesced.reservations_per_s / reservations_per_s.max(1e-9),
    });
    Ok(Round {
        raw_tps,
        raw_latency_ms,
        lease_only: of(Variant::LeaseOnly),
        coalesced,
        batched,
    })
}

/// Locations of the located hot row.
const LOCATIONS: usize = 3;

/// The hot SKU at several locations, split allowed: one round.
#[derive(Debug, Serialize)]
struct Located {
    clients: usize,
    locations: usize,
    /// `ratio_to_raw` is against the raw one-request transaction of the hot row's round.
    measured: Measured,
    /// Over the one-location coalesced service of the same round.
    vs_one_location: f64,
}

/// Server replicas of the replicated rows (besides the one-replica service).
const REPLICAS: [usize; 2] = [3, 6];

/// Several replicas on one scenario: one round.
/// A Zipf round where every hold expires (shoppers abandon their carts) against the same load
/// with long holds, in the same round.
#[derive(Debug, Serialize)]
struct Abandoned {
    clients: usize,
    long: Measured,
    expiring: Measured,
    /// Reservations/s and p99 of the expiring run over the long-hold run's.
    vs_long: f64,
    p99_vs_long: f64,
    oldest_overdue_s: f64,
    /// CPU µs per reservation of PostgreSQL and of the server, long then expiring.
    cpu_us: [(f64, f64); 2],
}

#[derive(Debug, Serialize)]
struct Replicated {
    scenario: Scenario,
    clients: usize,
    replicas: usize,
    /// `ratio_to_raw` is against the raw one-request transaction of the same row's round.
    measured: Measured,
    /// Over the one-replica coalesced service of the same round.
    vs_one_replica: f64,
    p99_vs_one_replica: f64,
}

/// `median (min–max)` of `values`, each printed by `show`.
pub(crate) fn spread(values: &[f64], show: impl Fn(f64) -> String) -> String {
    if values.is_empty() {
        return "—".to_owned();
    }
    let (min, max) = range(values);
    if values.len() == 1 {
        return show(median(values));
    }
    format!("{} ({}–{})", show(median(values)), show(min), show(max))
}

pub(crate) fn rate(value: f64) -> String {
    format!("{value:.0}")
}

pub(crate) fn ratio(value: f64) -> String {
    format!("{value:.2}x")
}

/// The median p99 of `measured`.
fn p99<'a>(measured: impl Iterator<Item = &'a Measured>) -> String {
    let values: Vec<f64> = measured.map(|m| m.p99_us as f64).collect();
    us(median(&values) as u64)
}

fn located_table(rounds: &[Located]) -> String {
    let Some(first) = rounds.first() else {
        return String::new();
    };
    let header = format!(
        "| hot SKU at {} locations, split | clients | coalesced r/s | ratio to raw SQL | p99 | \
         batch | vs one location | audits |",
        first.locations
    );
    let rounds: Vec<_> = rounds
        .iter()
        .map(|l| (&l.measured, l.vs_one_location))
        .collect();
    format!(
        "\n{header}\n|---|---:|---:|---:|---:|---:|---:|---|\n{}",
        extra_line("Hot", first.clients, &rounds)
    )
}

fn replicated_table(rounds: &[Replicated]) -> String {
    let Some(first) = rounds.first() else {
        return String::new();
    };
    let mut table = String::from(
        "\n| replicas (forwarding), one database and Redis | clients | coalesced r/s | \
         ratio to raw SQL | p99 | batch | vs one replica | p99 vs one replica | \
         CPU µs PG / Redis / servers (busiest) | audits |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for scenario in [Scenario::Uniform, Scenario::Hot] {
        for replicas in std::iter::once(1).chain(REPLICAS) {
            let of: Vec<&Replicated> = rounds
                .iter()
                .filter(|r| r.scenario == scenario && r.replicas == replicas)
                .collect();
            if of.is_empty() {
                continue;
            }
            let pairs: Vec<_> = of.iter().map(|r| (&r.measured, r.vs_one_replica)).collect();
            let line = extra_line(&format!("{scenario:?}, {replicas}"), first.clients, &pairs);
            // `extra_line` ends with `| audits |`: the two p99 and CPU columns go before it.
            let (head, audits) = line
                .trim_end()
                .trim_end_matches('|')
                .rsplit_once('|')
                .expect("a table line");
            let p99s: Vec<f64> = of.iter().map(|r| r.p99_vs_one_replica).collect();
            let cpu = |f: fn(&Measured) -> Option<f64>| {
                let values: Vec<f64> = of.iter().filter_map(|r| f(&r.measured)).collect();
                if values.is_empty() {
                    "—".to_owned()
                } else {
                    format!("{:.0}", median(&values))
                }
            };
            table.push_str(&format!(
                "{head}| {} | {} / {} / {} ({}) |{audits}|\n",
                spread(&p99s, ratio),
                cpu(|m| m.cpu_us.map(|c| c.0)),
                cpu(|m| m.fleet_cpu_us.map(|c| c.0)),
                cpu(|m| m.cpu_us.map(|c| c.1)),
                cpu(|m| m.fleet_cpu_us.map(|c| c.1)),
            ));
        }
    }
    table
}

/// One abandonment round: the long-hold and the expiring run, in an order that alternates
/// from round to round.
async fn abandonment(
    config: &SuiteConfig,
    databases: &TemplateDatabases,
    serial: &mut usize,
    clients: usize,
    round: usize,
) -> anyhow::Result<Abandoned> {
    let mut results: [Option<RunResult>; 2] = [None, None];
    let order = if round.is_multiple_of(2) {
        [0, 1]
    } else {
        [1, 0]
    };
    for side in order {
        *serial += 1;
        let (name, ttl) = match side {
            0 => ("long-holds", LONG_HOLD),
            _ => ("abandoned", ABANDONED_HOLD),
        };
        let run = ServiceRun {
            server: &config.server,
            verify: true,
            label: format!("coalesced-zipf-{clients}-{name}-r{round}"),
            serial: *serial,
            scenario: Scenario::Zipf,
            clients,
            replicas: 1,
            max_batch: 64,
            locations: 1,
            ttl,
        };
        let result = service(config, databases, run).await?;
        result.print();
        results[side] = Some(result);
    }
    let [Some(long), Some(expiring)] = results else {
        unreachable!("both sides ran");
    };
    let cpu = |r: &RunResult| {
        r.profile.as_ref().map_or((0.0, 0.0), |p| {
            let of = |k: &str| p.cpu_us_per_reservation.get(k).copied().unwrap_or(0.0);
            (of("postgres"), of("server"))
        })
    };
    // Against the raw rate is not what this row asks: its ratios are to the long-hold run.
    let (long_m, expiring_m) = (Measured::of(&long, 1.0), Measured::of(&expiring, 1.0));
    Ok(Abandoned {
        clients,
        vs_long: expiring_m.reservations_per_s / long_m.reservations_per_s.max(1e-9),
        p99_vs_long: expiring_m.p99_us as f64 / (long_m.p99_us as f64).max(1.0),
        oldest_overdue_s: expiring.oldest_overdue_s.unwrap_or(f64::NAN),
        cpu_us: [cpu(&long), cpu(&expiring)],
        long: long_m,
        expiring: expiring_m,
    })
}

/// Samples, every 200 ms until told to stop, how long the oldest hold past its expiry has
/// waited for a sweep; answers the longest.
fn overdue_sampler(
    db_config: PgConfig,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<anyhow::Result<f64>>,
) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let sampler = tokio::spawn(async move {
        let db = connect(&db_config).await?;
        let mut longest: f64 = 0.0;
        loop {
            let waited: f64 = db
                .query_one(
                    "SELECT coalesce(extract(epoch FROM clock_timestamp() - min(expires_at))::float8, 0)
                     FROM reservations WHERE state = 'HELD' AND expires_at <= clock_timestamp()",
                    &[],
                )
                .await?
                .get(0);
            longest = longest.max(waited);
            tokio::select! {
                _ = &mut stopped => return Ok(longest),
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    });
    (stop, sampler)
}

fn abandoned_table(rounds: &[Abandoned]) -> String {
    let Some(first) = rounds.first() else {
        return String::new();
    };
    let of = |f: fn(&Abandoned) -> f64| rounds.iter().map(f).collect::<Vec<_>>();
    let cpu = |side: usize| {
        let pg: Vec<f64> = rounds.iter().map(|a| a.cpu_us[side].0).collect();
        let server: Vec<f64> = rounds.iter().map(|a| a.cpu_us[side].1).collect();
        format!("{:.0} / {:.0}", median(&pg), median(&server))
    };
    format!(
        "\n| Zipf, every hold expires ({}s) | clients | long-hold r/s | expiring r/s | vs long holds | \
         p99 long | p99 expiring | p99 vs long | oldest overdue | CPU µs PG / server (long, expiring) | audits |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|\n\
         | Zipf | {} | {} | {} | **{}** | {} | {} | **{}** | {} | {}, {} | {} |\n",
        ABANDONED_HOLD.as_secs(),
        first.clients,
        spread(&of(|a| a.long.reservations_per_s), rate),
        spread(&of(|a| a.expiring.reservations_per_s), rate),
        spread(&of(|a| a.vs_long), ratio),
        p99(rounds.iter().map(|a| &a.long)),
        p99(rounds.iter().map(|a| &a.expiring)),
        spread(&of(|a| a.p99_vs_long), ratio),
        spread(&of(|a| a.oldest_overdue_s), |s| format!("{s:.1}s")),
        cpu(0),
        cpu(1),
        if rounds
            .iter()
            .all(|a| a.long.audit_passed && a.expiring.audit_passed)
        {
            "passed"
        } else {
            "FAILED"
        },
    )
}

/// One line of a table beside the main one: each round's measurement and its ratio to the
/// main table's coalesced run of the same round.
fn extra_line(name: &str, clients: usize, rounds: &[(&Measured, f64)]) -> String {
    let of = |f: fn(&(&Measured, f64)) -> f64| rounds.iter().map(f).collect::<Vec<_>>();
    let batches: Vec<f64> = rounds
        .iter()
        .filter_map(|(m, _)| m.batch.map(|b| b as f64))
        .collect();
    format!(
        "| {name} | {clients} | {} | **{}** | {} | {} | {} | {} |\n",
        spread(&of(|(m, _)| m.reservations_per_s), rate),
        spread(&of(|(m, _)| m.ratio_to_raw), ratio),
        p99(rounds.iter().map(|(m, _)| *m)),
        if batches.is_empty() {
            "—".to_owned()
        } else {
            rate(median(&batches))
        },
        spread(&of(|(_, vs)| *vs), ratio),
        if rounds.iter().all(|(m, _)| m.audit_passed) {
            "passed"
        } else {
            "FAILED"
        },
    )
}

fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| scenario | clients | raw SQL tx/s | lease-only r/s | ratio | p99 | coalesced r/s | ratio | p99 | batched SQL r/s (batch) | coalesced / batched SQL | coalesced CPU µs PG / server | coalesced WAL B / rows | audits |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for row in rows {
        let of = |f: fn(&Round) -> f64| row.rounds.iter().map(f).collect::<Vec<_>>();
        let batched: Vec<&Batched> = row
            .rounds
            .iter()
            .filter_map(|r| r.batched.as_ref())
            .collect();
        let batched_rate = if batched.is_empty() {
            "—".to_owned()
        } else {
            let batches: Vec<f64> = batched.iter().map(|b| b.batch as f64).collect();
            let rates: Vec<f64> = batched.iter().map(|b| b.reservations_per_s).collect();
            format!("{} ({})", rate(median(&rates)), rate(median(&batches)))
        };
        let ceiling: Vec<f64> = batched.iter().map(|b| b.coalesced_ratio).collect();
        let audits = row
            .rounds
            .iter()
            .all(|r| r.lease_only.audit_passed && r.coalesced.audit_passed);
        out.push_str(&format!(
            "| {:?} | {} | {} | {} | {} | {} | {} | **{}** | {} | {} | {} | {} | {} | {} |\n",
            row.scenario,
            row.clients,
            spread(&of(|r| r.raw_tps), rate),
            spread(&of(|r| r.lease_only.reservations_per_s), rate),
            spread(&of(|r| r.lease_only.ratio_to_raw), ratio),
            p99(row.rounds.iter().map(|r| &r.lease_only)),
            spread(&of(|r| r.coalesced.reservations_per_s), rate),
            spread(&of(|r| r.coalesced.ratio_to_raw), ratio),
            p99(row.rounds.iter().map(|r| &r.coalesced)),
            batched_rate,
            if ceiling.is_empty() {
                "—".to_owned()
            } else {
                format!("**{}**", spread(&ceiling, ratio))
            },
            coalesced_cpu(&row.rounds),
            coalesced_writes(&row.rounds),
            if audits { "passed" } else { "FAILED" }
        ));
    }
    out
}

/// The coalesced runs' CPU per reservation, PostgreSQL / server (medians of the rounds).
fn coalesced_cpu(rounds: &[Round]) -> String {
    let cpu: Vec<(f64, f64)> = rounds.iter().filter_map(|r| r.coalesced.cpu_us).collect();
    if cpu.is_empty() {
        return "—".to_owned();
    }
    let pg: Vec<f64> = cpu.iter().map(|c| c.0).collect();
    let server: Vec<f64> = cpu.iter().map(|c| c.1).collect();
    format!("{:.0} / {:.0}", median(&pg), median(&server))
}

/// The coalesced runs' WAL bytes / rows written per reservation (medians of the rounds).
fn coalesced_writes(rounds: &[Round]) -> String {
    let storage: Vec<Storage> = rounds.iter().filter_map(|r| r.coalesced.storage).collect();
    if storage.is_empty() {
        return "—".to_owned();
    }
    let wal: Vec<f64> = storage
        .iter()
        .map(|s| s.wal_per_reservation as f64)
        .collect();
    let rows: Vec<f64> = storage.iter().map(|s| s.tuples_per_reservation).collect();
    format!("{:.0} / {:.1}", median(&wal), median(&rows))
}

fn host(config: &tokio_postgres::Config) -> String {
    match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
        _ => "127.0.0.1".into(),
    }
}

/// Connections the batched-SQL ceiling runs on: as the service writes a SKU's batches, one
/// transaction executing while the one before commits. More, all on the one SKU's row, only
/// queue on its lock: at 64 they made less than the service itself.
const BATCHED_CONNECTIONS: usize = 2;

/// pgbench with the service's transaction (with `batch`, the batched one of that many
/// requests): (transactions/s, mean latency in ms). The one-request transaction runs on as
/// many connections as there are clients; the batched one on [`BATCHED_CONNECTIONS`].
async fn raw(
    config: &SuiteConfig,
    databases: &TemplateDatabases,
    script: &Path,
    serial: usize,
    skus: usize,
    clients: usize,
    batch: Option<usize>,
) -> anyhow::Result<(f64, f64)> {
    let name = format!("bench_raw_{serial}_{}", batch.unwrap_or(1));
    let db_config = databases.create(&name).await?;
    let db = connect(&db_config).await?;
    db.execute(
        "INSERT INTO stock (sku, on_hand) SELECT 'P-' || g, 1000000000 FROM generate_series(0, $1::int - 1) g",
        &[&(skus as i32)],
    )
    .await?;
    db.execute(
        "INSERT INTO stock_locations (sku, location_id, on_hand, version)
         SELECT sku, 'default', on_hand, version FROM stock",
        &[],
    )
    .await?;
    db.batch_execute("VACUUM ANALYZE").await?;
    let host = host(&db_config);
    let clients = if batch.is_some() {
        clients.min(BATCHED_CONNECTIONS)
    } else {
        clients
    };
    let pgbench = Command::new(&config.pgbench)
        .args(["-n", "-M", "prepared", "-h", &host])
        .args(["-p", &db_config.get_ports()[0].to_string()])
        .args(["-U", db_config.get_user().unwrap_or("postgres")])
        .args(["-c", &clients.to_string()])
        .args(["-j", &clients.min(2).to_string()])
        .args(["-T", &config.duration.as_secs().max(1).to_string()])
        .args(["-D", &format!("skus={skus}")])
        .args(["-D", &format!("batch={}", batch.unwrap_or(1))])
        .arg("-f")
        .arg(script)
        .arg(&name)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("run pgbench")?;
    // CPU over the middle of the run, while every pgbench connection is alive.
    let window = config.duration.saturating_sub(Duration::from_secs(2));
    let mut cpu = None;
    if !window.is_zero() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = CpuSnapshot::take();
        tokio::time::sleep(window).await;
        cpu = Some(CpuSnapshot::take().since(&before));
    }
    let output = pgbench.wait_with_output().await?;
    drop(db);
    databases.drop_database(&name).await?;
    let text = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        bail!("pgbench failed:\n{text}");
    }
    let number_after = |prefix: &str| -> Option<f64> {
        text.lines()
            .find_map(|line| line.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
    };
    let tps = number_after("tps = ").context("no tps in pgbench output")?;
    let latency = number_after("latency average = ").unwrap_or(f64::NAN);
    if let Some(cpu) = cpu {
        let seconds = window.as_secs_f64();
        // Per reservation: a batched transaction makes `batch` of them.
        let reservations = tps * seconds * batch.unwrap_or(1) as f64;
        Profile::new(cpu, seconds, reservations, profile::Steps::default()).print();
    }
    Ok((tps, latency))
}

/// One measured run of a service binary.
#[derive(Debug)]
pub(crate) struct ServiceRun<'a> {
    pub server: &'a Path,
    /// Run `server verify` on the database afterwards (a binary without the ledger cannot).
    pub verify: bool,
    pub label: String,
    /// Tells the run's database, Redis keys and seed apart from every other run's.
    pub serial: usize,
    pub scenario: Scenario,
    pub clients: usize,
    /// Server processes sharing the database and the Redis keys; the load's connections go
    /// to each in turn.
    pub replicas: usize,
    /// `COALESCE_MAX_BATCH`: 1 is the lease-only service, 64 the service as shipped.
    pub max_batch: usize,
    /// Locations the stock is spread over; with more than one, every Reserve may split.
    pub locations: usize,
    /// The hold each Reserve asks for; below [`audit::EXPIRING`] every hold expires during
    /// the run, and the run records how long the oldest overdue hold waited.
    pub ttl: Duration,
}

/// Every replica's `/metrics` page, one after the other: the step timings are then the
/// fleet's (their histograms add up).
pub(crate) async fn scrape_all(admin_addrs: &[std::net::SocketAddr]) -> String {
    let mut pages = String::new();
    for addr in admin_addrs {
        pages.push_str(&profile::scrape(*addr).await);
        pages.push('\n');
    }
    pages
}

/// What the bench's replicas sign forwarded calls with.
const PEER_SECRET: &str = "the benchmark's peer secret, 32+ bytes long";

/// The environment of one bench replica of tenant `default` with authentication off: its
/// database, its Redis and the key prefix it shares with the other replicas, a pool of
/// `clients` connections (at least 16: as many as pgbench gets, so the comparison is like for
/// like), and the coalescing limit.
pub(crate) fn server_env(
    database_url: String,
    redis_url: String,
    key_prefix: String,
    admin_addr: std::net::SocketAddr,
    clients: usize,
    max_batch: usize,
) -> anyhow::Result<Vec<(String, String)>> {
    let env = [
        ("DATABASE_URL", database_url),
        ("REDIS_URL", redis_url),
        ("REDIS_KEY_PREFIX", key_prefix),
        ("ADMIN_LISTEN_ADDR", admin_addr.to_string()),
        ("AUTH_DISABLED", "true".into()),
        ("TENANTS", "default".into()),
        ("DATABASE_POOL_SIZE", clients.max(16).to_string()),
        ("COALESCE_MAX_BATCH", max_batch.to_string()),
        // Forwarding on, as deployed: a hot SKU's calls go to the replica holding its lease
        // (with one replica, nobody else ever holds it).
        ("PEER_LISTEN_ADDR", format!("127.0.0.1:{}", free_port()?)),
        ("PEER_SECRET", PEER_SECRET.into()),
        ("RUST_LOG", "warn".into()),
    ];
    Ok(env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
}

/// The service under load: a fresh database, its own server process, then the audit.
pub(crate) async fn service(
    config: &SuiteConfig,
    databases: &TemplateDatabases,
    run: ServiceRun<'_>,
) -> anyhow::Result<RunResult> {
    let ServiceRun {
        server: binary,
        verify,
        label,
        serial,
        scenario,
        clients,
        replicas,
        max_batch,
        locations,
        ttl,
    } = run;
    let label = label.as_str();
    let name = format!("bench_service_{serial}_{max_batch}");
    let db_config = databases.create(&name).await?;
    let replicas = replicas.max(1);
    let mut servers = Vec::with_capacity(replicas);
    let mut admin_addrs = Vec::with_capacity(replicas);
    for replica in 0..replicas {
        let admin_addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        // One prefix for every replica: they share the leases, as in a deployment.
        let env = server_env(
            url(&db_config),
            config.redis_url.clone(),
            format!("bench:{name}"),
            admin_addr,
            clients.div_ceil(replicas),
            max_batch,
        )?;
        let log = if replicas == 1 {
            config.out.join(format!("{label}.server.log"))
        } else {
            config.out.join(format!("{label}.server-{replica}.log"))
        };
        servers.push(ServerProcess::start(binary, env, log).await?);
        admin_addrs.push(admin_addr);
    }
    let addr = servers
        .iter()
        .map(ServerProcess::addr)
        .collect::<Vec<_>>()
        .join(",");
    let outcome = async {
        let load = LoadConfig {
            addr: addr.clone(),
            scenario,
            clients,
            // The same number of connections to every replica.
            connections: clients.clamp(1, 4).div_ceil(replicas) * replicas,
            duration: config.duration,
            quantity: 1,
            ttl,
            skus: config.skus,
            stock: match scenario {
                Scenario::Race => 1_000,
                Scenario::Hot => 1_000_000_000,
                _ => 1_000_000,
            },
            zipf_exponent: 1.1,
            shoppers: 5_000,
            confirm_share: 0.3,
            release_share: 0.3,
            run_id: format!("s{serial}x{max_batch}"),
            token: None,
            seed: serial as u64,
            locations,
        };
        let prepared = load::prepare(load.clone()).await?;
        let wal_before = wal_position(&db_config).await?;
        let tuples_before = tuples_written(&db_config).await?;
        let (cpu, page) = (CpuSnapshot::take(), scrape_all(&admin_addrs).await);
        let sampling = (ttl < audit::EXPIRING).then(|| overdue_sampler(db_config.clone()));
        let observed = load::drive(prepared).await?;
        let cpu = CpuSnapshot::take().since(&cpu);
        let oldest_overdue_s = match sampling {
            Some((stop, sampler)) => {
                let _ = stop.send(());
                Some(sampler.await??)
            }
            None => None,
        };
        let steps = profile::steps(&page, &scrape_all(&admin_addrs).await);
        let mut audit = audit::audit(&load, &observed, Some(&url(&db_config))).await?;
        if verify {
            audit.verify_ledger(binary, &url(&db_config)).await?;
        }
        let storage = storage(label, &db_config, &wal_before, tuples_before).await?;
        let mut result = RunResult::new(label, scenario, clients, &observed, Some(audit));
        result.storage = storage;
        result.oldest_overdue_s = oldest_overdue_s;
        result.profile = Some(Profile::new(
            cpu,
            observed.elapsed.as_secs_f64(),
            observed.held.len() as f64,
            steps,
        ));
        std::fs::write(
            config.out.join(format!("{label}.json")),
            serde_json::to_vec_pretty(&result)?,
        )?;
        std::fs::write(config.out.join(format!("{label}.svg")), svg(&result))?;
        Ok::<_, anyhow::Error>(result)
    }
    .await;
    // SIGTERM and wait, like an orchestrator would.
    for server in &mut servers {
        server.stop(Duration::from_secs(30)).await;
    }
    databases.drop_database(&name).await?;
    outcome
}

/// SKUs and movements per SKU of the verify measurement.
const VERIFY_SKUS: i64 = 100_000;
const VERIFY_MOVEMENTS_PER_SKU: i64 = 10;
/// What `verify` must reach, in SKUs per second.
const VERIFY_TARGET: f64 = 10_000.0;

/// `inventory-server verify` over a ledger of 100,000 SKUs with 10 movements each, against a
/// bare scan of the same movements (the floor any verifier pays). `Ok(false)`: verify found
/// drift where there is none.
async fn verify_speed(config: &SuiteConfig, databases: &TemplateDatabases) -> anyhow::Result<bool> {
    let name = "bench_verify";
    let db_config = databases.create(name).await?;
    let db = connect(&db_config).await?;
    // Each SKU: an opening of 10 units, then 9 adjustments of +10, so 100 on hand at version 10.
    db.execute(
        "INSERT INTO stock (sku, on_hand, reserved, version)
         SELECT 'V-' || g, 10 * $2::bigint, 0, $2::bigint FROM generate_series(1, $1::bigint) g",
        &[&VERIFY_SKUS, &VERIFY_MOVEMENTS_PER_SKU],
    )
    .await?;
    db.execute(
        "INSERT INTO stock_locations (sku, location_id, on_hand, reserved, version)
         SELECT sku, 'default', on_hand, reserved, version FROM stock",
        &[],
    )
    .await?;
    db.execute(
        "INSERT INTO stock_movements
             (sku, version, kind, on_hand_delta, reserved_delta, on_hand, reserved)
         SELECT 'V-' || g, v, CASE WHEN v = 1 THEN 'OPENING' ELSE 'ADJUSTED' END, 10, 0, 10 * v, 0
         FROM generate_series(1, $1::bigint) g, generate_series(1, $2::bigint) v",
        &[&VERIFY_SKUS, &VERIFY_MOVEMENTS_PER_SKU],
    )
    .await?;
    db.batch_execute("VACUUM ANALYZE").await?;
    let started = std::time::Instant::now();
    db.query_one(
        "SELECT count(*), sum(on_hand_delta) FROM stock_movements",
        &[],
    )
    .await?;
    let scan = started.elapsed().as_secs_f64();
    let started = std::time::Instant::now();
    let (verified, report) =
        inventory_testkit::server::verify(&config.server, &url(&db_config)).await?;
    let seconds = started.elapsed().as_secs_f64();
    drop(db);
    databases.drop_database(name).await?;
    let rate = VERIFY_SKUS as f64 / seconds;
    println!(
        "verify: {VERIFY_SKUS} SKUs, {} movements in {seconds:.2} s (process included): {rate:.0} SKUs/s, \
         {:.2}x the target of {VERIFY_TARGET:.0}/s; a bare scan of the movements takes {scan:.2} s \
         ({:.1}x as long as verify) — {}",
        VERIFY_SKUS * VERIFY_MOVEMENTS_PER_SKU,
        rate / VERIFY_TARGET,
        seconds / scan.max(1e-9),
        if verified {
            "no drift, as seeded"
        } else {
            "DRIFT REPORTED"
        }
    );
    if !verified {
        println!("{report}");
    }
    Ok(verified)
}

async fn wal_position(config: &PgConfig) -> anyhow::Result<String> {
    let db = connect(config).await?;
    Ok(db
        .query_one("SELECT pg_current_wal_lsn()::text", &[])
        .await?
        .get(0))
}

/// What one reservation costs on disk after the run: every table and index it writes
/// (reservation, lines, idempotency record, events, stock movements), and the WAL the run
/// wrote, each divided by the reservations made. The run is the cluster's only writer, so the
/// WAL is its own.
async fn storage(
    label: &str,
    config: &PgConfig,
    wal_before: &str,
    tuples_before: i64,
) -> anyhow::Result<Option<Storage>> {
    let tuples = tuples_written(config).await? - tuples_before;
    let db = connect(config).await?;
    db.batch_execute("CHECKPOINT").await?;
    let row = db
        .query_one(
            "SELECT (SELECT count(*) FROM reservations),
                    (SELECT coalesce(sum(pg_total_relation_size(t)), 0)::bigint FROM unnest(ARRAY[
                        'reservations', 'reservation_lines', 'idempotency_keys', 'outbox',
                        'stock_movements'
                    ]::regclass[]) AS t),
                    pg_wal_lsn_diff(pg_current_wal_lsn(), $1::text::pg_lsn)::bigint",
            &[&wal_before],
        )
        .await?;
    let (reservations, bytes, wal): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    if reservations == 0 {
        return Ok(None);
    }
    let storage = Storage {
        reservations,
        bytes_per_reservation: bytes / reservations,
        wal_per_reservation: wal / reservations,
        tuples_per_reservation: tuples as f64 / reservations as f64,
    };
    println!(
        "storage after {label}: {reservations} reservations, {} bytes each on disk (tables and indexes), {} bytes of WAL and {:.1} rows written each",
        storage.bytes_per_reservation, storage.wal_per_reservation, storage.tuples_per_reservation
    );
    Ok(Some(storage))
}

/// Rows the database of `config` wrote so far: inserted, updated and deleted, every table.
/// A backend reports its counts within a second of going idle (PostgreSQL's statistics are
/// flushed at most once a second), so this reads until two reads 1.1 s apart agree.
async fn tuples_written(config: &PgConfig) -> anyhow::Result<i64> {
    let db = connect(config).await?;
    let read = async || -> anyhow::Result<i64> {
        // A new snapshot of the statistics each time, not the transaction's cached one.
        db.batch_execute("SELECT pg_stat_clear_snapshot()").await?;
        Ok(db
            .query_one(
                "SELECT (tup_inserted + tup_updated + tup_deleted)::bigint
                 FROM pg_stat_database WHERE datname = current_database()",
                &[],
            )
            .await?
            .get(0))
    };
    let mut last = read().await?;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let now = read().await?;
        if now == last {
            break;
        }
        last = now;
    }
    Ok(last)
}
