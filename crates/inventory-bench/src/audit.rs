//! The oversell audit: after the load, what the service reports and what PostgreSQL holds
//! must account for every success the shoppers were told about, and never exceed the stock.

use std::collections::{HashMap, HashSet};

use anyhow::Context as _;
use inventory_proto::GetStockRequest;
use inventory_testkit::audit as rows;
use serde::Serialize;

use crate::load::{Fate, LoadConfig, Observed, Scenario, connect};

#[derive(Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub passed: bool,
    pub detail: String,
}

#[derive(Debug, Serialize)]
pub struct Audit {
    pub passed: bool,
    pub checks: Vec<Check>,
}

impl Audit {
    /// Runs `inventory-server verify` on the run's database: the ledger and the live holds
    /// must agree with every level the run left.
    pub async fn verify_ledger(
        &mut self,
        server: &std::path::Path,
        database_url: &str,
    ) -> anyhow::Result<()> {
        let (verified, report) = inventory_testkit::server::verify(server, database_url).await?;
        let detail = if verified {
            report.lines().last().unwrap_or_default().to_owned()
        } else {
            report
        };
        self.push(
            "the ledger and live holds verify with no drift",
            verified,
            detail,
        );
        Ok(())
    }

    fn push(&mut self, name: &'static str, passed: bool, detail: String) {
        self.passed &= passed;
        self.checks.push(Check {
            name,
            passed,
            detail,
        });
    }
}

/// Units per SKU of the holds the shoppers were told about, by what became of them.
#[derive(Default)]
struct Expected {
    held: i64,
    confirmed: i64,
    released: i64,
}

/// Holds shorter than this are meant to expire during the run: the audit first waits for the
/// sweep to return every one of them (at most this long past their expiry), then expects
/// their units back.
pub const EXPIRING: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits until none of the run's holds is still `HELD` (all expired and swept), polling; the
/// holds left after `EXPIRING` past the last expiry, if any.
async fn swept(config: &LoadConfig, url: &str) -> anyhow::Result<i64> {
    let (db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .context("connect to PostgreSQL for the audit")?;
    tokio::spawn(connection);
    let deadline = std::time::Instant::now() + config.ttl + EXPIRING;
    loop {
        let left: i64 = db
            .query_one(
                "SELECT count(*) FROM reservations
                 WHERE state = 'HELD' AND starts_with(order_id, $1)",
                &[&format!("{}-order-", config.run_id)],
            )
            .await?
            .get(0);
        if left == 0 || std::time::Instant::now() >= deadline {
            return Ok(left);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

pub async fn audit(
    config: &LoadConfig,
    observed: &Observed,
    database_url: Option<&str>,
) -> anyhow::Result<Audit> {
    let mut audit = Audit {
        passed: true,
        checks: Vec::new(),
    };
    // Holds meant to expire: every one must come back, and the levels are judged after.
    let expiring = config.ttl < EXPIRING && config.scenario != Scenario::Race;
    if let (true, Some(url)) = (expiring, database_url) {
        let left = swept(config, url).await?;
        audit.push(
            "every abandoned hold expired and was swept",
            left == 0,
            if left == 0 {
                "no hold of the run is still HELD".to_owned()
            } else {
                format!(
                    "{left} holds still HELD {}s past their expiry",
                    EXPIRING.as_secs()
                )
            },
        );
    }
    let mut expected: HashMap<&str, Expected> = HashMap::new();
    for hold in &observed.held {
        let e = expected.entry(hold.sku.as_str()).or_default();
        match hold.fate {
            // Swept by now: its units are back.
            Fate::Held if expiring && database_url.is_some() => e.released += hold.quantity,
            Fate::Held => e.held += hold.quantity,
            Fate::Confirmed => e.confirmed += hold.quantity,
            Fate::Released => e.released += hold.quantity,
        }
    }
    let ids: HashSet<&str> = observed
        .held
        .iter()
        .map(|h| h.reservation_id.as_str())
        .collect();
    audit.push(
        "distinct reservation ids",
        ids.len() == observed.held.len(),
        format!(
            "{} successes, {} distinct ids",
            observed.held.len(),
            ids.len()
        ),
    );

    // What the service reports.
    let mut client = connect(config).await?.remove(0);
    let mut over = Vec::new();
    let mut mismatched = Vec::new();
    let unknown = observed.indeterminate.len() as i64 * config.quantity;
    for chunk in observed.skus.chunks(100) {
        let levels = client
            .get_stock(GetStockRequest {
                skus: chunk.to_vec(),
                ..Default::default()
            })
            .await
            .context("GetStock for the audit")?
            .into_inner()
            .levels;
        for level in levels {
            let e = expected.get(level.sku.as_str());
            let (held, confirmed, sold) = e.map_or((0, 0, 0), |e| {
                (e.held, e.confirmed, e.held + e.confirmed + e.released)
            });
            if level.reserved > level.on_hand || level.available < 0 || sold > config.stock {
                over.push(format!(
                    "{}: on_hand {} reserved {} sold {sold} of {}",
                    level.sku, level.on_hand, level.reserved, config.stock
                ));
            }
            // Calls with an unknown outcome may account for a little more.
            let reserved_ok = level.reserved >= held && level.reserved - held <= unknown;
            let on_hand_ok = level.on_hand == config.stock - confirmed;
            if !reserved_ok || !on_hand_ok {
                mismatched.push(format!(
                    "{}: on_hand {} (expected {}), reserved {} (expected {held})",
                    level.sku,
                    level.on_hand,
                    config.stock - confirmed,
                    level.reserved
                ));
            }
        }
    }
    audit.push(
        "never more reserved than on hand",
        over.is_empty(),
        summary(&over, "every SKU within its stock"),
    );
    audit.push(
        "levels account for every success",
        mismatched.is_empty(),
        summary(&mismatched, "reserved and on_hand match the successes"),
    );

    if config.scenario == Scenario::Race {
        let units = config.stock.min(config.shoppers as i64 * config.quantity);
        let sold: i64 = observed.held.iter().map(|h| h.quantity).sum();
        let exact = if observed.indeterminate.is_empty() {
            sold == units
        } else {
            sold <= units
        };
        audit.push(
            "race sells exactly the units there are",
            exact,
            format!(
                "{sold} units held of {units} ({} shoppers for {} units, {} indeterminate)",
                config.shoppers,
                config.stock,
                observed.indeterminate.len()
            ),
        );
    }

    if let Some(url) = database_url {
        database_checks(&mut audit, config, observed, url).await?;
    }
    Ok(audit)
}

fn summary(problems: &[String], fine: &str) -> String {
    if problems.is_empty() {
        return fine.to_owned();
    }
    let shown: Vec<&str> = problems.iter().take(5).map(String::as_str).collect();
    format!("{} problems, e.g. {}", problems.len(), shown.join("; "))
}

/// The rows themselves: each success exactly once with its quantity and fate, nothing that
/// nobody was told about (beyond calls with an unknown outcome), levels equal to the rows.
async fn database_checks(
    audit: &mut Audit,
    config: &LoadConfig,
    observed: &Observed,
    url: &str,
) -> anyhow::Result<()> {
    let (db, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .context("connect to PostgreSQL for the audit")?;
    tokio::spawn(connection);
    let reservations = rows::reservations(&db, Some(&format!("{}-order-", config.run_id))).await?;
    // The load's reservations have one line each: a second is a duplicate.
    let mut stored: HashMap<String, (String, String, String, i64)> = HashMap::new();
    let mut duplicates = 0;
    for reservation in reservations {
        duplicates += reservation.lines.len().saturating_sub(1);
        if let Some((sku, quantity, _)) = reservation.lines.into_iter().next() {
            stored.insert(
                reservation.id,
                (reservation.key, reservation.state, sku, quantity),
            );
        }
    }
    let mut problems = Vec::new();
    for hold in &observed.held {
        let want = match hold.fate {
            Fate::Held => "HELD",
            Fate::Confirmed => "CONFIRMED",
            Fate::Released => "RELEASED",
        };
        match stored.get(&hold.reservation_id) {
            None => problems.push(format!("{} reported held, not stored", hold.reservation_id)),
            Some((key, state, sku, quantity)) => {
                let state_ok = state == want || (want == "HELD" && state == "EXPIRED");
                if key != &hold.idempotency_key
                    || !state_ok
                    || sku != &hold.sku
                    || *quantity != hold.quantity
                {
                    problems.push(format!(
                        "{}: stored ({key}, {state}, {sku}, {quantity}), expected ({}, {want}, {}, {})",
                        hold.reservation_id, hold.idempotency_key, hold.sku, hold.quantity
                    ));
                }
            }
        }
    }
    audit.push(
        "every success stored once with its quantity",
        problems.is_empty() && duplicates == 0,
        summary(
            &problems,
            &format!("{} successes, {} rows", observed.held.len(), stored.len()),
        ),
    );

    let reported: HashSet<&str> = observed
        .held
        .iter()
        .map(|h| h.reservation_id.as_str())
        .collect();
    let unknown: HashSet<&str> = observed.indeterminate.iter().map(String::as_str).collect();
    let strays: Vec<String> = stored
        .iter()
        .filter(|(id, (key, ..))| {
            !reported.contains(id.as_str()) && !unknown.contains(key.as_str())
        })
        .map(|(id, (key, ..))| format!("{id} ({key})"))
        .collect();
    audit.push(
        "no reservation nobody was told about",
        strays.is_empty(),
        summary(
            &strays,
            &format!(
                "{} rows beyond the successes, all from {} calls with unknown outcome",
                stored.len() - reported.len().min(stored.len()),
                unknown.len()
            ),
        ),
    );

    let off: Vec<String> = rows::reserved_against_holds(&db, Some(&observed.skus))
        .await?
        .iter()
        .map(ToString::to_string)
        .collect();
    audit.push(
        "stock.reserved equals the held rows",
        off.is_empty(),
        summary(
            &off,
            "every SKU's reserved column matches its HELD reservations",
        ),
    );
    Ok(())
}
