//! The verifier: every SKU recomputed from its ledger and from the live holds, every drift
//! named. Three statements, each one scan, so it runs at the speed of reading the tables:
//!
//! 1. along each SKU's movements in version order, versions are dense and each level is the
//!    previous one plus the movement's deltas (the first movement is version 1, or the
//!    opening balance, and its level is its own deltas; under `LEDGER_RETENTION`, it follows
//!    the version pruning recorded in `ledger_pruned`);
//! 2. each SKU's last movement is its `stock` row (level and version), and every `stock` row
//!    has movements;
//! 3. each SKU's `reserved` is exactly what its `HELD` reservations still hold.

use std::fmt;

use serde::Serialize;

const CHAIN: &str = "
    SELECT c.sku, version, kind, on_hand_delta, reserved_delta, on_hand, reserved,
           prev_version, prev_on_hand, prev_reserved, p.through_version
    FROM (
        SELECT m.*, lag(version) OVER w AS prev_version, lag(on_hand) OVER w AS prev_on_hand,
               lag(reserved) OVER w AS prev_reserved
        FROM stock_movements m WINDOW w AS (PARTITION BY sku ORDER BY version)) c
    LEFT JOIN ledger_pruned p ON p.sku = c.sku
    WHERE CASE
        WHEN prev_version IS NULL AND p.through_version IS NOT NULL
            THEN version <> p.through_version + 1
        WHEN prev_version IS NULL
            THEN NOT ((version = 1 OR kind = 'OPENING')
                      AND on_hand = on_hand_delta AND reserved = reserved_delta)
        ELSE version <> prev_version + 1 OR on_hand <> prev_on_hand + on_hand_delta
             OR reserved <> prev_reserved + reserved_delta
    END
    ORDER BY c.sku COLLATE \"C\", version";

const LAST: &str = "
    SELECT coalesce(s.sku, l.sku), s.on_hand, s.reserved, s.version,
           l.on_hand, l.reserved, l.version
    FROM stock s
    FULL JOIN (SELECT DISTINCT ON (sku) sku, on_hand, reserved, version FROM stock_movements
               ORDER BY sku, version DESC) l ON l.sku = s.sku
    WHERE s.sku IS NULL OR l.sku IS NULL
       OR (s.on_hand, s.reserved, s.version) IS DISTINCT FROM (l.on_hand, l.reserved, l.version)
    ORDER BY coalesce(s.sku, l.sku) COLLATE \"C\"";

const HELD: &str = "
    SELECT s.sku, s.reserved, coalesce(h.held, 0)::bigint
    FROM stock s
    LEFT JOIN (
        SELECT l.sku, sum(l.quantity - l.confirmed - l.released) AS held
        FROM reservation_lines l JOIN reservations r USING (reservation_id)
        WHERE r.state = 'HELD' GROUP BY l.sku
    ) h USING (sku)
    WHERE s.reserved <> coalesce(h.held, 0)
    ORDER BY s.sku COLLATE \"C\"";

const COUNTS: &str = "
    SELECT (SELECT count(*) FROM stock), (SELECT count(*) FROM stock_movements)";

/// One disagreement, named by SKU (and version, for a broken chain).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Drift {
    pub sku: String,
    pub problem: String,
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.sku, self.problem)
    }
}

/// What a verification examined and found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    pub skus: i64,
    pub movements: i64,
    pub drifts: Vec<Drift>,
}

/// Verifies every SKU, in one read-only snapshot.
pub async fn verify(client: &mut tokio_postgres::Client) -> Result<Report, tokio_postgres::Error> {
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let counts = tx.query_one(COUNTS, &[]).await?;
    let mut report = Report {
        skus: counts.get(0),
        movements: counts.get(1),
        drifts: Vec::new(),
    };
    for row in tx.query(CHAIN, &[]).await? {
        let (version, kind): (i64, &str) = (row.get(1), row.get(2));
        let (d_on, d_res, on_hand, reserved): (i64, i64, i64, i64) =
            (row.get(3), row.get(4), row.get(5), row.get(6));
        let previous: Option<i64> = row.get(7);
        let pruned: Option<i64> = row.get(10);
        let problem = match (previous, pruned) {
            (None, Some(through)) => format!(
                "pruned through version {through}, yet the ledger resumes at version {version}: \
                 movements are missing"
            ),
            (None, None) => format!(
                "the ledger begins at version {version} ({kind}) with {on_hand}/{reserved} \
                 (on hand/reserved) from deltas {d_on}/{d_res}"
            ),
            (Some(previous), _) if version != previous + 1 => {
                format!("version {version} follows version {previous}: movements are missing")
            }
            (Some(_), _) => {
                let (p_on, p_res): (i64, i64) = (row.get(8), row.get(9));
                format!(
                    "version {version} ({kind}): {p_on}/{p_res} moved by {d_on}/{d_res} is not \
                     the recorded {on_hand}/{reserved}"
                )
            }
        };
        report.drifts.push(Drift {
            sku: row.get(0),
            problem,
        });
    }
    for row in tx.query(LAST, &[]).await? {
        let stock: Option<i64> = row.get(3);
        let ledger: Option<i64> = row.get(6);
        let problem = match (stock, ledger) {
            (None, _) => "movements for a SKU with no stock row".to_owned(),
            (_, None) => "a stock row with no movements".to_owned(),
            (Some(version), Some(last)) => {
                let (on_hand, reserved): (i64, i64) = (row.get(1), row.get(2));
                let (l_on, l_res): (i64, i64) = (row.get(4), row.get(5));
                format!(
                    "the row says {on_hand}/{reserved} at version {version}, the ledger \
                     {l_on}/{l_res} at version {last}"
                )
            }
        };
        report.drifts.push(Drift {
            sku: row.get(0),
            problem,
        });
    }
    for row in tx.query(HELD, &[]).await? {
        let (reserved, held): (i64, i64) = (row.get(1), row.get(2));
        report.drifts.push(Drift {
            sku: row.get(0),
            problem: format!("reserved is {reserved}, live holds hold {held}"),
        });
    }
    tx.commit().await?;
    Ok(report)
}
