//! The `race` scenario of the load generator, with its oversell and row-level audit, against
//! a real server, PostgreSQL and Redis: the short correctness run of the benchmark.

use std::time::Duration;

use inventory_bench::{
    audit::audit,
    load::{self, LoadConfig, Scenario},
};
use inventory_core::coalesce::CoalesceConfig;

use crate::helpers::{fresh_database, spawn_app_with, test_settings};

async fn race(max_batch: usize) {
    let mut settings = test_settings(fresh_database().await);
    settings.inventory.coalesce.max_batch = max_batch;
    let app = spawn_app_with(settings).await;
    let database_url = app.database_url().await;
    let addr = app.addr;

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
        locations: 1,
    };
    let observed = load::run(config.clone()).await.unwrap();
    let verdict = audit(&config, &observed, Some(&database_url))
        .await
        .unwrap();
    for check in &verdict.checks {
        println!("[{}] {}: {}", check.passed, check.name, check.detail);
    }
    assert!(verdict.passed, "{verdict:#?}");
    // The ledger and the live holds agree with every level the race left.
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_inventory-server"));
    let (verified, report) = inventory_testkit::server::verify(binary, &database_url)
        .await
        .unwrap();
    assert!(verified, "{report}");
    assert!(report.contains("0 drift(s)"), "{report}");
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
    if max_batch > 1 {
        // The audited race went through the renewed-lease path, not only fresh leases.
        assert!(app.inventory.handed_batches() > 0);
    }
}

#[tokio::test]
async fn a_race_for_the_last_units_sells_each_exactly_once() {
    race(CoalesceConfig::default().max_batch).await;
}

#[tokio::test]
async fn a_race_with_coalescing_off_sells_each_exactly_once() {
    race(1).await;
}
