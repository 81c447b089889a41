//! No level ever reserves more than is on hand, or less than nothing: the snapshots taken
//! during the run, every level the stream committed, and the rows at the end.

use super::{Check, Facts, Verdict};
use crate::history::{History, SeenEvent};

pub(super) fn never_oversold(history: &History, stream: &[SeenEvent], facts: &Facts) -> Check {
    let mut v = Verdict::new("never_oversold");
    for s in &history.snapshots {
        v.examined += 1;
        if s.reserved > s.on_hand || s.available < 0 || s.available != s.on_hand - s.reserved {
            v.fail(format!(
                "{} at {:.0} ms: on_hand {} reserved {} available {}",
                s.sku, s.at_ms, s.on_hand, s.reserved, s.available
            ));
        }
    }
    for e in stream {
        for (sku, on_hand, reserved, version) in &e.levels {
            v.examined += 1;
            if reserved > on_hand || *reserved < 0 {
                v.fail(format!(
                    "{sku} v{version} (event {}): on_hand {on_hand} reserved {reserved}",
                    e.sequence
                ));
            }
        }
    }
    for s in &facts.stock {
        v.examined += 1;
        if s.reserved > s.on_hand || s.reserved < 0 {
            v.fail(format!(
                "{} at the end: {} of {}",
                s.sku, s.reserved, s.on_hand
            ));
        }
    }
    v.note = format!(
        "{} snapshots, every committed level in the stream and the final rows",
        history.snapshots.len()
    );
    v.done()
}
