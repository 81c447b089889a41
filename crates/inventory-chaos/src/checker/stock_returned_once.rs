//! Every SKU's levels, replayed from its events in commit order, end at the stored row: no
//! unit is returned twice or lost.

use std::collections::{BTreeMap, HashMap};

use super::{Check, Facts, Verdict, event_units};
use crate::history::SeenEvent;

/// One SKU's level in one event: (version, on_hand, reserved, the change's own deltas to
/// on_hand and reserved, and the versions it took: one per location it moved).
type LevelChange = (i64, i64, i64, i64, i64, i64);

/// Replays every SKU's levels from its events in commit (version) order: each change moves
/// `on_hand` and `reserved` by exactly its own units, and the last level is the stored row.
/// A hold reserves its quantity; every later step of the reservation lowers `on_hand` by the
/// units it confirmed and moves `reserved` with the units still held, per SKU, against the
/// reservation's previous event along the stream (stream order is commit order).
pub(super) fn stock_returned_once(stream: &[SeenEvent], facts: &Facts) -> Check {
    let mut v = Verdict::new("stock_moves_exactly_once");
    let mut per_sku: BTreeMap<&str, Vec<LevelChange>> = BTreeMap::new();
    // Per reservation and SKU: (held, confirmed) after its latest event.
    let mut last: HashMap<&str, HashMap<&str, (i64, i64)>> = HashMap::new();
    for e in stream {
        // Per SKU: this event's deltas to on_hand and reserved.
        let mut moved: HashMap<&str, (i64, i64)> = HashMap::new();
        if let Some(id) = e.reservation_id.as_deref() {
            let before = last.entry(id).or_default();
            let held = e.event_type == "RESERVATION_HELD";
            for (line, (h, c, _)) in e.lines.iter().zip(event_units(e)) {
                let now = if held { (line.quantity, 0) } else { (h, c) };
                // A reservation whose hold the stream did not show starts from it.
                let (h0, c0) = match before.get(line.sku.as_str()) {
                    Some(&previous) => previous,
                    None if held => (0, 0),
                    None => (line.quantity, 0),
                };
                moved.insert(&line.sku, (-(now.1 - c0), now.0 - h0));
                before.insert(&line.sku, now);
            }
        }
        for (sku, on_hand, reserved, version) in &e.levels {
            let (d_on, d_res) = match e.event_type.as_str() {
                "STOCK_ADJUSTED" => (e.delta.unwrap_or(0), 0),
                _ => moved.get(sku.as_str()).copied().unwrap_or((0, 0)),
            };
            let steps = e
                .steps
                .iter()
                .find(|(s, _)| s == sku)
                .map_or(1, |(_, steps)| *steps);
            per_sku
                .entry(sku)
                .or_default()
                .push((*version, *on_hand, *reserved, d_on, d_res, steps));
        }
    }
    for (sku, mut changes) in per_sku {
        changes.sort();
        let (mut on, mut res, mut ver) = (0, 0, 0);
        for (version, on_hand, reserved, d_on, d_res, steps) in changes {
            v.examined += 1;
            if version != ver + steps {
                v.fail(format!(
                    "{sku}: version {version} follows {ver}, by a change of {steps} movements"
                ));
            }
            on += d_on;
            res += d_res;
            if (on, res) != (on_hand, reserved) {
                v.fail(format!(
                    "{sku} v{version}: replayed {on}/{res}, event says {on_hand}/{reserved}"
                ));
                (on, res) = (on_hand, reserved);
            }
            ver = version;
        }
        match facts.stock.iter().find(|s| s.sku == sku) {
            Some(row) if (row.on_hand, row.reserved, row.version) == (on, res, ver) => {}
            row => v.fail(format!(
                "{sku}: events end at {on}/{res} v{ver}, row is {row:?}"
            )),
        }
    }
    for s in &facts.stock {
        if !stream.iter().any(|e| e.levels.iter().any(|l| l.0 == s.sku)) {
            v.fail(format!(
                "{}: stored, but no event ever carried its level",
                s.sku
            ));
        }
    }
    // And from the rows alone: reserved is exactly what is still held.
    for mismatch in &facts.level_mismatches {
        v.fail(mismatch.to_string());
    }
    v.note = format!("{} level changes replayed", v.examined);
    v.done()
}
