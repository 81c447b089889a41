//! No unit is confirmed twice, released twice, or held after a cancel.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{Check, Facts, ReservationRow, Verdict, event_units, sorted_lines};
use crate::history::{History, OpKind, Outcome, SeenEvent};

/// Partial calls of one kind on one reservation: the keys that answered OK, and the units each
/// key sent (OK or unknown outcome) asked for, with whether an event has used them yet.
#[derive(Default)]
struct Parts<'a> {
    ok: BTreeSet<&'a str>,
    sent: BTreeMap<&'a str, Asked>,
}

/// The units a partial call asked for, (sku, units) by SKU, and whether an event used them.
type Asked = (Vec<(String, i64)>, bool);

/// A line along the stream: (sku, quantity, held, confirmed, released).
type Units = (String, i64, i64, i64, i64);

/// The partial event type of a partial call of `kind`.
fn partial_event(kind: OpKind) -> &'static str {
    if kind == OpKind::Confirm {
        "RESERVATION_PARTIALLY_CONFIRMED"
    } else {
        "RESERVATION_PARTIALLY_RELEASED"
    }
}

/// No unit is confirmed twice, released twice, or held after a cancel:
///
/// - along the stream, each line's held, confirmed and released units add up to its quantity
///   at every event; confirmed and released never go down, held never goes up; the last
///   event's units are the row's;
/// - a reservation has at least as many partial confirm (release) events as partial confirm
///   (release) keys that answered OK, at most as many as were sent, and each such event moved
///   exactly the units of one key sent, confirmed (released) and nothing else;
/// - a cancel that answered OK left nothing held, no `Reserve` for its order invoked after it
///   answered succeeded (unless its key was sent before: a replay), and no row of a cancelled
///   order was created after the cancel or left held (`Facts::cancel_violations`).
pub(super) fn units_settled_once(
    history: &History,
    stream: &[SeenEvent],
    facts: &Facts,
    rows: &HashMap<&str, &ReservationRow>,
) -> Check {
    let mut v = Verdict::new("units_settled_once");
    let mut parts: HashMap<(&str, &str), Parts> = HashMap::new();
    for op in history.ops.iter().filter(|o| o.is_partial()) {
        let id = op.reservation_id.as_deref().unwrap_or("");
        let key = op.key.as_deref().unwrap_or("");
        let p = parts.entry((id, partial_event(op.kind))).or_default();
        if op.outcome == Outcome::Ok {
            p.ok.insert(key);
        }
        if op.outcome != Outcome::Fail {
            p.sent.insert(key, (sorted_lines(&op.lines), false));
        }
    }

    let mut per_reservation: BTreeMap<&str, Vec<&SeenEvent>> = BTreeMap::new();
    for e in stream {
        if let Some(id) = e.reservation_id.as_deref() {
            per_reservation.entry(id).or_default().push(e);
        }
    }
    let mut partial_events: HashMap<(&str, &str), usize> = HashMap::new();
    for (id, events) in &per_reservation {
        v.examined += 1;
        // (sku, quantity, held, confirmed, released) of every line, by SKU, after each event.
        let mut before: Option<Vec<Units>> = None;
        for e in events {
            let mut now: Vec<Units> = e
                .lines
                .iter()
                .zip(event_units(e))
                .map(|(l, (h, c, r))| (l.sku.clone(), l.quantity, h, c, r))
                .collect();
            now.sort();
            let at = format!("{id} at sequence {}", e.sequence);
            for (sku, q, h, c, r) in &now {
                if h + c + r != *q || [h, c, r].iter().any(|u| **u < 0) {
                    v.fail(format!(
                        "{at}: {sku} held {h}, confirmed {c}, released {r} of {q}"
                    ));
                }
            }
            if let Some(before) = &before {
                let same_lines = before.len() == now.len()
                    && before
                        .iter()
                        .zip(&now)
                        .all(|(b, n)| (&b.0, b.1) == (&n.0, n.1));
                if !same_lines {
                    v.fail(format!("{at}: the lines changed"));
                }
                for (b, n) in before.iter().zip(&now) {
                    if n.2 > b.2 || n.3 < b.3 || n.4 < b.4 {
                        v.fail(format!(
                            "{at}: {} went from {}/{}/{} to {}/{}/{} (held/confirmed/released)",
                            n.0, b.2, b.3, b.4, n.2, n.3, n.4
                        ));
                    }
                }
                let kind = e.event_type.as_str();
                if matches!(
                    kind,
                    "RESERVATION_PARTIALLY_CONFIRMED" | "RESERVATION_PARTIALLY_RELEASED"
                ) {
                    *partial_events.entry((id, kind)).or_default() += 1;
                    let confirm = kind == "RESERVATION_PARTIALLY_CONFIRMED";
                    let mut moved = Vec::new();
                    let mut other = false;
                    for (b, n) in before.iter().zip(&now) {
                        let (d_part, d_other) = if confirm {
                            (n.3 - b.3, n.4 - b.4)
                        } else {
                            (n.4 - b.4, n.3 - b.3)
                        };
                        if d_part != 0 {
                            moved.push((n.0.clone(), d_part));
                        }
                        other |= d_other != 0;
                    }
                    let key = parts.get_mut(&(id, kind)).and_then(|p| {
                        p.sent
                            .values_mut()
                            .find(|(asked, used)| !*used && *asked == moved)
                    });
                    match key {
                        Some((_, used)) if !other => *used = true,
                        _ => v.fail(format!(
                            "{at}: {kind} moved {moved:?}{}, which no unused key sent asked for",
                            if other { " and more" } else { "" }
                        )),
                    }
                }
            }
            before = Some(now);
        }
        if let (Some(last), Some(row)) = (before, rows.get(id)) {
            let mut stored: Vec<_> = row
                .lines
                .iter()
                .zip(&row.units)
                .map(|((sku, q, _), (h, c, r))| (sku.clone(), *q, *h, *c, *r))
                .collect();
            stored.sort();
            if stored != last {
                v.fail(format!(
                    "{id}: the last event says {last:?}, the row {stored:?}"
                ));
            }
        }
    }
    let mut partial_calls = 0;
    for ((id, kind), p) in &parts {
        partial_calls += p.sent.len();
        let seen = partial_events.get(&(*id, *kind)).copied().unwrap_or(0);
        if seen < p.ok.len() || seen > p.sent.len() {
            v.fail(format!(
                "{id}: {seen} {kind} events for {} keys answered OK of {} sent",
                p.ok.len(),
                p.sent.len()
            ));
        }
    }

    // Cancels: per order, when the first cancel that answered OK answered.
    let mut cancelled: HashMap<String, f64> = HashMap::new();
    for op in history
        .ops
        .iter()
        .filter(|o| o.kind == OpKind::Cancel && o.outcome == Outcome::Ok)
    {
        v.examined += 1;
        let at = cancelled.entry(op.order()).or_insert(op.completed_ms);
        *at = at.min(op.completed_ms);
        let held: i64 = op.units.iter().map(|u| u.1).sum();
        if held != 0 {
            v.fail(format!(
                "cancel of {} answered with {held} units still held",
                op.order()
            ));
        }
    }
    let mut first_sent: HashMap<&str, f64> = HashMap::new();
    for op in history.ops.iter().filter(|o| o.kind == OpKind::Reserve) {
        let at = first_sent
            .entry(op.key.as_deref().unwrap_or(""))
            .or_insert(op.invoked_ms);
        *at = at.min(op.invoked_ms);
    }
    let mut late = 0;
    for op in history.ops.iter().filter(|o| o.kind == OpKind::Reserve) {
        let key = op.key.as_deref().unwrap_or("");
        let Some(&at) = cancelled.get(&op.order()) else {
            continue;
        };
        if op.invoked_ms < at || first_sent.get(key).is_some_and(|&first| first < at) {
            continue;
        }
        v.examined += 1;
        late += 1;
        if op.outcome == Outcome::Ok {
            v.fail(format!(
                "{key}: Reserve for cancelled order {} answered OK at {:.0} ms, after the cancel at {at:.0} ms",
                op.order(),
                op.completed_ms
            ));
        }
    }
    for violation in &facts.cancel_violations {
        v.fail(violation.clone());
    }
    v.note = format!(
        "{} reservations' units along the stream, {partial_calls} partial calls sent, {} \
         orders cancelled, {late} Reserve calls after a cancel (none OK)",
        per_reservation.len(),
        cancelled.len()
    );
    v.done()
}
