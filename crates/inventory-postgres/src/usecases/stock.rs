//! The stock use cases of [`PgStore`]: adjust, count (one or a batch), transfer, read levels,
//! list movements and locations. Each write is one keyed transaction that locks the SKU's
//! row, lets the core decide and writes the decision under guards that repeat it.

use deadpool_postgres::Transaction;
use inventory_core::{
    Error,
    command::{
        AdjustStock, BatchSetStock, CancelReceipt, ExpectStock, GetStock, ListReceipts,
        ListStockMovements, MoveStockState, MovementPage, ReceiptChanged, ReceiptPage,
        ReceiveStock, SetStock, SetStockPolicy, StockLevels, TransferStock, Transferred,
    },
    domain::{Location, LocationId, MovementKind, Sku, States, StockLevel, StockState},
    ports::StockStore,
    rules,
};
use serde_json::json;

use crate::{
    PgStore,
    plumbing::error::{from_db, from_pool},
    tables::idempotency::outcome::{
        ADJUST_STOCK, AdjustOutcome, BATCH_SET_STOCK, BatchSetOutcome, SET_STOCK, SetOutcome,
        TRANSFER_STOCK, TransferOutcome,
    },
    tables::ledger::{self, Cause, NewMovement},
    tables::locations,
    tables::outbox,
    tables::stock::{self, Moved, StockMove},
    usecases::keyed::{Commit, Key},
};

impl StockStore for PgStore {
    #[tracing::instrument(name = "sql.adjust_stock", skip_all, fields(sku = %command.sku, delta = command.delta.get()))]
    async fn adjust_stock(&self, command: &AdjustStock) -> Result<StockLevel, Error> {
        let key = Key::new(
            &command.caller,
            &command.idempotency_key,
            ADJUST_STOCK,
            command.fingerprint(),
        );
        let replay = async |stored: AdjustOutcome, _: &Transaction<'_>| stored.into_result(command);
        self.keyed(key, None, replay, async |tx| {
            known_locations(tx, [&command.location]).await?;
            let result = apply_adjustment(tx, command).await?;
            let mut filled = Vec::new();
            if let Ok(moved) = &result {
                let change = StockChange::new(
                    MovementKind::Adjusted,
                    moved,
                    command.delta.get(),
                    command.state,
                    Cause::call(
                        command.caller.as_str(),
                        command.reason.as_str(),
                        Some(command.idempotency_key.as_str()),
                    ),
                );
                filled = record_changes(tx, &[change]).await?;
            }
            let result = result.map(|moved| super::fill::after_fills(moved.total, &filled));
            let outcome = AdjustOutcome::from_result(&result)
                .expect("apply_adjustment returns only storable outcomes");
            let wrote = result.is_ok();
            Commit::storing(result, &outcome)?.wrote(wrote).step()
        })
        .await
    }

    #[tracing::instrument(name = "sql.set_stock", skip_all, fields(sku = %command.sku, on_hand = command.on_hand))]
    async fn set_stock(&self, command: &SetStock) -> Result<StockLevel, Error> {
        let key = Key::new(
            &command.caller,
            &command.idempotency_key,
            SET_STOCK,
            command.fingerprint(),
        );
        let replay = async |stored: SetOutcome, _: &Transaction<'_>| stored.into_result(command);
        self.keyed(key, None, replay, async |tx| {
            known_locations(tx, [&command.location]).await?;
            let result = apply_count(tx, command).await?;
            let changed = matches!(&result, Ok(Count { moved: Some(_), .. }));
            let mut filled = Vec::new();
            if let Ok(Count {
                moved: Some(moved),
                delta,
                ..
            }) = &result
            {
                let change = StockChange::new(
                    MovementKind::Set,
                    moved,
                    *delta,
                    command.state,
                    Cause::call(
                        command.caller.as_str(),
                        command.reason.as_str(),
                        Some(command.idempotency_key.as_str()),
                    ),
                );
                filled = record_changes(tx, &[change]).await?;
            }
            let result = result.map(|count| super::fill::after_fills(count.total, &filled));
            let outcome = SetOutcome::from_result(&result)
                .expect("apply_count returns only storable outcomes");
            Commit::storing(result, &outcome)?.wrote(changed).step()
        })
        .await
    }

    #[tracing::instrument(name = "sql.batch_set_stock", skip_all, fields(counts = command.counts.len()))]
    async fn batch_set_stock(&self, command: &BatchSetStock) -> Result<Vec<StockLevel>, Error> {
        let key = Key::new(
            &command.caller,
            &command.idempotency_key,
            BATCH_SET_STOCK,
            command.fingerprint(),
        );
        let replay =
            async |stored: BatchSetOutcome, _: &Transaction<'_>| stored.into_result(command);
        self.keyed(key, None, replay, async |tx| {
            known_locations(tx, command.counts.iter().map(|c| &c.location)).await?;
            // Under a savepoint: a refusal undoes every row the batch wrote (SKUs it created
            // included) but keeps the claim, so the refusal itself is stored and replayed.
            let savepoint = tx.savepoint("counts").await.map_err(from_db)?;
            let result = apply_counts(&savepoint, command).await?;
            if result.is_ok() {
                savepoint.commit().await.map_err(from_db)?;
            } else {
                savepoint.rollback().await.map_err(from_db)?;
            }
            let outcome = BatchSetOutcome::from_result(&result)
                .expect("apply_counts returns only storable outcomes");
            Commit::storing(result.map_err(|(_, refusal)| refusal), &outcome)?
                .wrote(true)
                .step()
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
    async fn get_stock(&self, query: &GetStock) -> Result<StockLevels, Error> {
        self.bounded(async {
            let client = self.pool.get().await.map_err(from_pool)?;
            let position = |sku: &Sku| query.skus().iter().position(|s| s == sku);
            // The locations and the SKUs' rows at each: two statements, sent together (a
            // location made inactive between them is seen by one of them only; the next read
            // sees it). A SKU's total is the sum of its rows (its version its newest row's,
            // since every movement is one location's), and what it has available is the sum
            // of what its active locations have. The rows are one statement: one snapshot.
            let (all, mut by_location) = tokio::try_join!(
                locations::all(&client),
                stock::read_locations_many(&client, query.skus()),
            )?;
            let active = |level: &StockLevel| {
                all.iter()
                    .any(|l| Some(&l.id) == level.location.as_ref() && l.active)
            };
            let mut totals: Vec<StockLevel> = Vec::new();
            for level in &by_location {
                let share = level.share_apart(active(level));
                match totals.iter_mut().find(|t| t.sku == level.sku) {
                    Some(t) => {
                        t.on_hand += level.on_hand;
                        t.reserved += level.reserved;
                        t.states = t.states.plus(&level.states);
                        t.version = t.version.max(level.version);
                        t.apart += share;
                    }
                    None => totals.push(StockLevel {
                        location: None,
                        apart: share,
                        ..level.clone()
                    }),
                }
            }
            let missing: Vec<_> = query
                .skus()
                .iter()
                .filter(|sku| !totals.iter().any(|level| &level.sku == *sku))
                .cloned()
                .collect();
            if !missing.is_empty() {
                return Err(Error::UnknownSkus(missing));
            }
            totals.sort_by_key(|level| position(&level.sku));
            by_location.sort_by(|a, b| {
                (position(&a.sku), &a.location).cmp(&(position(&b.sku), &b.location))
            });
            // What may be promised by date: only SKUs with incoming units have steps, and
            // only they cost a read of their receipts.
            let incoming: Vec<Sku> = totals
                .iter()
                .filter(|t| t.states.incoming > 0)
                .map(|t| t.sku.clone())
                .collect();
            let open = if incoming.is_empty() {
                Vec::new()
            } else {
                crate::tables::receipts::counted_of(&client, &incoming).await?
            };
            let now = std::time::SystemTime::now();
            let counted = |level: &StockLevel| -> Vec<&inventory_core::domain::Receipt> {
                open.iter()
                    .filter(|r| r.sku == level.sku && level.location.as_ref() == Some(&r.location))
                    .collect()
            };
            // A line of a Reserve made now waits until the horizon at most: no receipt due
            // after it takes one.
            let waits_until = Some(now + self.wait_horizon);
            // Never a date in the past: a late receipt's units are promised from now.
            let promise = |level: &StockLevel| {
                rules::promised_from(rules::promises(level, &counted(level), waits_until), now)
            };
            let total_promise = |total: &StockLevel| {
                let here: Vec<(&StockLevel, Vec<&inventory_core::domain::Receipt>)> = by_location
                    .iter()
                    .filter(|l| l.sku == total.sku && active(l))
                    .map(|l| (l, counted(l)))
                    .collect();
                rules::promised_from(rules::total_promise(&here, waits_until), now)
            };
            let promises = totals.iter().map(total_promise).collect();
            let location_promises = if query.by_location {
                by_location.iter().map(promise).collect()
            } else {
                by_location.clear();
                Vec::new()
            };
            Ok(StockLevels {
                promises,
                location_promises,
                totals,
                by_location,
            })
        })
        .await
    }

    #[tracing::instrument(name = "sql.transfer_stock", skip_all, fields(sku = %command.sku, quantity = command.quantity))]
    async fn transfer_stock(&self, command: &TransferStock) -> Result<Transferred, Error> {
        let key = Key::new(
            &command.caller,
            &command.idempotency_key,
            TRANSFER_STOCK,
            command.fingerprint(),
        );
        let replay = async |stored: TransferOutcome, _: &Transaction<'_>| stored.into_result();
        self.keyed(key, None, replay, async |tx| {
            known_locations(tx, [&command.from, &command.to]).await?;
            let result = apply_transfer(tx, command).await?;
            let outcome = TransferOutcome::of(&result);
            let wrote = result.is_ok();
            Commit::storing(result, &outcome)?.wrote(wrote).step()
        })
        .await
    }

    async fn expect_stock(&self, command: &ExpectStock) -> Result<ReceiptChanged, Error> {
        self.expect(command).await
    }

    async fn receive_stock(&self, command: &ReceiveStock) -> Result<ReceiptChanged, Error> {
        self.receive(command).await
    }

    async fn cancel_receipt(&self, command: &CancelReceipt) -> Result<ReceiptChanged, Error> {
        self.cancel_receipt_of(command).await
    }

    async fn list_receipts(&self, query: &ListReceipts) -> Result<ReceiptPage, Error> {
        self.receipts_page(query).await
    }

    async fn set_stock_policy(&self, command: &SetStockPolicy) -> Result<StockLevel, Error> {
        self.set_policy(command).await
    }

    async fn move_stock_state(&self, command: &MoveStockState) -> Result<StockLevel, Error> {
        self.move_state(command).await
    }

    #[tracing::instrument(name = "sql.upsert_location", skip_all, fields(location = %location.id))]
    async fn upsert_location(&self, location: &Location) -> Result<Location, Error> {
        self.bounded(async {
            let client = self.pool.get().await.map_err(from_pool)?;
            locations::upsert(&client, location).await
        })
        .await
    }

    async fn list_locations(&self) -> Result<Vec<Location>, Error> {
        self.bounded(async {
            let client = self.pool.get().await.map_err(from_pool)?;
            locations::all(&client).await
        })
        .await
    }
}

/// Refuses a location that does not exist, before anything is written (and nothing is
/// stored with the key: once the location is created, the same call goes through). Every
/// deployment has `default`, which needs no read.
pub(crate) async fn known_locations<'a>(
    tx: &deadpool_postgres::Transaction<'_>,
    wanted: impl IntoIterator<Item = &'a LocationId>,
) -> Result<(), Error> {
    let wanted: Vec<&LocationId> = wanted
        .into_iter()
        .filter(|l| l.as_str() != LocationId::DEFAULT)
        .collect();
    if wanted.is_empty() {
        return Ok(());
    }
    let all = locations::all(tx).await?;
    wanted
        .into_iter()
        .try_for_each(|location| locations::check(&all, location))
}

/// The states of a location's row before a change (none: no row yet).
fn at_or_default(at: Option<&StockLevel>) -> States {
    at.map(|level| level.states).unwrap_or_default()
}

/// A SKU created by its first change at `location`: the total and the location are equal.
fn created((level, active): (StockLevel, bool), location: &LocationId) -> Moved {
    Moved {
        level: StockLevel {
            location: Some(location.clone()),
            apart: 0,
            ..level.clone()
        },
        total: level,
        active,
    }
}

/// Writes one decided change of `on_hand` at a location of a locked SKU, giving the SKU a row
/// there first if it has none.
async fn move_on_hand(
    tx: &deadpool_postgres::Transaction<'_>,
    sku: &Sku,
    location: &LocationId,
    had_row: bool,
    delta: i64,
    states: States,
) -> Result<Moved, Error> {
    if !had_row {
        stock::add_location(tx, sku, location)
            .await
            .map_err(from_db)?;
    }
    let moves = [StockMove {
        sku,
        location,
        on_hand: delta,
        reserved: 0,
        states,
    }];
    let mut moved = stock::apply(tx, &moves, &[], true).await?;
    Ok(moved.remove(0))
}

/// A SKU's row, locked for a change at a location.
enum Locked {
    /// It existed: its total, locked.
    Existing(StockLevel),
    /// This change created it (the new row is locked): its level, and whether the location
    /// is active.
    Created((StockLevel, bool)),
    /// It did not exist, and the core refuses to create it with this change.
    Refused(Error),
}

/// Locks the SKU's row, or creates it at `location` with the first level `first` decides.
/// Created meanwhile by another transaction (committed: the insert waited for it), it is
/// locked after all and the change is decided on it.
async fn lock_or_create(
    tx: &Transaction<'_>,
    sku: &Sku,
    location: &LocationId,
    first: impl FnOnce() -> Result<StockLevel, Error>,
) -> Result<Locked, Error> {
    if let Some(total) = stock::lock(tx, sku).await.map_err(from_db)? {
        return Ok(Locked::Existing(total));
    }
    let first = match first() {
        Ok(first) => first,
        Err(refusal) => return Ok(Locked::Refused(refusal)),
    };
    if let Some(level) = stock::create(tx, sku, location, &first)
        .await
        .map_err(from_db)?
    {
        return Ok(Locked::Created(level));
    }
    let total = stock::lock(tx, sku)
        .await
        .map_err(from_db)?
        .ok_or_else(|| Error::internal("a SKU vanished while it was created"))?;
    Ok(Locked::Existing(total))
}

/// What a count came to: the SKU's total after it, the change of `on_hand`, and what was
/// written (`None`: a count equal to what is stored writes nothing).
struct Count {
    total: StockLevel,
    delta: i64,
    moved: Option<Moved>,
}

/// An absolute count: the SKU's row is locked (or created), then its row at the location;
/// the core decides, the count is written under guards that repeat the decision.
async fn apply_count(
    tx: &deadpool_postgres::Transaction<'_>,
    command: &SetStock,
) -> Result<Result<Count, Error>, Error> {
    let sku = &command.sku;
    let location = &command.location;
    let total = match lock_or_create(tx, sku, location, || rules::set_stock(None, command)).await? {
        Locked::Existing(total) => total,
        Locked::Created(level) => {
            let moved = created(level, location);
            return Ok(Ok(Count {
                total: moved.total.clone(),
                delta: moved.total.on_hand,
                moved: Some(moved),
            }));
        }
        Locked::Refused(refusal) => return Ok(Err(refusal)),
    };
    let at = stock::read_at(tx, sku, location).await.map_err(from_db)?;
    let (total_after, at_after, delta) = match rules::set_at(&total, at.as_ref(), command) {
        Err(refusal) => return Ok(Err(refusal)),
        // The count confirms what is stored: no change, no version, no movement.
        Ok(None) => {
            return Ok(Ok(Count {
                total: stock::worked_out(tx, total).await?,
                delta: 0,
                moved: None,
            }));
        }
        Ok(Some(decided)) => decided,
    };
    let states = at_after.states.minus(&at_or_default(at.as_ref()));
    let moved = move_on_hand(tx, sku, location, at.is_some(), delta, states).await?;
    debug_assert_eq!(
        (&moved.total.summed(), &moved.level),
        (&total_after, &at_after),
        "the stored levels are the decided ones"
    );
    Ok(Ok(Count {
        total: moved.total.clone(),
        delta,
        moved: Some(moved),
    }))
}

/// A batch of counts, under a savepoint the caller rolls back on a refusal. Each SKU's row is
/// locked (or created, which locks the new row, or locked after all if another transaction
/// created it meanwhile) in SKU order, then all their location rows, in (SKU, location)
/// order. Every count is then decided in request order (the first refusal refuses the
/// batch), each expected version against the SKU's version before the batch (a sync sends
/// what it read), and the changes are written together, with an event and a movement each.
async fn apply_counts(
    tx: &deadpool_postgres::Transaction<'_>,
    command: &BatchSetStock,
) -> Result<Result<Vec<StockLevel>, (usize, Error)>, Error> {
    use std::collections::HashMap;
    let mut by_key: Vec<&SetStock> = command.counts.iter().collect();
    by_key.sort_by(|a, b| (&a.sku, &a.location).cmp(&(&b.sku, &b.location)));
    let mut totals: HashMap<Sku, StockLevel> = HashMap::with_capacity(by_key.len());
    let mut before: HashMap<Sku, i64> = HashMap::with_capacity(by_key.len());
    // The counts that created their SKU, by index in the request.
    let mut creating: Vec<(usize, (StockLevel, bool))> = Vec::new();
    let index_of = |count: &SetStock| {
        command
            .counts
            .iter()
            .position(|c| std::ptr::eq(c, count))
            .expect("a count of the batch")
    };
    for count in by_key {
        if totals.contains_key(&count.sku) {
            continue;
        }
        let level = match stock::lock(tx, &count.sku).await.map_err(from_db)? {
            Some(level) => level,
            // A count the core refuses for a missing SKU creates nothing; it is decided below.
            None if rules::set_stock(None, count).is_err() => continue,
            None => match stock::create(
                tx,
                &count.sku,
                &count.location,
                &rules::set_stock(None, count)?,
            )
            .await
            .map_err(from_db)?
            {
                Some((level, active)) => {
                    creating.push((index_of(count), (level.clone(), active)));
                    before.insert(count.sku.clone(), 0);
                    totals.insert(count.sku.clone(), level);
                    continue;
                }
                // Created meanwhile by another transaction (committed: the insert waited
                // for it): lock it and decide on it below.
                None => stock::lock(tx, &count.sku)
                    .await
                    .map_err(from_db)?
                    .ok_or_else(|| Error::internal("a SKU vanished while it was created"))?,
            },
        };
        before.insert(count.sku.clone(), level.version);
        totals.insert(count.sku.clone(), level);
    }
    let mut skus: Vec<Sku> = totals.keys().cloned().collect();
    skus.sort();
    let mut at: HashMap<(Sku, LocationId), StockLevel> = stock::read_locations_many(tx, &skus)
        .await?
        .into_iter()
        .filter_map(|level| Some(((level.sku.clone(), level.location.clone()?), level)))
        .collect();
    let mut changes: Vec<(usize, i64, bool, States)> = Vec::new();
    for (index, count) in command.counts.iter().enumerate() {
        if creating.iter().any(|(i, _)| *i == index) {
            continue;
        }
        let Some(total) = totals.get_mut(&count.sku) else {
            let refusal = rules::set_stock(None, count)
                .expect_err("only a refused count leaves its SKU unlocked");
            return Ok(Err((index, refusal)));
        };
        let expected = before[&count.sku];
        if let Some(wanted) = count.expected_version
            && wanted != expected
        {
            let refusal = Error::VersionMismatch {
                sku: count.sku.clone(),
                expected: wanted,
                current: expected,
            };
            return Ok(Err((index, refusal)));
        }
        let unversioned = SetStock {
            expected_version: None,
            ..count.clone()
        };
        let key = (count.sku.clone(), count.location.clone());
        match rules::set_at(total, at.get(&key), &unversioned) {
            Err(refusal) => return Ok(Err((index, refusal))),
            Ok(None) => {}
            Ok(Some((total_after, at_after, delta))) => {
                *total = total_after;
                let states = at_after.states;
                let before = at.insert(key, at_after);
                let states = states.minus(&at_or_default(before.as_ref()));
                changes.push((index, delta, before.is_some(), states));
            }
        }
    }
    for (index, _, had_row, _) in &changes {
        let count = &command.counts[*index];
        if !had_row {
            stock::add_location(tx, &count.sku, &count.location)
                .await
                .map_err(from_db)?;
        }
    }
    let moves: Vec<StockMove<'_>> = changes
        .iter()
        .map(|(index, delta, _, states)| {
            let count = &command.counts[*index];
            StockMove {
                sku: &count.sku,
                location: &count.location,
                on_hand: *delta,
                reserved: 0,
                states: *states,
            }
        })
        .collect();
    let moved = stock::apply(tx, &moves, &[], true).await?;
    // The totals as stored: what the writes left (in order, so each SKU's last), and the
    // SKUs no count changed as they are.
    let mut unchanged: Vec<StockLevel> = totals
        .values()
        .filter(|t| !moved.iter().any(|m| m.total.sku == t.sku))
        .filter(|t| !creating.iter().any(|(_, (c, _))| c.sku == t.sku))
        .cloned()
        .collect();
    stock::with_apart(tx, &mut unchanged).await?;
    for total in unchanged
        .into_iter()
        .chain(moved.iter().map(|m| m.total.clone()))
    {
        totals.insert(total.sku.clone(), total);
    }
    let mut records = Vec::with_capacity(command.counts.len());
    for (index, level) in creating {
        let count = &command.counts[index];
        records.push((index, created(level, &count.location), count.on_hand));
    }
    for ((index, delta, ..), moved) in changes.iter().zip(moved) {
        records.push((*index, moved, *delta));
    }
    // Each SKU's changes in version order: events and movements as they happened.
    records.sort_by(|a, b| {
        (&a.1.total.sku, a.1.total.version).cmp(&(&b.1.total.sku, b.1.total.version))
    });
    let recorded: Vec<StockChange<'_>> = records
        .iter()
        .map(|(index, moved, delta)| {
            let count = &command.counts[*index];
            let cause = Cause::call(
                command.caller.as_str(),
                count.reason.as_str(),
                Some(command.idempotency_key.as_str()),
            );
            StockChange::new(MovementKind::Set, moved, *delta, count.state, cause)
        })
        .collect();
    let filled = record_changes(tx, &recorded).await?;
    Ok(Ok(command
        .counts
        .iter()
        .map(|c| super::fill::after_fills(totals[&c.sku].clone(), &filled))
        .collect()))
}

/// A transfer: the SKU's row is locked (the lock of both location rows), both rows are read;
/// the core decides; both sides move in one write, one movement each, and one event.
async fn apply_transfer(
    tx: &deadpool_postgres::Transaction<'_>,
    command: &TransferStock,
) -> Result<Result<Transferred, Error>, Error> {
    let sku = &command.sku;
    let Some(total) = stock::lock(tx, sku).await.map_err(from_db)? else {
        return Ok(Err(Error::UnknownSkus(vec![sku.clone()])));
    };
    let (from_row, to_row) = tokio::try_join!(
        stock::read_at(tx, sku, &command.from),
        stock::read_at(tx, sku, &command.to),
    )
    .map_err(from_db)?;
    let decided = match rules::transfer(&total, from_row.as_ref(), to_row.as_ref(), command) {
        Err(refusal) => return Ok(Err(refusal)),
        Ok(decided) => decided,
    };
    if from_row.is_none() {
        stock::add_location(tx, sku, &command.from)
            .await
            .map_err(from_db)?;
    }
    if to_row.is_none() {
        stock::add_location(tx, sku, &command.to)
            .await
            .map_err(from_db)?;
    }
    let side = |location, on_hand| StockMove {
        sku,
        location,
        on_hand,
        reserved: 0,
        states: States::default(),
    };
    let mut moves = vec![
        side(&command.from, -command.quantity),
        side(&command.to, command.quantity),
    ];
    moves.sort_by(|a, b| a.location.cmp(b.location));
    let moved = stock::apply(tx, &moves, &[], true).await?;
    let (from, to) = if moved[0].level.location.as_ref() == Some(&command.from) {
        (&moved[0], &moved[1])
    } else {
        (&moved[1], &moved[0])
    };
    let transferred = Transferred {
        total: moved[1].total.clone(),
        from: from.level.clone(),
        to: to.level.clone(),
    };
    debug_assert_eq!(
        Transferred {
            total: transferred.total.summed(),
            ..transferred.clone()
        },
        decided,
        "the stored levels are the decided ones"
    );
    outbox::append_sku_event(
        tx,
        outbox::STOCK_TRANSFERRED,
        sku,
        &json!({
            "quantity": command.quantity,
            "reason": command.reason.as_str(),
            "level": outbox::level_payload(&transferred.total),
            "from": outbox::level_payload(&transferred.from),
            "to": outbox::level_payload(&transferred.to),
        }),
    )
    .await
    .map_err(from_db)?;
    let cause = Cause::call(
        command.caller.as_str(),
        command.reason.as_str(),
        Some(command.idempotency_key.as_str()),
    );
    let movements: Vec<NewMovement<'_>> = moved
        .iter()
        .zip(&moves)
        .map(|(m, side)| {
            NewMovement::new(MovementKind::Transferred, m, side.on_hand, 0).because(cause)
        })
        .collect();
    ledger::append(tx, &movements).await.map_err(from_db)?;
    // Units that reached `to` go to the holds waiting there.
    let filled = super::fill::fill(tx, &super::fill::location_levels(&moved), None, cause).await?;
    let transferred = Transferred {
        total: super::fill::after_fills(transferred.total, &filled),
        ..transferred
    };
    Ok(Ok(transferred))
}

/// A change of `on_hand` by an adjustment or a count, to be recorded: its `STOCK_ADJUSTED`
/// event and its movement.
struct StockChange<'a> {
    payload: serde_json::Value,
    movement: NewMovement<'a>,
}

impl<'a> StockChange<'a> {
    /// `delta` units of `on_hand` in `state` (`None`: sellable).
    fn new(
        kind: MovementKind,
        moved: &Moved,
        delta: i64,
        state: Option<StockState>,
        cause: Cause<'a>,
    ) -> Self {
        let total = &moved.total;
        let mut payload = json!({
            "delta": delta,
            "reason": cause.reason,
            "on_hand": total.on_hand,
            "reserved": total.reserved,
            "version": total.version,
            "location": outbox::level_payload(&moved.level),
        });
        if !total.states.is_zero() {
            payload["states"] = json!(total.states.to_array());
        }
        if total.apart != 0 {
            payload["apart"] = json!(total.apart);
        }
        Self {
            payload,
            movement: NewMovement::new(kind, moved, delta, 0)
                .with_states(state.unwrap_or(StockState::Sellable).delta(delta))
                .because(cause),
        }
    }
}

/// Writes the events of `changes` (pipelined) and then their movements (one statement), then
/// fills the holds waiting where units arrived: answers the totals the fills left (see
/// [`super::fill::fill`]).
async fn record_changes(
    tx: &deadpool_postgres::Transaction<'_>,
    changes: &[StockChange<'_>],
) -> Result<Vec<StockLevel>, Error> {
    futures::future::try_join_all(changes.iter().map(|change| {
        let sku = &change.movement.level.sku;
        outbox::append_sku_event(tx, outbox::STOCK_ADJUSTED, sku, &change.payload)
    }))
    .await
    .map_err(from_db)?;
    let movements: Vec<NewMovement<'_>> = changes.iter().map(|c| c.movement.clone()).collect();
    ledger::append(tx, &movements).await.map_err(from_db)?;
    // Units that arrived go to the holds waiting there.
    let levels: Vec<StockLevel> = movements.iter().map(|m| m.level.clone()).collect();
    let cause = movements.first().map(|m| m.cause).unwrap_or_default();
    super::fill::fill(tx, &levels, None, cause).await
}

/// The stock change itself: the SKU's row is locked (or created), then its row at the
/// location; the core decides, the decision is written under guards that repeat it. `Err` is
/// either a storable business outcome or a failure to reach or use the database (which rolls
/// the whole transaction back, claim included).
async fn apply_adjustment(
    tx: &deadpool_postgres::Transaction<'_>,
    command: &AdjustStock,
) -> Result<Result<Moved, Error>, Error> {
    let sku = &command.sku;
    let location = &command.location;
    let first = || rules::adjust_stock(None, command);
    let total = match lock_or_create(tx, sku, location, first).await? {
        Locked::Existing(total) => total,
        Locked::Created(level) => return Ok(Ok(created(level, location))),
        Locked::Refused(refusal) => return Ok(Err(refusal)),
    };
    let at = stock::read_at(tx, sku, location).await.map_err(from_db)?;
    let (total_after, at_after) = match rules::adjust_at(&total, at.as_ref(), command) {
        Err(refusal) => return Ok(Err(refusal)),
        Ok(decided) => decided,
    };
    let states = at_after.states.minus(&at_or_default(at.as_ref()));
    let moved = move_on_hand(tx, sku, location, at.is_some(), command.delta.get(), states).await?;
    debug_assert_eq!(
        (&moved.total.summed(), &moved.level),
        (&total_after, &at_after),
        "the stored levels are the decided ones"
    );
    Ok(Ok(moved))
}
