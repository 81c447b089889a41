//! The verifier: every SKU, at every location, recomputed from its ledger and from the live
//! holds, every drift named. A few statements, each one scan, so it runs at the speed of
//! reading the tables:
//!
//! 1. along each SKU's movements in version order, versions are dense (the first is version
//!    1, or the opening balance; under `LEDGER_RETENTION`, it follows the version pruning
//!    recorded in `ledger_pruned`), and along each (SKU, location)'s, each level is the
//!    previous one plus the movement's deltas (a location's first movement: its own deltas,
//!    unless pruning took the ones before);
//! 2. each (SKU, location)'s last movement is its `stock_locations` row (level and version),
//!    each SKU's last version is its `stock` row's, every row has movements, and each
//!    `stock` row is the sum of its locations;
//! 3. each (SKU, location)'s `reserved` is exactly what `HELD` reservations still hold
//!    there;
//! 4. the states (unsellable units, policy, waiting and incoming units) the same way along
//!    the ledger, against the rows and totals, and `backordered`, `preordered` and `incoming`
//!    against the live holds and open receipts they count.

/// Versions along each SKU, levels along each (SKU, location).
const CHAIN: &str = "
    SELECT c.sku, version, kind, on_hand_delta, reserved_delta, on_hand, reserved,
           prev_version, prev_on_hand, prev_reserved, p.through_version, location_id,
           prev_at_version
    FROM (
        SELECT m.*, lag(version) OVER w AS prev_version,
               lag(version) OVER at AS prev_at_version,
               lag(on_hand) OVER at AS prev_on_hand, lag(reserved) OVER at AS prev_reserved
        FROM stock_movements m
        WINDOW w AS (PARTITION BY sku ORDER BY version),
               at AS (PARTITION BY sku, location_id ORDER BY version)) c
    LEFT JOIN ledger_pruned p ON p.sku = c.sku
    WHERE CASE
        WHEN prev_version IS NULL AND p.through_version IS NOT NULL
            THEN version <> p.through_version + 1
        WHEN prev_version IS NULL
            THEN NOT ((version = 1 OR kind = 'OPENING')
                      AND on_hand = on_hand_delta AND reserved = reserved_delta)
        WHEN version <> prev_version + 1 THEN true
        WHEN prev_at_version IS NULL
            THEN p.through_version IS NULL
                 AND (on_hand <> on_hand_delta OR reserved <> reserved_delta)
        ELSE on_hand <> prev_on_hand + on_hand_delta OR reserved <> prev_reserved + reserved_delta
    END
    ORDER BY c.sku COLLATE \"C\", version";

/// Each location row against its last movement (a location whose every movement was pruned
/// has none: its row is checked through its SKU's total only).
const LAST: &str = "
    SELECT coalesce(s.sku, l.sku), s.on_hand, s.reserved, s.version,
           l.on_hand, l.reserved, l.version, coalesce(s.location_id, l.location_id)
    FROM stock_locations s
    FULL JOIN (SELECT DISTINCT ON (sku, location_id) sku, location_id, on_hand, reserved, version
               FROM stock_movements ORDER BY sku, location_id, version DESC) l
        ON l.sku = s.sku AND l.location_id = s.location_id
    LEFT JOIN ledger_pruned p ON p.sku = s.sku
    WHERE s.sku IS NULL
       OR (l.sku IS NULL AND (p.sku IS NULL OR s.version > p.through_version))
       OR (l.sku IS NOT NULL
           AND (s.on_hand, s.reserved, s.version)
               IS DISTINCT FROM (l.on_hand, l.reserved, l.version))
    ORDER BY coalesce(s.sku, l.sku) COLLATE \"C\", 8";

/// Each SKU's total against the sum of its locations and its last movement's version.
const TOTALS: &str = "
    SELECT s.sku, s.on_hand, s.reserved, s.version, a.on_hand, a.reserved, m.version
    FROM stock s
    LEFT JOIN (SELECT sku, sum(on_hand)::bigint AS on_hand, sum(reserved)::bigint AS reserved
               FROM stock_locations GROUP BY sku) a USING (sku)
    LEFT JOIN (SELECT sku, max(version) AS version FROM stock_movements GROUP BY sku) m
        USING (sku)
    WHERE (s.on_hand, s.reserved) IS DISTINCT FROM (a.on_hand, a.reserved)
       OR s.version IS DISTINCT FROM m.version
    ORDER BY s.sku COLLATE \"C\"";

/// Each location's `reserved` against its live holds, both ways: a hold at a location the SKU
/// has no row for is drift too.
const HELD: &str = "
    SELECT sku, coalesce(s.reserved, 0), coalesce(h.held, 0)::bigint, location_id
    FROM stock_locations s
    FULL JOIN (
        SELECT l.sku, l.location_id, sum(l.quantity - l.confirmed - l.released - l.backordered - l.preordered) AS held
        FROM reservation_lines l JOIN reservations r USING (reservation_id)
        WHERE r.state = 'HELD' GROUP BY l.sku, l.location_id
    ) h USING (sku, location_id)
    WHERE coalesce(s.reserved, 0) <> coalesce(h.held, 0)
    ORDER BY sku COLLATE \"C\", location_id COLLATE \"C\"";

/// The states along each (SKU, location)'s movements, its row against its last movement,
/// each SKU's total against its locations, and the waiting and incoming units against the
/// reservations and receipts that make them up; each drift as `(sku, problem)`. The states
/// are `[damaged, quality_control, safety_stock, backorder_limit, backordered, preordered, incoming]`.
const STATES: &str = "
    WITH c AS (
        SELECT m.sku, m.version, m.kind, m.location_id,
               ARRAY[coalesce(m.damaged, 0), coalesce(m.quality_control, 0), coalesce(m.safety_stock, 0), coalesce(m.backorder_limit, 0), coalesce(m.backordered, 0), coalesce(m.preordered, 0), coalesce(m.incoming, 0)] AS s,
               lag(ARRAY[coalesce(m.damaged, 0), coalesce(m.quality_control, 0), coalesce(m.safety_stock, 0), coalesce(m.backorder_limit, 0), coalesce(m.backordered, 0), coalesce(m.preordered, 0), coalesce(m.incoming, 0)]) OVER at AS prev,
               ARRAY[damaged_delta, quality_control_delta, safety_stock_delta, backorder_limit_delta, backordered_delta, preordered_delta, incoming_delta] AS d,
               row_number() OVER (PARTITION BY m.sku, m.location_id ORDER BY m.version DESC) AS back
        FROM stock_movements m
        WINDOW at AS (PARTITION BY m.sku, m.location_id ORDER BY m.version)
    ), chain AS (
        SELECT c.sku, c.location_id,
               format('version %s (%s) at %s: the states %s moved by %s are not the recorded %s',
                      c.version, c.kind, c.location_id, coalesce(prev, '{0,0,0,0,0,0,0}'), d, s)
        FROM c LEFT JOIN ledger_pruned p ON p.sku = c.sku
        WHERE CASE WHEN prev IS NULL THEN p.through_version IS NULL AND s <> d
                   ELSE s <> ARRAY[prev[1] + d[1], prev[2] + d[2], prev[3] + d[3],
                                   prev[4] + d[4], prev[5] + d[5], prev[6] + d[6],
                                   prev[7] + d[7]] END
    ), last AS (
        SELECT l.sku, l.location_id,
               format('at %s the row''s states are %s, the last movement''s %s',
                      l.location_id, ARRAY[l.damaged, l.quality_control, l.safety_stock, l.backorder_limit, l.backordered, l.preordered, l.incoming], c.s)
        FROM stock_locations l JOIN c ON c.sku = l.sku AND c.location_id = l.location_id
                                      AND c.back = 1
        WHERE ARRAY[l.damaged, l.quality_control, l.safety_stock, l.backorder_limit, l.backordered, l.preordered, l.incoming] <> c.s
    ), totals AS (
        SELECT s.sku, '',
               format('the total''s states are %s; its locations sum to %s',
                      ARRAY[s.damaged, s.quality_control, s.safety_stock, s.backorder_limit, s.backordered, s.preordered, s.incoming], a.s)
        FROM stock s JOIN (
            SELECT sku, ARRAY[sum(damaged)::bigint, sum(quality_control)::bigint, sum(safety_stock)::bigint, sum(backorder_limit)::bigint, sum(backordered)::bigint, sum(preordered)::bigint, sum(incoming)::bigint] AS s
            FROM stock_locations GROUP BY sku) a USING (sku)
        WHERE ARRAY[s.damaged, s.quality_control, s.safety_stock, s.backorder_limit, s.backordered, s.preordered, s.incoming] <> a.s
    ), waiting AS (
        SELECT sku, location_id,
               format('at %s backordered/preordered are %s/%s, live holds wait for %s/%s',
                      location_id, coalesce(l.backordered, 0), coalesce(l.preordered, 0),
                      coalesce(w.backordered, 0), coalesce(w.preordered, 0))
        FROM stock_locations l FULL JOIN (
            SELECT r.sku, r.location_id, sum(r.backordered)::bigint AS backordered,
                   sum(r.preordered)::bigint AS preordered
            FROM reservation_lines r JOIN reservations h USING (reservation_id)
            WHERE h.state = 'HELD' AND (r.backordered > 0 OR r.preordered > 0)
            GROUP BY r.sku, r.location_id) w USING (sku, location_id)
        WHERE (coalesce(l.backordered, 0), coalesce(l.preordered, 0))
              <> (coalesce(w.backordered, 0), coalesce(w.preordered, 0))
    ), incoming AS (
        SELECT sku, location_id,
               format('at %s incoming is %s, open receipts bring %s',
                      location_id, coalesce(l.incoming, 0), coalesce(o.incoming, 0))
        FROM stock_locations l FULL JOIN (
            SELECT sku, location_id, sum(greatest(quantity - received, 0))::bigint AS incoming
            FROM receipts WHERE state = 'OPEN' GROUP BY sku, location_id) o
            USING (sku, location_id)
        WHERE coalesce(l.incoming, 0) <> coalesce(o.incoming, 0)
    ), pegged AS (
        SELECT e.sku, e.location_id,
               format('receipt %s has %s pre-ordered, live holds are pegged to it for %s',
                      e.receipt_id, e.preordered, coalesce(w.preordered, 0))
        FROM receipts e LEFT JOIN (
            SELECT r.receipt_id, sum(r.preordered)::bigint AS preordered
            FROM reservation_lines r JOIN reservations h USING (reservation_id)
            WHERE h.state = 'HELD' AND r.preordered > 0 GROUP BY r.receipt_id) w
            USING (receipt_id)
        WHERE e.preordered <> coalesce(w.preordered, 0)
    )
    SELECT sku, problem FROM (
        SELECT * FROM chain UNION ALL SELECT * FROM last UNION ALL SELECT * FROM totals
        UNION ALL SELECT * FROM waiting UNION ALL SELECT * FROM incoming
        UNION ALL SELECT * FROM pegged) AS d (sku, location_id, problem)
    ORDER BY sku COLLATE \"C\", location_id COLLATE \"C\"";

const COUNTS: &str = "
    SELECT (SELECT count(*) FROM stock), (SELECT count(*) FROM stock_movements)";

pub use inventory_core::upkeep::{Drift, Report};

/// Verifies every SKU, in one read-only snapshot.
pub async fn verify(client: &mut tokio_postgres::Client) -> Result<Report, tokio_postgres::Error> {
    let tx = client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    // A scan of every table: not held to the pool's per-statement bound.
    tx.batch_execute("SET LOCAL statement_timeout = 0").await?;
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
        let location: &str = row.get(11);
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
                let (p_on, p_res): (Option<i64>, Option<i64>) = (row.get(8), row.get(9));
                format!(
                    "version {version} ({kind}) at {location}: {}/{} moved by {d_on}/{d_res} \
                     is not the recorded {on_hand}/{reserved}",
                    p_on.unwrap_or(0),
                    p_res.unwrap_or(0)
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
        let location: &str = row.get(7);
        let problem = match (stock, ledger) {
            (None, _) => format!("movements at {location} with no stock row there"),
            (_, None) => format!("a stock row at {location} with no movements"),
            (Some(version), Some(last)) => {
                let (on_hand, reserved): (i64, i64) = (row.get(1), row.get(2));
                let (l_on, l_res): (i64, i64) = (row.get(4), row.get(5));
                format!(
                    "at {location} the row says {on_hand}/{reserved} at version {version}, \
                     the ledger {l_on}/{l_res} at version {last}"
                )
            }
        };
        report.drifts.push(Drift {
            sku: row.get(0),
            problem,
        });
    }
    for row in tx.query(TOTALS, &[]).await? {
        let (on_hand, reserved, version): (i64, i64, i64) = (row.get(1), row.get(2), row.get(3));
        let (sum_on, sum_res, last): (Option<i64>, Option<i64>, Option<i64>) =
            (row.get(4), row.get(5), row.get(6));
        report.drifts.push(Drift {
            sku: row.get(0),
            problem: format!(
                "the total says {on_hand}/{reserved} at version {version}; its locations sum \
                 to {}/{} and its last movement is version {}",
                sum_on.unwrap_or(0),
                sum_res.unwrap_or(0),
                last.map_or_else(|| "none".to_owned(), |v| v.to_string())
            ),
        });
    }
    for row in tx.query(HELD, &[]).await? {
        let (reserved, held, location): (i64, i64, &str) = (row.get(1), row.get(2), row.get(3));
        report.drifts.push(Drift {
            sku: row.get(0),
            problem: format!("at {location} reserved is {reserved}, live holds hold {held}"),
        });
    }
    for row in tx.query(STATES, &[]).await? {
        report.drifts.push(Drift {
            sku: row.get(0),
            problem: row.get(1),
        });
    }
    tx.commit().await?;
    Ok(report)
}
