//! An order saga against a running server (`make run` in another terminal):
//!
//! reserve -> payment -> confirm; when the payment fails, or the reserve's outcome is unknown,
//! `CancelOrder` is the compensation: it releases whatever the order holds and refuses any
//! late Reserve of the order, so a lost answer can never leave stock held for nobody.
//!
//! ```text
//! cargo run --example order_saga -- [ENDPOINT] [ORDER_ID] [SKU] [QUANTITY] [approve|decline]
//! cargo run --example order_saga -- http://127.0.0.1:50051 order-1 DEMO-MUG 1 decline
//! ```
//!
//! Every step's key is derived from the order id (`<order>/reserve`, ...): a saga that
//! crashes and runs again for the same order repeats its inventory steps without acting
//! twice (the payment step must be idempotent the same way: key it by the order too).
//! Left to a real saga: a confirm that fails after the payment went through (the hold
//! expired, `INVALID_RESERVATION_STATE`) needs a refund, or a new Reserve.

use std::time::Duration;

use inventory_client::{
    ClientConfig, Error, InventoryClient,
    proto::{
        CancelOrderRequest, ConfirmReservationRequest, Reservation, ReservationLine,
        ReservationState, ReserveRequest,
    },
};

/// What the payment step decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Payment {
    Approved,
    Declined,
}

/// How the saga ended.
#[derive(Debug)]
pub enum SagaOutcome {
    /// Paid and confirmed: the units are sold.
    Confirmed(Reservation),
    /// Nothing to sell: the Reserve was refused (`reason`), nothing is held.
    Refused { reason: String },
    /// The order was cancelled: `released` of its reservations gave their units back.
    Compensated { why: String, released: usize },
}

/// Runs one order's saga. `pay` stands for the payment service.
pub async fn run_saga(
    client: &InventoryClient,
    order_id: &str,
    lines: &[(&str, i64)],
    pay: impl AsyncFnOnce(&Reservation) -> Payment,
) -> Result<SagaOutcome, Error> {
    let request = ReserveRequest {
        idempotency_key: format!("{order_id}/reserve"),
        order_id: order_id.to_owned(),
        lines: lines
            .iter()
            .map(|(sku, quantity)| ReservationLine {
                sku: (*sku).to_owned(),
                quantity: *quantity,
                ..Default::default()
            })
            .collect(),
        ttl: Some(prost_types::Duration {
            seconds: 15 * 60,
            nanos: 0,
        }),
        ..Default::default()
    };
    let reservation = match client.reserve(request).await {
        Ok(reservation) => reservation,
        Err(Error::Refused { reason, .. }) => return Ok(SagaOutcome::Refused { reason }),
        // Held or not, nobody can tell: cancel the order, which releases a hold if there is
        // one and refuses the Reserve if it is still on its way.
        Err(Error::OutcomeUnknown { .. } | Error::Unavailable { .. }) => {
            return compensate(client, order_id, "the reserve's outcome is unknown").await;
        }
        Err(other) => return Err(other),
    };
    match pay(&reservation).await {
        Payment::Approved => {
            let confirmed = client
                .confirm_reservation(ConfirmReservationRequest {
                    reservation_id: reservation.reservation_id.clone(),
                    idempotency_key: format!("{order_id}/confirm"),
                    ..Default::default()
                })
                .await?;
            Ok(SagaOutcome::Confirmed(confirmed))
        }
        Payment::Declined => compensate(client, order_id, "the payment was declined").await,
    }
}

async fn compensate(
    client: &InventoryClient,
    order_id: &str,
    why: &str,
) -> Result<SagaOutcome, Error> {
    let cancelled = client
        .cancel_order(CancelOrderRequest {
            order_id: order_id.to_owned(),
            idempotency_key: format!("{order_id}/cancel"),
            reason: why.to_owned(),
        })
        .await?;
    let released = cancelled
        .reservations
        .iter()
        .filter(|r| r.state() == ReservationState::Released)
        .count();
    Ok(SagaOutcome::Compensated {
        why: why.to_owned(),
        released,
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:50051".into());
    let order_id = args
        .next()
        .unwrap_or_else(|| format!("saga-{}", std::process::id()));
    let sku = args.next().unwrap_or_else(|| "DEMO-MUG".into());
    let quantity: i64 = args.next().map_or(Ok(1), |q| q.parse())?;
    let payment = match args.next().as_deref() {
        Some("decline") => Payment::Declined,
        _ => Payment::Approved,
    };
    let mut config = ClientConfig::new(endpoint);
    config.token = std::env::var("INVENTORY_TOKEN").ok().map(Into::into);
    let client = InventoryClient::connect(config)
        .await?
        .with_budget(Duration::from_secs(10));
    let outcome = run_saga(&client, &order_id, &[(&sku, quantity)], async |held| {
        println!(
            "reserved {} ({} x {sku}), expires {:?}; payment: {payment:?}",
            held.reservation_id,
            quantity,
            held.expires_at.as_ref().map(|t| t.seconds)
        );
        payment
    })
    .await?;
    println!("{order_id}: {outcome:?}");
    Ok(())
}
