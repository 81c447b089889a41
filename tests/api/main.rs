//! Black-box tests of `inventory-server` against real PostgreSQL and Redis.
//!
//! `make test` starts both and sets `DATABASE_URL` (a role that may create databases) and
//! `REDIS_URL`. Every test gets its own database, cloned from a migrated template, its own
//! Redis key prefix, and its own server on an ephemeral port.
//!
//! One binary with modules, so the suite links once.

mod admission;
mod auth;
mod cancel;
mod cells;
mod client;
mod coalescing;
mod config;
mod datastore_tls;
mod deploy;
mod drill;
mod events;
mod extend;
mod failover;
mod faults;
mod feeds;
mod forwarding;
mod helpers;
mod hostile;
mod identity;
mod lab;
mod languages;
mod ledger;
mod list;
mod locations;
mod migrations;
mod model;
mod multihost;
mod partial;
mod pooler;
mod race;
mod relay;
mod reservations;
mod resilience;
mod retention;
mod roles;
mod rotation;
mod server;
mod states;
mod stock;
mod telemetry;
mod tenants;
mod tls;
mod waiting;
