//! SQL for the `receipts` table: incoming receipts (purchase order lines), what each has
//! brought and what pre-orders are pegged to it.
//!
//! Invariant relied on: a receipt's row is written only under its SKU's `stock` row lock,
//! like every other row of the SKU. `preordered` moves only by [`peg`] and [`unpeg`] (a
//! Reserve pegs at most the unpromised remainder; fills and released holds unpeg), never by
//! [`update`]; `preordered <= quantity` is a CHECK.

use deadpool_postgres::GenericClient;
use inventory_core::{
    Error,
    command::{ListReceipts, ReceiptPage},
    domain::{LocationId, Receipt, ReceiptId, ReceiptState, Sku},
};
use tokio_postgres::Row;

use crate::plumbing::error::from_db;

const COLUMNS: &str = "receipt_id, sku, location_id, quantity, received, preordered, expected_at, \
                       state, created_at";

/// A new receipt; nothing comes back when the id is taken.
const INSERT: &str = "
    INSERT INTO receipts (receipt_id, sku, location_id, quantity, expected_at, reason)
    VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (receipt_id) DO NOTHING
    RETURNING receipt_id, sku, location_id, quantity, received, preordered, expected_at, state,
              created_at";

const UPDATE: &str = "
    UPDATE receipts SET received = $2, state = $3, updated_at = clock_timestamp()
    WHERE receipt_id = $1";

/// Turns a row of [`COLUMNS`] into a receipt.
fn receipt(row: &Row) -> Result<Receipt, Error> {
    let get = |e| Error::internal(e);
    let state: &str = row.try_get(7).map_err(get)?;
    Ok(Receipt {
        id: ReceiptId::parse(row.try_get(0).map_err(get)?).map_err(Error::internal)?,
        sku: Sku::parse(row.try_get(1).map_err(get)?).map_err(Error::internal)?,
        location: LocationId::parse(row.try_get(2).map_err(get)?).map_err(Error::internal)?,
        quantity: row.try_get(3).map_err(get)?,
        received: row.try_get(4).map_err(get)?,
        preordered: row.try_get(5).map_err(get)?,
        expected_at: row.try_get(6).map_err(get)?,
        state: ReceiptState::parse(state)
            .ok_or_else(|| Error::internal(format!("unknown receipt state {state:?}")))?,
        created_at: row.try_get(8).map_err(get)?,
    })
}

/// Inserts `receipt`'s id, SKU, location, quantity and date; `None` if the id is taken.
pub(crate) async fn insert(
    client: &impl GenericClient,
    new: &Receipt,
    reason: &str,
) -> Result<Option<Receipt>, Error> {
    let statement = client.prepare_cached(INSERT).await.map_err(from_db)?;
    let row = client
        .query_opt(
            &statement,
            &[
                &new.id.as_str(),
                &new.sku.as_str(),
                &new.location.as_str(),
                &new.quantity,
                &new.expected_at,
                &reason,
            ],
        )
        .await
        .map_err(from_db)?;
    row.as_ref().map(receipt).transpose()
}

/// The receipt `id` as it is (under its SKU's lock, when the caller holds it).
pub(crate) async fn read(
    client: &impl GenericClient,
    id: &ReceiptId,
) -> Result<Option<Receipt>, Error> {
    let sql = format!("SELECT {COLUMNS} FROM receipts WHERE receipt_id = $1");
    let statement = client.prepare_cached(&sql).await.map_err(from_db)?;
    let row = client
        .query_opt(&statement, &[&id.as_str()])
        .await
        .map_err(from_db)?;
    row.as_ref().map(receipt).transpose()
}

/// Writes what a change made of `receipt`: received and state.
pub(crate) async fn update(client: &impl GenericClient, after: &Receipt) -> Result<(), Error> {
    let statement = client.prepare_cached(UPDATE).await.map_err(from_db)?;
    client
        .execute(
            &statement,
            &[&after.id.as_str(), &after.received, &after.state.as_str()],
        )
        .await
        .map_err(from_db)?;
    Ok(())
}

/// Pre-ordered units no longer pegged to their receipts (filled, or released with their
/// hold): `(receipt, units)`, a receipt possibly several times.
pub(crate) async fn unpeg(
    client: &impl GenericClient,
    units: &[(&ReceiptId, i64)],
) -> Result<(), Error> {
    if units.is_empty() {
        return Ok(());
    }
    let statement = client
        .prepare_cached(
            "UPDATE receipts e SET preordered = e.preordered - u.units,
                                   updated_at = clock_timestamp()
             FROM (SELECT id, sum(n)::bigint AS units
                   FROM unnest($1::text[], $2::bigint[]) AS v(id, n) GROUP BY id) u
             WHERE e.receipt_id = u.id",
        )
        .await
        .map_err(from_db)?;
    let ids: Vec<&str> = units.iter().map(|(id, _)| id.as_str()).collect();
    let counts: Vec<i64> = units.iter().map(|(_, n)| *n).collect();
    client
        .execute(&statement, &[&ids, &counts])
        .await
        .map_err(from_db)?;
    Ok(())
}

/// Units of new holds pegged to their receipts: `(receipt, units)`.
pub(crate) async fn peg(
    client: &impl GenericClient,
    units: &[(&ReceiptId, i64)],
) -> Result<(), Error> {
    let negated: Vec<(&ReceiptId, i64)> = units.iter().map(|(id, n)| (*id, -n)).collect();
    unpeg(client, &negated).await
}

/// The receipts of `skus` that count in what may be promised: the open ones, and the closed
/// ones with pre-ordered units still pegged (at risk); by SKU, location and expected date.
pub(crate) async fn counted_of(
    client: &impl GenericClient,
    skus: &[Sku],
) -> Result<Vec<Receipt>, Error> {
    let sql = format!(
        "SELECT {COLUMNS} FROM receipts WHERE sku = ANY($1) AND (state = 'OPEN' OR preordered > 0)
         ORDER BY sku COLLATE \"C\", location_id COLLATE \"C\", expected_at, receipt_id"
    );
    let statement = client.prepare_cached(&sql).await.map_err(from_db)?;
    let names: Vec<&str> = skus.iter().map(Sku::as_str).collect();
    let rows = client.query(&statement, &[&names]).await.map_err(from_db)?;
    rows.iter().map(receipt).collect()
}

/// One page of receipts (of one SKU, or every one), by id.
pub(crate) async fn page(
    client: &impl GenericClient,
    query: &ListReceipts,
) -> Result<ReceiptPage, Error> {
    let sql = format!(
        "SELECT {COLUMNS} FROM receipts
         WHERE ($1::text IS NULL OR sku = $1) AND ($2::text IS NULL OR receipt_id > $2)
         ORDER BY receipt_id LIMIT $3"
    );
    let statement = client.prepare_cached(&sql).await.map_err(from_db)?;
    let limit = i64::try_from(query.page_size + 1).unwrap_or(i64::MAX);
    let rows = client
        .query(
            &statement,
            &[
                &query.sku.as_ref().map(Sku::as_str),
                &query.after.as_ref().map(ReceiptId::as_str),
                &limit,
            ],
        )
        .await
        .map_err(from_db)?;
    let mut receipts = rows.iter().map(receipt).collect::<Result<Vec<_>, _>>()?;
    let more = receipts.len() > query.page_size;
    receipts.truncate(query.page_size);
    let next = more
        .then(|| receipts.last().map(|r| r.id.clone()))
        .flatten();
    Ok(ReceiptPage { receipts, next })
}
