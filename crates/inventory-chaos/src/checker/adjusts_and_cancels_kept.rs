//! Every `AdjustStock` and `CancelOrder` answered OK is stored.

use std::collections::HashSet;

use super::{Check, Facts, Verdict};
use crate::history::{History, OpKind, Outcome};

/// Every `AdjustStock` and `CancelOrder` answered OK is stored: the movement with its key, the
/// order's tombstone. (Reserves, confirms and releases have checks of their own above.)
pub(super) fn adjusts_and_cancels_kept(history: &History, facts: &Facts) -> Check {
    let mut v = Verdict::new("adjusts_and_cancels_kept");
    let adjusted: HashSet<&str> = facts.adjust_keys.iter().map(String::as_str).collect();
    let cancelled: HashSet<&str> = facts.cancelled_orders.iter().map(String::as_str).collect();
    for op in history.ops.iter().filter(|o| o.outcome == Outcome::Ok) {
        match op.kind {
            OpKind::Adjust => {
                v.examined += 1;
                let key = op.key.as_deref().unwrap_or("");
                if !adjusted.contains(key) {
                    v.fail(format!("adjust {key} answered OK, no movement stored"));
                }
            }
            OpKind::Cancel => {
                v.examined += 1;
                let order = op.order();
                if !cancelled.contains(order.as_str()) {
                    v.fail(format!(
                        "cancel of {order} answered OK, no tombstone stored"
                    ));
                }
            }
            _ => {}
        }
    }
    v.note = format!("{} acknowledged adjusts and cancels stored", v.examined);
    v.done()
}
