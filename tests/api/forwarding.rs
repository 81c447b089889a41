//! Forwarding to the replica holding a SKU's lease: the calls for a hot SKU meet in one
//! batch wherever they arrive, at most one hop, and SQL stays the only guarantee.

use std::{
    collections::HashSet,
    time::{Duration, Instant},
};

use futures::future::join_all;
use inventory_core::{
    command::Reserve,
    domain::{Caller, IdempotencyKey, Line, OrderId, Quantity, Sku},
    ports::{Forwarded, Forwarder as _, Peer},
};
use inventory_server::{
    config::PeerSettings,
    peer::{PeerForwarder, PeerSecret},
    proto::{ReservationState, inventory::peer::v2 as v1},
};
use tonic::Code;

use crate::{
    coalescing::hold_leader,
    helpers::{
        TestApp, error_reason, fresh_database, reserve, spawn_app_with, stock, test_settings,
    },
};

const SECRET: &[u8] = b"a peer secret of at least 32 bytes, for tests";

fn peers() -> Option<PeerSettings> {
    Some(PeerSettings {
        listen_addr: "127.0.0.1:0".parse().unwrap(),
        advertise_addr: None,
        secret: SECRET.to_vec().into(),
    })
}

/// `n` replicas of one deployment with forwarding on: one database, one set of Redis keys.
async fn fleet(n: usize) -> Vec<TestApp> {
    let first = test_settings(fresh_database().await);
    let (database, prefix) = (
        first.database.config.clone(),
        first.redis.client.key_prefix.clone(),
    );
    let mut apps = Vec::with_capacity(n);
    for _ in 0..n {
        let mut settings = test_settings(database.clone());
        settings.redis.client.key_prefix = prefix.clone();
        settings.peer = peers();
        apps.push(spawn_app_with(settings).await);
    }
    apps
}

fn answered(app: &TestApp) -> u64 {
    app.inventory
        .forwards()
        .answered
        .load(std::sync::atomic::Ordering::Relaxed)
}

fn single_line(key: &str, sku: &str) -> Reserve {
    Reserve::new(
        Caller::anonymous(),
        IdempotencyKey::parse(key).unwrap(),
        OrderId::parse(&format!("order-{key}")).unwrap(),
        vec![Line::new(
            Sku::parse(sku).unwrap(),
            Quantity::parse(1).unwrap(),
        )],
        None,
    )
}

async fn stored_keys(app: &TestApp) -> i64 {
    app.count("SELECT count(*) FROM reservations").await
}

#[tokio::test]
async fn a_call_for_a_sku_a_peer_holds_is_written_in_that_peers_next_batch() {
    let apps = fleet(2).await;
    let (a, b) = (&apps[0], &apps[1]);
    stock(a, "HOT", 10).await;
    // A holds HOT's lease, paused right after the grant.
    let (held, leader) = hold_leader(a, "HOT").await;

    // B's call finds the lease held by A and goes there: it queues behind A's leader.
    let mut client = b.client.clone();
    let call = tokio::spawn(async move { client.reserve(reserve("via-b", &[("HOT", 2)])).await });
    let sku = Sku::parse("HOT").unwrap();
    while a.inventory.queued(&sku) == 0 {
        assert!(!call.is_finished(), "B answered instead of forwarding to A");
        tokio::task::yield_now().await;
    }
    held.resume();

    let leader = leader.await.unwrap().unwrap().into_inner();
    let forwarded = call.await.unwrap().expect("answered by A").into_inner();
    assert_eq!(forwarded.state(), ReservationState::Held);
    assert_eq!(answered(b), 1);
    assert_eq!(b.level("HOT").await, (10, 3));
    // Written by A under the lease it held: a newer token than its leader's, and no lease
    // ever taken by B.
    let fence = |id: String| async move {
        let row =
            a.db.query_one(
                "SELECT fence_token FROM reservation_lines WHERE reservation_id = $1::text::uuid",
                &[&id],
            )
            .await
            .unwrap();
        row.get::<_, i64>(0)
    };
    assert!(fence(forwarded.reservation_id.clone()).await > fence(leader.reservation_id).await);

    // A retry at B, with the same key, replays it (whoever answers).
    let again = b
        .client
        .clone()
        .reserve(reserve("via-b", &[("HOT", 2)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.reservation_id, forwarded.reservation_id);
    assert_eq!(b.level("HOT").await, (10, 3));
}

#[tokio::test]
async fn a_forward_to_a_replica_that_does_not_hold_the_lease_is_refused_and_writes_nothing() {
    let apps = fleet(2).await;
    let (a, b) = (&apps[0], &apps[1]);
    stock(a, "HOT", 10).await;
    let (held, leader) = hold_leader(a, "HOT").await;

    // A stale sender thinks B holds HOT: B finds A has it and refuses, running nothing.
    let forwarder = PeerForwarder::new(PeerSecret::new(SECRET));
    let peer = Peer(b.peer_addr.unwrap().to_string());
    let deadline = Instant::now() + Duration::from_secs(10);
    let command = single_line("stale", "HOT");
    let outcome = forwarder.forward(&peer, &command, deadline, None).await;
    assert!(matches!(outcome, Forwarded::NotHolder), "{outcome:?}");

    held.resume();
    leader.await.unwrap().unwrap();
    assert_eq!(stored_keys(a).await, 1, "only the leader's reservation");
    assert_eq!(a.level("HOT").await, (10, 1));

    // With the lease free, the same forward is run by B (which takes it) and answered.
    let outcome = forwarder.forward(&peer, &command, deadline, None).await;
    let Forwarded::Answered(Ok(reservation)) = outcome else {
        panic!("B should run it: {outcome:?}");
    };
    assert_eq!(reservation.lines[0].held, 1);
    assert_eq!(a.level("HOT").await, (10, 2));
}

#[tokio::test]
async fn a_lease_naming_a_dead_replica_costs_one_failed_hop_then_the_call_waits_here() {
    let apps = fleet(1).await;
    let app = &apps[0];
    stock(app, "HOT", 10).await;
    // A holder that died: its lease names an address nothing listens on, until it expires.
    let lease_ttl_ms = 1_500;
    let _: () = fred::interfaces::KeysInterface::set(
        &app.redis,
        app.lease_key("HOT"),
        "dead-holder@127.0.0.1:1",
        Some(fred::types::Expiration::PX(lease_ttl_ms)),
        None,
        false,
    )
    .await
    .unwrap();

    let reservation = app
        .client
        .clone()
        .reserve(reserve("after-death", &[("HOT", 1)]))
        .await
        .expect("runs here once the dead holder's lease expires")
        .into_inner();
    assert_eq!(reservation.state(), ReservationState::Held);
    let forwards = app.inventory.forwards();
    assert_eq!(
        forwards.failed.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(answered(app), 0);
    assert_eq!(app.level("HOT").await, (10, 1));
}

/// A rollout: the lease is held by a replica of a release that speaks another version of
/// the peer protocol. It answers UNIMPLEMENTED; the call ran nowhere, so it is run here like
/// a call never sent, and keeps the answer it gets here (here `LEASE_BUSY`, the lease being
/// held), not the `DEADLINE_EXCEEDED` of a hop that may have been written.
#[tokio::test]
async fn a_holder_of_another_protocol_version_makes_the_call_run_here() {
    let mut settings = test_settings(fresh_database().await);
    settings.peer = peers();
    settings.inventory.lease_wait = Duration::from_secs(1);
    let app = &spawn_app_with(settings).await;
    stock(app, "HOT", 10).await;
    // Its API port stands in for the other release's peer port: it serves no PeerService v2.
    let _: () = fred::interfaces::KeysInterface::set(
        &app.redis,
        app.lease_key("HOT"),
        format!("older-release@{}", app.addr),
        Some(fred::types::Expiration::PX(60_000)),
        None,
        false,
    )
    .await
    .unwrap();

    let status = app
        .client
        .clone()
        .reserve(reserve("across-releases", &[("HOT", 1)]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(error_reason(&status), "LEASE_BUSY");
    let forwards = app.inventory.forwards();
    assert_eq!(
        forwards.failed.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(stored_keys(app).await, 0);
}

#[tokio::test]
async fn a_peer_call_without_a_valid_signature_is_refused() {
    let apps = fleet(1).await;
    let app = &apps[0];
    stock(app, "HOT", 10).await;
    let mut client = v1::peer_service_client::PeerServiceClient::connect(format!(
        "http://{}",
        app.peer_addr.unwrap()
    ))
    .await
    .unwrap();
    let body = prost::Message::encode_to_vec(&v1::ForwardedReserve {
        request: Some(reserve("forged", &[("HOT", 1)])),
        caller: String::new(),
        lease_wait: None,
        tenant: String::new(),
    });
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for signature in [Vec::new(), vec![0x5a; 32]] {
        let refused = client
            .reserve(v1::SignedMessage {
                body: body.clone(),
                signed_at_ms: now_ms,
                signature,
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    }
    assert_eq!(stored_keys(app).await, 0);
    assert_eq!(app.level("HOT").await, (10, 0));
}

#[tokio::test]
async fn three_replicas_racing_for_a_hot_sku_sell_each_unit_once_and_replay_anywhere() {
    let apps = fleet(3).await;
    stock(&apps[0], "HOT", 40).await;
    let racers = 120;
    let calls = (0..racers).map(|i| {
        let mut client = apps[i % apps.len()].client.clone();
        async move {
            client
                .reserve(reserve(&format!("racer-{i}"), &[("HOT", 1)]))
                .await
        }
    });
    let (mut held, mut refused) = (Vec::new(), Vec::new());
    for (i, result) in join_all(calls).await.into_iter().enumerate() {
        match result {
            Ok(response) => held.push((i, response.into_inner())),
            Err(status) => refused.push(status),
        }
    }
    assert_eq!(held.len(), 40, "refused: {refused:?}");
    for status in &refused {
        assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        assert_eq!(error_reason(status), "INSUFFICIENT_STOCK");
    }
    let ids: HashSet<&str> = held
        .iter()
        .map(|(_, r)| r.reservation_id.as_str())
        .collect();
    assert_eq!(ids.len(), 40);
    assert_eq!(apps[0].level("HOT").await, (40, 40));
    assert_eq!(stored_keys(&apps[0]).await, 40);

    // Every winner retried at another replica gets its own reservation back.
    for (i, reservation) in &held {
        let mut client = apps[(i + 1) % apps.len()].client.clone();
        let again = client
            .reserve(reserve(&format!("racer-{i}"), &[("HOT", 1)]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(again.reservation_id, reservation.reservation_id);
    }
    assert_eq!(apps[0].level("HOT").await, (40, 40));
}

#[tokio::test]
async fn a_hop_that_got_no_answer_never_turns_into_a_refusal_and_its_key_settles_it() {
    // A's peer port is reached through a proxy that can hold every byte: a frozen holder.
    let a_peer = inventory_testkit::ports::loopback(inventory_testkit::ports::free_port().unwrap());
    let proxy = inventory_testkit::proxy::Proxy::start(a_peer)
        .await
        .unwrap();
    let first = test_settings(fresh_database().await);
    let (database, prefix) = (
        first.database.config.clone(),
        first.redis.client.key_prefix.clone(),
    );
    let mut a = test_settings(database.clone());
    a.redis.client.key_prefix = prefix.clone();
    // A's lease outlasts everything below: only A may write HOT meanwhile.
    a.redis.leases.ttl = Duration::from_secs(60);
    a.peer = Some(PeerSettings {
        listen_addr: a_peer,
        advertise_addr: Some(proxy.addr()),
        secret: SECRET.to_vec().into(),
    });
    let mut b = test_settings(database);
    b.redis.client.key_prefix = prefix;
    b.peer = peers();
    // B waits for a lease at most this long: the bound, not the caller's deadline.
    b.inventory.lease_wait = Duration::from_millis(500);
    let (a, b) = (spawn_app_with(a).await, spawn_app_with(b).await);
    stock(&a, "HOT", 10).await;
    let (held, leader) = hold_leader(&a, "HOT").await;
    proxy.set_stalled(true);

    // B sends the call to A and hears nothing back (the caller set no deadline: the hop gives
    // up after B's lease wait and the write allowance); the lease stays A's. The wait here
    // then ends at B's bound before the key was claimed, while the call may still be written
    // at A: the answer must not say "nothing changed" (ABORTED), only that the outcome is
    // unknown.
    let unknown = b
        .client
        .clone()
        .reserve(reserve("late", &[("HOT", 1)]))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::DeadlineExceeded, "{unknown:?}");
    assert_eq!(
        b.inventory
            .forwards()
            .failed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    // A thaws: the held call reaches it late, and may or may not be written there. Retrying
    // the key settles it either way: one reservation, never two.
    proxy.set_stalled(false);
    held.resume();
    leader.await.unwrap().unwrap();
    let settled = b
        .client
        .clone()
        .reserve(reserve("late", &[("HOT", 1)]))
        .await
        .expect("the retry settles the key")
        .into_inner();
    assert_eq!(settled.state(), ReservationState::Held);
    assert_eq!(
        a.count("SELECT count(*) FROM reservations WHERE idempotency_key = 'late'")
            .await,
        1
    );
    assert_eq!(a.level("HOT").await, (10, 2));
}
