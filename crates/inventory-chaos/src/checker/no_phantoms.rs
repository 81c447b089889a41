//! Every stored reservation is under a key some client sent.

use std::collections::BTreeMap;

use super::{Check, Facts, Verdict};
use crate::history::Op;

pub(super) fn no_phantoms(by_key: &BTreeMap<&str, Vec<&Op>>, facts: &Facts) -> Check {
    let mut v = Verdict::new("no_phantom_reservations");
    for row in &facts.reservations {
        v.examined += 1;
        if !by_key.contains_key(row.key.as_str()) {
            v.fail(format!("{} under key {} nobody sent", row.id, row.key));
        }
    }
    v.note = format!("{} stored reservations", v.examined);
    v.done()
}
