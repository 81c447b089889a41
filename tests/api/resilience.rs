//! Bounded work and honest clocks: admission that counts the work rather than the answer,
//! expiry judged when a statement acts, and a lease granted too late given back.

use std::time::{Duration, Instant, SystemTime};

use fred::prelude::{ClientLike as _, KeysInterface as _};
use inventory_server::proto::{ConfirmReservationRequest, ReserveRequest};
use inventory_testkit::{eventually, process::eventually_ok, proxy::Proxy, redis::RedisNode};
use tonic::{Code, Request};

use crate::helpers::{
    TestApp, connect, fresh_database, get_stock, reserve, spawn_app_with, stock, test_settings,
};

/// A second session on the test's database, to hold row locks the service must wait for.
async fn locker(app: &TestApp) -> tokio_postgres::Client {
    connect(&app.database_config().await).await
}

/// Sessions of this database (other than the test's own) waiting for a row lock.
async fn lock_waiters(app: &TestApp) -> i64 {
    app.count(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND wait_event_type = 'Lock'",
    )
    .await
}

/// Waits until `n` sessions wait for a lock: the service's statement is then blocked where
/// the test wants it. Bounded, so a wrong expectation fails instead of hanging.
async fn until_lock_waiters(app: &TestApp, n: i64) {
    eventually(
        "a session waits for the lock",
        Duration::from_secs(20),
        || async { lock_waiters(app).await >= n },
    )
    .await
    .unwrap();
}

fn with_timeout<T>(message: T, timeout: Duration) -> Request<T> {
    let mut request = Request::new(message);
    request.set_timeout(timeout);
    request
}

#[tokio::test]
async fn calls_that_give_up_early_still_hold_their_admission_until_the_work_ends() {
    const MAX_IN_FLIGHT: usize = 4;
    let mut settings = test_settings(fresh_database().await);
    settings.server.max_in_flight = MAX_IN_FLIGHT;
    let app = spawn_app_with(settings).await;
    let skus: Vec<String> = (0..20).map(|i| format!("FLOOD-{i:02}")).collect();
    for sku in &skus {
        stock(&app, sku, 10).await;
    }
    // Every SKU's row is locked: each Reserve that gets through blocks in SQL.
    let locker = locker(&app).await;
    locker.batch_execute("BEGIN").await.unwrap();
    locker
        .execute(
            "SELECT 1 FROM stock WHERE sku = ANY($1) FOR UPDATE",
            &[&skus],
        )
        .await
        .unwrap();

    let mut codes = Vec::new();
    for (i, sku) in skus.iter().enumerate() {
        let request = with_timeout(
            reserve(&format!("flood-{i}"), &[(sku, 1)]),
            Duration::from_millis(50),
        );
        let code = match app.client.clone().reserve(request).await {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        codes.push(code);
    }
    let shed = codes
        .iter()
        .filter(|code| **code == Code::ResourceExhausted)
        .count();
    assert!(
        shed > 0,
        "calls that answered DEADLINE_EXCEEDED kept their permits while their work went on: {codes:?}"
    );
    // A call past its deadline hears DEADLINE_EXCEEDED from its own client or, when the
    // server's deadline handling answers first, CANCELLED: both mean it gave up.
    assert!(
        codes.iter().all(|code| matches!(
            code,
            Code::DeadlineExceeded | Code::Cancelled | Code::ResourceExhausted
        )),
        "{codes:?}"
    );
    // However many calls were answered, no more reservations than MAX_IN_FLIGHT run at once.
    assert!(lock_waiters(&app).await <= MAX_IN_FLIGHT as i64);
    locker.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn a_hold_that_waited_on_a_lock_is_dated_from_when_it_acted() {
    let app = crate::helpers::spawn_app().await;
    stock(&app, "SLOW-LOCK", 5).await;
    let locker = locker(&app).await;
    locker.batch_execute("BEGIN").await.unwrap();
    locker
        .execute(
            "SELECT 1 FROM stock WHERE sku = 'SLOW-LOCK' FOR UPDATE",
            &[],
        )
        .await
        .unwrap();

    let sent = Instant::now();
    let request = ReserveRequest {
        ttl: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        ..reserve("slow-1", &[("SLOW-LOCK", 1)])
    };
    let mut client = app.client.clone();
    let call = tokio::spawn(async move { client.reserve(request).await });
    until_lock_waiters(&app, 1).await;
    // The scenario itself: the transaction waits on the lock longer than the hold lasts.
    tokio::time::sleep_until((sent + Duration::from_millis(1500)).into()).await;
    locker.batch_execute("COMMIT").await.unwrap();

    let hold = call.await.unwrap().unwrap().into_inner();
    let expires_at = SystemTime::try_from(hold.expires_at.unwrap()).unwrap();
    let created_at = SystemTime::try_from(hold.created_at.unwrap()).unwrap();
    assert!(
        expires_at > SystemTime::now(),
        "a 1 s hold answered after 1.5 s must not have expired already"
    );
    assert_eq!(
        expires_at.duration_since(created_at).unwrap(),
        Duration::from_secs(1)
    );
}

#[tokio::test]
async fn a_confirm_that_locks_the_hold_after_it_expired_is_refused() {
    let mut settings = test_settings(fresh_database().await);
    // The sweeper stays out of the way: the confirm alone decides.
    settings.upkeep.interval = Duration::from_secs(3600);
    let app = spawn_app_with(settings).await;
    stock(&app, "LATE-CONFIRM", 5).await;
    let request = ReserveRequest {
        ttl: Some(prost_types::Duration {
            seconds: 1,
            nanos: 0,
        }),
        ..reserve("late-1", &[("LATE-CONFIRM", 1)])
    };
    let hold = app
        .client
        .clone()
        .reserve(request)
        .await
        .unwrap()
        .into_inner();
    let expires_at = SystemTime::try_from(hold.expires_at.unwrap()).unwrap();
    let id = uuid::Uuid::parse_str(&hold.reservation_id).unwrap();

    let locker = locker(&app).await;
    locker.batch_execute("BEGIN").await.unwrap();
    locker
        .execute(
            "SELECT 1 FROM reservations WHERE reservation_id = $1 FOR UPDATE",
            &[&id],
        )
        .await
        .unwrap();
    // The confirm's transaction begins before the hold expires, and waits for the row.
    let mut client = app.client.clone();
    let reservation_id = hold.reservation_id.clone();
    let confirm = tokio::spawn(async move {
        client
            .confirm_reservation(ConfirmReservationRequest {
                reservation_id,
                ..Default::default()
            })
            .await
    });
    until_lock_waiters(&app, 1).await;
    assert!(
        SystemTime::now() < expires_at,
        "the confirm began before the expiry"
    );
    let past_expiry =
        expires_at.duration_since(SystemTime::now()).unwrap() + Duration::from_millis(200);
    tokio::time::sleep(past_expiry).await;
    locker.batch_execute("COMMIT").await.unwrap();

    let status = confirm.await.unwrap().unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert_eq!(
        crate::helpers::error_reason(&status),
        "INVALID_RESERVATION_STATE"
    );
    assert_eq!(
        app.level("LATE-CONFIRM").await,
        (5, 1),
        "nothing shipped: the unit is the sweeper's to return"
    );
}

#[tokio::test]
async fn a_lease_granted_after_its_grant_timed_out_is_given_back() {
    let redis = RedisNode::start_scratch().await.unwrap();
    let mut settings =
        crate::helpers::test_settings_with_redis(fresh_database().await, &redis.url());
    // Long enough that an unreleased lease would still be there when the test looks.
    settings.redis.leases.ttl = Duration::from_secs(60);
    settings.inventory.coalesce.max_batch = 1;
    let app = spawn_app_with(settings).await;
    stock(&app, "LATE-GRANT", 5).await;
    // Loads the lease scripts into this fresh Redis, so the late grant is one EVALSHA.
    stock(&app, "WARM-UP", 1).await;
    app.hold("warm-up", &[("WARM-UP", 1)]).await;

    redis.pause().await.unwrap();
    let status = app
        .client
        .clone()
        .reserve(reserve("late-grant", &[("LATE-GRANT", 1)]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    // Redis runs the grant it was sent, then the release that followed it.
    redis.resume().await.unwrap();
    let lease = app.lease_key("LATE-GRANT");
    eventually_ok(
        "the late grant is given back",
        Duration::from_secs(10),
        || async {
            // The grant ran (the fence moved) and its lease is gone again: given back, not
            // expired.
            let fence: Option<i64> = app.redis.get(app.fence_key("LATE-GRANT")).await.unwrap();
            let holder: Option<String> = app.redis.get(&lease).await.unwrap();
            if fence == Some(1) && holder.is_none() {
                Ok(())
            } else {
                Err(format!(
                    "the late grant still blocks the SKU (fence {fence:?}, holder {holder:?})"
                ))
            }
        },
    )
    .await
    .unwrap();
    // And the SKU is free at once for the next caller.
    app.hold("after-late-grant", &[("LATE-GRANT", 1)]).await;
}

#[tokio::test]
async fn event_streams_have_a_cap_of_their_own() {
    let mut settings = test_settings(fresh_database().await);
    settings.server.max_watchers = 2;
    let app = spawn_app_with(settings).await;
    let watch = || {
        let mut client = app.client.clone();
        async move {
            client
                .watch_events(inventory_server::proto::WatchEventsRequest {
                    after_sequence: 0,
                    ..Default::default()
                })
                .await
        }
    };
    let first = watch().await.unwrap();
    let _second = watch().await.unwrap();
    let refused = watch().await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(crate::helpers::error_reason(&refused), "TOO_MANY_WATCHERS");
    // Unary calls are not counted against it.
    stock(&app, "CAP-1", 1).await;

    drop(first);
    eventually(
        "a closed stream frees its place",
        Duration::from_secs(10),
        || async { app.events.watching() <= 1 },
    )
    .await
    .unwrap();
    watch().await.expect("a place was freed");
}

#[tokio::test]
async fn a_consumer_that_stops_reading_during_catch_up_does_not_hold_shutdown() {
    use tonic::transport::Endpoint;
    let grace = Duration::from_secs(3);
    let mut settings = test_settings(fresh_database().await);
    settings.server.shutdown_grace = grace;
    let mut app = spawn_app_with(settings).await;
    // More than the server's HTTP/2 send buffer and the watcher's queue hold together:
    // about 1,100 events of ~450 bytes (long SKUs, long reasons).
    use futures::StreamExt as _;
    let reason = "r".repeat(256);
    futures::stream::iter(0..1100)
        .map(|i| {
            let mut client = app.client.clone();
            let reason = reason.clone();
            async move {
                client
                    .adjust_stock(inventory_server::proto::AdjustStockRequest {
                        sku: format!("{:-<60}{:04}", "STUCK", i % 50),
                        delta: 1,
                        idempotency_key: format!("stuck-{i}"),
                        reason,
                        ..Default::default()
                    })
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<()>>()
        .await;
    // A client with tiny HTTP/2 windows that never reads: the server can send it almost
    // nothing, and its watcher's queue fills during catch-up.
    let channel = Endpoint::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .initial_stream_window_size(Some(1024))
        .initial_connection_window_size(Some(1024))
        .connect()
        .await
        .unwrap();
    let _stuck =
        inventory_server::proto::inventory_service_client::InventoryServiceClient::new(channel)
            .watch_events(inventory_server::proto::WatchEventsRequest {
                after_sequence: 0,
                ..Default::default()
            })
            .await
            .unwrap();
    eventually(
        "the watcher's queue fills",
        Duration::from_secs(20),
        || async { app.events.most_queued() >= inventory_server::events::WATCH_BUFFER },
    )
    .await
    .unwrap();

    let stopping = Instant::now();
    app.begin_stop();
    // The stuck watcher lets go at once, not when the grace period is over.
    while app.events.watching() > 0 {
        assert!(
            stopping.elapsed() < grace / 2,
            "the stuck watcher still runs after shutdown began"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    app.stop().await.unwrap();
    assert!(
        stopping.elapsed() < grace + Duration::from_secs(1),
        "shutdown took {:?}",
        stopping.elapsed()
    );
}

#[tokio::test]
async fn reserves_for_skus_that_do_not_exist_leave_redis_as_it_was() {
    use futures::StreamExt as _;
    let app = crate::helpers::spawn_app().await;
    stock(&app, "REAL-1", 1).await;
    let calls = 10_000;
    let refused = futures::stream::iter(0..calls)
        .map(|i| {
            let mut client = app.client.clone();
            async move {
                // Multi-line carts now and then: both write paths see unknown SKUs.
                let lines: Vec<(String, i64)> = if i % 10 == 0 {
                    vec![(format!("JUNK-{i}"), 1), (format!("JUNK-{i}-B"), 1)]
                } else {
                    vec![(format!("JUNK-{i}"), 1)]
                };
                let lines: Vec<(&str, i64)> = lines.iter().map(|(s, q)| (s.as_str(), *q)).collect();
                client
                    .reserve(reserve(&format!("junk-{i}"), &lines))
                    .await
                    .unwrap_err()
                    .code()
            }
        })
        .buffer_unordered(64)
        .filter(|code| std::future::ready(*code == Code::NotFound))
        .count()
        .await;
    assert_eq!(refused, calls, "every call names SKUs that do not exist");
    app.hold("real", &[("REAL-1", 1)]).await;

    let pattern = format!("{}:*", app.key_prefix.as_str());
    let keys: Vec<String> = app
        .redis
        .custom(fred::cmd!("KEYS"), vec![pattern])
        .await
        .unwrap();
    assert!(
        keys.len() <= 10,
        "{} keys left behind by {calls} calls for made-up SKUs: {:?}",
        keys.len(),
        &keys[..keys.len().min(5)]
    );
    // The real SKU keeps its fence counter.
    assert!(keys.iter().any(|key| key.contains("{REAL-1}")), "{keys:?}");
}

#[tokio::test]
async fn a_database_that_stops_answering_costs_each_call_a_bound_and_the_replica_recovers() {
    use inventory_core::pause::PausePoint;
    let direct = fresh_database().await;
    let upstream = format!(
        "127.0.0.1:{}",
        crate::helpers::admin_config().get_ports()[0]
    );
    let proxy = Proxy::start(upstream.parse().unwrap()).await.unwrap();
    let through: inventory_postgres::PgConfig = format!(
        "postgres://postgres@127.0.0.1:{}/{}",
        proxy.addr().port(),
        direct.get_dbname().unwrap()
    )
    .parse()
    .unwrap();
    let mut settings = test_settings(through);
    settings.database.pool.statement_timeout = Duration::from_millis(500);
    settings.database.pool.acquire_timeout = Duration::from_secs(1);
    let bound = settings.database.pool.operation_bound();
    let app = spawn_app_with(settings).await;
    stock(&app, "HUNG-A", 5).await;
    stock(&app, "HUNG-B", 5).await;

    // A's reservation has its lease; the database goes silent before its transaction.
    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut client = app.client.clone();
    let stuck =
        tokio::spawn(async move { client.reserve(reserve("hung-a", &[("HUNG-A", 1)])).await });
    held.reached().await;
    proxy.set_stalled(true);
    let stalled = Instant::now();
    held.resume();

    // Another SKU's call on the same replica: an answer, not a hang. It may queue behind A's
    // write for the replica's group commit, then pays its own bound.
    let other = app
        .client
        .clone()
        .reserve(reserve("hung-b", &[("HUNG-B", 1)]))
        .await
        .unwrap_err();
    assert_eq!(other.code(), Code::Unavailable, "{other:?}");
    assert!(
        stalled.elapsed() < bound * 2 + Duration::from_secs(1),
        "answered after {:?} (bound {bound:?})",
        stalled.elapsed()
    );
    let stuck = stuck.await.unwrap().unwrap_err();
    assert_eq!(stuck.code(), Code::Unavailable, "{stuck:?}");
    // Reads are bounded the same way.
    let read = app
        .client
        .clone()
        .get_stock(get_stock(&["HUNG-B"]))
        .await
        .unwrap_err();
    assert_eq!(read.code(), Code::Unavailable, "{read:?}");

    // The network comes back: the replica recovers by itself.
    proxy.set_stalled(false);
    eventually_ok("the replica recovers", Duration::from_secs(20), || {
        let mut client = app.client.clone();
        async move { client.reserve(reserve("hung-b", &[("HUNG-B", 1)])).await }
    })
    .await
    .unwrap();
    // A's retry with its key settles what became of it.
    app.client
        .clone()
        .reserve(reserve("hung-a", &[("HUNG-A", 1)]))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_key_pruned_between_claim_and_read_is_claimed_again_not_an_internal_error() {
    use inventory_core::pause::PausePoint;
    let app = crate::helpers::spawn_app().await;
    stock(&app, "PRUNED-KEY", 5).await;
    let first = app.hold("pruned-1", &[("PRUNED-KEY", 1)]).await;

    // The retry finds the key taken; before it reads the record, retention removes it.
    let mut held = app.pauses.arm(PausePoint::KeyTaken);
    let mut client = app.client.clone();
    let retry = tokio::spawn(async move {
        client
            .reserve(reserve("pruned-1", &[("PRUNED-KEY", 1)]))
            .await
    });
    held.reached().await;
    app.db
        .execute("DELETE FROM idempotency_keys WHERE key = 'pruned-1'", &[])
        .await
        .unwrap();
    held.resume();

    // Past retention a key is free again: the retry is a new request, answered as one.
    let second = retry
        .await
        .unwrap()
        .expect("claimed again, not INTERNAL")
        .into_inner();
    assert_ne!(second.reservation_id, first.reservation_id);
    assert_eq!(app.level("PRUNED-KEY").await, (5, 2));
}

/// A pooled connection carries the statement bounds, and the options of `DATABASE_URL` too:
/// the plan cache mode a `Reserve` sets is its transaction's alone (`SET LOCAL`), the
/// session's stays the operator's.
#[tokio::test]
async fn pooled_connections_carry_the_statement_bounds_and_the_urls_own_options() {
    let database = fresh_database().await;
    let settings = inventory_postgres::PoolSettings {
        statement_timeout: Duration::from_millis(1500),
        ..Default::default()
    };
    let show = |pool: inventory_postgres::Pool| async move {
        let client = pool.get().await.expect("a pooled connection");
        let mut values = Vec::new();
        for name in ["plan_cache_mode", "statement_timeout", "lock_timeout"] {
            let row = client
                .query_one(&format!("SHOW {name}"), &[])
                .await
                .expect("SHOW");
            values.push(row.get::<_, String>(0));
        }
        values
    };
    let pool = inventory_postgres::connect(database.clone(), &settings).expect("a pool");
    assert_eq!(show(pool).await, ["auto", "1500ms", "1500ms"]);

    let mut theirs = database.clone();
    theirs.options("-c plan_cache_mode=force_custom_plan");
    let pool = inventory_postgres::connect(theirs, &settings).expect("a pool");
    assert_eq!(show(pool).await, ["force_custom_plan", "1500ms", "1500ms"]);
}
