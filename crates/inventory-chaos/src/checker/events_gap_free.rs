//! One event per committed change: sequences 1..=head without a gap or a duplicate, each the
//! outbox row at its position, and each reservation's events its life.

use std::collections::{BTreeSet, HashMap};

use super::{Check, Facts, OutboxRow, Verdict};
use crate::history::SeenEvent;

pub(super) fn events_gap_free(stream: &[SeenEvent], facts: &Facts) -> Check {
    let mut v = Verdict::new("events_one_per_change_gap_free");
    for (i, e) in stream.iter().enumerate() {
        v.examined += 1;
        if e.sequence != i as i64 + 1 {
            v.fail(format!("position {} holds sequence {}", i + 1, e.sequence));
            break;
        }
    }
    if stream.len() as i64 != facts.head || facts.outbox.len() != stream.len() {
        v.fail(format!(
            "{} events read, head {}, {} outbox rows",
            stream.len(),
            facts.head,
            facts.outbox.len()
        ));
    }
    let mut ids = BTreeSet::new();
    for e in stream {
        if !ids.insert(e.event_id.as_str()) {
            v.fail(format!("event id {} twice", e.event_id));
        }
    }
    let by_position: HashMap<i64, &OutboxRow> = facts
        .outbox
        .iter()
        .filter_map(|o| o.position.map(|p| (p, o)))
        .collect();
    for e in stream {
        match by_position.get(&e.sequence) {
            Some(row) if row.event_id == e.event_id && row.event_type == e.event_type => {}
            row => v.fail(format!(
                "sequence {}: stream {:?}, outbox {row:?}",
                e.sequence, e.event_type
            )),
        }
    }
    // One event per step of every reservation.
    let mut per_reservation: HashMap<&str, Vec<&SeenEvent>> = HashMap::new();
    for e in stream {
        if let Some(id) = e.reservation_id.as_deref() {
            per_reservation.entry(id).or_default().push(e);
        }
    }
    for row in &facts.reservations {
        let seen = per_reservation.remove(row.id.as_str()).unwrap_or_default();
        if let Some(problem) = lifecycle_problem(&row.state, &seen) {
            let kinds: Vec<&str> = seen.iter().map(|e| e.event_type.as_str()).collect();
            v.fail(format!(
                "{} ({}): {problem}; events {kinds:?}",
                row.id, row.state
            ));
        }
    }
    if let Some((id, _)) = per_reservation.into_iter().next() {
        v.fail(format!("events for {id}, which is not stored"));
    }
    v.note = format!("{} events, sequences 1..={}", stream.len(), facts.head);
    v.done()
}

/// Why a reservation's events, in stream order, are not its life: `RESERVATION_HELD`, then any
/// number of extensions and partial confirms and releases (state HELD), then, once the stored
/// row is no longer `HELD`, exactly one end (CONFIRMED, RELEASED or EXPIRED) whose state is the
/// row's. `None` when they are.
fn lifecycle_problem(state: &str, events: &[&SeenEvent]) -> Option<String> {
    let Some((first, rest)) = events.split_first() else {
        return Some("no events".into());
    };
    if first.event_type != "RESERVATION_HELD" {
        return Some("the first is not RESERVATION_HELD".into());
    }
    let (during, end) = match rest.split_last() {
        _ if state == "HELD" => (rest, None),
        Some((end, during)) => (during, Some(end)),
        None => return Some("no end".into()),
    };
    let steps = during.iter().all(|e| {
        matches!(
            e.event_type.as_str(),
            "RESERVATION_EXTENDED"
                | "RESERVATION_PARTIALLY_CONFIRMED"
                | "RESERVATION_PARTIALLY_RELEASED"
                // Waiting units that became held, or whose receipt was cancelled: the hold
                // goes on.
                | "RESERVATION_FILLED"
                | "RESERVATION_PREORDER_AT_RISK"
        )
    });
    if !steps {
        return Some("an end while held, or more than one end".into());
    }
    if let Some(e) = std::iter::once(first)
        .chain(during)
        .find(|e| e.state.as_deref() != Some("HELD"))
    {
        return Some(format!(
            "{} at sequence {} says {:?} while held",
            e.event_type, e.sequence, e.state
        ));
    }
    let end = end?;
    // The end is named by what ended the hold; a partly confirmed one ends CONFIRMED.
    let ends_in: &[&str] = match end.event_type.as_str() {
        "RESERVATION_CONFIRMED" => &["CONFIRMED"],
        "RESERVATION_RELEASED" => &["RELEASED", "CONFIRMED"],
        "RESERVATION_EXPIRED" => &["EXPIRED", "CONFIRMED"],
        other => return Some(format!("{other} at sequence {} ends it", end.sequence)),
    };
    match end.state.as_deref() {
        Some(s) if s == state && ends_in.contains(&s) => None,
        s => Some(format!(
            "{} at sequence {} says {s:?}",
            end.event_type, end.sequence
        )),
    }
}
