//! The checker: after a run, the recorded history, the event stream read back from the start
//! and PostgreSQL's rows must agree on every guarantee. Each check names what it examined and,
//! when it fails, the first offenders.
//!
//! A reservation's units move in steps: a hold, then any number of partial confirms and
//! releases and extensions, then one end (confirm, release, cancel or expiry of the rest).
//! Every `ReservationChanged` event carries each line's held, confirmed and released units
//! after its step, so the checks replay stock and units from the stream itself, in commit
//! order.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

pub use inventory_testkit::audit::{LevelMismatch, ReservationRow};
use serde::Serialize;

use crate::history::{History, Line, Op, OpKind, Outcome, Phase, SeenEvent};

#[derive(Clone, Debug, Serialize)]
pub struct StockRow {
    pub sku: String,
    pub on_hand: i64,
    pub reserved: i64,
    pub version: i64,
}

#[derive(Clone, Debug, Serialize)]
pub struct OutboxRow {
    pub position: Option<i64>,
    pub event_id: String,
    pub event_type: String,
    /// The writing transaction.
    pub tx_id: String,
}

/// What PostgreSQL holds once the run is over.
#[derive(Debug, Default, Serialize)]
pub struct Facts {
    pub reservations: Vec<ReservationRow>,
    pub stock: Vec<StockRow>,
    pub outbox: Vec<OutboxRow>,
    pub head: i64,
    /// SKUs whose `reserved` column is not what their HELD rows hold (the row audit).
    pub level_mismatches: Vec<LevelMismatch>,
    /// Reservations of a cancelled order created after the cancel, or held past it.
    pub cancel_violations: Vec<String>,
    /// The idempotency keys of the stored `ADJUSTED` movements.
    pub adjust_keys: Vec<String>,
    /// The orders stored as cancelled.
    pub cancelled_orders: Vec<String>,
}

/// A fault healed at this moment; the `Reserve` calls that must succeed again soon after are
/// those for these SKUs (any, when `None`).
#[derive(Clone, Debug, Serialize)]
pub struct Heal {
    pub fault: String,
    pub healed_ms: f64,
    pub skus: Option<Vec<String>>,
    /// When the next PostgreSQL failover after it began, if one did.
    pub next_failover_ms: Option<f64>,
}

/// A span during which Redis could not grant a lease for these SKUs (all, when `None`).
#[derive(Clone, Debug, Serialize)]
pub struct Outage {
    pub fault: String,
    pub start_ms: f64,
    pub end_ms: f64,
    pub skus: Option<Vec<String>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub passed: bool,
    pub examined: usize,
    pub detail: String,
}

/// How long after an outage starts a `Reserve` may still complete on a lease granted before it
/// (the grant was on its way back when Redis went away).
const OUTAGE_GRACE_MS: f64 = 100.0;
/// How soon after a fault heals a `Reserve` must succeed again.
pub const RESUME_WITHIN_MS: f64 = 10_000.0;

struct Verdict {
    name: &'static str,
    examined: usize,
    problems: Vec<String>,
    note: String,
}

impl Verdict {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            examined: 0,
            problems: Vec::new(),
            note: String::new(),
        }
    }

    fn fail(&mut self, problem: String) {
        self.problems.push(problem);
    }

    fn done(self) -> Check {
        let passed = self.problems.is_empty();
        let detail = if passed {
            self.note
        } else {
            let shown: Vec<_> = self.problems.iter().take(5).cloned().collect();
            format!(
                "{} problem(s): {}{}",
                self.problems.len(),
                shown.join("; "),
                if self.problems.len() > 5 { "; …" } else { "" }
            )
        };
        Check {
            name: self.name,
            passed,
            examined: self.examined,
            detail,
        }
    }
}

fn sorted_lines(lines: &[Line]) -> Vec<(String, i64)> {
    let mut lines: Vec<_> = lines.iter().map(|l| (l.sku.clone(), l.quantity)).collect();
    lines.sort();
    lines
}

pub fn check(
    history: &History,
    stream: &[SeenEvent],
    facts: &Facts,
    outages: &[Outage],
    heals: &[Heal],
    failovers: &[Outage],
    load_end_ms: f64,
) -> Vec<Check> {
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in history.ops.iter().filter(|o| o.kind == OpKind::Reserve) {
        by_key
            .entry(op.key.as_deref().unwrap_or(""))
            .or_default()
            .push(op);
    }
    let mut rows_by_key: HashMap<&str, Vec<&ReservationRow>> = HashMap::new();
    for row in &facts.reservations {
        rows_by_key.entry(&row.key).or_default().push(row);
    }
    let rows_by_id: HashMap<&str, &ReservationRow> = facts
        .reservations
        .iter()
        .map(|r| (r.id.as_str(), r))
        .collect();
    vec![
        never_oversold(history, stream, facts),
        successes_exist_once(&by_key, &rows_by_key),
        failures_left_nothing(&by_key, &rows_by_key),
        indeterminate_resolved(&by_key, &rows_by_key),
        no_phantoms(&by_key, facts),
        settled_never_lost(history, &rows_by_id),
        stock_returned_once(stream, facts),
        units_settled_once(history, stream, facts, &rows_by_id),
        fences_increase(stream, facts, &rows_by_id),
        events_gap_free(stream, facts),
        events_in_commit_order(stream),
        live_stream_consistent(history, stream),
        unavailable_while_redis_down(history, outages),
        resumed_after_faults(history, heals, load_end_ms),
        adjusts_and_cancels_kept(history, facts),
        retryable_during_failover(history, failovers),
    ]
}

fn never_oversold(history: &History, stream: &[SeenEvent], facts: &Facts) -> Check {
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

fn successes_exist_once(
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

fn failures_left_nothing(
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

fn indeterminate_resolved(
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

fn no_phantoms(by_key: &BTreeMap<&str, Vec<&Op>>, facts: &Facts) -> Check {
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

/// Every whole confirm or release that answered OK stuck: the answer is a state it may end in,
/// and the row is in that state. Partial calls answer HELD and are judged by
/// `units_settled_once`.
fn settled_never_lost(history: &History, rows: &HashMap<&str, &ReservationRow>) -> Check {
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

/// (held, confirmed, released) of each of an event's lines. A stream read before events
/// carried them has none: the lines are then taken whole, where the event type puts them.
fn event_units(e: &SeenEvent) -> Vec<(i64, i64, i64)> {
    if e.units.len() == e.lines.len() {
        return e.units.clone();
    }
    e.lines
        .iter()
        .map(|l| match e.event_type.as_str() {
            "RESERVATION_CONFIRMED" => (0, l.quantity, 0),
            "RESERVATION_RELEASED" | "RESERVATION_EXPIRED" => (0, 0, l.quantity),
            _ => (l.quantity, 0, 0),
        })
        .collect()
}

/// One SKU's level in one event: (version, on_hand, reserved, the change's own deltas to
/// on_hand and reserved, and the versions it took: one per location it moved).
type LevelChange = (i64, i64, i64, i64, i64, i64);

/// Replays every SKU's levels from its events in commit (version) order: each change moves
/// `on_hand` and `reserved` by exactly its own units, and the last level is the stored row.
/// A hold reserves its quantity; every later step of the reservation lowers `on_hand` by the
/// units it confirmed and moves `reserved` with the units still held, per SKU, against the
/// reservation's previous event along the stream (stream order is commit order).
fn stock_returned_once(stream: &[SeenEvent], facts: &Facts) -> Check {
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
fn units_settled_once(
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

/// The version of `sku` an event's levels carry.
fn version_of(event: &SeenEvent, sku: &str) -> Option<i64> {
    event.levels.iter().find(|l| l.0 == sku).map(|l| l.3)
}

fn fences_increase(
    stream: &[SeenEvent],
    facts: &Facts,
    rows: &HashMap<&str, &ReservationRow>,
) -> Check {
    let mut v = Verdict::new("fences_increase_in_commit_order");
    let tx_of: HashMap<&str, &str> = facts
        .outbox
        .iter()
        .map(|o| (o.event_id.as_str(), o.tx_id.as_str()))
        .collect();
    // Per SKU: (version = commit order, fence, transaction).
    let mut per_sku: BTreeMap<&str, Vec<(i64, i64, &str)>> = BTreeMap::new();
    for e in stream.iter().filter(|e| e.event_type == "RESERVATION_HELD") {
        let Some(row) = e.reservation_id.as_deref().and_then(|id| rows.get(id)) else {
            v.fail(format!("event {}: no stored reservation", e.sequence));
            continue;
        };
        for (sku, _, fence) in &row.lines {
            let Some(version) = version_of(e, sku) else {
                v.fail(format!("event {}: no level for {sku}", e.sequence));
                continue;
            };
            let tx = tx_of.get(e.event_id.as_str()).copied().unwrap_or("");
            per_sku.entry(sku).or_default().push((version, *fence, tx));
        }
    }
    for (sku, mut holds) in per_sku {
        holds.sort();
        for pair in holds.windows(2) {
            v.examined += 1;
            let ((_, f0, t0), (version, f1, t1)) = (pair[0], pair[1]);
            let ok = if t0 == t1 { f1 == f0 } else { f1 > f0 };
            if !ok {
                v.fail(format!("{sku} v{version}: fence {f1} after {f0}"));
            }
        }
    }
    v.note = format!("{} consecutive holds compared", v.examined);
    v.done()
}

fn events_gap_free(stream: &[SeenEvent], facts: &Facts) -> Check {
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

/// Within one SKU, stream order is commit order: versions only go up along the stream.
fn events_in_commit_order(stream: &[SeenEvent]) -> Check {
    let mut v = Verdict::new("events_in_commit_order_per_sku");
    let mut last: HashMap<&str, (i64, i64)> = HashMap::new();
    for e in stream {
        for (sku, _, _, version) in &e.levels {
            v.examined += 1;
            if let Some(&(before, at)) = last.get(sku.as_str())
                && *version <= before
            {
                v.fail(format!(
                    "{sku}: v{version} at sequence {} after v{before} at {at}",
                    e.sequence
                ));
            }
            last.insert(sku, (*version, e.sequence));
        }
    }
    v.note = format!(
        "{} levels along the stream, {} SKUs",
        v.examined,
        last.len()
    );
    v.done()
}

fn live_stream_consistent(history: &History, stream: &[SeenEvent]) -> Check {
    let mut v = Verdict::new("live_stream_consistent");
    let mut previous = 0;
    for e in &history.live_events {
        v.examined += 1;
        // The watcher resumes after the last event it saw, so delivery is contiguous.
        if e.sequence != previous + 1 {
            v.fail(format!(
                "sequence {} delivered after {previous}",
                e.sequence
            ));
        }
        previous = e.sequence;
        match usize::try_from(e.sequence - 1)
            .ok()
            .and_then(|i| stream.get(i))
        {
            Some(stored) if stored == e => {}
            _ => v.fail(format!(
                "sequence {} differs from the stored stream",
                e.sequence
            )),
        }
    }
    if history.live_events.is_empty() && !stream.is_empty() {
        v.fail("the live watcher received nothing".into());
    }
    v.note = format!(
        "{} events received live across reconnections, in order, none missed or changed",
        v.examined
    );
    v.done()
}

fn unavailable_while_redis_down(history: &History, outages: &[Outage]) -> Check {
    let mut v = Verdict::new("unavailable_while_redis_down");
    let mut unavailable = 0;
    for outage in outages {
        let before = v.examined;
        for op in history.ops.iter().filter(|o| o.kind == OpKind::Reserve) {
            let inside = op.invoked_ms >= outage.start_ms + OUTAGE_GRACE_MS
                && op.completed_ms <= outage.end_ms;
            let affected = outage
                .skus
                .as_ref()
                .is_none_or(|skus| op.lines.iter().any(|l| skus.contains(&l.sku)));
            if !inside || !affected {
                continue;
            }
            v.examined += 1;
            // Fail closed, and say so: UNAVAILABLE, never success, never a vaguer error.
            if op.code == "Unavailable" {
                unavailable += 1;
            } else {
                v.fail(format!(
                    "{}: {} answered {} at {:.0}–{:.0} ms during {} ({:.0}–{:.0} ms)",
                    op.key.as_deref().unwrap_or(""),
                    op.lines.first().map_or("", |l| l.sku.as_str()),
                    op.code,
                    op.invoked_ms,
                    op.completed_ms,
                    outage.fault,
                    outage.start_ms,
                    outage.end_ms
                ));
            }
        }
        // An outage of any length with no call inside it proved nothing.
        let covered = outage.skus.as_ref().is_none_or(|skus| !skus.is_empty());
        if covered && v.examined == before && outage.end_ms - outage.start_ms >= 1_000.0 {
            v.fail(format!(
                "{} ({:.0}–{:.0} ms): no Reserve call came and went inside it",
                outage.fault, outage.start_ms, outage.end_ms
            ));
        }
    }
    v.note = format!(
        "{} outages, {} Reserve calls inside them, {unavailable} answered UNAVAILABLE",
        outages.len(),
        v.examined
    );
    v.done()
}

fn resumed_after_faults(history: &History, heals: &[Heal], load_end_ms: f64) -> Check {
    let mut v = Verdict::new("resumed_after_faults");
    for heal in heals {
        let (fault, healed) = (&heal.fault, heal.healed_ms);
        // Late in the run, the resolve phase judges instead: it must answer every key.
        // A Cluster node that served none of the run's SKUs has nothing to resume. A failover
        // that began within the window (it takes most of it) leaves the judging to its own
        // heal.
        if healed + RESUME_WITHIN_MS > load_end_ms
            || heal.skus.as_ref().is_some_and(Vec::is_empty)
            || heal
                .next_failover_ms
                .is_some_and(|next| next < healed + RESUME_WITHIN_MS)
        {
            continue;
        }
        v.examined += 1;
        let resumed = history.ops.iter().any(|o| {
            o.kind == OpKind::Reserve
                && o.outcome == Outcome::Ok
                && o.invoked_ms >= healed
                && o.completed_ms <= healed + RESUME_WITHIN_MS
                && heal
                    .skus
                    .as_ref()
                    .is_none_or(|skus| o.lines.iter().any(|l| skus.contains(&l.sku)))
        });
        if !resumed {
            v.fail(format!(
                "{fault}: no Reserve succeeded within {} s of healing at {healed:.0} ms",
                RESUME_WITHIN_MS / 1000.0
            ));
        }
    }
    v.note = format!(
        "{} healed faults followed by a successful Reserve",
        v.examined
    );
    v.done()
}

/// Every `AdjustStock` and `CancelOrder` answered OK is stored: the movement with its key, the
/// order's tombstone. (Reserves, confirms and releases have checks of their own above.)
fn adjusts_and_cancels_kept(history: &History, facts: &Facts) -> Check {
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

/// While PostgreSQL fails over, a call is answered OK or with a status that says "try again"
/// (or that the request cannot be met, as at any time): never an error that hides what
/// happened (`INTERNAL`, `UNKNOWN` from the server), nor `NOT_FOUND` for what an earlier
/// answer created. A transport error (the replica called was killed) is no answer.
fn retryable_during_failover(history: &History, failovers: &[Outage]) -> Check {
    const EXPECTED: [&str; 7] = [
        "Ok",
        "Unavailable",
        "DeadlineExceeded",
        "Aborted",
        "ResourceExhausted",
        "FailedPrecondition",
        "Cancelled",
    ];
    let mut v = Verdict::new("retryable_during_failover");
    let mut unavailable = 0;
    for failover in failovers {
        for op in history
            .ops
            .iter()
            .filter(|o| o.invoked_ms >= failover.start_ms && o.invoked_ms <= failover.end_ms)
        {
            v.examined += 1;
            unavailable += usize::from(op.code == "Unavailable");
            // The client's own report that the replica it called went away (a replica fault
            // beside the failover), not an answer.
            let transport = op.code == "Unknown" && op.message.starts_with("transport error");
            if !EXPECTED.contains(&op.code.as_str()) && !transport {
                v.fail(format!(
                    "{:?} {} answered {} ({}) at {:.0} ms during {}",
                    op.kind,
                    op.key
                        .as_deref()
                        .or(op.reservation_id.as_deref())
                        .unwrap_or(""),
                    op.code,
                    op.message,
                    op.invoked_ms,
                    failover.fault
                ));
            }
        }
    }
    v.note = format!(
        "{} failovers: calls answered OK or retryable ({unavailable} UNAVAILABLE)",
        failovers.len()
    );
    v.done()
}

#[cfg(test)]
mod tests;
