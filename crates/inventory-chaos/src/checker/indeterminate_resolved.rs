//! A `Reserve` key whose outcome the load left unknown is settled by its retries: one
//! reservation when a retry succeeded, none when one was refused for good.

use std::collections::{BTreeMap, HashMap};

use super::{Check, ReservationRow, Verdict};
use crate::history::{Op, Outcome, Phase};

pub(super) fn indeterminate_resolved(
    by_key: &BTreeMap<&str, Vec<&Op>>,
    rows: &HashMap<&str, Vec<&ReservationRow>>,
) -> Check {
    let mut v = Verdict::new("indeterminate_resolved");
    let (mut to_one, mut to_zero) = (0, 0);
    for (key, ops) in by_key {
        let load: Vec<_> = ops.iter().filter(|o| o.phase == Phase::Load).collect();
        if load.iter().any(|o| o.outcome == Outcome::Ok)
            || !load.iter().any(|o| o.outcome == Outcome::Unknown)
        {
            continue;
        }
        v.examined += 1;
        let stored = rows.get(key).map_or(0, Vec::len);
        match ops.iter().rev().find(|o| o.phase == Phase::Resolve) {
            Some(last) if last.outcome == Outcome::Ok => {
                to_one += 1;
                if stored != 1 {
                    v.fail(format!("{key}: the retry succeeded, {stored} rows stored"));
                }
            }
            Some(last) if last.outcome == Outcome::Fail && Outcome::settles(&last.code) => {
                to_zero += 1;
                if stored != 0 {
                    v.fail(format!(
                        "{key}: the retry was refused ({}), {stored} rows stored",
                        last.code
                    ));
                }
            }
            Some(last) => v.fail(format!("{key}: still {} after the retries", last.code)),
            None => v.fail(format!("{key}: never retried")),
        }
    }
    v.note = format!("{to_one} resolved to one reservation, {to_zero} to none");
    v.done()
}
