//! The row audit: what PostgreSQL holds after a run, read the same way by the benchmark's
//! oversell audit and the fault suite's checker.

use std::fmt;

use serde::Serialize;

/// A reservation as PostgreSQL holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReservationRow {
    pub id: String,
    pub key: String,
    pub order_id: String,
    /// As stored: a hold past its expiry stays `HELD` until the sweeper ends it.
    pub state: String,
    /// (sku, quantity, fence token), by SKU.
    pub lines: Vec<(String, i64, i64)>,
    /// (held, confirmed, released) of each line, in the order of `lines`; see [`reservations`].
    pub units: Vec<(i64, i64, i64)>,
}

/// Where a line's units are: its `confirmed` and `released` columns, plus the rest of the line
/// (`quantity - confirmed - released`, less its waiting units while it is a live hold) where
/// the stored state puts it. The columns are exact
/// while a reservation is `HELD` and once it was settled in parts; one settled in one step
/// keeps zeros, and its whole quantity is the rest. The rest is held by a live `HELD` row
/// (`expires_at` after PostgreSQL's clock, read once for the statement), released by an
/// overdue one (the sweeper will expire it), confirmed by a `CONFIRMED` row and released by a
/// `RELEASED` or `EXPIRED` one.
const UNITS: &str = "
    CASE WHEN u.live THEN u.rest ELSE 0 END,
    l.confirmed + CASE WHEN r.state = 'CONFIRMED' THEN u.rest ELSE 0 END,
    l.released + CASE WHEN u.live OR r.state = 'CONFIRMED' THEN 0 ELSE u.rest END";

/// Every reservation with its lines and their units, in id order; with `order_prefix`, only
/// those whose order id begins with it (one run's, in a shared database).
pub async fn reservations(
    client: &tokio_postgres::Client,
    order_prefix: Option<&str>,
) -> Result<Vec<ReservationRow>, tokio_postgres::Error> {
    let rows = client
        .query(
            &format!(
                "WITH c AS MATERIALIZED (SELECT clock_timestamp() AS now)
                 SELECT r.reservation_id::text, r.idempotency_key, r.order_id, r.state,
                        l.sku, l.quantity, l.fence_token, {UNITS}
                 FROM reservations r
                 JOIN reservation_lines l USING (reservation_id)
                 CROSS JOIN c
                 CROSS JOIN LATERAL (
                     SELECT l.quantity - l.confirmed - l.released
                                - CASE WHEN r.state = 'HELD' AND r.expires_at > c.now
                                       THEN l.backordered + l.preordered ELSE 0 END AS rest,
                            r.state = 'HELD' AND r.expires_at > c.now AS live
                 ) u
                 WHERE $1::text IS NULL OR starts_with(r.order_id, $1::text)
                 ORDER BY r.reservation_id, l.sku COLLATE \"C\", l.location_id COLLATE \"C\""
            ),
            &[&order_prefix],
        )
        .await?;
    let mut reservations: Vec<ReservationRow> = Vec::new();
    for row in rows {
        let id: String = row.get(0);
        let line: (String, i64, i64) = (row.get(4), row.get(5), row.get(6));
        let units: (i64, i64, i64) = (row.get(7), row.get(8), row.get(9));
        match reservations.last_mut() {
            // A line split over locations has a row per location: one line, their sums.
            Some(last) if last.id == id && last.lines.last().is_some_and(|l| l.0 == line.0) => {
                let (same, counts) = (last.lines.last_mut(), last.units.last_mut());
                let (same, counts) = (same.expect("a line"), counts.expect("its units"));
                same.1 += line.1;
                (counts.0, counts.1, counts.2) =
                    (counts.0 + units.0, counts.1 + units.1, counts.2 + units.2);
            }
            Some(last) if last.id == id => {
                last.lines.push(line);
                last.units.push(units);
            }
            _ => reservations.push(ReservationRow {
                id,
                key: row.get(1),
                order_id: row.get(2),
                state: row.get(3),
                lines: vec![line],
                units: vec![units],
            }),
        }
    }
    Ok(reservations)
}

/// A SKU whose stored level disagrees with its rows: `reserved` is not the sum of the units
/// still held on its HELD reservation lines, or is negative, or exceeds `on_hand`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LevelMismatch {
    pub sku: String,
    pub on_hand: i64,
    pub reserved: i64,
    /// Units still held on the SKU's HELD reservation lines (`quantity - confirmed -
    /// released`).
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
/// reservations still hold, or lies outside 0..=on_hand. Empty when the levels match the rows.
///
/// A stored `HELD` reservation holds each line's units not yet confirmed or released in part,
/// whether or not it is past its expiry: `reserved` drops only when the sweeper ends it.
pub async fn reserved_against_holds(
    client: &tokio_postgres::Client,
    skus: Option<&[String]>,
) -> Result<Vec<LevelMismatch>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT s.sku, s.on_hand, s.reserved, coalesce(h.held, 0)::bigint
             FROM stock s
             LEFT JOIN (
                 SELECT l.sku,
                        sum(l.quantity - l.confirmed - l.released - l.backordered
                            - l.preordered) AS held
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
