//! What every use case stands on: reaching PostgreSQL and keeping its schema.
//!
//! - [`connect`] — configuration parsing, the connection pool, the start-up probe.
//! - `hosts` — several hosts in one URL: the order they are tried in, the primary found.
//! - [`tls`] — libpq's `sslmode` and `sslrootcert` over rustls.
//! - [`migrate`] — the embedded, versioned schema, a lock so concurrent runs are safe, and
//!   the schema floor older releases are held to.
//! - `error` — driver errors classified as unavailable or internal (and the schema floor's).
//! - `durable` — answers decided by reading, made as durable as answers decided by writing.
//! - `plans` — per-transaction planner settings for the hot statements.
//! - `metrics` — the repository's instruments.

pub mod connect;
pub(crate) mod durable;
pub(crate) mod error;
pub(crate) mod hosts;
pub(crate) mod metrics;
pub mod migrate;
pub(crate) mod plans;
pub mod tls;
