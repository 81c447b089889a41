//! The stock-states load: one SKU of the first tenant ([`WAITING_SKU`]) sold beyond what is
//! on hand. Holds that wait (backorders within a limit, pre-orders pegged to receipts),
//! receipts expected, received (in parts, and by two docks at once) and cancelled, stock
//! added, holds confirmed and released, all under the run's faults; every few steps the receipts are read back and recorded. Its
//! calls are not in the history's operations (the reservation checks replay units that
//! never wait): `never_overpromised` judges it, from the stream and the rows.

use std::time::Duration;

use inventory_proto::{
    AdjustStockRequest, CancelReceiptRequest, ConfirmReservationRequest, ExpectStockRequest,
    ListReceiptsRequest, ReceiveStockRequest, ReleaseReservationRequest, ReserveRequest,
    SetStockPolicyRequest, SetStockRequest,
};
use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
use tokio::sync::watch;

use super::{Endpoints, WorkloadConfig, proto_duration, proto_lines};
use crate::history::{Line, ReceiptSnapshot, Recorder};

/// The SKU of the stock-states load; the reservation checks leave it to
/// `never_overpromised`.
pub const WAITING_SKU: &str = "WAIT-1";

/// How far beyond what is on hand holds of [`WAITING_SKU`] may be promised.
pub const BACKORDER_LIMIT: i64 = 6;

/// Whether a SKU is the stock-states load's.
pub fn waits(sku: &str) -> bool {
    sku == WAITING_SKU
}

pub(super) async fn promiser(
    config: &WorkloadConfig,
    endpoints: &Endpoints,
    recorder: &Recorder,
    stopped: watch::Receiver<bool>,
) {
    let tenant = &config.tenants[0];
    let mut rng = StdRng::seed_from_u64(config.seed ^ 0x5eed_57a7);
    let run = &config.run_id;
    let timeout = config.call_timeout;
    // Each call once, under a key of its own: a fault leaves it undone or done, and either
    // is a state the invariants must hold in.
    macro_rules! call {
        ($replica:expr, $method:ident, $message:expr) => {{
            let mut grpc = endpoints.client($replica);
            let mut request = tonic::Request::new($message);
            request.set_timeout(timeout);
            tenant.admin.authorize(&mut request);
            tokio::time::timeout(timeout, grpc.$method(request))
                .await
                .ok()
                .and_then(Result::ok)
                .map(tonic::Response::into_inner)
        }};
    }
    // The SKU and its limit, until both are there.
    for attempt in 0usize.. {
        if *stopped.borrow() {
            return;
        }
        let created = call!(
            attempt,
            set_stock,
            SetStockRequest {
                sku: WAITING_SKU.into(),
                on_hand: 2,
                expected_version: Some(0),
                idempotency_key: format!("{run}-wait-create"),
                reason: "stock states".into(),
                ..Default::default()
            }
        );
        let limited = call!(
            attempt,
            set_stock_policy,
            SetStockPolicyRequest {
                sku: WAITING_SKU.into(),
                backorder_limit: Some(BACKORDER_LIMIT),
                idempotency_key: format!("{run}-wait-limit"),
                reason: "stock states".into(),
                ..Default::default()
            }
        );
        if created.is_some() && limited.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut receipts: Vec<String> = Vec::new();
    let mut holds: Vec<String> = Vec::new();
    for step in 0usize.. {
        if *stopped.borrow() {
            return;
        }
        let replica = rng.random_range(0..endpoints.len().max(1));
        let key = format!("{run}-wait-{step}");
        match rng.random_range(0..10) {
            0..=2 => {
                let quantity = rng.random_range(1..=3);
                let request = ReserveRequest {
                    idempotency_key: key.clone(),
                    order_id: key,
                    lines: proto_lines(&[Line {
                        sku: WAITING_SKU.into(),
                        quantity,
                    }]),
                    ttl: Some(proto_duration(rng.random_range(500..3_000))),
                    allow_backorder: rng.random_bool(0.7),
                    allow_preorder: rng.random_bool(0.7),
                    ..Default::default()
                };
                if let Some(held) = call!(replica, reserve, request) {
                    holds.push(held.reservation_id);
                }
            }
            3 => {
                let id = format!("{run}-R{step}");
                let days = rng.random_range(1..30);
                let expected = std::time::SystemTime::now() + Duration::from_secs(days * 86_400);
                let request = ExpectStockRequest {
                    receipt_id: id.clone(),
                    sku: WAITING_SKU.into(),
                    quantity: rng.random_range(2..=6),
                    expected_at: Some(expected.into()),
                    idempotency_key: key,
                    reason: "purchase order".into(),
                    ..Default::default()
                };
                if call!(replica, expect_stock, request).is_some() {
                    receipts.push(id);
                }
            }
            4 if !receipts.is_empty() => {
                let id = receipts[rng.random_range(0..receipts.len())].clone();
                let request = ReceiveStockRequest {
                    receipt_id: id,
                    quantity: rng.random_range(1..=4),
                    idempotency_key: key,
                    reason: "dock".into(),
                    ..Default::default()
                };
                let _ = call!(replica, receive_stock, request);
            }
            5 => {
                let request = AdjustStockRequest {
                    sku: WAITING_SKU.into(),
                    delta: rng.random_range(1..=2),
                    idempotency_key: key,
                    reason: "found".into(),
                    ..Default::default()
                };
                let _ = call!(replica, adjust_stock, request);
            }
            6 if !holds.is_empty() => {
                let id = holds.swap_remove(rng.random_range(0..holds.len()));
                let _ = call!(
                    replica,
                    release_reservation,
                    ReleaseReservationRequest {
                        reservation_id: id,
                        ..Default::default()
                    }
                );
            }
            7 if !holds.is_empty() => {
                // Ships what is held; a hold that still waits stays open (and is confirmed
                // only under a key, which a retry of the call reuses).
                let id = holds[rng.random_range(0..holds.len())].clone();
                let _ = call!(
                    replica,
                    confirm_reservation,
                    ConfirmReservationRequest {
                        reservation_id: id,
                        idempotency_key: key,
                        ..Default::default()
                    }
                );
            }
            8 if !receipts.is_empty() => {
                // A supplier drops a purchase order: its pre-orders wait on, at risk, and
                // count as backorders.
                let id = receipts.swap_remove(rng.random_range(0..receipts.len()));
                let request = CancelReceiptRequest {
                    receipt_id: id,
                    idempotency_key: key,
                    reason: "supplier out".into(),
                };
                let _ = call!(replica, cancel_receipt, request);
            }
            9 if !receipts.is_empty() => {
                // Two docks receive one purchase order at once, through two replicas: each
                // fill runs under the SKU's lock, and what one skips the refill pass fills.
                let id = receipts[rng.random_range(0..receipts.len())].clone();
                let other = (replica + 1) % endpoints.len().max(1);
                let mut receive = |dock: u8| ReceiveStockRequest {
                    receipt_id: id.clone(),
                    quantity: rng.random_range(1..=2),
                    idempotency_key: format!("{key}-dock{dock}"),
                    reason: "dock".into(),
                    ..Default::default()
                };
                let (first, second) = (receive(1), receive(2));
                let _ = tokio::join!(async { call!(replica, receive_stock, first) }, async {
                    call!(other, receive_stock, second)
                },);
            }
            _ => {}
        }
        if step % 5 == 0
            && let Some(page) = call!(
                replica,
                list_receipts,
                ListReceiptsRequest {
                    sku: WAITING_SKU.into(),
                    page_size: 500,
                    ..Default::default()
                }
            )
        {
            let at_ms = recorder.now_ms();
            for r in page.receipts {
                recorder.receipt(ReceiptSnapshot {
                    tenant: tenant.tenant.clone(),
                    at_ms,
                    receipt_id: r.receipt_id,
                    quantity: r.quantity,
                    received: r.received,
                    preordered: r.preordered,
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(40)).await;
    }
}
