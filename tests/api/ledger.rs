//! Stock control: the ledger every level change writes, `verify` finding drift made behind the
//! service's back, compare-and-set counts and adjustments, and the availability events.

use futures::future::join_all;
use inventory_server::proto::{
    AdjustStockRequest, BatchSetStockRequest, CancelOrderRequest, ConfirmReservationRequest,
    EventType, ListStockMovementsRequest, MovementKind, ReservationLine, SetStockRequest,
    StockMovement,
};
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::{
    events::{take, watch},
    helpers::{
        TestApp, confirm, error_reason, release, set_stock, spawn_app, stock, violated_fields,
    },
};

async fn movements(app: &TestApp, sku: &str) -> Vec<StockMovement> {
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let page = app
            .client
            .clone()
            .list_stock_movements(ListStockMovementsRequest {
                sku: sku.into(),
                page_size: 2,
                page_token: token,
                after_version: 0,
            })
            .await
            .unwrap()
            .into_inner();
        all.extend(page.movements);
        if page.next_page_token.is_empty() {
            return all;
        }
        token = page.next_page_token;
    }
}

#[tokio::test]
async fn every_change_of_a_level_is_one_movement_and_they_add_up_to_it() {
    let mut app = spawn_app().await;
    stock(&app, "MUG", 10).await;
    let held = app.hold("order", &[("MUG", 4)]).await;
    app.client
        .confirm_reservation(ConfirmReservationRequest {
            reservation_id: held.reservation_id.clone(),
            lines: vec![ReservationLine {
                sku: "MUG".into(),
                quantity: 1,
                ..Default::default()
            }],
            idempotency_key: "ship-1".into(),
        })
        .await
        .unwrap();
    app.client
        .release_reservation(release(&held.reservation_id))
        .await
        .unwrap();
    let second = app.hold("second", &[("MUG", 2)]).await;
    app.client
        .cancel_order(CancelOrderRequest {
            order_id: "order-second".into(),
            idempotency_key: "cancel".into(),
            reason: "changed mind".into(),
        })
        .await
        .unwrap();
    app.client
        .set_stock(set_stock("MUG", 20, Some(6), "count-1"))
        .await
        .unwrap();

    // A count that finds what is stored changes nothing: no version, event or movement.
    let events = app.count("SELECT count(*) FROM outbox").await;
    let same = app
        .client
        .set_stock(set_stock("MUG", 20, None, "count-2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((same.on_hand, same.version), (20, 7));
    assert_eq!(app.count("SELECT count(*) FROM outbox").await, events);

    let ledger = movements(&app, "MUG").await;
    let kinds: Vec<MovementKind> = ledger.iter().map(|m| m.kind()).collect();
    assert_eq!(
        kinds,
        [
            MovementKind::Adjusted,
            MovementKind::Held,
            MovementKind::Confirmed,
            MovementKind::Released,
            MovementKind::Held,
            MovementKind::Released,
            MovementKind::Set,
        ]
    );
    let versions: Vec<i64> = ledger.iter().map(|m| m.version).collect();
    assert_eq!(
        versions,
        (1..=7).collect::<Vec<_>>(),
        "one movement per version"
    );
    let (mut on_hand, mut reserved) = (0, 0);
    for m in &ledger {
        on_hand += m.on_hand_delta;
        reserved += m.reserved_delta;
        let level = m.level.as_ref().unwrap();
        assert_eq!(
            (level.on_hand, level.reserved),
            (on_hand, reserved),
            "{m:?}"
        );
    }
    assert_eq!((on_hand, reserved), app.level("MUG").await);
    assert_eq!((on_hand, reserved), (20, 0));
    // Who, why and what for.
    assert_eq!(ledger[2].reservation_id, held.reservation_id);
    assert_eq!(ledger[2].idempotency_key, "ship-1");
    assert_eq!(
        (ledger[2].on_hand_delta, ledger[2].reserved_delta),
        (-1, -1)
    );
    assert_eq!(ledger[5].reservation_id, second.reservation_id);
    assert_eq!(ledger[5].reason, "changed mind");
    assert_eq!(ledger[5].order_id, "order-second");
    assert_eq!(ledger[6].reason, "cycle count");
    assert_eq!(ledger[6].on_hand_delta, 11, "counted 20 where 9 were");

    // Paging resumes after a version; tokens are bound to their request.
    let later = app
        .client
        .list_stock_movements(ListStockMovementsRequest {
            sku: "MUG".into(),
            after_version: 5,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(later.movements, ledger[5..]);
    let first = app
        .client
        .list_stock_movements(ListStockMovementsRequest {
            sku: "MUG".into(),
            page_size: 2,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let foreign = app
        .client
        .list_stock_movements(ListStockMovementsRequest {
            sku: "CAP".into(),
            page_token: first.next_page_token,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&foreign), ["page_token"]);
    let unknown = app
        .client
        .list_stock_movements(ListStockMovementsRequest {
            sku: "NOPE".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);

    let (ok, out) = app.verify().await;
    assert!(ok, "{out}");
    assert!(out.contains("0 drift(s)"), "{out}");
}

#[tokio::test]
async fn verify_names_every_drift_made_behind_the_services_back() {
    let app = spawn_app().await;
    for sku in ["A", "B", "C", "D"] {
        stock(&app, sku, 5).await;
    }
    app.hold("k", &[("C", 2)]).await;
    app.hold("l", &[("D", 1)]).await;
    let (ok, out) = app.verify().await;
    assert!(
        ok && out.contains("verified 4 SKUs and 6 movements"),
        "{out}"
    );

    // A: a total changed by hand. B: a movement lost. C: reserved units nobody holds, at a
    // location. D: a hold's line edited, so its units no longer match reserved.
    app.db
        .batch_execute(
            "UPDATE stock SET on_hand = on_hand + 1 WHERE sku = 'A';
             DELETE FROM stock_movements WHERE sku = 'B';
             UPDATE stock_locations SET reserved = reserved + 1 WHERE sku = 'C';
             UPDATE reservation_lines SET released = 1 WHERE sku = 'D';",
        )
        .await
        .unwrap();
    let (ok, out) = app.verify().await;
    assert!(!ok, "drift fails the command: {out}");
    for expected in [
        "drift A: the total says 6/0 at version 1; its locations sum to 5/0 and its last \
         movement is version 1",
        "drift B: a stock row at default with no movements",
        "drift B: the total says 5/0 at version 1; its locations sum to 5/0 and its last \
         movement is version none",
        "drift C: at default the row says 5/3 at version 2, the ledger 5/2 at version 2",
        "drift C: the total says 5/2 at version 2; its locations sum to 5/3",
        "drift C: at default reserved is 3, live holds hold 2",
        "drift D: at default reserved is 1, live holds hold 0",
    ] {
        assert!(out.contains(expected), "missing {expected:?} in:\n{out}");
    }
    assert!(out.contains("7 drift(s)"), "{out}");
}

#[tokio::test]
async fn a_count_or_adjustment_at_a_stale_version_changes_nothing() {
    let mut app = spawn_app().await;
    // Creating with expected version 0 (no such SKU yet).
    let created = app
        .client
        .set_stock(set_stock("MUG", 10, Some(0), "count-0"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((created.on_hand, created.version), (10, 1));

    // Two counts taken at version 1 race: exactly one wins.
    let calls = (0..2).map(|i| {
        let mut client = app.client.clone();
        async move {
            client
                .set_stock(set_stock(
                    "MUG",
                    20 + i,
                    Some(1),
                    &format!("count-{}", i + 1),
                ))
                .await
        }
    });
    let results = join_all(calls).await;
    let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    let winner = winners[0].get_ref().clone();
    let loser = results.iter().find_map(|r| r.as_ref().err()).unwrap();
    assert_eq!(loser.code(), Code::Aborted, "{loser:?}");
    assert_eq!(error_reason(loser), "VERSION_MISMATCH");
    let info = loser.get_details_error_info().unwrap();
    assert_eq!(info.metadata["current_version"], "2");
    assert_eq!(info.metadata["expected_version"], "1");
    // The winner's key replays its answer.
    let key = format!("count-{}", winner.on_hand - 19);
    let replay = app
        .client
        .set_stock(set_stock("MUG", winner.on_hand, Some(1), &key))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay, winner);

    // An adjustment against the right version applies; against a stale one it does not.
    let adjust = |delta: i64, expected: i64, key: &str| AdjustStockRequest {
        sku: "MUG".into(),
        delta,
        idempotency_key: key.into(),
        reason: String::new(),
        expected_version: Some(expected),
        ..Default::default()
    };
    let stale = app
        .client
        .adjust_stock(adjust(5, 1, "adj-1"))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&stale), "VERSION_MISMATCH");
    let applied = app
        .client
        .adjust_stock(adjust(5, 2, "adj-2"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((applied.on_hand, applied.version), (winner.on_hand + 5, 3));
    // A stale key replays its refusal: versions only grow, so it stays refused.
    let again = app
        .client
        .adjust_stock(adjust(5, 1, "adj-1"))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&again), "VERSION_MISMATCH");

    // A count below what is held names the reserved units.
    app.hold("k", &[("MUG", 4)]).await;
    let below = app
        .client
        .set_stock(set_stock("MUG", 3, None, "count-low"))
        .await
        .unwrap_err();
    assert_eq!(below.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&below), "BELOW_RESERVED");
    assert_eq!(
        below.get_details_error_info().unwrap().metadata["reserved"],
        "4"
    );
    let bad = app
        .client
        .set_stock(SetStockRequest {
            on_hand: -1,
            expected_version: Some(-2),
            ..set_stock("bad sku", 0, None, "")
        })
        .await
        .unwrap_err();
    assert_eq!(
        violated_fields(&bad),
        ["idempotency_key", "sku", "on_hand", "expected_version"]
    );
    assert_eq!(app.level("MUG").await, (winner.on_hand + 5, 4));
    let (ok, out) = app.verify().await;
    assert!(ok, "{out}");
}

#[tokio::test]
async fn out_of_stock_and_back_in_stock_come_at_the_crossings_in_commit_order() {
    let mut app = spawn_app().await;
    stock(&app, "LAST", 2).await;
    let mut stream = watch(&app, 0).await;
    let first = app.hold("a", &[("LAST", 1)]).await;
    let second = app.hold("b", &[("LAST", 1)]).await;
    app.client
        .release_reservation(release(&second.reservation_id))
        .await
        .unwrap();
    app.client
        .confirm_reservation(confirm(&first.reservation_id))
        .await
        .unwrap();
    // Confirming a held unit changes no availability; counting to zero does.
    app.client
        .set_stock(set_stock("LAST", 0, None, "count"))
        .await
        .unwrap();
    let events = take(&mut stream, 8).await;
    let types: Vec<EventType> = events.iter().map(|e| e.r#type()).collect();
    assert_eq!(
        types,
        [
            EventType::StockAdjusted,
            EventType::ReservationHeld,
            EventType::ReservationHeld,
            EventType::OutOfStock,
            EventType::ReservationReleased,
            EventType::BackInStock,
            EventType::ReservationConfirmed,
            EventType::StockAdjusted,
        ]
    );
    let more = take(&mut stream, 1).await;
    assert_eq!(more[0].r#type(), EventType::OutOfStock);
    let level = match &more[0].payload {
        Some(inventory_server::proto::event::Payload::Availability(a)) => a.level.clone().unwrap(),
        other => panic!("{other:?}"),
    };
    assert_eq!((level.on_hand, level.available, level.version), (0, 0, 6));
}

async fn events(app: &TestApp) -> i64 {
    app.count("SELECT count(*) FROM outbox").await
}

fn batch(key: &str, counts: &[(String, i64, Option<i64>)]) -> BatchSetStockRequest {
    BatchSetStockRequest {
        idempotency_key: key.into(),
        requests: counts
            .iter()
            .map(|(sku, on_hand, expected)| SetStockRequest {
                sku: sku.clone(),
                on_hand: *on_hand,
                expected_version: *expected,
                idempotency_key: String::new(),
                reason: "erp sync".into(),
                ..Default::default()
            })
            .collect(),
    }
}

#[tokio::test]
async fn a_batch_of_counts_is_all_or_nothing_with_one_event_and_movement_per_change() {
    let mut app = spawn_app().await;
    let skus: Vec<String> = (0..1_000).map(|i| format!("ERP-{i:04}")).collect();
    let first: Vec<_> = skus.iter().map(|s| (s.clone(), 10, None)).collect();
    let created = app
        .client
        .batch_set_stock(batch("sync-1", &first))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.levels.len(), 1_000);
    assert!(
        created
            .levels
            .iter()
            .all(|l| l.on_hand == 10 && l.version == 1)
    );
    assert_eq!(events(&app).await, 1_000);

    // 1,000 counts, ten of which find what is stored.
    let second: Vec<_> = skus
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), if i % 100 == 0 { 10 } else { 20 }, Some(1)))
        .collect();
    let synced = app
        .client
        .batch_set_stock(batch("sync-2", &second))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(synced.levels[0].version, 1, "unchanged: no new version");
    assert_eq!(
        (synced.levels[1].on_hand, synced.levels[1].version),
        (20, 2)
    );
    assert_eq!(events(&app).await, 1_990);
    assert_eq!(
        app.count("SELECT count(*) FROM stock_movements").await,
        1_990
    );
    let replay = app
        .client
        .batch_set_stock(batch("sync-2", &second))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay, synced);
    assert_eq!(events(&app).await, 1_990);

    // One stale entry refuses the batch: nothing changes.
    app.hold("k", &[("ERP-0003", 5)]).await;
    let before = (events(&app).await, app.level("ERP-0001").await);
    let stale = vec![
        ("ERP-0001".to_string(), 30, None),
        ("ERP-0002".to_string(), 30, Some(1)),
        ("NEW-SKU".to_string(), 30, None),
    ];
    let refused = app
        .client
        .batch_set_stock(batch("sync-3", &stale))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&refused), "VERSION_MISMATCH");
    assert!(refused.message().contains("ERP-0002"), "{refused:?}");
    let below = vec![("ERP-0003".to_string(), 4, None)];
    let refused = app
        .client
        .batch_set_stock(batch("sync-4", &below))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&refused), "BELOW_RESERVED");
    assert_eq!((events(&app).await, app.level("ERP-0001").await), before);
    assert_eq!(
        app.count("SELECT count(*) FROM stock WHERE sku = 'NEW-SKU'")
            .await,
        0
    );

    // Every bad field is named, and nothing is looked at.
    let malformed = vec![
        ("ERP-0001".to_string(), 1, None),
        ("ERP-0002".to_string(), -1, None),
        ("ERP-0001".to_string(), 1, None),
        ("bad sku".to_string(), 1, Some(-1)),
    ];
    let invalid = app
        .client
        .batch_set_stock(batch("sync-5", &malformed))
        .await
        .unwrap_err();
    assert_eq!(
        violated_fields(&invalid),
        [
            "requests[1].on_hand",
            "requests[2].sku",
            "requests[3].sku",
            "requests[3].expected_version"
        ]
    );
    let (ok, out) = app.verify().await;
    assert!(ok, "{out}");
}

#[tokio::test]
async fn a_pruned_ledger_keeps_each_skus_latest_movement_and_still_verifies() {
    let app = spawn_app().await;
    stock(&app, "OLD", 5).await;
    app.hold("a", &[("OLD", 1)]).await;
    app.hold("b", &[("OLD", 1)]).await;
    let pruned = app
        .store
        .prune(&crate::helpers::ledger_only_retention(), 100)
        .await
        .unwrap();
    assert_eq!(pruned.movements, 2, "all but the latest");
    let kept = movements(&app, "OLD").await;
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].version, 3);
    let (ok, out) = app.verify().await;
    assert!(ok, "{out}");

    // A movement lost after pruning is still told from a pruned one.
    app.hold("c", &[("OLD", 1)]).await;
    app.db
        .execute(
            "DELETE FROM stock_movements WHERE sku = 'OLD' AND version = 3",
            &[],
        )
        .await
        .unwrap();
    let (ok, out) = app.verify().await;
    assert!(!ok);
    assert!(
        out.contains("drift OLD: pruned through version 2, yet the ledger resumes at version 4"),
        "{out}"
    );
}

#[tokio::test]
async fn batches_racing_to_create_a_sku_leave_nothing_of_the_refused_one() {
    let app = spawn_app().await;
    for round in 0..5 {
        let (a, shared, b) = (
            format!("N{round}-1"),
            format!("N{round}-2"),
            format!("N{round}-3"),
        );
        let first = batch(
            &format!("first-{round}"),
            &[(a.clone(), 5, Some(0)), (shared.clone(), 5, Some(0))],
        );
        let second = batch(
            &format!("second-{round}"),
            &[(shared.clone(), 7, Some(0)), (b.clone(), 7, Some(0))],
        );
        let (mut c1, mut c2) = (app.client.clone(), app.client.clone());
        let (r1, r2) = tokio::join!(c1.batch_set_stock(first), c2.batch_set_stock(second));
        assert!(
            r1.is_ok() != r2.is_ok(),
            "exactly one creates {shared}: {r1:?} {r2:?}"
        );
        let (loser, only_loser) = if r1.is_ok() { (&r2, &b) } else { (&r1, &a) };
        assert_eq!(
            error_reason(loser.as_ref().unwrap_err()),
            "VERSION_MISMATCH"
        );
        assert_eq!(
            app.count(&format!(
                "SELECT count(*) FROM stock WHERE sku = '{only_loser}'"
            ))
            .await,
            0,
            "the refused batch created nothing"
        );
    }
    let (ok, out) = app.verify().await;
    assert!(ok, "{out}");
}
