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
            apart: 0,
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
        receipts: Vec::new(),
        waits_until: None,
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
        ..AllocationPolicy::default()
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

mod waiting {
    use super::*;
    use crate::domain::{Receipt, ReceiptId, ReceiptState, States};

    fn waiting_policy(backorder: bool, preorder: bool) -> AllocationPolicy {
        AllocationPolicy {
            allow_backorder: backorder,
            allow_preorder: preorder,
            ..AllocationPolicy::default()
        }
    }

    fn receipt(raw: &str, at: &str, quantity: i64, preordered: i64, day: u64) -> Receipt {
        Receipt {
            id: ReceiptId::parse(raw).unwrap(),
            sku: Sku::parse("A").unwrap(),
            location: id(at),
            quantity,
            received: 0,
            preordered,
            expected_at: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(day * 86_400),
            state: ReceiptState::Open,
            created_at: SystemTime::UNIX_EPOCH,
        }
    }

    fn with_limit(mut stock: SkuStock, limit: i64) -> SkuStock {
        for row in &mut stock.at {
            row.states.backorder_limit = limit;
        }
        stock
    }

    #[test]
    fn a_backorder_holds_what_is_there_and_waits_for_the_rest_within_the_limit() {
        let mut stock = with_limit(stock(&[("east", 3, 1)]), 4);
        let placed = stock
            .place_waiting(
                &line(6, None),
                waiting_policy(true, false),
                &[location("east", 1, true)],
            )
            .expect("2 held, 4 backordered");
        assert_eq!((placed.units, placed.waiting.backordered), (2, 4));
        assert_eq!(stock.at[0].reserved, 3);
        assert_eq!(stock.at[0].states.backordered, 4);
        // The limit is spent: one more unit does not fit.
        assert!(
            stock
                .place_waiting(
                    &line(1, None),
                    waiting_policy(true, false),
                    &[location("east", 1, true)]
                )
                .is_none()
        );
        assert_eq!(stock.at[0].states.backordered, 4, "nothing changed");
    }

    #[test]
    fn a_safety_stock_above_what_is_free_shrinks_the_room_for_backorders() {
        let mut stock = with_limit(stock(&[("east", 5, 4)]), 3);
        stock.at[0].states.safety_stock = 3;
        // Free is 5 - 4 - 3 = -2: two of the three backorders are spoken for already.
        assert_eq!(stock.at[0].backorder_room(0), 1);
        assert!(
            stock
                .place_waiting(
                    &line(2, None),
                    waiting_policy(true, false),
                    &[location("east", 1, true)]
                )
                .is_none()
        );
        let placed = stock
            .place_waiting(
                &line(1, None),
                waiting_policy(true, false),
                &[location("east", 1, true)],
            )
            .unwrap();
        assert_eq!((placed.units, placed.waiting.backordered), (0, 1));
    }

    #[test]
    fn a_pre_order_takes_the_earliest_receipt_with_enough_unpromised_units() {
        let mut stock = stock(&[("east", 0, 0)]);
        stock.receipts = vec![
            receipt("LATE", "east", 10, 0, 20),
            receipt("SOON", "east", 5, 3, 14),
            receipt("SOONER", "east", 2, 0, 10),
        ];
        let placed = stock
            .place_waiting(
                &line(2, None),
                waiting_policy(false, true),
                &[location("east", 1, true)],
            )
            .unwrap();
        assert_eq!(placed.receipt.as_ref().unwrap().receipt.as_str(), "SOONER");
        // 3 units: SOONER has none left, SOON only 2 unpromised; LATE has them.
        let placed = stock
            .place_waiting(
                &line(3, None),
                waiting_policy(false, true),
                &[location("east", 1, true)],
            )
            .unwrap();
        assert_eq!(placed.receipt.as_ref().unwrap().receipt.as_str(), "LATE");
        assert_eq!(
            placed.waiting,
            States {
                preordered: 3,
                ..States::default()
            }
        );
        assert_eq!(stock.receipts[0].preordered, 3);
        assert_eq!(stock.at[0].states.preordered, 5);
        // Nothing left anywhere for 9 more, and no backorders allowed.
        assert!(
            stock
                .place_waiting(
                    &line(9, None),
                    waiting_policy(false, true),
                    &[location("east", 1, true)]
                )
                .is_none()
        );
    }
}
