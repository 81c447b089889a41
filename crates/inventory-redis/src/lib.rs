//! Redis leases: they keep hundreds of requests for a hot SKU waiting on Redis instead of
//! piling onto one PostgreSQL row lock. They limit contention and nothing more: correctness
//! never depends on a lease being exclusive, because PostgreSQL checks the fencing token.
//!
//! The client is configured to fail fast: every command is bounded by a timeout, a command
//! is never re-sent after a broken connection, and commands do not queue without bound while
//! Redis is away. The server turns those failures into `UNAVAILABLE` for `Reserve`.
//!
//! # Layout
//! - [`keys`] — the key namespace (environment prefix, hash tag per SKU).
//! - [`client`] — connection settings and the connected client.
//! - [`leases`] — the lease scripts and [`RedisLeases`], the core's `LeaseService`.
//! - `metrics` — the lease instruments (waits, contention, lost leases), from the global meter
//!   provider.

pub mod client;
pub mod keys;
pub mod leases;
mod metrics;
pub use metrics::init as init_metrics;

pub use client::{
    Redis, RedisProbeError, RedisSettings, RedisTlsFiles, parse_url, parse_url_with_tls, probe,
};
/// Parsed connection settings (`REDIS_URL`).
pub use fred::prelude::Config as RedisConfig;
pub use keys::KeyPrefix;
pub use leases::{LeaseSettings, RedisLeases};
