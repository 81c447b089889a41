//! `inventory-bench run` drives one scenario against a running service; `inventory-bench
//! suite` is what `make bench` runs.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use clap::{Args, Parser, Subcommand};
use inventory_bench::{
    audit,
    compare::{self, CompareConfig, Variant},
    load::{self, LoadConfig, Scenario},
    report::{RunResult, svg},
    suite::{self, Section, SuiteConfig},
};

#[derive(Debug, Parser)]
#[command(
    name = "inventory-bench",
    version,
    about = "Load generator for inventory-server"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one scenario against a running service, audit it, write JSON and SVG.
    Run(Box<RunArgs>),
    /// The benchmark suite: pgbench's raw-SQL ceiling, then the service, as ratios; then one
    /// cell alone against two side by side.
    Suite(SuiteCommand),
    /// The service as built now against an earlier build, sides alternating, as ratios.
    Compare(CompareArgs),
}

#[derive(Debug, Args)]
struct SuiteCommand {
    #[command(flatten)]
    suite: SuiteArgs,
    /// The parts of the suite to run, comma separated.
    #[arg(
        long,
        env = "BENCH_SECTIONS",
        value_enum,
        value_delimiter = ',',
        default_value = "ratios,cells"
    )]
    sections: Vec<Section>,
}

#[derive(Debug, Args)]
struct CompareArgs {
    #[command(flatten)]
    suite: SuiteArgs,
    /// The inventory-server binary of the earlier revision.
    #[arg(long, env = "BENCH_BASELINE")]
    baseline: PathBuf,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "coalesced")]
    variants: Vec<Variant>,
    #[arg(
        long,
        env = "BENCH_SCENARIOS",
        value_enum,
        value_delimiter = ',',
        default_value = "uniform,hot"
    )]
    scenarios: Vec<Scenario>,
    /// Server replicas of each side's runs, sharing the database and the leases.
    #[arg(long, env = "BENCH_REPLICAS", default_value_t = 1)]
    replicas: usize,
}

#[derive(Debug, Args)]
struct RunArgs {
    /// The service, e.g. http://127.0.0.1:50051.
    #[arg(long, default_value = "http://127.0.0.1:50051")]
    addr: String,
    #[arg(long, value_enum, default_value_t = Scenario::Hot)]
    scenario: Scenario,
    /// Calls in flight at once.
    #[arg(long, default_value_t = 32)]
    clients: usize,
    /// HTTP/2 connections the calls are spread over.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Units each Reserve asks for.
    #[arg(long, default_value_t = 1)]
    quantity: i64,
    /// Hold each Reserve asks for.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// SKUs of `uniform` and `zipf`.
    #[arg(long, default_value_t = 10_000)]
    skus: usize,
    /// Units each SKU is stocked with before the run (default: 1,000,000, or 100 in race).
    #[arg(long)]
    stock: Option<i64>,
    #[arg(long, default_value_t = 1.1)]
    zipf_exponent: f64,
    /// `race`: how many shoppers (one Reserve each).
    #[arg(long, default_value_t = 1_000)]
    shoppers: usize,
    /// `race`: share of holds confirmed, then share released afterwards.
    #[arg(long, default_value_t = 0.3)]
    confirm_share: f64,
    #[arg(long, default_value_t = 0.3)]
    release_share: f64,
    /// Bearer token, when the service requires one.
    #[arg(long, env = "BENCH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PostgreSQL URL of the service's database: adds the row-level audit.
    #[arg(long)]
    database_url: Option<String>,
    /// Where the JSON result and the SVG chart go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Locations the stock is spread over (with more than one, Reserves may split).
    #[arg(long, default_value_t = 1)]
    locations: usize,
}

#[derive(Debug, Args)]
struct SuiteArgs {
    /// A PostgreSQL role that may create databases.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: String,
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    redis_url: String,
    /// The inventory-server binary to measure (a release build).
    #[arg(long, default_value = "target/release/inventory-server")]
    server: PathBuf,
    #[arg(long, env = "PGBENCH", default_value = "pgbench")]
    pgbench: PathBuf,
    /// Length of each measured run.
    #[arg(long, env = "BENCH_DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Concurrency levels, comma separated.
    #[arg(
        long,
        env = "BENCH_CLIENTS",
        default_value = "1,8,32,64",
        value_delimiter = ','
    )]
    clients: Vec<usize>,
    /// SKUs of the uniform scenario.
    #[arg(long, default_value_t = 10_000)]
    skus: usize,
    /// Times every point is measured (`compare`: runs of each side per cell); the tables
    /// give medians.
    #[arg(long, env = "BENCH_ROUNDS", default_value_t = 3)]
    rounds: usize,
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
}

#[tokio::main]
async fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Run(args) => match run(*args).await {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::from(2),
            Err(error) => {
                eprintln!("error: {error:#}");
                ExitCode::FAILURE
            }
        },
        Command::Suite(args) => exit(
            suite::run(SuiteConfig {
                sections: args.sections,
                ..args.suite.config()
            })
            .await,
        ),
        Command::Compare(args) => exit(
            compare::run(CompareConfig {
                rounds: args.suite.rounds.max(1),
                suite: args.suite.config(),
                baseline: args.baseline,
                variants: args.variants,
                scenarios: args.scenarios,
                replicas: args.replicas.max(1),
            })
            .await,
        ),
    }
}

impl SuiteArgs {
    fn config(self) -> SuiteConfig {
        SuiteConfig {
            database_url: self.database_url,
            redis_url: self.redis_url,
            server: self.server,
            pgbench: self.pgbench,
            duration: self.duration,
            clients: self.clients,
            skus: self.skus,
            rounds: self.rounds.max(1),
            out: self.out.join(timestamp()),
            sections: Section::ALL.to_vec(),
        }
    }
}

/// `Ok(false)`: an audit failed.
fn exit(outcome: anyhow::Result<bool>) -> ExitCode {
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: an audit FAILED");
            ExitCode::from(2)
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!("run-{secs}")
}

/// `Ok(false)`: the audit failed.
async fn run(args: RunArgs) -> anyhow::Result<bool> {
    let run_id = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
    let config = LoadConfig {
        addr: args.addr,
        scenario: args.scenario,
        clients: args.clients,
        connections: args.connections,
        duration: args.duration,
        quantity: args.quantity,
        ttl: args.ttl,
        skus: args.skus,
        stock: args.stock.unwrap_or(if args.scenario == Scenario::Race {
            100
        } else {
            1_000_000
        }),
        zipf_exponent: args.zipf_exponent,
        shoppers: args.shoppers,
        confirm_share: args.confirm_share,
        release_share: args.release_share,
        run_id: run_id.clone(),
        token: args.token,
        seed: args.seed,
        locations: args.locations,
    };
    let observed = load::run(config.clone()).await?;
    let audit = audit::audit(&config, &observed, args.database_url.as_deref()).await?;
    let passed = audit.passed;
    let label = format!("{:?}-{}-{run_id}", config.scenario, config.clients).to_lowercase();
    let result = RunResult::new(
        &label,
        config.scenario,
        config.clients,
        &observed,
        Some(audit),
    );
    result.print();
    std::fs::create_dir_all(&args.out)?;
    let json = args.out.join(format!("{label}.json"));
    std::fs::write(&json, serde_json::to_vec_pretty(&result)?)?;
    let chart = args.out.join(format!("{label}.svg"));
    std::fs::write(&chart, svg(&result))?;
    println!("  wrote {} and {}", json.display(), chart.display());
    Ok(passed)
}
