//! Logging: human-readable text by default, JSON lines for log collectors. `RUST_LOG` filters
//! (default `info`).

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::config::LogFormat;

pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Text => registry.with(fmt::layer().with_target(false)).init(),
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true),
            )
            .init(),
    }
}
