//! `CancelOrder`: held units released, confirmed ones left, a tombstone that refuses every
//! later `Reserve` of the order, including one in flight when the cancel commits, and both
//! orders of the race driven by pause points.

use std::time::Duration;

use futures::future::join_all;
use inventory_core::pause::PausePoint;
use inventory_server::proto::{CancelOrderRequest, Reservation, ReservationState, ReserveRequest};
use tonic::Code;

use crate::helpers::{TestApp, confirm, error_reason, reserve, spawn_app, stock, violated_fields};

fn for_order(key: &str, order: &str, lines: &[(&str, i64)]) -> ReserveRequest {
    ReserveRequest {
        order_id: order.into(),
        ..reserve(key, lines)
    }
}

fn cancel(order: &str, key: &str) -> CancelOrderRequest {
    CancelOrderRequest {
        order_id: order.into(),
        idempotency_key: key.into(),
        reason: "shopper gave up".into(),
    }
}

async fn hold(app: &TestApp, request: ReserveRequest) -> Reservation {
    app.client
        .clone()
        .reserve(request)
        .await
        .unwrap()
        .into_inner()
}

fn states(reservations: &[Reservation]) -> Vec<(String, ReservationState)> {
    reservations
        .iter()
        .map(|r| (r.reservation_id.clone(), r.state()))
        .collect()
}

#[tokio::test]
async fn a_cancel_releases_what_is_held_keeps_what_is_confirmed_and_refuses_later_reserves() {
    let mut app = spawn_app().await;
    stock(&app, "MUG", 10).await;
    stock(&app, "CAP", 10).await;
    let held = hold(&app, for_order("h", "order-x", &[("MUG", 2), ("CAP", 1)])).await;
    let shipped = hold(&app, for_order("s", "order-x", &[("MUG", 3)])).await;
    app.client
        .confirm_reservation(confirm(&shipped.reservation_id))
        .await
        .unwrap();
    let other = hold(&app, for_order("o", "order-y", &[("MUG", 1)])).await;
    assert_eq!(app.level("MUG").await, (7, 3));

    let answer = app
        .client
        .cancel_order(cancel("order-x", "c1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        states(&answer.reservations),
        [
            (held.reservation_id.clone(), ReservationState::Released),
            (shipped.reservation_id.clone(), ReservationState::Confirmed),
        ]
    );
    assert_eq!(
        app.level("MUG").await,
        (7, 1),
        "only order-y's unit is held"
    );
    assert_eq!(app.level("CAP").await, (10, 0));
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM reservations WHERE reservation_id = '{}' AND state = 'HELD'",
            other.reservation_id
        ))
        .await,
        1,
        "another order is untouched"
    );
    assert_eq!(
        app.count(
            "SELECT count(*) FROM outbox WHERE event_type = 'RESERVATION_RELEASED' \
             AND payload->>'order_id' = 'order-x'"
        )
        .await,
        1,
        "one event per released hold"
    );

    // From now on the order refuses new holds, whatever the key...
    let refused = app
        .client
        .reserve(for_order("late", "order-x", &[("MUG", 1)]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&refused), "ORDER_CANCELLED");
    assert_eq!(app.level("MUG").await, (7, 1));
    // ...and the refusal is stored with the key, like any final refusal.
    let again = app
        .client
        .reserve(for_order("late", "order-x", &[("MUG", 1)]))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&again), "ORDER_CANCELLED");
    // A key used before the cancel replays what it got then.
    let replay = hold(&app, for_order("h", "order-x", &[("MUG", 2), ("CAP", 1)])).await;
    assert_eq!(replay.reservation_id, held.reservation_id);
    assert_eq!(app.level("MUG").await, (7, 1), "a replay holds nothing");

    // Cancelling again (same key or a new one) releases nothing more.
    for key in ["c1", "c2"] {
        let repeat = app
            .client
            .cancel_order(cancel("order-x", key))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(states(&repeat.reservations), states(&answer.reservations));
    }
    assert_eq!(app.level("MUG").await, (7, 1));
    // The key belongs to this cancel: another order with it is refused.
    let reused = app
        .client
        .cancel_order(cancel("order-y", "c1"))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::AlreadyExists);
}

#[tokio::test]
async fn a_reserve_in_flight_when_the_cancel_commits_is_refused() {
    let app = spawn_app().await;
    stock(&app, "SKU-1", 5).await;
    // The Reserve has its lease and is about to write when the cancel commits.
    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut client = app.client.clone();
    let reserving = tokio::spawn(async move {
        client
            .reserve(for_order("r", "order-1", &[("SKU-1", 2)]))
            .await
    });
    held.reached().await;
    let cancelled = app
        .client
        .clone()
        .cancel_order(cancel("order-1", "c"))
        .await
        .unwrap()
        .into_inner();
    assert!(cancelled.reservations.is_empty());
    held.resume();

    let refused = reserving.await.unwrap().unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&refused), "ORDER_CANCELLED");
    assert_eq!(app.level("SKU-1").await, (5, 0), "nothing held");
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 0);
}

#[tokio::test]
async fn a_reserve_that_committed_first_is_released_by_the_cancel() {
    let app = spawn_app().await;
    stock(&app, "SKU-1", 5).await;
    // The Reserve holds the order's lock (it checked the order) and has not committed.
    let mut held = app.pauses.arm(PausePoint::OrderChecked);
    let mut client = app.client.clone();
    let reserving = tokio::spawn(async move {
        client
            .reserve(for_order("r", "order-1", &[("SKU-1", 2)]))
            .await
    });
    held.reached().await;
    let mut client = app.client.clone();
    let cancelling = tokio::spawn(async move { client.cancel_order(cancel("order-1", "c")).await });
    // The cancel waits for the order's lock.
    inventory_testkit::eventually(
        "the cancel waits on the order lock",
        Duration::from_secs(10),
        || async {
            app.count("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                .await
                == 1
        },
    )
    .await
    .unwrap();
    held.resume();

    let reservation = reserving.await.unwrap().unwrap().into_inner();
    assert_eq!(reservation.state(), ReservationState::Held);
    let cancelled = cancelling.await.unwrap().unwrap().into_inner();
    assert_eq!(
        states(&cancelled.reservations),
        [(reservation.reservation_id, ReservationState::Released)]
    );
    assert_eq!(app.level("SKU-1").await, (5, 0), "the hold was released");
}

#[tokio::test]
async fn coalesced_reserves_of_a_cancelled_order_are_refused_one_by_one() {
    let app = spawn_app().await;
    stock(&app, "SKU-1", 100).await;
    app.client
        .clone()
        .cancel_order(cancel("gone", "c"))
        .await
        .unwrap();
    let calls = (0..20).map(|i| {
        let mut client = app.client.clone();
        let order = if i % 2 == 0 { "gone" } else { "live" };
        async move {
            let answer = client
                .reserve(for_order(&format!("k{i}"), order, &[("SKU-1", 1)]))
                .await;
            (order, answer)
        }
    });
    for (order, answer) in join_all(calls).await {
        match order {
            "gone" => assert_eq!(error_reason(&answer.unwrap_err()), "ORDER_CANCELLED"),
            _ => assert_eq!(answer.unwrap().into_inner().state(), ReservationState::Held),
        }
    }
    assert_eq!(app.level("SKU-1").await, (100, 10));
}

#[tokio::test]
async fn a_cancel_needs_an_order_and_a_key() {
    let app = spawn_app().await;
    let refused = app
        .client
        .clone()
        .cancel_order(CancelOrderRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&refused), ["order_id", "idempotency_key"]);
    assert_eq!(app.count("SELECT count(*) FROM cancelled_orders").await, 0);
}
