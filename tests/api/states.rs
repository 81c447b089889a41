//! Stock states: unsellable units (damaged, in quality control), safety stock, and what
//! each does to `available`, to Reserve, to the ledger and to the stream.

use inventory_server::proto::{
    AdjustStockRequest, EventType, ListStockMovementsRequest, MoveStockStateRequest, MovementKind,
    SetStockPolicyRequest, SetStockRequest, StockLevel, StockState, StockStateChanged, event,
};
use tonic::Code;

use crate::{
    events::{take, watch},
    helpers::{
        TestApp, error_reason, get_stock, reserve, spawn_app, stock, stock_at, violated_fields,
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

async fn total(app: &TestApp, sku: &str) -> StockLevel {
    app.client
        .clone()
        .get_stock(get_stock(&[sku]))
        .await
        .unwrap()
        .into_inner()
        .levels
        .remove(0)
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
    assert_eq!(total(&app, "MUG").await, moved);

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
    let nowhere = client
        .move_stock_state(MoveStockStateRequest {
            location_id: "mars".into(),
            ..move_state("PEN", 1, StockState::Sellable, StockState::Damaged, "b6")
        })
        .await
        .unwrap_err();
    assert_eq!(error_reason(&nowhere), "LOCATION_NOT_FOUND");
    let level = total(&app, "PEN").await;
    assert_eq!((level.on_hand, level.unsellable, level.version), (2, 0, 1));
}
