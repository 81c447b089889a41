//! Along each SKU's holds in commit order, the fencing token never goes down: it goes up from
//! one transaction to the next and stays the same within one.

use std::collections::{BTreeMap, HashMap};

use super::{Check, Facts, ReservationRow, Verdict, version_of};
use crate::history::SeenEvent;

pub(super) fn fences_increase(
    stream: &[SeenEvent],
    facts: &Facts,
    rows: &HashMap<&str, &ReservationRow>,
) -> Check {
    let mut v = Verdict::new("fences_increase_in_commit_order");
    let tx_of: HashMap<&str, &str> = facts
        .outbox
        .iter()
        .map(|o| (o.event_id.as_str(), o.tx_id.as_str()))
        .collect();
    // Per SKU: (version = commit order, fence, transaction).
    let mut per_sku: BTreeMap<&str, Vec<(i64, i64, &str)>> = BTreeMap::new();
    for e in stream.iter().filter(|e| e.event_type == "RESERVATION_HELD") {
        let Some(row) = e.reservation_id.as_deref().and_then(|id| rows.get(id)) else {
            v.fail(format!("event {}: no stored reservation", e.sequence));
            continue;
        };
        for (sku, _, fence) in &row.lines {
            let Some(version) = version_of(e, sku) else {
                v.fail(format!("event {}: no level for {sku}", e.sequence));
                continue;
            };
            let tx = tx_of.get(e.event_id.as_str()).copied().unwrap_or("");
            per_sku.entry(sku).or_default().push((version, *fence, tx));
        }
    }
    for (sku, mut holds) in per_sku {
        holds.sort();
        for pair in holds.windows(2) {
            v.examined += 1;
            let ((_, f0, t0), (version, f1, t1)) = (pair[0], pair[1]);
            let ok = if t0 == t1 { f1 == f0 } else { f1 > f0 };
            if !ok {
                v.fail(format!("{sku} v{version}: fence {f1} after {f0}"));
            }
        }
    }
    v.note = format!("{} consecutive holds compared", v.examined);
    v.done()
}
