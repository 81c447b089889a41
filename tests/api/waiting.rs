//! Holds that wait for stock: backorders (within a location's backorder limit) and
//! pre-orders (pegged to an incoming receipt), filled oldest first as units arrive, given up
//! with their hold, and put at risk when their receipt is cancelled.

use inventory_server::proto::{
    CancelReceiptRequest, ConfirmReservationRequest, Event, EventType, ExpectStockRequest,
    ReceiptState, ReceiveStockRequest, Reservation, ReservationState, ReserveRequest,
    SetStockPolicyRequest, SetStockRequest, event,
};

use crate::{
    events::{take, watch},
    helpers::{
        TestApp, confirm, confirm_part, december, error_reason, get_stock, release, reserve,
        spawn_app, stock,
    },
};

async fn backorder_limit(app: &TestApp, sku: &str, limit: i64) {
    app.client
        .clone()
        .set_stock_policy(SetStockPolicyRequest {
            sku: sku.into(),
            backorder_limit: Some(limit),
            idempotency_key: format!("limit-{sku}-{limit}"),
            ..Default::default()
        })
        .await
        .unwrap();
}

/// Creates `sku` with nothing on hand.
async fn new_sku(app: &TestApp, sku: &str) {
    app.client
        .clone()
        .set_stock(SetStockRequest {
            sku: sku.into(),
            on_hand: 0,
            idempotency_key: format!("new-{sku}"),
            ..Default::default()
        })
        .await
        .unwrap();
}

fn backorder(key: &str, sku: &str, quantity: i64) -> ReserveRequest {
    ReserveRequest {
        allow_backorder: true,
        ..reserve(key, &[(sku, quantity)])
    }
}

fn preorder(key: &str, sku: &str, quantity: i64) -> ReserveRequest {
    ReserveRequest {
        allow_preorder: true,
        ..reserve(key, &[(sku, quantity)])
    }
}

async fn expect(app: &TestApp, receipt: &str, sku: &str, quantity: i64, day: u32) {
    app.client
        .clone()
        .expect_stock(ExpectStockRequest {
            receipt_id: receipt.into(),
            sku: sku.into(),
            quantity,
            expected_at: Some(december(day)),
            idempotency_key: format!("expect-{receipt}"),
            ..Default::default()
        })
        .await
        .unwrap();
}

async fn receive(app: &TestApp, receipt: &str, quantity: i64, key: &str) -> i64 {
    app.client
        .clone()
        .receive_stock(ReceiveStockRequest {
            receipt_id: receipt.into(),
            quantity,
            idempotency_key: key.into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .preordered
}

/// `(held, backordered, preordered)` of a reservation's only line.
fn units(reservation: &Reservation) -> (i64, i64, i64) {
    let line = &reservation.lines[0];
    (line.held, line.backordered, line.preordered)
}

/// The reservation ids of the events of `kind` among `events`.
fn of_type(events: &[Event], kind: EventType) -> Vec<String> {
    events
        .iter()
        .filter(|e| e.r#type() == kind)
        .filter_map(|e| match &e.subject {
            Some(event::Subject::ReservationId(id)) => Some(id.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_backorder_waits_within_the_limit_and_is_filled_oldest_first_as_stock_arrives() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "MUG", 2).await;
    backorder_limit(&app, "MUG", 3).await;
    let mut stream = watch(&app, app.positioned().await).await;

    // Without asking, a short line is refused as ever.
    let refused = client
        .reserve(reserve("r0", &[("MUG", 4)]))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&refused), "INSUFFICIENT_STOCK");
    let first = client
        .reserve(backorder("r1", "MUG", 4))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&first), (2, 2, 0));
    let level = app.total("MUG").await;
    assert_eq!(
        (level.reserved, level.backordered, level.available),
        (2, 2, 0)
    );
    // One unit of the limit is left.
    let over = client.reserve(backorder("r2", "MUG", 2)).await.unwrap_err();
    assert_eq!(error_reason(&over), "INSUFFICIENT_STOCK");
    let second = client
        .reserve(backorder("r2b", "MUG", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&second), (0, 1, 0));
    // A retry answers the hold as it was made, waiting units and all.
    let again = client
        .reserve(backorder("r1", "MUG", 4))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&again), (2, 2, 0));

    // Only held units ship: the first hold stays open for the rest (under a key, as it
    // has units waiting).
    let shipped = client
        .confirm_reservation(confirm_part(&first.reservation_id, "ship-1", &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(shipped.state(), ReservationState::Held);
    assert_eq!(
        (shipped.lines[0].confirmed, shipped.lines[0].backordered),
        (2, 2)
    );
    // Nothing held yet: the second cannot be confirmed.
    let nothing = client
        .confirm_reservation(confirm_part(&second.reservation_id, "ship-2", &[]))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&nothing), "NOT_HELD");

    // Two arrive: they go to the oldest hold.
    stock(&app, "MUG", 2).await;
    assert_eq!(
        units(&app.reservation(&first.reservation_id).await),
        (2, 0, 0)
    );
    assert_eq!(
        units(&app.reservation(&second.reservation_id).await),
        (0, 1, 0)
    );
    let level = app.total("MUG").await;
    assert_eq!(
        (level.on_hand, level.reserved, level.backordered),
        (2, 2, 1)
    );
    stock(&app, "MUG", 1).await;
    assert_eq!(
        units(&app.reservation(&second.reservation_id).await),
        (1, 0, 0)
    );
    let done = client
        .confirm_reservation(confirm(&first.reservation_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (done.state(), done.lines[0].confirmed),
        (ReservationState::Confirmed, 4)
    );

    let events = take(&mut stream, 11).await;
    assert_eq!(
        of_type(&events, EventType::ReservationFilled),
        [
            first.reservation_id.as_str(),
            second.reservation_id.as_str()
        ]
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn a_pre_order_is_pegged_to_a_receipt_and_filled_when_it_is_received() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    new_sku(&app, "BOOK").await;
    expect(&app, "PO-1", "BOOK", 5, 14).await;
    let first = client
        .reserve(preorder("p1", "BOOK", 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&first), (0, 0, 3));
    let line = &first.lines[0];
    assert_eq!(
        (
            line.receipt_id.as_str(),
            line.preorder_expected_at.as_ref().unwrap().seconds
        ),
        ("PO-1", december(14).seconds)
    );
    // Two of the five are left to promise.
    let over = client.reserve(preorder("p2", "BOOK", 3)).await.unwrap_err();
    assert_eq!(error_reason(&over), "INSUFFICIENT_STOCK");
    let second = client
        .reserve(preorder("p3", "BOOK", 2))
        .await
        .unwrap()
        .into_inner();
    let level = app.total("BOOK").await;
    assert_eq!(
        (level.incoming, level.preordered, level.available),
        (5, 5, 0)
    );
    assert_eq!(
        level
            .available_to_promise
            .iter()
            .map(|s| s.quantity)
            .collect::<Vec<_>>(),
        [0]
    );

    // Three arrive: the oldest pre-order is filled; the receipt still owes two.
    assert_eq!(receive(&app, "PO-1", 3, "in-1").await, 2);
    assert_eq!(
        units(&app.reservation(&first.reservation_id).await),
        (3, 0, 0)
    );
    assert_eq!(
        units(&app.reservation(&second.reservation_id).await),
        (0, 0, 2)
    );
    assert_eq!(receive(&app, "PO-1", 2, "in-2").await, 0);
    assert_eq!(
        units(&app.reservation(&second.reservation_id).await),
        (2, 0, 0)
    );
    let receipt = client
        .list_receipts(inventory_server::proto::ListReceiptsRequest {
            sku: "BOOK".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .receipts
        .remove(0);
    assert_eq!(
        (receipt.state(), receipt.preordered),
        (ReceiptState::Received, 0)
    );
    let level = app.total("BOOK").await;
    assert_eq!(
        (
            level.on_hand,
            level.reserved,
            level.incoming,
            level.preordered
        ),
        (5, 5, 0, 0)
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn a_cancelled_receipt_puts_its_pre_orders_at_risk_and_other_stock_fills_them() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "LAMP", 1).await;
    expect(&app, "PO-7", "LAMP", 4, 20).await;
    let held = client
        .reserve(preorder("p1", "LAMP", 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&held), (1, 0, 2));
    let mut stream = watch(&app, app.positioned().await).await;
    let cancelled = client
        .cancel_receipt(CancelReceiptRequest {
            receipt_id: "PO-7".into(),
            idempotency_key: "cancel-7".into(),
            reason: "supplier out".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (cancelled.state(), cancelled.preordered),
        (ReceiptState::Cancelled, 2)
    );
    // The hold still waits for its two units: nothing is dropped.
    assert_eq!(
        units(&app.reservation(&held.reservation_id).await),
        (1, 0, 2)
    );
    let events = take(&mut stream, 2).await;
    assert_eq!(
        of_type(&events, EventType::ReservationPreorderAtRisk),
        [held.reservation_id.as_str()]
    );
    // Other stock arrives: it fills them.
    stock(&app, "LAMP", 2).await;
    assert_eq!(
        units(&app.reservation(&held.reservation_id).await),
        (3, 0, 0)
    );
    let level = app.total("LAMP").await;
    assert_eq!(
        (level.reserved, level.preordered, level.incoming),
        (3, 0, 0)
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

/// The pre-orders of a cancelled receipt still wait and count as backorders do: the next
/// receipt is promised to them first (a younger pre-order of it is refused, and pegs to a
/// later receipt instead), the backorder limit sees them, and the next receipt fills them.
#[tokio::test]
async fn a_cancelled_receipts_pre_orders_count_so_the_next_receipt_is_not_promised_twice() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    new_sku(&app, "KETTLE").await;
    expect(&app, "PO-1", "KETTLE", 5, 10).await;
    let older = client
        .reserve(preorder("p", "KETTLE", 5))
        .await
        .unwrap()
        .into_inner();
    client
        .cancel_receipt(CancelReceiptRequest {
            receipt_id: "PO-1".into(),
            idempotency_key: "cancel-1".into(),
            reason: "supplier out".into(),
        })
        .await
        .unwrap();
    expect(&app, "PO-2", "KETTLE", 5, 12).await;
    let level = app.total("KETTLE").await;
    assert_eq!(
        level
            .available_to_promise
            .iter()
            .map(|s| s.quantity)
            .collect::<Vec<_>>(),
        [0],
        "PO-2's five units are the older pre-order's"
    );
    let younger = client
        .reserve(preorder("q", "KETTLE", 5))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&younger), "INSUFFICIENT_STOCK");
    // The backorder limit is 0, and five units already wait with no open receipt.
    backorder_limit(&app, "KETTLE", 4).await;
    let over = client
        .reserve(backorder("b", "KETTLE", 1))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&over), "INSUFFICIENT_STOCK");
    // A later receipt has units nobody waits for: the younger pre-order pegs to it.
    expect(&app, "PO-3", "KETTLE", 5, 20).await;
    let pegged = client
        .reserve(preorder("q2", "KETTLE", 5))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pegged.lines[0].receipt_id, "PO-3");

    // PO-2 arrives: it fills the older pre-order, and the younger still waits for PO-3.
    assert_eq!(receive(&app, "PO-2", 5, "in-2").await, 0);
    assert_eq!(
        units(&app.reservation(&older.reservation_id).await),
        (5, 0, 0)
    );
    assert_eq!(
        units(&app.reservation(&pegged.reservation_id).await),
        (0, 0, 5)
    );
    let level = app.total("KETTLE").await;
    assert_eq!(
        (
            level.on_hand,
            level.reserved,
            level.preordered,
            level.incoming
        ),
        (5, 5, 5, 5)
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

/// A pre-order is taken only where `available_to_promise` at its receipt's date covers it:
/// a safety stock not met takes a receipt's units before any pre-order does.
#[tokio::test]
async fn a_pre_order_takes_no_more_than_available_to_promise_shows_by_its_date() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "STOOL", 1).await;
    expect(&app, "PO-9", "STOOL", 4, 8).await;
    client
        .set_stock_policy(SetStockPolicyRequest {
            sku: "STOOL".into(),
            safety_stock: Some(4),
            idempotency_key: "buffer".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let level = app.total("STOOL").await;
    let promised: Vec<i64> = level
        .available_to_promise
        .iter()
        .map(|s| s.quantity)
        .collect();
    assert_eq!(promised, [1], "1 on hand - 4 kept back + 4 incoming");
    let over = client
        .reserve(preorder("p3", "STOOL", 3))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&over), "INSUFFICIENT_STOCK");
    let one = client
        .reserve(preorder("p1", "STOOL", 1))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&one), (0, 0, 1));
    let level = app.total("STOOL").await;
    assert_eq!(level.available_to_promise[0].quantity, 0);
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

/// A hold with waiting units is confirmed only under a key: without one, a retry after a
/// lost answer would ship the units filled in between. Under a key the retry answers the
/// reservation as it is now and ships nothing more.
#[tokio::test]
async fn confirming_a_hold_with_waiting_units_needs_a_key_and_its_retry_ships_nothing_more() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "CHAIR", 2).await;
    backorder_limit(&app, "CHAIR", 2).await;
    let hold = client
        .reserve(backorder("b", "CHAIR", 4))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&hold), (2, 2, 0));
    let keyless = client
        .confirm_reservation(confirm(&hold.reservation_id))
        .await
        .unwrap_err();
    assert_eq!(keyless.code(), tonic::Code::InvalidArgument);
    assert!(keyless.message().contains("idempotency_key"), "{keyless:?}");
    assert_eq!(
        units(&app.reservation(&hold.reservation_id).await),
        (2, 2, 0),
        "refused: nothing moved"
    );
    let keyed = ConfirmReservationRequest {
        idempotency_key: "pay-b".into(),
        ..confirm(&hold.reservation_id)
    };
    let paid = client
        .confirm_reservation(keyed.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (paid.state(), units(&paid), paid.lines[0].confirmed),
        (ReservationState::Held, (0, 2, 0), 2)
    );
    // The answer is lost; stock arrives and fills the waiting units; the retry ships nothing.
    stock(&app, "CHAIR", 2).await;
    let retried = client
        .confirm_reservation(keyed)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (units(&retried), retried.lines[0].confirmed),
        ((2, 0, 0), 2)
    );
    let level = app.total("CHAIR").await;
    assert_eq!((level.on_hand, level.reserved), (2, 2));
    // A whole release needs no key: it ends the hold, and its retry answers the same.
    let released = client
        .release_reservation(release(&hold.reservation_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (released.lines[0].confirmed, released.lines[0].released),
        (2, 2)
    );
    assert_ne!(released.state(), ReservationState::Held);
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

/// Waits until `at` (a reservation's `created_at`) is more than `seconds` ago by this
/// machine's clock, which PostgreSQL's shares, and a moment more.
async fn wait_past(at: &prost_types::Timestamp, seconds: u64) {
    let at = std::time::UNIX_EPOCH
        + std::time::Duration::new(at.seconds as u64, at.nanos as u32)
        + std::time::Duration::from_millis(seconds * 1_000 + 200);
    while std::time::SystemTime::now() <= at {
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `expires_at - created_at` of a reservation, in seconds.
fn lasts(reservation: &Reservation) -> i64 {
    reservation.expires_at.as_ref().unwrap().seconds
        - reservation.created_at.as_ref().unwrap().seconds
}

fn ttl_of_a_second(request: ReserveRequest) -> ReserveRequest {
    ReserveRequest {
        ttl: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        ..request
    }
}

/// Waiting demand is a commitment, not a checkout hold: past its checkout expiry, a hold
/// with units waiting keeps every unit (held ones too) until the wait horizon, counted from
/// when it was made; stock that arrives later fills it, and it ships by the same calls.
#[tokio::test]
async fn a_backorder_and_a_pre_order_outlive_their_checkout_hold_and_are_filled_later() {
    let app = crate::helpers::spawn_app_without_sweeper().await;
    let mut client = app.client.clone();
    stock(&app, "DESK", 2).await;
    backorder_limit(&app, "DESK", 5).await;
    expect(&app, "PO-5", "DESK", 10, 14).await;
    let backordered = client
        .reserve(ttl_of_a_second(backorder("b", "DESK", 4)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&backordered), (2, 2, 0));
    let preordered = client
        .reserve(ttl_of_a_second(preorder("p", "DESK", 3)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&preordered), (0, 0, 3));

    // Made to last until the wait horizon (ten years in the tests), not the one-second ttl.
    for made in [&backordered, &preordered] {
        assert_eq!(lasts(made), 3_650 * 86_400, "{made:?}");
    }
    // Past the ttl, swept: nothing is due, both still hold every unit.
    wait_past(backordered.created_at.as_ref().unwrap(), 1).await;
    wait_past(preordered.created_at.as_ref().unwrap(), 1).await;
    assert_eq!(app.inventory.expire_due(100).await.unwrap(), 0);
    // Extending one changes nothing: no ttl moves the horizon.
    let extended = client
        .extend_reservation(inventory_server::proto::ExtendReservationRequest {
            reservation_id: backordered.reservation_id.clone(),
            ttl: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(extended.expires_at, backordered.expires_at);
    let read = [
        app.reservation(&backordered.reservation_id).await,
        app.reservation(&preordered.reservation_id).await,
    ];
    for (reservation, expected) in read.iter().zip([(2, 2, 0), (0, 0, 3)]) {
        assert_eq!(
            reservation.state(),
            ReservationState::Held,
            "{reservation:?}"
        );
        assert_eq!(units(reservation), expected);
        assert_eq!(lasts(reservation), 3_650 * 86_400);
    }
    let level = app.total("DESK").await;
    assert_eq!(
        (level.reserved, level.backordered, level.preordered),
        (2, 2, 3)
    );

    // The receipt arrives: the pre-order first, then the backorder.
    receive(&app, "PO-5", 10, "in-5").await;
    assert_eq!(
        units(&app.reservation(&preordered.reservation_id).await),
        (3, 0, 0)
    );
    assert_eq!(
        units(&app.reservation(&backordered.reservation_id).await),
        (4, 0, 0)
    );
    let shipped = client
        .confirm_reservation(confirm(&backordered.reservation_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (shipped.state(), shipped.lines[0].confirmed),
        (ReservationState::Confirmed, 4)
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

/// A waiting hold a release before this one made with its checkout ttl reads as held past
/// it, and the sweeper moves its expiry to the wait horizon instead of ending it.
#[tokio::test]
async fn a_waiting_hold_made_with_its_ttl_by_an_older_release_is_moved_to_the_horizon() {
    let app = crate::helpers::spawn_app_without_sweeper().await;
    let mut client = app.client.clone();
    stock(&app, "BOWL", 1).await;
    backorder_limit(&app, "BOWL", 5).await;
    let hold = client
        .reserve(ttl_of_a_second(backorder("b", "BOWL", 3)))
        .await
        .unwrap()
        .into_inner();
    // As the release before stored it: ending with its one-second ttl. Past it:
    let id = uuid::Uuid::parse_str(&hold.reservation_id).unwrap();
    app.db
        .execute(
            "UPDATE reservations SET expires_at = created_at + interval '1 second'
             WHERE reservation_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    wait_past(hold.created_at.as_ref().unwrap(), 1).await;
    let read = app.reservation(&hold.reservation_id).await;
    assert_eq!(
        (read.state(), units(&read)),
        (ReservationState::Held, (1, 2, 0))
    );
    assert!(lasts(&read) < 3_650 * 86_400);
    assert_eq!(app.inventory.expire_due(100).await.unwrap(), 1);
    let moved = app.reservation(&hold.reservation_id).await;
    assert_eq!(
        (moved.state(), units(&moved), lasts(&moved)),
        (ReservationState::Held, (1, 2, 0), 3_650 * 86_400)
    );
    assert_eq!(app.inventory.expire_due(100).await.unwrap(), 0);
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

/// At the wait horizon, a hold still waiting ends like any expired hold: its held units go
/// back and its waiting units are given up.
#[tokio::test]
async fn a_hold_still_waiting_at_the_wait_horizon_expires() {
    let mut settings = crate::helpers::test_settings(crate::helpers::fresh_database().await);
    settings.upkeep.interval = std::time::Duration::from_secs(3600);
    settings.inventory.wait_horizon = std::time::Duration::from_secs(2);
    let app = crate::helpers::spawn_app_with(settings).await;
    let mut client = app.client.clone();
    stock(&app, "LAMP", 1).await;
    backorder_limit(&app, "LAMP", 5).await;
    let hold = client
        .reserve(ttl_of_a_second(backorder("b", "LAMP", 3)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&hold), (1, 2, 0));
    // It lasts until two seconds after it was made (the horizon), not one (its ttl): that
    // it still holds past its ttl is the test above's, with a horizon nothing reaches.
    let made = hold.created_at.as_ref().unwrap();
    let until = hold.expires_at.as_ref().unwrap();
    assert_eq!(
        (until.seconds - made.seconds) * 1_000_000_000 + i64::from(until.nanos - made.nanos),
        2_000_000_000
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // Past the horizon: it expires, and nothing waits any more.
    let ended = loop {
        app.inventory.expire_due(100).await.unwrap();
        let read = app.reservation(&hold.reservation_id).await;
        if read.state() != ReservationState::Held {
            break read;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never expired: {read:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(ended.state(), ReservationState::Expired);
    let level = app.total("LAMP").await;
    assert_eq!(
        (level.reserved, level.backordered, level.available),
        (0, 0, 1)
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

/// A fill skips a waiting hold another transaction has locked (it cannot wait for it under
/// the SKU's row lock), so units arrive free while that hold waits; the sweeper's refill pass
/// finds them and fills it, without waiting for more stock.
#[tokio::test]
async fn a_fill_skipped_because_the_hold_was_locked_is_made_up_by_the_refill_pass() {
    let app = crate::helpers::spawn_app_without_sweeper().await;
    let mut client = app.client.clone();
    new_sku(&app, "VASE").await;
    backorder_limit(&app, "VASE", 5).await;
    let hold = client
        .reserve(backorder("b", "VASE", 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&hold), (0, 3, 0));
    assert_eq!(app.inventory.refill_waiting(100).await.unwrap(), 0);

    // Another transaction has the hold locked (as a confirm in flight would) while three
    // units arrive: the arrival's fill skips it.
    app.db.batch_execute("BEGIN").await.unwrap();
    let id = uuid::Uuid::parse_str(&hold.reservation_id).unwrap();
    app.db
        .execute(
            "SELECT 1 FROM reservations WHERE reservation_id = $1 FOR UPDATE",
            &[&id],
        )
        .await
        .unwrap();
    stock(&app, "VASE", 3).await;
    app.db.batch_execute("ROLLBACK").await.unwrap();
    let level = app.total("VASE").await;
    assert_eq!(
        (level.available, level.backordered),
        (3, 3),
        "free while a hold waits"
    );
    assert_eq!(
        units(&app.reservation(&hold.reservation_id).await),
        (0, 3, 0)
    );

    // The refill pass fills it.
    assert_eq!(app.inventory.refill_waiting(100).await.unwrap(), 3);
    assert_eq!(
        units(&app.reservation(&hold.reservation_id).await),
        (3, 0, 0)
    );
    let level = app.total("VASE").await;
    assert_eq!(
        (level.available, level.reserved, level.backordered),
        (0, 3, 0)
    );
    assert_eq!(app.inventory.refill_waiting(100).await.unwrap(), 0);
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

/// A receipt still open past its date is reported late, and `available_to_promise` never
/// shows a date in the past: its units are promised from now.
#[tokio::test]
async fn a_late_receipt_is_reported_and_promised_from_now_on() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "RUG", 1).await;
    let past = prost_types::Timestamp {
        seconds: 1_577_836_800, // 2020-01-01
        nanos: 0,
    };
    let late = client
        .expect_stock(ExpectStockRequest {
            receipt_id: "PO-OLD".into(),
            sku: "RUG".into(),
            quantity: 4,
            expected_at: Some(past),
            idempotency_key: "expect-old".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(late.late, "{late:?}");
    expect(&app, "PO-NEW", "RUG", 2, 14).await;
    let listed = client
        .list_receipts(inventory_server::proto::ListReceiptsRequest {
            sku: "RUG".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .receipts;
    let lateness: Vec<(&str, bool)> = listed
        .iter()
        .map(|r| (r.receipt_id.as_str(), r.late))
        .collect();
    assert_eq!(lateness, [("PO-NEW", false), ("PO-OLD", true)]);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let level = app.total("RUG").await;
    let steps: Vec<(i64, i64)> = level
        .available_to_promise
        .iter()
        .map(|s| (s.at.as_ref().unwrap().seconds, s.quantity))
        .collect();
    assert_eq!(steps.len(), 2, "{steps:?}");
    assert!(steps[0].0 >= before, "a step in the past: {steps:?}");
    assert_eq!(steps[0].1, 5, "one on hand and the late four, from now");
    assert_eq!(steps[1], (december(14).seconds, 7));
    // Received: no longer late.
    let received = client
        .receive_stock(ReceiveStockRequest {
            receipt_id: "PO-OLD".into(),
            quantity: 4,
            idempotency_key: "in-old".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!received.late);
}

/// Units received into quality control are on hand but unsellable: they fill nothing, not
/// even the receipt's own pre-orders, until MoveStockState passes them; then they fill the
/// waiting holds oldest first. A retry of the receive with its key receives nothing more, and
/// the same key for a sellable receive is another request.
#[tokio::test]
async fn units_received_into_quality_control_fill_pre_orders_only_once_they_pass() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    new_sku(&app, "OVEN").await;
    expect(&app, "PO-Q", "OVEN", 6, 14).await;
    let pre = client
        .reserve(preorder("p", "OVEN", 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&pre), (0, 0, 3));
    expect(&app, "PO-R", "OVEN", 5, 20).await;
    let into_qc = ReceiveStockRequest {
        receipt_id: "PO-Q".into(),
        quantity: 4,
        idempotency_key: "in-q".into(),
        state: inventory_server::proto::StockState::QualityControl.into(),
        ..Default::default()
    };
    let received = client
        .receive_stock(into_qc.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (received.state(), received.remainder, received.preordered),
        (ReceiptState::Open, 2, 3)
    );
    let level = received.level.unwrap();
    assert_eq!(
        (
            level.on_hand,
            level.quality_control,
            level.available,
            level.reserved
        ),
        (4, 4, 0, 0)
    );
    assert_eq!(
        units(&app.reservation(&pre.reservation_id).await),
        (0, 0, 3)
    );
    // PO-Q can bring two of the three units pegged to it: the third waits with no receipt
    // able to bring it, and PO-R's five are promised to it first (4, not 5, by the 20th).
    let promised: Vec<(i64, i64)> = app
        .total("OVEN")
        .await
        .available_to_promise
        .iter()
        .map(|s| (s.at.as_ref().unwrap().seconds, s.quantity))
        .collect();
    assert_eq!(
        promised,
        [(december(14).seconds, 0), (december(20).seconds, 4)]
    );
    // A retry receives nothing more; the same key for sellable units is another request.
    client.receive_stock(into_qc.clone()).await.unwrap();
    let other = client
        .receive_stock(ReceiveStockRequest {
            state: 0,
            ..into_qc
        })
        .await
        .unwrap_err();
    assert_eq!(other.code(), tonic::Code::AlreadyExists);
    assert_eq!(app.total("OVEN").await.on_hand, 4);

    // Quality control passes them: the waiting pre-order is filled.
    client
        .move_stock_state(inventory_server::proto::MoveStockStateRequest {
            sku: "OVEN".into(),
            quantity: 4,
            from_state: inventory_server::proto::StockState::QualityControl.into(),
            to_state: inventory_server::proto::StockState::Sellable.into(),
            idempotency_key: "qc-pass".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        units(&app.reservation(&pre.reservation_id).await),
        (3, 0, 0)
    );
    let level = app.total("OVEN").await;
    assert_eq!(
        (
            level.on_hand,
            level.reserved,
            level.available,
            level.preordered
        ),
        (4, 3, 1, 0)
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn a_released_hold_gives_up_its_waiting_units_and_its_held_ones_go_to_the_queue() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "PEN", 2).await;
    backorder_limit(&app, "PEN", 5).await;
    // Six expected: the three backordered below are promised the first three of them.
    expect(&app, "PO-2", "PEN", 6, 12).await;
    let first = client
        .reserve(backorder("b1", "PEN", 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&first), (2, 1, 0));
    let second = client
        .reserve(backorder("b2", "PEN", 2))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&second), (0, 2, 0));
    let third = client
        .reserve(preorder("p3", "PEN", 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&third), (0, 0, 3));

    // The first is released: its waiting unit is given up, its two held ones fill the
    // second, which waited longest.
    client
        .release_reservation(release(&first.reservation_id))
        .await
        .unwrap();
    assert_eq!(
        units(&app.reservation(&second.reservation_id).await),
        (2, 0, 0)
    );
    let level = app.total("PEN").await;
    assert_eq!(
        (level.reserved, level.backordered, level.preordered),
        (2, 0, 3)
    );
    // The pre-order released gives its units back to its receipt.
    client
        .release_reservation(release(&third.reservation_id))
        .await
        .unwrap();
    let level = app.total("PEN").await;
    assert_eq!((level.preordered, level.incoming), (0, 6));
    let receipt = client
        .list_receipts(inventory_server::proto::ListReceiptsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .receipts
        .remove(0);
    assert_eq!(receipt.preordered, 0);
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

/// A pre-order given up (released, or expired) answers as a read of it does afterwards: no
/// unit waits for the receipt any more, so neither its line nor its allocation names one.
/// (Found by the reference model: the release's answer named the receipt, a read did not.)
#[tokio::test]
async fn a_pre_order_given_up_names_no_receipt_in_the_answer_or_a_read() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "CUP", 1).await;
    expect(&app, "PO-9", "CUP", 4, 14).await;
    let held = client
        .reserve(preorder("p1", "CUP", 3))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&held), (1, 0, 2));
    assert_eq!(held.lines[0].receipt_id, "PO-9");

    let released = client
        .release_reservation(release(&held.reservation_id))
        .await
        .unwrap()
        .into_inner();
    let read = app.reservation(&held.reservation_id).await;
    assert_eq!(released.lines, read.lines);
    assert_eq!(released.lines[0].receipt_id, "");
    assert_eq!(released.lines[0].allocations[0].receipt_id, "");
    assert_eq!(released.lines[0].released, 3);
}

/// Forty one-unit orders race for a SKU with 5 on hand, a backorder limit of 5 and a
/// receipt of 10 on its way, while the receipt arrives in two parts and 3 units are found:
/// every order answered held is one promise (held, backordered or pre-ordered), none more,
/// none lost, and no promise exceeds what the stock can keep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_arriving_while_reserves_race_promises_no_unit_twice() {
    let app = spawn_app().await;
    stock(&app, "HOT", 5).await;
    backorder_limit(&app, "HOT", 5).await;
    expect(&app, "PO-H", "HOT", 10, 15).await;
    let orders = (0..40).map(|n| {
        let mut client = app.client.clone();
        async move {
            let request = ReserveRequest {
                allow_backorder: n % 3 != 0,
                allow_preorder: n % 2 == 0,
                ..reserve(&format!("race-{n}"), &[("HOT", 1)])
            };
            // The same key until the call is decided (a busy lease asks for a retry).
            loop {
                match client.reserve(request.clone()).await {
                    Ok(held) => return Ok(held.into_inner()),
                    Err(status) if error_reason(&status) == "INSUFFICIENT_STOCK" => {
                        return Err(status);
                    }
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                }
            }
        }
    });
    let arrivals = async {
        receive(&app, "PO-H", 4, "race-in-1").await;
        stock(&app, "HOT", 3).await;
        receive(&app, "PO-H", 6, "race-in-2").await;
    };
    let (answers, ()) = tokio::join!(futures::future::join_all(orders), arrivals);
    let held: Vec<Reservation> = answers.into_iter().filter_map(Result::ok).collect();
    // Each answer's single unit is somewhere, and the stored holds are the answered ones.
    for r in &held {
        let (h, b, p) = units(&app.reservation(&r.reservation_id).await);
        assert_eq!(h + b + p, 1, "{}", r.reservation_id);
    }
    let level = app.total("HOT").await;
    let promised = level.reserved + level.backordered + level.preordered;
    assert_eq!(promised, held.len() as i64, "{level:?}");
    // 5 + 3 found + 10 received are on hand; 5 more may be backordered.
    assert_eq!(level.on_hand, 18);
    assert!(
        level.reserved + level.backordered <= level.on_hand + level.backorder_limit,
        "{level:?}"
    );
    assert_eq!((level.incoming, level.preordered), (0, 0), "{level:?}");
    assert!(held.len() <= 23, "{} held", held.len());
    // Nothing is left free while a backorder waits.
    assert!(level.backordered == 0 || level.available == 0, "{level:?}");
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

/// Two receipts of 5 promise 10 units by the second's date, but a pre-order waits for one
/// receipt, never two: GetStock says what one line gets by each date
/// (`max_line_quantity`), and that is what one Reserve gets, not a unit more.
#[tokio::test]
async fn available_to_promise_says_what_one_line_gets_when_receipts_add_up() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "PEN", 1).await;
    expect(&app, "PO-A", "PEN", 5, 10).await;
    expect(&app, "PO-B", "PEN", 5, 12).await;
    let steps = async || -> Vec<(i64, i64, i64)> {
        app.client
            .clone()
            .get_stock(get_stock(&["PEN"]))
            .await
            .unwrap()
            .into_inner()
            .levels[0]
            .available_to_promise
            .iter()
            .map(|p| {
                (
                    p.at.as_ref().unwrap().seconds,
                    p.quantity,
                    p.max_line_quantity,
                )
            })
            .collect()
    };
    let (tenth, twelfth) = (december(10).seconds, december(12).seconds);
    assert_eq!(steps().await, [(tenth, 6, 6), (twelfth, 11, 6)]);
    // Seven: the free unit and five of one receipt are not enough.
    let refused = client
        .reserve(preorder("seven", "PEN", 7))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&refused), "INSUFFICIENT_STOCK");
    let six = client
        .reserve(preorder("six", "PEN", 6))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&six), (1, 0, 5));
    assert_eq!(steps().await, [(tenth, 0, 0), (twelfth, 5, 5)]);
    let five = client
        .reserve(preorder("five", "PEN", 5))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(units(&five), (0, 0, 5));
    assert_eq!(five.lines[0].allocations[0].receipt_id, "PO-B");
}
