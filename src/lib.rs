//! `inventory-server`: the deployable gRPC service. It owns the wire (protobuf, status codes,
//! health, reflection), configuration and process lifecycle; the rules live in
//! `inventory-core`, storage in `inventory-postgres` and `inventory-redis`.
//!
//! # Layout
//! - [`proto`] — the generated API, re-exported from `inventory-proto`.
//! - [`auth`] — bearer tokens (opaque or JWT) and client certificates (pinned or by SAN), roles,
//!   the caller that scopes keys, per-caller limits.
//! - [`access`] — the caller label of every call's metrics, and the access log.
//! - [`config`] — flags and environment, checked before anything starts.
//! - [`wire`] — protobuf in and out: requests decoded to core commands for their caller,
//!   answers encoded; nothing else touches protobuf types.
//! - [`events`] — the event stream: sequencer, tailer and one watcher per `WatchEvents` call.
//! - [`grpc`] — the service implementation, thin on purpose.
//! - [`peer`] — the internal port: a hot SKU's calls forwarded to the replica holding its
//!   lease, signed with the fleet's secret.
//! - [`status`] — the one map from core errors to gRPC statuses.
//! - [`startup`] — building, serving and the shutdown sequence.
//! - [`upkeep`] — expiry of overdue holds and pruning past retention, in the background.
//! - [`tls`] — TLS on the gRPC port, its material swappable while serving.
//! - [`relay`] — `inventory-server relay`: each tenant's event stream copied to NATS
//!   JetStream under a lease, resumed from where the copy ends.
//! - [`reload`] — credentials and TLS material re-read on SIGHUP and on change.
//! - [`telemetry`] — logs, traces (W3C context in, OTLP out) and the meter provider.
//! - [`metrics`] — the server's instruments; the adapters record their own.
//! - [`tenants`] — the tenants one deployment serves: one wired core each, what their
//!   callers share.
//! - [`admin`] — the plaintext admin HTTP port: `/metrics`.

// The `Reserve` future nests the routing, coalescing and group-commit futures; computing its
// layout goes deeper than the default limit of 128.
#![recursion_limit = "256"]

pub mod access;
pub mod admin;
pub mod auth;
pub mod config;
pub mod events;
pub mod grpc;
pub mod metrics;
pub mod peer;
/// The generated API (`inventory-proto`), re-exported so `crate::proto` names it.
pub use inventory_proto as proto;
pub mod relay;
pub mod reload;
pub mod startup;
pub mod status;
pub mod telemetry;
pub mod tenants;
pub mod tls;
pub mod upkeep;
pub mod wire;

/// The core, wired to its adapters.
pub type Service =
    inventory_core::service::Inventory<inventory_postgres::PgStore, inventory_redis::RedisLeases>;
