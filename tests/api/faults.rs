//! The failure cases the design exists for, each driven deterministically: a holder paused past
//! its lease (a latch at a named pause point), a stale release, Redis forgetting its fence
//! counters, Redis dying, a response lost after commit.

use std::time::{Duration, Instant};

use fred::prelude::{ClientLike as _, KeysInterface as _};
use inventory_core::{domain::Sku, pause::PausePoint, ports::LeaseService as _};
use inventory_redis::{LeaseSettings, RedisLeases};
use inventory_server::proto::ReservationState;
use inventory_testkit::{
    process::{eventually, eventually_ok},
    redis::RedisNode,
};
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::helpers::{
    TestApp, confirm, error_reason, fresh_database, get_stock, release, reserve, spawn_app,
    spawn_app_with, stock, test_settings, test_settings_with_redis,
};

/// Waits until Redis has expired `key` by itself, after its TTL was cut to 1 ms.
async fn expire_now(app: &TestApp, key: &str) {
    let _: bool = app.redis.pexpire(key, 1, None).await.unwrap();
    for _ in 0..500 {
        let exists: i64 = app.redis.exists(key).await.unwrap();
        if exists == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("{key} did not expire");
}

/// Two replicas of one deployment: the same database, the same Redis keys.
pub(crate) async fn two_replicas() -> (TestApp, TestApp) {
    let first = test_settings(fresh_database().await);
    let mut second = test_settings(first.database.config.clone());
    second.redis.client.key_prefix = first.redis.client.key_prefix.clone();
    (spawn_app_with(first).await, spawn_app_with(second).await)
}

/// The stalled holder's lease on `sku` runs out and B, on `replica`, reserves 5 units (key
/// `b`) with a newer token: B's answer and the fence it stored.
async fn take_over(
    app: &TestApp,
    replica: &TestApp,
    sku: &str,
) -> (tonic::Response<inventory_server::proto::Reservation>, i64) {
    expire_now(app, &app.lease_key(sku)).await;
    let b = replica
        .client
        .clone()
        .reserve(reserve("b", &[(sku, 5)]))
        .await
        .unwrap();
    (b, app.stored_fence(sku).await)
}

#[tokio::test]
async fn a_holder_paused_past_its_lease_is_fenced_off_even_with_stock_to_spare() {
    // Two replicas of one deployment: same database, same Redis keys. (Within one replica the
    // second request would queue behind the stalled one instead of racing it.)
    let (app, replica) = two_replicas().await;
    // Plenty of stock: only the fence can stop the stale write.
    stock(&app, "SKU-1", 1_000).await;

    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut client_a = app.client.clone();
    let a = tokio::spawn(async move { client_a.reserve(reserve("a", &[("SKU-1", 7)])).await });
    held.reached().await;
    let token_a = app.redis_fence("SKU-1").await;

    // A stalls; its lease runs out; B, on the other replica, takes the SKU with a newer token
    // and commits.
    let (b, token_b) = take_over(&app, &replica, "SKU-1").await;
    assert!(token_b > token_a);

    held.resume();
    let status = a.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(error_reason(&status), "LEASE_LOST");
    assert!(status.get_details_retry_info().is_some());

    // A changed nothing: only B's units are held, the fence is B's, A left no trace.
    assert_eq!(app.level("SKU-1").await, (1_000, 5));
    assert_eq!(app.stored_fence("SKU-1").await, token_b);
    let rows: i64 = app
        .count("SELECT count(*) FROM reservations WHERE idempotency_key = 'a'")
        .await;
    assert_eq!(rows, 0);
    let keys: i64 = app
        .count("SELECT count(*) FROM idempotency_keys WHERE key = 'a'")
        .await;
    assert_eq!(keys, 0, "a lost lease is transient: the key is not stored");
    assert_eq!(b.into_inner().state(), ReservationState::Held);

    // A's retry with the same key is a fresh attempt, and wins legitimately.
    let retry = app
        .client
        .clone()
        .reserve(reserve("a", &[("SKU-1", 7)]))
        .await
        .unwrap();
    assert_eq!(retry.into_inner().state(), ReservationState::Held);
    assert_eq!(app.level("SKU-1").await, (1_000, 12));
}

#[tokio::test]
async fn a_next_leader_paused_on_a_handed_lease_is_fenced_off_and_writes_nothing() {
    // The renewed-lease path: a coalescing leader with requests queued behind it keeps its
    // lease (renewed, with the next token) and hands it to the next leader instead of
    // releasing it. That next leader stalls past the lease; another replica takes the SKU.
    let (app, replica) = two_replicas().await;
    stock(&app, "SKU-1", 1_000).await;

    let (held, leader) = crate::coalescing::hold_leader(&app, "SKU-1").await;
    let a2 = crate::coalescing::queue(&app, "SKU-1", reserve("a2", &[("SKU-1", 2)])).await;
    let a3 = crate::coalescing::queue(&app, "SKU-1", reserve("a3", &[("SKU-1", 3)])).await;
    let mut handed = app.pauses.arm(PausePoint::LeaseHanded);
    held.resume();
    leader.await.unwrap().unwrap();
    let token_leader = app.stored_fence("SKU-1").await;
    tokio::time::timeout(Duration::from_secs(10), handed.reached())
        .await
        .expect("the next leader writes under the lease the leader kept");
    assert_eq!(app.inventory.handed_batches(), 1);
    // The renewal took the next token for the same holder: the lease is still taken.
    let token_handed = app.redis_fence("SKU-1").await;
    assert_eq!(token_handed, token_leader + 1);
    let exists: i64 = app.redis.exists(app.lease_key("SKU-1")).await.unwrap();
    assert_eq!(exists, 1, "the kept lease was not released");

    let (_, token_b) = take_over(&app, &replica, "SKU-1").await;
    assert!(token_b > token_handed);

    handed.resume();
    for call in [a2, a3] {
        let status = call.await.unwrap().unwrap_err();
        assert_eq!(status.code(), Code::Aborted, "{status:?}");
        assert_eq!(error_reason(&status), "LEASE_LOST");
    }
    // Only the leader's unit and B's are held; the stale batch left no trace.
    assert_eq!(app.level("SKU-1").await, (1_000, 6));
    assert_eq!(app.stored_fence("SKU-1").await, token_b);
    let rows: i64 = app
        .count("SELECT count(*) FROM reservations WHERE idempotency_key IN ('a2', 'a3')")
        .await;
    assert_eq!(rows, 0);
}

/// Leases on `app`'s Redis keys, as the service takes them.
async fn leases_of(app: &TestApp) -> RedisLeases {
    leases_with(app, LeaseSettings::default()).await
}

/// Leases on `app`'s Redis keys with `settings`: another replica's, when called again.
async fn leases_with(app: &TestApp, settings: LeaseSettings) -> RedisLeases {
    let leases = RedisLeases::new(
        inventory_redis::Redis::connect(
            inventory_redis::parse_url(&crate::helpers::redis_url()).unwrap(),
            &inventory_redis::RedisSettings {
                key_prefix: app.key_prefix.clone(),
                command_timeout: Duration::from_millis(250),
                connect_timeout: Duration::from_secs(1),
            },
        )
        .unwrap(),
        settings,
    );
    assert!(leases.redis().wait_connected(Duration::from_secs(5)).await);
    leases
}

#[tokio::test]
async fn a_replica_waiting_for_a_lease_takes_it_when_another_releases_it_not_after_its_backoff() {
    let app = spawn_app().await;
    let sku = Sku::parse("SKU-1").unwrap();
    let a = leases_of(&app).await;
    // B's backoff step is an hour: only the release message can wake it in time.
    let b = leases_with(
        &app,
        LeaseSettings {
            min_backoff: Duration::from_secs(3_600),
            max_backoff: Duration::from_secs(3_600),
            ..LeaseSettings::default()
        },
    )
    .await;
    let deadline = || Instant::now() + Duration::from_secs(7_200);
    eventually(
        "B subscribed to lease releases",
        Duration::from_secs(10),
        || async { b.hears_releases() },
    )
    .await
    .unwrap();
    let b = std::sync::Arc::new(b);

    // A holds the lease, B is refused and sleeps its hour, A releases.
    let a_lease = a.acquire(&sku, deadline()).await.unwrap();
    let refused = b.refused_attempts();
    let call = {
        let (b, sku) = (b.clone(), sku.clone());
        tokio::spawn(async move { b.acquire(&sku, deadline()).await })
    };
    while b.refused_attempts() == refused {
        tokio::task::yield_now().await;
    }
    assert!(a.release(&a_lease).await.unwrap());
    let b_lease = tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .expect("B slept out its backoff instead of hearing the release")
        .unwrap()
        .unwrap();
    assert!(b_lease.fence > a_lease.fence);
    assert!(b.is_held(&b_lease).await.unwrap());
}

#[tokio::test]
async fn a_renewal_keeps_the_holder_with_a_newer_token_and_fails_once_the_lease_passed_on() {
    let app = spawn_app().await;
    let leases = leases_of(&app).await;
    let sku = Sku::parse("SKU-1").unwrap();
    let deadline = || Instant::now() + Duration::from_secs(5);

    let a = leases.acquire(&sku, deadline()).await.unwrap();
    let renewed = leases
        .renew(&a)
        .await
        .unwrap()
        .expect("A still holds the lease");
    assert_eq!(renewed.holder, a.holder);
    assert_eq!(renewed.fence.get(), a.fence.get() + 1);
    assert!(leases.is_held(&renewed).await.unwrap());

    // The lease runs out and B takes it: A's renewal is refused and takes no token.
    expire_now(&app, &app.lease_key("SKU-1")).await;
    let b = leases.acquire(&sku, deadline()).await.unwrap();
    assert!(b.fence > renewed.fence);
    assert_eq!(leases.renew(&renewed).await.unwrap(), None);
    assert_eq!(app.redis_fence("SKU-1").await, b.fence.get());
    assert!(leases.is_held(&b).await.unwrap(), "B still holds the lease");
}

#[tokio::test]
async fn a_stale_release_does_not_delete_the_next_holders_lease() {
    let app = spawn_app().await;
    let leases = leases_of(&app).await;
    let sku = Sku::parse("SKU-1").unwrap();
    let deadline = || Instant::now() + Duration::from_secs(5);

    let a = leases.acquire(&sku, deadline()).await.unwrap();
    expire_now(&app, &app.lease_key("SKU-1")).await;
    let b = leases.acquire(&sku, deadline()).await.unwrap();
    assert!(b.fence > a.fence);

    assert!(
        !leases.release(&a).await.unwrap(),
        "A no longer holds the lease"
    );
    assert!(!leases.is_held(&a).await.unwrap());
    assert!(
        leases.is_held(&b).await.unwrap(),
        "B's lease survived A's release"
    );
    let holder: Option<String> = app.redis.get(app.lease_key("SKU-1")).await.unwrap();
    assert_eq!(holder.as_deref(), Some(b.holder.as_str()));
    assert!(leases.release(&b).await.unwrap());
    assert_ne!(a.holder, b.holder);
    assert_eq!(a.holder.len(), 32, "128 random bits, hex");
}

/// After a few writes, Redis loses the fence counter in some way; the next `Reserve` must
/// still succeed, with a token above the one PostgreSQL stored.
async fn survives_counter_loss(app: &mut TestApp, lose: impl std::future::Future<Output = ()>) {
    stock(app, "SKU-1", 100).await;
    for i in 0..3 {
        app.client
            .reserve(reserve(&format!("before-{i}"), &[("SKU-1", 1)]))
            .await
            .unwrap();
    }
    let stored_before = app.stored_fence("SKU-1").await;
    assert!(stored_before >= 3);

    lose.await;
    assert!(
        app.redis_fence("SKU-1").await < stored_before,
        "the counter was lost"
    );

    let after = app
        .client
        .reserve(reserve("after", &[("SKU-1", 1)]))
        .await
        .expect("a legitimate holder is not locked out");
    assert_eq!(after.into_inner().state(), ReservationState::Held);
    let stored_after = app.stored_fence("SKU-1").await;
    assert!(
        stored_after > stored_before,
        "{stored_after} > {stored_before}"
    );
    assert!(
        app.redis_fence("SKU-1").await >= stored_after,
        "the counter was raised, not lowered"
    );
    assert_eq!(app.level("SKU-1").await, (100, 4));
}

#[tokio::test]
async fn a_wiped_fence_counter_heals_itself() {
    let mut app = spawn_app().await;
    let key = app.fence_key("SKU-1");
    let redis = app.redis.clone();
    survives_counter_loss(&mut app, async move {
        let _: i64 = redis.del(key).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_flushed_redis_heals_itself() {
    let redis_process = RedisNode::start_scratch().await.unwrap();
    let mut app = spawn_app_with(test_settings_with_redis(
        fresh_database().await,
        &redis_process.url(),
    ))
    .await;
    let redis = app.redis.clone();
    survives_counter_loss(&mut app, async move {
        let _: () = redis.flushall(false).await.unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_redis_restarted_empty_heals_itself() {
    let mut redis_process = RedisNode::start_scratch().await.unwrap();
    let mut app = spawn_app_with(test_settings_with_redis(
        fresh_database().await,
        &redis_process.url(),
    ))
    .await;
    let observer = app.redis.clone();
    let server = app.client.clone();
    survives_counter_loss(&mut app, async {
        redis_process.kill().await.unwrap();
        redis_process.restart().await.unwrap();
        // Both the service's client and the test's reconnect on their own.
        wait_until_reserving(server, "reconnect-probe").await;
        let _ = observer.ping::<()>(None).await;
    })
    .await;
}

/// Retries one `Reserve` (same key, so at most one takes effect) until Redis is back.
async fn wait_until_reserving(
    client: inventory_server::proto::inventory_service_client::InventoryServiceClient<
        tonic::transport::Channel,
    >,
    key: &str,
) {
    eventually_ok(
        "Reserve comes back after Redis did",
        Duration::from_secs(10),
        || {
            let mut client = client.clone();
            async move {
                match client.reserve(reserve(key, &[("PROBE", 1)])).await {
                    // PROBE does not exist: NOT_FOUND proves the lease was granted again.
                    Err(status) if status.code() == Code::NotFound => Ok(()),
                    Err(status) if status.code() == Code::Unavailable => Err(status),
                    other => panic!("unexpected {other:?}"),
                }
            }
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn with_redis_down_reserve_fails_closed_and_everything_else_works() {
    let mut redis_process = RedisNode::start_scratch().await.unwrap();
    let mut app = spawn_app_with(test_settings_with_redis(
        fresh_database().await,
        &redis_process.url(),
    ))
    .await;
    stock(&app, "SKU-1", 10).await;
    let to_confirm = app.hold("c", &[("SKU-1", 2)]).await;
    let to_release = app.hold("r", &[("SKU-1", 3)]).await;

    redis_process.kill().await.unwrap();
    let before = app.row_counts().await;
    for attempt in 0..3 {
        let started = Instant::now();
        let status = app
            .client
            .reserve(reserve(&format!("down-{attempt}"), &[("SKU-1", 1)]))
            .await
            .unwrap_err();
        let took = started.elapsed();
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(error_reason(&status), "REDIS_UNAVAILABLE");
        assert!(took < Duration::from_secs(2), "answered in {took:?}");
    }
    assert_eq!(app.row_counts().await, before, "Reserve wrote nothing");
    assert_eq!(app.level("SKU-1").await, (10, 5));

    // None of these can oversell, so none needs Redis.
    let levels = app
        .client
        .get_stock(get_stock(&["SKU-1"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(levels.levels[0].reserved, 5);
    let confirmed = app
        .client
        .confirm_reservation(confirm(&to_confirm.reservation_id))
        .await
        .unwrap();
    assert_eq!(confirmed.into_inner().state(), ReservationState::Confirmed);
    let released = app
        .client
        .release_reservation(release(&to_release.reservation_id))
        .await
        .unwrap();
    assert_eq!(released.into_inner().state(), ReservationState::Released);
    assert_eq!(app.level("SKU-1").await, (8, 0));

    // Redis returns: Reserve works again, without a restart of the service.
    redis_process.restart().await.unwrap();
    let back = eventually_ok("Reserve works again", Duration::from_secs(10), || async {
        let answer = app
            .client
            .clone()
            .reserve(reserve("after", &[("SKU-1", 1)]))
            .await;
        if let Err(status) = &answer {
            assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        }
        answer
    })
    .await
    .unwrap();
    assert_eq!(back.into_inner().state(), ReservationState::Held);
}

#[tokio::test]
async fn a_busy_lease_past_the_servers_wait_bound_is_aborted_with_retry_advice() {
    let mut settings = crate::helpers::test_settings(fresh_database().await);
    settings.inventory.lease_wait = Duration::from_millis(200);
    let app = spawn_app_with(settings).await;
    stock(&app, "SKU-1", 10).await;
    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut client_a = app.client.clone();
    let a = tokio::spawn(async move { client_a.reserve(reserve("a", &[("SKU-1", 1)])).await });
    held.reached().await;

    // B sets no deadline; the server gives up waiting after LEASE_WAIT.
    let status = app
        .client
        .clone()
        .reserve(reserve("b", &[("SKU-1", 1)]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_eq!(error_reason(&status), "LEASE_BUSY");
    let delay = status
        .get_details_retry_info()
        .unwrap()
        .retry_delay
        .unwrap();
    // The same delay where gRPC's own retries (service config) look for it.
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        delay.as_millis().to_string().as_str()
    );

    held.resume();
    assert!(a.await.unwrap().is_ok());
    assert_eq!(app.level("SKU-1").await, (10, 1));
}

#[tokio::test]
async fn a_50ms_client_deadline_during_a_held_lease_is_deadline_exceeded_promptly() {
    let app = spawn_app().await;
    stock(&app, "SKU-1", 10).await;
    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut client_a = app.client.clone();
    let a = tokio::spawn(async move { client_a.reserve(reserve("a", &[("SKU-1", 1)])).await });
    held.reached().await;

    let mut request = tonic::Request::new(reserve("b", &[("SKU-1", 1)]));
    request.set_timeout(Duration::from_millis(50));
    let started = Instant::now();
    let status = app.client.clone().reserve(request).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );

    held.resume();
    assert!(a.await.unwrap().is_ok());
    // B never got its lease, so it changed nothing.
    assert_eq!(app.level("SKU-1").await, (10, 1));
}

#[tokio::test]
async fn a_response_lost_after_commit_is_recovered_by_retrying_the_key() {
    let app = spawn_app().await;
    stock(&app, "SKU-1", 10).await;
    let mut held = app.pauses.arm(PausePoint::Committed);
    let mut client = app.client.clone();
    let lost = tokio::spawn(async move { client.reserve(reserve("k1", &[("SKU-1", 4)])).await });
    held.reached().await;
    // The client gives up while the server sits between commit and response.
    lost.abort();
    let _ = lost.await;
    held.resume();

    let retry = app.hold("k1", &[("SKU-1", 4)]).await;
    assert_eq!(retry.state(), ReservationState::Held);
    assert_eq!(app.level("SKU-1").await, (10, 4), "stock moved once");
    let count: i64 = app.count("SELECT count(*) FROM reservations").await;
    assert_eq!(count, 1);
}

#[tokio::test]
async fn a_large_cart_survives_lost_counters_in_one_call() {
    let mut app = spawn_app().await;
    let skus = ["C1", "C2", "C3", "C4", "C5", "C6"];
    for sku in skus {
        stock(&app, sku, 10).await;
    }
    let cart: Vec<(&str, i64)> = skus.iter().map(|sku| (*sku, 1)).collect();
    app.client.reserve(reserve("first", &cart)).await.unwrap();
    for sku in skus {
        let _: i64 = app.redis.del(app.fence_key(sku)).await.unwrap();
    }
    // Every line is fenced at once; all counters are raised in one recovery.
    let second = app.client.reserve(reserve("second", &cart)).await;
    assert!(second.is_ok(), "{second:?}");
    for sku in skus {
        assert_eq!(app.level(sku).await, (10, 2));
    }
}

#[tokio::test]
async fn a_caller_that_gives_up_mid_reserve_does_not_leave_the_sku_blocked() {
    // A long lease TTL: if the abandoned call left its lease behind, the SKU would stay blocked.
    let mut settings = crate::helpers::test_settings(fresh_database().await);
    settings.redis.leases.ttl = Duration::from_secs(60);
    let app = spawn_app_with(settings).await;
    stock(&app, "SKU-1", 10).await;

    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut client = app.client.clone();
    let abandoned =
        tokio::spawn(async move { client.reserve(reserve("gone", &[("SKU-1", 1)])).await });
    held.reached().await;
    abandoned.abort();
    let _ = abandoned.await;
    held.resume();

    // The work finishes without its caller: committed, lease released.
    let next = tokio::time::timeout(
        Duration::from_secs(10),
        app.client.clone().reserve(reserve("next", &[("SKU-1", 1)])),
    )
    .await
    .expect("the SKU is not blocked for the lease TTL")
    .unwrap();
    assert_eq!(next.into_inner().state(), ReservationState::Held);
    let retry = app
        .client
        .clone()
        .reserve(reserve("gone", &[("SKU-1", 1)]))
        .await
        .unwrap();
    assert_eq!(retry.into_inner().state(), ReservationState::Held);
    assert_eq!(
        app.level("SKU-1").await,
        (10, 2),
        "the abandoned call committed once"
    );
}
