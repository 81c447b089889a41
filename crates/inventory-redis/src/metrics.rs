//! Lease instruments, from the global meter provider.

use std::sync::OnceLock;

use inventory_core::metrics::SECONDS_BUCKETS;
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
    /// Each Redis round trip of the leases, by command and outcome.
    pub command_duration: Histogram<f64>,
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
                .with_boundaries(SECONDS_BUCKETS.to_vec())
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
            command_duration: meter
                .f64_histogram("inventory.redis.command.duration")
                .with_unit("s")
                .with_description("Redis round trips of the leases, by command (acquire, release, read_lease, forget_fence, raise_fence) and outcome (ok, error, timeout)")
                .with_boundaries(SECONDS_BUCKETS.to_vec())
                .build(),
        }
    })
}

/// Creates the instruments and starts the counters at 0, so `/metrics` lists them (and
/// `rate()` has a start) before their first event.
pub fn init() {
    let metrics = leases();
    for counter in [
        &metrics.contended,
        &metrics.retries,
        &metrics.lost,
        &metrics.fence_raised,
    ] {
        counter.add(0, &[]);
    }
}
