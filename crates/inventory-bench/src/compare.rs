//! `make bench-compare BASELINE=<rev>`: the service as built now against the service of an
//! earlier revision, on the same machine in the same run, as ratios.
//!
//! One run of each side is noisy on a shared machine (the disk's fsync latency alone swings
//! runs by tens of percent), so every cell is measured `rounds` times with the two sides
//! alternating, ABBA (A B, then B A, ...), so that drift over the run (a checkpoint, a warm
//! cache, another tenant) falls on both sides alike. The table gives each side's median with
//! its range, the ratio of the medians, and the median of the per-round ratios with its range:
//! a change is within noise when that range straddles the ratio it is tested against.

use std::path::PathBuf;

use clap::ValueEnum;
use inventory_testkit::postgres::TemplateDatabases;
use serde::Serialize;

use crate::{
    load::Scenario,
    report::{RunResult, us},
    stats::{median, range},
    suite::{self, ServiceRun, SuiteConfig},
};

/// How the service runs: as shipped, or without coalescing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// `COALESCE_MAX_BATCH=64`, the service as shipped.
    Coalesced,
    /// `COALESCE_MAX_BATCH=1`: a lease and a transaction per request.
    LeaseOnly,
}

impl Variant {
    fn max_batch(self) -> usize {
        match self {
            Self::Coalesced => 64,
            Self::LeaseOnly => 1,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Coalesced => "coalesced",
            Self::LeaseOnly => "lease-only",
        }
    }
}

#[derive(Clone, Debug)]
pub struct CompareConfig {
    /// The candidate is `suite.server`; databases, Redis, duration and clients come from here.
    pub suite: SuiteConfig,
    /// The binary of the earlier revision.
    pub baseline: PathBuf,
    pub rounds: usize,
    pub variants: Vec<Variant>,
    pub scenarios: Vec<Scenario>,
    /// Server replicas of every run, sharing the database and the leases.
    pub replicas: usize,
}

/// One side's runs of one cell.
#[derive(Debug, Default, Serialize)]
struct Side {
    reservations_per_s: Vec<f64>,
    p99_us: Vec<u64>,
    wal_per_reservation: Vec<i64>,
    bytes_per_reservation: Vec<i64>,
    audits_passed: bool,
}

impl Side {
    fn push(&mut self, result: &RunResult) {
        self.reservations_per_s.push(result.reservations_per_s);
        self.p99_us.push(result.latency.p99_us);
        if let Some(storage) = result.storage {
            self.wal_per_reservation.push(storage.wal_per_reservation);
            self.bytes_per_reservation
                .push(storage.bytes_per_reservation);
        }
        self.audits_passed &= result.audit.as_ref().is_some_and(|a| a.passed);
    }
}

#[derive(Debug, Serialize)]
struct Cell {
    scenario: Scenario,
    clients: usize,
    variant: Variant,
    baseline: Side,
    candidate: Side,
    /// Candidate over baseline, round by round.
    ratios: Vec<f64>,
}

/// `Ok(false)`: an audit failed.
pub async fn run(config: CompareConfig) -> anyhow::Result<bool> {
    let suite = &config.suite;
    std::fs::create_dir_all(&suite.out)?;
    let databases = TemplateDatabases::new(suite.database_url.parse()?);
    let mut cells = Vec::new();
    let mut serial = 0;
    for &scenario in &config.scenarios {
        for &clients in &suite.clients {
            for &variant in &config.variants {
                let mut cell = Cell {
                    scenario,
                    clients,
                    variant,
                    baseline: Side {
                        audits_passed: true,
                        ..Side::default()
                    },
                    candidate: Side {
                        audits_passed: true,
                        ..Side::default()
                    },
                    ratios: Vec::new(),
                };
                for round in 0..config.rounds {
                    let mut this_round = [0.0; 2];
                    // ABBA: the side that goes first alternates round by round.
                    let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
                    for side in order {
                        serial += 1;
                        let (name, server) = match side {
                            0 => ("baseline", &config.baseline),
                            _ => ("candidate", &suite.server),
                        };
                        let run = ServiceRun {
                            server,
                            // The baseline may predate `verify`; the candidate is checked.
                            verify: side == 1,
                            label: format!(
                                "{name}-{}-{scenario:?}-{clients}-{}-replicas-r{round}",
                                variant.name(),
                                config.replicas
                            )
                            .to_lowercase(),
                            serial,
                            scenario,
                            clients,
                            replicas: config.replicas,
                            max_batch: variant.max_batch(),
                            locations: 1,
                            ttl: suite::LONG_HOLD,
                        };
                        let result = suite::service(suite, &databases, run).await?;
                        result.print();
                        this_round[side] = result.reservations_per_s;
                        match side {
                            0 => cell.baseline.push(&result),
                            _ => cell.candidate.push(&result),
                        }
                    }
                    cell.ratios.push(this_round[1] / this_round[0].max(1e-9));
                }
                println!("{}", row(&cell));
                cells.push(cell);
            }
        }
    }
    let table = table(&config, &cells);
    println!("\n{table}");
    std::fs::write(suite.out.join("compare.md"), &table)?;
    std::fs::write(
        suite.out.join("compare.json"),
        serde_json::to_vec_pretty(&cells)?,
    )?;
    println!(
        "results: {} (one JSON and one SVG per run, compare.md, compare.json)",
        suite.out.display()
    );
    Ok(cells
        .iter()
        .all(|c| c.baseline.audits_passed && c.candidate.audits_passed))
}

fn rate(side: &Side) -> String {
    let (min, max) = range(&side.reservations_per_s);
    format!(
        "{:.0} ({min:.0}–{max:.0})",
        median(&side.reservations_per_s)
    )
}

fn row(cell: &Cell) -> String {
    let (low, high) = range(&cell.ratios);
    let p99 = |side: &Side| {
        let values: Vec<f64> = side.p99_us.iter().map(|&v| v as f64).collect();
        us(median(&values) as u64)
    };
    let wal = |side: &Side| {
        let values: Vec<f64> = side.wal_per_reservation.iter().map(|&v| v as f64).collect();
        format!("{:.0}", median(&values))
    };
    format!(
        "| {:?} | {} | {} | {} | {} | {:.2}x | **{:.2}x** ({low:.2}–{high:.2}) | {} / {} | {} / {} | {} |",
        cell.scenario,
        cell.clients,
        cell.variant.name(),
        rate(&cell.baseline),
        rate(&cell.candidate),
        median(&cell.candidate.reservations_per_s) / median(&cell.baseline.reservations_per_s),
        median(&cell.ratios),
        p99(&cell.baseline),
        p99(&cell.candidate),
        wal(&cell.baseline),
        wal(&cell.candidate),
        if cell.baseline.audits_passed && cell.candidate.audits_passed {
            "passed"
        } else {
            "FAILED"
        }
    )
}

fn table(config: &CompareConfig, cells: &[Cell]) -> String {
    let mut out = format!(
        "baseline: {}\ncandidate: {}\n{} rounds per cell, sides alternating ABBA, {} s per run, \
         {} server replica(s) per run\n\n\
         | scenario | clients | variant | baseline r/s median (range) | candidate r/s median (range) | ratio of medians | per-round ratio median (range) | p99 baseline / candidate | WAL bytes per reservation baseline / candidate | audits |\n\
         |---|---:|---|---:|---:|---:|---:|---:|---:|---|\n",
        config.baseline.display(),
        config.suite.server.display(),
        config.rounds,
        config.suite.duration.as_secs(),
        config.replicas,
    );
    for cell in cells {
        out.push_str(&row(cell));
        out.push('\n');
    }
    out
}
