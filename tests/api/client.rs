//! The client crate against the real server: retries through a Redis outage with one key,
//! the outcome left unknown when the budget is too short (and settled by a retry with the
//! key), refusals that are never retried, and the order saga example.

use std::time::{Duration, Instant};

use inventory_client::{ClientConfig, Error, InventoryClient, RetryPolicy};
use inventory_server::proto::{ReservationLine, ReservationState, ReserveRequest};
use inventory_testkit::redis::RedisNode;

use crate::helpers::{
    TestApp, fresh_database, get_reservation, get_stock, spawn_app, spawn_app_with, stock,
    test_settings_with_redis,
};

#[allow(dead_code)]
#[path = "../../examples/order_saga.rs"]
mod order_saga;

#[allow(dead_code)]
#[path = "../../examples/fulfilment_feed.rs"]
mod fulfilment_feed;

fn client(app: &TestApp, budget: Duration) -> InventoryClient {
    InventoryClient::connect_lazy(ClientConfig {
        endpoint: format!("http://{}", app.addr),
        retry: RetryPolicy {
            budget,
            ..RetryPolicy::default()
        },
        ..ClientConfig::default()
    })
    .unwrap()
}

fn order(key: &str, order_id: &str, sku: &str, quantity: i64) -> ReserveRequest {
    ReserveRequest {
        idempotency_key: key.into(),
        order_id: order_id.into(),
        lines: vec![ReservationLine {
            sku: sku.into(),
            quantity,
            ..Default::default()
        }],
        ttl: None,
        ..Default::default()
    }
}

async fn reservations_of(app: &TestApp, order_id: &str) -> i64 {
    app.db
        .query_one(
            "SELECT count(*) FROM reservations WHERE order_id = $1",
            &[&order_id],
        )
        .await
        .unwrap()
        .get(0)
}

/// An app on a Redis of its own, which the test can kill and restart.
async fn app_with_own_redis() -> (TestApp, RedisNode) {
    let redis = RedisNode::start_scratch().await.unwrap();
    let app = spawn_app_with(test_settings_with_redis(
        fresh_database().await,
        &redis.url(),
    ))
    .await;
    (app, redis)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_retried_through_a_two_second_redis_outage_holds_once() {
    let (app, mut redis) = app_with_own_redis().await;
    stock(&app, "SKU-1", 10).await;
    redis.kill().await.unwrap();
    let client = client(&app, Duration::from_secs(10));
    let call = tokio::spawn(async move { client.reserve(order("k-1", "o-1", "SKU-1", 2)).await });
    // Redis stays down for 2 s of the call's attempts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !call.is_finished(),
        "the call kept retrying while Redis was down"
    );
    redis.restart().await.unwrap();

    let reservation = call.await.unwrap().expect("reserved once Redis was back");
    assert_eq!(reservation.state(), ReservationState::Held);
    assert_eq!(reservations_of(&app, "o-1").await, 1);
    assert_eq!(app.level("SKU-1").await, (10, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_short_budget_the_outcome_is_unknown_and_a_retry_with_the_key_settles_it() {
    let (app, mut redis) = app_with_own_redis().await;
    stock(&app, "SKU-1", 10).await;
    redis.kill().await.unwrap();

    let started = Instant::now();
    let error = client(&app, Duration::from_secs(1))
        .reserve(order("k-2", "o-2", "SKU-1", 3))
        .await
        .unwrap_err();
    let took = started.elapsed();
    match &error {
        Error::OutcomeUnknown {
            idempotency_key,
            attempts,
            last,
        } => {
            assert_eq!(idempotency_key.as_deref(), Some("k-2"));
            assert!(*attempts >= 2, "retried within the budget: {error:?}");
            assert_eq!(last.code(), tonic::Code::Unavailable);
        }
        other => panic!("expected OutcomeUnknown, got {other:?}"),
    }
    assert!(
        took < Duration::from_millis(1500),
        "kept to its budget: {took:?}"
    );

    // Later, with Redis back: the same key settles it, once.
    redis.restart().await.unwrap();
    let settled = client(&app, Duration::from_secs(10))
        .reserve(order("k-2", "o-2", "SKU-1", 3))
        .await
        .unwrap();
    assert_eq!(settled.state(), ReservationState::Held);
    assert_eq!(reservations_of(&app, "o-2").await, 1);
    assert_eq!(app.level("SKU-1").await, (10, 3));
}

#[tokio::test]
async fn refusals_and_invalid_requests_are_answered_at_once_and_say_why() {
    let app = spawn_app().await;
    stock(&app, "SKU-1", 1).await;
    let client = client(&app, Duration::from_secs(10));

    let started = Instant::now();
    let refused = client
        .reserve(order("k-3", "o-3", "SKU-1", 5))
        .await
        .unwrap_err();
    assert_eq!(refused.reason(), Some("INSUFFICIENT_STOCK"), "{refused:?}");
    let invalid = client
        .reserve(order("k-4", "o-4", "SKU-1", 0))
        .await
        .unwrap_err();
    match &invalid {
        Error::Invalid { violations, .. } => {
            assert_eq!(violations[0].field, "lines[0].quantity", "{invalid:?}");
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    let unknown = client
        .get_reservation(get_reservation(&uuid::Uuid::new_v4().to_string()))
        .await
        .unwrap_err();
    assert_eq!(
        unknown.reason(),
        Some("RESERVATION_NOT_FOUND"),
        "{unknown:?}"
    );
    // Not retried: well inside the first backoff steps of a 10 s budget.
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(app.level("SKU-1").await, (1, 0));
}

#[tokio::test]
async fn a_request_without_a_key_is_sent_with_a_uuid_v7_key() {
    let app = spawn_app().await;
    stock(&app, "SKU-1", 5).await;
    let client = client(&app, Duration::from_secs(10));
    let reservation = client.reserve(order("", "o-5", "SKU-1", 1)).await.unwrap();
    let key: String = app
        .db
        .query_one(
            "SELECT idempotency_key FROM reservations WHERE reservation_id = $1::text::uuid",
            &[&reservation.reservation_id],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(uuid::Uuid::parse_str(&key).unwrap().get_version_num(), 7);
}

/// The stock-state calls through the client kit: a policy, a state move, a receipt expected,
/// a pre-order pegged to it, received (filling the pre-order), listed; keys generated when
/// none is given, so a retried receive never counts twice.
#[tokio::test]
async fn the_client_drives_stock_states_and_receipts_with_generated_keys() {
    use inventory_server::proto::{
        CancelReceiptRequest, ExpectStockRequest, ListReceiptsRequest, MoveStockStateRequest,
        ReceiptState, ReceiveStockRequest, SetStockPolicyRequest, StockState,
    };
    let app = spawn_app().await;
    stock(&app, "KIT", 3).await;
    let client = client(&app, Duration::from_secs(10));
    let level = client
        .set_stock_policy(SetStockPolicyRequest {
            sku: "KIT".into(),
            backorder_limit: Some(2),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(level.backorder_limit, 2);
    let level = client
        .move_stock_state(MoveStockStateRequest {
            sku: "KIT".into(),
            quantity: 1,
            from_state: StockState::Sellable.into(),
            to_state: StockState::Damaged.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!((level.damaged, level.available), (1, 2));
    let receipt = client
        .expect_stock(ExpectStockRequest {
            receipt_id: "PO-K1".into(),
            sku: "KIT".into(),
            quantity: 4,
            expected_at: Some(crate::helpers::december(14)),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (receipt.state(), receipt.remainder),
        (ReceiptState::Open, 4)
    );
    let preorder = client
        .reserve(ReserveRequest {
            allow_preorder: true,
            ..order("", "o-k", "KIT", 5)
        })
        .await
        .unwrap();
    assert_eq!(
        (preorder.lines[0].held, preorder.lines[0].preordered),
        (2, 3)
    );
    let received = client
        .receive_stock(ReceiveStockRequest {
            receipt_id: "PO-K1".into(),
            quantity: 4,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        (received.state(), received.preordered),
        (ReceiptState::Received, 0)
    );
    let refused = client
        .cancel_receipt(CancelReceiptRequest {
            receipt_id: "PO-K1".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(refused, Error::Refused { .. }), "{refused:?}");
    let listed = client
        .list_receipts(ListReceiptsRequest {
            sku: "KIT".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.receipts.len(), 1);
    let held = app.reservation(&preorder.reservation_id).await;
    assert_eq!((held.lines[0].held, held.lines[0].preordered), (5, 0));
    let level = app.total("KIT").await;
    assert_eq!((level.on_hand, level.reserved, level.incoming), (7, 5, 0));
}

#[tokio::test]
async fn the_order_saga_confirms_a_paid_order_and_compensates_the_others() {
    use order_saga::{Payment, SagaOutcome, run_saga};
    let app = spawn_app().await;
    stock(&app, "MUG", 3).await;
    let client = client(&app, Duration::from_secs(10));

    let paid = run_saga(&client, "paid", &[("MUG", 2)], async |_| Payment::Approved)
        .await
        .unwrap();
    let SagaOutcome::Confirmed(confirmed) = paid else {
        panic!("{paid:?}")
    };
    assert_eq!(confirmed.state(), ReservationState::Confirmed);
    assert_eq!(app.level("MUG").await, (1, 0), "two units sold");

    let declined = run_saga(&client, "declined", &[("MUG", 1)], async |_| {
        Payment::Declined
    })
    .await
    .unwrap();
    assert!(
        matches!(declined, SagaOutcome::Compensated { released: 1, .. }),
        "{declined:?}"
    );
    assert_eq!(
        app.level("MUG").await,
        (1, 0),
        "the declined hold was released"
    );

    let sold_out = run_saga(&client, "late", &[("MUG", 2)], async |_| Payment::Approved)
        .await
        .unwrap();
    assert!(
        matches!(&sold_out, SagaOutcome::Refused { reason } if reason == "INSUFFICIENT_STOCK"),
        "{sold_out:?}"
    );

    // Run again after a crash, the saga repeats its steps without acting twice.
    let again = run_saga(&client, "paid", &[("MUG", 2)], async |_| Payment::Approved)
        .await
        .unwrap();
    assert!(matches!(again, SagaOutcome::Confirmed(_)), "{again:?}");
    assert_eq!(app.level("MUG").await, (1, 0));
}

/// The subscription consumer of `examples/fulfilment_feed.rs`: it sees only the confirmations
/// of its SKUs, and after a stop it resumes right after the last one it handled.
#[tokio::test]
async fn the_fulfilment_feed_resumes_after_what_it_handled() {
    use fulfilment_feed::{confirmations, follow};
    let app = spawn_app().await;
    stock(&app, "DEMO-MUG", 10).await;
    stock(&app, "OTHER", 10).await;
    let client = client(&app, Duration::from_secs(10));
    client
        .create_subscription("fulfilment", confirmations("DEMO-"), false)
        .await
        .unwrap();
    let confirm_order = |order: &'static str, sku: &'static str| {
        let client = client.clone();
        async move {
            let held = client
                .reserve(crate::helpers::reserve(order, &[(sku, 1)]))
                .await
                .unwrap();
            client
                .confirm_reservation(crate::helpers::confirm(&held.reservation_id))
                .await
                .unwrap();
            held.reservation_id
        }
    };
    let first = confirm_order("f-1", "DEMO-MUG").await;
    confirm_order("f-other", "OTHER").await;
    let second = confirm_order("f-2", "DEMO-MUG").await;
    let reservation = |event: &inventory_server::proto::Event| match &event.subject {
        Some(inventory_server::proto::event::Subject::ReservationId(id)) => id.clone(),
        other => panic!("{other:?}"),
    };
    let mut handled = Vec::new();
    follow(
        &client,
        "fulfilment",
        confirmations("DEMO-"),
        async |event| {
            handled.push(reservation(event));
            handled.len() < 2
        },
    )
    .await
    .unwrap();
    assert_eq!(handled, [first, second.clone()]);

    let third = confirm_order("f-3", "DEMO-MUG").await;
    let mut resumed = Vec::new();
    follow(
        &client,
        "fulfilment",
        confirmations("DEMO-"),
        async |event| {
            resumed.push(reservation(event));
            false
        },
    )
    .await
    .unwrap();
    assert_eq!(resumed, [third], "nothing handled comes again");
}

/// `deploy/grpc/service-config.json` retries, for clients in other languages, what the Rust
/// client retries: no method is missing, and no code it lists is one the Rust client would
/// give up on.
#[test]
fn the_service_config_retries_what_the_rust_client_retries() {
    use inventory_client::retry::{Verdict, verdict};
    use tonic::{Code, Status};
    use tonic_types::{ErrorDetails, StatusExt as _};

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grpc/service-config.json")).unwrap(),
    )
    .unwrap();
    let proto = std::fs::read_to_string(root.join("proto/inventory/v1/inventory.proto")).unwrap();
    let unary: Vec<&str> = proto
        .lines()
        .filter_map(|line| line.trim().strip_prefix("rpc "))
        .filter(|line| !line.contains("stream "))
        .map(|line| line.split('(').next().unwrap())
        .collect();
    assert!(unary.len() >= 12, "{unary:?}");
    let mut configured = Vec::new();
    for method_config in config["methodConfig"].as_array().unwrap() {
        let methods: Vec<&str> = method_config["name"]
            .as_array()
            .unwrap()
            .iter()
            .map(|name| {
                assert_eq!(name["service"], "inventory.v1.InventoryService");
                name["method"].as_str().unwrap()
            })
            .collect();
        let policy = &method_config["retryPolicy"];
        assert!(
            policy["maxAttempts"].as_u64().unwrap() <= 5,
            "gRPC caps it at 5"
        );
        for code in policy["retryableStatusCodes"].as_array().unwrap() {
            let code = code.as_str().unwrap();
            // ABORTED is retried only where its reasons are lost lease races (Reserve), never
            // where it means VERSION_MISMATCH (counts and adjustments).
            let status = match code {
                "UNAVAILABLE" => Status::unavailable("down"),
                "RESOURCE_EXHAUSTED" => Status::resource_exhausted("busy"),
                "ABORTED" => {
                    assert!(
                        !methods.iter().any(|m| m.contains("Stock")),
                        "ABORTED retried for {methods:?}"
                    );
                    let mut details = ErrorDetails::new();
                    details.set_error_info(
                        "LEASE_BUSY",
                        "inventory.v1",
                        std::collections::HashMap::new(),
                    );
                    Status::with_error_details(Code::Aborted, "busy", details)
                }
                other => panic!("{other} is not retried by the Rust client"),
            };
            assert_eq!(verdict(&status), Verdict::Retry, "{code}");
        }
        configured.extend(methods);
    }
    configured.sort_unstable();
    let mut expected = unary.clone();
    expected.sort_unstable();
    assert_eq!(configured, expected, "every unary RPC has a retry policy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_that_hangs_is_given_up_and_retried_with_the_same_key() {
    let app = spawn_app().await;
    stock(&app, "SKU-1", 5).await;
    let proxy = inventory_testkit::proxy::Proxy::start(app.addr)
        .await
        .unwrap();
    let client = InventoryClient::connect_lazy(ClientConfig {
        endpoint: format!("http://{}", proxy.addr()),
        retry: RetryPolicy {
            budget: Duration::from_secs(10),
            attempt_timeout: Duration::from_millis(500),
            ..RetryPolicy::default()
        },
        ..ClientConfig::default()
    })
    .unwrap();
    client.get_stock(get_stock(&["SKU-1"])).await.unwrap();

    // The link hangs: every attempt times out after 500 ms, and the client tries again.
    proxy.set_stalled(true);
    let call = {
        let client = client.clone();
        tokio::spawn(async move { client.reserve(order("k-h", "o-h", "SKU-1", 1)).await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!call.is_finished(), "a hung attempt does not end the call");
    // The link recovers: the held attempts arrive too, all with the same key.
    proxy.set_stalled(false);
    let reservation = call
        .await
        .unwrap()
        .expect("reserved once the link recovered");
    assert_eq!(reservation.state(), ReservationState::Held);
    assert_eq!(reservations_of(&app, "o-h").await, 1);
    assert_eq!(app.level("SKU-1").await, (5, 1));
}

/// A consumer keeping an `EventCursor` resumes in the history it read, and when a restore cut
/// that history behind it, hears so (as the stream's last item) and is told where to go on.
#[tokio::test]
async fn an_event_cursor_resumes_and_after_a_cut_says_where_to_go_on() {
    use inventory_client::EventCursor;
    use tokio_stream::StreamExt as _;

    let app = spawn_app().await;
    let kit = client(&app, Duration::from_secs(5));
    stock(&app, "CURSOR", 100).await;
    app.hold("first", &[("CURSOR", 1)]).await;
    let mut cursor = EventCursor::start();
    let mut stream = kit.watch_events_from(&cursor).await.unwrap();
    for _ in 0..2 {
        let event = stream.next().await.unwrap().unwrap();
        cursor.advance(&event);
    }
    assert_eq!(cursor.sequence(), 2);
    drop(stream);

    app.hold("second", &[("CURSOR", 1)]).await;
    let mut stream = kit.watch_events_from(&cursor).await.unwrap();
    let event = stream.next().await.unwrap().unwrap();
    assert_eq!(event.sequence, 3, "resumed after the cursor");
    cursor.advance(&event);

    // A restore back to position 1, on a new timeline; the history goes on from there.
    crate::events::restore_stream_to(&app, 1).await;
    for i in 0..3 {
        app.hold(&format!("after-{i}"), &[("CURSOR", 1)]).await;
    }
    let ended = tokio::time::timeout(Duration::from_secs(20), stream.next())
        .await
        .expect("the open stream hears of the cut")
        .expect("an item")
        .expect_err("the cut, not an event");
    let go_on = EventCursor::after_cut(&Error::from_stream(ended)).expect("a cut");
    let refused = kit.watch_events_from(&cursor).await.unwrap_err();
    assert_eq!(EventCursor::after_cut(&refused), Some(go_on.clone()));
    assert_eq!(go_on.sequence(), 4, "the head when the server answered");
    assert_ne!(go_on.epoch(), cursor.epoch());
    // After the snapshot, on from there.
    app.hold("after-snapshot", &[("CURSOR", 1)]).await;
    let mut stream = kit.watch_events_from(&go_on).await.unwrap();
    let event = stream.next().await.unwrap().unwrap();
    assert_eq!((event.sequence, event.epoch.as_str()), (5, go_on.epoch()));
}
