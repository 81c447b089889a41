//! Reservations: the last-unit race, lifecycle, idempotency, multi-line carts, expiry and the
//! outbox, against real PostgreSQL and Redis.

use std::{collections::HashSet, time::Duration};

use futures::future::join_all;
use inventory_core::pause::PausePoint;
use inventory_server::proto::{Reservation, ReservationState, ReserveRequest};
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::helpers::{
    TestApp, confirm, error_reason, get_reservation, release, reserve, spawn_app, spawn_app_with,
    spawn_app_without_sweeper, stock, test_settings, violated_fields,
};

/// `(event_type, reservation_id)` of every reservation event, in sequence order.
pub async fn reservation_events(app: &TestApp) -> Vec<(String, String)> {
    app.db
        .query(
            "SELECT event_type, reservation_id::text FROM outbox
             WHERE reservation_id IS NOT NULL ORDER BY sequence",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

pub async fn race(
    app: &TestApp,
    sku: &str,
    racers: usize,
) -> (Vec<Reservation>, Vec<tonic::Status>) {
    let calls = (0..racers).map(|i| {
        let mut client = app.client.clone();
        let request = reserve(&format!("racer-{i}"), &[(sku, 1)]);
        async move { client.reserve(request).await }
    });
    let (mut held, mut refused) = (Vec::new(), Vec::new());
    for result in join_all(calls).await {
        match result {
            Ok(response) => held.push(response.into_inner()),
            Err(status) => refused.push(status),
        }
    }
    (held, refused)
}

#[tokio::test]
async fn the_last_unit_goes_to_exactly_one_of_a_hundred_racers() {
    let app = spawn_app().await;
    stock(&app, "LAST-ONE", 1).await;
    let (held, refused) = race(&app, "LAST-ONE", 100).await;

    assert_eq!(held.len(), 1);
    assert_eq!(held[0].state(), ReservationState::Held);
    assert_eq!(refused.len(), 99);
    for status in &refused {
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert_eq!(error_reason(status), "INSUFFICIENT_STOCK");
    }
    assert_eq!(app.level("LAST-ONE").await, (1, 1));
}

#[tokio::test]
async fn ten_units_go_to_exactly_ten_of_a_hundred_racers() {
    let app = spawn_app().await;
    stock(&app, "TEN", 10).await;
    let (held, refused) = race(&app, "TEN", 100).await;

    assert_eq!(held.len(), 10, "{refused:?}");
    assert!(
        refused.iter().all(|s| s.code() == Code::FailedPrecondition),
        "{refused:?}"
    );
    assert_eq!(app.level("TEN").await, (10, 10));
    let ids: HashSet<_> = held.iter().map(|r| r.reservation_id.clone()).collect();
    assert_eq!(ids.len(), 10);
    // Every accepted write carried a newer fence than the one before it: in the order the
    // holds were applied (the SKU's version), fences never go back, and each transaction (a
    // batch of holds) has its own.
    let fences: Vec<i64> = app
        .db
        .query(
            "SELECT l.fence_token FROM reservation_lines l
             JOIN outbox o ON o.reservation_id = l.reservation_id
             WHERE l.sku = 'TEN'
             ORDER BY (o.payload->'levels'->0->>'version')::bigint",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(fences.len(), 10);
    assert!(fences.windows(2).all(|w| w[0] <= w[1]), "{fences:?}");
    assert_eq!(app.stored_fence("TEN").await, *fences.last().unwrap());
}

#[tokio::test]
async fn a_reservation_moves_through_its_lifecycle() {
    let mut app = spawn_app().await;
    stock(&app, "SKU-1", 10).await;
    let held = app.hold("k1", &[("SKU-1", 3)]).await;
    assert_eq!(held.state(), ReservationState::Held);
    assert_eq!(held.order_id, "order-k1");
    assert_eq!(app.level("SKU-1").await, (10, 3));
    let read = app
        .client
        .get_reservation(get_reservation(&held.reservation_id))
        .await
        .unwrap();
    assert_eq!(read.into_inner(), held);

    let confirmed = app
        .client
        .confirm_reservation(confirm(&held.reservation_id))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(confirmed.state(), ReservationState::Confirmed);
    assert_eq!(app.level("SKU-1").await, (7, 0));

    // Confirming again changes nothing; releasing a confirmed one is refused.
    let again = app
        .client
        .confirm_reservation(confirm(&held.reservation_id))
        .await
        .unwrap();
    assert_eq!(again.into_inner().state(), ReservationState::Confirmed);
    let refused = app
        .client
        .release_reservation(release(&held.reservation_id))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&refused), "INVALID_RESERVATION_STATE");
    assert!(refused.message().contains("CONFIRMED"), "{refused:?}");
    assert_eq!(app.level("SKU-1").await, (7, 0));

    let events = reservation_events(&app).await;
    let types: Vec<_> = events.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(types, ["RESERVATION_HELD", "RESERVATION_CONFIRMED"]);
}

#[tokio::test]
async fn a_released_reservation_returns_its_stock_once() {
    let mut app = spawn_app().await;
    stock(&app, "SKU-1", 5).await;
    let held = app.hold("k1", &[("SKU-1", 5)]).await;
    assert_eq!(app.level("SKU-1").await, (5, 5));

    for _ in 0..2 {
        let released = app
            .client
            .release_reservation(release(&held.reservation_id))
            .await
            .unwrap();
        assert_eq!(released.into_inner().state(), ReservationState::Released);
        assert_eq!(app.level("SKU-1").await, (5, 0));
    }
    let refused = app
        .client
        .confirm_reservation(confirm(&held.reservation_id))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    let types: Vec<_> = reservation_events(&app)
        .await
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    assert_eq!(types, ["RESERVATION_HELD", "RESERVATION_RELEASED"]);
}

#[tokio::test]
async fn unknown_skus_and_reservations_are_not_found() {
    let mut app = spawn_app().await;
    stock(&app, "REAL", 5).await;
    let status = app
        .client
        .reserve(reserve("k1", &[("REAL", 1), ("GHOST", 1)]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert!(status.message().contains("GHOST"));
    assert_eq!(app.level("REAL").await, (5, 0));

    let unknown = uuid::Uuid::new_v4().to_string();
    for status in [
        app.client
            .get_reservation(get_reservation(&unknown))
            .await
            .unwrap_err(),
        app.client
            .confirm_reservation(confirm(&unknown))
            .await
            .unwrap_err(),
        app.client
            .release_reservation(release(&unknown))
            .await
            .unwrap_err(),
    ] {
        assert_eq!(status.code(), Code::NotFound);
        assert_eq!(error_reason(&status), "RESERVATION_NOT_FOUND");
    }
}

/// A made-up SKU leaves no fence counter in Redis, but only a refusal decided now says a
/// SKU is unknown: the replay of a refusal stored before the SKU was created must leave the
/// SKU's live counter alone.
#[tokio::test]
async fn a_replayed_unknown_sku_refusal_keeps_the_fence_counter_of_a_sku_created_since() {
    let app = spawn_app().await;
    let early = || reserve("early", &[("LATER", 1)]);
    let refused = app.client.clone().reserve(early()).await.unwrap_err();
    assert_eq!(refused.code(), Code::NotFound);
    assert_eq!(
        app.redis_fence("LATER").await,
        0,
        "no counter for a made-up SKU"
    );

    stock(&app, "LATER", 5).await;
    app.hold("after", &[("LATER", 1)]).await;
    let counter = app.redis_fence("LATER").await;
    assert!(counter > 0);

    let replayed = app.client.clone().reserve(early()).await.unwrap_err();
    assert_eq!(
        replayed.code(),
        Code::NotFound,
        "the stored refusal, replayed"
    );
    assert!(
        app.redis_fence("LATER").await > counter,
        "the replay's lease took the next token and the counter stayed"
    );
    let stored = app.stored_fence("LATER").await;
    assert!(app.redis_fence("LATER").await >= stored);
    app.hold("later", &[("LATER", 1)]).await;
    assert_eq!(app.level("LATER").await, (5, 2));
}

#[tokio::test]
async fn a_replayed_key_returns_the_same_reservation_and_moves_stock_once() {
    let mut app = spawn_app().await;
    stock(&app, "SKU-1", 10).await;
    let first = app
        .client
        .reserve(reserve("k1", &[("SKU-1", 4)]))
        .await
        .unwrap();
    let replay = app
        .client
        .reserve(reserve("k1", &[("SKU-1", 4)]))
        .await
        .unwrap();
    assert_eq!(replay.into_inner(), first.into_inner());
    assert_eq!(app.level("SKU-1").await, (10, 4));
    assert_eq!(reservation_events(&app).await.len(), 1);
}

#[tokio::test]
async fn a_replayed_out_of_stock_answer_is_returned_as_stored() {
    let mut app = spawn_app().await;
    stock(&app, "SKU-1", 1).await;
    let first = app
        .client
        .reserve(reserve("k1", &[("SKU-1", 2)]))
        .await
        .unwrap_err();
    assert_eq!(first.code(), Code::FailedPrecondition);
    let violations = first.get_details_precondition_failure().unwrap().violations;
    assert_eq!(violations[0].subject, "SKU-1");
    assert_eq!(violations[0].description, "requested 2, available 1");

    stock(&app, "SKU-1", 5).await;
    let replay = app
        .client
        .reserve(reserve("k1", &[("SKU-1", 2)]))
        .await
        .unwrap_err();
    assert_eq!(replay.code(), Code::FailedPrecondition);
    assert_eq!(app.level("SKU-1").await, (6, 0));
    assert!(reservation_events(&app).await.is_empty());
}

#[tokio::test]
async fn a_key_reused_with_different_lines_is_already_exists() {
    let mut app = spawn_app().await;
    stock(&app, "SKU-1", 10).await;
    app.client
        .reserve(reserve("k1", &[("SKU-1", 1)]))
        .await
        .unwrap();
    let before = app.row_counts().await;
    let status = app
        .client
        .reserve(reserve("k1", &[("SKU-1", 2)]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);
    assert_eq!(app.row_counts().await, before);
    assert_eq!(app.level("SKU-1").await, (10, 1));
}

#[tokio::test]
async fn twenty_concurrent_requests_with_one_key_make_one_reservation() {
    let app = spawn_app().await;
    stock(&app, "SKU-1", 100).await;
    let calls = (0..20).map(|_| {
        let mut client = app.client.clone();
        async move { client.reserve(reserve("same", &[("SKU-1", 2)])).await }
    });
    let ids: HashSet<String> = join_all(calls)
        .await
        .into_iter()
        .map(|result| result.unwrap().into_inner().reservation_id)
        .collect();
    assert_eq!(ids.len(), 1);
    assert_eq!(app.level("SKU-1").await, (100, 2));
    let count: i64 = app.count("SELECT count(*) FROM reservations").await;
    assert_eq!(count, 1);
}

#[tokio::test]
async fn one_short_line_fails_the_whole_cart() {
    let mut app = spawn_app().await;
    stock(&app, "A", 5).await;
    stock(&app, "B", 1).await;
    stock(&app, "C", 5).await;
    let status = app
        .client
        .reserve(reserve("cart", &[("A", 2), ("B", 3), ("C", 9)]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let short: Vec<String> = status
        .get_details_precondition_failure()
        .unwrap()
        .violations
        .into_iter()
        .map(|v| v.subject)
        .collect();
    assert_eq!(short, ["B", "C"]);
    for sku in ["A", "B", "C"] {
        assert_eq!(app.level(sku).await.1, 0, "{sku} holds nothing");
    }
    let fence: i64 = app.stored_fence("A").await;
    assert_eq!(fence, 0, "a refused cart leaves no fence behind");
}

#[tokio::test]
async fn opposite_order_carts_under_concurrency_all_finish() {
    let app = spawn_app().await;
    for sku in ["X", "Y", "Z"] {
        stock(&app, sku, 1_000).await;
    }
    let carts = [
        vec![("X", 1), ("Y", 1), ("Z", 1)],
        vec![("Z", 1), ("Y", 1), ("X", 1)],
        vec![("Y", 1), ("X", 1)],
        vec![("Z", 1), ("X", 1)],
    ];
    let calls = (0..60).map(|i| {
        let mut client = app.client.clone();
        let request = reserve(&format!("cart-{i}"), &carts[i % carts.len()]);
        async move { client.reserve(request).await }
    });
    let results = tokio::time::timeout(Duration::from_secs(60), join_all(calls))
        .await
        .expect("no cart waits forever");
    for result in &results {
        assert!(result.is_ok(), "{result:?}");
    }
    let expected: i64 = (0..60).map(|i| carts[i % carts.len()].len() as i64).sum();
    let mut total = 0;
    for sku in ["X", "Y", "Z"] {
        total += app.level(sku).await.1;
    }
    assert_eq!(total, expected);
}

#[tokio::test]
async fn every_committed_change_has_exactly_one_event_and_refusals_none() {
    let mut app = spawn_app().await;
    stock(&app, "SKU-1", 3).await;
    let a = app.hold("a", &[("SKU-1", 2)]).await;
    let b = app.hold("b", &[("SKU-1", 1)]).await;
    // Refused, replayed and invalid calls commit no state change.
    app.client
        .reserve(reserve("c", &[("SKU-1", 1)]))
        .await
        .unwrap_err();
    app.client
        .reserve(reserve("a", &[("SKU-1", 2)]))
        .await
        .unwrap();
    app.client
        .reserve(reserve("", &[("SKU-1", 1)]))
        .await
        .unwrap_err();
    app.client
        .confirm_reservation(confirm(&a.reservation_id))
        .await
        .unwrap();
    app.client
        .confirm_reservation(confirm(&a.reservation_id))
        .await
        .unwrap();
    app.client
        .release_reservation(release(&b.reservation_id))
        .await
        .unwrap();
    app.client
        .release_reservation(release(&b.reservation_id))
        .await
        .unwrap();

    assert_eq!(
        reservation_events(&app).await,
        [
            ("RESERVATION_HELD".to_string(), a.reservation_id.clone()),
            ("RESERVATION_HELD".to_string(), b.reservation_id.clone()),
            (
                "RESERVATION_CONFIRMED".to_string(),
                a.reservation_id.clone()
            ),
            ("RESERVATION_RELEASED".to_string(), b.reservation_id.clone()),
        ]
    );
    let payload: serde_json::Value = app
        .db
        .query_one(
            "SELECT payload FROM outbox WHERE event_type = 'RESERVATION_CONFIRMED'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(payload["levels"][0]["on_hand"], 1);
    assert_eq!(payload["lines"][0]["quantity"], 2);
}

#[tokio::test]
async fn malformed_reservation_requests_are_invalid_argument_and_change_nothing() {
    let mut app = spawn_app().await;
    stock(&app, "SKU-1", 10).await;
    let before = app.row_counts().await;
    let ttl = |seconds, nanos| Some(prost_types::Duration { seconds, nanos });

    let cases: Vec<(ReserveRequest, Vec<&str>)> = vec![
        (reserve("", &[("SKU-1", 1)]), vec!["idempotency_key"]),
        (
            ReserveRequest {
                order_id: String::new(),
                ..reserve("k", &[("SKU-1", 1)])
            },
            vec!["order_id"],
        ),
        (reserve("k", &[]), vec!["lines"]),
        (reserve("k", &[("SKU-1", 0)]), vec!["lines[0].quantity"]),
        (reserve("k", &[("SKU-1", -5)]), vec!["lines[0].quantity"]),
        (
            reserve("k", &[("SKU-1", 1_000_001)]),
            vec!["lines[0].quantity"],
        ),
        (
            reserve("k", &[("SKU-1", 1), ("SKU-1", 1)]),
            vec!["lines[1].sku"],
        ),
        (reserve("k", &[("bad sku", 1)]), vec!["lines[0].sku"]),
        (
            ReserveRequest {
                ttl: ttl(0, 0),
                ..reserve("k", &[("SKU-1", 1)])
            },
            vec!["ttl"],
        ),
        (
            ReserveRequest {
                ttl: ttl(100_000, 0),
                ..reserve("k", &[("SKU-1", 1)])
            },
            vec!["ttl"],
        ),
        (
            ReserveRequest {
                ttl: ttl(-5, 0),
                ..reserve("k", &[("SKU-1", 1)])
            },
            vec!["ttl"],
        ),
    ];
    for (request, fields) in cases {
        let status = app.client.reserve(request.clone()).await.unwrap_err();
        assert_eq!(violated_fields(&status), fields, "for {request:?}");
    }
    let too_many: Vec<(String, i64)> = (0..101).map(|i| (format!("S{i}"), 1)).collect();
    let too_many: Vec<(&str, i64)> = too_many.iter().map(|(s, q)| (s.as_str(), *q)).collect();
    let status = app
        .client
        .reserve(reserve("k", &too_many))
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&status), ["lines"]);

    for bad in ["", "not-a-uuid", "0b7e5a4c3f1d4a9e9c2b6d8f0e1a2b3c"] {
        let statuses = [
            app.client
                .get_reservation(get_reservation(bad))
                .await
                .unwrap_err(),
            app.client
                .confirm_reservation(confirm(bad))
                .await
                .unwrap_err(),
            app.client
                .release_reservation(release(bad))
                .await
                .unwrap_err(),
        ];
        for status in statuses {
            assert_eq!(violated_fields(&status), ["reservation_id"], "for {bad:?}");
        }
    }
    assert_eq!(app.row_counts().await, before);
    assert_eq!(app.redis_fence("SKU-1").await, 0, "no lease was taken");
}

/// Moves a hold's expiry into the past, as if its TTL had run out.
async fn backdate(app: &TestApp, reservation_id: &str) {
    app.db
        .execute(
            "UPDATE reservations
             SET created_at = now() - interval '2 minutes', expires_at = now() - interval '1 minute'
             WHERE reservation_id = $1::text::uuid",
            &[&reservation_id],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_one_second_hold_expires_and_returns_its_stock() {
    let mut app = spawn_app().await;
    stock(&app, "SKU-1", 2).await;
    let mut request = reserve("k1", &[("SKU-1", 2)]);
    request.ttl = Some(prost_types::Duration {
        seconds: 1,
        nanos: 0,
    });
    let held = app.client.reserve(request).await.unwrap().into_inner();
    assert_eq!(app.level("SKU-1").await, (2, 2));

    // The background sweeper (every 100 ms here) returns the stock once the hold is over.
    inventory_testkit::eventually(
        "the sweeper returned the stock",
        Duration::from_secs(5),
        || async { app.level("SKU-1").await == (2, 0) },
    )
    .await
    .unwrap();
    let read = app
        .client
        .get_reservation(get_reservation(&held.reservation_id))
        .await
        .unwrap();
    assert_eq!(read.into_inner().state(), ReservationState::Expired);
    let types: Vec<_> = reservation_events(&app)
        .await
        .into_iter()
        .map(|(t, _)| t)
        .collect();
    assert_eq!(types, ["RESERVATION_HELD", "RESERVATION_EXPIRED"]);
}

#[tokio::test]
async fn a_hold_past_its_expiry_is_expired_for_every_reader_before_any_sweep() {
    let mut app = spawn_app_without_sweeper().await;
    stock(&app, "SKU-1", 2).await;
    let held = app.hold("k1", &[("SKU-1", 2)]).await;
    backdate(&app, &held.reservation_id).await;

    let read = app
        .client
        .get_reservation(get_reservation(&held.reservation_id))
        .await
        .unwrap();
    assert_eq!(read.into_inner().state(), ReservationState::Expired);
    let refused = app
        .client
        .confirm_reservation(confirm(&held.reservation_id))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert!(refused.message().contains("EXPIRED"), "{refused:?}");
    // Releasing it is a no-op: the sweeper owns returning its stock.
    let released = app
        .client
        .release_reservation(release(&held.reservation_id))
        .await
        .unwrap();
    assert_eq!(released.into_inner().state(), ReservationState::Expired);
    assert_eq!(app.level("SKU-1").await, (2, 2), "not swept yet");

    assert_eq!(app.inventory.expire_due(100).await.unwrap(), 1);
    assert_eq!(app.level("SKU-1").await, (2, 0));
}

#[tokio::test]
async fn two_sweepers_at_once_return_expired_stock_exactly_once() {
    let app = spawn_app_without_sweeper().await;
    stock(&app, "SKU-1", 60).await;
    let mut ids = Vec::new();
    for i in 0..60 {
        let held = app.hold(&format!("k{i}"), &[("SKU-1", 1)]).await;
        ids.push(held.reservation_id);
    }
    for id in &ids {
        backdate(&app, id).await;
    }
    assert_eq!(app.level("SKU-1").await, (60, 60));

    // Two replicas' sweepers, in small batches so that they overlap.
    let sweeper = |inventory: std::sync::Arc<inventory_server::Service>| async move {
        let mut total = 0;
        loop {
            let expired = inventory.expire_due(7).await.unwrap();
            if expired == 0 {
                return total;
            }
            total += expired;
        }
    };
    let (a, b) = tokio::join!(
        sweeper(app.inventory.clone()),
        sweeper(app.inventory.clone())
    );
    assert_eq!(a + b, 60);
    assert_eq!(app.level("SKU-1").await, (60, 0));
    let expired: i64 = app
        .count("SELECT count(*) FROM outbox WHERE event_type = 'RESERVATION_EXPIRED'")
        .await;
    assert_eq!(expired, 60);
}

#[tokio::test]
async fn the_oldest_overdue_hold_is_measured_until_a_sweep_returns_it() {
    let app = spawn_app_without_sweeper().await;
    stock(&app, "SKU-1", 5).await;
    let live = app.hold("live", &[("SKU-1", 1)]).await;
    assert_eq!(
        app.inventory.oldest_overdue().await.unwrap(),
        Duration::ZERO
    );
    let due = app.hold("due", &[("SKU-1", 1)]).await;
    backdate(&app, &due.reservation_id).await;
    // Backdated a minute past its expiry; the live hold does not count.
    let waited = app.inventory.oldest_overdue().await.unwrap();
    assert!(waited >= Duration::from_secs(60), "{waited:?}");
    assert!(waited < Duration::from_secs(120), "{waited:?}");

    assert_eq!(app.inventory.expire_due(100).await.unwrap(), 1);
    assert_eq!(
        app.inventory.oldest_overdue().await.unwrap(),
        Duration::ZERO
    );
    assert_eq!(app.level("SKU-1").await, (5, 1), "{live:?} still held");
}

/// Holds the stock row of `sku` locked on the test's own connection, as a writer in the
/// middle of its transaction does, until [`end_writer`].
async fn lock_stock_row(app: &TestApp, sku: &str) {
    app.db.batch_execute("BEGIN").await.unwrap();
    app.db
        .execute("SELECT 1 FROM stock WHERE sku = $1 FOR UPDATE", &[&sku])
        .await
        .unwrap();
}

async fn end_writer(app: &TestApp) {
    app.db.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn a_sweep_passes_a_sku_a_writer_holds_and_ends_its_holds_when_the_writer_is_done() {
    let app = spawn_app_without_sweeper().await;
    stock(&app, "SKU-1", 10).await;
    stock(&app, "SKU-2", 10).await;
    let mut ids = Vec::new();
    for (key, sku) in [("k1", "SKU-1"), ("k2", "SKU-2"), ("k3", "SKU-1")] {
        let held = app.hold(key, &[(sku, 2)]).await;
        backdate(&app, &held.reservation_id).await;
        ids.push(held.reservation_id);
    }
    lock_stock_row(&app, "SKU-1").await;

    let mut deferred = app.pauses.arm(PausePoint::ExpiryDeferred);
    let inventory = app.inventory.clone();
    let sweep = tokio::spawn(async move { inventory.expire_due(100).await });
    deferred.reached().await;
    // The first step did not wait for SKU-1: SKU-2's hold is back, SKU-1's are not yet.
    assert_eq!(app.level("SKU-2").await, (10, 0));
    assert_eq!(app.level("SKU-1").await, (10, 4));
    // A confirm racing the deferred expiry: the hold ran out, so the expiry is the one winner.
    let refused = app
        .client
        .clone()
        .confirm_reservation(confirm(&ids[0]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    deferred.resume();
    // The second step waits for SKU-1's row, like one more writer.
    inventory_testkit::eventually(
        "the sweep waits for SKU-1's row",
        Duration::from_secs(10),
        || async {
            app.count(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .await
                >= 1
        },
    )
    .await
    .unwrap();
    assert_eq!(app.level("SKU-1").await, (10, 4));
    end_writer(&app).await;

    assert_eq!(sweep.await.unwrap().unwrap(), 3);
    assert_eq!(app.level("SKU-1").await, (10, 0));
    let confirmed: i64 = app
        .count("SELECT count(*) FROM outbox WHERE event_type = 'RESERVATION_CONFIRMED'")
        .await;
    assert_eq!(confirmed, 0);
    let expired: i64 = app
        .count("SELECT count(*) FROM outbox WHERE event_type = 'RESERVATION_EXPIRED'")
        .await;
    assert_eq!(expired, 3);
}

#[tokio::test]
async fn a_hold_another_sweeper_expired_between_the_two_steps_is_expired_once() {
    let app = spawn_app_without_sweeper().await;
    stock(&app, "SKU-1", 10).await;
    let held = app.hold("k1", &[("SKU-1", 3)]).await;
    backdate(&app, &held.reservation_id).await;
    lock_stock_row(&app, "SKU-1").await;

    // Replica A's sweep finds the hold due but its SKU's row busy, and defers it.
    let mut deferred = app.pauses.arm(PausePoint::ExpiryDeferred);
    let inventory = app.inventory.clone();
    let sweep_a = tokio::spawn(async move { inventory.expire_due(100).await });
    deferred.reached().await;
    end_writer(&app).await;
    // Replica B's sweep, meanwhile, finds the row free and expires the hold.
    assert_eq!(app.inventory.expire_due(100).await.unwrap(), 1);
    deferred.resume();

    // A takes the hold again, judged at that moment: no longer held, so not expired twice.
    assert_eq!(sweep_a.await.unwrap().unwrap(), 0);
    assert_eq!(app.level("SKU-1").await, (10, 0));
    let expired: i64 = app
        .count("SELECT count(*) FROM outbox WHERE event_type = 'RESERVATION_EXPIRED'")
        .await;
    assert_eq!(expired, 1);
    let movements: i64 = app
        .count("SELECT count(*) FROM stock_movements WHERE kind = 'EXPIRED'")
        .await;
    assert_eq!(movements, 1);
}

#[tokio::test]
async fn one_sweep_gives_each_expiry_of_a_sku_its_own_level_and_version() {
    // Found by the fault suite: a sweep that expired several holds of one SKU gave each of
    // their events the level after the whole sweep, all with one version.
    let app = spawn_app_without_sweeper().await;
    stock(&app, "SKU-1", 10).await;
    for (key, units) in [("k1", 2), ("k2", 3)] {
        let held = app.hold(key, &[("SKU-1", units)]).await;
        backdate(&app, &held.reservation_id).await;
    }
    assert_eq!(app.level("SKU-1").await, (10, 5));

    assert_eq!(app.inventory.expire_due(100).await.unwrap(), 2);
    let rows = app
        .db
        .query(
            "SELECT (payload->'lines'->0->>'quantity')::bigint,
                    (payload->'levels'->0->>'reserved')::bigint,
                    (payload->'levels'->0->>'version')::bigint
             FROM outbox WHERE event_type = 'RESERVATION_EXPIRED' ORDER BY sequence",
            &[],
        )
        .await
        .unwrap();
    let expiries: Vec<(i64, i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    // Created at version 1, two holds (2, 3), then one version per expiry, each level the
    // one its own change left.
    let (first, second) = (expiries[0], expiries[1]);
    assert_eq!(expiries.len(), 2);
    assert_eq!((first.1, first.2), (5 - first.0, 4), "{expiries:?}");
    assert_eq!((second.1, second.2), (0, 5), "{expiries:?}");
    assert_eq!(app.level("SKU-1").await, (10, 0));
}

#[tokio::test]
async fn lines_come_in_byte_order_even_where_the_database_sorts_linguistically() {
    // A database whose default collation puts "apple" before "Banana" (byte order is the
    // other way round). Every writer must lock stock rows in one order, the byte order the
    // service sorts SKUs in; confirm and release take theirs from the stored lines.
    let name = format!("inventory_test_{}", uuid::Uuid::new_v4().simple());
    crate::helpers::connect(&crate::helpers::admin_config())
        .await
        .batch_execute(&format!(
            "CREATE DATABASE {name} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8'"
        ))
        .await
        .unwrap();
    let mut database = crate::helpers::admin_config();
    database.dbname(&name);
    inventory_postgres::migrate::run(&database).await.unwrap();
    let app = spawn_app_with(test_settings(database)).await;
    let sorted: String = app
        .db
        .query_one(
            "SELECT string_agg(s, ',' ORDER BY s) FROM unnest(ARRAY['apple', 'Banana']) s",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(sorted, "apple,Banana", "the database sorts linguistically");

    stock(&app, "apple", 5).await;
    stock(&app, "Banana", 5).await;
    let held = app.hold("cart", &[("apple", 1), ("Banana", 2)]).await;
    let read = app
        .client
        .clone()
        .get_reservation(get_reservation(&held.reservation_id))
        .await
        .unwrap()
        .into_inner();
    let skus: Vec<&str> = read.lines.iter().map(|l| l.sku.as_str()).collect();
    assert_eq!(skus, ["Banana", "apple"]);
    let held_skus: Vec<&str> = held.lines.iter().map(|l| l.sku.as_str()).collect();
    assert_eq!(held_skus, skus, "reads and writes agree on the order");
}
