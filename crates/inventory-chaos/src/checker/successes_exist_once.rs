//! A `Reserve` key that answered OK is stored as exactly one reservation, with the id it
//! answered and the lines it asked for.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Check, ReservationRow, Verdict, sorted_lines};
use crate::history::{Op, Outcome};

pub(super) fn successes_exist_once(
    by_key: &BTreeMap<&str, Vec<&Op>>,
    rows: &HashMap<&str, Vec<&ReservationRow>>,
) -> Check {
    let mut v = Verdict::new("successes_exist_once");
    for (key, ops) in by_key {
        let ids: BTreeSet<&str> = ops
            .iter()
            .filter(|o| o.outcome == Outcome::Ok)
            .filter_map(|o| o.reservation_id.as_deref())
            .collect();
        if ids.is_empty() {
            continue;
        }
        v.examined += 1;
        let stored = rows.get(key).map(Vec::as_slice).unwrap_or_default();
        if ids.len() > 1 {
            v.fail(format!(
                "{key}: answered with {} reservation ids",
                ids.len()
            ));
        }
        match stored {
            [row] => {
                let id = ids.first().expect("not empty");
                let asked = sorted_lines(&ops[0].lines);
                let held: Vec<_> = row.lines.iter().map(|(s, q, _)| (s.clone(), *q)).collect();
                if row.id != *id {
                    v.fail(format!("{key}: answered {id}, stored {}", row.id));
                } else if held != asked {
                    v.fail(format!("{key}: asked {asked:?}, stored {held:?}"));
                }
            }
            _ => v.fail(format!(
                "{key}: reported success, {} rows stored",
                stored.len()
            )),
        }
    }
    v.note = format!("{} keys answered with success", v.examined);
    v.done()
}
