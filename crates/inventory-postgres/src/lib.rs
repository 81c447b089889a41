//! The PostgreSQL repository: the system of record, and the only place that can guarantee
//! stock is never oversold.
//!
//! Every stock change is a conditional statement judged by its affected rows, inside one
//! transaction together with its idempotency record and its outbox event; the table
//! constraints refuse negative availability even if that logic were wrong. This crate
//! implements the `inventory-core` ports and depends on no other adapter.
//!
//! # Layout
//! Three floors, each using only the ones below it:
//! - `usecases` — [`PgStore`] and its use cases, one module per family (stock, states,
//!   reserve, batch, fill, cancel, expiry, events, retention, verify), each write through the one
//!   `keyed` transaction shape: read, let `inventory_core::rules` decide, write.
//! - `tables` — the SQL, one module per table (`stock`, `reservations`, `idempotency` with
//!   the stored outcomes' format, `outbox`, `ledger`, `orders`, `locations`, `receipts`), each statement
//!   in the module of the table it writes.
//! - `plumbing` — connecting (configuration, hosts, TLS, the pool, the probe), the
//!   migrations and the schema floor, errors, metrics, plan settings, durable answers.
//!
//! Where a new RPC's SQL goes: its statements in `tables/<table>.rs`, its transaction in
//! `usecases/<family>.rs`, written as a `keyed` body if it changes anything.

mod plumbing;
mod tables;
mod usecases;

pub use deadpool_postgres::{Pool, WeakPool};
pub use inventory_core::upkeep::HeldTotals;
pub use plumbing::{
    connect::{
        self, PgConfig, PoolSettings, ProbeError, Schema, UrlError, connect, parse_url, probe,
    },
    metrics::init as init_metrics,
    migrate,
    tls::{self, PgTls, SslMode},
};
pub use usecases::{OVERDUE_GRACE, PgStore, events, retention, verify};
