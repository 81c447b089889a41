//! SQL for the `stock_movements` table, the stock ledger: one movement per change of a SKU's
//! level at one location, written by the transaction that makes the change, right after its
//! outbox event.
//!
//! Invariant relied on: every statement that changes a `stock` row is followed, in the same
//! transaction, by [`append`] with one movement per version it produced, so a SKU's versions
//! are exactly its movements. The same call writes the availability events: a call that
//! takes a SKU's total `available` to 0 is followed by `OUT_OF_STOCK`, one that takes it from
//! 0 to more by `BACK_IN_STOCK`.

use std::time::SystemTime;

use deadpool_postgres::{GenericClient, Transaction};
use inventory_core::{
    Error,
    command::{ListStockMovements, MovementPage},
    domain::{LocationId, Movement, MovementKind, OrderId, ReservationId, Sku, States, StockLevel},
};
use uuid::Uuid;

use crate::tables::stock::Moved;

/// The state deltas (`$14`) and levels (`$15`) come seven per movement, in
/// [`States::to_array`] order.
pub(crate) const APPEND: &str = "
    INSERT INTO stock_movements
        (sku, version, kind, on_hand_delta, reserved_delta, on_hand, reserved, reason, actor,
         reservation_id, order_id, idempotency_key, location_id, receipt_id,
         damaged_delta, quality_control_delta, safety_stock_delta, backorder_limit_delta,
         backordered_delta, preordered_delta, incoming_delta,
         damaged, quality_control, safety_stock, backorder_limit, backordered, preordered,
         incoming)
    SELECT u.sku, u.version, u.kind, u.on_hand_delta, u.reserved_delta, u.on_hand, u.reserved,
           u.reason, u.actor, u.reservation_id, u.order_id, u.idempotency_key, u.location_id,
           u.receipt_id,
           d[o], d[o + 1], d[o + 2], d[o + 3], d[o + 4], d[o + 5], d[o + 6],
           l[o], l[o + 1], l[o + 2], l[o + 3], l[o + 4], l[o + 5], l[o + 6]
    FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[],
                $6::bigint[], $7::bigint[], $8::text[], $9::text[], $10::uuid[],
                $11::text[], $12::text[], $13::text[], $16::text[])
        WITH ORDINALITY AS u(sku, version, kind, on_hand_delta, reserved_delta, on_hand,
                             reserved, reason, actor, reservation_id, order_id,
                             idempotency_key, location_id, receipt_id, n),
        LATERAL (SELECT $14::bigint[] AS d, $15::bigint[] AS l, u.n::integer * 7 - 6 AS o) x";

const APPEND_AVAILABILITY: &str = "
    INSERT INTO outbox (event_id, event_type, sku, payload)
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[])";

const PAGE: &str = "
    SELECT version, kind, on_hand_delta, reserved_delta, on_hand, reserved, reason, actor,
           reservation_id, order_id, idempotency_key, occurred_at, location_id,
           damaged_delta, quality_control_delta, safety_stock_delta, backorder_limit_delta,
           backordered_delta, preordered_delta, incoming_delta,
           coalesce(damaged, 0), coalesce(quality_control, 0), coalesce(safety_stock, 0),
           coalesce(backorder_limit, 0), coalesce(backordered, 0), coalesce(preordered, 0),
           coalesce(incoming, 0), receipt_id
    FROM stock_movements WHERE sku = $1 AND version > $2 ORDER BY version LIMIT $3";

const SKU_EXISTS: &str = "
    SELECT EXISTS (SELECT 1 FROM stock WHERE sku = $1)
        OR EXISTS (SELECT 1 FROM stock_movements WHERE sku = $1)";

/// Who made a change, why, and what it belongs to: the same for every movement of one call.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cause<'a> {
    pub actor: &'a str,
    pub reason: &'a str,
    pub idempotency_key: Option<&'a str>,
    pub reservation: Option<(ReservationId, &'a OrderId)>,
}

impl<'a> Cause<'a> {
    /// A call's caller, reason and key.
    pub fn call(actor: &'a str, reason: &'a str, idempotency_key: Option<&'a str>) -> Self {
        Self {
            actor,
            reason,
            idempotency_key,
            reservation: None,
        }
    }

    pub fn of_reservation(mut self, id: ReservationId, order_id: &'a OrderId) -> Self {
        self.reservation = Some((id, order_id));
        self
    }
}

/// A movement about to be written: the location's level right after it, the SKU's total
/// right after it (which availability events are about), and its deltas.
#[derive(Clone, Debug)]
pub(crate) struct NewMovement<'a> {
    pub kind: MovementKind,
    pub level: StockLevel,
    pub total: StockLevel,
    pub on_hand_delta: i64,
    pub reserved_delta: i64,
    pub states_delta: States,
    /// The receipt the movement belongs to.
    pub receipt: Option<&'a str>,
    pub cause: Cause<'a>,
    /// Whether the location is active (its share of the total's `apart`).
    pub active: bool,
}

impl<'a> NewMovement<'a> {
    pub fn new(kind: MovementKind, moved: &Moved, on_hand: i64, reserved: i64) -> Self {
        Self {
            kind,
            level: moved.level.clone(),
            total: moved.total.clone(),
            on_hand_delta: on_hand,
            reserved_delta: reserved,
            states_delta: States::default(),
            receipt: None,
            cause: Cause::default(),
            active: moved.active,
        }
    }

    /// With the states' deltas.
    pub fn with_states(mut self, delta: States) -> Self {
        self.states_delta = delta;
        self
    }

    /// Belonging to a receipt.
    pub fn of_receipt(mut self, receipt: &'a str) -> Self {
        self.receipt = Some(receipt);
        self
    }

    pub fn because(mut self, cause: Cause<'a>) -> Self {
        self.cause = cause;
        self
    }

    /// Units of `kind` moving `units` held units of a reservation: a hold raises `reserved`,
    /// a confirm lowers both columns, a release or expiry lowers `reserved`.
    pub fn of_units(kind: MovementKind, moved: &Moved, units: i64) -> Self {
        let (on_hand, reserved) = match kind {
            MovementKind::Held => (0, units),
            MovementKind::Confirmed => (-units, -units),
            _ => (0, -units),
        };
        Self::new(kind, moved, on_hand, reserved)
    }

    /// The SKU's `available` (over every location: a storefront sells the SKU, not a
    /// location's units) before the change.
    fn available_before(&self) -> i64 {
        let undo = |level: &StockLevel| StockLevel {
            on_hand: level.on_hand - self.on_hand_delta,
            reserved: level.reserved - self.reserved_delta,
            states: level.states.minus(&self.states_delta),
            ..level.clone()
        };
        // Only this movement's location changed its share of what is apart.
        let share = |level: &StockLevel| level.share_apart(self.active);
        StockLevel {
            apart: self.total.apart - share(&self.level) + share(&undo(&self.level)),
            ..undo(&self.total)
        }
        .available()
    }
}

/// Writes the movements (one array statement) and the availability events they cause.
pub(crate) async fn append(
    tx: &Transaction<'_>,
    movements: &[NewMovement<'_>],
) -> Result<(), tokio_postgres::Error> {
    if movements.is_empty() {
        return Ok(());
    }
    let statement = tx.prepare_cached(APPEND).await?;
    let mut columns = Columns::default();
    for m in movements {
        columns.push(m);
    }
    tx.execute(&statement, &columns.params()).await?;
    let crossings = crossings(movements);
    if crossings.is_empty() {
        return Ok(());
    }
    let statement = tx.prepare_cached(APPEND_AVAILABILITY).await?;
    let ids: Vec<Uuid> = crossings.iter().map(|_| Uuid::new_v4()).collect();
    let types: Vec<&str> = crossings.iter().map(|(_, t)| *t).collect();
    let skus: Vec<&str> = crossings
        .iter()
        .map(|(m, _)| m.level.sku.as_str())
        .collect();
    let payloads: Vec<serde_json::Value> = crossings
        .iter()
        .map(|(m, _)| crate::tables::outbox::level_payload(&m.total))
        .collect();
    tx.execute(&statement, &[&ids, &types, &skus, &payloads])
        .await?;
    Ok(())
}

/// The availability events of one call's movements: per SKU, from its `available` before the
/// call's first movement of it to after the last, so a change that passes through 0 and
/// back within the transaction (a transfer, a batch of counts moving units between
/// locations) announces nothing nobody could see. Not for a SKU the call created: its own
/// event says so, and there was nothing to be back in stock. In the order of each SKU's
/// last movement.
fn crossings<'m, 'a>(movements: &'m [NewMovement<'a>]) -> Vec<(&'m NewMovement<'a>, &'static str)> {
    let mut crossings = Vec::new();
    for (index, last) in movements.iter().enumerate() {
        let sku = &last.total.sku;
        if movements[index + 1..].iter().any(|m| &m.total.sku == sku) {
            continue;
        }
        let first = movements
            .iter()
            .find(|m| &m.total.sku == sku)
            .expect("the SKU's last movement is one of them");
        if first.total.version == 1 {
            continue;
        }
        match (first.available_before() > 0, last.total.available() > 0) {
            (true, false) => crossings.push((last, OUT_OF_STOCK)),
            (false, true) => crossings.push((last, BACK_IN_STOCK)),
            _ => {}
        }
    }
    crossings
}

pub(crate) const OUT_OF_STOCK: &str = "OUT_OF_STOCK";
pub(crate) const BACK_IN_STOCK: &str = "BACK_IN_STOCK";

/// The columns of [`APPEND`], one array each.
#[derive(Default)]
struct Columns<'a> {
    skus: Vec<&'a str>,
    versions: Vec<i64>,
    kinds: Vec<&'static str>,
    on_hand_deltas: Vec<i64>,
    reserved_deltas: Vec<i64>,
    on_hands: Vec<i64>,
    reserveds: Vec<i64>,
    reasons: Vec<&'a str>,
    actors: Vec<&'a str>,
    reservation_ids: Vec<Option<Uuid>>,
    order_ids: Vec<Option<&'a str>>,
    keys: Vec<Option<&'a str>>,
    locations: Vec<&'a str>,
    state_deltas: Vec<i64>,
    state_levels: Vec<i64>,
    receipts: Vec<Option<&'a str>>,
}

impl<'a> Columns<'a> {
    fn push(&mut self, m: &'a NewMovement<'a>) {
        self.skus.push(m.level.sku.as_str());
        self.versions.push(m.level.version);
        self.kinds.push(m.kind.as_str());
        self.on_hand_deltas.push(m.on_hand_delta);
        self.reserved_deltas.push(m.reserved_delta);
        self.on_hands.push(m.level.on_hand);
        self.reserveds.push(m.level.reserved);
        self.reasons.push(m.cause.reason);
        self.actors.push(m.cause.actor);
        self.reservation_ids
            .push(m.cause.reservation.map(|(id, _)| id.as_uuid()));
        self.order_ids
            .push(m.cause.reservation.map(|(_, order)| order.as_str()));
        self.keys.push(m.cause.idempotency_key);
        self.locations.push(
            m.level
                .location
                .as_ref()
                .map_or(LocationId::DEFAULT, LocationId::as_str),
        );
        self.state_deltas.extend(m.states_delta.to_array());
        self.state_levels.extend(m.level.states.to_array());
        self.receipts.push(m.receipt);
    }

    fn params(&self) -> [&(dyn tokio_postgres::types::ToSql + Sync); 16] {
        [
            &self.skus,
            &self.versions,
            &self.kinds,
            &self.on_hand_deltas,
            &self.reserved_deltas,
            &self.on_hands,
            &self.reserveds,
            &self.reasons,
            &self.actors,
            &self.reservation_ids,
            &self.order_ids,
            &self.keys,
            &self.locations,
            &self.state_deltas,
            &self.state_levels,
            &self.receipts,
        ]
    }
}

/// One page of a SKU's movements, in version order; a SKU that never existed is unknown.
pub(crate) async fn page(
    client: &impl GenericClient,
    query: &ListStockMovements,
) -> Result<MovementPage, Error> {
    let statement = client
        .prepare_cached(PAGE)
        .await
        .map_err(crate::plumbing::error::from_db)?;
    let limit = i64::try_from(query.page_size + 1).unwrap_or(i64::MAX);
    let rows = client
        .query(&statement, &[&query.sku.as_str(), &query.cursor, &limit])
        .await
        .map_err(crate::plumbing::error::from_db)?;
    if rows.is_empty() {
        let exists = client
            .query_one(SKU_EXISTS, &[&query.sku.as_str()])
            .await
            .map_err(crate::plumbing::error::from_db)?;
        if !exists.get::<_, bool>(0) {
            return Err(Error::UnknownSkus(vec![query.sku.clone()]));
        }
    }
    let mut movements = rows
        .iter()
        .map(|row| movement(&query.sku, row))
        .collect::<Result<Vec<_>, Error>>()?;
    let more = movements.len() > query.page_size;
    movements.truncate(query.page_size);
    let next = more
        .then(|| movements.last().map(|m| m.level.version))
        .flatten();
    Ok(MovementPage { movements, next })
}

fn movement(sku: &Sku, row: &tokio_postgres::Row) -> Result<Movement, Error> {
    let get_err = Error::internal;
    let kind: &str = row.try_get(1).map_err(get_err)?;
    let reservation_id: Option<Uuid> = row.try_get(8).map_err(get_err)?;
    let order_id: Option<&str> = row.try_get(9).map_err(get_err)?;
    let location: &str = row.try_get(12).map_err(get_err)?;
    let states = |first: usize| -> Result<States, Error> {
        let mut counts = [0; 7];
        for (i, count) in counts.iter_mut().enumerate() {
            *count = row.try_get(first + i).map_err(get_err)?;
        }
        Ok(States::from_array(counts))
    };
    Ok(Movement {
        kind: MovementKind::parse(kind)
            .ok_or_else(|| Error::internal(format!("unknown movement kind {kind:?}")))?,
        level: StockLevel {
            sku: sku.clone(),
            on_hand: row.try_get(4).map_err(get_err)?,
            reserved: row.try_get(5).map_err(get_err)?,
            version: row.try_get(0).map_err(get_err)?,
            location: Some(LocationId::parse(location).map_err(Error::internal)?),
            states: states(20)?,
            apart: 0,
        },
        on_hand_delta: row.try_get(2).map_err(get_err)?,
        reserved_delta: row.try_get(3).map_err(get_err)?,
        states_delta: states(13)?,
        receipt_id: row.try_get(27).map_err(get_err)?,
        reason: row.try_get(6).map_err(get_err)?,
        actor: row.try_get(7).map_err(get_err)?,
        reservation_id: reservation_id.map(ReservationId::from_uuid),
        order_id: order_id
            .map(OrderId::parse)
            .transpose()
            .map_err(Error::internal)?,
        idempotency_key: row.try_get(10).map_err(get_err)?,
        occurred_at: row.try_get::<_, SystemTime>(11).map_err(get_err)?,
    })
}
