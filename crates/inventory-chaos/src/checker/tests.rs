//! Every check passes on a consistent world and fails when one fact in it is wrong.

use super::*;
use crate::history::{Outcome, Phase, Snapshot};

/// SKU "S": stocked with 10; k1 holds 2 and is confirmed; k2 is refused; k3's first answer is
/// unknown, its retry holds 1, which then expires; k4 comes while Redis is down, and its
/// retry afterwards is refused. Then k5 holds 3, confirms 1 of them under key k5-part and
/// releases the rest (the reservation ends CONFIRMED); k6 holds 1, is extended, and its
/// order is cancelled, after which a Reserve for that order (k6-late) is refused.
struct World {
    history: History,
    stream: Vec<SeenEvent>,
    facts: Facts,
    outages: Vec<Outage>,
    heals: Vec<Heal>,
    failovers: Vec<Outage>,
}

fn line(quantity: i64) -> Vec<Line> {
    vec![Line {
        sku: "S".into(),
        quantity,
    }]
}

fn op(kind: OpKind, key: &str, id: Option<&str>, at: f64, outcome: Outcome, code: &str) -> Op {
    Op {
        tenant: "default".into(),
        client: 0,
        replica: 0,
        kind,
        phase: Phase::Load,
        key: (kind == OpKind::Reserve).then(|| key.to_owned()),
        reservation_id: id.map(str::to_owned),
        order_id: (kind == OpKind::Reserve).then(|| format!("order-{key}")),
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
        units: Vec::new(),
        message: String::new(),
    }
}

/// An event of a whole step: the units of its one line of `q` are where its type puts them.
fn event(sequence: i64, kind: &str, id: Option<&str>, q: i64, level: (i64, i64, i64)) -> SeenEvent {
    let (state, units) = match kind {
        "RESERVATION_HELD" => ("HELD", (q, 0, 0)),
        "RESERVATION_CONFIRMED" => ("CONFIRMED", (0, q, 0)),
        "RESERVATION_RELEASED" => ("RELEASED", (0, 0, q)),
        _ => ("EXPIRED", (0, 0, q)),
    };
    SeenEvent {
        tenant: "default".into(),
        sequence,
        event_id: format!("e{sequence}"),
        event_type: kind.into(),
        reservation_id: id.map(str::to_owned),
        sku: id.is_none().then(|| "S".to_owned()),
        delta: id.is_none().then_some(q),
        state: id.map(|_| state.to_owned()),
        lines: if id.is_some() { line(q) } else { Vec::new() },
        units: if id.is_some() {
            vec![units]
        } else {
            Vec::new()
        },
        levels: vec![("S".into(), level.0, level.1, level.2)],
        steps: Vec::new(),
        promised: Vec::new(),
    }
}

/// An event of reservation `id` (one line of `q` on "S") with its units and state set.
fn step(
    sequence: i64,
    kind: &str,
    id: &str,
    q: i64,
    state: &str,
    units: (i64, i64, i64),
    level: Option<(i64, i64, i64)>,
) -> SeenEvent {
    SeenEvent {
        state: Some(state.into()),
        units: vec![units],
        levels: level
            .map(|l| vec![("S".into(), l.0, l.1, l.2)])
            .unwrap_or_default(),
        ..event(sequence, kind, Some(id), q, (0, 0, 0))
    }
}

fn row(
    id: &str,
    key: &str,
    state: &str,
    q: i64,
    fence: i64,
    units: (i64, i64, i64),
) -> ReservationRow {
    ReservationRow {
        id: id.into(),
        key: key.into(),
        order_id: format!("order-{key}"),
        state: state.into(),
        lines: vec![("S".into(), q, fence)],
        units: vec![units],
    }
}

fn heal(healed_ms: f64, skus: Option<Vec<String>>) -> Heal {
    Heal {
        fault: "redis_cut".into(),
        healed_ms,
        skus,
        next_failover_ms: None,
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
    // k5: 3 held, 1 confirmed in part, the rest released.
    let mut k5 = op(
        OpKind::Reserve,
        "k5",
        Some("R5"),
        1_000.0,
        Outcome::Ok,
        "Ok",
    );
    k5.lines = line(3);
    let mut part = op(OpKind::Confirm, "", Some("R5"), 1_100.0, Outcome::Ok, "Ok");
    part.key = Some("k5-part".into());
    part.lines = line(1);
    part.state = Some("HELD".into());
    part.units = vec![("S".into(), 2, 1, 0)];
    let mut rest = op(OpKind::Release, "", Some("R5"), 1_200.0, Outcome::Ok, "Ok");
    rest.state = Some("CONFIRMED".into());
    rest.units = vec![("S".into(), 0, 1, 2)];
    // k6: 1 held, extended, its order cancelled; a later Reserve for the order is refused.
    let k6 = op(
        OpKind::Reserve,
        "k6",
        Some("R6"),
        1_300.0,
        Outcome::Ok,
        "Ok",
    );
    let mut extend = op(OpKind::Extend, "", Some("R6"), 1_350.0, Outcome::Ok, "Ok");
    extend.state = Some("HELD".into());
    let mut cancel = op(OpKind::Cancel, "", Some("R6"), 1_400.0, Outcome::Ok, "Ok");
    cancel.key = Some("k6-cancel".into());
    cancel.order_id = Some("order-k6".into());
    cancel.state = Some("RELEASED".into());
    cancel.units = vec![("S".into(), 0, 0, 1)];
    let mut late = op(
        OpKind::Reserve,
        "k6-late",
        None,
        1_500.0,
        Outcome::Fail,
        "FailedPrecondition",
    );
    late.order_id = Some("order-k6".into());
    let stream = vec![
        event(1, "STOCK_ADJUSTED", None, 10, (10, 0, 1)),
        event(2, "RESERVATION_HELD", Some("R1"), 2, (10, 2, 2)),
        event(3, "RESERVATION_CONFIRMED", Some("R1"), 2, (8, 0, 3)),
        event(4, "RESERVATION_HELD", Some("R3"), 1, (8, 1, 4)),
        event(5, "RESERVATION_EXPIRED", Some("R3"), 1, (8, 0, 5)),
        event(6, "RESERVATION_HELD", Some("R5"), 3, (8, 3, 6)),
        step(
            7,
            "RESERVATION_PARTIALLY_CONFIRMED",
            "R5",
            3,
            "HELD",
            (2, 1, 0),
            Some((7, 2, 7)),
        ),
        step(
            8,
            "RESERVATION_RELEASED",
            "R5",
            3,
            "CONFIRMED",
            (0, 1, 2),
            Some((7, 0, 8)),
        ),
        event(9, "RESERVATION_HELD", Some("R6"), 1, (7, 1, 9)),
        step(10, "RESERVATION_EXTENDED", "R6", 1, "HELD", (1, 0, 0), None),
        event(11, "RESERVATION_RELEASED", Some("R6"), 1, (7, 0, 10)),
    ];
    let facts = Facts {
        reservations: vec![
            row("R1", "k1", "CONFIRMED", 2, 5, (0, 2, 0)),
            row("R3", "k3", "EXPIRED", 1, 6, (0, 0, 1)),
            row("R5", "k5", "CONFIRMED", 3, 7, (0, 1, 2)),
            row("R6", "k6", "RELEASED", 1, 8, (0, 0, 1)),
        ],
        stock: vec![StockRow {
            sku: "S".into(),
            on_hand: 7,
            reserved: 0,
            version: 10,
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
        head: 11,
        level_mismatches: Vec::new(),
        cancel_violations: Vec::new(),
        adjust_keys: Vec::new(),
        cancelled_orders: vec!["order-k6".into()],
        callers: vec!["shopper".into()],
        receipts: Vec::new(),
        demand: Vec::new(),
    };
    World {
        history: History {
            ops: vec![
                k1, confirm, k2, k3, k3_retry, k4, k4_retry, k5, part, rest, k6, extend, cancel,
                late,
            ],
            snapshots: vec![Snapshot {
                tenant: "default".into(),
                at_ms: 150.0,
                sku: "S".into(),
                on_hand: 10,
                reserved: 2,
                available: 8,
            }],
            receipts: Vec::new(),
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
        // PostgreSQL failed over at the same time: k4 was answered UNAVAILABLE.
        failovers: vec![Outage {
            fault: "pg_primary_kill".into(),
            start_ms: 150.0,
            end_ms: 400.0,
            skus: None,
        }],
    }
}

fn run(w: &World) -> Vec<Check> {
    check(
        &w.history,
        &w.stream,
        &w.facts,
        &w.outages,
        &w.heals,
        &w.failovers,
        20_000.0,
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

/// Fails, and for the reason given: the detail names it.
#[track_caller]
fn fails_with(w: &World, name: &str, reason: &str) {
    let c = verdict(w, name);
    assert!(!c.passed, "{name} passed: {}", c.detail);
    assert!(c.detail.contains(reason), "{name}: {}", c.detail);
}

#[test]
fn a_consistent_world_passes_every_check() {
    let w = world();
    for c in run(&w) {
        assert!(c.passed, "{}: {}", c.name, c.detail);
        assert!(
            // The world has no stock-states load; its check has a test of its own.
            c.examined > 0 || matches!(c.name, "resumed_after_faults" | "never_overpromised"),
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
    w.facts
        .reservations
        .push(row("R2", "k2", "HELD", 1, 7, (1, 0, 0)));
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
    w.history.ops.remove(6);
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
    w.heals = vec![heal(2_000.0, None)];
    fails(&w, "resumed_after_faults");
    // With a failover right after it, the failover's heal is the one judged.
    w.heals[0].next_failover_ms = Some(3_000.0);
    w.heals.push(heal(4_000.0, None));
    fails(&w, "resumed_after_faults");
    w.heals.pop();
    assert!(verdict(&w, "resumed_after_faults").passed);
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

#[test]
fn a_partial_step_and_an_extension_pass_the_lifecycle_and_the_replay() {
    let w = world();
    for name in [
        "events_one_per_change_gap_free",
        "stock_moves_exactly_once",
        "units_settled_once",
    ] {
        let c = verdict(&w, name);
        assert!(c.passed, "{name}: {}", c.detail);
    }
}

#[test]
fn a_partial_confirm_that_left_on_hand_alone_fails() {
    let mut w = world();
    // The confirmed unit never left the stock.
    w.stream[6].levels[0].1 = 8;
    fails_with(
        &w,
        "stock_moves_exactly_once",
        "S v7: replayed 7/2, event says 8/2",
    );
}

#[test]
fn a_partial_confirm_applied_twice_fails() {
    // The key asked for 1 unit; the event confirmed 2. The levels agree with the event, so
    // only the units give it away.
    let mut w = world();
    w.stream[6].units = vec![(1, 2, 0)];
    w.stream[6].levels[0] = ("S".into(), 6, 1, 7);
    w.stream[7].units = vec![(0, 2, 1)];
    w.stream[7].levels[0] = ("S".into(), 6, 0, 8);
    w.stream[8].levels[0] = ("S".into(), 6, 1, 9);
    w.stream[10].levels[0] = ("S".into(), 6, 0, 10);
    w.facts.stock[0].on_hand = 6;
    w.facts.reservations[2].units = vec![(0, 2, 1)];
    assert!(verdict(&w, "stock_moves_exactly_once").passed);
    fails_with(
        &w,
        "units_settled_once",
        "R5 at sequence 7: RESERVATION_PARTIALLY_CONFIRMED moved [(\"S\", 2)]",
    );
}

#[test]
fn a_partial_event_no_key_asked_for_fails() {
    let mut w = world();
    // The partial confirm never went out, yet a partial event moved its unit.
    w.history
        .ops
        .retain(|o| o.key.as_deref() != Some("k5-part"));
    fails_with(
        &w,
        "units_settled_once",
        "which no unused key sent asked for",
    );
}

#[test]
fn a_partial_key_answered_ok_without_its_event_fails() {
    let mut w = world();
    let mut again = w.history.ops[8].clone();
    again.kind = OpKind::Release;
    again.key = Some("k5-part-2".into());
    w.history.ops.push(again);
    fails_with(
        &w,
        "units_settled_once",
        "R5: 0 RESERVATION_PARTIALLY_RELEASED events for 1 keys answered OK of 1 sent",
    );
    // Refused outright, it moved nothing and needs no event.
    w.history.ops.last_mut().unwrap().outcome = Outcome::Fail;
    assert!(verdict(&w, "units_settled_once").passed);
}

#[test]
fn units_that_do_not_add_up_fail() {
    let mut w = world();
    w.stream[6].units = vec![(2, 1, 1)];
    fails_with(
        &w,
        "units_settled_once",
        "R5 at sequence 7: S held 2, confirmed 1, released 1 of 3",
    );
}

#[test]
fn a_confirmed_unit_released_again_fails() {
    let mut w = world();
    // The release of the rest took the confirmed unit back too.
    w.stream[7].units = vec![(0, 0, 3)];
    w.facts.reservations[2].units = vec![(0, 0, 3)];
    fails_with(&w, "units_settled_once", "S went from 2/1/0 to 0/0/3");
}

#[test]
fn a_row_whose_units_differ_from_its_last_event_fails() {
    let mut w = world();
    w.facts.reservations[2].units = vec![(0, 0, 3)];
    fails_with(&w, "units_settled_once", "R5: the last event says");
}

#[test]
fn an_end_in_another_state_than_the_row_fails() {
    let mut w = world();
    // Released the rest of a partly confirmed hold, yet says it ended RELEASED.
    w.stream[7].state = Some("RELEASED".into());
    fails_with(
        &w,
        "events_one_per_change_gap_free",
        "RESERVATION_RELEASED at sequence 8 says Some(\"RELEASED\")",
    );
    let mut w = world();
    // A confirm cannot end a reservation RELEASED.
    w.stream[2].state = Some("RELEASED".into());
    w.facts.reservations[0].state = "RELEASED".into();
    fails_with(
        &w,
        "events_one_per_change_gap_free",
        "RESERVATION_CONFIRMED at sequence 3 says",
    );
}

#[test]
fn a_step_after_the_end_or_two_ends_fail() {
    let mut w = world();
    // The extension came after the cancel's release.
    w.stream.swap(9, 10);
    for (i, e) in w.stream.iter_mut().enumerate() {
        e.sequence = i as i64 + 1;
    }
    for (o, e) in w.facts.outbox.iter_mut().zip(&w.stream) {
        (o.event_id, o.event_type) = (e.event_id.clone(), e.event_type.clone());
    }
    fails_with(
        &w,
        "events_one_per_change_gap_free",
        "R6 (RELEASED): an end while held, or more than one end",
    );
    let mut w = world();
    // The partial confirm as a second end.
    w.stream[6].event_type = "RESERVATION_CONFIRMED".into();
    w.facts.outbox[6].event_type = "RESERVATION_CONFIRMED".into();
    fails_with(
        &w,
        "events_one_per_change_gap_free",
        "R5 (CONFIRMED): an end while held, or more than one end",
    );
}

#[test]
fn a_whole_release_answers_confirmed_after_a_partial_confirm() {
    let mut w = world();
    assert!(verdict(&w, "confirmed_and_released_never_lost").passed);
    // But a whole confirm never answers RELEASED.
    w.history.ops[1].state = Some("RELEASED".into());
    fails(&w, "confirmed_and_released_never_lost");
}

#[test]
fn a_reserve_ok_after_its_order_was_cancelled_fails() {
    let mut w = world();
    let late = w.history.ops.last_mut().unwrap();
    late.outcome = Outcome::Ok;
    late.code = "Ok".into();
    fails_with(
        &w,
        "units_settled_once",
        "k6-late: Reserve for cancelled order order-k6 answered OK",
    );
    // Sent before the cancel answered, it may have committed first.
    let mut w = world();
    let late = w.history.ops.last_mut().unwrap();
    late.outcome = Outcome::Ok;
    late.invoked_ms = 1_390.0;
    assert!(verdict(&w, "units_settled_once").passed);
}

#[test]
fn a_cancel_that_left_units_held_fails() {
    let mut w = world();
    w.history.ops[12].units = vec![("S".into(), 1, 0, 0)];
    fails_with(
        &w,
        "units_settled_once",
        "cancel of order-k6 answered with 1 units still held",
    );
}

#[test]
fn a_row_the_tombstone_should_have_stopped_fails() {
    let mut w = world();
    w.facts
        .cancel_violations
        .push("R7 of cancelled order order-k6: created after the cancel (HELD)".into());
    fails_with(&w, "units_settled_once", "R7 of cancelled order order-k6");
}

#[test]
fn an_acknowledged_adjust_or_cancel_that_is_not_stored_fails() {
    let mut w = world();
    w.history
        .ops
        .push(op(OpKind::Adjust, "", None, 1_500.0, Outcome::Ok, "Ok"));
    w.history.ops.last_mut().unwrap().key = Some("a1".into());
    fails_with(&w, "adjusts_and_cancels_kept", "adjust a1");
    w.facts.adjust_keys.push("a1".into());
    assert!(verdict(&w, "adjusts_and_cancels_kept").passed);

    w.facts.cancelled_orders.clear();
    fails_with(&w, "adjusts_and_cancels_kept", "cancel of order-k6");
}

/// A call on R1 at 300 ms, answered `code` with `message`.
fn answered(kind: OpKind, outcome: Outcome, code: &str, message: &str) -> Op {
    let mut op = op(kind, "", Some("R1"), 300.0, outcome, code);
    op.message = message.into();
    op
}

#[test]
fn an_error_that_hides_the_outcome_during_a_failover_fails() {
    let mut w = world();
    // A replica killed beside the failover: the client's transport error is no answer.
    let gone = answered(
        OpKind::Release,
        Outcome::Unknown,
        "Unknown",
        "transport error",
    );
    w.history.ops.push(gone);
    assert!(verdict(&w, "retryable_during_failover").passed);

    let hidden = answered(
        OpKind::Confirm,
        Outcome::Fail,
        "Internal",
        "connection closed",
    );
    w.history.ops.push(hidden);
    fails_with(
        &w,
        "retryable_during_failover",
        "Internal (connection closed)",
    );
    // The same answer outside the failover is another check's business.
    w.failovers[0].end_ms = 250.0;
    assert!(verdict(&w, "retryable_during_failover").passed);
}

#[test]
fn a_failovers_outage_is_the_longest_stretch_without_a_reserve_inside_it() {
    use crate::report::longest_without_reserve;
    let reserve = |at: f64, outcome| op(OpKind::Reserve, "k", None, at, outcome, "Ok");
    // Answered at 105, 905 (and a refusal at 505), 1,205 and 5,005: the last is past the heal.
    let history = History {
        ops: vec![
            reserve(100.0, Outcome::Ok),
            reserve(500.0, Outcome::Fail),
            reserve(900.0, Outcome::Ok),
            reserve(1_200.0, Outcome::Ok),
            reserve(5_000.0, Outcome::Ok),
        ],
        snapshots: Vec::new(),
        receipts: Vec::new(),
        live_events: Vec::new(),
    };
    assert_eq!(longest_without_reserve(&history, 0.0, 2_000.0), 800.0);
    // Nothing answered after 1,205 until the heal at 3,000; what follows the heal is not its.
    assert_eq!(longest_without_reserve(&history, 0.0, 3_000.0), 1_795.0);
    assert_eq!(longest_without_reserve(&history, 2_000.0, 3_000.0), 1_000.0);
}

/// The world of `world()` in `tenant`: the same SKU name, keys and orders, reservations and
/// events of its own, and its own caller.
fn world_of(tenant: &str) -> World {
    let mut w = world();
    let own = |id: &str| format!("{tenant}-{id}");
    for op in &mut w.history.ops {
        op.tenant = tenant.into();
        op.reservation_id = op.reservation_id.as_deref().map(own);
    }
    for snapshot in &mut w.history.snapshots {
        snapshot.tenant = tenant.into();
    }
    for e in w.stream.iter_mut().chain(&mut w.history.live_events) {
        e.tenant = tenant.into();
        e.event_id = own(&e.event_id);
        e.reservation_id = e.reservation_id.as_deref().map(own);
    }
    for row in &mut w.facts.reservations {
        row.id = own(&row.id);
    }
    for row in &mut w.facts.outbox {
        row.event_id = own(&row.event_id);
    }
    w.facts.callers = vec![format!("shopper-{tenant}")];
    w
}

/// Tenants `default` and `brand_b`, each its world, and the run's history: both tenants' calls
/// interleaved.
fn two_tenants() -> (History, World, World) {
    let (a, b) = (world_of("default"), world_of("brand_b"));
    let mut history = History::default();
    for w in [&a, &b] {
        history.ops.extend(w.history.ops.iter().cloned());
        history
            .snapshots
            .extend(w.history.snapshots.iter().cloned());
        history
            .live_events
            .extend(w.history.live_events.iter().cloned());
    }
    history
        .ops
        .sort_by(|x, y| x.invoked_ms.total_cmp(&y.invoked_ms));
    (history, a, b)
}

fn rows<'a>(tenant: &'a str, caller: &'a str, w: &'a World) -> TenantRows<'a> {
    TenantRows {
        tenant,
        callers: vec![caller],
        facts: &w.facts,
        stream: &w.stream,
    }
}

fn isolated(history: &History, a: &World, b: &World) -> Check {
    tenants_isolated(
        history,
        &[
            rows("default", "shopper-default", a),
            rows("brand_b", "shopper-brand_b", b),
        ],
        &["S".to_owned()],
    )
}

#[test]
fn each_tenant_is_judged_on_its_own_history_stream_and_rows() {
    let (history, a, b) = two_tenants();
    for (tenant, w) in [("default", &a), ("brand_b", &b)] {
        let checks = check_tenant(
            tenant,
            &history,
            &w.stream,
            &w.facts,
            (&w.outages, &w.heals),
            &w.failovers,
            20_000.0,
        );
        assert_eq!(checks.len(), run(&a).len());
        for c in &checks {
            assert!(c.passed, "{tenant} {}: {}", c.name, c.detail);
            assert_eq!(c.tenant.as_deref(), Some(tenant), "{}", c.name);
        }
    }
    // Against one tenant's rows, the other's calls under the same keys are strangers.
    let mixed = check(
        &history,
        &a.stream,
        &a.facts,
        &a.outages,
        &a.heals,
        &a.failovers,
        20_000.0,
    );
    let failed: Vec<_> = mixed.iter().filter(|c| !c.passed).map(|c| c.name).collect();
    assert!(failed.contains(&"successes_exist_once"), "{failed:?}");
}

#[test]
fn nothing_of_one_tenant_may_be_in_another() {
    let (history, a, b) = two_tenants();
    let c = isolated(&history, &a, &b);
    assert!(c.passed, "{}", c.detail);
    assert!(
        c.detail.contains("holds: brand_b 4, default 4"),
        "{}",
        c.detail
    );

    let failing = |history: &History, a: &World, b: &World, reason: &str| {
        let c = isolated(history, a, b);
        assert!(!c.passed, "passed: {}", c.detail);
        assert!(c.detail.contains(reason), "{reason:?} not in: {}", c.detail);
    };
    // Another tenant's reservation among a tenant's rows.
    let (history, a, mut b) = two_tenants();
    b.facts.reservations.push(a.facts.reservations[0].clone());
    failing(
        &history,
        &a,
        &b,
        "reservation default-R1 is stored in tenant default's rows and in tenant brand_b's",
    );
    // Another tenant's caller in a tenant's rows.
    let (history, a, mut b) = two_tenants();
    b.facts.callers.push("shopper-default".into());
    failing(
        &history,
        &a,
        &b,
        "tenant brand_b's rows name caller \"shopper-default\"",
    );
    // A tenant's caller answered with another tenant's reservation.
    let (mut history, a, b) = two_tenants();
    let k1 = history
        .ops
        .iter_mut()
        .find(|o| o.tenant == "brand_b" && o.key.as_deref() == Some("k1"))
        .unwrap();
    k1.reservation_id = Some("default-R1".into());
    failing(
        &history,
        &a,
        &b,
        "tenant brand_b's Reserve k1 was answered with reservation default-R1",
    );
    // One event in two streams; a stream naming another tenant's reservation.
    let (history, a, mut b) = two_tenants();
    b.stream[0].event_id = "default-e1".into();
    b.stream[1].reservation_id = Some("default-R1".into());
    failing(
        &history,
        &a,
        &b,
        "event default-e1 is in tenant default's stream and in tenant brand_b's",
    );
    failing(
        &history,
        &a,
        &b,
        "tenant brand_b's stream names reservation default-R1, stored in tenant default's rows",
    );
    // A tenant without its own stock row of a SKU name, or that never sold.
    let (mut history, a, mut b) = two_tenants();
    b.facts.stock.clear();
    history.ops.retain(|o| o.tenant != "brand_b");
    failing(&history, &a, &b, "tenant brand_b has no stock row of S");
    failing(&history, &a, &b, "tenant brand_b: no Reserve succeeded");
}

/// The stock-states load's promises: within what the stock keeps, at every level and
/// receipt; and each way of breaking them is named.
#[test]
fn never_overpromised_names_a_promise_beyond_the_stock_or_a_receipt() {
    use crate::history::ReceiptSnapshot;
    use crate::workload::WAITING_SKU;
    let world = world();
    let mut stream = world.stream.clone();
    let mut waiting = event(12, "RESERVATION_HELD", Some("W1"), 3, (2, 2, 12));
    waiting.lines[0].sku = WAITING_SKU.into();
    waiting.levels[0].0 = WAITING_SKU.into();
    // 2 on hand, 2 held, 1 backordered within a limit of 6.
    waiting.promised = vec![(WAITING_SKU.into(), 2, 2, 1, 6, 0)];
    stream.push(waiting.clone());
    let mut facts = world.facts.clone();
    facts.head = 12;
    let mut stored = row("W1", "kw", "HELD", 3, 9, (2, 0, 0));
    stored.lines[0].0 = WAITING_SKU.into();
    facts.reservations.push(stored);
    facts.outbox.push(OutboxRow {
        position: Some(12),
        event_id: "e12".into(),
        event_type: "RESERVATION_HELD".into(),
        tx_id: "712".into(),
    });
    facts.receipts.push(ReceiptRow {
        receipt_id: "R".into(),
        quantity: 5,
        received: 1,
        preordered: 3,
        pegged: 3,
    });
    let mut history = world.history.of_tenant("default");
    let (outages, heals, failovers) = (&world.outages, &world.heals, &world.failovers);
    history.receipts.push(ReceiptSnapshot {
        tenant: "default".into(),
        at_ms: 10.0,
        receipt_id: "R".into(),
        quantity: 5,
        received: 0,
        preordered: 5,
    });
    let verdict = |stream: &[SeenEvent], facts: &Facts, history: &History| {
        check(history, stream, facts, outages, heals, failovers, 20_000.0)
            .into_iter()
            .find(|c| c.name == "never_overpromised")
            .unwrap()
    };
    let clean = verdict(&stream, &facts, &history);
    assert!(clean.passed, "{}", clean.detail);
    assert_eq!(clean.examined, 3);
    // The waiting load's events leave the reservation checks alone.
    let all = check(
        &history, &stream, &facts, outages, heals, failovers, 20_000.0,
    );
    assert!(all.iter().all(|c| c.passed), "{all:?}");

    let mut over = stream.clone();
    over.last_mut().unwrap().promised = vec![(WAITING_SKU.into(), 2, 2, 7, 6, 0)];
    let failed = verdict(&over, &facts, &history);
    assert!(
        !failed.passed && failed.detail.contains("backordered 7"),
        "{}",
        failed.detail
    );
    let mut unsound = stream.clone();
    unsound.last_mut().unwrap().promised = vec![(WAITING_SKU.into(), 2, 2, 0, 6, 1)];
    assert!(!verdict(&unsound, &facts, &history).passed);
    let mut pegged_twice = facts.clone();
    pegged_twice.receipts[0].pegged = 2;
    assert!(!verdict(&stream, &pegged_twice, &history).passed);
    let mut beyond = history.of_tenant("default");
    beyond.receipts[0].preordered = 6;
    assert!(!verdict(&stream, &facts, &beyond).passed);

    // At the end: 2 held + 1 backordered + 3 pre-ordered from open receipts against 2 on
    // hand, a limit of 6 and 4 incoming is covered; 10 pre-ordered is not.
    let mut demand = facts.clone();
    demand.demand.push(crate::checker::DemandRow {
        sku: WAITING_SKU.into(),
        held: 2,
        backordered: 1,
        preordered_open: 3,
        on_hand: 2,
        backorder_limit: 6,
        incoming: 4,
    });
    let covered = verdict(&stream, &demand, &history);
    assert!(covered.passed, "{}", covered.detail);
    assert_eq!(covered.examined, 4);
    demand.demand[0].preordered_open = 10;
    let uncovered = verdict(&stream, &demand, &history);
    assert!(
        !uncovered.passed && uncovered.detail.contains("pre-ordered 10"),
        "{}",
        uncovered.detail
    );
}
