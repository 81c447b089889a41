//! A `Reserve` key refused on every call left no reservation behind.

use std::collections::{BTreeMap, HashMap};

use super::{Check, ReservationRow, Verdict};
use crate::history::{Op, Outcome};

pub(super) fn failures_left_nothing(
    by_key: &BTreeMap<&str, Vec<&Op>>,
    rows: &HashMap<&str, Vec<&ReservationRow>>,
) -> Check {
    let mut v = Verdict::new("failures_left_nothing");
    for (key, ops) in by_key {
        if ops.iter().all(|o| o.outcome == Outcome::Fail) {
            v.examined += 1;
            let stored = rows.get(key).map_or(0, Vec::len);
            if stored != 0 {
                v.fail(format!(
                    "{key}: refused ({}) yet {stored} stored",
                    ops[0].code
                ));
            }
        }
    }
    v.note = format!("{} keys refused outright", v.examined);
    v.done()
}
