//! Load generator and benchmark suite for `inventory-server`.
//!
//! # Layout
//! - [`load`] — scenarios (`uniform`, `hot`, `zipf`, `race`) driven over gRPC, every call
//!   recorded.
//! - [`audit`] — the oversell audit over what the service and PostgreSQL hold afterwards.
//! - [`profile`] — CPU per process and the server's step timings, for where the time goes.
//! - [`report`] — latency percentiles (HDR histogram), JSON results and an SVG chart.
//! - [`suite`] — `make bench`: pgbench's raw-SQL ceiling against the service, as ratios
//!   (medians of rounds).
//! - [`cells`] — `make bench`'s cells row: one complete copy of the service alone against two
//!   side by side, CPU per reservation of each.
//! - [`stats`] — medians and ranges over rounds.
//! - [`compare`] — `make bench-compare`: the service against an earlier build of it, rounds
//!   alternating, as ratios with their spread.

pub mod audit;
pub mod cells;
pub mod compare;
pub mod load;
pub mod profile;
pub mod report;
pub mod stats;
pub mod suite;
