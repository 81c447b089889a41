//! Every check passes on a consistent world and fails when one fact in it is wrong.

use super::*;
use crate::history::Snapshot;

/// SKU "S": stocked with 10; k1 holds 2 and is confirmed; k2 is refused; k3's first answer is
/// unknown, its retry holds 1, which then expires; k4 comes while Redis is down, and its
/// retry afterwards is refused.
struct World {
    history: History,
    stream: Vec<SeenEvent>,
    facts: Facts,
    outages: Vec<Outage>,
    heals: Vec<Heal>,
}

fn line(quantity: i64) -> Vec<Line> {
    vec![Line {
        sku: "S".into(),
        quantity,
    }]
}

fn op(kind: OpKind, key: &str, id: Option<&str>, at: f64, outcome: Outcome, code: &str) -> Op {
    Op {
        client: 0,
        replica: 0,
        kind,
        phase: Phase::Load,
        key: (kind == OpKind::Reserve).then(|| key.to_owned()),
        reservation_id: id.map(str::to_owned),
        lines: if kind == OpKind::Reserve {
            line(1)
        } else {
            Vec::new()
        },
        ttl_ms: Some(1000),
        invoked_ms: at,
        completed_ms: at + 5.0,
        outcome,
        code: code.into(),
        state: None,
        message: String::new(),
    }
}

fn event(sequence: i64, kind: &str, id: Option<&str>, q: i64, level: (i64, i64, i64)) -> SeenEvent {
    SeenEvent {
        sequence,
        event_id: format!("e{sequence}"),
        event_type: kind.into(),
        reservation_id: id.map(str::to_owned),
        sku: id.is_none().then(|| "S".to_owned()),
        delta: id.is_none().then_some(q),
        lines: if id.is_some() { line(q) } else { Vec::new() },
        levels: vec![("S".into(), level.0, level.1, level.2)],
    }
}

fn heal(healed_ms: f64, skus: Option<Vec<String>>) -> Heal {
    Heal {
        fault: "redis_cut".into(),
        healed_ms,
        skus,
    }
}

fn world() -> World {
    let mut k1 = op(OpKind::Reserve, "k1", Some("R1"), 100.0, Outcome::Ok, "Ok");
    k1.lines = line(2);
    let mut confirm = op(OpKind::Confirm, "", Some("R1"), 200.0, Outcome::Ok, "Ok");
    confirm.state = Some("CONFIRMED".into());
    let k2 = op(
        OpKind::Reserve,
        "k2",
        None,
        500.0,
        Outcome::Fail,
        "FailedPrecondition",
    );
    let k3 = op(
        OpKind::Reserve,
        "k3",
        None,
        400.0,
        Outcome::Unknown,
        "DeadlineExceeded",
    );
    let mut k3_retry = op(OpKind::Reserve, "k3", Some("R3"), 900.0, Outcome::Ok, "Ok");
    k3_retry.phase = Phase::Resolve;
    let k4 = op(
        OpKind::Reserve,
        "k4",
        None,
        300.0,
        Outcome::Unknown,
        "Unavailable",
    );
    let mut k4_retry = op(
        OpKind::Reserve,
        "k4",
        None,
        960.0,
        Outcome::Fail,
        "FailedPrecondition",
    );
    k4_retry.phase = Phase::Resolve;
    let stream = vec![
        event(1, "STOCK_ADJUSTED", None, 10, (10, 0, 1)),
        event(2, "RESERVATION_HELD", Some("R1"), 2, (10, 2, 2)),
        event(3, "RESERVATION_CONFIRMED", Some("R1"), 2, (8, 0, 3)),
        event(4, "RESERVATION_HELD", Some("R3"), 1, (8, 1, 4)),
        event(5, "RESERVATION_EXPIRED", Some("R3"), 1, (8, 0, 5)),
    ];
    let facts = Facts {
        reservations: vec![
            ReservationRow {
                id: "R1".into(),
                key: "k1".into(),
                state: "CONFIRMED".into(),
                lines: vec![("S".into(), 2, 5)],
            },
            ReservationRow {
                id: "R3".into(),
                key: "k3".into(),
                state: "EXPIRED".into(),
                lines: vec![("S".into(), 1, 6)],
            },
        ],
        stock: vec![StockRow {
            sku: "S".into(),
            on_hand: 8,
            reserved: 0,
            version: 5,
        }],
        outbox: stream
            .iter()
            .map(|e| OutboxRow {
                position: Some(e.sequence),
                event_id: e.event_id.clone(),
                event_type: e.event_type.clone(),
                tx_id: format!("{}", 700 + e.sequence),
            })
            .collect(),
        head: 5,
        level_mismatches: Vec::new(),
    };
    World {
        history: History {
            ops: vec![k1, confirm, k2, k3, k3_retry, k4, k4_retry],
            snapshots: vec![Snapshot {
                at_ms: 150.0,
                sku: "S".into(),
                on_hand: 10,
                reserved: 2,
                available: 8,
            }],
            live_events: stream[..3].to_vec(),
        },
        stream,
        facts,
        // Redis was down from 150 to 400 ms: k4 came and went inside.
        outages: vec![Outage {
            fault: "redis_cut".into(),
            start_ms: 150.0,
            end_ms: 400.0,
            skus: None,
        }],
        heals: vec![heal(50.0, None)],
    }
}

fn run(w: &World) -> Vec<Check> {
    check(
        &w.history, &w.stream, &w.facts, &w.outages, &w.heals, 20_000.0,
    )
}

fn verdict(w: &World, name: &str) -> Check {
    run(w)
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no check {name}"))
}

#[track_caller]
fn fails(w: &World, name: &str) {
    let c = verdict(w, name);
    assert!(!c.passed, "{name} passed: {}", c.detail);
}

#[test]
fn a_consistent_world_passes_every_check() {
    let w = world();
    for c in run(&w) {
        assert!(c.passed, "{}: {}", c.name, c.detail);
        assert!(
            c.examined > 0 || c.name == "resumed_after_faults",
            "{} examined nothing",
            c.name
        );
    }
}

#[test]
fn an_oversold_snapshot_fails() {
    let mut w = world();
    w.history.snapshots[0].reserved = 11;
    w.history.snapshots[0].available = -1;
    fails(&w, "never_oversold");
}

#[test]
fn a_success_missing_from_the_rows_fails() {
    let mut w = world();
    w.facts.reservations.remove(0);
    fails(&w, "successes_exist_once");
}

#[test]
fn a_success_stored_with_another_quantity_fails() {
    let mut w = world();
    w.facts.reservations[0].lines[0].1 = 3;
    fails(&w, "successes_exist_once");
}

#[test]
fn a_refusal_that_left_a_row_fails() {
    let mut w = world();
    w.facts.reservations.push(ReservationRow {
        id: "R2".into(),
        key: "k2".into(),
        state: "HELD".into(),
        lines: vec![("S".into(), 1, 7)],
    });
    fails(&w, "failures_left_nothing");
}

#[test]
fn an_unknown_outcome_resolved_to_success_without_a_row_fails() {
    let mut w = world();
    w.facts.reservations.remove(1);
    fails(&w, "indeterminate_resolved");
}

#[test]
fn an_unknown_outcome_never_retried_fails() {
    let mut w = world();
    w.history.ops.pop();
    fails(&w, "indeterminate_resolved");
}

#[test]
fn a_row_nobody_asked_for_fails() {
    let mut w = world();
    w.facts.reservations[1].key = "stranger".into();
    fails(&w, "no_phantom_reservations");
}

#[test]
fn a_confirmed_reservation_lost_fails() {
    let mut w = world();
    w.facts.reservations[0].state = "RELEASED".into();
    fails(&w, "confirmed_and_released_never_lost");
}

#[test]
fn a_release_of_an_expired_hold_answers_expired_and_stays_so() {
    let mut w = world();
    let mut release = op(OpKind::Release, "", Some("R3"), 950.0, Outcome::Ok, "Ok");
    release.state = Some("EXPIRED".into());
    w.history.ops.push(release);
    assert!(verdict(&w, "confirmed_and_released_never_lost").passed);
    w.facts.reservations[1].state = "RELEASED".into();
    fails(&w, "confirmed_and_released_never_lost");
}

#[test]
fn stock_returned_twice_fails() {
    let mut w = world();
    // The expiry gave back two units of a one-unit hold.
    w.stream[4].levels[0].2 = -1;
    fails(&w, "stock_moves_exactly_once");
    let mut w = world();
    w.facts.stock[0].reserved = 1;
    fails(&w, "stock_moves_exactly_once");
}

#[test]
fn a_reserved_column_the_rows_do_not_account_for_fails() {
    let mut w = world();
    w.facts.level_mismatches.push(LevelMismatch {
        sku: "S".into(),
        on_hand: 8,
        reserved: 0,
        held: 1,
    });
    fails(&w, "stock_moves_exactly_once");
}

#[test]
fn a_fence_going_back_fails() {
    let mut w = world();
    w.facts.reservations[1].lines[0].2 = 4;
    fails(&w, "fences_increase_in_commit_order");
    // Two holds of one transaction share their fence; of two transactions, they may not.
    let mut w = world();
    w.facts.reservations[1].lines[0].2 = 5;
    fails(&w, "fences_increase_in_commit_order");
    w.facts.outbox[3].tx_id = w.facts.outbox[1].tx_id.clone();
    assert!(verdict(&w, "fences_increase_in_commit_order").passed);
}

#[test]
fn a_gap_or_a_missing_event_fails() {
    let mut w = world();
    w.stream.remove(2);
    fails(&w, "events_one_per_change_gap_free");
    let mut w = world();
    w.facts.reservations[1].state = "HELD".into();
    fails(&w, "events_one_per_change_gap_free");
}

#[test]
fn a_skus_events_out_of_commit_order_fail() {
    let mut w = world();
    w.stream.swap(3, 4);
    fails(&w, "events_in_commit_order_per_sku");
}

#[test]
fn a_live_event_that_differs_from_the_stream_fails() {
    let mut w = world();
    w.history.live_events[1].levels[0].2 = 3;
    fails(&w, "live_stream_consistent");
    let mut w = world();
    w.history.live_events.swap(0, 1);
    fails(&w, "live_stream_consistent");
}

#[test]
fn a_success_while_redis_was_down_fails() {
    let mut w = world();
    w.outages[0].start_ms = 0.0;
    w.outages[0].end_ms = 150.0;
    fails(&w, "unavailable_while_redis_down");
    // Not for a SKU the outage did not cover.
    w.outages[0].skus = Some(vec!["OTHER".into()]);
    assert!(verdict(&w, "unavailable_while_redis_down").passed);
}

#[test]
fn another_answer_than_unavailable_while_redis_was_down_fails() {
    let mut w = world();
    w.history.ops[5].code = "DeadlineExceeded".into();
    fails(&w, "unavailable_while_redis_down");
}

#[test]
fn no_success_after_a_fault_healed_fails() {
    let mut w = world();
    w.heals = vec![heal(1_000.0, None)];
    fails(&w, "resumed_after_faults");
}

#[test]
fn a_success_on_another_nodes_sku_does_not_count_as_resuming() {
    let mut w = world();
    // k1 succeeded 50 ms after the heal, but on S; the healed node served only T.
    w.heals = vec![heal(50.0, Some(vec!["T".into()]))];
    fails(&w, "resumed_after_faults");
    w.heals = vec![heal(50.0, Some(vec!["S".into()]))];
    assert!(verdict(&w, "resumed_after_faults").passed);
}

#[test]
fn a_gap_in_the_live_stream_fails() {
    let mut w = world();
    w.history.live_events.remove(1);
    fails(&w, "live_stream_consistent");
    let mut w = world();
    w.history.live_events.clear();
    fails(&w, "live_stream_consistent");
}

#[test]
fn a_retry_refused_for_lack_of_room_does_not_settle_a_key() {
    let mut w = world();
    // k4's retry was turned away at the door: that says nothing about its first attempt.
    w.history.ops[6].code = "ResourceExhausted".into();
    fails(&w, "indeterminate_resolved");
}

#[test]
fn a_long_outage_with_no_call_inside_proves_nothing() {
    let mut w = world();
    w.outages[0].start_ms = 2_000.0;
    w.outages[0].end_ms = 3_500.0;
    fails(&w, "unavailable_while_redis_down");
}

#[test]
fn a_stock_row_no_event_ever_described_fails() {
    let mut w = world();
    w.facts.stock.push(StockRow {
        sku: "U".into(),
        on_hand: 0,
        reserved: 0,
        version: 1,
    });
    fails(&w, "stock_moves_exactly_once");
}
