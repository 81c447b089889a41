//! Hot-SKU coalescing: single-line Reserve calls queued behind one leader are written in one
//! transaction, each decided on its own, in arrival order.

use std::time::Duration;

use inventory_core::{
    domain::Sku,
    pause::{Held, PausePoint},
};
use inventory_server::proto::{Reservation, ReservationState, ReserveRequest};
use tokio::task::JoinHandle;
use tonic::Code;

use crate::{
    helpers::{
        TestApp, error_reason, fresh_database, reserve, spawn_app, spawn_app_with, stock,
        test_settings,
    },
    reservations::race,
};

type Call = JoinHandle<Result<tonic::Response<Reservation>, tonic::Status>>;

/// Sends `request` and returns once `waiting` (a count of waiting calls) went up: the call
/// waits behind a held leader instead of being answered.
async fn send_until_waiting(
    app: &TestApp,
    request: ReserveRequest,
    waiting: impl Fn() -> usize,
) -> Call {
    let before = waiting();
    let mut client = app.client.clone();
    let call = tokio::spawn(async move { client.reserve(request).await });
    while waiting() == before {
        assert!(
            !call.is_finished(),
            "the call was answered instead of waiting"
        );
        tokio::task::yield_now().await;
    }
    call
}

/// Sends `request` and returns once it waits in the SKU's queue (behind a held leader).
pub(crate) async fn queue(app: &TestApp, sku: &str, request: ReserveRequest) -> Call {
    let sku = Sku::parse(sku).unwrap();
    send_until_waiting(app, request, || app.inventory.queued(&sku)).await
}

/// Holds a leader for `sku` at its lease, so that what follows queues behind it.
pub(crate) async fn hold_leader(app: &TestApp, sku: &str) -> (inventory_core::pause::Held, Call) {
    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut client = app.client.clone();
    let request = reserve("leader", &[(sku, 1)]);
    let leader = tokio::spawn(async move { client.reserve(request).await });
    held.reached().await;
    (held, leader)
}

async fn fence_of(app: &TestApp, reservation_id: &str) -> i64 {
    app.db
        .query_one(
            "SELECT fence_token FROM reservation_lines WHERE reservation_id = $1::text::uuid",
            &[&reservation_id],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_queued_batch_is_decided_in_arrival_order_in_one_transaction() {
    let app = spawn_app().await;
    stock(&app, "HOT", 6).await;
    let (held, leader) = hold_leader(&app, "HOT").await;
    let a = queue(&app, "HOT", reserve("a", &[("HOT", 3)])).await;
    let b = queue(&app, "HOT", reserve("b", &[("HOT", 3)])).await;
    let c = queue(&app, "HOT", reserve("c", &[("HOT", 2)])).await;
    held.resume();

    let leader = leader.await.unwrap().unwrap().into_inner();
    // 5 left after the leader: A takes 3, B (3) would overdraw and is refused, C takes 2.
    let a = a.await.unwrap().unwrap().into_inner();
    let b = b.await.unwrap().unwrap_err();
    let c = c.await.unwrap().unwrap().into_inner();
    assert_eq!(a.state(), ReservationState::Held);
    assert_eq!(c.state(), ReservationState::Held);
    assert_eq!(b.code(), Code::FailedPrecondition, "{b:?}");
    assert_eq!(error_reason(&b), "INSUFFICIENT_STOCK");
    assert!(b.message().contains("HOT"), "{b:?}");
    assert_eq!(app.level("HOT").await, (6, 6));

    // A and C went in one transaction (one fencing token), after the leader's.
    let (fence_leader, fence_a, fence_c) = (
        fence_of(&app, &leader.reservation_id).await,
        fence_of(&app, &a.reservation_id).await,
        fence_of(&app, &c.reservation_id).await,
    );
    assert_eq!(fence_a, fence_c);
    assert!(fence_a > fence_leader);

    // Each is its own reservation, with its own event carrying the level right after it.
    let levels: Vec<(String, i64, i64)> = app
        .db
        .query(
            "SELECT r.idempotency_key, (o.payload->'levels'->0->>'reserved')::bigint,
                    (o.payload->'levels'->0->>'version')::bigint
             FROM outbox o JOIN reservations r USING (reservation_id)
             WHERE o.event_type = 'RESERVATION_HELD' ORDER BY o.sequence",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect();
    let keys: Vec<&str> = levels.iter().map(|(k, ..)| k.as_str()).collect();
    assert_eq!(keys, ["leader", "a", "c"]);
    assert_eq!(levels[1].1, 4);
    assert_eq!(levels[2].1, 6);
    assert_eq!(levels[2].2, levels[1].2 + 1, "one version per hold");

    // Every outcome, the refusal included, is stored with its key and replays.
    let replay_a = app
        .client
        .clone()
        .reserve(reserve("a", &[("HOT", 3)]))
        .await;
    assert_eq!(
        replay_a.unwrap().into_inner().reservation_id,
        a.reservation_id
    );
    let replay_b = app
        .client
        .clone()
        .reserve(reserve("b", &[("HOT", 3)]))
        .await
        .unwrap_err();
    assert_eq!(replay_b.code(), Code::FailedPrecondition);
    assert_eq!(app.level("HOT").await, (6, 6));
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 3);
}

#[tokio::test]
async fn a_leader_with_a_queue_hands_its_renewed_lease_to_the_next_leader() {
    let app = spawn_app().await;
    stock(&app, "HOT", 10).await;
    let (held, leader) = hold_leader(&app, "HOT").await;
    let a = queue(&app, "HOT", reserve("a", &[("HOT", 2)])).await;
    held.resume();
    let leader = leader.await.unwrap().unwrap().into_inner();
    let a = a.await.unwrap().unwrap().into_inner();

    // One acquire for two batches: the second was written under the lease the first kept,
    // with the next token.
    assert_eq!(app.inventory.handed_batches(), 1);
    assert_eq!(
        fence_of(&app, &a.reservation_id).await,
        fence_of(&app, &leader.reservation_id).await + 1
    );
    // With nobody queued after it, the last leader released the lease.
    let exists: i64 = fred::prelude::KeysInterface::exists(&app.redis, app.lease_key("HOT"))
        .await
        .unwrap();
    assert_eq!(exists, 0);
    assert_eq!(app.level("HOT").await, (10, 3));
}

#[tokio::test]
async fn one_key_twice_in_a_queue_reserves_once() {
    let app = spawn_app().await;
    stock(&app, "HOT", 10).await;
    let (held, leader) = hold_leader(&app, "HOT").await;
    let first = queue(&app, "HOT", reserve("k", &[("HOT", 2)])).await;
    let retry = queue(&app, "HOT", reserve("k", &[("HOT", 2)])).await;
    let reused = queue(&app, "HOT", reserve("k", &[("HOT", 5)])).await;
    let other = queue(&app, "HOT", reserve("other", &[("HOT", 1)])).await;
    held.resume();

    leader.await.unwrap().unwrap();
    let first = first.await.unwrap().unwrap().into_inner();
    let retry = retry.await.unwrap().unwrap().into_inner();
    assert_eq!(
        retry.reservation_id, first.reservation_id,
        "the retry replays"
    );
    let reused = reused.await.unwrap().unwrap_err();
    assert_eq!(reused.code(), Code::AlreadyExists, "{reused:?}");
    other.await.unwrap().unwrap();
    assert_eq!(app.level("HOT").await, (10, 4));
    assert_eq!(app.count("SELECT count(*) FROM reservations").await, 3);
}

#[tokio::test]
async fn a_queued_batch_for_an_unknown_sku_is_refused_and_stored() {
    let app = spawn_app().await;
    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut client = app.client.clone();
    let leader = tokio::spawn(async move { client.reserve(reserve("l", &[("NOPE", 1)])).await });
    held.reached().await;
    let a = queue(&app, "NOPE", reserve("a", &[("NOPE", 1)])).await;
    held.resume();
    for call in [leader, a] {
        let status = call.await.unwrap().unwrap_err();
        assert_eq!(status.code(), Code::NotFound, "{status:?}");
    }
    assert_eq!(app.count("SELECT count(*) FROM idempotency_keys").await, 2);
    assert_eq!(app.count("SELECT count(*) FROM stock").await, 0);
}

#[tokio::test]
async fn a_multi_line_cart_and_a_queue_on_the_same_sku_share_the_stock_exactly() {
    let app = spawn_app().await;
    stock(&app, "HOT", 5).await;
    stock(&app, "COLD", 5).await;
    let (held, leader) = hold_leader(&app, "HOT").await;
    let queued = queue(&app, "HOT", reserve("q", &[("HOT", 2)])).await;
    // The cart takes the lease in the ordinary way: it waits for the leader's lease too.
    let mut client = app.client.clone();
    let cart = tokio::spawn(async move {
        client
            .reserve(reserve("cart", &[("COLD", 1), ("HOT", 3)]))
            .await
    });
    held.resume();
    leader.await.unwrap().unwrap();
    // After the leader's unit, 4 are left: the queued 2 and the cart's 3 cannot both fit.
    // Whichever takes the lease first wins; the other is refused and holds nothing.
    let queued = queued.await.unwrap();
    let cart = cart.await.unwrap();
    match (&queued, &cart) {
        (Ok(_), Err(refused)) => {
            assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
            assert_eq!(app.level("HOT").await, (5, 3));
            assert_eq!(app.level("COLD").await, (5, 0));
        }
        (Err(refused), Ok(_)) => {
            assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
            assert_eq!(app.level("HOT").await, (5, 4));
            assert_eq!(app.level("COLD").await, (5, 1));
        }
        other => panic!("exactly one of the two must win: {other:?}"),
    }
}

#[tokio::test]
async fn with_coalescing_off_every_racer_commits_alone() {
    let mut settings = test_settings(fresh_database().await);
    settings.inventory.coalesce.max_batch = 1;
    let app = spawn_app_with(settings).await;
    stock(&app, "TEN", 10).await;
    let (held, refused) = race(&app, "TEN", 50).await;
    assert_eq!(held.len(), 10, "{refused:?}");
    assert!(refused.iter().all(|s| s.code() == Code::FailedPrecondition));
    assert_eq!(app.level("TEN").await, (10, 10));
    let fences = app
        .count("SELECT count(DISTINCT fence_token) FROM reservation_lines WHERE sku = 'TEN'")
        .await;
    assert_eq!(fences, 10, "one transaction, one token, per reservation");
}

#[tokio::test]
async fn a_lone_request_does_not_linger() {
    let mut settings = test_settings(fresh_database().await);
    settings.inventory.coalesce.linger = Duration::from_secs(30);
    let app = spawn_app_with(settings).await;
    stock(&app, "SKU-1", 10).await;
    // Nobody else queued: a 30 s linger would show as a timeout here.
    let alone = tokio::time::timeout(
        Duration::from_secs(10),
        app.client
            .clone()
            .reserve(reserve("alone", &[("SKU-1", 1)])),
    )
    .await
    .expect("no linger without company");
    assert!(alone.is_ok());
}

/// Sends a Reserve and returns once its SKU's batch waits for the group commit in progress.
async fn wait_for_commit(app: &TestApp, request: ReserveRequest) -> Call {
    send_until_waiting(app, request, || app.inventory.groups_waiting()).await
}

/// Sends `request` and returns once its group commit is held at [`PausePoint::GroupCommit`],
/// holding the replica's turn until the returned pause is resumed.
async fn hold_turn(app: &TestApp, request: ReserveRequest) -> (Held, Call) {
    let mut held = app.pauses.arm(PausePoint::GroupCommit);
    let mut client = app.client.clone();
    let call = tokio::spawn(async move { client.reserve(request).await });
    held.reached().await;
    (held, call)
}

async fn writing_transaction(app: &TestApp, key: &str) -> String {
    app.db
        .query_one(
            "SELECT xmin::text FROM reservations WHERE idempotency_key = $1",
            &[&key],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_second_group_commit_is_written_while_the_first_is_held() {
    // With two transactions allowed in flight, a batch of another SKU does not wait for a
    // held one.
    let mut settings = test_settings(fresh_database().await);
    settings.inventory.coalesce.max_commits = 2;
    let app = spawn_app_with(settings).await;
    for sku in ["A", "B", "C"] {
        stock(&app, sku, 10).await;
    }
    let (held, a) = hold_turn(&app, reserve("a", &[("A", 1)])).await;
    let b = tokio::time::timeout(
        Duration::from_secs(5),
        app.client.clone().reserve(reserve("b", &[("B", 1)])),
    )
    .await
    .expect("B's batch did not wait for A's transaction");
    assert!(b.is_ok(), "{b:?}");
    assert_eq!(app.level("B").await, (10, 1));
    assert!(!a.is_finished());
    held.resume();
    a.await.unwrap().unwrap();
    assert_eq!(app.level("A").await, (10, 1));
}

#[tokio::test]
async fn the_next_group_commit_runs_while_the_one_before_is_committing() {
    // One transaction in flight (the default), but one that has sent its statements and only
    // waits for its commit no longer holds the turn.
    let app = spawn_app().await;
    for sku in ["L", "A", "C"] {
        stock(&app, sku, 10).await;
    }
    // While L holds the turn, A queues; they share the next transaction (two SKUs), which is
    // then held at its commit.
    let (turn, l) = hold_turn(&app, reserve("l", &[("L", 1)])).await;
    let a = wait_for_commit(&app, reserve("a", &[("A", 2)])).await;
    let mut committing = app.pauses.arm(PausePoint::Committing);
    turn.resume();
    committing.reached().await;

    let c = tokio::time::timeout(
        Duration::from_secs(5),
        app.client.clone().reserve(reserve("c", &[("C", 4)])),
    )
    .await
    .expect("C's batch waited for a transaction that was only committing");
    assert!(c.is_ok(), "{c:?}");
    assert_eq!(app.level("C").await, (10, 4));
    // L and A are not committed yet: nothing of theirs is visible.
    assert!(!l.is_finished() && !a.is_finished());
    assert_eq!(app.level("L").await, (10, 0));
    assert_eq!(app.level("A").await, (10, 0));
    committing.resume();
    l.await.unwrap().unwrap();
    a.await.unwrap().unwrap();
    assert_eq!(app.level("L").await, (10, 1));
    assert_eq!(app.level("A").await, (10, 2));
    assert_eq!(
        writing_transaction(&app, "l").await,
        writing_transaction(&app, "a").await
    );
}

#[tokio::test]
async fn batches_of_several_skus_share_one_commit_and_a_fenced_one_writes_nothing() {
    let app = spawn_app().await;
    for sku in ["A", "B", "C"] {
        stock(&app, sku, 10).await;
    }
    // C's stored fence gets ahead of its Redis counter, which is then lost.
    app.hold("c-before", &[("C", 1)]).await;
    let _: i64 = fred::prelude::KeysInterface::del(&app.redis, app.fence_key("C"))
        .await
        .unwrap();

    let (held, a) = hold_turn(&app, reserve("a", &[("A", 2)])).await;
    let b = wait_for_commit(&app, reserve("b", &[("B", 3)])).await;
    let c = wait_for_commit(&app, reserve("c", &[("C", 4)])).await;
    held.resume();

    for call in [a, b, c] {
        let reservation = call.await.unwrap().unwrap().into_inner();
        assert_eq!(reservation.state(), ReservationState::Held);
    }
    assert_eq!(app.level("A").await, (10, 2));
    assert_eq!(app.level("B").await, (10, 3));
    assert_eq!(app.level("C").await, (10, 5));
    // A and B in one transaction; C was fenced there (its counter lagged), wrote nothing,
    // had its claim undone, and committed after its counter was raised.
    let (ta, tb, tc) = (
        writing_transaction(&app, "a").await,
        writing_transaction(&app, "b").await,
        writing_transaction(&app, "c").await,
    );
    assert_eq!(ta, tb);
    assert_ne!(ta, tc);
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE key = 'c'")
            .await,
        1
    );
    // Replays still answer each with its own reservation.
    let replay = app.hold("b", &[("B", 3)]).await;
    assert_eq!(app.level("B").await, (10, 3));
    assert_eq!(replay.state(), ReservationState::Held);
}

#[tokio::test]
async fn one_key_in_two_skus_batches_is_not_executed_twice_in_one_commit() {
    let app = spawn_app().await;
    for sku in ["L", "A", "B"] {
        stock(&app, sku, 10).await;
    }
    let (held, leader) = hold_turn(&app, reserve("l", &[("L", 1)])).await;
    // The same key for two different requests, on two SKUs: one executes, one conflicts.
    let first = wait_for_commit(&app, reserve("same", &[("A", 2)])).await;
    let second = wait_for_commit(&app, reserve("same", &[("B", 2)])).await;
    held.resume();
    leader.await.unwrap().unwrap();
    let results = [first.await.unwrap(), second.await.unwrap()];
    let held_count = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(held_count, 1, "{results:?}");
    let conflict = results.iter().find_map(|r| r.as_ref().err()).unwrap();
    assert_eq!(conflict.code(), Code::AlreadyExists, "{conflict:?}");
    let (_, a) = app.level("A").await;
    let (_, b) = app.level("B").await;
    assert_eq!(
        a + b,
        2,
        "one of the two requests held its units, the other nothing"
    );
    assert_eq!(app.level("L").await, (10, 1));
}

/// A batch claims its keys before it locks any stock row, whatever its connection has
/// prepared: the same order as every other writer, so a retry holding its key and a batch
/// holding the SKU never wait on each other in a cycle. The connection (the pool's only one)
/// first serves a one-request `Reserve`, which prepares the stock lock but not the batch's
/// key claim; then a key the batch needs is held by an open transaction. While the batch
/// waits for that key, the stock row must still be free.
#[tokio::test]
async fn a_batch_claims_its_keys_before_it_locks_stock_on_a_connection_that_served_one_request() {
    let database = fresh_database().await;
    let mut settings = test_settings(database.clone());
    settings.database.pool.max_size = 1;
    let app = spawn_app_with(settings).await;
    stock(&app, "ORDERED", 10).await;
    app.hold("warm", &[("ORDERED", 1)]).await;
    let caller: String = app
        .db
        .query_one(
            "SELECT caller FROM idempotency_keys WHERE key = 'warm'",
            &[],
        )
        .await
        .unwrap()
        .get(0);

    // Another transaction holds the key of one of the batch's requests.
    let mut holder = crate::helpers::connect(&database).await;
    let holding = holder.transaction().await.unwrap();
    holding
        .execute(
            "INSERT INTO idempotency_keys (caller, key, operation, fingerprint)
             VALUES ($1, 'held-key', 'Reserve', decode(repeat('00', 32), 'hex'))",
            &[&caller],
        )
        .await
        .unwrap();

    let (held, leader) = hold_leader(&app, "ORDERED").await;
    let blocked = queue(&app, "ORDERED", reserve("held-key", &[("ORDERED", 1)])).await;
    let free = queue(&app, "ORDERED", reserve("free-key", &[("ORDERED", 1)])).await;
    held.resume();
    inventory_testkit::process::eventually(
        "the batch waits for the held key",
        Duration::from_secs(10),
        || async {
            app.count(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                 WHERE NOT l.granted AND a.datname = current_database()",
            )
            .await
                > 0
        },
    )
    .await
    .unwrap();

    let probe = app
        .db
        .simple_query(
            "BEGIN; SELECT 1 FROM stock WHERE sku = 'ORDERED' FOR UPDATE NOWAIT; ROLLBACK",
        )
        .await;
    if probe.is_err() {
        app.db.simple_query("ROLLBACK").await.unwrap();
    }
    holding.rollback().await.unwrap();
    leader.await.unwrap().unwrap();
    let (blocked, free) = (blocked.await.unwrap(), free.await.unwrap());
    assert!(
        probe.is_ok(),
        "the batch locked the stock row before claiming its keys: {probe:?}"
    );
    blocked.unwrap();
    free.unwrap();
    assert_eq!(app.level("ORDERED").await, (10, 4));
}

/// A stored outcome this release cannot read (written by a newer release, met during a
/// rollback) refuses the one call that replays it, with `UNAVAILABLE` so that its retry may
/// reach a replica that reads it; the other requests of its transaction are answered.
#[tokio::test]
async fn an_unreadable_stored_outcome_fails_its_own_call_not_the_batch() {
    let app = spawn_app().await;
    stock(&app, "NEWER", 10).await;
    app.hold("written-by-newer", &[("NEWER", 1)]).await;
    app.db
        .execute(
            "UPDATE idempotency_keys SET outcome = '{\"outcome\": \"from_a_newer_release\"}'
             WHERE key = 'written-by-newer'",
            &[],
        )
        .await
        .unwrap();

    let (held, leader) = hold_leader(&app, "NEWER").await;
    let unreadable = queue(&app, "NEWER", reserve("written-by-newer", &[("NEWER", 1)])).await;
    let fresh = queue(&app, "NEWER", reserve("fresh", &[("NEWER", 2)])).await;
    held.resume();
    leader.await.unwrap().unwrap();
    let refused = unreadable.await.unwrap().unwrap_err();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    let fresh = fresh
        .await
        .unwrap()
        .expect("the batch's other request is answered");
    assert_eq!(fresh.into_inner().lines[0].quantity, 2);
    assert_eq!(app.level("NEWER").await, (10, 4));
}
