//! The core's instruments, and the buckets every duration in seconds uses.
//!
//! Only OpenTelemetry's API is used here (no SDK, no exporter): without a meter provider
//! installed, recording does nothing. The server installs one.

use std::sync::OnceLock;

use opentelemetry::{
    KeyValue, global,
    metrics::{Counter, Histogram},
};

/// Buckets of every duration in seconds: half a millisecond to ten seconds. (The SDK's
/// default buckets, 0 to 10,000, are meant for milliseconds: every sample in seconds would
/// land in the first.)
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How deep a SKU's coalescing queue was when a `Reserve` joined it: 0 when it found none
/// and leads, else its place in the queue (1: next behind the batch being written). A
/// distribution, not a label per SKU, so the number of series stays fixed however many SKUs
/// are hot.
pub(crate) fn queue_depth() -> &'static Histogram<u64> {
    static INSTRUMENT: OnceLock<Histogram<u64>> = OnceLock::new();
    INSTRUMENT.get_or_init(|| {
        global::meter("inventory-core")
            .u64_histogram("inventory.reserve.queue.depth")
            .with_description(
                "Place of a Reserve in its SKU's coalescing queue when it joined (0: it led)",
            )
            .with_boundaries(vec![
                0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0,
            ])
            .build()
    })
}

/// Counts one SKU batch written by a coalescing leader, by how it had the lease: `acquired`
/// (taken from Redis) or `handed` (kept by the last leader: renewed beside its commit). The
/// share of `handed` is how much of a hot SKU's pipeline skips the lease round trips.
pub(crate) fn count_batch(handed: bool) {
    static INSTRUMENT: OnceLock<Counter<u64>> = OnceLock::new();
    INSTRUMENT
        .get_or_init(|| {
            global::meter("inventory-core")
                .u64_counter("inventory.reserve.batches")
                .with_description(
                    "SKU batches written by a coalescing leader, by how it had the lease",
                )
                .build()
        })
        .add(
            1,
            &[KeyValue::new(
                "lease",
                if handed { "handed" } else { "acquired" },
            )],
        );
}

/// Counts one `Reserve` handed to the replica holding its SKU's lease, by `result`
/// (`answered`: the peer ran it; `not_holder`: it no longer held the lease; `failed`: the hop
/// failed), and times the hop (`inventory.reserve.forward.duration`, the peer's work
/// included). Either of the last two runs the call here.
pub(crate) fn count_forward(forwarded: &crate::ports::Forwarded, took: std::time::Duration) {
    static COUNTER: OnceLock<Counter<u64>> = OnceLock::new();
    static DURATION: OnceLock<Histogram<f64>> = OnceLock::new();
    let result = match forwarded {
        crate::ports::Forwarded::Answered(_) => "answered",
        crate::ports::Forwarded::NotHolder => "not_holder",
        crate::ports::Forwarded::Failed { .. } => "failed",
    };
    let attributes = [KeyValue::new("result", result)];
    COUNTER
        .get_or_init(|| {
            global::meter("inventory-core")
                .u64_counter("inventory.reserve.forwarded")
                .with_description(
                    "Reserve calls handed to the replica holding their SKU's lease, by result",
                )
                .build()
        })
        .add(1, &attributes);
    DURATION
        .get_or_init(|| {
            global::meter("inventory-core")
                .f64_histogram("inventory.reserve.forward.duration")
                .with_unit("s")
                .with_description("Time from handing a Reserve to a peer to its answer")
                .with_boundaries(SECONDS_BUCKETS.to_vec())
                .build()
        })
        .record(took.as_secs_f64(), &attributes);
}
