//! A consumer of a named subscription against a running server (`make run` in another
//! terminal): fulfilment reading the confirmations of some SKUs.
//!
//! ```text
//! cargo run --example fulfilment_feed -- [ENDPOINT] [SUBSCRIPTION] [SKU_PREFIX]
//! cargo run --example fulfilment_feed -- http://127.0.0.1:50051 fulfilment DEMO-
//! ```
//!
//! The server keeps the filter and the cursor: the consumer creates the subscription (again
//! on every start: the same filter answers the same subscription), reads it, handles each
//! event and acknowledges it, heartbeats included, so a restart resumes right after what was
//! handled. An event handled but not acknowledged (a crash in between) comes again: handle
//! idempotently, keyed by `event_id` or the reservation.

use std::time::Duration;

use inventory_client::{
    ClientConfig, Error, InventoryClient,
    proto::{Event, EventFilter, EventType},
};

/// What the confirmations of SKUs starting with `sku_prefix` are.
pub fn confirmations(sku_prefix: &str) -> EventFilter {
    EventFilter {
        types: vec![
            EventType::ReservationConfirmed as i32,
            EventType::ReservationPartiallyConfirmed as i32,
        ],
        sku_prefixes: vec![sku_prefix.to_owned()],
        ..Default::default()
    }
}

/// Reads the subscription `name` (created with `filter` if it is not there), handing each
/// event to `handle` and acknowledging it after, until `handle` answers `false` (that event
/// is acknowledged too) or the stream fails (a second reader took the subscription over:
/// `SUBSCRIPTION_TAKEN_OVER`; the server went away: `Unavailable`, read again).
pub async fn follow(
    client: &InventoryClient,
    name: &str,
    filter: EventFilter,
    mut handle: impl AsyncFnMut(&Event) -> bool,
) -> Result<(), Error> {
    client.create_subscription(name, filter, false).await?;
    let mut events = client.watch_subscription(name).await?;
    while let Some(event) = events.message().await.map_err(Error::from_stream)? {
        let go_on = event.r#type == EventType::Heartbeat as i32 || handle(&event).await;
        client.ack_events(name, &event).await?;
        if !go_on {
            return Ok(());
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:50051".into());
    let name = args.next().unwrap_or_else(|| "fulfilment".into());
    let prefix = args.next().unwrap_or_else(|| "DEMO-".into());
    let mut config = ClientConfig::new(endpoint);
    config.token = std::env::var("INVENTORY_TOKEN").ok().map(Into::into);
    let client = InventoryClient::connect(config)
        .await?
        .with_budget(Duration::from_secs(10));
    follow(&client, &name, confirmations(&prefix), async |event| {
        println!("ship: event {} at {}", event.event_id, event.sequence);
        true
    })
    .await?;
    Ok(())
}
