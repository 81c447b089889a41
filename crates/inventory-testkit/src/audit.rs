//! The row audit: what PostgreSQL holds after a run, read the same way by the benchmark's
//! oversell audit and the fault suite's checker.

use std::fmt;

use serde::Serialize;

/// A reservation as PostgreSQL holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReservationRow {
    pub id: String,
    pub key: String,
    pub state: String,
    /// (sku, quantity, fence token), by SKU.
    pub lines: Vec<(String, i64, i64)>,
}

/// Every reservation with its lines, in id order; with `order_prefix`, only those whose order
/// id begins with it (one run's, in a shared database).
pub async fn reservations(
    client: &tokio_postgres::Client,
    order_prefix: Option<&str>,
) -> Result<Vec<ReservationRow>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT r.reservation_id::text, r.idempotency_key, r.state, l.sku, l.quantity, l.fence_token
             FROM reservations r JOIN reservation_lines l USING (reservation_id)
             WHERE $1::text IS NULL OR starts_with(r.order_id, $1::text)
             ORDER BY r.reservation_id, l.sku COLLATE \"C\"",
            &[&order_prefix],
        )
        .await?;
    let mut reservations: Vec<ReservationRow> = Vec::new();
    for row in rows {
        let id: String = row.get(0);
        let line = (row.get(3), row.get(4), row.get(5));
        match reservations.last_mut() {
            Some(last) if last.id == id => last.lines.push(line),
            _ => reservations.push(ReservationRow {
                id,
                key: row.get(1),
                state: row.get(2),
                lines: vec![line],
            }),
        }
    }
    Ok(reservations)
}

/// A SKU whose stored level disagrees with its rows: `reserved` is not the sum of its HELD
/// reservation lines, or is negative, or exceeds `on_hand`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LevelMismatch {
    pub sku: String,
    pub on_hand: i64,
    pub reserved: i64,
    /// Units on the SKU's HELD reservation lines.
    pub held: i64,
}

impl fmt::Display for LevelMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: reserved {}, held rows {}, on_hand {}",
            self.sku, self.reserved, self.held, self.on_hand
        )
    }
}

/// Every SKU (of `skus`, or all) whose `stock.reserved` is not exactly what its HELD
/// reservations hold, or lies outside 0..=on_hand. Empty when the levels match the rows.
pub async fn reserved_against_holds(
    client: &tokio_postgres::Client,
    skus: Option<&[String]>,
) -> Result<Vec<LevelMismatch>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT s.sku, s.on_hand, s.reserved, coalesce(h.held, 0)::bigint
             FROM stock s
             LEFT JOIN (
                 SELECT l.sku, sum(l.quantity) AS held
                 FROM reservation_lines l JOIN reservations r USING (reservation_id)
                 WHERE r.state = 'HELD'
                 GROUP BY l.sku
             ) h USING (sku)
             WHERE ($1::text[] IS NULL OR s.sku = ANY($1::text[]))
               AND (s.reserved <> coalesce(h.held, 0) OR s.reserved < 0 OR s.reserved > s.on_hand)
             ORDER BY s.sku COLLATE \"C\"",
            &[&skus],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| LevelMismatch {
            sku: row.get(0),
            on_hand: row.get(1),
            reserved: row.get(2),
            held: row.get(3),
        })
        .collect())
}

#[cfg(test)]
mod tests;
