//! `inventory-chaos`: runs the fault suite against real `inventory-server` processes, one
//! topology after another, and exits non-zero unless the checker passes every run.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use inventory_chaos::{
    run::{self, RunConfig},
    tenants::TENANTS,
    topology::Topology,
};
use inventory_testkit::postgres::Postgres;

#[derive(Debug, Parser)]
#[command(
    name = "inventory-chaos",
    version,
    about = "Fault suite for inventory-server"
)]
struct Cli {
    /// Topologies to run, one after another: the Redis layouts, `pg-failover` (PostgreSQL
    /// failing over, one Redis instance), and on request `rolling-upgrade` (from
    /// `--previous-server` to `--server`, under the faults of `single`).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = Topology::ALL)]
    topologies: Vec<Topology>,
    /// How long the load and the faults run, per topology.
    #[arg(long, env = "CHAOS_DURATION", default_value = "3m", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Seeds the fault schedule and the clients' choices; a random one when not given.
    #[arg(long, env = "CHAOS_SEED")]
    seed: Option<u64>,
    /// The `inventory-server` binary (default: next to this one).
    #[arg(long, env = "INVENTORY_SERVER_BIN")]
    server: Option<PathBuf>,
    /// The previous release's `inventory-server`, for `rolling-upgrade` (which starts on it and
    /// rolls to `--server`).
    #[arg(long, env = "INVENTORY_PREVIOUS_SERVER_BIN")]
    previous_server: Option<PathBuf>,
    /// Where logs, histories and reports go.
    #[arg(long, default_value = "target/chaos")]
    out: PathBuf,
    /// Concurrent shoppers.
    #[arg(long, default_value_t = 12)]
    clients: usize,
    #[arg(long, default_value_t = 6)]
    skus: usize,
    /// Units each SKU starts with; a SKU running low is restocked by half of it.
    #[arg(long, default_value_t = 40)]
    stock: i64,
    /// The tenants the replicas serve, each with the same SKU names and a reserver and an
    /// admin of its own; the shoppers are dealt to them in turn, and the checker runs per
    /// tenant. `rolling-upgrade` serves `default` alone.
    #[arg(long, value_delimiter = ',', default_values_t = TENANTS.map(String::from))]
    tenants: Vec<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run_all(cli).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

async fn run_all(cli: Cli) -> anyhow::Result<bool> {
    let seed = cli.seed.unwrap_or_else(rand::random);
    let server = match cli.server {
        Some(server) => server,
        None => std::env::current_exe()?.with_file_name("inventory-server"),
    };
    anyhow::ensure!(
        server.exists(),
        "no inventory-server at {} (build it, or pass --server)",
        server.display()
    );
    if cli.topologies.iter().any(|t| t.rolls()) {
        let previous = cli.previous_server.as_ref().context(
            "rolling-upgrade needs the previous release: --previous-server (make chaos builds it)",
        )?;
        anyhow::ensure!(
            previous.exists(),
            "no previous release at {}",
            previous.display()
        );
    }
    std::fs::create_dir_all(&cli.out)?;
    let out = std::fs::canonicalize(&cli.out)?;
    eprintln!(
        "chaos: seed {seed}, {:?} per topology, output in {}",
        cli.duration,
        out.display()
    );
    // One instance for every topology but the one that brings its own formation.
    let postgres = if cli.topologies.iter().any(|t| !t.fails_over()) {
        Some(
            Postgres::start(&out.join("postgres"))
                .await
                .context("start PostgreSQL")?,
        )
    } else {
        None
    };
    let mut all_passed = true;
    let mut outcome = Ok(());
    for topology in cli.topologies {
        let config = RunConfig {
            topology,
            seed,
            duration: cli.duration,
            server: server.clone(),
            previous: cli.previous_server.clone(),
            out: out.join(topology.name()),
            clients: cli.clients,
            skus: cli.skus,
            stock: cli.stock,
            tenants: cli.tenants.clone(),
        };
        eprintln!("chaos {}: starting", topology.name());
        match run::run(&config, postgres.as_ref()).await {
            Ok(report) => {
                print!("{}", report.summary());
                println!("report: {}", config.out.join("report.txt").display());
                all_passed &= report.passed;
            }
            Err(error) => {
                outcome = Err(error.context(format!(
                    "the {} run could not complete; replay: {}",
                    topology.name(),
                    config.replay()
                )));
                break;
            }
        }
    }
    if let Some(postgres) = postgres {
        postgres.stop().await;
    }
    outcome.map(|()| all_passed)
}
