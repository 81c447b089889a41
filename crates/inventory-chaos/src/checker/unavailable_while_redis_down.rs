//! While Redis cannot grant a lease, `Reserve` fails closed and says so: `UNAVAILABLE`.

use super::{Check, Outage, Verdict};
use crate::history::{History, OpKind};

/// How long after an outage starts a `Reserve` may still complete on a lease granted before it
/// (the grant was on its way back when Redis went away).
const OUTAGE_GRACE_MS: f64 = 100.0;

pub(super) fn unavailable_while_redis_down(history: &History, outages: &[Outage]) -> Check {
    let mut v = Verdict::new("unavailable_while_redis_down");
    let mut unavailable = 0;
    for outage in outages {
        let before = v.examined;
        for op in history.ops.iter().filter(|o| o.kind == OpKind::Reserve) {
            let inside = op.invoked_ms >= outage.start_ms + OUTAGE_GRACE_MS
                && op.completed_ms <= outage.end_ms;
            let affected = outage
                .skus
                .as_ref()
                .is_none_or(|skus| op.lines.iter().any(|l| skus.contains(&l.sku)));
            if !inside || !affected {
                continue;
            }
            v.examined += 1;
            // Fail closed, and say so: UNAVAILABLE, never success, never a vaguer error.
            if op.code == "Unavailable" {
                unavailable += 1;
            } else {
                v.fail(format!(
                    "{}: {} answered {} at {:.0}–{:.0} ms during {} ({:.0}–{:.0} ms)",
                    op.key.as_deref().unwrap_or(""),
                    op.lines.first().map_or("", |l| l.sku.as_str()),
                    op.code,
                    op.invoked_ms,
                    op.completed_ms,
                    outage.fault,
                    outage.start_ms,
                    outage.end_ms
                ));
            }
        }
        // An outage of any length with no call inside it proved nothing.
        let covered = outage.skus.as_ref().is_none_or(|skus| !skus.is_empty());
        if covered && v.examined == before && outage.end_ms - outage.start_ms >= 1_000.0 {
            v.fail(format!(
                "{} ({:.0}–{:.0} ms): no Reserve call came and went inside it",
                outage.fault, outage.start_ms, outage.end_ms
            ));
        }
    }
    v.note = format!(
        "{} outages, {} Reserve calls inside them, {unavailable} answered UNAVAILABLE",
        outages.len(),
        v.examined
    );
    v.done()
}
