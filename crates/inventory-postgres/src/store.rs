//! [`PgStore`]: each use case is one transaction that claims its idempotency key, makes its
//! change with conditional statements, appends its outbox event and stores its outcome.

use std::{sync::Arc, time::Duration};

use deadpool_postgres::Pool;
use inventory_core::{
    Dependency, Error,
    command::{AdjustStock, GetStock},
    domain::{MAX_ON_HAND, StockLevel},
    pause::PausePoints,
    ports::StockStore,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::Notify;

use crate::{
    error::{from_db, from_pool},
    idempotency, outbox, stock,
};

#[derive(Clone, Debug)]
pub struct PgStore {
    pool: Pool,
    /// Signalled after every commit that wrote an outbox event, to wake the sequencer.
    pub(crate) outbox_written: Arc<Notify>,
    /// Longest one use case may wait for PostgreSQL, all round trips together.
    bound: Duration,
    /// Shared with the core's (tests hold requests at these points).
    pub(crate) pauses: PausePoints,
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
        }
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
    /// stopped forwarding): this does. The abandoned transaction is rolled back by the server
    /// once the session resumes or dies; its outcome is unknown to the caller, who retries
    /// with the same idempotency key.
    pub(crate) async fn bounded<T>(
        &self,
        work: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.bound, work).await {
            Ok(result) => result,
            Err(_) => Err(Error::unavailable(
                Dependency::Postgres,
                format!("no answer from PostgreSQL within {:?}", self.bound),
            )),
        }
    }
}

/// The stored outcome of an `AdjustStock`. The SKU and delta are not stored: a replay has the
/// same fingerprint, hence the same SKU and delta.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
enum AdjustOutcome {
    Adjusted {
        on_hand: i64,
        reserved: i64,
        /// Absent in outcomes stored before stock versions existed: 0, "unknown".
        #[serde(default)]
        version: i64,
    },
    UnknownSku,
    BelowReserved {
        on_hand: i64,
        reserved: i64,
    },
    StockLimit,
}

impl AdjustOutcome {
    fn from_result(result: &Result<StockLevel, Error>) -> Option<Self> {
        Some(match result {
            Ok(level) => Self::Adjusted {
                on_hand: level.on_hand,
                reserved: level.reserved,
                version: level.version,
            },
            Err(Error::UnknownSkus(_)) => Self::UnknownSku,
            Err(Error::BelowReserved {
                on_hand, reserved, ..
            }) => Self::BelowReserved {
                on_hand: *on_hand,
                reserved: *reserved,
            },
            Err(Error::StockLimit { .. }) => Self::StockLimit,
            // Anything else is not an outcome of the request but a failure to carry it out.
            Err(_) => return None,
        })
    }

    fn into_result(self, command: &AdjustStock) -> Result<StockLevel, Error> {
        let sku = command.sku.clone();
        let requested = command.delta.get().abs();
        match self {
            Self::Adjusted {
                on_hand,
                reserved,
                version,
            } => Ok(StockLevel {
                sku,
                on_hand,
                reserved,
                version,
            }),
            Self::UnknownSku => Err(Error::UnknownSkus(vec![sku])),
            Self::BelowReserved { on_hand, reserved } => Err(Error::BelowReserved {
                sku,
                requested,
                on_hand,
                reserved,
            }),
            Self::StockLimit => Err(Error::StockLimit {
                sku,
                requested,
                limit: MAX_ON_HAND,
            }),
        }
    }
}

const ADJUST_STOCK: &str = "AdjustStock";

impl StockStore for PgStore {
    #[tracing::instrument(name = "sql.adjust_stock", skip_all, fields(sku = %command.sku, delta = command.delta.get()))]
    async fn adjust_stock(&self, command: &AdjustStock) -> Result<StockLevel, Error> {
        self.bounded(async {
            let mut client = self.pool.get().await.map_err(from_pool)?;
            let tx = client.transaction().await.map_err(from_db)?;
            let fingerprint = command.fingerprint();

            if let idempotency::Claim::Replay(outcome) = idempotency::claim(
                &tx,
                &self.pauses,
                command.caller.as_str(),
                &command.idempotency_key,
                ADJUST_STOCK,
                &fingerprint,
            )
            .await?
            {
                let outcome: AdjustOutcome =
                    serde_json::from_value(outcome).map_err(Error::internal)?;
                return outcome.into_result(command);
            }

            let result = apply_adjustment(&tx, command).await?;
            let outcome = AdjustOutcome::from_result(&result)
                .expect("apply_adjustment returns only storable outcomes");
            if let Ok(level) = &result {
                let payload = json!({
                    "delta": command.delta.get(),
                    "reason": command.reason.as_str(),
                    "on_hand": level.on_hand,
                    "reserved": level.reserved,
                    "version": level.version,
                });
                outbox::append_sku_event(&tx, outbox::STOCK_ADJUSTED, &command.sku, &payload)
                    .await
                    .map_err(from_db)?;
            }
            let outcome = serde_json::to_value(outcome).map_err(Error::internal)?;
            idempotency::record_outcome(
                &tx,
                command.caller.as_str(),
                &command.idempotency_key,
                &outcome,
            )
            .await
            .map_err(from_db)?;
            tx.commit().await.map_err(from_db)?;
            if result.is_ok() {
                self.outbox_written();
            }
            result
        })
        .await
    }

    #[tracing::instrument(skip_all, fields(skus = query.skus().len()))]
    async fn get_stock(&self, query: &GetStock) -> Result<Vec<StockLevel>, Error> {
        self.bounded(async {
            let client = self.pool.get().await.map_err(from_pool)?;
            let mut found = stock::read_many(&client, query.skus())
                .await
                .map_err(from_db)?;
            let missing: Vec<_> = query
                .skus()
                .iter()
                .filter(|sku| !found.iter().any(|level| &level.sku == *sku))
                .cloned()
                .collect();
            if !missing.is_empty() {
                return Err(Error::UnknownSkus(missing));
            }
            found.sort_by_key(|level| query.skus().iter().position(|sku| sku == &level.sku));
            Ok(found)
        })
        .await
    }
}

/// The stock change itself. `Err` is either a storable business outcome or a failure to reach
/// or use the database (which rolls the whole transaction back, claim included).
async fn apply_adjustment(
    tx: &deadpool_postgres::Transaction<'_>,
    command: &AdjustStock,
) -> Result<Result<StockLevel, Error>, Error> {
    let delta = command.delta.get();
    let sku = &command.sku;
    if delta > 0 {
        return Ok(match stock::add(tx, sku, delta).await.map_err(from_db)? {
            Some(level) => Ok(level),
            None => Err(Error::StockLimit {
                sku: sku.clone(),
                requested: delta,
                limit: MAX_ON_HAND,
            }),
        });
    }
    let units = -delta;
    if let Some(level) = stock::remove(tx, sku, units).await.map_err(from_db)? {
        return Ok(Ok(level));
    }
    // The conditional update matched nothing: find out which condition failed.
    Ok(match stock::read(tx, sku).await.map_err(from_db)? {
        None => Err(Error::UnknownSkus(vec![sku.clone()])),
        Some(level) => Err(Error::BelowReserved {
            sku: sku.clone(),
            requested: units,
            on_hand: level.on_hand,
            reserved: level.reserved,
        }),
    })
}
