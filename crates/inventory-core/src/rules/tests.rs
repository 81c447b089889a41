use std::time::{Duration, SystemTime};

use super::*;
use crate::domain::{
    AllocationPolicy, Caller, IdempotencyKey, OrderId, Quantity, Reason, StockDelta,
};

fn sku(raw: &str) -> Sku {
    Sku::parse(raw).unwrap()
}

fn level(on_hand: i64, reserved: i64, version: i64) -> StockLevel {
    StockLevel {
        sku: sku("A"),
        on_hand,
        reserved,
        version,
        location: None,
        states: Default::default(),
        apart: 0,
    }
}

fn adjust(delta: i64) -> AdjustStock {
    AdjustStock {
        caller: Caller::anonymous(),
        sku: sku("A"),
        delta: StockDelta::parse(delta).unwrap(),
        idempotency_key: IdempotencyKey::parse("k").unwrap(),
        reason: Reason::parse("r").unwrap(),
        expected_version: None,
        location: LocationId::default_location(),
        state: None,
    }
}

#[test]
fn a_first_positive_adjustment_creates_the_sku_at_version_one() {
    assert_eq!(adjust_stock(None, &adjust(5)).unwrap(), level(5, 0, 1));
    assert!(matches!(
        adjust_stock(None, &adjust(-1)),
        Err(Error::UnknownSkus(skus)) if skus == [sku("A")]
    ));
}

#[test]
fn adding_stops_at_the_limit_and_removing_at_the_reserved_units() {
    assert_eq!(
        adjust_stock(Some(&level(10, 4, 3)), &adjust(2)).unwrap(),
        level(12, 4, 4)
    );
    assert_eq!(
        adjust_stock(Some(&level(10, 4, 3)), &adjust(-6)).unwrap(),
        level(4, 4, 4)
    );
    assert!(matches!(
        adjust_stock(Some(&level(10, 4, 3)), &adjust(-7)),
        Err(Error::BelowReserved {
            requested: 7,
            on_hand: 10,
            reserved: 4,
            ..
        })
    ));
    let full = level(MAX_ON_HAND - 1, 0, 9);
    assert_eq!(
        adjust_stock(Some(&full), &adjust(1)).unwrap().on_hand,
        MAX_ON_HAND
    );
    assert!(matches!(
        adjust_stock(Some(&full), &adjust(2)),
        Err(Error::StockLimit {
            requested: 2,
            limit: MAX_ON_HAND,
            ..
        })
    ));
}

fn line(raw: &str, quantity: i64) -> Line {
    Line {
        sku: sku(raw),
        quantity: Quantity::parse(quantity).unwrap(),
        location: None,
    }
}

/// Every location as configured: `default` only.
fn only_default() -> Vec<Location> {
    vec![Location {
        id: LocationId::default_location(),
        priority: 0,
        active: true,
    }]
}

/// A SKU's locked stock, all at `default`.
fn stock_of(raw: &str, on_hand: i64, reserved: i64, fence: i64) -> SkuStock {
    let total = StockLevel {
        sku: sku(raw),
        ..level(on_hand, reserved, 1)
    };
    SkuStock {
        at: vec![StockLevel {
            location: Some(LocationId::default_location()),
            ..total.clone()
        }],
        total,
        fence: FenceToken::new(fence),
        now: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000),
        receipts: Vec::new(),
        waits_until: None,
    }
}

#[test]
fn a_cart_is_held_whole_or_refused_with_fences_first_then_unknown_skus_then_shortfalls() {
    let (a, b, c) = (line("A", 3), line("B", 1), line("C", 2));
    let fence = FenceToken::new(5);
    let stock = |a_fence: i64| {
        std::collections::HashMap::from([
            (sku("A"), stock_of("A", 4, 2, a_fence)),
            (sku("C"), stock_of("C", 1, 0, 1)),
        ])
    };
    let policy = AllocationPolicy::default();
    let locations = only_default();
    // A is short (2 available), B is unknown, C is short: the unknown SKU decides.
    let mut locked = stock(1);
    let lines = [(&a, fence), (&b, fence), (&c, fence)];
    assert!(matches!(
        place_lines(&lines, &mut locked, policy, &locations),
        LinesVerdict::Refused(Error::UnknownSkus(s)) if s == [sku("B")]
    ));
    // A's stored fence is not below the token: fenced outranks everything.
    let mut fenced = stock(5);
    assert!(matches!(
        place_lines(&lines, &mut fenced, policy, &locations),
        LinesVerdict::Fenced(f) if f == [(sku("A"), FenceToken::new(5))]
    ));
    let lines = [(&a, fence), (&c, fence)];
    match place_lines(&lines, &mut locked, policy, &locations) {
        LinesVerdict::Refused(Error::InsufficientStock(short)) => {
            let named: Vec<(&str, i64, i64)> = short
                .iter()
                .map(|s| (s.sku.as_str(), s.requested, s.available))
                .collect();
            assert_eq!(named, [("A", 3, 2), ("C", 2, 1)]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(locked, stock(1), "a refused cart changes nothing");
    let (a2, c1) = (line("A", 2), line("C", 1));
    let lines = [(&a2, fence), (&c1, fence)];
    match place_lines(&lines, &mut locked, policy, &locations) {
        LinesVerdict::Held(placed) => {
            assert_eq!(placed.len(), 2);
            assert_eq!((placed[0][0].units, placed[0][0].total.reserved), (2, 4));
            assert_eq!(placed[1][0].level.version, 2);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(locked[&sku("A")].total.available(), 0);
}

fn reserve(key: &str, quantity: i64) -> (Reserve, Ttl) {
    (
        Reserve::new(
            Caller::anonymous(),
            IdempotencyKey::parse(key).unwrap(),
            OrderId::parse("o").unwrap(),
            vec![line("A", quantity)],
            None,
        ),
        Ttl::parse(Duration::from_secs(60)).unwrap(),
    )
}

fn group(fence: i64, batch: Vec<(Reserve, Ttl)>) -> ReserveGroup {
    ReserveGroup {
        sku: sku("A"),
        fence: FenceToken::new(fence),
        batch,
    }
}

fn locked(on_hand: i64, reserved: i64, fence: i64) -> SkuStock {
    stock_of("A", on_hand, reserved, fence)
}

fn decided(verdict: GroupVerdict) -> Vec<Decided> {
    match verdict {
        GroupVerdict::Decided(decided) => decided,
        GroupVerdict::Fenced(stored) => panic!("fenced at {stored:?}"),
    }
}

#[test]
fn a_group_decides_each_request_as_if_alone_after_the_ones_before() {
    let g = group(
        10,
        vec![
            reserve("a", 3),
            reserve("b", 3),
            reserve("c", 1),
            reserve("d", 5),
        ],
    );
    let stock = locked(7, 0, 9);
    let decisions = decided(
        decide_group(
            &g,
            Some(&stock),
            &only_default(),
            |_| Ok(Earlier::Claimed),
            |_| false,
        )
        .unwrap(),
    );
    let held: Vec<bool> = decisions.iter().map(|d| d.answer.is_ok()).collect();
    // 7 units: 3 + 3 + 1 fit, the last 5 do not.
    assert_eq!(held, [true, true, true, false]);
    assert!(decisions.iter().all(|d| d.executed));
    let after: Vec<(i64, i64)> = decisions
        .iter()
        .filter_map(|d| d.placements.last())
        .map(|p| (p.total.reserved, p.total.version))
        .collect();
    assert_eq!(after, [(3, 2), (6, 3), (7, 4)], "each hold's own level");
    match &decisions[3].answer {
        Err(Error::InsufficientStock(s)) => assert_eq!((s[0].requested, s[0].available), (5, 0)),
        other => panic!("{other:?}"),
    }
    let hold = decisions[0].answer.as_ref().unwrap();
    assert_eq!(hold.created_at, stock.now);
    assert_eq!(hold.expires_at, stock.now + Duration::from_secs(60));
}

#[test]
fn a_stale_fence_writes_nothing_of_the_group() {
    let g = group(9, vec![reserve("a", 1)]);
    let mut asked = 0;
    let verdict = decide_group(
        &g,
        Some(&locked(5, 0, 9)),
        &only_default(),
        |_| {
            asked += 1;
            Ok(Earlier::Claimed)
        },
        |_| false,
    )
    .unwrap();
    assert!(matches!(verdict, GroupVerdict::Fenced(f) if f == FenceToken::new(9)));
    assert_eq!(asked, 0, "no key is judged for a fenced group");
}

#[test]
fn replays_conflicts_and_vanished_keys_take_no_stock() {
    let g = group(
        10,
        vec![
            reserve("replayed", 1),
            reserve("reused", 1),
            reserve("gone", 1),
            reserve("new", 2),
        ],
    );
    let decisions = decided(
        decide_group(
            &g,
            Some(&locked(2, 0, 1)),
            &only_default(),
            |command| {
                Ok(match command.idempotency_key.as_str() {
                    "replayed" => Earlier::Replay(Err(Error::UnknownSkus(vec![sku("A")]))),
                    "reused" => Earlier::KeyReused,
                    "gone" => Earlier::Vanished,
                    _ => Earlier::Claimed,
                })
            },
            |_| false,
        )
        .unwrap(),
    );
    assert!(matches!(decisions[0].answer, Err(Error::UnknownSkus(_))));
    assert!(matches!(
        decisions[1].answer,
        Err(Error::IdempotencyKeyReused)
    ));
    assert!(matches!(
        decisions[2].answer,
        Err(Error::Unavailable { .. })
    ));
    assert!(decisions[..3].iter().all(|d| !d.executed));
    // All 2 units were still there for the only executed request.
    assert!(decisions[3].answer.is_ok() && decisions[3].executed);
}

#[test]
fn an_unknown_sku_is_a_stored_refusal_for_every_request() {
    let g = group(1, vec![reserve("a", 1), reserve("b", 1)]);
    let decisions = decided(
        decide_group(
            &g,
            None,
            &only_default(),
            |_| Ok(Earlier::Claimed),
            |_| false,
        )
        .unwrap(),
    );
    assert!(
        decisions
            .iter()
            .all(|d| d.executed && matches!(d.answer, Err(Error::UnknownSkus(_))))
    );
}

/// A live hold of `lines` (`(sku, quantity)`), nothing settled yet.
fn hold_of(lines: &[(&str, i64)]) -> Reservation {
    let (command, ttl) = reserve("k", 1);
    let lines: Vec<ReservationLine> = lines
        .iter()
        .map(|(s, q)| at_default(&line(s, *q)))
        .collect();
    new_hold(&command, lines, SystemTime::UNIX_EPOCH, ttl)
}

/// A line just held, all at `default`.
fn at_default(line: &Line) -> ReservationLine {
    let placed = Allocation::new_hold(LocationId::default_location(), line.quantity.get());
    ReservationLine::new_hold(line, vec![placed])
}

/// `(sku, units)` of each move (all at `default` here).
fn pairs(moves: &[Move]) -> Vec<(Sku, i64)> {
    moves.iter().map(|m| (m.sku.clone(), m.units)).collect()
}

fn applied(step: Result<SettleStep, Error>) -> UnitMove {
    match step.unwrap() {
        SettleStep::Apply(change) => change,
        SettleStep::Repeat => panic!("expected a change, got a repeat"),
    }
}

/// `(held, confirmed, released)` of every line, checking that each adds up to its quantity.
fn counts(reservation: &Reservation) -> Vec<(i64, i64, i64)> {
    reservation
        .lines
        .iter()
        .map(|l| {
            assert_eq!(l.held + l.confirmed + l.released, l.quantity.get(), "{l:?}");
            (l.held, l.confirmed, l.released)
        })
        .collect()
}

fn units(lines: &[(&str, i64)]) -> Vec<Line> {
    lines.iter().map(|(s, q)| line(s, *q)).collect()
}

#[test]
fn settling_a_whole_hold_moves_every_held_unit_and_writes_no_line() {
    use ReservationState::*;
    let hold = hold_of(&[("A", 5), ("B", 3)]);
    let confirm = applied(Settle::Confirm.step(&hold, &[], true));
    assert_eq!(pairs(&confirm.moves), vec![(sku("A"), 5), (sku("B"), 3)]);
    assert_eq!(confirm.after.state, Confirmed);
    assert_eq!(confirm.event, ReservationEvent::Confirmed);
    assert_eq!(counts(&confirm.after), vec![(0, 5, 0), (0, 3, 0)]);
    assert!(!confirm.write_lines, "read back by its state alone");
    let release = applied(Settle::Release.step(&hold, &[], true));
    assert_eq!(release.after.state, Released);
    assert_eq!(release.event, ReservationEvent::Released);
    assert_eq!(counts(&release.after), vec![(0, 0, 5), (0, 0, 3)]);
    assert!(!release.write_lines);
}

#[test]
fn repeats_of_whole_calls_are_no_ops_and_other_states_refuse() {
    use ReservationState::*;
    let hold = hold_of(&[("A", 2)]);
    let at = |state: ReservationState, confirmed: i64, released: i64| {
        let mut r = hold.clone();
        r.state = state;
        r.lines[0].held = 0;
        r.lines[0].confirmed = confirmed;
        r.lines[0].released = released;
        r
    };
    for (settle, reservation) in [
        (Settle::Confirm, at(Confirmed, 2, 0)),
        (Settle::Release, at(Released, 0, 2)),
        (Settle::Release, at(Expired, 0, 2)),
        // The rest of a partly confirmed reservation was released.
        (Settle::Release, at(Confirmed, 1, 1)),
    ] {
        assert_eq!(
            settle.step(&reservation, &[], true).unwrap(),
            SettleStep::Repeat,
            "{settle:?} {reservation:?}"
        );
    }
    for (settle, reservation) in [
        (Settle::Confirm, at(Released, 0, 2)),
        (Settle::Confirm, at(Expired, 0, 2)),
        (Settle::Release, at(Confirmed, 2, 0)),
    ] {
        let state = reservation.state;
        assert!(matches!(
            settle.step(&reservation, &[], true),
            Err(Error::WrongState { state: s, action, .. }) if s == state && action == settle.action()
        ));
    }
    // A whole confirm of a reservation whose rest went back to stock is no repeat: it says
    // what became of each line.
    let partly = at(Confirmed, 1, 1);
    match Settle::Confirm.step(&partly, &[], true) {
        Err(Error::PartlyReleased { id, lines }) => {
            assert_eq!(id, partly.id);
            assert_eq!(
                lines,
                vec![Settled {
                    sku: sku("A"),
                    quantity: 2,
                    confirmed: 1,
                    released: 1,
                }]
            );
        }
        other => panic!("a whole confirm after a partial one and a release: {other:?}"),
    }
    // Nor when the rest expired while the confirm waited for the lock.
    let mut expiring = hold.clone();
    expiring.lines[0].held = 1;
    expiring.lines[0].confirmed = 1;
    expiring.lines[0].allocations[0].held = 1;
    expiring.lines[0].allocations[0].confirmed = 1;
    assert!(matches!(
        Settle::Confirm.expired_meanwhile(expiring, &[]),
        Err(Error::PartlyReleased { .. })
    ));
    // A call with lines is never a repeat: only its key makes it one.
    assert!(matches!(
        Settle::Confirm.step(&at(Confirmed, 2, 0), &units(&[("A", 1)]), true),
        Err(Error::WrongState { .. })
    ));
}

#[test]
fn partial_calls_move_only_their_units_and_the_last_one_ends_the_hold() {
    use ReservationState::*;
    let hold = hold_of(&[("A", 5), ("B", 3)]);

    let first = applied(Settle::Confirm.step(&hold, &units(&[("A", 2)]), true));
    assert_eq!(pairs(&first.moves), vec![(sku("A"), 2)]);
    assert_eq!(first.after.state, Held);
    assert_eq!(first.event, ReservationEvent::PartiallyConfirmed);
    assert_eq!(counts(&first.after), vec![(3, 2, 0), (3, 0, 0)]);
    assert!(first.write_lines);

    // Lines in any order; moves come out in SKU order.
    let second = applied(Settle::Release.step(&first.after, &units(&[("B", 3), ("A", 1)]), true));
    assert_eq!(pairs(&second.moves), vec![(sku("A"), 1), (sku("B"), 3)]);
    assert_eq!(second.after.state, Held);
    assert_eq!(second.event, ReservationEvent::PartiallyReleased);
    assert_eq!(counts(&second.after), vec![(2, 2, 1), (0, 0, 3)]);

    let last = applied(Settle::Confirm.step(&second.after, &units(&[("A", 2)]), true));
    assert_eq!(last.after.state, Confirmed);
    assert_eq!(last.event, ReservationEvent::Confirmed);
    assert_eq!(counts(&last.after), vec![(0, 4, 1), (0, 0, 3)]);
    assert!(last.write_lines);
}

#[test]
fn releasing_the_rest_of_a_partly_confirmed_hold_leaves_it_confirmed() {
    let hold = hold_of(&[("A", 5)]);
    let part = applied(Settle::Confirm.step(&hold, &units(&[("A", 2)]), true)).after;
    let rest = applied(Settle::Release.step(&part, &[], true));
    assert_eq!(pairs(&rest.moves), vec![(sku("A"), 3)]);
    assert_eq!(rest.after.state, ReservationState::Confirmed);
    assert_eq!(rest.event, ReservationEvent::Released);
    assert_eq!(counts(&rest.after), vec![(0, 2, 3)]);
    assert!(
        rest.write_lines,
        "the state alone would read the rest as confirmed"
    );
    // Only released units: the reservation ends RELEASED.
    let part = applied(Settle::Release.step(&hold, &units(&[("A", 2)]), true)).after;
    let rest = applied(Settle::Release.step(&part, &[], true));
    assert_eq!(rest.after.state, ReservationState::Released);
    assert_eq!(counts(&rest.after), vec![(0, 0, 5)]);
}

#[test]
fn lines_asking_for_more_than_is_held_are_all_named_and_nothing_moves() {
    let hold = hold_of(&[("A", 5), ("B", 3)]);
    let part = applied(Settle::Confirm.step(&hold, &units(&[("B", 2)]), true)).after;
    match Settle::Release.step(&part, &units(&[("A", 5), ("B", 2), ("C", 1)]), true) {
        Err(Error::NotHeld { id, lines }) => {
            assert_eq!(id, hold.id);
            assert_eq!(
                lines,
                vec![
                    NotHeld {
                        index: 1,
                        sku: sku("B"),
                        requested: 2,
                        held: Some(1),
                    },
                    NotHeld {
                        index: 2,
                        sku: sku("C"),
                        requested: 1,
                        held: None,
                    },
                ]
            );
        }
        other => panic!("expected NotHeld, got {other:?}"),
    }
}

#[test]
fn expiry_and_cancel_return_only_what_is_still_held() {
    use ReservationState::*;
    let hold = hold_of(&[("A", 5), ("B", 3)]);
    let untouched = end_hold(&hold, Expired);
    assert_eq!(untouched.after.state, Expired);
    assert_eq!(untouched.event, ReservationEvent::Expired);
    assert_eq!(pairs(&untouched.moves), vec![(sku("A"), 5), (sku("B"), 3)]);
    assert!(!untouched.write_lines);

    let part = applied(Settle::Confirm.step(&hold, &units(&[("A", 5), ("B", 1)]), true)).after;
    let expired = end_hold(&part, Expired);
    assert_eq!(pairs(&expired.moves), vec![(sku("B"), 2)]);
    assert_eq!(expired.after.state, Confirmed, "some units were confirmed");
    assert_eq!(expired.event, ReservationEvent::Expired);
    assert_eq!(counts(&expired.after), vec![(0, 5, 0), (0, 1, 2)]);
    assert!(expired.write_lines);

    let part = applied(Settle::Release.step(&hold, &units(&[("A", 1)]), true)).after;
    let cancelled = end_hold(&part, Released);
    assert_eq!(cancelled.after.state, Released);
    assert_eq!(cancelled.event, ReservationEvent::Released);
    assert_eq!(counts(&cancelled.after), vec![(0, 0, 5), (0, 0, 3)]);
}

#[test]
fn a_hold_that_expired_while_waited_for_is_released_but_not_confirmed() {
    let hold = hold_of(&[("A", 1)]);
    let released = Settle::Release
        .expired_meanwhile(hold.clone(), &[])
        .unwrap();
    assert_eq!(released.state, ReservationState::Expired);
    assert_eq!(counts(&released), vec![(0, 0, 1)]);
    for (settle, lines) in [
        (Settle::Confirm, vec![]),
        (Settle::Confirm, units(&[("A", 1)])),
        (Settle::Release, units(&[("A", 1)])),
    ] {
        assert!(matches!(
            settle.expired_meanwhile(hold.clone(), &lines),
            Err(Error::WrongState {
                state: ReservationState::Expired,
                ..
            })
        ));
    }
}

fn held(created_secs: u64, expires_secs: u64) -> Reservation {
    let (command, _) = reserve("k", 1);
    Reservation {
        created_at: SystemTime::UNIX_EPOCH + Duration::from_secs(created_secs),
        expires_at: SystemTime::UNIX_EPOCH + Duration::from_secs(expires_secs),
        ..new_hold(
            &command,
            command.lines().iter().map(at_default).collect(),
            SystemTime::UNIX_EPOCH,
            reserve("k", 1).1,
        )
    }
}

fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
}

fn ttl(secs: u64) -> Ttl {
    Ttl::parse(Duration::from_secs(secs)).unwrap()
}

#[test]
fn a_live_hold_is_extended_from_now_within_the_max_hold() {
    let hold = held(1_000, 1_900);
    let day = Duration::from_secs(24 * 3600);
    assert_eq!(extend(&hold, at(1_500), ttl(600), day).unwrap(), at(2_100));
    // Shorter than what is left is allowed: the caller says how long from now.
    assert_eq!(extend(&hold, at(1_500), ttl(60), day).unwrap(), at(1_560));
    // Up to exactly created_at + MAX_HOLD, not a microsecond more.
    let max = Duration::from_secs(3_600);
    assert_eq!(
        extend(&hold, at(1_500), ttl(3_100), max).unwrap(),
        at(4_600)
    );
    assert!(matches!(
        extend(&hold, at(1_500), ttl(3_101), max),
        Err(Error::MaxHoldExceeded { latest, .. }) if latest == at(4_600)
    ));
}

#[test]
fn only_a_live_hold_is_extended() {
    let day = Duration::from_secs(24 * 3600);
    let overdue = held(1_000, 1_900);
    assert!(matches!(
        extend(&overdue, at(1_900), ttl(60), day),
        Err(Error::WrongState {
            state: ReservationState::Expired,
            action: "extend",
            ..
        })
    ));
    for state in [
        ReservationState::Confirmed,
        ReservationState::Released,
        ReservationState::Expired,
    ] {
        let settled = Reservation {
            state,
            ..held(1_000, 1_900)
        };
        assert!(matches!(
            extend(&settled, at(1_500), ttl(60), day),
            Err(Error::WrongState { state: s, .. }) if s == state
        ));
    }
}

#[test]
fn a_new_hold_may_not_ask_for_more_than_the_max_hold() {
    let hour = Duration::from_secs(3_600);
    assert!(within_max_hold(ttl(3_600), hour).is_ok());
    assert!(matches!(
        within_max_hold(ttl(3_601), hour),
        Err(Error::InvalidArgument(v)) if v[0].field == "ttl"
    ));
}

#[test]
fn a_cancelled_order_is_a_stored_refusal_that_takes_no_stock() {
    let mut cancelled = reserve("c", 1);
    cancelled.0.order_id = OrderId::parse("gone").unwrap();
    let g = group(10, vec![cancelled, reserve("live", 2)]);
    let decisions = decided(
        decide_group(
            &g,
            Some(&locked(2, 0, 1)),
            &only_default(),
            |_| Ok(Earlier::Claimed),
            |c| c.order_id.as_str() == "gone",
        )
        .unwrap(),
    );
    assert!(matches!(
        &decisions[0].answer,
        Err(Error::OrderCancelled { order_id }) if order_id.as_str() == "gone"
    ));
    assert!(decisions[0].executed, "stored with its key");
    assert!(decisions[0].placements.is_empty());
    // Both units were left for the live order.
    assert_eq!(decisions[1].placements.last().unwrap().total.reserved, 2);
}

mod fill {
    use super::*;
    use crate::domain::ReceiptId;
    use crate::rules::{Fill, Waiting, fill_plan};

    fn at(on_hand: i64, reserved: i64, backordered: i64, preordered: i64) -> StockLevel {
        let mut level = level(on_hand, reserved, 1);
        level.location = Some(LocationId::default_location());
        level.states.backordered = backordered;
        level.states.preordered = preordered;
        level
    }

    fn wait(n: u128, backordered: i64, preordered: i64, receipt: Option<&str>) -> Waiting {
        Waiting {
            reservation: ReservationId::from_uuid(uuid::Uuid::from_u128(n)),
            sku: sku("A"),
            location: LocationId::default_location(),
            backordered,
            preordered,
            receipt: receipt.map(|r| ReceiptId::parse(r).unwrap()),
        }
    }

    fn fill(index: usize, backordered: i64, preordered: i64) -> Fill {
        Fill {
            index,
            backordered,
            preordered,
        }
    }

    #[test]
    fn free_units_go_to_the_oldest_hold_first_and_the_head_blocks_the_queue() {
        // 3 free units; holds waiting for 2, 4 and 1 units, in that order.
        let level = at(10, 7, 6, 1);
        let waiting = [
            wait(1, 2, 0, None),
            wait(2, 4, 0, None),
            wait(3, 0, 1, Some("PO")),
        ];
        assert_eq!(
            fill_plan(&[level], &waiting, None),
            [fill(0, 2, 0), fill(1, 1, 0)]
        );
    }

    #[test]
    fn a_receipt_fills_its_own_pre_orders_first_then_the_queue() {
        // 5 arrived for PO: its pre-order of 2 first, though a backorder is older; the 3
        // left free go to the queue, oldest first.
        let level = at(5, 0, 4, 2);
        let po = ReceiptId::parse("PO").unwrap();
        let waiting = [wait(1, 4, 0, None), wait(2, 0, 2, Some("PO"))];
        assert_eq!(
            fill_plan(&[level], &waiting, Some((&po, 5))),
            [fill(0, 3, 0), fill(1, 0, 2)]
        );
    }

    #[test]
    fn nothing_free_fills_nothing() {
        let level = at(4, 4, 2, 0);
        assert!(fill_plan(&[level], &[wait(1, 2, 0, None)], None).is_empty());
    }
}

#[test]
fn promises_dated_in_the_past_are_shown_from_now_merged() {
    use std::time::{Duration, UNIX_EPOCH};
    let day = |n: u64| UNIX_EPOCH + Duration::from_secs(n * 86_400);
    let step = |at, units| crate::command::Promise {
        at,
        units,
        one_line: units - 1,
    };
    let now = day(10);
    let steps = vec![
        step(day(3), 2),
        step(day(7), 5),
        step(day(10), 6),
        step(day(12), 9),
    ];
    assert_eq!(
        crate::rules::promised_from(steps, now),
        [step(day(10), 6), step(day(12), 9)]
    );
    assert_eq!(
        crate::rules::promised_from(vec![step(day(11), 1)], now),
        [step(day(11), 1)]
    );
    assert!(crate::rules::promised_from(Vec::new(), now).is_empty());
}

/// Two receipts of 5 promise 10 by the second's date, but one line gets at most 5 of them
/// (a pre-order waits for one receipt) plus what it may hold now; past the end of demand
/// made now, a receipt promises units but takes no line.
#[test]
fn one_line_gets_what_one_receipt_brings() {
    use crate::domain::{LocationId, ReceiptId};
    use std::time::{Duration, UNIX_EPOCH};
    let day = |n: u64| UNIX_EPOCH + Duration::from_secs(n * 86_400);
    let receipt = |id: &str, quantity: i64, due: u64| Receipt {
        id: ReceiptId::parse(id).unwrap(),
        sku: sku("A"),
        location: LocationId::default_location(),
        quantity,
        received: 0,
        preordered: 0,
        expected_at: day(due),
        state: ReceiptState::Open,
        created_at: day(1),
    };
    let (first, second) = (receipt("PO-1", 5, 10), receipt("PO-2", 5, 20));
    let level = StockLevel {
        location: Some(LocationId::default_location()),
        ..level(2, 0, 1)
    };
    let shown = |end: Option<u64>| -> Vec<(u64, i64, i64)> {
        crate::rules::promises(&level, &[&first, &second], end.map(day))
            .iter()
            .map(|p| {
                let days = p.at.duration_since(UNIX_EPOCH).unwrap().as_secs() / 86_400;
                (days, p.units, p.one_line)
            })
            .collect()
    };
    assert_eq!(shown(None), [(10, 7, 7), (20, 12, 7)]);
    assert_eq!(shown(Some(15)), [(10, 7, 7), (20, 12, 7)]);
    assert_eq!(shown(Some(5)), [(10, 7, 2), (20, 12, 2)]);
}
