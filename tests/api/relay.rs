//! The event relay to NATS JetStream, against a real `nats-server`: every event once, in
//! position order, whatever is killed in between (a relay after JetStream stored its batch and
//! before its cursor moved, JetStream itself mid-stream); one relay publishes at a time, and
//! one whose lease passed on moves nothing.

use std::{collections::HashMap, sync::Arc, time::Duration};

use async_nats::jetstream;
use inventory_core::{
    events::SubscriptionName,
    pause::{PausePoint, PausePoints},
    ports::SubscriptionStore as _,
};
use inventory_nats::{JetStreamSettings, JetStreamSink};
use inventory_postgres::events::PgHeadFeed;
use inventory_server::{
    proto::Event,
    relay::{Relay, RelaySettings},
};
use inventory_testkit::{nats::NatsNode, process::eventually};
use prost::Message as _;
use tokio::sync::watch;

use crate::helpers::{TestApp, reserve, spawn_app, stock};

const LEASE: Duration = Duration::from_millis(600);

fn sink_settings() -> JetStreamSettings {
    JetStreamSettings {
        stream_prefix: "INVENTORY".into(),
        subject_prefix: "inventory".into(),
        duplicate_window: Duration::from_secs(120),
        max_age: Duration::from_secs(3600),
        ack_timeout: Duration::from_secs(2),
    }
}

async fn client(nats: &NatsNode) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connect(nats.url())
        .await
        .unwrap()
}

/// A relay of the app's default tenant, started on a task: `stop` ends it gracefully,
/// aborting the task kills it.
async fn start_relay(
    app: &TestApp,
    nats: &NatsNode,
    holder: &str,
    pauses: PausePoints,
) -> (tokio::task::JoinHandle<()>, watch::Sender<bool>) {
    let sink = JetStreamSink::open(client(nats).await, &sink_settings(), "default")
        .await
        .unwrap();
    let relay = Relay {
        store: Arc::new(app.store.clone()),
        sink,
        feed: PgHeadFeed::new(app.database_config().await, Duration::from_secs(5)),
        tenant: "default".into(),
        settings: RelaySettings {
            name: "jetstream".into(),
            holder: holder.into(),
            lease_ttl: LEASE,
            batch: 10,
        },
        pauses,
    };
    let (stop, stopping) = watch::channel(false);
    let task = tokio::spawn(async move {
        relay.run(stopping).await.unwrap();
    });
    (task, stop)
}

/// Every message of the tenant's stream, by JetStream sequence (1 on).
async fn copied(nats: &NatsNode) -> Vec<(i64, String, Event)> {
    let context = jetstream::new(client(nats).await);
    let stream = context.get_stream("INVENTORY_DEFAULT").await.unwrap();
    let last = stream.cached_info().state.last_sequence;
    let mut messages = Vec::new();
    for sequence in 1..=last {
        let message = stream.get_raw_message(sequence).await.unwrap();
        let position: i64 = message
            .headers
            .get(inventory_nats::POSITION)
            .unwrap()
            .as_str()
            .parse()
            .unwrap();
        let id = message
            .headers
            .get("Nats-Msg-Id")
            .unwrap()
            .as_str()
            .to_owned();
        messages.push((position, id, Event::decode(message.payload).unwrap()));
    }
    messages
}

async fn stream_length(nats: &NatsNode) -> u64 {
    let context = jetstream::new(client(nats).await);
    match context.get_stream("INVENTORY_DEFAULT").await {
        Ok(stream) => stream.cached_info().state.messages,
        Err(_) => 0,
    }
}

/// The outbox, by position: every event id once.
async fn outbox(app: &TestApp) -> Vec<(i64, String)> {
    app.db
        .query(
            "SELECT position, event_id::text FROM outbox WHERE position IS NOT NULL
             ORDER BY position",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

async fn write(app: &TestApp, from: usize, to: usize) {
    let mut client = app.client.clone();
    for i in from..to {
        let sku = ["MUG", "CUP.LARGE", "PLATE"][i % 3];
        // Some of them a reservation of two SKUs (subject token `%`).
        let cart: &[(&str, i64)] = if i % 5 == 0 {
            &[("MUG", 1), ("PLATE", 1)]
        } else {
            &[(sku, 1)]
        };
        client
            .reserve(reserve(&format!("relay-{i}"), cart))
            .await
            .unwrap();
    }
}

/// The copy holds the outbox exactly: each event once, in position order.
async fn assert_exact_copy(app: &TestApp, nats: &NatsNode) {
    app.positioned().await;
    let outbox = outbox(app).await;
    eventually(
        "the relay copies every event",
        Duration::from_secs(60),
        || async { stream_length(nats).await >= outbox.len() as u64 },
    )
    .await
    .unwrap();
    let copy = copied(nats).await;
    let got: Vec<(i64, String)> = copy.iter().map(|(p, id, _)| (*p, id.clone())).collect();
    assert_eq!(got, outbox, "every event once, in order");
    for (position, id, event) in &copy {
        assert_eq!(event.sequence, *position);
        assert_eq!(&event.event_id, id);
    }
    // In order per SKU: each SKU's level versions only grow along the copy.
    let mut versions: HashMap<String, i64> = HashMap::new();
    for (_, _, event) in &copy {
        if let Some(inventory_server::proto::event::Payload::ReservationChanged(changed)) =
            &event.payload
        {
            for level in &changed.levels {
                let last = versions.entry(level.sku.clone()).or_default();
                assert!(level.version > *last, "{} went back", level.sku);
                *last = level.version;
            }
        }
    }
}

#[tokio::test]
async fn every_event_reaches_jetstream_once_in_order_across_a_killed_relay_and_a_killed_jetstream()
{
    let app = spawn_app().await;
    let mut nats = NatsNode::start().await.unwrap();
    for sku in ["MUG", "CUP.LARGE", "PLATE"] {
        stock(&app, sku, 1_000).await;
    }
    write(&app, 0, 25).await;
    app.positioned().await;

    // The first relay publishes its first batch and is killed before its cursor moves.
    let pauses = PausePoints::default();
    let mut published = pauses.arm(PausePoint::RelayPublished);
    let (first, _stop_first) = start_relay(&app, &nats, "first", pauses).await;
    published.reached().await;
    first.abort();
    let _ = first.await;
    assert_eq!(stream_length(&nats).await, 10, "its first batch was stored");
    let name = SubscriptionName::parse("relay.jetstream").unwrap();
    assert_eq!(
        app.store.subscription(&name).await.unwrap().acked,
        0,
        "and its cursor never moved"
    );

    // The next relay takes over once the lease lapses and goes on from the copy's end.
    let (second, stop_second) = start_relay(&app, &nats, "second", PausePoints::default()).await;
    let writer = {
        let app_client = app.client.clone();
        tokio::spawn(async move {
            let mut client = app_client;
            for i in 25..60 {
                let sku = ["MUG", "CUP.LARGE", "PLATE"][i % 3];
                client
                    .reserve(reserve(&format!("relay-{i}"), &[(sku, 1)]))
                    .await
                    .unwrap();
            }
        })
    };
    eventually(
        "the second relay publishes",
        Duration::from_secs(30),
        || async { stream_length(&nats).await > 20 },
    )
    .await
    .unwrap();
    // JetStream dies mid-stream and comes back with its store.
    nats.kill().await.unwrap();
    write(&app, 60, 70).await;
    nats.restart().await.unwrap();
    writer.await.unwrap();
    write(&app, 70, 80).await;

    assert_exact_copy(&app, &nats).await;
    let head = app.count("SELECT head FROM event_stream").await;
    eventually(
        "the relay's cursor reaches the head",
        Duration::from_secs(30),
        || async { app.store.subscription(&name).await.unwrap().acked == head },
    )
    .await
    .unwrap();
    let _ = stop_second.send(true);
    second.await.unwrap();
}

/// A relay's subscription, made as a relay makes it (from the oldest event kept, no filter).
async fn relay_subscription(app: &TestApp, name: &str) -> SubscriptionName {
    let name = SubscriptionName::parse(name).unwrap();
    app.store
        .create_subscription(
            &inventory_core::events::CreateSubscription {
                name: name.clone(),
                filter: Default::default(),
                from_oldest: true,
            },
            0,
            None,
        )
        .await
        .unwrap();
    name
}

#[tokio::test]
async fn a_relay_whose_lease_passed_on_moves_nothing_and_a_standby_waits() {
    let app = spawn_app().await;
    let name = relay_subscription(&app, "relay.fenced").await;
    stock(&app, "A", 1).await;
    let first = app
        .store
        .hold_subscription(&name, "first", LEASE)
        .await
        .unwrap()
        .expect("free");
    // A standby gets nothing while the lease runs...
    assert!(
        app.store
            .hold_subscription(&name, "second", Duration::from_secs(60))
            .await
            .unwrap()
            .is_none()
    );
    // ...and takes it once it lapsed.
    let second = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Some(held) = app
                .store
                .hold_subscription(&name, "second", Duration::from_secs(60))
                .await
                .unwrap()
            {
                return held;
            }
            tokio::time::sleep(LEASE / 4).await;
        }
    })
    .await
    .expect("the lease lapses");
    assert!(second.reader > first.reader);
    // The first relay wakes up and tries to record what it published: refused.
    assert!(
        !app.store
            .advance_held(&name, first.reader, 1, None, LEASE)
            .await
            .unwrap()
    );
    assert_eq!(app.store.subscription(&name).await.unwrap().acked, 0);
    assert!(
        app.store
            .advance_held(&name, second.reader, 1, None, LEASE)
            .await
            .unwrap()
    );
    assert_eq!(app.store.subscription(&name).await.unwrap().acked, 1);
}

#[tokio::test]
async fn a_wiped_copy_is_published_again_from_the_oldest_event_kept() {
    let app = spawn_app().await;
    let nats = NatsNode::start().await.unwrap();
    for sku in ["MUG", "CUP.LARGE", "PLATE"] {
        stock(&app, sku, 100).await;
    }
    write(&app, 0, 9).await;
    let (relay, stop) = start_relay(&app, &nats, "only", PausePoints::default()).await;
    assert_exact_copy(&app, &nats).await;

    // The stream is deleted (a broker whose store was lost): the relay makes it again.
    jetstream::new(client(&nats).await)
        .delete_stream("INVENTORY_DEFAULT")
        .await
        .unwrap();
    write(&app, 9, 15).await;
    assert_exact_copy(&app, &nats).await;
    let _ = stop.send(true);
    relay.await.unwrap();
}

/// The `relay` command as it runs in production: two processes, one publishing and one
/// standing by; the one publishing is killed, the other goes on.
#[tokio::test]
async fn the_relay_command_stands_by_and_takes_over_from_a_killed_relay() {
    use inventory_testkit::process::Process;
    let app = spawn_app().await;
    let nats = NatsNode::start().await.unwrap();
    for sku in ["MUG", "CUP.LARGE", "PLATE"] {
        stock(&app, sku, 100).await;
    }
    write(&app, 0, 10).await;
    let url = app.database_url().await;
    let spawn = || {
        Process::new(
            tokio::process::Command::new(env!("CARGO_BIN_EXE_inventory-server"))
                .arg("relay")
                .env("DATABASE_URL", &url)
                .env("NATS_URL", nats.url())
                .env("RELAY_LEASE_TTL", "1s")
                .env("NATS_ACK_TIMEOUT", "500ms")
                .env("RELAY_BATCH", "4")
                .env("RUST_LOG", "warn")
                .stdout(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap(),
        )
    };
    let mut relays = [spawn(), spawn()];
    assert_exact_copy(&app, &nats).await;

    // The one holding the lease (named by its process id) is killed.
    let holder: String = app
        .db
        .query_one(
            "SELECT holder FROM event_subscriptions WHERE name = 'relay.jetstream'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let pid = |p: &Process| p.id().map(|id| format!("-{id}-"));
    let active = relays
        .iter()
        .position(|p| pid(p).is_some_and(|id| holder.contains(&id)))
        .unwrap_or_else(|| panic!("{holder} is one of the relays"));
    relays[active].kill().await.unwrap();
    write(&app, 10, 30).await;
    assert_exact_copy(&app, &nats).await;
    let standby = &mut relays[1 - active];
    let status = standby.terminate(Duration::from_secs(10)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

/// Renewing a relay's lease without publishing (its sink is down) is not progress: the
/// subscription's last acknowledgement stays where it was, so retention stops waiting for it
/// after SUBSCRIPTION_IDLE_LIMIT instead of keeping every event for as long as the sink is
/// down.
#[tokio::test]
async fn renewing_a_lease_without_progress_is_no_acknowledgement() {
    let app = spawn_app().await;
    let name = relay_subscription(&app, "relay.idle").await;
    stock(&app, "A", 1).await;
    stock(&app, "B", 1).await;
    assert_eq!(app.positioned().await, 2);
    let held = app
        .store
        .hold_subscription(&name, "relay", LEASE)
        .await
        .unwrap()
        .unwrap();
    let acked_at = || async { app.store.subscription(&name).await.unwrap().acked_at };
    let created = acked_at().await;
    // Behind the head and not moving: the lease is renewed, nothing is acknowledged.
    assert!(
        app.store
            .advance_held(&name, held.reader, 0, None, LEASE)
            .await
            .unwrap()
    );
    assert_eq!(acked_at().await, created);
    // Moving is progress; so is standing at the head.
    assert!(
        app.store
            .advance_held(&name, held.reader, 1, None, LEASE)
            .await
            .unwrap()
    );
    let moved = acked_at().await;
    assert!(moved > created);
    assert!(
        app.store
            .advance_held(&name, held.reader, 2, None, LEASE)
            .await
            .unwrap()
    );
    let at_head = acked_at().await;
    assert!(
        app.store
            .advance_held(&name, held.reader, 2, None, LEASE)
            .await
            .unwrap()
    );
    assert!(acked_at().await > at_head, "caught up, it is not idle");
}
