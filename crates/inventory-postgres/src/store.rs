//! [`PgStore`]: each use case is one transaction that claims its idempotency key, makes its
//! change with conditional statements, appends its outbox event and stores its outcome.

use std::{sync::Arc, time::Duration};

use deadpool_postgres::Pool;
use inventory_core::{
    Dependency, Error,
    command::{AdjustStock, BatchSetStock, GetStock, ListStockMovements, MovementPage, SetStock},
    domain::{MovementKind, StockLevel},
    pause::PausePoints,
    ports::StockStore,
    rules,
};
use serde_json::json;
use tokio::sync::Notify;

use crate::{
    error::{from_db, from_pool},
    idempotency,
    ledger::{self, Cause, NewMovement},
    outbox,
    outcome::{
        ADJUST_STOCK, AdjustOutcome, BATCH_SET_STOCK, BatchSetOutcome, SET_STOCK, SetOutcome,
    },
    stock,
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

impl StockStore for PgStore {
    #[tracing::instrument(name = "sql.adjust_stock", skip_all, fields(sku = %command.sku, delta = command.delta.get()))]
    async fn adjust_stock(&self, command: &AdjustStock) -> Result<StockLevel, Error> {
        self.bounded(async {
            let mut client = self.pool.get().await.map_err(from_pool)?;
            let tx = client.transaction().await.map_err(from_db)?;
            let fingerprint = command.fingerprint();

            if let Some(outcome) = idempotency::claim(
                &tx,
                &self.pauses,
                command.caller.as_str(),
                &command.idempotency_key,
                ADJUST_STOCK,
                &fingerprint,
            )
            .await?
            .stored::<AdjustOutcome>()?
            {
                return outcome.into_result(command);
            }

            let result = apply_adjustment(&tx, command).await?;
            let outcome = AdjustOutcome::from_result(&result)
                .expect("apply_adjustment returns only storable outcomes");
            if let Ok(level) = &result {
                let cause = Cause::call(
                    command.caller.as_str(),
                    command.reason.as_str(),
                    Some(command.idempotency_key.as_str()),
                );
                let change =
                    StockChange::new(MovementKind::Adjusted, level, command.delta.get(), cause);
                record_changes(&tx, &[change]).await?;
            }
            idempotency::record(
                &tx,
                command.caller.as_str(),
                &command.idempotency_key,
                &outcome,
            )
            .await?;
            tx.commit().await.map_err(from_db)?;
            if result.is_ok() {
                self.outbox_written();
            }
            result
        })
        .await
    }

    #[tracing::instrument(name = "sql.set_stock", skip_all, fields(sku = %command.sku, on_hand = command.on_hand))]
    async fn set_stock(&self, command: &SetStock) -> Result<StockLevel, Error> {
        self.bounded(async {
            let mut client = self.pool.get().await.map_err(from_pool)?;
            let tx = client.transaction().await.map_err(from_db)?;
            if let Some(outcome) = idempotency::claim(
                &tx,
                &self.pauses,
                command.caller.as_str(),
                &command.idempotency_key,
                SET_STOCK,
                &command.fingerprint(),
            )
            .await?
            .stored::<SetOutcome>()?
            {
                return outcome.into_result(command);
            }
            let result = apply_count(&tx, command).await?;
            let changed = matches!(&result, Ok(Count { changed: true, .. }));
            if let (true, Ok(Count { level, delta, .. })) = (changed, &result) {
                let cause = Cause::call(
                    command.caller.as_str(),
                    command.reason.as_str(),
                    Some(command.idempotency_key.as_str()),
                );
                record_changes(
                    &tx,
                    &[StockChange::new(MovementKind::Set, level, *delta, cause)],
                )
                .await?;
            }
            let result = result.map(|count| count.level);
            let outcome = SetOutcome::from_result(&result)
                .expect("apply_count returns only storable outcomes");
            idempotency::record(
                &tx,
                command.caller.as_str(),
                &command.idempotency_key,
                &outcome,
            )
            .await?;
            tx.commit().await.map_err(from_db)?;
            if changed {
                self.outbox_written();
            }
            result
        })
        .await
    }

    #[tracing::instrument(name = "sql.batch_set_stock", skip_all, fields(counts = command.counts.len()))]
    async fn batch_set_stock(&self, command: &BatchSetStock) -> Result<Vec<StockLevel>, Error> {
        self.bounded(async {
            let mut client = self.pool.get().await.map_err(from_pool)?;
            let mut tx = client.transaction().await.map_err(from_db)?;
            if let Some(outcome) = idempotency::claim(
                &tx,
                &self.pauses,
                command.caller.as_str(),
                &command.idempotency_key,
                BATCH_SET_STOCK,
                &command.fingerprint(),
            )
            .await?
            .stored::<BatchSetOutcome>()?
            {
                return outcome.into_result(command);
            }
            // Under a savepoint: a refusal undoes every row the batch wrote (SKUs it created
            // included) but keeps the claim, so the refusal itself is stored and replayed.
            let savepoint = tx.savepoint("counts").await.map_err(from_db)?;
            let result = apply_counts(&savepoint, command).await?;
            if result.is_ok() {
                savepoint.commit().await.map_err(from_db)?;
            } else {
                savepoint.rollback().await.map_err(from_db)?;
            }
            let outcome = BatchSetOutcome::from_result(command, &result)
                .expect("apply_counts returns only storable outcomes");
            idempotency::record(
                &tx,
                command.caller.as_str(),
                &command.idempotency_key,
                &outcome,
            )
            .await?;
            tx.commit().await.map_err(from_db)?;
            self.outbox_written();
            result
        })
        .await
    }

    #[tracing::instrument(name = "sql.list_stock_movements", skip_all, fields(sku = %query.sku))]
    async fn list_movements(&self, query: &ListStockMovements) -> Result<MovementPage, Error> {
        self.bounded(async {
            let client = self.pool.get().await.map_err(from_pool)?;
            ledger::page(&client, query).await
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

/// What a count came to: the level after it, the change of `on_hand`, and whether anything
/// was written (a count equal to what is stored writes nothing).
struct Count {
    level: StockLevel,
    delta: i64,
    changed: bool,
}

/// An absolute count: the row is locked (or created), the core decides, the count is written
/// under guards that repeat the decision.
async fn apply_count(
    tx: &deadpool_postgres::Transaction<'_>,
    command: &SetStock,
) -> Result<Result<Count, Error>, Error> {
    let sku = &command.sku;
    let mut current = stock::lock(tx, sku).await.map_err(from_db)?;
    if current.is_none() {
        let created = match rules::set_stock(None, command) {
            Err(refusal) => return Ok(Err(refusal)),
            Ok(first) => stock::create(tx, sku, first.on_hand)
                .await
                .map_err(from_db)?,
        };
        if let Some(level) = created {
            let delta = level.on_hand;
            return Ok(Ok(Count {
                level,
                delta,
                changed: true,
            }));
        }
        // Created meanwhile by another transaction (committed: the insert waited for it).
        current = stock::lock(tx, sku).await.map_err(from_db)?;
    }
    let before = current.as_ref().map_or(0, |level| level.on_hand);
    let decided = match rules::set_stock(current.as_ref(), command) {
        Err(refusal) => return Ok(Err(refusal)),
        Ok(level) => level,
    };
    let delta = decided.on_hand - before;
    if delta == 0
        && let Some(current) = current
    {
        // The count confirms what is stored: no change, no version, no movement.
        return Ok(Ok(Count {
            level: current,
            delta: 0,
            changed: false,
        }));
    }
    match stock::adjust(tx, sku, delta).await.map_err(from_db)? {
        Some(level) => {
            debug_assert_eq!(level, decided, "the stored level is the decided one");
            Ok(Ok(Count {
                level,
                delta,
                changed: true,
            }))
        }
        None => Err(Error::internal(
            "the locked stock row no longer matched its guards",
        )),
    }
}

/// A batch of counts, under a savepoint the caller rolls back on a refusal. One pass in SKU
/// order, like every writer: each SKU's row is locked, or created (which locks the new row),
/// or locked after all if another transaction created it meanwhile. Then every count is
/// decided in request order (the first refusal refuses the batch), and the changed rows are
/// written with one statement, one event and one movement each.
async fn apply_counts(
    tx: &deadpool_postgres::Transaction<'_>,
    command: &BatchSetStock,
) -> Result<Result<Vec<StockLevel>, Error>, Error> {
    let mut by_sku: Vec<&SetStock> = command.counts.iter().collect();
    by_sku.sort_by(|a, b| a.sku.cmp(&b.sku));
    let mut current: std::collections::HashMap<String, StockLevel> =
        std::collections::HashMap::with_capacity(by_sku.len());
    let mut created = Vec::new();
    for count in by_sku {
        let level = match stock::lock(tx, &count.sku).await.map_err(from_db)? {
            Some(level) => level,
            // A count the core refuses for a missing SKU creates nothing; it is decided below.
            None if rules::set_stock(None, count).is_err() => continue,
            None => match stock::create(tx, &count.sku, count.on_hand)
                .await
                .map_err(from_db)?
            {
                Some(level) => {
                    created.push(count.sku.clone());
                    level
                }
                // Created meanwhile by another transaction (committed: the insert waited
                // for it): lock it and decide on it below.
                None => stock::lock(tx, &count.sku)
                    .await
                    .map_err(from_db)?
                    .ok_or_else(|| Error::internal("a SKU vanished while it was created"))?,
            },
        };
        current.insert(count.sku.as_str().to_owned(), level);
    }
    for count in &command.counts {
        if created.contains(&count.sku) {
            continue;
        }
        if let Err(refusal) = rules::set_stock(current.get(count.sku.as_str()), count) {
            return Ok(Err(refusal));
        }
    }
    let changes: Vec<(&str, i64)> = command
        .counts
        .iter()
        .filter(|c| !created.contains(&c.sku))
        .filter(|c| current[c.sku.as_str()].on_hand != c.on_hand)
        .map(|c| (c.sku.as_str(), c.on_hand))
        .collect();
    let mut changed = stock::set_many(tx, &changes).await?;
    if changed.len() != changes.len() {
        return Err(Error::internal(
            "the locked stock rows no longer matched their guards",
        ));
    }
    let mut changes = Vec::with_capacity(command.counts.len());
    for count in &command.counts {
        let (level, before) = if created.contains(&count.sku) {
            (current[count.sku.as_str()].clone(), 0)
        } else if let Some(i) = changed.iter().position(|l| l.sku == count.sku) {
            (changed.swap_remove(i), current[count.sku.as_str()].on_hand)
        } else {
            continue;
        };
        let cause = Cause::call(
            command.caller.as_str(),
            count.reason.as_str(),
            Some(command.idempotency_key.as_str()),
        );
        let delta = level.on_hand - before;
        changes.push(StockChange::new(MovementKind::Set, &level, delta, cause));
        current.insert(count.sku.as_str().to_owned(), level);
    }
    record_changes(tx, &changes).await?;
    Ok(Ok(command
        .counts
        .iter()
        .map(|c| current[c.sku.as_str()].clone())
        .collect()))
}

/// A change of `on_hand` by an adjustment or a count, to be recorded: its `STOCK_ADJUSTED`
/// event and its movement.
struct StockChange<'a> {
    payload: serde_json::Value,
    movement: NewMovement<'a>,
}

impl<'a> StockChange<'a> {
    fn new(kind: MovementKind, level: &StockLevel, delta: i64, cause: Cause<'a>) -> Self {
        Self {
            payload: json!({
                "delta": delta,
                "reason": cause.reason,
                "on_hand": level.on_hand,
                "reserved": level.reserved,
                "version": level.version,
            }),
            movement: NewMovement::new(kind, level, delta, 0).because(cause),
        }
    }
}

/// Writes the events of `changes` (pipelined) and then their movements (one statement).
async fn record_changes(
    tx: &deadpool_postgres::Transaction<'_>,
    changes: &[StockChange<'_>],
) -> Result<(), Error> {
    futures::future::try_join_all(changes.iter().map(|change| {
        let sku = &change.movement.level.sku;
        outbox::append_sku_event(tx, outbox::STOCK_ADJUSTED, sku, &change.payload)
    }))
    .await
    .map_err(from_db)?;
    let movements: Vec<NewMovement<'_>> = changes.iter().map(|c| c.movement.clone()).collect();
    ledger::append(tx, &movements).await.map_err(from_db)
}

/// The stock change itself: the row is locked, the core decides, the decision is written
/// under guards that repeat it. `Err` is either a storable business outcome or a failure to
/// reach or use the database (which rolls the whole transaction back, claim included).
async fn apply_adjustment(
    tx: &deadpool_postgres::Transaction<'_>,
    command: &AdjustStock,
) -> Result<Result<StockLevel, Error>, Error> {
    let sku = &command.sku;
    let delta = command.delta.get();
    let mut current = stock::lock(tx, sku).await.map_err(from_db)?;
    if current.is_none() {
        let created = match rules::adjust_stock(None, command) {
            Err(refusal) => return Ok(Err(refusal)),
            Ok(first) => stock::create(tx, sku, first.on_hand)
                .await
                .map_err(from_db)?,
        };
        if let Some(level) = created {
            return Ok(Ok(level));
        }
        // Another transaction created the SKU meanwhile (and committed: the insert waited
        // for it). Its row exists now: lock it and decide again.
        current = stock::lock(tx, sku).await.map_err(from_db)?;
    }
    let decided = match rules::adjust_stock(current.as_ref(), command) {
        Err(refusal) => return Ok(Err(refusal)),
        Ok(level) => level,
    };
    match stock::adjust(tx, sku, delta).await.map_err(from_db)? {
        Some(level) => {
            debug_assert_eq!(level, decided, "the stored level is the decided one");
            Ok(Ok(level))
        }
        None => Err(Error::internal(
            "the locked stock row no longer matched its guards",
        )),
    }
}
