//! The requests the tests send, built in one place, and the stock set-up most tests begin
//! with: a builder sets what a plain request needs, and a test changes only the fields it is
//! about (`Request { field, ..builder(...) }`).

use std::process::Command;

use inventory_server::proto::{
    AdjustStockRequest, AllocationStrategy, ConfirmReservationRequest, GetReservationRequest,
    GetStockRequest, ReleaseReservationRequest, Reservation, ReservationLine, ReserveRequest,
    SetStockRequest, StockLevel, UpsertLocationRequest,
};

use tonic::Request;

use super::{TestApp, TestClient};

/// A line of `quantity` units of `sku`, from any location.
pub fn line(sku: &str, quantity: i64) -> ReservationLine {
    line_at(sku, quantity, "")
}

/// A line of `quantity` units of `sku`, pinned to location `pin` (empty: any).
pub fn line_at(sku: &str, quantity: i64, pin: &str) -> ReservationLine {
    ReservationLine {
        sku: sku.into(),
        quantity,
        location_id: pin.into(),
        ..Default::default()
    }
}

/// Lines of `(sku, quantity)`, from any location.
pub fn lines(lines: &[(&str, i64)]) -> Vec<ReservationLine> {
    lines
        .iter()
        .map(|(sku, quantity)| line(sku, *quantity))
        .collect()
}

/// A `Reserve` of `(sku, quantity)` lines under `key`, for the order `order-{key}`.
pub fn reserve(key: &str, cart: &[(&str, i64)]) -> ReserveRequest {
    ReserveRequest {
        idempotency_key: key.into(),
        order_id: format!("order-{key}"),
        lines: lines(cart),
        ttl: None,
        ..Default::default()
    }
}

/// A `Reserve` of `lines` under `key`, for the order `order-{key}`, allocated by `strategy`.
pub fn reserve_with(
    key: &str,
    lines: Vec<ReservationLine>,
    strategy: AllocationStrategy,
    allow_split: bool,
) -> ReserveRequest {
    ReserveRequest {
        idempotency_key: key.into(),
        order_id: format!("order-{key}"),
        lines,
        strategy: strategy.into(),
        allow_split,
        ..Default::default()
    }
}

/// Confirms the whole of reservation `id`.
pub fn confirm(id: &str) -> ConfirmReservationRequest {
    ConfirmReservationRequest {
        reservation_id: id.into(),
        ..Default::default()
    }
}

/// Confirms `(sku, quantity)` lines of reservation `id` (none: all it holds), under `key`.
pub fn confirm_part(id: &str, key: &str, cart: &[(&str, i64)]) -> ConfirmReservationRequest {
    ConfirmReservationRequest {
        reservation_id: id.into(),
        lines: lines(cart),
        idempotency_key: key.into(),
    }
}

/// Releases the whole of reservation `id`.
pub fn release(id: &str) -> ReleaseReservationRequest {
    ReleaseReservationRequest {
        reservation_id: id.into(),
        ..Default::default()
    }
}

/// Releases `(sku, quantity)` lines of reservation `id` (none: all it holds), under `key`.
pub fn release_part(id: &str, key: &str, cart: &[(&str, i64)]) -> ReleaseReservationRequest {
    ReleaseReservationRequest {
        reservation_id: id.into(),
        lines: lines(cart),
        idempotency_key: key.into(),
    }
}

pub fn get_reservation(id: &str) -> GetReservationRequest {
    GetReservationRequest {
        reservation_id: id.into(),
    }
}

/// An `AdjustStock` of `sku` by `delta` under `key`.
pub fn adjust(sku: &str, delta: i64, key: &str) -> AdjustStockRequest {
    AdjustStockRequest {
        sku: sku.into(),
        delta,
        idempotency_key: key.into(),
        reason: "test".into(),
        ..Default::default()
    }
}

/// `units` more of `sku` at location `at` (empty: `default`), under a key of its own.
pub fn restock(sku: &str, at: &str, units: i64) -> AdjustStockRequest {
    AdjustStockRequest {
        sku: sku.into(),
        delta: units,
        idempotency_key: format!("stock-{sku}-{at}-{}", uuid::Uuid::new_v4()),
        reason: "test stock".into(),
        location_id: at.into(),
        ..Default::default()
    }
}

/// A count: `SetStock` of `sku` to `on_hand`, if its version is still `expected`.
pub fn set_stock(sku: &str, on_hand: i64, expected: Option<i64>, key: &str) -> SetStockRequest {
    SetStockRequest {
        sku: sku.into(),
        on_hand,
        expected_version: expected,
        idempotency_key: key.into(),
        reason: "cycle count".into(),
        ..Default::default()
    }
}

pub fn get_stock(skus: &[&str]) -> GetStockRequest {
    GetStockRequest {
        skus: skus.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// A level as the API reports it; `version` counts the changes made to the SKU so far.
pub fn level(sku: &str, on_hand: i64, reserved: i64, version: i64) -> StockLevel {
    StockLevel {
        sku: sku.into(),
        on_hand,
        reserved,
        available: on_hand - reserved,
        version,
        ..Default::default()
    }
}

/// `message` carrying `token` as its bearer credential (`None`: no credential at all).
pub fn with_token<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

/// Adds `units` of `sku` (at the `default` location).
pub async fn stock(app: &TestApp, sku: &str, units: i64) {
    stock_at(app, sku, "", units).await;
}

/// Adds `units` of `sku` at `at` (empty: `default`).
pub async fn stock_at(app: &TestApp, sku: &str, at: &str, units: i64) {
    app.client
        .clone()
        .adjust_stock(restock(sku, at, units))
        .await
        .unwrap();
}

/// Creates or changes location `id`.
pub async fn location(app: &TestApp, id: &str, priority: i32, active: bool) {
    app.client
        .clone()
        .upsert_location(UpsertLocationRequest {
            location_id: id.into(),
            priority,
            active,
        })
        .await
        .unwrap();
}

impl TestApp {
    /// Reservation `id`, as `GetReservation` reads it.
    pub async fn reservation(&self, id: &str) -> Reservation {
        self.client
            .clone()
            .get_reservation(get_reservation(id))
            .await
            .unwrap()
            .into_inner()
    }

    /// `inventory-server verify` over the test's database: `(clean, report)`.
    pub async fn verify(&self) -> (bool, String) {
        let url = self.database_url().await;
        let output = tokio::task::spawn_blocking(move || {
            Command::new(env!("CARGO_BIN_EXE_inventory-server"))
                .args(["verify", "--database-url", &url])
                .output()
                .expect("run inventory-server verify")
        })
        .await
        .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
        )
    }
}

impl TestClient {
    /// Adds `units` of `sku` (at the `default` location).
    pub async fn stock(&self, sku: &str, units: i64) {
        self.0
            .clone()
            .adjust_stock(restock(sku, "", units))
            .await
            .unwrap();
    }
}

impl TestApp {
    /// `sku`'s total, as `GetStock` reads it.
    pub async fn total(&self, sku: &str) -> StockLevel {
        self.client
            .clone()
            .get_stock(get_stock(&[sku]))
            .await
            .unwrap()
            .into_inner()
            .levels
            .remove(0)
    }
}

/// Midnight UTC of a day of December 2030.
pub fn december(day: u32) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: 1_922_313_600 + i64::from(day - 1) * 86_400,
        nanos: 0,
    }
}
