//! The reservation core: the rules of the inventory, free of I/O.
//!
//! This crate owns what a valid request is, what each operation promises and which errors a
//! caller can see. It talks to storage only through the traits in [`ports`], which the
//! adapters (`inventory-postgres`, `inventory-redis`) implement. It must not depend on tonic,
//! fred, tokio-postgres or any other I/O crate (tokio's `sync` and `time` only, for the
//! coalescing queues; OpenTelemetry's API only, for its instruments): `cargo tree -p
//! inventory-core` shows it.
//!
//! # Layout
//! - [`domain`] — newtypes that can only hold valid values (`Sku`, `IdempotencyKey`, ...), and the
//!   limits they enforce.
//! - [`command`] — parsed requests, each with the fingerprint that idempotency compares.
//! - [`error`] — every failure a caller can observe, one variant per distinct client action.
//! - [`events`] — the changes the outbox records, as the event stream delivers them.
//! - [`ports`] — what the core needs from storage and from the lease service.
//! - [`quota`] — per-caller caps on live holds and held units.
//! - [`pause`] — named pause points that tests hold with latches; empty in production.
//! - [`rules`] — the decisions (enough stock? which answer? which state?) as pure functions of
//!   what a transaction read; the storage adapter applies them.
//! - [`service`] — the use cases the gRPC layer calls.
//! - [`allocation`] — which locations a `Reserve` line's units come from, by strategy, as a
//!   pure function of the rows its transaction locked.
//! - [`budget`] — the time a call has: the caller's deadline and the server's lease bound.
//! - [`coalesce`] — the per-SKU queues that let one lease and one transaction serve many
//!   `Reserve` calls for a hot SKU.
//! - [`upkeep`] — retention, what pruning deleted, what is held, what a verification found.
//! - [`metrics`] — the queue-depth histogram and the buckets every duration in seconds uses.

pub mod allocation;
pub mod budget;
pub mod coalesce;
pub mod command;
pub mod domain;
pub mod error;
pub mod events;
pub mod metrics;
pub mod pause;
pub mod ports;
pub mod quota;
pub mod rules;
pub mod service;
pub mod upkeep;

pub use error::{Dependency, Error, FieldViolation};
