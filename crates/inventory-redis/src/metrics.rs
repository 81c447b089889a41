//! Lease instruments, from the global meter provider.

use std::sync::OnceLock;

use opentelemetry::{
    global,
    metrics::{Counter, Histogram},
};

pub(crate) struct LeaseMetrics {
    /// Wait from the first attempt to the grant (or the give-up), by outcome.
    pub acquire_duration: Histogram<f64>,
    /// Acquisitions that found the lease busy on their first try.
    pub contended: Counter<u64>,
    /// Attempts after the first.
    pub retries: Counter<u64>,
    /// Fenced writes whose lease had expired or passed on: stale holders.
    pub lost: Counter<u64>,
    /// Fence counters raised because Redis had fallen behind PostgreSQL.
    pub fence_raised: Counter<u64>,
}

pub(crate) fn leases() -> &'static LeaseMetrics {
    static METRICS: OnceLock<LeaseMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let meter = global::meter("inventory-redis");
        LeaseMetrics {
            acquire_duration: meter
                .f64_histogram("inventory.lease.acquire.duration")
                .with_unit("s")
                .with_description("Time to obtain a SKU lease, by outcome")
                .with_boundaries(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                    10.0,
                ])
                .build(),
            contended: meter
                .u64_counter("inventory.lease.contended")
                .with_description("Lease acquisitions that found the lease busy on the first try")
                .build(),
            retries: meter
                .u64_counter("inventory.lease.retries")
                .with_description("Lease acquisition attempts after the first")
                .build(),
            lost: meter
                .u64_counter("inventory.lease.lost")
                .with_description("Writes fenced off because their lease had expired or passed on")
                .build(),
            fence_raised: meter
                .u64_counter("inventory.fence.raised")
                .with_description("Fence counters raised after Redis fell behind PostgreSQL")
                .build(),
        }
    })
}
