//! Stock at several locations: allocation by priority and by what is available, pinned and
//! split lines, inactive locations, transfers, and the guarantees (no oversell, fencing,
//! ledger, events) per (SKU, location).

use futures::future::join_all;
use inventory_core::pause::PausePoint;
use inventory_server::proto::{
    AdjustStockRequest, AllocationStrategy, ConfirmReservationRequest, EventType, GetStockRequest,
    ListLocationsRequest, ListStockMovementsRequest, MovementKind, ReleaseReservationRequest,
    Reservation, ReservationState, SetStockRequest, StockLevel, TransferStockRequest,
    UpsertLocationRequest, event,
};
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::{
    events::{take, watch},
    helpers::{
        TestApp, confirm, error_reason, get_reservation, get_stock, line_at, location,
        reserve_with, spawn_app, spawn_app_without_sweeper, stock_at, violated_fields,
    },
};

/// Three locations, `east` (priority 1), `west` (priority 2), `north` (priority 3), and
/// `default` (priority 0) without stock.
async fn three_locations(app: &TestApp) {
    location(app, "east", 1, true).await;
    location(app, "west", 2, true).await;
    location(app, "north", 3, true).await;
}

/// `(location, quantity)` of each allocation of a reservation's first line.
fn allocations(reservation: &Reservation) -> Vec<(String, i64)> {
    reservation.lines[0]
        .allocations
        .iter()
        .map(|a| (a.location_id.clone(), a.quantity))
        .collect()
}

/// `(location, on_hand, reserved)` of `sku` at every location it has a row at, by id.
async fn at_locations(app: &TestApp, sku: &str) -> Vec<(String, i64, i64)> {
    app.db
        .query(
            "SELECT location_id, on_hand, reserved FROM stock_locations WHERE sku = $1
             ORDER BY location_id COLLATE \"C\"",
            &[&sku],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect()
}

fn triple(location: &str, on_hand: i64, reserved: i64) -> (String, i64, i64) {
    (location.to_owned(), on_hand, reserved)
}

#[tokio::test]
async fn locations_are_created_changed_and_listed_in_allocation_order() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    let all = || {
        let mut client = app.client.clone();
        async move {
            client
                .list_locations(ListLocationsRequest {})
                .await
                .unwrap()
                .into_inner()
                .locations
                .into_iter()
                .map(|l| (l.location_id, l.priority, l.active))
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(all().await, [("default".to_owned(), 0, true)]);
    three_locations(&app).await;
    location(&app, "default", 5, false).await;
    assert_eq!(
        all().await,
        [
            ("east".to_owned(), 1, true),
            ("west".to_owned(), 2, true),
            ("north".to_owned(), 3, true),
            ("default".to_owned(), 5, false),
        ]
    );
    for bad in ["", "East", "a b", &"x".repeat(33)] {
        let refused = client
            .upsert_location(UpsertLocationRequest {
                location_id: bad.into(),
                priority: 0,
                active: true,
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{bad:?}");
        assert_eq!(violated_fields(&refused), ["location_id"]);
    }
}

#[tokio::test]
async fn stock_is_kept_per_location_and_the_totals_are_their_sums() {
    let app = spawn_app().await;
    three_locations(&app).await;
    stock_at(&app, "MUG", "east", 4).await;
    stock_at(&app, "MUG", "west", 6).await;
    stock_at(&app, "MUG", "", 1).await;
    let levels = app
        .client
        .clone()
        .get_stock(GetStockRequest {
            skus: vec!["MUG".into()],
            by_location: true,
        })
        .await
        .unwrap()
        .into_inner();
    let total = &levels.levels[0];
    assert_eq!((total.on_hand, total.available, total.version), (11, 11, 3));
    assert_eq!(total.location_id, "");
    let per: Vec<(&str, i64, i64)> = levels
        .location_levels
        .iter()
        .map(|l| (l.location_id.as_str(), l.on_hand, l.version))
        .collect();
    assert_eq!(per, [("default", 1, 3), ("east", 4, 1), ("west", 6, 2)]);
    // Without `by_location`, only the totals, as before locations.
    let plain = app
        .client
        .clone()
        .get_stock(get_stock(&["MUG"]))
        .await
        .unwrap()
        .into_inner();
    assert!(plain.location_levels.is_empty());
    assert_eq!(plain.levels[0].on_hand, 11);

    // An unknown location is refused and changes nothing, and its key is not used up.
    let mut unknown = AdjustStockRequest {
        sku: "MUG".into(),
        delta: 1,
        idempotency_key: "to-mars".into(),
        location_id: "mars".into(),
        ..Default::default()
    };
    let refused = app
        .client
        .clone()
        .adjust_stock(unknown.clone())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::NotFound);
    assert_eq!(error_reason(&refused), "LOCATION_NOT_FOUND");
    assert_eq!(app.level("MUG").await, (11, 0));
    location(&app, "mars", 9, true).await;
    let level = app
        .client
        .clone()
        .adjust_stock(unknown.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!((level.on_hand, level.location_id.as_str()), (12, ""));
    unknown.location_id = "Mars".into();
    let invalid = app.client.clone().adjust_stock(unknown).await.unwrap_err();
    assert_eq!(violated_fields(&invalid), ["location_id"]);

    // A count is a location's count: the total moves by the difference.
    let counted = app
        .client
        .clone()
        .set_stock(SetStockRequest {
            sku: "MUG".into(),
            on_hand: 10,
            idempotency_key: "count-west".into(),
            location_id: "west".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(counted.on_hand, 16);
    assert_eq!(
        at_locations(&app, "MUG").await,
        [
            triple("default", 1, 0),
            triple("east", 4, 0),
            triple("mars", 1, 0),
            triple("west", 10, 0),
        ]
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn priority_serves_each_line_whole_from_the_first_location_that_can() {
    let app = spawn_app().await;
    three_locations(&app).await;
    stock_at(&app, "MUG", "east", 2).await;
    stock_at(&app, "MUG", "west", 5).await;
    stock_at(&app, "MUG", "north", 9).await;
    let mut client = app.client.clone();
    // 2 fit east, the first by priority; 4 do not, so west serves them; 7 only north has.
    let expect = [(2, "east"), (4, "west"), (7, "north")];
    for (i, (units, at)) in expect.into_iter().enumerate() {
        let held = client
            .reserve(reserve_with(
                &format!("p{i}"),
                vec![line_at("MUG", units, "")],
                AllocationStrategy::Unspecified,
                false,
            ))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(allocations(&held), [(at.to_owned(), units)]);
        assert_eq!(
            held.lines[0].location_id, at,
            "one location: named on the line"
        );
    }
    // 3 units are left (west 1, north 2): no single location has 3, so the order is refused
    // with what is available over every location.
    let refused = client
        .reserve(reserve_with(
            "p3",
            vec![line_at("MUG", 3, "")],
            AllocationStrategy::Priority,
            false,
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&refused), "INSUFFICIENT_STOCK");
    let failure = refused.get_details_precondition_failure().unwrap();
    assert_eq!(
        failure.violations[0].description,
        "requested 3, available 3; no one location has them all (allow_split combines locations)"
    );
    assert_eq!(
        at_locations(&app, "MUG").await,
        [
            triple("east", 2, 2),
            triple("north", 9, 7),
            triple("west", 5, 4),
        ]
    );
}

#[tokio::test]
async fn split_fills_a_line_from_the_locations_in_strategy_order() {
    let app = spawn_app().await;
    three_locations(&app).await;
    stock_at(&app, "MUG", "east", 2).await;
    stock_at(&app, "MUG", "west", 5).await;
    stock_at(&app, "MUG", "north", 9).await;
    let mut client = app.client.clone();
    let held = client
        .reserve(reserve_with(
            "split",
            vec![line_at("MUG", 10, "")],
            AllocationStrategy::Priority,
            true,
        ))
        .await
        .unwrap()
        .into_inner();
    // east 2, west 5, then 3 from north; listed by location id.
    assert_eq!(
        allocations(&held),
        [
            ("east".to_owned(), 2),
            ("north".to_owned(), 3),
            ("west".to_owned(), 5)
        ]
    );
    assert_eq!(held.lines[0].location_id, "", "split: no single location");
    assert_eq!(held.lines[0].held, 10);
    // Most available first: north has 6 left, the most.
    let most = client
        .reserve(reserve_with(
            "most",
            vec![line_at("MUG", 4, "")],
            AllocationStrategy::MostAvailable,
            true,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allocations(&most), [("north".to_owned(), 4)]);
    // A read answers the same allocations.
    let read = client
        .get_reservation(get_reservation(&held.reservation_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.lines, held.lines);
    // More than everything together: refused, nothing held.
    let refused = client
        .reserve(reserve_with(
            "too-many",
            vec![line_at("MUG", 3, "")],
            AllocationStrategy::Priority,
            true,
        ))
        .await
        .unwrap_err();
    let failure = refused.get_details_precondition_failure().unwrap();
    assert_eq!(
        failure.violations[0].description,
        "requested 3, available 2"
    );

    // The ledger has one movement per location, one version each.
    let movements = client
        .list_stock_movements(ListStockMovementsRequest {
            sku: "MUG".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .movements;
    let held_moves: Vec<(i64, &str, i64, i64)> = movements
        .iter()
        .filter(|m| m.kind() == MovementKind::Held)
        .map(|m| {
            let level = m.level.as_ref().unwrap();
            (
                m.version,
                m.location_id.as_str(),
                m.reserved_delta,
                level.reserved,
            )
        })
        .collect();
    assert_eq!(
        held_moves,
        [
            (4, "east", 2, 2),
            (5, "north", 3, 3),
            (6, "west", 5, 5),
            (7, "north", 4, 7),
        ]
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn a_pinned_line_is_served_only_where_it_points() {
    let app = spawn_app().await;
    three_locations(&app).await;
    stock_at(&app, "MUG", "east", 5).await;
    stock_at(&app, "MUG", "north", 5).await;
    let mut client = app.client.clone();
    let held = client
        .reserve(reserve_with(
            "pin",
            vec![line_at("MUG", 3, "north")],
            AllocationStrategy::Priority,
            true,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allocations(&held), [("north".to_owned(), 3)]);
    // 3 more at north: only 2 are there, and a pin never splits elsewhere.
    let refused = client
        .reserve(reserve_with(
            "pin-2",
            vec![line_at("MUG", 3, "north")],
            AllocationStrategy::Priority,
            true,
        ))
        .await
        .unwrap_err();
    let failure = refused.get_details_precondition_failure().unwrap();
    assert_eq!(
        failure.violations[0].description,
        "requested 3, available 2"
    );
    // A pin to a location that does not exist: NOT_FOUND, stored with the key.
    for _ in 0..2 {
        let unknown = client
            .reserve(reserve_with(
                "pin-3",
                vec![line_at("MUG", 1, "mars")],
                AllocationStrategy::Priority,
                false,
            ))
            .await
            .unwrap_err();
        assert_eq!(unknown.code(), Code::NotFound);
        assert_eq!(error_reason(&unknown), "LOCATION_NOT_FOUND");
    }
    // The same key with another pin is another request.
    let reused = client
        .reserve(reserve_with(
            "pin-3",
            vec![line_at("MUG", 1, "east")],
            AllocationStrategy::Priority,
            false,
        ))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::AlreadyExists);
}

#[tokio::test]
async fn an_inactive_location_keeps_its_stock_and_holds_but_is_never_allocated_from() {
    let app = spawn_app().await;
    three_locations(&app).await;
    stock_at(&app, "MUG", "east", 5).await;
    stock_at(&app, "MUG", "west", 5).await;
    let mut client = app.client.clone();
    let held = app.hold("before", &[("MUG", 2)]).await;
    assert_eq!(allocations(&held), [("east".to_owned(), 2)]);
    location(&app, "east", 1, false).await;
    // east is first by priority and has 3 left, but is inactive now.
    let next = app.hold("after", &[("MUG", 2)]).await;
    assert_eq!(allocations(&next), [("west".to_owned(), 2)]);
    let refused = client
        .reserve(reserve_with(
            "pinned-shut",
            vec![line_at("MUG", 1, "east")],
            AllocationStrategy::Priority,
            false,
        ))
        .await
        .unwrap_err();
    let failure = refused.get_details_precondition_failure().unwrap();
    assert_eq!(
        failure.violations[0].description,
        "requested 1, available 0"
    );
    // 4 available overall (3 of them at inactive east): 4 cannot be served.
    let refused = client
        .reserve(reserve_with(
            "too-many",
            vec![line_at("MUG", 4, "")],
            AllocationStrategy::MostAvailable,
            true,
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    // Its hold is still confirmed from there.
    client
        .confirm_reservation(confirm(&held.reservation_id))
        .await
        .unwrap();
    assert_eq!(
        at_locations(&app, "MUG").await,
        [triple("east", 3, 0), triple("west", 5, 2)]
    );
}

#[tokio::test]
async fn partial_confirm_and_release_may_name_a_location() {
    // Swept by hand below: a background sweep could expire the hold first.
    let app = spawn_app_without_sweeper().await;
    three_locations(&app).await;
    stock_at(&app, "MUG", "east", 2).await;
    stock_at(&app, "MUG", "west", 5).await;
    let mut client = app.client.clone();
    let held = client
        .reserve(reserve_with(
            "split",
            vec![line_at("MUG", 6, "")],
            AllocationStrategy::Priority,
            true,
        ))
        .await
        .unwrap()
        .into_inner();
    let id = held.reservation_id.clone();
    // 3 confirmed from west (the shipment left from there).
    let confirmed = client
        .confirm_reservation(ConfirmReservationRequest {
            reservation_id: id.clone(),
            lines: vec![line_at("MUG", 3, "west")],
            idempotency_key: "ship-west".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let counts: Vec<(String, i64, i64, i64)> = confirmed.lines[0]
        .allocations
        .iter()
        .map(|a| (a.location_id.clone(), a.held, a.confirmed, a.released))
        .collect();
    assert_eq!(
        counts,
        [("east".to_owned(), 2, 0, 0), ("west".to_owned(), 1, 3, 0)]
    );
    // More than west still holds is refused, whatever east holds.
    let refused = client
        .release_reservation(ReleaseReservationRequest {
            reservation_id: id.clone(),
            lines: vec![line_at("MUG", 2, "west")],
            idempotency_key: "too-much".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(error_reason(&refused), "NOT_HELD");
    // Without a location, units come from the allocations by location id: east first.
    let released = client
        .release_reservation(ReleaseReservationRequest {
            reservation_id: id.clone(),
            lines: vec![line_at("MUG", 2, "")],
            idempotency_key: "release-two".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(released.state(), ReservationState::Held);
    assert_eq!(
        at_locations(&app, "MUG").await,
        [triple("east", 2, 0), triple("west", 2, 1)]
    );
    // Expiry returns the rest to where it was held.
    app.db
        .execute(
            "UPDATE reservations SET created_at = now() - interval '2 seconds',
                                     expires_at = now() - interval '1 second'
             WHERE reservation_id = $1::text::uuid",
            &[&id],
        )
        .await
        .unwrap();
    assert_eq!(app.inventory.expire_due(100).await.unwrap(), 1);
    assert_eq!(
        at_locations(&app, "MUG").await,
        [triple("east", 2, 0), triple("west", 2, 0)]
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn a_transfer_moves_available_units_only_with_a_movement_per_side_and_one_event() {
    let app = spawn_app().await;
    three_locations(&app).await;
    stock_at(&app, "MUG", "east", 5).await;
    let held = app.hold("h", &[("MUG", 3)]).await;
    assert_eq!(allocations(&held), [("east".to_owned(), 3)]);
    let mut stream = watch(&app, 2).await;
    let transfer = |key: &str, quantity: i64, to: &str| TransferStockRequest {
        sku: "MUG".into(),
        from_location_id: "east".into(),
        to_location_id: to.into(),
        quantity,
        idempotency_key: key.into(),
        reason: "rebalance".into(),
    };
    let mut client = app.client.clone();
    // 3 of east's 5 are held: only 2 may move.
    let refused = client
        .transfer_stock(transfer("t0", 3, "west"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&refused), "INSUFFICIENT_STOCK");
    let moved = client
        .transfer_stock(transfer("t1", 2, "west"))
        .await
        .unwrap()
        .into_inner();
    let total = moved.level.clone().unwrap();
    assert_eq!((total.on_hand, total.reserved, total.version), (5, 3, 4));
    let sides: Vec<(String, i64, i64)> = moved
        .location_levels
        .iter()
        .map(|l| (l.location_id.clone(), l.on_hand, l.reserved))
        .collect();
    assert_eq!(sides, [triple("east", 3, 3), triple("west", 2, 0)]);
    // A retry answers the same and moves nothing more.
    let again = client
        .transfer_stock(transfer("t1", 2, "west"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, moved);
    assert_eq!(
        at_locations(&app, "MUG").await,
        [triple("east", 3, 3), triple("west", 2, 0)]
    );
    // Events: the refused transfer wrote none; the transfer wrote one.
    let events = take(&mut stream, 1).await;
    assert_eq!(events[0].r#type(), EventType::StockTransferred);
    match &events[0].payload {
        Some(event::Payload::StockTransferred(t)) => {
            assert_eq!(
                (
                    t.from_location_id.as_str(),
                    t.to_location_id.as_str(),
                    t.quantity
                ),
                ("east", "west", 2)
            );
            assert_eq!(t.location_levels.len(), 2);
            assert_eq!(t.level.as_ref().unwrap().version, 4);
        }
        other => panic!("{other:?}"),
    }
    let movements = client
        .list_stock_movements(ListStockMovementsRequest {
            sku: "MUG".into(),
            after_version: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .movements;
    let transferred: Vec<(String, i64, String)> = movements
        .iter()
        .map(|m| (m.location_id.clone(), m.on_hand_delta, m.reason.clone()))
        .collect();
    assert_eq!(
        transferred,
        [
            ("east".to_owned(), -2, "rebalance".to_owned()),
            ("west".to_owned(), 2, "rebalance".to_owned())
        ]
    );
    assert!(
        movements
            .iter()
            .all(|m| m.kind() == MovementKind::Transferred)
    );
    // Bad transfers: same location, unknown location, unknown SKU.
    let same = client
        .transfer_stock(transfer("t2", 1, "east"))
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&same), ["to_location_id"]);
    let unknown = client
        .transfer_stock(transfer("t3", 1, "mars"))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&unknown), "LOCATION_NOT_FOUND");
    let mut nothing = transfer("t4", 1, "west");
    nothing.sku = "NOPE".into();
    let nothing = client.transfer_stock(nothing).await.unwrap_err();
    assert_eq!(error_reason(&nothing), "SKU_NOT_FOUND");
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn a_held_event_carries_the_levels_of_every_location_it_moved() {
    let app = spawn_app().await;
    three_locations(&app).await;
    stock_at(&app, "MUG", "east", 1).await;
    stock_at(&app, "MUG", "west", 1).await;
    let mut stream = watch(&app, 2).await;
    app.client
        .clone()
        .reserve(reserve_with(
            "split",
            vec![line_at("MUG", 2, "")],
            AllocationStrategy::Priority,
            true,
        ))
        .await
        .unwrap();
    let events = take(&mut stream, 2).await;
    assert_eq!(events[0].r#type(), EventType::ReservationHeld);
    let Some(event::Payload::ReservationChanged(changed)) = &events[0].payload else {
        panic!("{:?}", events[0]);
    };
    let total: Vec<(i64, i64, i64)> = changed
        .levels
        .iter()
        .map(|l| (l.on_hand, l.reserved, l.version))
        .collect();
    assert_eq!(
        total,
        [(2, 2, 4)],
        "the SKU's total, once, after both movements"
    );
    let per: Vec<(&str, i64, i64)> = changed
        .location_levels
        .iter()
        .map(|l: &StockLevel| (l.location_id.as_str(), l.reserved, l.version))
        .collect();
    assert_eq!(per, [("east", 1, 3), ("west", 1, 4)]);
    assert_eq!(changed.lines[0].allocations.len(), 2);
    // Availability stays a SKU's: out of stock once the total is gone.
    assert_eq!(events[1].r#type(), EventType::OutOfStock);
}

#[tokio::test]
async fn racing_carts_never_oversell_any_location() {
    let app = spawn_app().await;
    three_locations(&app).await;
    for (at, units) in [("east", 7), ("west", 5), ("north", 3)] {
        stock_at(&app, "HOT", at, units).await;
    }
    // 40 carts of 1 to 3 units, both strategies, split or not: 15 units in all.
    let calls = (0..40).map(|i| {
        let mut client = app.client.clone();
        let strategy = if i % 2 == 0 {
            AllocationStrategy::Priority
        } else {
            AllocationStrategy::MostAvailable
        };
        async move {
            client
                .reserve(reserve_with(
                    &format!("race-{i}"),
                    vec![line_at("HOT", 1 + i % 3, "")],
                    strategy,
                    i % 4 < 2,
                ))
                .await
        }
    });
    let results = join_all(calls).await;
    let mut held = 0;
    for result in &results {
        match result {
            Ok(reservation) => held += reservation.get_ref().lines[0].quantity,
            Err(status) => assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}"),
        }
    }
    let rows = at_locations(&app, "HOT").await;
    assert!(
        rows.iter()
            .all(|(_, on_hand, reserved)| reserved <= on_hand)
    );
    let reserved: i64 = rows.iter().map(|r| r.2).sum();
    assert_eq!(
        reserved, held,
        "every unit held is a success, and only those"
    );
    assert!(held >= 13, "the carts used up the stock: {held} of 15");
    assert_eq!(app.level("HOT").await, (15, held));
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn a_holder_paused_past_its_lease_writes_nothing_at_any_location() {
    // Two replicas of one deployment, as in faults.rs: A stalls after its lease, B allocates.
    let (app, replica) = crate::faults::two_replicas().await;
    location(&app, "east", 1, true).await;
    location(&app, "west", 2, true).await;
    // Stock to spare in both locations: only the fence can stop A.
    stock_at(&app, "SKU-1", "east", 100).await;
    stock_at(&app, "SKU-1", "west", 100).await;

    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut client_a = app.client.clone();
    let a = tokio::spawn(async move {
        client_a
            .reserve(reserve_with(
                "a",
                vec![line_at("SKU-1", 150, "")],
                AllocationStrategy::Priority,
                true,
            ))
            .await
    });
    held.reached().await;
    let lease = app.lease_key("SKU-1");
    let _: bool = fred::prelude::KeysInterface::pexpire(&app.redis, &lease, 1, None)
        .await
        .unwrap();
    while fred::prelude::KeysInterface::exists::<i64, _>(&app.redis, &lease)
        .await
        .unwrap()
        > 0
    {
        tokio::task::yield_now().await;
    }
    let b = replica
        .client
        .clone()
        .reserve(reserve_with(
            "b",
            vec![line_at("SKU-1", 120, "")],
            AllocationStrategy::Priority,
            true,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        allocations(&b),
        [("east".to_owned(), 100), ("west".to_owned(), 20)]
    );
    let fence_b = app.stored_fence("SKU-1").await;

    held.resume();
    let status = a.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(error_reason(&status), "LEASE_LOST");
    // Only B's units are held, at both locations; every row carries B's fence.
    assert_eq!(
        at_locations(&app, "SKU-1").await,
        [triple("east", 100, 100), triple("west", 100, 20)]
    );
    let fences: Vec<i64> = app
        .db
        .query(
            "SELECT fence_token FROM stock_locations WHERE sku = 'SKU-1' ORDER BY location_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(fences, [fence_b, fence_b]);
    assert_eq!(
        app.count("SELECT count(*) FROM reservations WHERE idempotency_key = 'a'")
            .await,
        0
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

/// A location that stopped changing long ago does not hold back the pruning of its SKU's
/// later movements: its own go too, and `verify` still checks its row through the total.
#[tokio::test]
async fn an_idle_location_never_holds_back_ledger_pruning() {
    let app = spawn_app().await;
    three_locations(&app).await;
    stock_at(&app, "IDLE", "", 4).await;
    for _ in 0..3 {
        stock_at(&app, "IDLE", "east", 1).await;
    }
    let pruned = app
        .store
        .prune(&crate::helpers::ledger_only_retention(), 100)
        .await
        .unwrap();
    assert_eq!(
        pruned.movements, 3,
        "all but the SKU's latest, default's included"
    );
    let kept: Vec<(i64, String)> = app
        .db
        .query(
            "SELECT version, location_id FROM stock_movements WHERE sku = 'IDLE'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(kept, [(4, "east".to_owned())]);
    let (ok, out) = app.verify().await;
    assert!(ok, "{out}");

    // The pruned location's row still has to add up with the others to the total.
    app.db
        .execute(
            "UPDATE stock_locations SET on_hand = 5 WHERE sku = 'IDLE' AND location_id = 'default'",
            &[],
        )
        .await
        .unwrap();
    let (ok, out) = app.verify().await;
    assert!(!ok, "{out}");
    assert!(out.contains("its locations sum to 8/0"), "{out}");
}

/// A hold at a location the SKU has no row for is drift, not silence.
#[tokio::test]
async fn verify_names_a_hold_at_a_location_without_a_stock_row() {
    let app = spawn_app().await;
    three_locations(&app).await;
    stock_at(&app, "GHOST", "east", 3).await;
    let held = app
        .client
        .clone()
        .reserve(reserve_with(
            "g1",
            vec![line_at("GHOST", 1, "east")],
            AllocationStrategy::Priority,
            false,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(allocations(&held), [("east".to_owned(), 1)]);
    let (ok, out) = app.verify().await;
    assert!(ok, "{out}");
    // Behind the service's back: the line claims to hold at west, where GHOST never was.
    app.db
        .execute(
            "UPDATE reservation_lines SET location_id = 'west' WHERE sku = 'GHOST'",
            &[],
        )
        .await
        .unwrap();
    let (ok, out) = app.verify().await;
    assert!(!ok, "{out}");
    assert!(out.contains("west"), "{out}");
}

/// What a SKU has available, and may promise by a date, is the sum of what each active
/// location has: a location short of its safety stock hides no unit another location has, and
/// an inactive location's units and receipts promise nothing. In every answer that carries the
/// total: a write's, an event's and GetStock's.
#[tokio::test]
async fn a_skus_total_is_the_sum_of_what_its_active_locations_have() {
    use inventory_server::proto::{ExpectStockRequest, SetStockPolicyRequest};
    let app = spawn_app().await;
    location(&app, "east", 1, true).await;
    location(&app, "west", 2, true).await;
    stock_at(&app, "MUG", "east", 10).await;
    stock_at(&app, "MUG", "west", 5).await;
    let mut client = app.client.clone();
    let policy = |location: &str, safety: i64, key: &str| SetStockPolicyRequest {
        sku: "MUG".into(),
        location_id: location.into(),
        safety_stock: Some(safety),
        idempotency_key: key.into(),
        reason: "store buffer".into(),
        ..Default::default()
    };
    // east keeps back 15 of its 10: 5 short. west's 5 are still for sale.
    let total = client
        .set_stock_policy(policy("east", 15, "east-15"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (total.on_hand, total.safety_stock, total.available),
        (15, 15, 5),
        "{total:?}"
    );
    let held = app.hold("west-five", &[("MUG", 5)]).await;
    assert_eq!(allocations(&held), [("west".to_owned(), 5)]);
    let now = client
        .get_stock(get_stock(&["MUG"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(now.levels[0].available, 0);

    // west closes with 4 new units: they are not for sale while it is inactive.
    location(&app, "west", 2, false).await;
    stock_at(&app, "MUG", "west", 4).await;
    let head = app.positioned().await;
    let mut stream = watch(&app, head).await;
    let total = client
        .set_stock_policy(policy("east", 8, "east-8"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (total.on_hand, total.reserved, total.available),
        (19, 5, 2),
        "east's 2 free units, none of inactive west's 4: {total:?}"
    );
    let replayed = client
        .set_stock_policy(policy("east", 8, "east-8"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replayed, total, "a retry answers what the first call did");
    let event = take(&mut stream, 1).await.remove(0);
    let Some(event::Payload::StockStateChanged(changed)) = &event.payload else {
        panic!("{event:?}");
    };
    assert_eq!(changed.level.as_ref().map(|l| l.available), Some(2));
    // Only east's receipts promise: west's 3 do not, while it is inactive.
    let at = |day: i64| prost_types::Timestamp {
        seconds: 1_893_456_000 + day * 86_400,
        nanos: 0,
    };
    for (receipt, location, quantity, day) in [("PO-W", "west", 3, 10), ("PO-E", "east", 4, 20)] {
        client
            .expect_stock(ExpectStockRequest {
                receipt_id: receipt.into(),
                sku: "MUG".into(),
                location_id: location.into(),
                quantity,
                expected_at: Some(at(day)),
                idempotency_key: format!("expect-{receipt}"),
                reason: "purchase order".into(),
            })
            .await
            .unwrap();
    }
    let levels = client
        .get_stock(GetStockRequest {
            skus: vec!["MUG".into()],
            by_location: true,
        })
        .await
        .unwrap()
        .into_inner();
    let total = &levels.levels[0];
    assert_eq!((total.available, total.incoming), (2, 7), "{total:?}");
    let promised: Vec<(i64, i64)> = total
        .available_to_promise
        .iter()
        .map(|p| (p.at.as_ref().unwrap().seconds, p.quantity))
        .collect();
    assert_eq!(
        promised,
        [(at(20).seconds, 6)],
        "east's 2 and PO-E's 4 by its date"
    );
    let west = levels
        .location_levels
        .iter()
        .find(|l| l.location_id == "west")
        .unwrap();
    assert_eq!(west.available, 4, "a location's own figure stays its own");
}
