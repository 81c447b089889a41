//! The PostgreSQL repository: the system of record, and the only place that can guarantee
//! stock is never oversold.
//!
//! Every stock change is a conditional statement judged by its affected rows, inside one
//! transaction together with its idempotency record and its outbox event; the table
//! constraints refuse negative availability even if that logic were wrong. This crate
//! implements the `inventory-core` ports and depends on no other adapter.
//!
//! # Layout
//! - [`connect`] — configuration parsing, the connection pool, the start-up probe.
//! - [`tls`] — libpq's `sslmode` and `sslrootcert` over rustls.
//! - [`migrate`] — the embedded, versioned schema and a lock so concurrent runs are safe.
//! - `store` — [`PgStore`], the `StockStore` implementation, one transaction per use case.
//! - [`events`] — positions for committed events, reading them back, retention, `LISTEN`.
//! - `reserve`, `batch` — the reservation use cases (`Reserve` one request per transaction,
//!   and coalesced: many single-line requests of several SKUs in one transaction; confirm,
//!   release, read): read, let `inventory_core::rules` decide, write.
//! - `outcome` — the stored outcome of each request, replayed for a retried key.
//! - `expiry` — the sweeper's transaction: overdue holds expired, their stock returned.
//! - `cancel` — `CancelOrder`: the order's tombstone under its lock, its live holds released.
//! - `orders` — tombstones of cancelled orders and the order locks a cancel and a `Reserve`
//!   exclude each other with.
//! - `ledger` — the stock movements every level change writes, and the availability events.
//! - [`verify`] — every SKU recomputed from its ledger and its live holds.
//! - `stock`, `reservations`, `idempotency`, `outbox` — the SQL, one module per table, each
//!   statement in the module of the table it writes.
//! - [`retention`] — pruning events, idempotency keys and final reservations past retention.
//! - `error` — driver errors classified as unavailable or internal.

mod batch;
mod cancel;
pub mod connect;
mod durable;
mod error;
pub mod events;
mod expiry;
mod hosts;
pub use expiry::{HeldTotals, OVERDUE_GRACE};
mod idempotency;
mod ledger;
mod locations;
mod metrics;
pub use metrics::init as init_metrics;
pub mod migrate;
mod orders;
mod outbox;
mod outcome;
mod plans;
mod reservations;
mod reserve;
pub mod retention;
mod stock;
mod store;
pub mod tls;
pub mod verify;

pub use connect::{PgConfig, PoolSettings, ProbeError, UrlError, connect, parse_url, probe};
pub use deadpool_postgres::Pool;
pub use store::PgStore;
pub use tls::{PgTls, SslMode};
