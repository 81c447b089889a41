use std::time::SystemTime;

use super::*;
use crate::domain::{Quantity, Sku};

fn id(raw: &str) -> LocationId {
    LocationId::parse(raw).unwrap()
}

fn location(raw: &str, priority: i32, active: bool) -> Location {
    Location {
        id: id(raw),
        priority,
        active,
    }
}

/// `north` (priority 2), `south` (priority 1), `west` (priority 1), `shut` (inactive).
fn configured() -> Vec<Location> {
    vec![
        location("north", 2, true),
        location("south", 1, true),
        location("west", 1, true),
        location("shut", 0, false),
    ]
}

/// SKU `A` with `(location, on_hand, reserved)` rows, at version 10.
fn stock(rows: &[(&str, i64, i64)]) -> SkuStock {
    let sku = Sku::parse("A").unwrap();
    let at: Vec<StockLevel> = rows
        .iter()
        .map(|(l, on_hand, reserved)| StockLevel {
            sku: sku.clone(),
            on_hand: *on_hand,
            reserved: *reserved,
            version: 3,
            location: Some(id(l)),
            states: Default::default(),
        })
        .collect();
    SkuStock {
        total: StockLevel::total(
            sku,
            at.iter().map(|l| l.on_hand).sum(),
            at.iter().map(|l| l.reserved).sum(),
            10,
        ),
        fence: FenceToken::new(1),
        now: SystemTime::UNIX_EPOCH,
        at,
    }
}

fn line(quantity: i64, pin: Option<&str>) -> Line {
    Line {
        sku: Sku::parse("A").unwrap(),
        quantity: Quantity::parse(quantity).unwrap(),
        location: pin.map(id),
    }
}

fn policy(strategy: AllocationStrategy, allow_split: bool) -> AllocationPolicy {
    AllocationPolicy {
        strategy,
        allow_split,
    }
}

/// `(location, units)` of each placement.
fn placed(placements: &[Placement]) -> Vec<(&str, i64)> {
    placements
        .iter()
        .map(|p| (p.location.as_str(), p.units))
        .collect()
}

fn short(result: Result<Vec<Placement>, Unplaced>) -> (i64, i64) {
    match result {
        Err(Unplaced::Short(s)) => (s.requested, s.available),
        other => panic!("expected a shortfall, got {other:?}"),
    }
}

use AllocationStrategy::{MostAvailable, Priority};

#[test]
fn priority_takes_the_lowest_priority_then_the_lowest_id_that_has_every_unit() {
    let rows = [("north", 10, 0), ("south", 3, 0), ("west", 5, 0)];
    // south and west share priority 1; south (by id) has only 3, so west serves 4.
    let mut s = stock(&rows);
    let p = s.place(&line(4, None), policy(Priority, false), &configured());
    assert_eq!(placed(&p.unwrap()), [("west", 4)]);
    // 3 fit south, the first in order.
    let mut s = stock(&rows);
    let p = s.place(&line(3, None), policy(Priority, false), &configured());
    assert_eq!(placed(&p.unwrap()), [("south", 3)]);
    // Only north has 8.
    let mut s = stock(&rows);
    let p = s.place(&line(8, None), policy(Priority, false), &configured());
    assert_eq!(placed(&p.unwrap()), [("north", 8)]);
}

#[test]
fn most_available_takes_the_fullest_location() {
    let rows = [("north", 10, 4), ("south", 3, 0), ("west", 7, 0)];
    let mut s = stock(&rows);
    let p = s.place(&line(2, None), policy(MostAvailable, false), &configured());
    assert_eq!(
        placed(&p.unwrap()),
        [("west", 2)],
        "7 available beats 6 and 3"
    );
    // Ties go by priority: north 6 vs west 6 after... west has priority 1.
    let rows = [("north", 6, 0), ("west", 6, 0)];
    let mut s = stock(&rows);
    let p = s.place(&line(2, None), policy(MostAvailable, false), &configured());
    assert_eq!(placed(&p.unwrap()), [("west", 2)]);
}

#[test]
fn without_split_a_line_no_single_location_can_serve_is_short_by_the_total() {
    let rows = [("north", 4, 0), ("south", 3, 0)];
    let mut s = stock(&rows);
    let before = s.clone();
    let result = s.place(&line(6, None), policy(Priority, false), &configured());
    assert_eq!(
        short(result),
        (6, 7),
        "7 over every active location, none with 6"
    );
    assert_eq!(s, before, "nothing placed");
}

#[test]
fn with_split_a_line_is_filled_in_strategy_order_one_movement_per_location() {
    let rows = [("north", 4, 0), ("south", 3, 1), ("west", 5, 0)];
    let mut s = stock(&rows);
    let p = s
        .place(&line(9, None), policy(Priority, true), &configured())
        .unwrap();
    // Priority order: south (2 available), west (5), then north (2 of 4).
    // Placements are listed by location id; each is one version of the SKU.
    assert_eq!(placed(&p), [("north", 2), ("south", 2), ("west", 5)]);
    let versions: Vec<i64> = p.iter().map(|p| p.total.version).collect();
    assert_eq!(versions, [11, 12, 13]);
    assert!(p.iter().all(|p| p.level.version == p.total.version));
    assert_eq!(p[2].total.reserved, 1 + 9);
    assert_eq!((s.total.reserved, s.total.version), (10, 13));
    assert_eq!(s.at[1].reserved, 3, "south is full");
    // Most available first: west (5) alone covers 5.
    let mut s = stock(&rows);
    let p = s
        .place(&line(5, None), policy(MostAvailable, true), &configured())
        .unwrap();
    assert_eq!(placed(&p), [("west", 5)]);
    // More than everything together is short, with the total available.
    let mut s = stock(&rows);
    let result = s.place(&line(12, None), policy(Priority, true), &configured());
    assert_eq!(short(result), (12, 11));
}

#[test]
fn inactive_and_unknown_locations_are_never_allocated_from() {
    let rows = [("shut", 100, 0), ("south", 2, 0), ("gone", 50, 0)];
    let mut s = stock(&rows);
    // `shut` is inactive and `gone` is not configured: only south's 2 count.
    let result = s.place(&line(5, None), policy(MostAvailable, true), &configured());
    assert_eq!(short(result), (5, 2));
    let result = s.place(
        &line(1, Some("shut")),
        policy(Priority, false),
        &configured(),
    );
    assert_eq!(short(result), (1, 0), "pinned to an inactive location");
    let result = s.place(
        &line(1, Some("mars")),
        policy(Priority, false),
        &configured(),
    );
    assert_eq!(result, Err(Unplaced::UnknownLocation(id("mars"))));
}

#[test]
fn a_pinned_line_is_served_by_its_location_alone() {
    let rows = [("north", 10, 0), ("south", 3, 0)];
    let mut s = stock(&rows);
    let p = s
        .place(
            &line(3, Some("north")),
            policy(Priority, true),
            &configured(),
        )
        .unwrap();
    assert_eq!(
        placed(&p),
        [("north", 3)],
        "priority would have picked south"
    );
    let result = s.place(
        &line(4, Some("south")),
        policy(Priority, true),
        &configured(),
    );
    assert_eq!(short(result), (4, 3), "no split away from the pin");
    // A configured location where the SKU has no row has nothing.
    let result = s.place(
        &line(1, Some("west")),
        policy(Priority, false),
        &configured(),
    );
    assert_eq!(short(result), (1, 0));
}
