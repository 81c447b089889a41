use std::time::{Duration, UNIX_EPOCH};

use inventory_core::domain::{Caller, IdempotencyKey, Reason, StockDelta};
use serde_json::json;

use super::*;

fn sku(raw: &str) -> Sku {
    Sku::parse(raw).unwrap()
}

fn round_trip(result: Result<Reservation, Error>) -> Result<Reservation, Error> {
    let json = serde_json::to_value(ReserveOutcome::of(&result)).unwrap();
    serde_json::from_value::<ReserveOutcome>(json)
        .unwrap()
        .into_result()
        .unwrap()
}

#[test]
fn a_hold_replays_exactly_to_the_microsecond() {
    let held = Reservation {
        id: ReservationId::new_random(),
        order_id: OrderId::parse("order-1").unwrap(),
        state: ReservationState::Held,
        lines: vec![
            ReservationLine::new_hold(
                &Line::new(sku("A"), Quantity::parse(3).unwrap()),
                vec![Allocation::new_hold(LocationId::default_location(), 3)],
            ),
            ReservationLine::new_hold(
                &Line::new(sku("B"), Quantity::parse(5).unwrap()),
                vec![
                    Allocation::new_hold(LocationId::parse("east").unwrap(), 2),
                    Allocation::new_hold(LocationId::parse("west").unwrap(), 3),
                ],
            ),
        ],
        created_at: UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456),
        expires_at: UNIX_EPOCH + Duration::from_micros(1_700_000_900_123_456),
    };
    assert_eq!(round_trip(Ok(held.clone())).unwrap(), held);
}

#[test]
fn a_hold_stored_before_locations_replays_at_default() {
    let old = json!({
        "outcome": "held",
        "reservation": {
            "reservation_id": "0b7e5a4c-3f1d-4a9e-9c2b-6d8f0e1a2b3c",
            "order_id": "o",
            "lines": [["A", 3]],
            "created_at_micros": 1,
            "expires_at_micros": 2,
        },
    });
    let replayed = serde_json::from_value::<ReserveOutcome>(old)
        .unwrap()
        .into_result()
        .unwrap()
        .unwrap();
    let line = &replayed.lines[0];
    assert_eq!((line.quantity.get(), line.held), (3, 3));
    assert_eq!(
        line.allocations,
        [Allocation::new_hold(LocationId::default_location(), 3)]
    );
}

#[test]
fn an_unknown_pinned_location_replays() {
    let location = LocationId::parse("mars").unwrap();
    assert!(matches!(
        round_trip(Err(Error::UnknownLocation(location.clone()))),
        Err(Error::UnknownLocation(l)) if l == location
    ));
}

#[test]
fn refusals_replay_with_their_details() {
    assert!(matches!(
        round_trip(Err(Error::UnknownSkus(vec![sku("A"), sku("B")]))),
        Err(Error::UnknownSkus(skus)) if skus == [sku("A"), sku("B")]
    ));
    let short = Shortfall {
        sku: sku("A"),
        requested: 5,
        available: 2,
    };
    assert!(matches!(
        round_trip(Err(Error::InsufficientStock(vec![short.clone()]))),
        Err(Error::InsufficientStock(s)) if s == [short]
    ));
}

#[test]
fn outcomes_stored_by_earlier_versions_still_read() {
    // Before stock versions existed an adjustment stored no version: it reads as 0.
    let old = serde_json::json!({"outcome": "adjusted", "on_hand": 7, "reserved": 2});
    let command = AdjustStock {
        caller: Caller::anonymous(),
        sku: sku("A"),
        delta: StockDelta::parse(1).unwrap(),
        idempotency_key: IdempotencyKey::parse("k").unwrap(),
        reason: Reason::parse("r").unwrap(),
        expected_version: None,
        location: LocationId::default_location(),
        state: None,
    };
    let level = serde_json::from_value::<AdjustOutcome>(old)
        .unwrap()
        .into_result(&command)
        .unwrap();
    assert_eq!((level.on_hand, level.reserved, level.version), (7, 2, 0));
}

#[test]
fn only_final_adjustment_outcomes_are_stored() {
    assert!(AdjustOutcome::from_result(&Err(Error::DeadlineExceeded)).is_none());
    let below = Err(Error::BelowReserved {
        sku: sku("A"),
        requested: 3,
        on_hand: 2,
        reserved: 1,
    });
    assert!(matches!(
        AdjustOutcome::from_result(&below),
        Some(AdjustOutcome::BelowReserved {
            on_hand: 2,
            reserved: 1
        })
    ));
}
