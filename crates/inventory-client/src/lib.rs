//! The Rust client of `inventory-server`, for order services.
//!
//! What it gets right so its callers need not:
//! - **Safe retries.** Every call that changes something carries an idempotency key (one is
//!   generated, UUIDv7, when the request has none), and every attempt sends the same key, so
//!   the server acts at most once however often the call is repeated. What is retried and what
//!   never is: [`retry`].
//! - **The server's pace.** A retry waits at least the `RetryInfo.retry_delay` the server sent,
//!   and otherwise backs off exponentially with full jitter.
//! - **One budget.** Attempts and waits fit in one budget per call ([`RetryPolicy::budget`],
//!   or [`InventoryClient::with_budget`] to pass on part of the caller's own deadline); each
//!   attempt carries its gRPC deadline.
//! - **Three kinds of failure** ([`Error`]): `Refused` (a definite no, with its reason),
//!   `Invalid` (which fields are wrong), `OutcomeUnknown` (a write may or may not have
//!   happened: retry later with the same key, or compensate), plus `Unavailable` for reads
//!   and for writes whose every attempt was refused before it acted.
//! - **Resumable events.** [`EventCursor`] keeps the last event's sequence and epoch, resumes
//!   after it, and says where to go on when a restore or a failover cut the history behind it.
//! - **Trace context.** The current `tracing` span's context goes out as W3C `traceparent`, so
//!   the server's spans join the caller's trace.
//! - **Cells.** Where a deployment runs several cells, each serving its own tenants,
//!   [`CellMap`] reads which cell serves which tenant and [`CellClients`] gives each tenant
//!   the client of its cell, with no router between.
//!
//! ```no_run
//! use inventory_client::{ClientConfig, Error, InventoryClient};
//! use inventory_client::proto::{ReservationLine, ReserveRequest};
//!
//! # async fn example() -> Result<(), Error> {
//! let client = InventoryClient::connect(ClientConfig::new("http://127.0.0.1:50051")).await?;
//! let request = ReserveRequest {
//!     idempotency_key: "order-42/reserve".into(),
//!     order_id: "order-42".into(),
//!     lines: vec![ReservationLine { sku: "DEMO-MUG".into(), quantity: 1, ..Default::default() }],
//!     ..Default::default()
//! };
//! match client.reserve(request).await {
//!     Ok(reservation) => println!("held {}", reservation.reservation_id),
//!     Err(Error::Refused { reason, .. }) if reason == "INSUFFICIENT_STOCK" => println!("sold out"),
//!     Err(Error::OutcomeUnknown { idempotency_key, .. }) => {
//!         println!("unknown: retry later with key {idempotency_key:?}, or cancel the order")
//!     }
//!     Err(other) => return Err(other),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//! - `client` — [`InventoryClient`] and [`ClientConfig`]: one method per RPC, each attempt
//!   under the call's budget, TLS and the bearer token.
//! - [`retry`] — what is retried and what never is, and how long to wait, as pure functions.
//! - `error` — [`Error`]: refused, invalid, outcome unknown, unavailable (and a tenant no
//!   cell serves).
//! - `cursor` — [`EventCursor`]: a consumer's place in the event stream, across cuts.
//! - [`cells`] — [`CellMap`] (which cell serves which tenant, read from a static map, its
//!   format) and [`CellClients`] (one client per cell).

pub mod cells;
mod client;
mod cursor;
mod error;
pub mod retry;

pub use cells::{Cell, CellClients, CellMap, CellMapError, CellMapProblem};
pub use client::{ClientConfig, InventoryClient, TlsOptions};
pub use cursor::EventCursor;
pub use error::{Error, FieldViolation};
pub use retry::RetryPolicy;

/// The API's messages, as the client takes and returns them.
pub use inventory_proto as proto;
