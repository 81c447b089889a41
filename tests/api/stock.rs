//! `AdjustStock` and `GetStock`: levels, idempotency, validation and status codes.

use futures::future::join_all;
use inventory_server::proto::{AdjustStockRequest, GetStockRequest};
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::helpers::{TestApp, adjust, error_reason, get_stock, level, spawn_app, violated_fields};

async fn outbox_events(app: &TestApp, sku: &str) -> Vec<serde_json::Value> {
    app.db
        .query(
            "SELECT payload FROM outbox WHERE sku = $1 AND event_type = 'STOCK_ADJUSTED' ORDER BY sequence",
            &[&sku],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

#[tokio::test]
async fn first_positive_adjustment_creates_the_sku_and_get_stock_reads_it() {
    let mut app = spawn_app().await;
    let created = app
        .client
        .adjust_stock(adjust("SKU-1", 10, "k1"))
        .await
        .unwrap();
    assert_eq!(created.into_inner(), level("SKU-1", 10, 0, 1));

    let read = app
        .client
        .get_stock(get_stock(&["SKU-1"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(read.levels, [level("SKU-1", 10, 0, 1)]);
}

#[tokio::test]
async fn adjustments_add_and_remove_and_each_writes_one_event() {
    let mut app = spawn_app().await;
    app.client
        .adjust_stock(adjust("SKU-1", 10, "k1"))
        .await
        .unwrap();
    app.client
        .adjust_stock(adjust("SKU-1", 5, "k2"))
        .await
        .unwrap();
    let after = app
        .client
        .adjust_stock(adjust("SKU-1", -12, "k3"))
        .await
        .unwrap();
    assert_eq!(after.into_inner(), level("SKU-1", 3, 0, 3));

    let events = outbox_events(&app, "SKU-1").await;
    let deltas: Vec<i64> = events
        .iter()
        .map(|e| e["delta"].as_i64().unwrap())
        .collect();
    assert_eq!(deltas, [10, 5, -12]);
    assert_eq!(events[2]["on_hand"], 3);
    assert_eq!(events[2]["reason"], "test");
}

#[tokio::test]
async fn get_stock_answers_in_request_order() {
    let mut app = spawn_app().await;
    for (sku, units) in [("A", 1), ("B", 2), ("C", 3)] {
        app.client
            .adjust_stock(adjust(sku, units, &format!("seed-{sku}")))
            .await
            .unwrap();
    }
    let read = app
        .client
        .get_stock(get_stock(&["C", "A", "B"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        read.levels,
        [
            level("C", 3, 0, 1),
            level("A", 1, 0, 1),
            level("B", 2, 0, 1)
        ]
    );
}

#[tokio::test]
async fn get_stock_of_unknown_skus_is_not_found_naming_them() {
    let mut app = spawn_app().await;
    app.client
        .adjust_stock(adjust("KNOWN", 1, "k1"))
        .await
        .unwrap();
    let status = app
        .client
        .get_stock(get_stock(&["GHOST-1", "KNOWN", "GHOST-2"]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert!(status.message().contains("GHOST-1, GHOST-2"), "{status:?}");
    assert_eq!(error_reason(&status), "SKU_NOT_FOUND");
}

#[tokio::test]
async fn removing_from_an_unknown_sku_is_not_found_and_creates_nothing() {
    let mut app = spawn_app().await;
    let status = app
        .client
        .adjust_stock(adjust("GHOST", -1, "k1"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let stock: i64 = app.count("SELECT count(*) FROM stock").await;
    assert_eq!(stock, 0);
}

#[tokio::test]
async fn removal_may_not_cut_into_reserved_units() {
    let mut app = spawn_app().await;
    app.client
        .adjust_stock(adjust("SKU-1", 10, "k1"))
        .await
        .unwrap();
    // Reservations arrive with the reservation core; hold units directly for now.
    app.db
        .execute("UPDATE stock SET reserved = 4 WHERE sku = 'SKU-1'", &[])
        .await
        .unwrap();

    let status = app
        .client
        .adjust_stock(adjust("SKU-1", -7, "k2"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let violations = status
        .get_details_precondition_failure()
        .unwrap()
        .violations;
    assert_eq!(violations[0].subject, "SKU-1");
    assert_eq!(violations[0].r#type, "STOCK_RESERVED");

    // Exactly down to the reserved units is allowed.
    let after = app
        .client
        .adjust_stock(adjust("SKU-1", -6, "k3"))
        .await
        .unwrap();
    assert_eq!(after.into_inner(), level("SKU-1", 4, 4, 2));
    assert_eq!(outbox_events(&app, "SKU-1").await.len(), 2);
}

#[tokio::test]
async fn on_hand_may_not_exceed_the_stock_limit() {
    let mut app = spawn_app().await;
    app.client
        .adjust_stock(adjust("SKU-1", 10, "k1"))
        .await
        .unwrap();
    let limit = inventory_core::domain::MAX_ON_HAND;
    app.db
        .execute(
            "UPDATE stock SET on_hand = $1::bigint - 5 WHERE sku = 'SKU-1'",
            &[&limit],
        )
        .await
        .unwrap();
    let status = app
        .client
        .adjust_stock(adjust("SKU-1", 6, "k2"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&status), "STOCK_LIMIT");
    let ok = app
        .client
        .adjust_stock(adjust("SKU-1", 5, "k3"))
        .await
        .unwrap();
    assert_eq!(ok.into_inner().on_hand, limit);
}

#[tokio::test]
async fn a_replayed_key_returns_the_stored_level_and_moves_stock_once() {
    let mut app = spawn_app().await;
    let first = app
        .client
        .adjust_stock(adjust("SKU-1", 10, "restock"))
        .await
        .unwrap();
    app.client
        .adjust_stock(adjust("SKU-1", 1, "other"))
        .await
        .unwrap();

    let replay = app
        .client
        .adjust_stock(adjust("SKU-1", 10, "restock"))
        .await
        .unwrap();
    // The outcome is the stored one (on_hand 10), not a fresh read (11).
    assert_eq!(replay.into_inner(), first.into_inner());
    let now = app
        .client
        .get_stock(get_stock(&["SKU-1"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(now.levels, [level("SKU-1", 11, 0, 2)]);
    assert_eq!(outbox_events(&app, "SKU-1").await.len(), 2);
}

#[tokio::test]
async fn a_replayed_failure_is_returned_as_stored() {
    let mut app = spawn_app().await;
    let first = app
        .client
        .adjust_stock(adjust("LATER", -1, "k1"))
        .await
        .unwrap_err();
    assert_eq!(first.code(), Code::NotFound);
    app.client
        .adjust_stock(adjust("LATER", 5, "k2"))
        .await
        .unwrap();

    let replay = app
        .client
        .adjust_stock(adjust("LATER", -1, "k1"))
        .await
        .unwrap_err();
    assert_eq!(replay.code(), Code::NotFound);
    let now = app
        .client
        .get_stock(get_stock(&["LATER"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(now.levels, [level("LATER", 5, 0, 1)]);
}

#[tokio::test]
async fn a_key_reused_for_a_different_request_is_already_exists_and_changes_nothing() {
    let mut app = spawn_app().await;
    app.client
        .adjust_stock(adjust("SKU-1", 10, "k1"))
        .await
        .unwrap();
    let before = app.row_counts().await;

    for different in [adjust("SKU-1", 11, "k1"), adjust("SKU-2", 10, "k1"), {
        let mut r = adjust("SKU-1", 10, "k1");
        r.reason = "other reason".into();
        r
    }] {
        let status = app.client.adjust_stock(different).await.unwrap_err();
        assert_eq!(status.code(), Code::AlreadyExists);
        assert_eq!(error_reason(&status), "IDEMPOTENCY_KEY_REUSED");
    }
    assert_eq!(app.row_counts().await, before);
    let now = app
        .client
        .get_stock(get_stock(&["SKU-1"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(now.levels, [level("SKU-1", 10, 0, 1)]);
}

#[tokio::test]
async fn concurrent_requests_with_one_key_execute_once() {
    let app = spawn_app().await;
    let calls = (0..20).map(|_| {
        let mut client = app.client.clone();
        async move { client.adjust_stock(adjust("SKU-1", 3, "same-key")).await }
    });
    let results = join_all(calls).await;
    for result in &results {
        assert_eq!(result.as_ref().unwrap().get_ref(), &level("SKU-1", 3, 0, 1));
    }
    assert_eq!(outbox_events(&app, "SKU-1").await.len(), 1);
    let keys: i64 = app.count("SELECT count(*) FROM idempotency_keys").await;
    assert_eq!(keys, 1);
}

#[tokio::test]
async fn concurrent_adjustments_with_distinct_keys_all_apply() {
    let app = spawn_app().await;
    let calls = (0..40).map(|i| {
        let mut client = app.client.clone();
        async move {
            client
                .adjust_stock(adjust("SKU-1", 1, &format!("k{i}")))
                .await
        }
    });
    for result in join_all(calls).await {
        result.unwrap();
    }
    let mut client = app.client.clone();
    let now = client
        .get_stock(get_stock(&["SKU-1"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(now.levels, [level("SKU-1", 40, 0, 40)]);
}

#[tokio::test]
async fn malformed_adjustments_are_invalid_argument_and_change_nothing() {
    let mut app = spawn_app().await;
    app.client
        .adjust_stock(adjust("SKU-1", 10, "seed"))
        .await
        .unwrap();
    let before = app.row_counts().await;

    let long = "x".repeat(200);
    let cases: Vec<(AdjustStockRequest, Vec<&str>)> = vec![
        (adjust("", 1, "k"), vec!["sku"]),
        (adjust(&"S".repeat(65), 1, "k"), vec!["sku"]),
        (adjust("bad sku", 1, "k"), vec!["sku"]),
        (adjust("{tag}", 1, "k"), vec!["sku"]),
        (adjust("SKU-1", 0, "k"), vec!["delta"]),
        (adjust("SKU-1", 1_000_000_001, "k"), vec!["delta"]),
        (adjust("SKU-1", i64::MIN, "k"), vec!["delta"]),
        (adjust("SKU-1", 1, ""), vec!["idempotency_key"]),
        (adjust("SKU-1", 1, &long), vec!["idempotency_key"]),
        (adjust("SKU-1", 1, "new\nline"), vec!["idempotency_key"]),
        (
            AdjustStockRequest {
                reason: "r".repeat(257),
                ..adjust("SKU-1", 1, "k")
            },
            vec!["reason"],
        ),
        (
            AdjustStockRequest {
                reason: "escape\u{1b}[31m".into(),
                ..adjust("SKU-1", 1, "k")
            },
            vec!["reason"],
        ),
        (adjust("", 0, ""), vec!["sku", "delta", "idempotency_key"]),
    ];
    for (request, fields) in cases {
        let status = app.client.adjust_stock(request.clone()).await.unwrap_err();
        assert_eq!(violated_fields(&status), fields, "for {request:?}");
    }
    assert_eq!(app.row_counts().await, before);
}

#[tokio::test]
async fn malformed_reads_are_invalid_argument() {
    let mut app = spawn_app().await;
    let too_many: Vec<String> = (0..101).map(|i| format!("S{i}")).collect();
    let cases: Vec<(GetStockRequest, Vec<&str>)> = vec![
        (get_stock(&[]), vec!["skus"]),
        (
            GetStockRequest {
                skus: too_many,
                ..Default::default()
            },
            vec!["skus"],
        ),
        (get_stock(&["A", ""]), vec!["skus[1]"]),
        (get_stock(&["A", "B", "A"]), vec!["skus[2]"]),
    ];
    for (request, fields) in cases {
        let status = app.client.get_stock(request.clone()).await.unwrap_err();
        assert_eq!(violated_fields(&status), fields, "for {request:?}");
    }
}

#[tokio::test]
async fn an_outcome_stored_before_stock_versions_still_replays() {
    use inventory_core::{
        command::AdjustStock,
        domain::{Caller, IdempotencyKey, LocationId, Reason, Sku, StockDelta},
    };
    let mut app = spawn_app().await;
    let command = AdjustStock {
        caller: Caller::anonymous(),
        sku: Sku::parse("OLD").unwrap(),
        delta: StockDelta::parse(3).unwrap(),
        idempotency_key: IdempotencyKey::parse("from-last-year").unwrap(),
        reason: Reason::parse("test").unwrap(),
        expected_version: None,
        location: LocationId::default_location(),
        state: None,
    };
    let fingerprint = command.fingerprint();
    let fingerprint: &[u8] = fingerprint.as_bytes();
    app.db
        .execute(
            "INSERT INTO idempotency_keys (caller, key, operation, fingerprint, outcome)
             VALUES ('', 'from-last-year', 'AdjustStock', $1,
                     '{\"outcome\": \"adjusted\", \"on_hand\": 3, \"reserved\": 0}')",
            &[&fingerprint],
        )
        .await
        .unwrap();
    let replay = app
        .client
        .adjust_stock(adjust("OLD", 3, "from-last-year"))
        .await
        .unwrap();
    assert_eq!(
        replay.into_inner(),
        level("OLD", 3, 0, 0),
        "version 0: unknown"
    );
}
