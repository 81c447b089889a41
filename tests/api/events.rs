//! `WatchEvents`: gap-free under out-of-order commits, resumable, shared, bounded, pruned.

use std::{collections::HashSet, time::Duration};

use futures::future::join_all;
use inventory_server::{
    events::WATCH_BUFFER,
    proto::{Event, EventType, WatchEventsRequest, event},
};
use tokio_stream::StreamExt as _;
use tonic::{Code, Streaming};

use crate::helpers::{TestApp, connect, error_reason, reserve, spawn_app, stock, violated_fields};

/// Watches from `after`, once the stream's head has reached it: a consumer's cursor is always
/// a position it was sent, and a cursor past the head is refused (`CURSOR_NOT_IN_HISTORY`).
/// Tests that skip events they know were committed wait for them to be positioned.
pub async fn watch(app: &TestApp, after: i64) -> Streaming<Event> {
    inventory_testkit::process::eventually(
        "the stream's head reaches the cursor",
        Duration::from_secs(20),
        || async { app.count("SELECT head FROM event_stream").await >= after },
    )
    .await
    .unwrap();
    app.client
        .clone()
        .watch_events(WatchEventsRequest {
            after_sequence: after,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// The next `n` events, failing the test if they do not come within 20 s.
pub async fn take(stream: &mut Streaming<Event>, n: usize) -> Vec<Event> {
    let mut events = Vec::with_capacity(n);
    while events.len() < n {
        let next = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} events arrived", events.len()));
        events.push(next.expect("stream open").expect("no error"));
    }
    events
}

fn sequences(events: &[Event]) -> Vec<i64> {
    events.iter().map(|e| e.sequence).collect()
}

/// Inserts a STOCK_ADJUSTED event the way the service does, on a connection of its own.
async fn insert_event(db: &impl tokio_postgres::GenericClient, sku: &str) {
    db.execute(
        "INSERT INTO outbox (event_id, event_type, sku, payload)
         VALUES (gen_random_uuid(), 'STOCK_ADJUSTED', $1,
                 '{\"delta\": 1, \"reason\": \"manual\", \"on_hand\": 1, \"reserved\": 0}')",
        &[&sku],
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn an_event_committed_late_with_a_lower_sequence_is_not_skipped() {
    let app = spawn_app().await;
    let config = app.database_config().await;
    let mut first = connect(&config).await;
    let mut second = connect(&config).await;

    // The first writer takes the lower sequence, then stalls; the second commits.
    let slow = first.transaction().await.unwrap();
    insert_event(&slow, "SLOW").await;
    let fast = second.transaction().await.unwrap();
    insert_event(&fast, "FAST").await;
    fast.commit().await.unwrap();

    // A watcher starts between the two commits and gets the committed event at once: the
    // open writer holds nothing back.
    let mut stream = watch(&app, 0).await;
    let events = take(&mut stream, 1).await;
    assert_eq!(sequences(&events), [1]);

    // The late one commits and comes next, above the watcher's cursor: not skipped.
    slow.commit().await.unwrap();
    let late = take(&mut stream, 1).await;
    assert_eq!(sequences(&late), [2]);
    let skus: Vec<_> = events
        .iter()
        .chain(&late)
        .map(|e| match &e.subject {
            Some(event::Subject::Sku(sku)) => sku.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(skus, ["FAST", "SLOW"], "in the order they became visible");
}

/// Writes one stock change of `sku` the way every writer does: lock and update the row, then
/// insert the event carrying the new level.
async fn change_stock(db: &impl tokio_postgres::GenericClient, sku: &str) -> i64 {
    let version: i64 = db
        .query_one(
            "UPDATE stock SET on_hand = on_hand + 1, version = version + 1 WHERE sku = $1
             RETURNING version",
            &[&sku],
        )
        .await
        .unwrap()
        .get(0);
    db.execute(
        "INSERT INTO outbox (event_id, event_type, sku, payload)
         VALUES (gen_random_uuid(), 'STOCK_ADJUSTED', $1, jsonb_build_object(
             'delta', 1, 'reason', 'manual', 'on_hand', 0, 'reserved', 0, 'version', $2::bigint))",
        &[&sku, &version],
    )
    .await
    .unwrap();
    version
}

#[tokio::test]
async fn a_skus_events_come_in_commit_order_whatever_the_transaction_ids() {
    // Found by the fault suite: transaction ids are handed out at a transaction's first write
    // (a confirm's, say, when it locks the reservation), so the writer that commits second on a
    // SKU can hold the older id. Positioning by transaction id put its event first.
    let app = spawn_app().await;
    stock(&app, "SKU-1", 5).await;
    let config = app.database_config().await;
    let mut first = connect(&config).await;
    let mut second = connect(&config).await;
    let older = first.transaction().await.unwrap();
    older
        .query_one("SELECT pg_current_xact_id()", &[])
        .await
        .unwrap();
    let younger = second.transaction().await.unwrap();
    younger
        .query_one("SELECT pg_current_xact_id()", &[])
        .await
        .unwrap();

    // The younger transaction changes the SKU and commits first; the older one after it.
    assert_eq!(change_stock(&younger, "SKU-1").await, 2);
    younger.commit().await.unwrap();
    assert_eq!(change_stock(&older, "SKU-1").await, 3);
    older.commit().await.unwrap();

    let mut stream = watch(&app, 0).await;
    let events = take(&mut stream, 3).await;
    let versions: Vec<i64> = events
        .iter()
        .map(|e| match &e.payload {
            Some(event::Payload::StockAdjusted(adjusted)) => {
                adjusted.level.as_ref().expect("a level").version
            }
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        versions,
        [1, 2, 3],
        "the SKU's changes in the order they committed"
    );
}

#[tokio::test]
async fn events_are_typed_and_follow_live_after_the_backlog() {
    let app = spawn_app().await;
    stock(&app, "SKU-1", 5).await;
    let mut stream = watch(&app, 0).await;
    let backlog = take(&mut stream, 1).await;
    assert_eq!(backlog[0].r#type(), EventType::StockAdjusted);
    match &backlog[0].payload {
        Some(event::Payload::StockAdjusted(adjusted)) => {
            assert_eq!(adjusted.delta, 5);
            assert_eq!(adjusted.level.as_ref().unwrap().available, 5);
        }
        other => panic!("{other:?}"),
    }

    let held = app.hold("k1", &[("SKU-1", 2)]).await;
    let live = take(&mut stream, 1).await;
    assert_eq!(live[0].sequence, 2);
    assert_eq!(live[0].r#type(), EventType::ReservationHeld);
    assert_eq!(
        live[0].subject,
        Some(event::Subject::ReservationId(held.reservation_id.clone()))
    );
    match &live[0].payload {
        Some(event::Payload::ReservationChanged(changed)) => {
            assert_eq!(changed.order_id, "order-k1");
            assert_eq!(changed.lines[0].quantity, 2);
            assert_eq!(changed.levels[0].reserved, 2);
        }
        other => panic!("{other:?}"),
    }
    assert!(!live[0].event_id.is_empty());
    assert!(live[0].occurred_at.is_some());
}

#[tokio::test]
async fn a_consumer_resuming_from_its_last_sequence_misses_nothing() {
    let app = spawn_app().await;
    for i in 0..10 {
        stock(&app, &format!("SKU-{i}"), 1).await;
    }
    let mut stream = watch(&app, 0).await;
    let first = take(&mut stream, 4).await;
    drop(stream);

    for i in 10..15 {
        stock(&app, &format!("SKU-{i}"), 1).await;
    }
    let mut resumed = watch(&app, first.last().unwrap().sequence).await;
    let rest = take(&mut resumed, 11).await;
    let all: Vec<i64> = sequences(&first)
        .into_iter()
        .chain(sequences(&rest))
        .collect();
    assert_eq!(all, (1..=15).collect::<Vec<_>>());
    let ids: HashSet<_> = first
        .iter()
        .chain(&rest)
        .map(|e| e.event_id.clone())
        .collect();
    assert_eq!(ids.len(), 15);
}

#[tokio::test]
async fn under_a_reservation_storm_a_watcher_sees_exactly_the_committed_events() {
    let app = spawn_app().await;
    stock(&app, "HOT", 100).await;
    stock(&app, "COLD", 1_000).await;
    let mut watchers = Vec::new();
    for _ in 0..3 {
        watchers.push(watch(&app, 0).await);
    }
    let calls = (0..300).map(|i| {
        let mut client = app.client.clone();
        // Half of the hot calls run out of stock and commit no event.
        let sku = if i % 2 == 0 { "HOT" } else { "COLD" };
        let quantity = if i % 2 == 0 { 1 } else { 2 };
        async move {
            client
                .reserve(reserve(&format!("storm-{i}"), &[(sku, quantity)]))
                .await
        }
    });
    let results = join_all(calls).await;
    assert!(results.iter().any(|r| r.is_err()), "some were refused");

    let committed: HashSet<String> = app
        .db
        .query("SELECT event_id::text FROM outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let held = results.iter().filter(|r| r.is_ok()).count();
    // Two adjustments, one event per hold, and HOT running out once.
    assert_eq!(committed.len(), 2 + held + 1);
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE event_type = 'OUT_OF_STOCK' AND sku = 'HOT'")
            .await,
        1
    );
    for mut stream in watchers {
        let events = take(&mut stream, committed.len()).await;
        assert_eq!(
            sequences(&events),
            (1..=committed.len() as i64).collect::<Vec<_>>()
        );
        // Each change of a SKU carries its own version, none missing: consumers can tell
        // the newest level of a SKU whatever order conflicting commits reached the stream in.
        let mut hot_versions: Vec<i64> = events
            .iter()
            .flat_map(|e| match &e.payload {
                Some(event::Payload::ReservationChanged(changed)) => changed.levels.clone(),
                Some(event::Payload::StockAdjusted(adjusted)) => {
                    adjusted.level.clone().into_iter().collect()
                }
                // Repeats the level of the change that crossed 0.
                Some(event::Payload::Availability(_))
                | Some(event::Payload::StockTransferred(_))
                | Some(event::Payload::StockStateChanged(_))
                | None => Vec::new(),
            })
            .filter(|level| level.sku == "HOT")
            .map(|level| level.version)
            .collect();
        hot_versions.sort_unstable();
        assert_eq!(hot_versions, (1..=101).collect::<Vec<_>>());
        let seen: HashSet<String> = events.into_iter().map(|e| e.event_id).collect();
        assert_eq!(seen, committed);
    }
}

#[tokio::test]
async fn a_cursor_behind_retention_is_out_of_range_naming_the_oldest_kept() {
    let mut app = spawn_app().await;
    for i in 0..5 {
        stock(&app, &format!("OLD-{i}"), 1).await;
    }
    let mut stream = watch(&app, 0).await;
    take(&mut stream, 5).await;
    // Everything positioned so far is past a zero retention.
    let retention = inventory_postgres::retention::Retention {
        events: Duration::ZERO,
        subscription_idle: Duration::from_secs(86_400),
        idempotency_keys: Duration::from_secs(86_400),
        reservations: Duration::from_secs(86_400),
        ledger: None,
    };
    let pruned = app.store.prune(&retention, 3).await.unwrap();
    assert_eq!(pruned.events, 3, "pruned in batches, oldest first");

    let status = app
        .client
        .watch_events(WatchEventsRequest {
            after_sequence: 1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange);
    assert_eq!(error_reason(&status), "CURSOR_PRUNED");
    use tonic_types::StatusExt as _;
    let info = status.get_details_error_info().unwrap();
    assert_eq!(info.metadata["oldest_sequence"], "4");

    // From the oldest kept (or from 0) the stream still works.
    let mut from_oldest = watch(&app, 3).await;
    assert_eq!(sequences(&take(&mut from_oldest, 2).await), [4, 5]);
    let mut from_zero = watch(&app, 0).await;
    assert_eq!(sequences(&take(&mut from_zero, 2).await), [4, 5]);

    let bad = app
        .client
        .watch_events(WatchEventsRequest {
            after_sequence: -1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&bad), ["after_sequence"]);
}

#[tokio::test]
async fn a_stuck_consumer_holds_a_bounded_queue_and_then_gets_everything() {
    let app = spawn_app().await;
    // Small HTTP/2 windows, so the client stops accepting data after a few kilobytes.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .initial_stream_window_size(Some(8 * 1024))
        .initial_connection_window_size(Some(8 * 1024))
        .connect()
        .await
        .unwrap();
    let mut stuck =
        inventory_server::proto::inventory_service_client::InventoryServiceClient::new(channel)
            .watch_events(WatchEventsRequest {
                after_sequence: 0,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
    // Enough events to fill the HTTP/2 window and then the watcher's own queue.
    let config = app.database_config().await;
    let db = connect(&config).await;
    db.execute(
        "INSERT INTO outbox (event_id, event_type, sku, payload)
         SELECT gen_random_uuid(), 'STOCK_ADJUSTED', 'SKU-' || i,
                '{\"delta\": 1, \"reason\": \"bulk\", \"on_hand\": 1, \"reserved\": 0}'
         FROM generate_series(1, 3000) AS i",
        &[],
    )
    .await
    .unwrap();
    while app.store.position_events(1000).await.unwrap()
        != inventory_postgres::events::Positioned::Moved(0)
    {}

    // Wait until the watcher's queue is full: the server then stops reading for it.
    inventory_testkit::eventually(
        "the stuck watcher's queue filled up to its bound",
        Duration::from_secs(10),
        || async {
            let queued = app.events.most_queued();
            assert!(queued <= WATCH_BUFFER, "queued {queued}");
            queued == WATCH_BUFFER
        },
    )
    .await
    .unwrap();

    let events = take(&mut stuck, 3000).await;
    assert_eq!(sequences(&events), (1..=3000).collect::<Vec<_>>());
}

#[tokio::test]
async fn shutdown_ends_open_event_streams_instead_of_waiting_out_the_grace_period() {
    let app = spawn_app().await;
    stock(&app, "SKU-1", 1).await;
    let mut stream = watch(&app, 0).await;
    take(&mut stream, 1).await;

    // The grace period is 5 s; an open stream must not hold the drain up to it.
    let stopped = tokio::time::timeout(Duration::from_secs(4), app.stop()).await;
    stopped
        .expect("stopped before the grace period ran out")
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(4), stream.next()).await;
    assert!(
        matches!(end, Ok(None) | Ok(Some(Err(_)))),
        "the stream ended: {end:?}"
    );
}

async fn watch_in(
    app: &TestApp,
    after: i64,
    epoch: &str,
) -> Result<Streaming<Event>, tonic::Status> {
    app.client
        .clone()
        .watch_events(WatchEventsRequest {
            after_sequence: after,
            epoch: epoch.into(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

/// Plays a restore of the stream to `head` on the test's database: the events after it are
/// gone, and the timeline the current epoch recorded is not the cluster's any more (as after
/// a point-in-time recovery, which ends on a new timeline).
pub async fn restore_stream_to(app: &TestApp, head: i64) {
    app.db
        .batch_execute(&format!(
            "DELETE FROM outbox WHERE position > {head};
             UPDATE event_stream SET head = {head};
             UPDATE stream_epochs SET timeline = timeline + 100;"
        ))
        .await
        .unwrap();
}

/// A refusal of a cursor the stream's current history does not have, with what to do next.
fn assert_not_in_history(status: &tonic::Status, epoch: &str, head: i64) {
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert_eq!(error_reason(status), "CURSOR_NOT_IN_HISTORY");
    use tonic_types::StatusExt as _;
    let details = status.get_error_details();
    let info = details.error_info().unwrap();
    assert_eq!(info.metadata["epoch"], epoch);
    assert_eq!(info.metadata["head"], head.to_string());
}

/// A restore (or a failover that lost a tail) takes the stream back to an earlier head, and
/// positions go on from there. A consumer past that head must hear that its history was cut,
/// never take the new events at positions it already passed for the ones it saw. The restore
/// to position 3 is played on the test's database (`restore_stream_to`).
#[tokio::test]
async fn a_cursor_past_a_cut_in_the_history_is_refused_and_one_before_it_resumes() {
    let app = spawn_app().await;
    stock(&app, "EPOCH", 100).await;
    for i in 0..4 {
        app.hold(&format!("before-{i}"), &[("EPOCH", 1)]).await;
    }
    let mut live = watch(&app, 0).await;
    let seen = take(&mut live, 5).await;
    assert_eq!(sequences(&seen), [1, 2, 3, 4, 5]);
    let first = seen[0].epoch.clone();
    assert_eq!(first.len(), 16, "an epoch is 16 hex digits: {first:?}");
    assert!(seen.iter().all(|e| e.epoch == first));

    // Past the head, with or without an epoch: refused, naming the epoch and the head.
    assert_not_in_history(&watch_in(&app, 9, &first).await.unwrap_err(), &first, 5);
    assert_not_in_history(&watch_in(&app, 9, "").await.unwrap_err(), &first, 5);
    let unknown = watch_in(&app, 2, "00000000000000ff").await.unwrap_err();
    assert_not_in_history(&unknown, &first, 5);
    let malformed = watch_in(&app, 2, "not-hex").await.unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&malformed), ["epoch"]);

    // The restore.
    restore_stream_to(&app, 3).await;
    for i in 0..3 {
        app.hold(&format!("after-{i}"), &[("EPOCH", 1)]).await;
    }

    // The live watcher had sent 4 and 5 of the lost history: the first event of the new
    // epoch past them ends its stream with the refusal.
    let ended = tokio::time::timeout(Duration::from_secs(20), live.next())
        .await
        .expect("the live watcher hears of the cut")
        .expect("an item");
    let status = ended.expect_err("not an event");
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    assert_eq!(error_reason(&status), "CURSOR_NOT_IN_HISTORY");

    // Resuming: past the cut in the old epoch is refused; at the cut it goes on in the new
    // epoch; the new epoch's own cursors resume as usual.
    let mut stream = watch_in(&app, 3, &first)
        .await
        .expect("a cursor at the cut resumes");
    let resumed = take(&mut stream, 3).await;
    assert_eq!(sequences(&resumed), [4, 5, 6]);
    let second = resumed[0].epoch.clone();
    assert_ne!(second, first, "a new epoch began at the cut");
    assert!(resumed.iter().all(|e| e.epoch == second));
    assert_not_in_history(&watch_in(&app, 5, &first).await.unwrap_err(), &second, 6);
    let mut stream = watch_in(&app, 5, &second).await.unwrap();
    assert_eq!(sequences(&take(&mut stream, 1).await), [6]);
    let (epochs, reason): (i64, String) = {
        let row = app
            .db
            .query_one(
                "SELECT (SELECT count(*) FROM stream_epochs),
                        (SELECT reason FROM stream_epochs ORDER BY seq DESC LIMIT 1)",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(epochs, 2);
    assert!(reason.starts_with("timeline "), "{reason}");

    // A new epoch by hand (`inventory-server new-stream-epoch`) cuts nothing behind the head:
    // the consumers at it go on.
    let mut client = connect(&app.database_config().await).await;
    let third = inventory_postgres::events::new_stream_epoch(&mut client, "test")
        .await
        .unwrap();
    assert_eq!(third.starts_after, 6);
    let mut stream = watch_in(&app, 6, &second).await.unwrap();
    app.hold("after-reset", &[("EPOCH", 1)]).await;
    let next = take(&mut stream, 1).await;
    assert_eq!(sequences(&next), [7]);
    assert_eq!(next[0].epoch, third.id.to_string());
}
