use std::time::SystemTime;

use super::*;
use crate::{
    domain::{Allocation, ReservationId, ReservationLine, ReservationState, StockLevel},
    events::{Epoch, EpochId},
};

fn sku(raw: &str) -> Sku {
    Sku::parse(raw).unwrap()
}

fn location(raw: &str) -> LocationId {
    LocationId::parse(raw).unwrap()
}

fn event(change: Change) -> Event {
    Event {
        position: 1,
        id: uuid::Uuid::nil(),
        occurred_at: SystemTime::UNIX_EPOCH,
        change,
        epoch: Epoch {
            id: EpochId(1),
            starts_after: 0,
        },
    }
}

fn adjusted(raw: &str, at: Option<&str>) -> Event {
    let level = StockLevel::total(sku(raw), 5, 0, 1);
    event(Change::StockAdjusted {
        sku: sku(raw),
        delta: 5,
        reason: String::new(),
        location_level: at.map(|at| StockLevel {
            location: Some(location(at)),
            ..level.clone()
        }),
        level,
    })
}

fn held(order: &str, lines: &[(&str, &str)]) -> Event {
    event(Change::Reservation {
        reservation_id: ReservationId::new_random(),
        order_id: OrderId::parse(order).unwrap(),
        what: ReservationEvent::Held,
        state: ReservationState::Held,
        lines: lines
            .iter()
            .map(|(raw, at)| {
                ReservationLine::from_allocations(
                    sku(raw),
                    vec![Allocation::new_hold(location(at), 2)],
                )
                .unwrap()
            })
            .collect(),
        levels: Vec::new(),
        expires_at: None,
    })
}

#[test]
fn an_empty_filter_passes_everything() {
    let filter = EventFilter::default();
    assert!(filter.is_empty());
    assert!(filter.matches(&adjusted("A", None)));
    assert!(filter.matches(&held("o-1", &[("A", "default")])));
}

#[test]
fn each_dimension_is_any_of_its_values_and_every_dimension_must_hold() {
    let filter = EventFilter {
        kinds: vec![EventKind::Reservation(ReservationEvent::Held)],
        skus: vec![sku("A")],
        sku_prefixes: vec!["MUG-".into()],
        ..EventFilter::default()
    };
    assert!(filter.matches(&held("o-1", &[("B", "default"), ("A", "default")])));
    assert!(filter.matches(&held("o-1", &[("MUG-7", "default")])));
    assert!(!filter.matches(&held("o-1", &[("B", "default")])));
    // The SKU is right, the type is not.
    assert!(!filter.matches(&adjusted("A", None)));
}

#[test]
fn orders_match_reservation_events_only() {
    let filter = EventFilter {
        order_ids: vec![OrderId::parse("o-1").unwrap()],
        ..EventFilter::default()
    };
    assert!(filter.matches(&held("o-1", &[("A", "default")])));
    assert!(!filter.matches(&held("o-2", &[("A", "default")])));
    assert!(!filter.matches(&adjusted("A", None)));
}

#[test]
fn locations_match_where_units_are_and_old_stock_events_are_at_the_default() {
    let filter = EventFilter {
        locations: vec![location("north")],
        ..EventFilter::default()
    };
    assert!(filter.matches(&adjusted("A", Some("north"))));
    assert!(!filter.matches(&adjusted("A", Some("south"))));
    assert!(!filter.matches(&adjusted("A", None)));
    assert!(filter.matches(&held("o-1", &[("A", "south"), ("B", "north")])));
    let default = EventFilter {
        locations: vec![location("default")],
        ..EventFilter::default()
    };
    assert!(default.matches(&adjusted("A", None)));
}

#[test]
fn every_kind_has_a_name_that_parses_back() {
    for kind in EventKind::ALL {
        assert_eq!(EventKind::parse(kind.as_str()), Some(kind));
    }
    assert_eq!(EventKind::parse("HEARTBEAT"), None);
}
