//! SQL for the `reservations` and `reservation_lines` tables.
//!
//! Invariants relied on: a reservation's lines keep their SKU and quantity; only their
//! `confirmed` and `released` counts grow, and only while the reservation's row is locked;
//! `state` moves only away from `HELD`. "Expired" is judged by PostgreSQL's clock, one clock for every
//! replica, so a hold past `expires_at` reads as `EXPIRED` everywhere at once, swept or not
//! (unless units of it wait for stock: see `effective_state!`).
//! The clock is read when the statement acts (`clock_timestamp()`), never at the start of its
//! transaction (`now()`): a transaction that waited on a lock must not judge, or date, by the
//! moment it began.

use std::time::SystemTime;

use deadpool_postgres::{GenericClient, Transaction};
use inventory_core::rules::Waiting;
use inventory_core::{
    Error,
    command::{Cursor, ListReservations, ReservationPage, ReservationRef},
    domain::{
        Allocation, Caller, FenceToken, IdempotencyKey, LocationId, OrderId, Peg, ReceiptId,
        Reservation, ReservationId, ReservationLine, ReservationState, Sku,
    },
    quota::Holdings,
};
use tokio_postgres::Row;

type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync + 'a);

/// Whether any unit of the reservation in the row at hand was confirmed (in part).
macro_rules! any_confirmed {
    () => {
        "EXISTS (SELECT 1 FROM reservation_lines c \
         WHERE c.reservation_id = reservations.reservation_id AND c.confirmed > 0)"
    };
}

/// The state every reader sees: a hold past its expiry with nothing waiting is expired, swept
/// or not (confirmed, if some of its units were). One with waiting units stays held past it:
/// a release before this one made it with its checkout `ttl`, and the sweeper moves its
/// expiry to the wait horizon (this release makes such holds last until the horizon from the
/// start). A macro so that constant statements can include it (`concat!`).
macro_rules! effective_state {
    () => {
        concat!(
            "CASE WHEN state = 'HELD' AND expires_at <= clock_timestamp() AND waiting = 0 \
             THEN (CASE WHEN ",
            any_confirmed!(),
            " THEN 'CONFIRMED' ELSE 'EXPIRED' END) ELSE state END"
        )
    };
}
const EFFECTIVE_STATE: &str = effective_state!();

/// New holds, dated by the clock once their stock rows were locked.
pub(crate) const INSERT_MANY: &str = "
    INSERT INTO reservations
        (reservation_id, order_id, state, caller, idempotency_key, created_at, expires_at,
         waiting)
    SELECT u.id, u.order_id, 'HELD', u.caller, u.key, u.created_at, u.expires_at, u.waiting
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::timestamptz[],
                $6::timestamptz[], $7::bigint[])
        AS u(id, order_id, caller, key, expires_at, created_at, waiting)";

/// The lines of new holds, a row per location a line's units come from.
pub(crate) const INSERT_LINES_MANY: &str = "
    INSERT INTO reservation_lines
        (reservation_id, sku, location_id, quantity, fence_token, backordered, preordered,
         receipt_id)
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::bigint[],
                         $6::bigint[], $7::bigint[], $8::text[])";

/// In byte order (`COLLATE "C"`), the order Rust sorts SKUs in: confirm and release lock
/// stock rows in this order, like every other writer, whatever the database's collation.
const LINES: &str = "
    SELECT l.sku, l.location_id, l.quantity, l.confirmed, l.released, l.backordered,
           l.preordered, l.receipt_id, e.expected_at
    FROM reservation_lines l LEFT JOIN receipts e ON e.receipt_id = l.receipt_id
    WHERE l.reservation_id = $1 ORDER BY l.sku COLLATE \"C\", l.location_id COLLATE \"C\"";

/// Sets the counts of a locked reservation's lines, as the core decided them.
const UPDATE_LINES: &str = "
    UPDATE reservation_lines l SET confirmed = u.confirmed, released = u.released,
                                   backordered = u.backordered, preordered = u.preordered
    FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[],
                $7::bigint[])
        AS u(reservation_id, sku, location_id, confirmed, released, backordered, preordered)
    WHERE l.reservation_id = u.reservation_id AND l.sku = u.sku
      AND l.location_id = u.location_id";

/// Moves a hold on, only while it is still a hold at this very moment: judged by its row count.
const SETTLE_HOLD: &str = "
    UPDATE reservations SET state = $2, waiting = $3, updated_at = clock_timestamp()
    WHERE reservation_id = $1 AND state = 'HELD'
      AND (expires_at > clock_timestamp() OR waiting > 0)";

/// Moves a live hold's expiry; judged by its row count, like `SETTLE_HOLD`.
const EXTEND_HOLD: &str = "
    UPDATE reservations SET expires_at = $2, updated_at = clock_timestamp()
    WHERE reservation_id = $1 AND state = 'HELD'
      AND (expires_at > clock_timestamp() OR waiting > 0)";

/// Holds past their expiry, oldest first. `SKIP LOCKED` lets several sweepers (one per
/// replica) take disjoint batches at the same moment instead of queueing on each other.
const LOCK_DUE: &str = "
    SELECT reservation_id, order_id, 'HELD', 'HELD', created_at, expires_at FROM reservations
    WHERE state = 'HELD' AND expires_at <= clock_timestamp()
    ORDER BY expires_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED";

/// Of the given holds, those still held and past their expiry at this very moment, locked;
/// one another transaction holds locked (a confirm, another sweeper) is skipped.
const LOCK_DUE_AMONG: &str = "
    SELECT reservation_id, order_id, 'HELD', 'HELD', created_at, expires_at FROM reservations
    WHERE reservation_id = ANY($1) AND state = 'HELD' AND expires_at <= clock_timestamp()
    ORDER BY expires_at
    FOR UPDATE SKIP LOCKED";

const LINES_OF_MANY: &str = "
    SELECT l.reservation_id, l.sku, l.location_id, l.quantity, l.confirmed, l.released,
           l.backordered, l.preordered, l.receipt_id, e.expected_at
    FROM reservation_lines l LEFT JOIN receipts e ON e.receipt_id = l.receipt_id
    WHERE l.reservation_id = ANY($1)
    ORDER BY l.reservation_id, l.sku COLLATE \"C\", l.location_id COLLATE \"C\"";

/// Ends locked holds, each in its own state (by id).
const END_MANY: &str = "
    UPDATE reservations r SET state = u.state, waiting = 0, updated_at = clock_timestamp()
    FROM unnest($1::uuid[], $2::text[]) AS u(reservation_id, state)
    WHERE r.reservation_id = u.reservation_id AND r.state = 'HELD'";

/// An order's live holds, of the given callers, locked; in id order.
const LOCK_LIVE_OF_ORDER: &str = "
    SELECT reservation_id, order_id, 'HELD', 'HELD', created_at, expires_at FROM reservations
    WHERE order_id = $1 AND caller = ANY($2) AND state = 'HELD'
      AND (expires_at > clock_timestamp() OR waiting > 0)
    ORDER BY reservation_id
    FOR UPDATE";

/// An order's reservations among some callers', oldest first.
const ALL_OF_ORDER: &str = concat!(
    "SELECT reservation_id, order_id, state, ",
    effective_state!(),
    ", created_at, expires_at
     FROM reservations WHERE order_id = $1 AND caller = ANY($2)
     ORDER BY created_at, reservation_id"
);

/// The callers that have reservations of an order.
const CALLERS_OF_ORDER: &str = "SELECT DISTINCT caller FROM reservations WHERE order_id = $1";

/// A reservation row, before its lines are attached.
#[derive(Debug)]
pub(crate) struct Header {
    pub id: ReservationId,
    pub order_id: OrderId,
    /// As stored.
    pub stored_state: ReservationState,
    /// As every reader sees it (`EXPIRED` once overdue).
    pub state: ReservationState,
    pub created_at: SystemTime,
    pub expires_at: SystemTime,
    /// PostgreSQL's clock when the row was read (and locked, if it was).
    pub read_at: SystemTime,
}

/// The units of a line at one location, as its row keeps them; see
/// [`ReservationLine::from_allocations`] for what the row leaves out.
#[derive(Debug)]
pub(crate) struct StoredLine {
    sku: Sku,
    location: LocationId,
    quantity: i64,
    confirmed: i64,
    released: i64,
    backordered: i64,
    preordered: i64,
    receipt: Option<Peg>,
}

impl Header {
    /// The reservation with its lines, from their rows (by SKU, then location).
    pub fn with_lines(self, rows: Vec<StoredLine>) -> Reservation {
        let live = self.state == ReservationState::Held;
        let mut lines: Vec<ReservationLine> = Vec::new();
        let mut allocations: Vec<Allocation> = Vec::new();
        let mut rows = rows.into_iter().peekable();
        while let Some(row) = rows.next() {
            allocations.push(
                Allocation::stored(
                    row.location,
                    row.quantity,
                    row.confirmed,
                    row.released,
                    self.stored_state,
                    live,
                )
                .stored_waiting(row.backordered, row.preordered, row.receipt),
            );
            if rows.peek().is_none_or(|next| next.sku != row.sku) {
                let line =
                    ReservationLine::from_allocations(row.sku, std::mem::take(&mut allocations))
                        .expect("a stored line's quantity is valid");
                lines.push(line);
            }
        }
        Reservation {
            id: self.id,
            order_id: self.order_id,
            state: self.state,
            lines,
            created_at: self.created_at,
            expires_at: self.expires_at,
        }
    }
}

/// Inserts new holds (each `(hold, caller, idempotency key, each line's fence)`) with their
/// lines, a row per allocation (both statements prepared first, then sent together, the
/// reservations first).
pub(crate) async fn insert_many(
    tx: &Transaction<'_>,
    holds: &[(&Reservation, &str, &str, &[FenceToken])],
) -> Result<u64, tokio_postgres::Error> {
    if holds.is_empty() {
        return Ok(0);
    }
    let (insert, insert_lines) = tokio::try_join!(
        biased;
        tx.prepare_cached(INSERT_MANY),
        tx.prepare_cached(INSERT_LINES_MANY)
    )?;
    let ids: Vec<uuid::Uuid> = holds.iter().map(|h| h.0.id.as_uuid()).collect();
    let order_ids: Vec<&str> = holds.iter().map(|h| h.0.order_id.as_str()).collect();
    let callers: Vec<&str> = holds.iter().map(|h| h.1).collect();
    let keys: Vec<&str> = holds.iter().map(|h| h.2).collect();
    let expires: Vec<SystemTime> = holds.iter().map(|h| h.0.expires_at).collect();
    let created: Vec<SystemTime> = holds.iter().map(|h| h.0.created_at).collect();
    let waiting: Vec<i64> = holds
        .iter()
        .map(|h| h.0.lines.iter().map(ReservationLine::waiting).sum())
        .collect();
    let (mut line_ids, mut skus, mut locations, mut quantities, mut fences) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut backordered, mut preordered, mut receipts) = (Vec::new(), Vec::new(), Vec::new());
    for (reservation, _, _, line_fences) in holds {
        for (line, fence) in reservation.lines.iter().zip(*line_fences) {
            for allocation in &line.allocations {
                line_ids.push(reservation.id.as_uuid());
                skus.push(line.sku.as_str());
                locations.push(allocation.location.as_str());
                quantities.push(allocation.quantity);
                fences.push(fence.get());
                backordered.push(allocation.backordered);
                preordered.push(allocation.preordered);
                receipts.push(allocation.receipt.as_ref().map(|p| p.receipt.as_str()));
            }
        }
    }
    let header_params: [Param<'_>; 7] = [
        &ids, &order_ids, &callers, &keys, &expires, &created, &waiting,
    ];
    let line_params: [Param<'_>; 8] = [
        &line_ids,
        &skus,
        &locations,
        &quantities,
        &fences,
        &backordered,
        &preordered,
        &receipts,
    ];
    // `biased`: the reservations reach PostgreSQL before the lines that reference them.
    let (inserted, _) = tokio::try_join!(
        biased;
        tx.execute(&insert, &header_params),
        tx.execute(&insert_lines, &line_params),
    )?;
    Ok(inserted)
}

/// The reservation's row, locked for update when `for_update`, if it exists and lies inside
/// `scope`. Another caller's reservation reads exactly like a missing one: the row is not
/// even locked, so a stranger's call cannot delay the owner's.
pub(crate) async fn header(
    client: &impl GenericClient,
    target: &ReservationRef,
    for_update: bool,
) -> Result<Option<Header>, Error> {
    let sql = format!(
        "SELECT order_id, state, {EFFECTIVE_STATE}, created_at, expires_at, clock_timestamp()
         FROM reservations WHERE reservation_id = $1 AND ($2::text IS NULL OR caller = $2){}",
        if for_update { " FOR UPDATE" } else { "" }
    );
    let statement = client
        .prepare_cached(&sql)
        .await
        .map_err(crate::plumbing::error::from_db)?;
    let id = target.id;
    let owner = target.scope.owner().map(Caller::as_str);
    let row = client
        .query_opt(&statement, &[&id.as_uuid(), &owner])
        .await
        .map_err(crate::plumbing::error::from_db)?;
    row.map(|row| {
        Ok(Header {
            id,
            order_id: stored(OrderId::parse(row.try_get(0).map_err(Error::internal)?))?,
            stored_state: state(&row, 1)?,
            state: state(&row, 2)?,
            created_at: row.try_get(3).map_err(Error::internal)?,
            expires_at: row.try_get(4).map_err(Error::internal)?,
            read_at: row.try_get(5).map_err(Error::internal)?,
        })
    })
    .transpose()
}

pub(crate) async fn lines(
    client: &impl GenericClient,
    id: ReservationId,
) -> Result<Vec<StoredLine>, Error> {
    let statement = client
        .prepare_cached(LINES)
        .await
        .map_err(crate::plumbing::error::from_db)?;
    let rows = client
        .query(&statement, &[&id.as_uuid()])
        .await
        .map_err(crate::plumbing::error::from_db)?;
    rows.iter().map(|row| line(row, 0)).collect()
}

/// Moves a locked hold to `state` (`HELD` again after a partial change); `false` if it
/// expired by now, and nothing changed.
pub(crate) async fn settle_hold(
    tx: &Transaction<'_>,
    id: ReservationId,
    state: ReservationState,
    waiting: i64,
) -> Result<bool, tokio_postgres::Error> {
    let statement = tx.prepare_cached(SETTLE_HOLD).await?;
    let changed = tx
        .execute(&statement, &[&id.as_uuid(), &state.as_str(), &waiting])
        .await?;
    Ok(changed == 1)
}

/// Sets a live hold's expiry; `false` if it is no longer a live hold at this very moment.
pub(crate) async fn extend_hold(
    tx: &Transaction<'_>,
    id: ReservationId,
    expires_at: SystemTime,
) -> Result<bool, tokio_postgres::Error> {
    let statement = tx.prepare_cached(EXTEND_HOLD).await?;
    let changed = tx
        .execute(&statement, &[&id.as_uuid(), &expires_at])
        .await?;
    Ok(changed == 1)
}

/// Locks up to `batch` overdue holds (skipping ones another transaction holds) and returns
/// them with their lines.
pub(crate) async fn lock_due(tx: &Transaction<'_>, batch: i64) -> Result<Vec<Reservation>, Error> {
    read_reservations(tx, LOCK_DUE, &[&batch]).await
}

/// Of `ids`, the holds still held and past their expiry now, locked (see `LOCK_DUE_AMONG`).
pub(crate) async fn lock_due_among(
    tx: &Transaction<'_>,
    ids: &[uuid::Uuid],
) -> Result<Vec<Reservation>, Error> {
    read_reservations(tx, LOCK_DUE_AMONG, &[&ids]).await
}

/// Locked holds past their expiry with units waiting: they wait on, each until its
/// `expires_at` as given (the wait horizon).
pub(crate) async fn wait_on_many(
    tx: &Transaction<'_>,
    waiting: &[Reservation],
) -> Result<(), tokio_postgres::Error> {
    if waiting.is_empty() {
        return Ok(());
    }
    let statement = tx
        .prepare_cached(
            "UPDATE reservations r SET expires_at = u.expires_at, updated_at = clock_timestamp()
             FROM unnest($1::uuid[], $2::timestamptz[]) AS u(reservation_id, expires_at)
             WHERE r.reservation_id = u.reservation_id AND r.state = 'HELD'",
        )
        .await?;
    let ids: Vec<uuid::Uuid> = waiting.iter().map(|r| r.id.as_uuid()).collect();
    let until: Vec<SystemTime> = waiting.iter().map(|r| r.expires_at).collect();
    tx.execute(&statement, &[&ids, &until]).await?;
    Ok(())
}

/// Ends locked holds, each in the state it ended in.
pub(crate) async fn end_many(
    tx: &Transaction<'_>,
    ended: &[&Reservation],
) -> Result<(), tokio_postgres::Error> {
    let statement = tx.prepare_cached(END_MANY).await?;
    let ids: Vec<uuid::Uuid> = ended.iter().map(|r| r.id.as_uuid()).collect();
    let states: Vec<&str> = ended.iter().map(|r| r.state.as_str()).collect();
    tx.execute(&statement, &[&ids, &states]).await?;
    Ok(())
}

/// The waiting lines at the locations of `levels`, of live holds, oldest reservation first;
/// their reservations locked, those another transaction holds skipped (see `fill`).
pub(crate) async fn lock_waiting(
    tx: &Transaction<'_>,
    levels: &[inventory_core::domain::StockLevel],
) -> Result<Vec<Waiting>, Error> {
    let statement = tx
        .prepare_cached(
            "SELECT l.reservation_id, l.sku, l.location_id, l.backordered, l.preordered,
                    l.receipt_id
             FROM reservations r JOIN reservation_lines l USING (reservation_id)
             WHERE (l.sku, l.location_id) IN (SELECT * FROM unnest($1::text[], $2::text[]))
               AND (l.backordered > 0 OR l.preordered > 0)
               AND r.state = 'HELD' AND (r.expires_at > clock_timestamp() OR r.waiting > 0)
             ORDER BY r.created_at, r.reservation_id, l.sku COLLATE \"C\",
                      l.location_id COLLATE \"C\"
             FOR UPDATE OF r SKIP LOCKED",
        )
        .await
        .map_err(crate::plumbing::error::from_db)?;
    let skus: Vec<&str> = levels.iter().map(|l| l.sku.as_str()).collect();
    let locations: Vec<&str> = levels
        .iter()
        .map(|l| {
            l.location
                .as_ref()
                .map_or(LocationId::DEFAULT, LocationId::as_str)
        })
        .collect();
    let rows = tx
        .query(&statement, &[&skus, &locations])
        .await
        .map_err(crate::plumbing::error::from_db)?;
    rows.iter()
        .map(|row| {
            let get = Error::internal;
            Ok(Waiting {
                reservation: ReservationId::from_uuid(row.try_get(0).map_err(get)?),
                sku: stored(Sku::parse(row.try_get(1).map_err(get)?))?,
                location: stored(LocationId::parse(row.try_get(2).map_err(get)?))?,
                backordered: row.try_get(3).map_err(get)?,
                preordered: row.try_get(4).map_err(get)?,
                receipt: row
                    .try_get::<_, Option<&str>>(5)
                    .map_err(get)?
                    .map(|id| stored(ReceiptId::parse(id)))
                    .transpose()?,
            })
        })
        .collect()
}

/// Waiting units of locked lines that became held: `(line, backordered, preordered)`; their
/// reservations' `waiting` drops with them.
pub(crate) async fn fill_lines(
    tx: &Transaction<'_>,
    filled: &[(&Waiting, i64, i64)],
) -> Result<(), Error> {
    let statement = tx
        .prepare_cached(
            "WITH u AS (
                 SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::bigint[],
                                      $5::bigint[])
                     AS u(id, sku, location_id, backordered, preordered)
             ), l AS (
                 UPDATE reservation_lines l
                 SET backordered = l.backordered - u.backordered,
                     preordered = l.preordered - u.preordered
                 FROM u WHERE l.reservation_id = u.id AND l.sku = u.sku
                   AND l.location_id = u.location_id
                 RETURNING l.reservation_id
             )
             UPDATE reservations r SET waiting = r.waiting - w.units,
                                       updated_at = clock_timestamp()
             FROM (SELECT id, sum(backordered + preordered)::bigint AS units FROM u GROUP BY id) w
             WHERE r.reservation_id = w.id",
        )
        .await
        .map_err(crate::plumbing::error::from_db)?;
    let ids: Vec<uuid::Uuid> = filled.iter().map(|f| f.0.reservation.as_uuid()).collect();
    let skus: Vec<&str> = filled.iter().map(|f| f.0.sku.as_str()).collect();
    let locations: Vec<&str> = filled.iter().map(|f| f.0.location.as_str()).collect();
    let backordered: Vec<i64> = filled.iter().map(|f| f.1).collect();
    let preordered: Vec<i64> = filled.iter().map(|f| f.2).collect();
    tx.execute(
        &statement,
        &[&ids, &skus, &locations, &backordered, &preordered],
    )
    .await
    .map_err(crate::plumbing::error::from_db)?;
    Ok(())
}

/// The live holds with units pegged to receipt `id`, with their lines, oldest first.
pub(crate) async fn pegged_to(
    client: &impl GenericClient,
    id: &ReceiptId,
) -> Result<Vec<Reservation>, Error> {
    read_reservations(client, PEGGED_TO, &[&id.as_str()]).await
}

const PEGGED_TO: &str = concat!(
    "SELECT reservation_id, order_id, state, ",
    effective_state!(),
    ", created_at, expires_at
     FROM reservations WHERE state = 'HELD' AND (expires_at > clock_timestamp() OR waiting > 0)
       AND reservation_id IN (SELECT reservation_id FROM reservation_lines
                              WHERE receipt_id = $1 AND preordered > 0)
     ORDER BY created_at, reservation_id"
);

/// The reservations `ids`, as they are, with their lines, oldest first.
pub(crate) async fn by_ids(
    client: &impl GenericClient,
    ids: &[ReservationId],
) -> Result<Vec<Reservation>, Error> {
    let ids: Vec<uuid::Uuid> = ids.iter().map(ReservationId::as_uuid).collect();
    read_reservations(client, BY_IDS, &[&ids]).await
}

const BY_IDS: &str = concat!(
    "SELECT reservation_id, order_id, state, ",
    effective_state!(),
    ", created_at, expires_at
     FROM reservations WHERE reservation_id = ANY($1)
     ORDER BY created_at, reservation_id"
);

/// Writes the counts of the lines of locked reservations, as they now are.
pub(crate) async fn update_lines(
    tx: &Transaction<'_>,
    reservations: &[&Reservation],
) -> Result<(), tokio_postgres::Error> {
    if reservations.is_empty() {
        return Ok(());
    }
    let statement = tx.prepare_cached(UPDATE_LINES).await?;
    let rows = reservations.iter().flat_map(|r| {
        r.lines.iter().flat_map(move |line| {
            line.allocations
                .iter()
                .map(move |a| (r.id.as_uuid(), line.sku.as_str(), a))
        })
    });
    let (mut ids, mut skus, mut locations, mut confirmed, mut released) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut backordered, mut preordered) = (Vec::new(), Vec::new());
    for (id, sku, allocation) in rows {
        ids.push(id);
        skus.push(sku);
        locations.push(allocation.location.as_str());
        confirmed.push(allocation.confirmed);
        released.push(allocation.released);
        backordered.push(allocation.backordered);
        preordered.push(allocation.preordered);
    }
    tx.execute(
        &statement,
        &[
            &ids,
            &skus,
            &locations,
            &confirmed,
            &released,
            &backordered,
            &preordered,
        ],
    )
    .await?;
    Ok(())
}

/// The callers with reservations of `order_id`, in byte order.
pub(crate) async fn callers_of_order(
    tx: &Transaction<'_>,
    order_id: &OrderId,
) -> Result<Vec<String>, tokio_postgres::Error> {
    let statement = tx.prepare_cached(CALLERS_OF_ORDER).await?;
    let mut callers: Vec<String> = tx
        .query(&statement, &[&order_id.as_str()])
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    callers.sort();
    Ok(callers)
}

/// The live holds of `order_id` among `callers`' reservations, locked, with their lines.
pub(crate) async fn lock_live_of_order(
    tx: &Transaction<'_>,
    order_id: &OrderId,
    callers: &[&str],
) -> Result<Vec<Reservation>, Error> {
    read_reservations(tx, LOCK_LIVE_OF_ORDER, &[&order_id.as_str(), &callers]).await
}

/// The reservations a statement selects as `(reservation_id, order_id, stored state,
/// effective state, created_at, expires_at)`, with their lines.
async fn read_reservations(
    client: &impl GenericClient,
    sql: &str,
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> Result<Vec<Reservation>, Error> {
    let statement = client
        .prepare_cached(sql)
        .await
        .map_err(crate::plumbing::error::from_db)?;
    let rows = client
        .query(&statement, params)
        .await
        .map_err(crate::plumbing::error::from_db)?;
    let mut headers = Vec::with_capacity(rows.len());
    for row in &rows {
        let uuid: uuid::Uuid = row.try_get(0).map_err(Error::internal)?;
        headers.push(Header {
            id: ReservationId::from_uuid(uuid),
            order_id: stored(OrderId::parse(row.try_get(1).map_err(Error::internal)?))?,
            stored_state: state(row, 2)?,
            state: state(row, 3)?,
            created_at: row.try_get(4).map_err(Error::internal)?,
            expires_at: row.try_get(5).map_err(Error::internal)?,
            // Not selected: only a single reservation's use cases need the clock.
            read_at: SystemTime::UNIX_EPOCH,
        });
    }
    let mut lines = lines_of_many(client, &headers).await?;
    Ok(headers
        .into_iter()
        .zip(lines.iter_mut())
        .map(|(header, lines)| header.with_lines(std::mem::take(lines)))
        .collect())
}

/// The stored lines of each reservation, in the order given.
async fn lines_of_many(
    client: &impl GenericClient,
    headers: &[Header],
) -> Result<Vec<Vec<StoredLine>>, Error> {
    let mut lines: Vec<Vec<StoredLine>> = headers.iter().map(|_| Vec::new()).collect();
    if headers.is_empty() {
        return Ok(lines);
    }
    let ids: Vec<uuid::Uuid> = headers.iter().map(|r| r.id.as_uuid()).collect();
    let statement = client
        .prepare_cached(LINES_OF_MANY)
        .await
        .map_err(crate::plumbing::error::from_db)?;
    let rows = client
        .query(&statement, &[&ids])
        .await
        .map_err(crate::plumbing::error::from_db)?;
    for row in &rows {
        let uuid: uuid::Uuid = row.try_get(0).map_err(Error::internal)?;
        if let Some(index) = ids.iter().position(|id| *id == uuid) {
            lines[index].push(line(row, 1)?);
        }
    }
    Ok(lines)
}

fn line(row: &Row, first: usize) -> Result<StoredLine, Error> {
    let count = |index: usize| row.try_get::<_, i64>(index).map_err(Error::internal);
    Ok(StoredLine {
        sku: stored(Sku::parse(row.try_get(first).map_err(Error::internal)?))?,
        location: stored(LocationId::parse(
            row.try_get(first + 1).map_err(Error::internal)?,
        ))?,
        quantity: count(first + 2)?,
        confirmed: count(first + 3)?,
        released: count(first + 4)?,
        backordered: count(first + 5)?,
        preordered: count(first + 6)?,
        receipt: match (
            row.try_get::<_, Option<&str>>(first + 7)
                .map_err(Error::internal)?,
            row.try_get::<_, Option<SystemTime>>(first + 8)
                .map_err(Error::internal)?,
        ) {
            (Some(id), Some(expected_at)) => Some(Peg {
                receipt: stored(ReceiptId::parse(id))?,
                expected_at,
            }),
            _ => None,
        },
    })
}

fn state(row: &Row, index: usize) -> Result<ReservationState, Error> {
    let raw: &str = row.try_get(index).map_err(Error::internal)?;
    ReservationState::parse(raw).ok_or_else(|| Error::internal(format!("unknown state {raw:?}")))
}

/// A stored value that fails its own parser means the schema and the code disagree.
fn stored<T>(parsed: Result<T, String>) -> Result<T, Error> {
    parsed.map_err(|problem| Error::internal(format!("stored value is invalid: {problem}")))
}

/// One page of the reservations `query` names, in creation order (then id), with their lines.
/// The statement is built for the filters set (each combination prepared once per
/// connection), so every one can use its index: `reservations_by_order` with an order,
/// `reservations_by_caller` otherwise.
pub(crate) async fn list(
    client: &impl GenericClient,
    query: &ListReservations,
) -> Result<ReservationPage, Error> {
    let mut conditions: Vec<String> = Vec::new();
    let mut params: Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> = Vec::new();
    let mut bind = |value: Box<dyn tokio_postgres::types::ToSql + Sync + Send>| {
        params.push(value);
        format!("${}", params.len())
    };
    if let Some(owner) = query.scope.owner() {
        let p = bind(Box::new(owner.as_str().to_owned()));
        conditions.push(format!("caller = {p}"));
    }
    if let Some(order_id) = &query.filter.order_id {
        let p = bind(Box::new(order_id.as_str().to_owned()));
        conditions.push(format!("order_id = {p}"));
    }
    // The state as reads show it, spelled out on the stored columns so the planner can use
    // them (a hold past its expiry is EXPIRED, swept or not).
    match query.filter.state {
        None => {}
        Some(ReservationState::Held) => conditions
            .push("state = 'HELD' AND (expires_at > clock_timestamp() OR waiting > 0)".into()),
        Some(ReservationState::Expired) => conditions.push(format!(
            "(state = 'EXPIRED' OR (state = 'HELD' AND expires_at <= clock_timestamp() \
             AND waiting = 0 AND NOT {}))",
            any_confirmed!()
        )),
        Some(ReservationState::Confirmed) => conditions.push(format!(
            "(state = 'CONFIRMED' OR (state = 'HELD' AND expires_at <= clock_timestamp() \
             AND waiting = 0 AND {}))",
            any_confirmed!()
        )),
        Some(settled) => {
            let p = bind(Box::new(settled.as_str()));
            conditions.push(format!("state = {p}"));
        }
    }
    if let Some(sku) = &query.filter.sku {
        let p = bind(Box::new(sku.as_str().to_owned()));
        conditions.push(format!(
            "EXISTS (SELECT 1 FROM reservation_lines l \
             WHERE l.reservation_id = reservations.reservation_id AND l.sku = {p})"
        ));
    }
    if let Some(after) = query.after {
        let created = bind(Box::new(after.created_at));
        let id = bind(Box::new(after.id.as_uuid()));
        conditions.push(format!("(created_at, reservation_id) > ({created}, {id})"));
    }
    // One more than a page: whether there is a next page, without another query.
    let limit = bind(Box::new(
        i64::try_from(query.page_size + 1).unwrap_or(i64::MAX),
    ));
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", conditions.join(" AND "))
    };
    let sql = format!(
        "SELECT reservation_id, order_id, state, {EFFECTIVE_STATE}, created_at, expires_at \
         FROM reservations {filter} ORDER BY created_at, reservation_id LIMIT {limit}"
    );
    let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
        .iter()
        .map(|p| p.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
        .collect();
    let mut reservations = read_reservations(client, &sql, &refs).await?;
    // The row past the page only tells that there is a next page.
    let more = reservations.len() > query.page_size;
    reservations.truncate(query.page_size);
    let next = more
        .then(|| reservations.last())
        .flatten()
        .map(|last| Cursor {
            created_at: last.created_at,
            id: last.id,
        });
    Ok(ReservationPage { reservations, next })
}

/// Every reservation of `order_id` among `callers`' reservations, oldest first (an order has
/// a handful), as every reader sees them.
pub(crate) async fn all_of_order(
    client: &impl GenericClient,
    order_id: &OrderId,
    callers: &[&str],
) -> Result<Vec<Reservation>, Error> {
    read_reservations(client, ALL_OF_ORDER, &[&order_id.as_str(), &callers]).await
}

/// What `caller` holds now, and whether `key` is claimed by it (see
/// [`ReservationStore::holdings`](inventory_core::ports::ReservationStore::holdings)). Walks
/// only the caller's live holds (`reservations_held_by_caller`, V19).
pub(crate) async fn holdings(
    client: &impl GenericClient,
    caller: Option<&Caller>,
    key: &IdempotencyKey,
) -> Result<Holdings, Error> {
    // Two statements, not one with `$1 IS NULL OR ...`: a generic plan of that could not use
    // the index of holds by caller.
    let (sql, params): (_, [&(dyn tokio_postgres::types::ToSql + Sync); 2]) = match &caller {
        Some(caller) => (HOLDINGS_OF_CALLER, [&caller.as_str(), &key.as_str()]),
        None => (HOLDINGS_OF_TENANT, [&"", &key.as_str()]),
    };
    let statement = client
        .prepare_cached(sql)
        .await
        .map_err(crate::plumbing::error::from_db)?;
    let row = client
        .query_one(&statement, &params)
        .await
        .map_err(crate::plumbing::error::from_db)?;
    Ok(Holdings {
        holds: row.get::<_, i64>(0).unsigned_abs(),
        units: row.get::<_, i64>(1).unsigned_abs(),
        key_used: row.get(2),
    })
}

const HOLDINGS_OF_CALLER: &str = "SELECT
     (SELECT count(*) FROM reservations
       WHERE caller = $1 AND state = 'HELD' AND (expires_at > now() OR waiting > 0)),
     (SELECT coalesce(sum(l.quantity - l.confirmed - l.released), 0)::bigint
        FROM reservations r JOIN reservation_lines l USING (reservation_id)
       WHERE r.caller = $1 AND r.state = 'HELD' AND (r.expires_at > now() OR r.waiting > 0)),
     EXISTS (SELECT 1 FROM idempotency_keys WHERE caller = $1 AND key = $2)";

/// Every caller's holds: the tenant's, as a store serves one tenant. (`$1` is unused: the
/// key's caller is asked separately.)
const HOLDINGS_OF_TENANT: &str = "SELECT
     (SELECT count(*) FROM reservations
       WHERE state = 'HELD' AND (expires_at > now() OR waiting > 0)),
     (SELECT coalesce(sum(l.quantity - l.confirmed - l.released), 0)::bigint
        FROM reservations r JOIN reservation_lines l USING (reservation_id)
       WHERE r.state = 'HELD' AND (r.expires_at > now() OR r.waiting > 0)),
     EXISTS (SELECT 1 FROM idempotency_keys WHERE caller = $1 AND key = $2)";
