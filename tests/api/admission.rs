//! Admission control: load shedding, the per-SKU waiter cap, message size limits.

use inventory_core::pause::PausePoint;
use inventory_server::proto::{ReservationLine, ReserveRequest};
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::helpers::{
    error_reason, fresh_database, get_stock, reserve, spawn_app_with, stock, test_settings,
};

#[tokio::test]
async fn a_saturated_server_sheds_load_and_recovers() {
    let mut settings = test_settings(fresh_database().await);
    settings.server.max_in_flight = 1;
    let app = spawn_app_with(settings).await;
    stock(&app, "SKU-1", 10).await;

    // One call in flight, held after its lease: the server is at its limit.
    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut client = app.client.clone();
    let a = tokio::spawn(async move { client.reserve(reserve("a", &[("SKU-1", 1)])).await });
    held.reached().await;

    let read = || {
        let mut client = app.client.clone();
        async move { client.get_stock(get_stock(&["SKU-1"])).await }
    };
    let status = read().await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(error_reason(&status), "SERVER_SATURATED");
    assert!(status.get_details_retry_info().is_some());

    held.resume();
    a.await.unwrap().unwrap();
    let level = read().await.expect("served again once the load is gone");
    assert_eq!(level.into_inner().levels[0].reserved, 1);
}

#[tokio::test]
async fn too_many_waiters_on_one_sku_are_refused_at_once() {
    let mut settings = test_settings(fresh_database().await);
    // LEASE_MAX_WAITERS=1 bounds both the lease waiters and the coalescing queue.
    settings.redis.leases.max_waiters = 1;
    settings.inventory.coalesce.max_queued = 1;
    let app = spawn_app_with(settings).await;
    stock(&app, "HOT", 10).await;

    let mut held = app.pauses.arm(PausePoint::LeaseGranted);
    let mut client = app.client.clone();
    let holder =
        tokio::spawn(async move { client.reserve(reserve("holder", &[("HOT", 1)])).await });
    held.reached().await;

    // The lease stays held, so of two more callers one waits and the other is turned away.
    let (mut b, mut c) = (app.client.clone(), app.client.clone());
    let mut waiter_b = tokio::spawn(async move { b.reserve(reserve("b", &[("HOT", 1)])).await });
    let mut waiter_c = tokio::spawn(async move { c.reserve(reserve("c", &[("HOT", 1)])).await });
    let (first, other) = tokio::select! {
        result = &mut waiter_b => (result.unwrap(), waiter_c),
        result = &mut waiter_c => (result.unwrap(), waiter_b),
    };
    let status = first.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(error_reason(&status), "SKU_CONTENDED");
    assert!(status.get_details_retry_info().is_some());
    assert_eq!(
        status.get_details_quota_failure().unwrap().violations[0].subject,
        "HOT"
    );

    held.resume();
    holder.await.unwrap().unwrap();
    other.await.unwrap().expect("the waiter got its turn");
    assert_eq!(app.level("HOT").await, (10, 2));
}

#[tokio::test]
async fn an_oversized_message_is_refused_and_changes_nothing() {
    let mut settings = test_settings(fresh_database().await);
    settings.server.max_message_bytes = 4096;
    let mut app = spawn_app_with(settings).await;
    stock(&app, "SKU-1", 10).await;
    let before = app.row_counts().await;
    let request = ReserveRequest {
        idempotency_key: "big".into(),
        order_id: "o".repeat(8192),
        lines: vec![ReservationLine {
            sku: "SKU-1".into(),
            quantity: 1,
            ..Default::default()
        }],
        ttl: None,
        ..Default::default()
    };
    let status = app.client.reserve(request).await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert_eq!(app.row_counts().await, before);
}
