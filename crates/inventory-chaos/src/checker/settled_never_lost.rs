//! Whole confirms and releases that answered OK stuck.

use std::collections::HashMap;

use super::{Check, ReservationRow, Verdict};
use crate::history::{History, OpKind, Outcome};

/// Every whole confirm or release that answered OK stuck: the answer is a state it may end in,
/// and the row is in that state. Partial calls answer HELD and are judged by
/// `units_settled_once`.
pub(super) fn settled_never_lost(
    history: &History,
    rows: &HashMap<&str, &ReservationRow>,
) -> Check {
    let mut v = Verdict::new("confirmed_and_released_never_lost");
    for op in &history.ops {
        // Releasing an expired hold is a no-op that answers EXPIRED: its stock went back once,
        // through the sweeper. Releasing the rest of a partly confirmed hold answers CONFIRMED.
        let allowed: &[&str] = match op.kind {
            OpKind::Confirm => &["CONFIRMED"],
            OpKind::Release => &["RELEASED", "EXPIRED", "CONFIRMED"],
            _ => continue,
        };
        if op.outcome != Outcome::Ok || op.is_partial() {
            continue;
        }
        v.examined += 1;
        let id = op.reservation_id.as_deref().unwrap_or("");
        let stored = rows.get(id).map(|r| r.state.as_str());
        let answered = op.state.as_deref();
        if !answered.is_some_and(|a| allowed.contains(&a)) || stored != answered {
            v.fail(format!(
                "{id}: {:?} answered {answered:?}, stored {stored:?}",
                op.kind
            ));
        }
    }
    v.note = format!("{} whole confirms and releases answered OK", v.examined);
    v.done()
}
