//! Stock states: unsellable units (damaged, in quality control), safety stock, incoming
//! receipts, and what each does to `available`, to Reserve, to the ledger and to the stream.

use inventory_server::proto::{
    AdjustStockRequest, CancelReceiptRequest, EventType, ExpectStockRequest, ListReceiptsRequest,
    ListStockMovementsRequest, MoveStockStateRequest, MovementKind, ReceiptState,
    ReceiveStockRequest, SetStockPolicyRequest, SetStockRequest, StockState, StockStateChanged,
    event,
};
use tonic::Code;

use crate::{
    events::{take, watch},
    helpers::{
        TestApp, december, error_reason, reserve, spawn_app, stock, stock_at, violated_fields,
    },
};

fn move_state(
    sku: &str,
    quantity: i64,
    from: StockState,
    to: StockState,
    key: &str,
) -> MoveStockStateRequest {
    MoveStockStateRequest {
        sku: sku.into(),
        quantity,
        from_state: from.into(),
        to_state: to.into(),
        idempotency_key: key.into(),
        reason: "found on inspection".into(),
        ..Default::default()
    }
}

fn policy(sku: &str, safety: Option<i64>, limit: Option<i64>, key: &str) -> SetStockPolicyRequest {
    SetStockPolicyRequest {
        sku: sku.into(),
        safety_stock: safety,
        backorder_limit: limit,
        idempotency_key: key.into(),
        reason: "store buffer".into(),
        ..Default::default()
    }
}

/// `(kind, on_hand_delta, damaged_delta, quality_control_delta, safety_stock_delta)` of every
/// movement of `sku` after `after`.
async fn movements(
    app: &TestApp,
    sku: &str,
    after: i64,
) -> Vec<(MovementKind, i64, i64, i64, i64)> {
    app.client
        .clone()
        .list_stock_movements(ListStockMovementsRequest {
            sku: sku.into(),
            after_version: after,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .movements
        .iter()
        .map(|m| {
            (
                m.kind(),
                m.on_hand_delta,
                m.damaged_delta,
                m.quality_control_delta,
                m.safety_stock_delta,
            )
        })
        .collect()
}

#[tokio::test]
async fn a_damaged_unit_is_never_reserved_and_is_written_off_by_its_state() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    let mut stream = watch(&app, 0).await;
    stock(&app, "MUG", 3).await;
    let moved = client
        .move_stock_state(move_state(
            "MUG",
            1,
            StockState::Sellable,
            StockState::Damaged,
            "d1",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            moved.on_hand,
            moved.unsellable,
            moved.damaged,
            moved.available,
            moved.version
        ),
        (3, 1, 1, 2, 2)
    );
    // A retry answers the same and moves nothing twice.
    let again = client
        .move_stock_state(move_state(
            "MUG",
            1,
            StockState::Sellable,
            StockState::Damaged,
            "d1",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again, moved);
    assert_eq!(app.total("MUG").await, moved);

    // Only the two sound units can be held.
    let refused = client
        .reserve(reserve("r1", &[("MUG", 3)]))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&refused), "INSUFFICIENT_STOCK");
    let held = client
        .reserve(reserve("r2", &[("MUG", 2)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.lines[0].held, 2);
    // Held units never move out of sellable; the damaged one cannot be moved twice.
    let busy = client
        .move_stock_state(move_state(
            "MUG",
            1,
            StockState::Sellable,
            StockState::QualityControl,
            "d2",
        ))
        .await
        .unwrap_err();
    assert_eq!(busy.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&busy), "INSUFFICIENT_STOCK");
    let twice = client
        .move_stock_state(move_state(
            "MUG",
            2,
            StockState::Damaged,
            StockState::QualityControl,
            "d3",
        ))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&twice), "INSUFFICIENT_STOCK");

    // Written off by its state: on hand and damaged drop together.
    let write_off = |key: &str| AdjustStockRequest {
        sku: "MUG".into(),
        delta: -1,
        idempotency_key: key.into(),
        reason: "broken".into(),
        state: StockState::Damaged.into(),
        ..Default::default()
    };
    let after = client
        .adjust_stock(write_off("w1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            after.on_hand,
            after.reserved,
            after.damaged,
            after.available
        ),
        (2, 2, 0, 0)
    );
    let none_left = client.adjust_stock(write_off("w2")).await.unwrap_err();
    assert_eq!(error_reason(&none_left), "INSUFFICIENT_STOCK");
    // A sellable write-off may not cut into the held units.
    let held_units = client
        .adjust_stock(AdjustStockRequest {
            state: StockState::Sellable.into(),
            ..write_off("w3")
        })
        .await
        .unwrap_err();
    assert_eq!(error_reason(&held_units), "STOCK_RESERVED");

    assert_eq!(
        movements(&app, "MUG", 1).await,
        [
            (MovementKind::StateMoved, 0, 1, 0, 0),
            (MovementKind::Held, 0, 0, 0, 0),
            (MovementKind::Adjusted, -1, -1, 0, 0),
        ]
    );
    let events = take(&mut stream, 5).await;
    let changed: Vec<&StockStateChanged> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Some(event::Payload::StockStateChanged(c)) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(changed.len(), 1);
    assert_eq!(
        (
            changed[0].kind(),
            changed[0].quantity,
            changed[0].from_state(),
            changed[0].to_state()
        ),
        (
            MovementKind::StateMoved,
            1,
            StockState::Sellable,
            StockState::Damaged
        )
    );
    assert_eq!(changed[0].location_level.as_ref().unwrap().damaged, 1);
    assert!(
        events
            .iter()
            .any(|e| e.r#type() == EventType::StockStateChanged)
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn units_in_quality_control_come_back_to_sale_when_they_pass() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "LAMP", 4).await;
    client
        .move_stock_state(move_state(
            "LAMP",
            4,
            StockState::Sellable,
            StockState::QualityControl,
            "q1",
        ))
        .await
        .unwrap();
    let refused = client
        .reserve(reserve("r1", &[("LAMP", 1)]))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&refused), "INSUFFICIENT_STOCK");
    let passed = client
        .move_stock_state(move_state(
            "LAMP",
            3,
            StockState::QualityControl,
            StockState::Sellable,
            "q2",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            passed.on_hand,
            passed.quality_control,
            passed.unsellable,
            passed.available
        ),
        (4, 1, 1, 3)
    );
    client.reserve(reserve("r2", &[("LAMP", 3)])).await.unwrap();
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn a_safety_stock_keeps_units_back_and_never_takes_back_a_hold() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "TEA", 10).await;
    let buffered = client
        .set_stock_policy(policy("TEA", Some(3), None, "p1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            buffered.on_hand,
            buffered.safety_stock,
            buffered.available,
            buffered.version
        ),
        (10, 3, 7, 2)
    );
    let refused = client
        .reserve(reserve("r1", &[("TEA", 8)]))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&refused), "INSUFFICIENT_STOCK");
    client.reserve(reserve("r2", &[("TEA", 7)])).await.unwrap();
    // Raised above what is free: accepted, the hold stays, nothing more is sold.
    let raised = client
        .set_stock_policy(policy("TEA", Some(5), Some(2), "p2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            raised.reserved,
            raised.safety_stock,
            raised.backorder_limit,
            raised.available
        ),
        (7, 5, 2, 0)
    );
    // The policy already stored changes nothing: no version, no movement.
    let same = client
        .set_stock_policy(policy("TEA", Some(5), None, "p3"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(same.version, raised.version);
    assert_eq!(
        movements(&app, "TEA", 1).await,
        [
            (MovementKind::PolicySet, 0, 0, 0, 3),
            (MovementKind::Held, 0, 0, 0, 0),
            (MovementKind::PolicySet, 0, 0, 0, 2),
        ]
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn counts_by_state_move_on_hand_by_the_difference() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock_at(&app, "CUP", "", 5).await;
    client.reserve(reserve("r1", &[("CUP", 2)])).await.unwrap();
    let count = |on_hand: i64, state: StockState, key: &str| SetStockRequest {
        sku: "CUP".into(),
        on_hand,
        idempotency_key: key.into(),
        reason: "cycle count".into(),
        state: state.into(),
        ..Default::default()
    };
    // Two damaged units found besides the five: the shelf has seven.
    let counted = client
        .set_stock(count(2, StockState::Damaged, "c1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (counted.on_hand, counted.damaged, counted.available),
        (7, 2, 3)
    );
    // Sellable counted at 4: one sellable unit fewer.
    let sellable = client
        .set_stock(count(4, StockState::Sellable, "c2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (sellable.on_hand, sellable.damaged, sellable.available),
        (6, 2, 2)
    );
    // A whole count may not fall below what is reserved and unsellable.
    let below = client
        .set_stock(count(3, StockState::Unspecified, "c3"))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&below), "BELOW_RESERVED");
    let sellable_below = client
        .set_stock(count(1, StockState::Sellable, "c4"))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&sellable_below), "BELOW_RESERVED");
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn bad_state_and_policy_requests_are_refused_and_change_nothing() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "PEN", 2).await;
    let same = client
        .move_stock_state(move_state(
            "PEN",
            1,
            StockState::Damaged,
            StockState::Damaged,
            "b1",
        ))
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&same), ["to_state"]);
    let unset = client
        .move_stock_state(move_state(
            "PEN",
            0,
            StockState::Unspecified,
            StockState::Sellable,
            "b2",
        ))
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&unset), ["quantity", "from_state"]);
    let empty = client
        .set_stock_policy(policy("PEN", None, None, "b3"))
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&empty), ["safety_stock"]);
    let negative = client
        .set_stock_policy(policy("PEN", Some(-1), Some(-2), "b4"))
        .await
        .unwrap_err();
    assert_eq!(
        violated_fields(&negative),
        ["safety_stock", "backorder_limit"]
    );
    let unknown = client
        .set_stock_policy(policy("NOPE", Some(1), None, "b5"))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&unknown), "SKU_NOT_FOUND");
    // A date before the epoch (stored as the epoch, so two dates would replay as one) or
    // past the year 9999 (no timestamp reads it back) is refused as such.
    for (n, seconds) in [
        (0, -1),
        (1, -86_400 * 365),
        (2, 253_402_300_800),
        (3, i64::MAX / 2),
    ] {
        let bad = client
            .expect_stock(ExpectStockRequest {
                expected_at: Some(prost_types::Timestamp { seconds, nanos: 0 }),
                idempotency_key: format!("bad-date-{n}"),
                ..expect(&format!("PO-D{n}"), "PEN", 1, 1)
            })
            .await
            .unwrap_err();
        assert_eq!(bad.code(), Code::InvalidArgument, "{seconds}: {bad:?}");
        assert!(bad.message().contains("expected_at"), "{bad:?}");
    }
    let nowhere = client
        .move_stock_state(MoveStockStateRequest {
            location_id: "mars".into(),
            ..move_state("PEN", 1, StockState::Sellable, StockState::Damaged, "b6")
        })
        .await
        .unwrap_err();
    assert_eq!(error_reason(&nowhere), "LOCATION_NOT_FOUND");
    let level = app.total("PEN").await;
    assert_eq!((level.on_hand, level.unsellable, level.version), (2, 0, 1));
}

fn expect(receipt: &str, sku: &str, quantity: i64, day: u32) -> ExpectStockRequest {
    ExpectStockRequest {
        receipt_id: receipt.into(),
        sku: sku.into(),
        quantity,
        expected_at: Some(december(day)),
        idempotency_key: format!("expect-{receipt}"),
        reason: "purchase order".into(),
        ..Default::default()
    }
}

fn receive(receipt: &str, quantity: i64, key: &str) -> ReceiveStockRequest {
    ReceiveStockRequest {
        receipt_id: receipt.into(),
        quantity,
        idempotency_key: key.into(),
        reason: "dock 3".into(),
        ..Default::default()
    }
}

fn cancel_receipt(receipt: &str, key: &str) -> CancelReceiptRequest {
    CancelReceiptRequest {
        receipt_id: receipt.into(),
        idempotency_key: key.into(),
        reason: "supplier out".into(),
    }
}

#[tokio::test]
async fn receipts_are_incoming_until_received_and_promise_by_date() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "BIKE", 2).await;
    let r1 = client
        .expect_stock(expect("PO-1", "BIKE", 5, 14))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            r1.state(),
            r1.remainder,
            r1.level.as_ref().unwrap().incoming
        ),
        (ReceiptState::Open, 5, 5)
    );
    client
        .expect_stock(expect("PO-2", "BIKE", 3, 20))
        .await
        .unwrap();
    // Same id again (another key): refused, nothing added.
    let taken = client
        .expect_stock(ExpectStockRequest {
            idempotency_key: "again".into(),
            ..expect("PO-1", "BIKE", 9, 15)
        })
        .await
        .unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists);
    assert_eq!(error_reason(&taken), "RECEIPT_EXISTS");
    let unknown = client
        .expect_stock(expect("PO-3", "NOPE", 1, 1))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&unknown), "SKU_NOT_FOUND");

    // Two on the shelf, five more by the 14th, three more by the 20th.
    let level = app.total("BIKE").await;
    assert_eq!((level.on_hand, level.incoming, level.available), (2, 8, 2));
    let steps: Vec<(i64, i64)> = level
        .available_to_promise
        .iter()
        .map(|s| (s.at.as_ref().unwrap().seconds, s.quantity))
        .collect();
    assert_eq!(
        steps,
        [(december(14).seconds, 7), (december(20).seconds, 10)]
    );

    // A partial receipt, then the rest and one more: the receipt is received.
    let part = client
        .receive_stock(receive("PO-1", 2, "g1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (part.received, part.remainder, part.state()),
        (2, 3, ReceiptState::Open)
    );
    let after = part.level.unwrap();
    assert_eq!((after.on_hand, after.incoming, after.available), (4, 6, 4));
    let rest = client
        .receive_stock(receive("PO-1", 4, "g2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (rest.received, rest.remainder, rest.state()),
        (6, 0, ReceiptState::Received)
    );
    let after = rest.level.unwrap();
    assert_eq!((after.on_hand, after.incoming), (8, 3));
    let closed = client
        .receive_stock(receive("PO-1", 1, "g3"))
        .await
        .unwrap_err();
    assert_eq!(
        (closed.code(), error_reason(&closed).as_str()),
        (Code::FailedPrecondition, "RECEIPT_CLOSED")
    );
    // A retry of an applied receipt answers it and receives nothing twice.
    let replay = client
        .receive_stock(receive("PO-1", 2, "g1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay.received, 2);
    assert_eq!(app.total("BIKE").await.on_hand, 8);

    // Cancelled: what it had still to bring is no longer incoming; twice is the same.
    let cancelled = client
        .cancel_receipt(cancel_receipt("PO-2", "x1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (cancelled.state(), cancelled.remainder),
        (ReceiptState::Cancelled, 0)
    );
    assert_eq!(cancelled.level.as_ref().unwrap().incoming, 0);
    let twice = client
        .cancel_receipt(cancel_receipt("PO-2", "x2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(twice.state(), ReceiptState::Cancelled);
    let late = client
        .receive_stock(receive("PO-2", 1, "g4"))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&late), "RECEIPT_CLOSED");
    let missing = client
        .receive_stock(receive("PO-9", 1, "g5"))
        .await
        .unwrap_err();
    assert_eq!(
        (missing.code(), error_reason(&missing).as_str()),
        (Code::NotFound, "RECEIPT_NOT_FOUND")
    );
    assert!(app.total("BIKE").await.available_to_promise.is_empty());

    let kinds: Vec<(MovementKind, i64)> = app
        .client
        .clone()
        .list_stock_movements(ListStockMovementsRequest {
            sku: "BIKE".into(),
            after_version: 1,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .movements
        .iter()
        .map(|m| (m.kind(), m.incoming_delta))
        .collect();
    assert_eq!(
        kinds,
        [
            (MovementKind::ReceiptExpected, 5),
            (MovementKind::ReceiptExpected, 3),
            (MovementKind::Received, -2),
            (MovementKind::Received, -3),
            (MovementKind::ReceiptCancelled, -3),
        ]
    );
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn receipts_are_listed_by_id_a_page_at_a_time() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    stock(&app, "A", 1).await;
    stock(&app, "B", 1).await;
    for (id, sku) in [("R-1", "A"), ("R-2", "B"), ("R-3", "A"), ("R-4", "A")] {
        client.expect_stock(expect(id, sku, 1, 10)).await.unwrap();
    }
    let first = client
        .list_receipts(ListReceiptsRequest {
            sku: "A".into(),
            page_size: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let ids = |page: &inventory_server::proto::ListReceiptsResponse| {
        page.receipts
            .iter()
            .map(|r| r.receipt_id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&first), ["R-1", "R-3"]);
    let second = client
        .list_receipts(ListReceiptsRequest {
            sku: "A".into(),
            page_size: 2,
            page_token: first.next_page_token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(&second), ["R-4"]);
    assert!(second.next_page_token.is_empty());
    // A token is bound to its filter.
    let other = client
        .list_receipts(ListReceiptsRequest {
            sku: "B".into(),
            page_size: 2,
            page_token: first.next_page_token,
        })
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&other), ["page_token"]);
    let all = client
        .list_receipts(ListReceiptsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ids(&all), ["R-1", "R-2", "R-3", "R-4"]);
}

/// What a replica of the release before states writes during a rollout: its statements
/// know nothing of them. It cannot hold an unsellable unit, and the movements it writes
/// still carry the location's states.
#[tokio::test]
async fn a_release_before_states_cannot_hold_an_unsellable_unit_nor_leave_the_ledger_short() {
    let app = spawn_app().await;
    stock(&app, "OLD", 2).await;
    app.client
        .clone()
        .move_stock_state(move_state(
            "OLD",
            1,
            StockState::Sellable,
            StockState::Damaged,
            "m",
        ))
        .await
        .unwrap();
    // Its Reserve saw 2 available (on_hand - reserved) and holds both.
    let refused = app
        .db
        .execute(
            "UPDATE stock_locations SET reserved = reserved + 2 WHERE sku = 'OLD'",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(
        refused.as_db_error().and_then(|e| e.constraint()),
        Some("stock_locations_sound_units")
    );
    // Its AdjustStock: the rows moved, then a movement without the state columns.
    app.db
        .batch_execute(
            "UPDATE stock SET on_hand = on_hand + 1, version = version + 1 WHERE sku = 'OLD';
             UPDATE stock_locations SET on_hand = on_hand + 1, version = version + 1
                 WHERE sku = 'OLD';
             INSERT INTO stock_movements (sku, version, kind, on_hand_delta, reserved_delta,
                                          on_hand, reserved, location_id)
                 VALUES ('OLD', 3, 'ADJUSTED', 1, 0, 3, 0, 'default');",
        )
        .await
        .unwrap();
    let damaged: i64 = app
        .db
        .query_one(
            "SELECT damaged FROM stock_movements WHERE sku = 'OLD' AND version = 3",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(damaged, 1);
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}
