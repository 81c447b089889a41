use std::time::{Duration, UNIX_EPOCH};

use inventory_core::domain::{Line, LocationId, OrderId, Quantity, ReservationId};
use serde_json::json;

use super::*;

fn sku(raw: &str) -> Sku {
    Sku::parse(raw).unwrap()
}

fn hold() -> Reservation {
    Reservation {
        id: ReservationId::new_random(),
        order_id: OrderId::parse("order-1").unwrap(),
        state: ReservationState::Held,
        lines: vec![ReservationLine::new_hold(
            &Line::new(sku("B"), Quantity::parse(5).unwrap()),
            vec![
                Allocation::new_hold(LocationId::parse("east").unwrap(), 2),
                Allocation::new_hold(LocationId::parse("west").unwrap(), 3),
            ],
        )],
        created_at: UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456),
        expires_at: UNIX_EPOCH + Duration::from_micros(1_700_000_900_123_456),
    }
}

fn levels() -> Vec<StockLevel> {
    let mut east = StockLevel::total(sku("B"), 10, 2, 7);
    east.location = Some(LocationId::parse("east").unwrap());
    vec![StockLevel::total(sku("B"), 30, 5, 7), east]
}

#[test]
fn a_hold_event_carries_its_lines_allocations_levels_and_expiry() {
    let (reservation, levels) = (hold(), levels());
    let payload = serde_json::to_value(reservation_payload(&reservation, &levels).0).unwrap();
    assert_eq!(
        payload,
        json!({
            "order_id": "order-1",
            "state": "HELD",
            "lines": [{
                "sku": "B", "quantity": 5, "held": 5, "confirmed": 0, "released": 0,
                "allocations": [
                    {"location_id": "east", "quantity": 2, "held": 2, "confirmed": 0, "released": 0},
                    {"location_id": "west", "quantity": 3, "held": 3, "confirmed": 0, "released": 0},
                ],
            }],
            "levels": [
                {"sku": "B", "on_hand": 30, "reserved": 5, "version": 7},
                {"sku": "B", "on_hand": 10, "reserved": 2, "version": 7, "location_id": "east"},
            ],
            "expires_at_micros": 1_700_000_900_123_456_i64,
        })
    );
}

#[test]
fn a_settled_reservation_has_no_expiry_in_its_event() {
    let mut reservation = hold();
    reservation.state = ReservationState::Released;
    let payload = serde_json::to_value(reservation_payload(&reservation, &[]).0).unwrap();
    assert_eq!(payload["state"], "RELEASED");
    assert_eq!(payload["levels"], json!([]));
    assert!(payload.get("expires_at_micros").is_none(), "{payload}");
}
