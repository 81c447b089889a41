//! The server's own instruments (the adapters record theirs; the call's duration is recorded
//! by [`crate::telemetry::RpcLayer`]). Every instrument comes from the global meter provider
//! that `telemetry::init` installs, and shows on `/metrics`.
//!
//! Saturation is read when the metrics are collected, from the parts that know it: the
//! PostgreSQL pool, the admission limit (`MAX_IN_FLIGHT`) and the event hub. The callbacks
//! hold weak references, so an application that stopped reports nothing.

use std::sync::{Arc, Weak};

use opentelemetry::{KeyValue, global};
use tokio::sync::Semaphore;

use crate::events::EventHub;

/// Latency buckets in seconds, from half a millisecond to ten seconds.
pub use inventory_core::metrics::SECONDS_BUCKETS as LATENCY_BUCKETS;

/// The commit this binary was built from (`GIT_COMMIT` at build time, else the checkout's
/// `HEAD`, else `unknown`).
pub const BUILD_COMMIT: &str = inventory_proto::BUILD_COMMIT;

/// `inventory_build_info{version, commit} 1`: which build each replica runs.
pub fn record_build_info() {
    global::meter("inventory-server")
        .u64_gauge("inventory.build.info")
        .with_description("Always 1; its labels say which build this replica runs")
        .build()
        .record(
            1,
            &[
                KeyValue::new("version", env!("CARGO_PKG_VERSION")),
                KeyValue::new("commit", BUILD_COMMIT),
            ],
        );
}

/// The admission limit: calls answered now against `MAX_IN_FLIGHT`.
#[derive(Clone, Debug)]
pub struct Admission {
    pub permits: Arc<Semaphore>,
    pub limit: usize,
}

/// Creates the adapters' instruments and the caller-refusal counter, so counters show at 0
/// before their first event.
pub fn init_adapters() {
    inventory_postgres::init_metrics();
    inventory_redis::init_metrics();
    init_caller_refusals();
}

/// Registers the saturation gauges of one application.
pub fn register_saturation(
    pools: &[(inventory_core::domain::Tenant, inventory_postgres::Pool)],
    admission: &Admission,
    events: &EventHub,
) {
    let meter = global::meter("inventory-server");
    // One pool per tenant, told apart by `tenant`.
    let weak_pools = weak_by_tenant(pools);
    meter
        .u64_observable_gauge("inventory.db.pool.connections")
        .with_description(
            "PostgreSQL pool connections by state: in use, idle, and the pool's maximum",
        )
        .with_callback(move |observer| {
            for (tenant, weak_pool) in &weak_pools {
                if let Some(pool) = weak_pool.upgrade() {
                    let status = pool.status();
                    let in_use = status.size.saturating_sub(status.available);
                    let at = |state: &'static str| [KeyValue::new("state", state), tenant.clone()];
                    observer.observe(in_use as u64, &at("used"));
                    observer.observe(status.available as u64, &at("idle"));
                    observer.observe(status.max_size as u64, &at("max"));
                }
            }
        })
        .build();
    let weak_pools = weak_by_tenant(pools);
    meter
        .u64_observable_gauge("inventory.db.pool.waiting")
        .with_description("Requests waiting for a PostgreSQL connection")
        .with_callback(move |observer| {
            for (tenant, weak_pool) in &weak_pools {
                if let Some(pool) = weak_pool.upgrade() {
                    observer.observe(pool.status().waiting as u64, std::slice::from_ref(tenant));
                }
            }
        })
        .build();
    let permits: Weak<Semaphore> = Arc::downgrade(&admission.permits);
    let limit = admission.limit;
    meter
        .u64_observable_gauge("inventory.rpc.in_flight")
        .with_description("Calls being answered now; new calls are refused (RESOURCE_EXHAUSTED) at inventory_rpc_in_flight_limit")
        .with_callback(move |observer| {
            if let Some(permits) = permits.upgrade() {
                let in_flight = limit.saturating_sub(permits.available_permits());
                observer.observe(in_flight as u64, &[]);
            }
        })
        .build();
    let permits: Weak<Semaphore> = Arc::downgrade(&admission.permits);
    meter
        .u64_observable_gauge("inventory.rpc.in_flight.limit")
        .with_description("MAX_IN_FLIGHT: calls answered at once before new ones are refused")
        .with_callback(move |observer| {
            if permits.strong_count() > 0 {
                observer.observe(limit as u64, &[]);
            }
        })
        .build();
    let watchers = events.watcher_count();
    meter
        .u64_observable_gauge("inventory.events.watchers")
        .with_description("Open WatchEvents streams; new ones are refused at MAX_WATCHERS")
        .with_callback(move |observer| {
            if let Some(open) = watchers.get() {
                observer.observe(open as u64, &[]);
            }
        })
        .build();
}

/// Each pool, not kept alive by a gauge, with its tenant's attribute.
fn weak_by_tenant(
    pools: &[(inventory_core::domain::Tenant, inventory_postgres::Pool)],
) -> Vec<(KeyValue, inventory_postgres::WeakPool)> {
    pools
        .iter()
        .map(|(tenant, pool)| {
            (
                KeyValue::new("tenant", tenant.as_str().to_owned()),
                pool.weak(),
            )
        })
        .collect()
}

/// `inventory_caller_limit_refusals_total{limit}`: calls refused because their caller was at
/// one of its own limits (`max_in_flight`, `max_holds`, `max_held_units`), not the server's.
/// Which caller is on the RPC metrics (`caller`, with `ResourceExhausted`).
pub fn record_caller_refusal(limit: &'static str) {
    caller_refusals().add(1, &[KeyValue::new("limit", limit)]);
}

/// Shows the caller-limit refusals at 0 before the first, so alerts can subtract them.
pub fn init_caller_refusals() {
    for limit in [
        "max_in_flight",
        "max_holds",
        "max_held_units",
        "tenant_max_in_flight",
        "tenant_max_holds",
        "tenant_max_held_units",
    ] {
        caller_refusals().add(0, &[KeyValue::new("limit", limit)]);
    }
}

fn caller_refusals() -> &'static opentelemetry::metrics::Counter<u64> {
    static COUNTER: std::sync::OnceLock<opentelemetry::metrics::Counter<u64>> =
        std::sync::OnceLock::new();
    COUNTER.get_or_init(|| {
        global::meter("inventory-server")
            .u64_counter("inventory.caller.limit_refusals")
            .with_description("Calls refused because their caller was at one of its own limits")
            .build()
    })
}
