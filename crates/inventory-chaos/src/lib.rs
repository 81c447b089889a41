//! The fault suite for `inventory-server`, in the manner of Jepsen: real processes, real
//! faults on a seeded schedule, and a checker over the recorded history.
//!
//! # Layout
//! - `inventory-testkit` starts the processes (PostgreSQL alone or as a pg_auto_failover
//!   formation, Redis single, Sentinel or Cluster, the server replicas) and the TCP fault
//!   proxies in front of PostgreSQL and a single Redis.
//! - [`topology`]: what a run is made of (the Redis layout; PostgreSQL alone or failing over).
//! - [`schedule`]: the seeded fault schedule.
//! - [`tenants`]: the tenants the replicas serve (two by default, with the same SKU names) and
//!   each tenant's callers.
//! - [`workload`]: shoppers, a stocker and a live event watcher per tenant, every call
//!   recorded; and the stock-states load (`workload::promiser`): holds that wait for stock,
//!   receipts expected and received.
//! - [`history`]: what was recorded.
//! - [`checker`]: the guarantees, checked per tenant against its history, its stream and its
//!   rows, and across tenants: nothing of one is in another.
//! - [`report`]: the summary, JSON and the SVG timeline.
//! - [`run`]: one run of one topology.

pub mod checker;
pub mod history;
pub mod report;
pub mod run;
pub mod schedule;
pub mod tenants;
pub mod topology;
pub mod workload;
