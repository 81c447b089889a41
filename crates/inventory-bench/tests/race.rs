//! The `race` scenario with its oversell audit, against a real server, PostgreSQL and Redis
//! (`make test` provides them): the short correctness run of the benchmark.

use std::time::Duration;

use clap::Parser as _;
use inventory_bench::{
    audit::audit,
    load::{self, LoadConfig, Scenario},
};
use inventory_server::{
    config::{Cli, Command, Settings},
    startup::Application,
};
use tokio_postgres::NoTls;

/// A freshly migrated database of its own; returns its URL.
async fn fresh_database() -> String {
    let admin = std::env::var("DATABASE_URL")
        .expect("DATABASE_URL is not set: run the suite with `make test`");
    let (db, connection) = tokio_postgres::connect(&admin, NoTls).await.unwrap();
    tokio::spawn(connection);
    let name = format!("inventory_race_{}", uuid::Uuid::new_v4().simple());
    db.batch_execute(&format!("CREATE DATABASE {name}"))
        .await
        .unwrap();
    let mut config: inventory_postgres::PgConfig = admin.parse().unwrap();
    config.dbname(&name);
    inventory_postgres::migrate::run(&config).await.unwrap();
    let (base, _) = admin.rsplit_once('/').expect("a URL with a database");
    format!("{base}/{name}")
}

/// The server as `serve` would configure it from these flags.
fn settings(database_url: &str, extra: &[&str]) -> Settings {
    let redis = std::env::var("REDIS_URL").expect("REDIS_URL is not set");
    let prefix = format!("race:{}", uuid::Uuid::new_v4().simple());
    let mut args = vec![
        "inventory-server",
        "serve",
        "--database-url",
        database_url,
        "--redis-url",
        &redis,
        "--redis-key-prefix",
        &prefix,
        "--listen-addr",
        "127.0.0.1:0",
        "--auth-disabled",
        // Racers must end in stock outcomes, not lease timeouts, even on a loaded machine.
        "--lease-wait",
        "20s",
    ];
    args.extend_from_slice(extra);
    match Cli::try_parse_from(args).unwrap().command {
        Command::Serve(serve) => Settings::from_args(&serve).unwrap(),
        other => panic!("not serve: {other:?}"),
    }
}

async fn race(extra: &[&str]) {
    let database_url = fresh_database().await;
    let application = Application::build(settings(&database_url, extra))
        .await
        .unwrap();
    let addr = application.local_addr();
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(application.run_until_stopped(async {
        let _ = stopped.await;
    }));

    let config = LoadConfig {
        addr: format!("http://{addr}"),
        scenario: Scenario::Race,
        clients: 32,
        connections: 2,
        duration: Duration::ZERO,
        quantity: 1,
        ttl: Duration::from_secs(600),
        skus: 1,
        stock: 100,
        zipf_exponent: 1.1,
        shoppers: 300,
        confirm_share: 0.3,
        release_share: 0.3,
        run_id: uuid::Uuid::new_v4().simple().to_string()[..8].to_owned(),
        token: None,
        seed: 7,
    };
    let observed = load::run(config.clone()).await.unwrap();
    let verdict = audit(&config, &observed, Some(&database_url))
        .await
        .unwrap();
    for check in &verdict.checks {
        println!("[{}] {}: {}", check.passed, check.name, check.detail);
    }
    assert!(verdict.passed, "{verdict:#?}");
    // 300 shoppers for 100 units: exactly 100 holds, every other call a clean refusal.
    assert_eq!(observed.held.len(), 100);
    let statuses = observed.status_counts();
    assert_eq!(statuses.get("Ok"), Some(&100), "{statuses:?}");
    assert_eq!(
        statuses.get("FailedPrecondition"),
        Some(&200),
        "{statuses:?}"
    );
    assert!(
        verdict
            .checks
            .iter()
            .any(|c| c.name.starts_with("every success stored")),
        "the row-level audit ran"
    );
}

#[tokio::test]
async fn a_race_for_the_last_units_sells_each_exactly_once() {
    race(&[]).await;
}

#[tokio::test]
async fn a_race_with_coalescing_off_sells_each_exactly_once() {
    race(&["--coalesce-max-batch", "1"]).await;
}
