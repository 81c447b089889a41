//! [`PgStore`] and its use cases, one module per family. Each write is one transaction that
//! claims its idempotency key (see [`keyed`]), reads and locks what it decides on, lets
//! `inventory_core::rules` decide, and writes the decision with conditional statements,
//! together with its outbox event, its ledger movements and its stored outcome.
//!
//! - `stock` — adjust, count (one or a batch), transfer, levels, movements, locations.
//! - `states` — a (SKU, location)'s policy and its units moved between states.
//! - `reserve` — `Reserve` one request per transaction; confirm, release, extend, read, list.
//! - `batch` — coalesced `Reserve`s: many single-line requests of several SKUs in one
//!   transaction.
//! - `holds` — the write of what either `Reserve` path decided: new holds, their events,
//!   movements and stored outcomes, in one round trip.
//! - `cancel` — `CancelOrder`: the order's tombstone under its lock, its live holds released.
//! - `expiry` — the sweeper's transaction: overdue holds expired, their stock returned.
//! - `fill` — waiting holds filled, oldest first, by the units a write left free.
//! - [`events`] — positions for committed events, reading them back, epochs, `LISTEN`.
//! - `subscriptions` — named subscriptions: their filters, cursors and readers.
//! - [`retention`] — pruning events, idempotency keys and final reservations past retention.
//! - [`verify`] — every SKU recomputed from its ledger and its live holds.
//! - [`keyed`] — the shape every keyed write shares: claim or replay, body, record, commit.

use std::{sync::Arc, time::Duration};

use deadpool_postgres::Pool;
use inventory_core::{
    Dependency, Error,
    pause::PausePoints,
    ports::Upkeep,
    upkeep::{HeldTotals, Pruned, Report, Retention},
};
use tokio::sync::Notify;

use crate::plumbing::error::{from_db, from_pool};

mod batch;
mod cancel;
pub mod events;
mod expiry;
mod fill;
mod holds;
pub(crate) mod keyed;
mod reserve;
pub mod retention;
pub(crate) mod states;
mod stock;
pub(crate) mod subscriptions;
pub mod verify;

pub use expiry::OVERDUE_GRACE;

#[derive(Clone, Debug)]
pub struct PgStore {
    pool: Pool,
    /// Signalled after every commit that wrote an outbox event, to wake the sequencer.
    pub(crate) outbox_written: Arc<Notify>,
    /// Longest one use case may wait for PostgreSQL, all round trips together.
    bound: Duration,
    /// Shared with the core's (tests hold requests at these points).
    pub(crate) pauses: PausePoints,
    /// The channel the sequencer announces new positions on (one per schema, so a tenant's
    /// tailers wake for its events only).
    pub(crate) positions_channel: Arc<str>,
    /// `tenant=<name>`, on the gauges of what this store counts (held reservations, outbox
    /// lag): each tenant's store reports its own series.
    tenant: Arc<[opentelemetry::KeyValue; 1]>,
    /// A named tenant's name, which its order locks are keyed under; `None` for `default`.
    order_locks: Option<Arc<str>>,
    /// How long waiting demand may wait from when its reservation was made (see
    /// `expiry.rs`, `wait_on`); no pre-order is pegged to a receipt due later.
    pub(crate) wait_horizon: Duration,
    /// Most subscriptions the tenant may have; `None`: unlimited.
    pub(crate) max_subscriptions: Option<u32>,
}

impl PgStore {
    /// `bound`: how long one use case (a transaction, or a read) may wait for PostgreSQL
    /// before it answers `UNAVAILABLE` (see [`PoolSettings::operation_bound`]).
    ///
    /// [`PoolSettings::operation_bound`]: crate::PoolSettings::operation_bound
    pub fn new(pool: Pool, bound: Duration) -> Self {
        Self {
            pool,
            outbox_written: Arc::new(Notify::new()),
            bound,
            pauses: PausePoints::default(),
            positions_channel: Arc::from(events::POSITIONS_CHANNEL),
            tenant: Arc::new([opentelemetry::KeyValue::new(
                "tenant",
                inventory_core::domain::Tenant::DEFAULT,
            )]),
            order_locks: None,
            wait_horizon: inventory_core::domain::DEFAULT_WAIT_HORIZON,
            max_subscriptions: None,
        }
    }

    /// The same store, with at most `limit` subscriptions (`None`: unlimited).
    pub fn with_max_subscriptions(mut self, limit: Option<u32>) -> Self {
        self.max_subscriptions = limit;
        self
    }

    /// The same store, with waiting demand kept `horizon` from when its reservation was made.
    pub fn with_wait_horizon(mut self, horizon: Duration) -> Self {
        self.wait_horizon = horizon;
        self
    }

    /// The same store, for `tenant`'s pool (one whose connections work in its schema,
    /// [`crate::PgConfig::in_schema`]): its sequencer notifies that schema's channel, and its
    /// gauges carry the tenant.
    pub fn for_tenant(mut self, tenant: &inventory_core::domain::Tenant) -> Self {
        let schema = crate::Schema::of_tenant(tenant);
        self.positions_channel = Arc::from(schema.positions_channel());
        self.tenant = Arc::new([opentelemetry::KeyValue::new(
            "tenant",
            tenant.as_str().to_owned(),
        )]);
        self.order_locks = (!tenant.is_default()).then(|| Arc::from(tenant.as_str()));
        self
    }

    /// The namespace of this store's order locks (see `tables::orders::lock_key`).
    pub(crate) fn order_lock_space(&self) -> Option<&str> {
        self.order_locks.as_deref()
    }

    /// The attributes of this store's gauges.
    pub(crate) fn tenant_attribute(&self) -> &[opentelemetry::KeyValue] {
        &self.tenant[..]
    }

    /// The same store, reaching these pause points (the core's, so one test arms both).
    pub fn with_pause_points(mut self, pauses: PausePoints) -> Self {
        self.pauses = pauses;
        self
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// How long one use case may wait for PostgreSQL.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// Bounds a use case on the client side. PostgreSQL's own `statement_timeout` cannot help
    /// when the answer never arrives (a hung server, a half-open connection, a network that
    /// stopped forwarding, a commit waiting for a standby that is gone): this does. The
    /// abandoned transaction is rolled back by the server once the session resumes or dies;
    /// its outcome is unknown to the caller, who retries with the same idempotency key.
    ///
    /// The abandoned use case hands its connection back to the pool with its request still
    /// on it, and every later request on that connection would queue behind the answer that
    /// never comes: so the connections taken since it began are dropped from the pool
    /// (healthy ones among them are simply opened again). A frozen old primary would
    /// otherwise keep the service unavailable after its standby took over.
    pub(crate) async fn bounded<T>(
        &self,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let started = std::time::Instant::now();
        // The future, and the connection it holds, is dropped when `timeout` returns.
        let outcome = tokio::time::timeout(self.bound, work).await;
        match outcome {
            Ok(result) => result,
            Err(_) => {
                // Kept: the connections last taken before this use case began.
                let dropped = self
                    .pool
                    .retain(|_, used| used.recycled.unwrap_or(used.created) < started)
                    .removed
                    .len();
                tracing::warn!(
                    dropped,
                    "no answer from PostgreSQL in time; recently used connections dropped"
                );
                Err(Error::unavailable(
                    Dependency::Postgres,
                    format!("no answer from PostgreSQL within {:?}", self.bound),
                ))
            }
        }
    }
}

impl Upkeep for PgStore {
    async fn prune(&self, retention: &Retention, batch: usize) -> Result<Pruned, Error> {
        PgStore::prune(self, retention, batch).await
    }

    async fn count_held(&self) -> Result<HeldTotals, Error> {
        if let Err(error) = self.refresh_subscription_gauges().await {
            tracing::warn!(%error, "cannot read the subscriptions; their gauges keep their last values");
        }
        self.refresh_held_gauges().await
    }

    async fn oldest_overdue(&self) -> Result<std::time::Duration, Error> {
        self.refresh_oldest_overdue().await
    }

    /// Not bounded like a call: it reads every table.
    async fn verify(&self) -> Result<Report, Error> {
        let mut client = self.pool.get().await.map_err(from_pool)?;
        verify::verify(&mut client).await.map_err(from_db)
    }
}
