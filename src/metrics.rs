//! The server's own instruments (the adapters record theirs). Every instrument comes from the
//! global meter provider that `telemetry::init` installs, and shows on `/metrics`.

use std::{sync::OnceLock, time::Duration};

use opentelemetry::{KeyValue, global, metrics::Histogram};

/// Latency buckets in seconds, from half a millisecond to ten seconds.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

fn rpc_duration() -> &'static Histogram<f64> {
    static INSTRUMENT: OnceLock<Histogram<f64>> = OnceLock::new();
    INSTRUMENT.get_or_init(|| {
        global::meter("inventory-server")
            .f64_histogram("inventory.rpc.duration")
            .with_unit("s")
            .with_description("Time to answer a call, by method and status code")
            .with_boundaries(LATENCY_BUCKETS.to_vec())
            .build()
    })
}

pub fn rpc_finished(method: &str, code: tonic::Code, took: Duration) {
    rpc_duration().record(
        took.as_secs_f64(),
        &[
            KeyValue::new("rpc.method", method.to_owned()),
            KeyValue::new("rpc.grpc.status_code", format!("{code:?}")),
        ],
    );
}
