//! The one test harness: everything the API tests, the benchmark and the fault suite need to
//! start and observe real processes, written once.
//!
//! # Layout
//! - [`ports`]: free loopback ports that a restarted process can keep.
//! - [`process`]: a child process that can be killed, paused, resumed and restarted, and
//!   [`process::eventually`] for "wait until this holds".
//! - [`scratch`]: a scratch folder removed on drop.
//! - [`postgres`]: a throwaway PostgreSQL cluster, and fresh databases cloned from a migrated
//!   template.
//! - [`pgbouncer`]: PgBouncer in session mode in front of a PostgreSQL.
//! - [`postgres_ha`]: PostgreSQL with automatic failover (pg_auto_failover), every node behind
//!   fault proxies.
//! - [`cells`]: complete copies of the service (PostgreSQL, Redis, replicas) serving fixed
//!   sets of tenants, and the map clients find them with.
//! - [`redis`]: `redis-server` nodes and the three topologies (single, Sentinel, Cluster).
//! - [`nats`]: a `nats-server` with JetStream, killed and restarted with its store.
//! - [`proxy`]: a TCP proxy with latency, cut-off and stall switches.
//! - [`server`]: `inventory-server` processes, ready once `grpc.health.v1` says SERVING.
//! - [`outcome`]: which status codes leave the outcome of a call unknown.
//! - [`audit`]: the rows after a run: reservations with their lines, stock against holds.
//! - [`svg`]: the small pieces the SVG charts share.

pub mod audit;
pub mod cells;
pub mod nats;
pub mod outcome;
pub mod pgbouncer;
pub mod ports;
pub mod postgres;
pub mod postgres_ha;
pub mod process;
pub mod proxy;
pub mod redis;
pub mod scratch;
pub mod server;
pub mod svg;

pub use ports::free_port;
pub use process::eventually;
pub use scratch::Scratch;
