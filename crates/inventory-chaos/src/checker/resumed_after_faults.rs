//! After a fault heals, `Reserve` succeeds again within [`RESUME_WITHIN_MS`].

use super::{Check, Heal, RESUME_WITHIN_MS, Verdict};
use crate::history::{History, OpKind, Outcome};

pub(super) fn resumed_after_faults(history: &History, heals: &[Heal], load_end_ms: f64) -> Check {
    let mut v = Verdict::new("resumed_after_faults");
    for heal in heals {
        let (fault, healed) = (&heal.fault, heal.healed_ms);
        // Late in the run, the resolve phase judges instead: it must answer every key.
        // A Cluster node that served none of the run's SKUs has nothing to resume. A failover
        // that began within the window (it takes most of it) leaves the judging to its own
        // heal.
        if healed + RESUME_WITHIN_MS > load_end_ms
            || heal.skus.as_ref().is_some_and(Vec::is_empty)
            || heal
                .next_failover_ms
                .is_some_and(|next| next < healed + RESUME_WITHIN_MS)
        {
            continue;
        }
        v.examined += 1;
        let resumed = history.ops.iter().any(|o| {
            o.kind == OpKind::Reserve
                && o.outcome == Outcome::Ok
                && o.invoked_ms >= healed
                && o.completed_ms <= healed + RESUME_WITHIN_MS
                && heal
                    .skus
                    .as_ref()
                    .is_none_or(|skus| o.lines.iter().any(|l| skus.contains(&l.sku)))
        });
        if !resumed {
            v.fail(format!(
                "{fault}: no Reserve succeeded within {} s of healing at {healed:.0} ms",
                RESUME_WITHIN_MS / 1000.0
            ));
        }
    }
    v.note = format!(
        "{} healed faults followed by a successful Reserve",
        v.examined
    );
    v.done()
}
