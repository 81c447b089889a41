//! SQL for the `stock` table (each SKU's total, lease fence and version) and the
//! `stock_locations` table (its units at each location; the totals are their sums).
//!
//! Invariants relied on: `0 <= reserved <= on_hand <= MAX_ON_HAND` is enforced by CHECK
//! constraints on both tables, so every statement here may assume it and none can break it.
//! A SKU's `stock` row is the lock of all its locations: every writer locks it (`FOR UPDATE`,
//! SKUs in byte order) before it reads any of the SKU's location rows, and writes those rows
//! only while holding it. So no two transactions ever contend on a location row, and the
//! location rows, read by a statement that starts once the lock is held, are the latest.
//! Every change goes through [`apply`], which moves a location row and its SKU's total
//! together, one version per movement.

use std::collections::HashMap;

use deadpool_postgres::{GenericClient, Transaction};
use inventory_core::{
    Error,
    allocation::{Placement, SkuStock},
    domain::{FenceToken, LocationId, Sku, States, StockLevel},
};
use tokio_postgres::Row;

use crate::{plumbing::error::from_db, plumbing::plans};

const LOCK_ONE: &str = "
    SELECT on_hand, reserved, version, damaged, quality_control, safety_stock, backorder_limit, backordered, preordered, incoming
    FROM stock WHERE sku = $1 FOR UPDATE";

const READ_LOCATION: &str = "
    SELECT on_hand, reserved, version, damaged, quality_control, safety_stock, backorder_limit, backordered, preordered, incoming
    FROM stock_locations WHERE sku = $1 AND location_id = $2";

/// A SKU's first stock, at one location. Nothing comes back when another transaction created
/// the SKU meanwhile.
const CREATE: &str = "
    WITH s AS (
        INSERT INTO stock (sku, on_hand, damaged, quality_control)
        SELECT $1::text, $3::bigint, $5::bigint, $6::bigint WHERE inventory_writer_gate($4)
        ON CONFLICT (sku) DO NOTHING
        RETURNING sku, on_hand, reserved, version, damaged, quality_control
    )
    INSERT INTO stock_locations
        (sku, location_id, on_hand, reserved, version, damaged, quality_control)
    SELECT sku, $2, on_hand, reserved, version, damaged, quality_control FROM s
    RETURNING on_hand, reserved, version, damaged, quality_control, safety_stock, backorder_limit, backordered, preordered, incoming,
              (SELECT active FROM locations WHERE location_id = $2)";

/// A location's first row for a SKU whose row is locked: nothing there yet.
const ADD_LOCATION: &str = "
    INSERT INTO stock_locations (sku, location_id, on_hand, version)
    SELECT sku, $2, 0, version FROM stock WHERE sku = $1 AND inventory_writer_gate($3)";

/// Rows are locked as the sort returns them: in SKU order, like every other writer. Byte
/// order (`COLLATE "C"`), as Rust sorts SKUs, whatever the database's collation.
/// The clock is read per row once its lock is held (outside the locking scan), so a hold
/// that waited for the lock is dated from when it could act.
pub(crate) const LOCK_MANY: &str = "
    WITH locked AS MATERIALIZED (
        SELECT sku, on_hand, reserved, version, fence_token, damaged, quality_control, safety_stock, backorder_limit, backordered, preordered, incoming
        FROM stock WHERE sku = ANY($1) ORDER BY sku COLLATE \"C\" FOR UPDATE)
    SELECT sku, clock_timestamp(), on_hand, reserved, version, fence_token, damaged, quality_control, safety_stock, backorder_limit, backordered, preordered, incoming
    FROM locked ORDER BY sku COLLATE \"C\"";

/// Of `skus`, the rows nobody holds locked, locked now (in SKU order); the others are
/// skipped, not waited for.
pub(crate) const LOCK_FREE: &str = "
    SELECT sku FROM stock WHERE sku = ANY($1) ORDER BY sku COLLATE \"C\" FOR UPDATE SKIP LOCKED";

/// Moves SKU totals and then their location rows, in one statement. Totals: each `(sku,
/// on_hand, reserved, movements, fence)` by its deltas and one version per movement; with a
/// fence (a Reserve's), only while the stored one is below it, which it then becomes. Location
/// rows: each `(sku, location_id, on_hand, reserved, later, fence)` by its deltas, taking the
/// version of its last movement (the SKU's new version less the SKU's movements after it,
/// `later`), and only if its total moved in this very statement (a total the guard kept out
/// keeps its locations out too) and, with a fence, while its own is below it. Answers the
/// totals (no location) and then the location rows, as they are after. `$12`: this release,
/// refused by the schema floor's gate (SQLSTATE IV001) if the schema moved on past it.
/// With `$15`, each total also answers the `apart` of its locations this statement did not
/// move (see `StockLevel::apart`), and each location row whether its location is active, so
/// that every movement's total can say what its active locations have available (a Reserve,
/// which worked that out on the rows it locked, asks for neither: NULL).
pub(crate) const APPLY: &str = "
    WITH gate AS MATERIALIZED (SELECT inventory_writer_gate($12::integer) AS open), t AS (
        UPDATE stock s
        SET on_hand = s.on_hand + u.on_hand, reserved = s.reserved + u.reserved,
            version = s.version + u.movements, fence_token = coalesce(u.fence, s.fence_token),
            damaged = s.damaged + u.st[1], quality_control = s.quality_control + u.st[2],
            safety_stock = s.safety_stock + u.st[3],
            backorder_limit = s.backorder_limit + u.st[4],
            backordered = s.backordered + u.st[5], preordered = s.preordered + u.st[6],
            incoming = s.incoming + u.st[7],
            updated_at = clock_timestamp()
        FROM (SELECT u.*, $13::bigint[] AS all_states
              FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[])
                  WITH ORDINALITY AS u(sku, on_hand, reserved, movements, fence, n)) v,
            LATERAL (SELECT v.sku, v.on_hand, v.reserved, v.movements, v.fence,
                            v.all_states[v.n * 7 - 6 : v.n * 7] AS st) u,
            gate
        WHERE s.sku = u.sku AND gate.open AND (u.fence IS NULL OR s.fence_token < u.fence)
        RETURNING s.sku, s.on_hand, s.reserved, s.version, s.damaged, s.quality_control,
                  s.safety_stock, s.backorder_limit, s.backordered, s.preordered, s.incoming
    ), l AS (
        UPDATE stock_locations l
        SET on_hand = l.on_hand + u.on_hand, reserved = l.reserved + u.reserved,
            version = t.version - u.later, fence_token = coalesce(u.fence, l.fence_token),
            damaged = l.damaged + u.st[1], quality_control = l.quality_control + u.st[2],
            safety_stock = l.safety_stock + u.st[3],
            backorder_limit = l.backorder_limit + u.st[4],
            backordered = l.backordered + u.st[5], preordered = l.preordered + u.st[6],
            incoming = l.incoming + u.st[7],
            updated_at = clock_timestamp()
        FROM (SELECT v.*, $14::bigint[] AS all_states
              FROM unnest($6::text[], $7::text[], $8::bigint[], $9::bigint[], $10::bigint[],
                          $11::bigint[])
                  WITH ORDINALITY AS v(sku, location_id, on_hand, reserved, later, fence, n)) v,
            LATERAL (SELECT v.sku, v.location_id, v.on_hand, v.reserved, v.later, v.fence,
                            v.all_states[v.n * 7 - 6 : v.n * 7] AS st) u
            JOIN t ON t.sku = u.sku
        WHERE l.sku = u.sku AND l.location_id = u.location_id
          AND (u.fence IS NULL OR l.fence_token < u.fence)
        RETURNING l.sku, l.location_id, l.on_hand, l.reserved, l.version, l.damaged,
                  l.quality_control, l.safety_stock, l.backorder_limit, l.backordered,
                  l.preordered, l.incoming
    )
    SELECT t.sku, NULL::text, t.on_hand, t.reserved, t.version, t.damaged, t.quality_control,
           t.safety_stock, t.backorder_limit, t.backordered, t.preordered, t.incoming,
           CASE WHEN $15::boolean THEN (
               SELECT coalesce(sum(CASE WHEN o.active THEN least(x.free, 0) ELSE x.free END), 0)
               FROM stock_locations r
                   JOIN locations o ON o.location_id = r.location_id,
                   LATERAL (SELECT r.on_hand - r.damaged - r.quality_control - r.reserved
                                   - r.safety_stock AS free) x
               WHERE r.sku = t.sku
                 AND NOT EXISTS (SELECT FROM l WHERE l.sku = r.sku
                                                AND l.location_id = r.location_id))::bigint
           END,
           NULL::boolean
    FROM t
    UNION ALL
    SELECT l.sku, l.location_id, l.on_hand, l.reserved, l.version, l.damaged,
           l.quality_control, l.safety_stock, l.backorder_limit, l.backordered, l.preordered,
           l.incoming, NULL::bigint,
           CASE WHEN $15::boolean THEN (SELECT o.active FROM locations o
                                        WHERE o.location_id = l.location_id) END
    FROM l";

/// Each of the SKUs' `apart` over its location rows (see `StockLevel::apart`); a SKU with no
/// rows is absent (0).
const APART: &str = "
    SELECT r.sku, coalesce(sum(CASE WHEN o.active THEN least(x.free, 0) ELSE x.free END), 0)::bigint
    FROM stock_locations r
        JOIN locations o ON o.location_id = r.location_id,
        LATERAL (SELECT r.on_hand - r.damaged - r.quality_control - r.reserved - r.safety_stock
                 AS free) x
    WHERE r.sku = ANY($1)
    GROUP BY r.sku";

pub(crate) const READ_LOCATIONS_MANY: &str = "
    SELECT sku, location_id, on_hand, reserved, version, damaged, quality_control, safety_stock, backorder_limit, backordered, preordered, incoming
    FROM stock_locations
    WHERE sku = ANY($1) ORDER BY sku COLLATE \"C\", location_id COLLATE \"C\"";

/// The SKU's row, locked until the transaction ends; `None` if there is no such SKU.
pub(crate) async fn lock(
    tx: &Transaction<'_>,
    sku: &Sku,
) -> Result<Option<StockLevel>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(LOCK_ONE).await?;
    let row = tx.query_opt(&statement, &[&sku.as_str()]).await?;
    Ok(row.map(|row| total(sku, &row)))
}

/// The SKU's row at `location`, read under its `stock` row's lock (which the transaction must
/// hold already); `None` if the SKU never had stock there.
pub(crate) async fn read_at(
    tx: &Transaction<'_>,
    sku: &Sku,
    location: &LocationId,
) -> Result<Option<StockLevel>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(READ_LOCATION).await?;
    let row = tx
        .query_opt(&statement, &[&sku.as_str(), &location.as_str()])
        .await?;
    Ok(row.map(|row| at(sku, location, &row)))
}

/// Creates the SKU with `on_hand` units at `location`; `None` if another transaction created
/// the SKU first. The level returned is both the total and the location's (as a total: with
/// its `apart`, and whether the location is active).
pub(crate) async fn create(
    tx: &Transaction<'_>,
    sku: &Sku,
    location: &LocationId,
    first: &StockLevel,
) -> Result<Option<(StockLevel, bool)>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(CREATE).await?;
    let row = tx
        .query_opt(
            &statement,
            &[
                &sku.as_str(),
                &location.as_str(),
                &first.on_hand,
                &crate::plumbing::migrate::RELEASE,
                &first.states.damaged,
                &first.states.quality_control,
            ],
        )
        .await?;
    Ok(row.map(|row| {
        let level = total(sku, &row);
        let active: bool = row.get(10);
        (
            StockLevel {
                apart: level.share_apart(active),
                ..level
            },
            active,
        )
    }))
}

/// Gives a locked SKU an empty row at `location`, which [`apply`] then moves.
pub(crate) async fn add_location(
    tx: &Transaction<'_>,
    sku: &Sku,
    location: &LocationId,
) -> Result<(), tokio_postgres::Error> {
    let statement = tx.prepare_cached(ADD_LOCATION).await?;
    tx.execute(
        &statement,
        &[
            &sku.as_str(),
            &location.as_str(),
            &crate::plumbing::migrate::RELEASE,
        ],
    )
    .await?;
    Ok(())
}

/// Locks the rows of those of `skus` that no other transaction holds locked, in SKU order,
/// and returns them; the others are left as they are.
pub(crate) async fn lock_free(
    tx: &Transaction<'_>,
    skus: &[&str],
) -> Result<Vec<String>, tokio_postgres::Error> {
    if skus.is_empty() {
        return Ok(Vec::new());
    }
    let statement = tx.prepare_cached(LOCK_FREE).await?;
    let rows = tx.query(&statement, &[&skus]).await?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

/// Locks the rows of `skus` in SKU order and then reads their location rows in (SKU,
/// location) order (two statements, sent together); each SKU with the clock read once its
/// lock was held.
pub(crate) async fn lock_many(
    tx: &Transaction<'_>,
    skus: &[&str],
) -> Result<HashMap<Sku, SkuStock>, Error> {
    let (lock, read_locations) = tokio::try_join!(
        biased;
        tx.prepare_cached(LOCK_MANY),
        tx.prepare_cached(READ_LOCATIONS_MANY),
    )
    .map_err(from_db)?;
    // `biased`: the location rows are read by the statement after the one that locked their
    // SKUs' rows, so under a snapshot taken once those locks were held.
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&skus];
    let (rows, location_rows) = plans::generic(tx, async {
        tokio::try_join!(
            biased;
            tx.query(&lock, &params),
            tx.query(&read_locations, &params),
        )
    })
    .await
    .map_err(from_db)?;
    let mut locked = HashMap::with_capacity(rows.len());
    for row in &rows {
        let sku = parse_sku(row)?;
        let entry = SkuStock {
            now: row.try_get(1).map_err(Error::internal)?,
            total: StockLevel {
                states: states_at(row, 6),
                ..StockLevel::total(
                    sku.clone(),
                    row.try_get(2).map_err(Error::internal)?,
                    row.try_get(3).map_err(Error::internal)?,
                    row.try_get(4).map_err(Error::internal)?,
                )
            },
            fence: FenceToken::new(row.try_get(5).map_err(Error::internal)?),
            at: Vec::new(),
            receipts: Vec::new(),
            waits_until: None,
        };
        locked.insert(sku, entry);
    }
    for row in &location_rows {
        let level = location_level(row)?;
        if let Some(stock) = locked.get_mut(&level.sku) {
            stock.at.push(level);
        }
    }
    Ok(locked)
}

/// One movement of a SKU's stock at one location.
#[derive(Clone, Debug)]
pub(crate) struct StockMove<'a> {
    pub sku: &'a Sku,
    pub location: &'a LocationId,
    pub on_hand: i64,
    pub reserved: i64,
    pub states: States,
}

impl<'a> StockMove<'a> {
    /// The units a `Reserve` placed at a location, moved into `reserved`.
    pub(crate) fn held(placement: &'a Placement) -> Self {
        Self {
            sku: &placement.level.sku,
            location: &placement.location,
            on_hand: 0,
            reserved: placement.units,
            states: placement.waiting,
        }
    }
}

/// The levels right after one movement: the location's and the SKU's total, both at the
/// version the movement produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Moved {
    pub level: StockLevel,
    pub total: StockLevel,
    /// Whether the location moved is active (its share of the total's `apart`).
    pub active: bool,
}

/// What events carry after `moved`: each SKU's last total, then each location's last level,
/// by SKU, then location.
pub(crate) fn levels_after(moved: &[Moved]) -> Vec<StockLevel> {
    let mut totals: Vec<StockLevel> = Vec::new();
    let mut at: Vec<StockLevel> = Vec::new();
    for m in moved {
        match totals.iter_mut().find(|t| t.sku == m.total.sku) {
            Some(t) => *t = m.total.clone(),
            None => totals.push(m.total.clone()),
        }
        match at
            .iter_mut()
            .find(|l| l.sku == m.level.sku && l.location == m.level.location)
        {
            Some(l) => *l = m.level.clone(),
            None => at.push(m.level.clone()),
        }
    }
    totals.sort_by(|a, b| a.sku.cmp(&b.sku));
    at.sort_by(|a, b| (&a.sku, &a.location).cmp(&(&b.sku, &b.location)));
    totals.extend(at);
    totals
}

/// Applies `moves` (in the order given, one version each), and answers the levels right
/// after each. `locked`: whether the transaction holds the SKUs' rows already; if not, they
/// are locked first, in SKU order. `fences`: a Reserve's lease tokens per SKU, each guarding
/// its SKU's row and location rows (strictly greater). One statement moves the totals and
/// their location rows, sent together with the lock.
/// Should a row not be there or a guard not hold, nothing is answered but an error, and the
/// caller's transaction is abandoned.
pub(crate) async fn apply(
    tx: &Transaction<'_>,
    moves: &[StockMove<'_>],
    fences: &[(&Sku, FenceToken)],
    locked: bool,
) -> Result<Vec<Moved>, Error> {
    apply_with(tx, moves, fences, locked, true).await
}

/// [`apply`], answering the totals as summed (`apart` 0, every location taken as active):
/// for a Reserve, which decided the levels its placements leave on the rows it locked.
pub(crate) async fn apply_summed(
    tx: &Transaction<'_>,
    moves: &[StockMove<'_>],
    fences: &[(&Sku, FenceToken)],
    locked: bool,
) -> Result<Vec<Moved>, Error> {
    apply_with(tx, moves, fences, locked, false).await
}

async fn apply_with(
    tx: &Transaction<'_>,
    moves: &[StockMove<'_>],
    fences: &[(&Sku, FenceToken)],
    locked: bool,
    worked_out: bool,
) -> Result<Vec<Moved>, Error> {
    if moves.is_empty() {
        return Ok(Vec::new());
    }
    let fence_of = |sku: &Sku| {
        fences
            .iter()
            .find(|(s, _)| *s == sku)
            .map(|(_, fence)| fence.get())
    };
    // Per SKU: deltas and movements; per (SKU, location): deltas and the SKU's movements
    // after its last one. Both in (SKU, location) order.
    let mut totals: Vec<(&Sku, i64, i64, i64, States)> = Vec::new();
    let mut rows: Vec<(&Sku, &LocationId, i64, i64, usize, States)> = Vec::new();
    for (index, m) in moves.iter().enumerate() {
        match totals.iter_mut().find(|t| t.0 == m.sku) {
            Some(t) => {
                t.1 += m.on_hand;
                t.2 += m.reserved;
                t.3 += 1;
                t.4 = t.4.plus(&m.states);
            }
            None => totals.push((m.sku, m.on_hand, m.reserved, 1, m.states)),
        }
        match rows.iter_mut().find(|r| r.0 == m.sku && r.1 == m.location) {
            Some(r) => {
                r.2 += m.on_hand;
                r.3 += m.reserved;
                r.4 = index;
                r.5 = r.5.plus(&m.states);
            }
            None => rows.push((m.sku, m.location, m.on_hand, m.reserved, index, m.states)),
        }
    }
    totals.sort_by(|a, b| a.0.cmp(b.0));
    rows.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let later =
        |sku: &Sku, last: usize| moves[last + 1..].iter().filter(|m| m.sku == sku).count() as i64;

    let (lock, apply) = tokio::try_join!(
        biased;
        tx.prepare_cached(LOCK_MANY),
        tx.prepare_cached(APPLY),
    )
    .map_err(from_db)?;
    let t_skus: Vec<&str> = totals.iter().map(|t| t.0.as_str()).collect();
    let t_on: Vec<i64> = totals.iter().map(|t| t.1).collect();
    let t_res: Vec<i64> = totals.iter().map(|t| t.2).collect();
    let t_moves: Vec<i64> = totals.iter().map(|t| t.3).collect();
    let t_fences: Vec<Option<i64>> = totals.iter().map(|t| fence_of(t.0)).collect();
    let t_states: Vec<i64> = totals.iter().flat_map(|t| t.4.to_array()).collect();
    let l_skus: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    let l_locations: Vec<&str> = rows.iter().map(|r| r.1.as_str()).collect();
    let l_on: Vec<i64> = rows.iter().map(|r| r.2).collect();
    let l_res: Vec<i64> = rows.iter().map(|r| r.3).collect();
    let l_later: Vec<i64> = rows.iter().map(|r| later(r.0, r.4)).collect();
    let l_fences: Vec<Option<i64>> = rows.iter().map(|r| fence_of(r.0)).collect();
    let l_states: Vec<i64> = rows.iter().flat_map(|r| r.5.to_array()).collect();
    // `biased`: the SKUs' rows are locked in SKU order before the update (an array update
    // locks in whatever order its join yields); their locks cover their location rows.
    let lock_first = async {
        if locked {
            return Ok(Vec::new());
        }
        tx.query(&lock, &[&t_skus]).await
    };
    let release = crate::plumbing::migrate::RELEASE;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 15] = [
        &t_skus,
        &t_on,
        &t_res,
        &t_moves,
        &t_fences,
        &l_skus,
        &l_locations,
        &l_on,
        &l_res,
        &l_later,
        &l_fences,
        &release,
        &t_states,
        &l_states,
        &worked_out,
    ];
    let (_, answered) = plans::generic(tx, async {
        tokio::try_join!(biased; lock_first, tx.query(&apply, &params))
    })
    .await
    .map_err(from_db)?;
    let (location_rows, total_rows): (Vec<&Row>, Vec<&Row>) = answered
        .iter()
        .partition(|row| matches!(row.try_get::<_, Option<&str>>(1), Ok(Some(_))));
    if total_rows.len() != totals.len() || location_rows.len() != rows.len() {
        return Err(Error::internal(
            "the locked stock rows no longer matched their guards",
        ));
    }

    // Walk back from the levels after every movement to each movement's own.
    let mut running_totals: HashMap<&str, StockLevel> = HashMap::with_capacity(totals.len());
    let mut unmoved_apart: HashMap<&str, i64> = HashMap::with_capacity(totals.len());
    for row in total_rows {
        let sku: &str = row.try_get(0).map_err(Error::internal)?;
        let (sku_ref, on, res, count, states) = totals
            .iter()
            .find(|t| t.0.as_str() == sku)
            .copied()
            .ok_or_else(|| Error::internal("a total that was not moved"))?;
        let after = StockLevel {
            states: states_at(row, 5),
            ..total_at(sku_ref, row, 2)
        };
        let unmoved: Option<i64> = row.try_get(12).map_err(Error::internal)?;
        unmoved_apart.insert(sku_ref.as_str(), unmoved.unwrap_or_default());
        running_totals.insert(
            sku_ref.as_str(),
            StockLevel {
                on_hand: after.on_hand - on,
                reserved: after.reserved - res,
                version: after.version - count,
                states: after.states.minus(&states),
                ..after
            },
        );
    }
    let mut running_at: HashMap<(&str, &str), (StockLevel, bool)> =
        HashMap::with_capacity(rows.len());
    for row in location_rows {
        let after = location_level(row)?;
        let active: Option<bool> = row.try_get(13).map_err(Error::internal)?;
        let active = active.unwrap_or(true);
        let (sku_ref, location, on, res, _, states) = rows
            .iter()
            .find(|r| Some(r.1) == after.location.as_ref() && *r.0 == after.sku)
            .copied()
            .ok_or_else(|| Error::internal("a location that was not moved"))?;
        running_at.insert(
            (sku_ref.as_str(), location.as_str()),
            (
                StockLevel {
                    on_hand: after.on_hand - on,
                    reserved: after.reserved - res,
                    states: after.states.minus(&states),
                    ..after
                },
                active,
            ),
        );
    }
    let mut moved = Vec::with_capacity(moves.len());
    for m in moves {
        let total = running_totals
            .get_mut(m.sku.as_str())
            .expect("every moved SKU is answered");
        total.on_hand += m.on_hand;
        total.reserved += m.reserved;
        total.version += 1;
        total.states = total.states.plus(&m.states);
        let (level, active) = running_at
            .get_mut(&(m.sku.as_str(), m.location.as_str()))
            .expect("every moved location is answered");
        level.on_hand += m.on_hand;
        level.reserved += m.reserved;
        level.states = level.states.plus(&m.states);
        level.version = total.version;
        let (level, active) = (level.clone(), *active);
        // What the SKU's active locations have available after this movement: the rows not
        // moved as they are, the moved ones as this movement left them.
        total.apart = if worked_out {
            unmoved_apart[m.sku.as_str()]
                + running_at
                    .iter()
                    .filter(|((sku, _), _)| *sku == m.sku.as_str())
                    .map(|(_, (at, active))| at.share_apart(*active))
                    .sum::<i64>()
        } else {
            0
        };
        moved.push(Moved {
            level,
            total: total.clone(),
            active,
        });
    }
    Ok(moved)
}

/// `totals` (as stored, locked or read by an earlier statement) with their `apart` worked
/// out over their location rows as they are now: for an answer that moved nothing.
pub(crate) async fn with_apart(
    client: &impl GenericClient,
    totals: &mut [StockLevel],
) -> Result<(), Error> {
    if totals.is_empty() {
        return Ok(());
    }
    let statement = client.prepare_cached(APART).await.map_err(from_db)?;
    let names: Vec<&str> = totals.iter().map(|t| t.sku.as_str()).collect();
    let rows = client.query(&statement, &[&names]).await.map_err(from_db)?;
    for total in totals.iter_mut() {
        total.apart = 0;
        for row in &rows {
            if row.try_get::<_, &str>(0).map_err(Error::internal)? == total.sku.as_str() {
                total.apart = row.try_get(1).map_err(Error::internal)?;
            }
        }
    }
    Ok(())
}

/// One total with its `apart` worked out as [`with_apart`] does.
pub(crate) async fn worked_out(
    client: &impl GenericClient,
    total: StockLevel,
) -> Result<StockLevel, Error> {
    let mut total = [total];
    with_apart(client, &mut total).await?;
    let [total] = total;
    Ok(total)
}

/// The location levels of whichever of `skus` exist, by SKU, then location.
pub(crate) async fn read_locations_many(
    client: &impl GenericClient,
    skus: &[Sku],
) -> Result<Vec<StockLevel>, Error> {
    let statement = client
        .prepare_cached(READ_LOCATIONS_MANY)
        .await
        .map_err(from_db)?;
    let names: Vec<&str> = skus.iter().map(Sku::as_str).collect();
    let rows = client.query(&statement, &[&names]).await.map_err(from_db)?;
    rows.iter().map(location_level).collect()
}

/// `(on_hand, reserved, version)` from column `first` on, and the states after them.
fn total_at(sku: &Sku, row: &Row, first: usize) -> StockLevel {
    StockLevel {
        states: states_at(row, first + 3),
        ..StockLevel::total(
            sku.clone(),
            row.get(first),
            row.get(first + 1),
            row.get(first + 2),
        )
    }
}

/// The seven state columns from column `first` on, in [`States::to_array`] order.
pub(crate) fn states_at(row: &Row, first: usize) -> States {
    let mut counts = [0; 7];
    for (i, count) in counts.iter_mut().enumerate() {
        *count = row.get(first + i);
    }
    States::from_array(counts)
}

fn total(sku: &Sku, row: &Row) -> StockLevel {
    total_at(sku, row, 0)
}

fn at(sku: &Sku, location: &LocationId, row: &Row) -> StockLevel {
    StockLevel {
        location: Some(location.clone()),
        ..total_at(sku, row, 0)
    }
}

/// `(sku, location_id, on_hand, reserved, version, states...)`.
fn location_level(row: &Row) -> Result<StockLevel, Error> {
    let sku = parse_sku(row)?;
    let location: &str = row.try_get(1).map_err(Error::internal)?;
    Ok(StockLevel {
        location: Some(LocationId::parse(location).map_err(Error::internal)?),
        ..total_at(&sku, row, 2)
    })
}

fn parse_sku(row: &Row) -> Result<Sku, Error> {
    let sku: &str = row.try_get(0).map_err(Error::internal)?;
    Sku::parse(sku).map_err(Error::internal)
}
