//! The short profile of the fault suite, part of `make test`: each Redis topology for 30 s of
//! load under a seeded fault schedule, then the checker, and PostgreSQL failing over for 35 s
//! (a failover comes first). `make chaos` runs the long profile.
//!
//! Every run serves two tenants, `default` and `brand_b`, with the same SKU names, keys and
//! order ids, each through its own callers of the credentials file; the checker runs per
//! tenant, then checks that nothing of one tenant is in the other.
//!
//! Each run starts its own PostgreSQL (one instance, or a formation with a monitor and a
//! standby), Redis processes and three `inventory-server` replicas
//! (the binary built next to this test), so nothing is shared with other tests. Set
//! `CHAOS_SEED` to run another schedule; a failure prints the command that replays it.

use std::{path::PathBuf, time::Duration};

use inventory_chaos::{
    run::{self, RunConfig},
    tenants::TENANTS,
    topology::Topology,
};
use inventory_testkit::postgres::Postgres;

/// Fixed, so `make test` runs the same schedules everywhere.
const SEED: u64 = 20_261_202;

fn server() -> PathBuf {
    if let Some(path) = std::env::var_os("INVENTORY_SERVER_BIN") {
        return path.into();
    }
    // target/<profile>/deps/short-<hash> → target/<profile>/inventory-server
    let exe = std::env::current_exe().expect("the test's own path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    profile.join("inventory-server")
}

async fn short_run(topology: Topology) {
    let server = server();
    assert!(
        server.exists(),
        "no inventory-server at {}: build it (cargo build -p inventory-server) or set INVENTORY_SERVER_BIN",
        server.display()
    );
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(SEED);
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("chaos-{}", topology.name()));
    std::fs::create_dir_all(&out).unwrap();
    // A formation is the run's own; one instance is this test's.
    let postgres = match topology.fails_over() {
        true => None,
        false => Some(Postgres::start(&out.join("postgres")).await.unwrap()),
    };
    let config = RunConfig {
        topology,
        seed,
        duration: Duration::from_secs(if topology.fails_over() { 35 } else { 30 }),
        server,
        previous: None,
        out: out.clone(),
        clients: 8,
        skus: 4,
        stock: 30,
        tenants: TENANTS.map(String::from).to_vec(),
    };
    let report = run::run(&config, postgres.as_ref()).await;
    if let Some(postgres) = postgres {
        postgres.stop().await;
    }
    let report = report.unwrap_or_else(|e| {
        panic!(
            "the run did not complete: {e:#}\nreplay: {}",
            config.replay()
        )
    });
    println!("{}", report.summary());
    assert!(
        report.passed,
        "the checker failed; files in {}\n{}",
        out.display(),
        report.summary()
    );
    // The schedule really injected faults, and the load really ran through them.
    let failovers = report
        .applied
        .iter()
        .filter(|a| a.fault.fails_over())
        .count();
    if topology.fails_over() {
        assert!(failovers >= 1, "{:?}", report.applied);
        assert!(report.applied.len() >= 2, "{} faults", report.applied.len());
    } else {
        assert!(report.applied.len() >= 4, "{} faults", report.applied.len());
    }
    assert!(report.counts["reserve"]["Ok"] > 100, "{:?}", report.counts);
    // Both tenants sold, and each was judged on its own.
    assert_eq!(report.tenants, TENANTS, "{}", report.summary());
    for tenant in TENANTS {
        assert!(
            report.holds_by_tenant[tenant] > 50,
            "{:?}",
            report.holds_by_tenant
        );
        let judged = report.checks.iter();
        let judged = judged.filter(|c| c.tenant.as_deref() == Some(tenant));
        assert!(judged.count() > 10, "no checks of tenant {tenant}");
    }
    assert!(report.checks.iter().any(|c| c.name == "tenants_isolated"));
}

#[tokio::test]
async fn single_redis_under_faults() {
    short_run(Topology::Single).await;
}

#[tokio::test]
async fn sentinel_failover_under_faults() {
    short_run(Topology::Sentinel).await;
}

#[tokio::test]
async fn redis_cluster_under_faults() {
    short_run(Topology::Cluster).await;
}

#[tokio::test]
async fn postgres_failover_under_faults() {
    short_run(Topology::PgFailover).await;
}
