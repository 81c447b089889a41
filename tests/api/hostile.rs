//! Malformed requests through the running server: each gets its code, and neither PostgreSQL
//! nor Redis changes.

use fred::prelude::KeysInterface as _;
use inventory_server::{
    auth::{Authenticator, digest_hex},
    proto::{AdjustStockRequest, ReservationLine, ReserveRequest},
};
use tonic::{Code, Request, metadata::MetadataValue};

use crate::helpers::{
    TestApp, adjust, fresh_database, get_stock, reserve, spawn_app_with, test_settings,
};

const ADMIN: &str = "hostile-admin";

async fn redis_keys(app: &TestApp) -> Vec<String> {
    let pattern = format!("{}:*", app.key_prefix);
    let (_, keys): (String, Vec<String>) = app
        .redis
        .scan_page("0", pattern, Some(10_000), None)
        .await
        .unwrap();
    let mut keys = keys;
    keys.sort();
    keys
}

fn authed<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {ADMIN}").parse().unwrap());
    request
}

#[tokio::test]
async fn malformed_requests_get_their_code_and_change_nothing() {
    let mut settings = test_settings(fresh_database().await);
    settings.auth.authenticator = Authenticator::parse(&format!(
        "ops admin token-sha256:{}\n",
        digest_hex(ADMIN.as_bytes())
    ))
    .unwrap();
    let app = spawn_app_with(settings).await;
    let mut client = app.client.clone();
    client
        .adjust_stock(authed(adjust("SKU-1", 10, "seed")))
        .await
        .unwrap();
    client
        .reserve(authed(reserve("seed-reserve", &[("SKU-1", 1)])))
        .await
        .unwrap();
    let rows = app.row_counts().await;
    let keys = redis_keys(&app).await;

    let adjust = |sku: String, delta: i64, key: String, reason: String| AdjustStockRequest {
        sku,
        delta,
        idempotency_key: key,
        reason,
        ..Default::default()
    };
    let adjustments = [
        adjust("S".repeat(10_000), 1, "k".into(), String::new()),
        adjust("SKU-1".into(), i64::MAX, "k".into(), String::new()),
        adjust("SKU-1".into(), i64::MIN, "k".into(), String::new()),
        adjust("SKU-1\u{0}".into(), 1, "k".into(), String::new()),
        adjust("SKU-1".into(), 1, "k\u{7f}".into(), String::new()),
        adjust("SKU-1".into(), 1, "k".into(), "\u{1b}[2J".into()),
        adjust("SKU-\u{202e}1".into(), 1, "k".into(), String::new()),
        adjust("SKU-1".into(), 1, "ключ".into(), String::new()),
    ];
    for request in adjustments {
        let status = client
            .adjust_stock(authed(request.clone()))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{request:?}");
    }

    let line = |sku: &str, quantity| ReservationLine {
        sku: sku.into(),
        quantity,
        ..Default::default()
    };
    let thousands: Vec<ReservationLine> = (0..5_000).map(|i| line(&format!("S{i}"), 1)).collect();
    let ttl = |seconds, nanos| Some(prost_types::Duration { seconds, nanos });
    let reservations = [
        ReserveRequest {
            lines: thousands,
            ..reserve("k", &[])
        },
        ReserveRequest {
            lines: vec![line("SKU-1", i64::MAX)],
            ..reserve("k", &[])
        },
        ReserveRequest {
            lines: vec![line("SKU-1", -1)],
            ..reserve("k", &[])
        },
        ReserveRequest {
            ttl: ttl(i64::MAX, 999_999_999),
            ..reserve("k", &[("SKU-1", 1)])
        },
        ReserveRequest {
            ttl: ttl(i64::MIN, -1),
            ..reserve("k", &[("SKU-1", 1)])
        },
        ReserveRequest {
            ttl: ttl(60, 1_000_000_000),
            ..reserve("k", &[("SKU-1", 1)])
        },
        ReserveRequest {
            order_id: "o\nrder".into(),
            ..reserve("k", &[("SKU-1", 1)])
        },
    ];
    for request in reservations {
        let status = client.reserve(authed(request.clone())).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{:?}", status);
    }

    // Credentials that are not even text.
    let mut request = Request::new(get_stock(&["SKU-1"]));
    // "Bearer " followed by bytes that are not UTF-8 (allowed in HTTP as obs-text).
    let mut raw = b"Bearer ".to_vec();
    raw.extend([0xff, 0xfe, 0xc3]);
    request.metadata_mut().insert(
        "authorization",
        MetadataValue::try_from(raw.as_slice()).unwrap(),
    );
    let status = client.get_stock(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    let mut request = Request::new(reserve("k", &[("SKU-1", 1)]));
    request.metadata_mut().insert_bin(
        "authorization-bin",
        MetadataValue::from_bytes(&[0xff, 0x00, 0x80]),
    );
    let status = client.reserve(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);

    assert_eq!(app.row_counts().await, rows, "PostgreSQL unchanged");
    assert_eq!(redis_keys(&app).await, keys, "Redis unchanged");
}
