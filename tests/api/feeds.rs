//! Filtered `WatchEvents` streams with heartbeats, and named subscriptions: the same gap-free
//! and resume guarantees as the whole stream, a cursor the server keeps, one reader at a time,
//! and retention that waits for every subscription but an idle one (which is then lost and
//! says so).

use std::time::Duration;

use futures::future::join_all;
use inventory_server::proto::{
    AckEventsRequest, CreateSubscriptionRequest, DeleteSubscriptionRequest, Event, EventFilter,
    EventType, ListSubscriptionsRequest, Subscription, WatchEventsRequest, event,
};
use tokio_stream::StreamExt as _;
use tonic::{Code, Streaming};

use crate::{
    events::{take, watch},
    helpers::{
        TestApp, error_reason, reserve, spawn_app, spawn_app_without_sweeper, stock,
        violated_fields,
    },
};

/// The stream's head once every committed event is positioned.
async fn head(app: &TestApp) -> i64 {
    app.positioned().await
}

async fn list(app: &TestApp) -> Vec<Subscription> {
    app.client
        .clone()
        .list_subscriptions(ListSubscriptionsRequest {})
        .await
        .unwrap()
        .into_inner()
        .subscriptions
}

/// Every event the stream has positioned, from a whole-stream watcher: `head` of them.
async fn whole_stream(app: &TestApp) -> Vec<Event> {
    let head = head(app).await;
    let mut stream = watch(app, 0).await;
    take(&mut stream, usize::try_from(head).unwrap()).await
}

/// Items of `stream` until one (event or heartbeat) at `through` or later; events only.
async fn events_through(stream: &mut Streaming<Event>, through: i64) -> (Vec<Event>, Event) {
    let mut events = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .unwrap_or_else(|_| panic!("nothing reached {through}; got {events:?}"))
            .expect("stream open")
            .expect("no error");
        if next.r#type == EventType::Heartbeat as i32 {
            assert!(next.event_id.is_empty() && next.payload.is_none());
            assert!(
                next.sequence == 0 || !next.epoch.is_empty(),
                "a heartbeat names its epoch"
            );
            if next.sequence >= through {
                return (events, next);
            }
            continue;
        }
        let last = next.sequence >= through;
        events.push(next.clone());
        if last {
            return (events, next);
        }
    }
}

/// The SKUs a reservation event is about.
fn skus(event: &Event) -> Vec<String> {
    match &event.payload {
        Some(event::Payload::ReservationChanged(changed)) => {
            changed.lines.iter().map(|l| l.sku.clone()).collect()
        }
        Some(event::Payload::StockAdjusted(adjusted)) => adjusted
            .level
            .iter()
            .map(|level| level.sku.clone())
            .collect(),
        Some(event::Payload::Availability(changed)) => {
            changed.level.iter().map(|l| l.sku.clone()).collect()
        }
        _ => Vec::new(),
    }
}

/// The next `n` events, after the opening heartbeat of a filtered stream (at `opens_at`).
async fn take_after_opening(stream: &mut Streaming<Event>, opens_at: i64, n: usize) -> Vec<Event> {
    let opening = take(stream, 1).await.remove(0);
    assert_eq!(opening.r#type, EventType::Heartbeat as i32, "{opening:?}");
    assert_eq!(opening.sequence, opens_at);
    take(stream, n).await
}

fn ids(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.event_id.clone()).collect()
}

fn held_of(sku: &str) -> EventFilter {
    EventFilter {
        types: vec![EventType::ReservationHeld as i32],
        skus: vec![sku.into()],
        ..Default::default()
    }
}

/// Reserves that race over HOT and COLD: holds, refusals (HOT runs out) and OUT_OF_STOCK.
async fn storm(app: &TestApp, calls: usize) {
    let calls = (0..calls).map(|i| {
        let mut client = app.client.clone();
        let cart: &[(&str, i64)] = if i % 2 == 0 {
            &[("HOT", 1)]
        } else {
            &[("COLD", 1), ("HOT", 1)]
        };
        async move { client.reserve(reserve(&format!("storm-{i}"), cart)).await }
    });
    let results = join_all(calls).await;
    assert!(results.iter().any(Result::is_ok));
}

async fn create(app: &TestApp, name: &str, filter: EventFilter, from_oldest: bool) -> Subscription {
    app.client
        .clone()
        .create_subscription(CreateSubscriptionRequest {
            name: name.into(),
            filter: Some(filter),
            from_oldest,
        })
        .await
        .unwrap()
        .into_inner()
}

async fn read(app: &TestApp, name: &str) -> Result<Streaming<Event>, tonic::Status> {
    app.client
        .clone()
        .watch_events(WatchEventsRequest {
            subscription: name.into(),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn ack(app: &TestApp, name: &str, event: &Event) -> Result<Subscription, tonic::Status> {
    app.client
        .clone()
        .ack_events(AckEventsRequest {
            subscription: name.into(),
            sequence: event.sequence,
            epoch: event.epoch.clone(),
        })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn under_a_storm_a_filtered_stream_and_a_subscription_send_exactly_the_matching_events() {
    let app = spawn_app().await;
    stock(&app, "HOT", 60).await;
    stock(&app, "COLD", 1_000).await;
    let filter = held_of("HOT");
    let mut filtered = app
        .client
        .clone()
        .watch_events(WatchEventsRequest {
            filter: Some(filter.clone()),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    create(&app, "hot-holds", filter, false).await;
    let mut subscribed = read(&app, "hot-holds").await.unwrap();

    storm(&app, 160).await;

    let all = whole_stream(&app).await;
    let head = all.last().unwrap().sequence;
    let wanted: Vec<Event> = all
        .iter()
        .filter(|e| e.r#type == EventType::ReservationHeld as i32)
        .filter(|e| skus(e).iter().any(|s| s == "HOT"))
        .cloned()
        .collect();
    assert_eq!(wanted.len(), 60, "every HOT unit was held once");
    for stream in [&mut filtered, &mut subscribed] {
        let (got, last) = events_through(stream, head).await;
        // Each matching event once, in stream order, with its place in the whole stream.
        assert_eq!(got, wanted);
        assert_eq!(last.sequence, head, "caught up, it says how far it scanned");
    }
}

#[tokio::test]
async fn a_filtered_consumer_resumes_from_a_heartbeat_and_misses_nothing() {
    let app = spawn_app().await;
    stock(&app, "RARE", 5).await;
    for i in 0..20 {
        stock(&app, &format!("BUSY-{i}"), 1).await;
    }
    let filter = EventFilter {
        sku_prefixes: vec!["RAR".into()],
        ..Default::default()
    };
    assert_eq!(head(&app).await, 21);
    let request = |after: i64, epoch: String| WatchEventsRequest {
        after_sequence: after,
        epoch,
        filter: Some(filter.clone()),
        ..Default::default()
    };
    let mut stream = app
        .client
        .clone()
        .watch_events(request(0, String::new()))
        .await
        .unwrap()
        .into_inner();
    let (first, beat) = events_through(&mut stream, head(&app).await).await;
    assert_eq!(first.len(), 1, "the one RARE event");
    assert_eq!(
        beat.sequence, 21,
        "the heartbeat says everything was scanned"
    );
    drop(stream);

    // The consumer saved the heartbeat's cursor; what follows it is all it gets.
    for i in 20..30 {
        stock(&app, &format!("BUSY-{i}"), 1).await;
    }
    let mut client = app.client.clone();
    client
        .reserve(reserve("rare-1", &[("RARE", 2)]))
        .await
        .unwrap();
    stock(&app, "RARE", 1).await;
    let mut resumed = client
        .watch_events(request(beat.sequence, beat.epoch.clone()))
        .await
        .unwrap()
        .into_inner();
    let (rest, last) = events_through(&mut resumed, head(&app).await).await;
    let all = whole_stream(&app).await;
    let expected: Vec<Event> = all
        .into_iter()
        .filter(|e| e.sequence > beat.sequence && skus(e).iter().any(|s| s == "RARE"))
        .collect();
    assert_eq!(ids(&rest), ids(&expected));
    assert_eq!(rest.len(), 2, "the hold and the restock");
    assert_eq!(last.sequence, head(&app).await);
}

#[tokio::test]
async fn filters_are_checked_value_by_value_and_a_subscription_takes_no_cursor() {
    let app = spawn_app().await;
    let status = app
        .client
        .clone()
        .watch_events(WatchEventsRequest {
            filter: Some(EventFilter {
                types: vec![EventType::Heartbeat as i32, 99],
                skus: vec!["ok".into(), "not a sku".into()],
                order_ids: vec![String::new()],
                location_ids: vec!["UPPER".into()],
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        violated_fields(&status),
        [
            "filter.skus[1]",
            "filter.order_ids[0]",
            "filter.location_ids[0]",
            "filter.types[0]",
            "filter.types[1]",
        ]
    );
    let status = app
        .client
        .clone()
        .watch_events(WatchEventsRequest {
            after_sequence: 3,
            subscription: "orders".into(),
            filter: Some(held_of("A")),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&status), ["after_sequence", "filter"]);
    let status = app
        .client
        .clone()
        .create_subscription(CreateSubscriptionRequest {
            name: "no spaces".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&status), ["name"]);
    assert_eq!(
        app.count("SELECT count(*) FROM event_subscriptions").await,
        0
    );
}

#[tokio::test]
async fn a_subscription_resumes_after_its_last_acknowledgement() {
    let app = spawn_app().await;
    stock(&app, "S-0", 1).await;
    assert_eq!(head(&app).await, 1);
    let created = create(
        &app,
        "restocks",
        EventFilter {
            sku_prefixes: vec!["S-".into()],
            ..Default::default()
        },
        false,
    )
    .await;
    assert_eq!(created.acked_sequence, 1, "it starts at the head");
    for i in 1..=6 {
        stock(&app, &format!("S-{i}"), 1).await;
        stock(&app, &format!("OTHER-{i}"), 1).await;
    }
    // Every event positioned first, so the catch-up sends exactly the three asked for next.
    head(&app).await;
    let mut stream = read(&app, "restocks").await.unwrap();
    // It opens where the subscription stands.
    let first = take_after_opening(&mut stream, 1, 3).await;
    assert_eq!(
        first.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        [2, 4, 6]
    );
    let head_now = head(&app).await;
    let acked = ack(&app, "restocks", &first[1]).await.unwrap();
    assert_eq!(acked.acked_sequence, 4);
    assert_eq!(
        acked.lag,
        head_now - 4,
        "behind the head by every event, matching or not"
    );
    // An older acknowledgement moves nothing back.
    let again = ack(&app, "restocks", &first[0]).await.unwrap();
    assert_eq!(again.acked_sequence, 4);
    drop(stream);

    // At least once: everything after the acknowledgement comes again.
    let mut resumed = read(&app, "restocks").await.unwrap();
    let (rest, _) = events_through(&mut resumed, head(&app).await).await;
    assert_eq!(
        rest.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        [6, 8, 10, 12]
    );
    let listed = list(&app).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].name, "restocks");
    assert_eq!(listed[0].acked_sequence, 4);
    assert_eq!(listed[0].lag, head(&app).await - 4);
    assert!(!listed[0].lost);

    // Acknowledging what the stream does not have yet is refused.
    let future = Event {
        sequence: head(&app).await + 1,
        ..Default::default()
    };
    let status = ack(&app, "restocks", &future).await.unwrap_err();
    assert_eq!(violated_fields(&status), ["sequence"]);
}

#[tokio::test]
async fn a_second_reader_takes_the_subscription_over_and_the_first_is_told() {
    let app = spawn_app().await;
    create(&app, "fulfilment", EventFilter::default(), false).await;
    let mut first = read(&app, "fulfilment").await.unwrap();
    stock(&app, "A", 1).await;
    take_after_opening(&mut first, 0, 1).await;

    let mut second = read(&app, "fulfilment").await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match first.next().await {
                Some(Ok(_)) => continue,
                Some(Err(status)) => return Some(status),
                None => return None,
            }
        }
    })
    .await
    .expect("the first reader's stream ends")
    .expect("with a status");
    assert_eq!(ended.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&ended), "SUBSCRIPTION_TAKEN_OVER");

    // Nothing was acknowledged: the new reader gets the event again, and what follows.
    stock(&app, "B", 1).await;
    let events = take_after_opening(&mut second, 0, 2).await;
    assert_eq!(
        events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        [1, 2]
    );

    // Deleting it ends its reader too.
    app.client
        .clone()
        .delete_subscription(DeleteSubscriptionRequest {
            name: "fulfilment".into(),
            allow_missing: false,
        })
        .await
        .unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(20), second.next())
        .await
        .expect("the reader's stream ends")
        .expect("with a status")
        .unwrap_err();
    assert_eq!(error_reason(&ended), "SUBSCRIPTION_NOT_FOUND");
    let status = app
        .client
        .clone()
        .delete_subscription(DeleteSubscriptionRequest {
            name: "fulfilment".into(),
            allow_missing: false,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    // Retried after a lost answer, with `allow_missing`: as deleted.
    app.client
        .clone()
        .delete_subscription(DeleteSubscriptionRequest {
            name: "fulfilment".into(),
            allow_missing: true,
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn creating_a_subscription_again_answers_it_and_another_filter_is_refused() {
    let app = spawn_app().await;
    let filter = EventFilter {
        skus: vec!["B".into(), "A".into()],
        ..Default::default()
    };
    let created = create(&app, "twice", filter, false).await;
    stock(&app, "A", 1).await;
    // The same filter, its values in another order: the same subscription, as it is.
    let again = create(
        &app,
        "twice",
        EventFilter {
            skus: vec!["A".into(), "B".into()],
            ..Default::default()
        },
        true,
    )
    .await;
    assert_eq!(again.created_at, created.created_at);
    assert_eq!(again.acked_sequence, 0);
    let status = app
        .client
        .clone()
        .create_subscription(CreateSubscriptionRequest {
            name: "twice".into(),
            filter: Some(held_of("A")),
            from_oldest: false,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);
    assert_eq!(error_reason(&status), "SUBSCRIPTION_EXISTS");
}

#[tokio::test]
async fn retention_waits_for_a_subscription_until_it_is_idle_and_then_it_is_lost_and_says_so() {
    let app = spawn_app_without_sweeper().await;
    create(&app, "slow", EventFilter::default(), true).await;
    for i in 0..5 {
        stock(&app, &format!("R-{i}"), 1).await;
    }
    let events = whole_stream(&app).await;
    let mut retention = inventory_postgres::retention::Retention {
        events: Duration::ZERO,
        subscription_idle: Duration::from_secs(86_400),
        idempotency_keys: Duration::from_secs(86_400),
        reservations: Duration::from_secs(86_400),
        ledger: None,
    };

    // Past event retention, but nobody acknowledged them.
    let pruned = app.store.prune(&retention, 100).await.unwrap();
    assert_eq!(pruned.events, 0);
    ack(&app, "slow", &events[2]).await.unwrap();
    let pruned = app.store.prune(&retention, 100).await.unwrap();
    assert_eq!(
        pruned.events, 3,
        "through the acknowledged event, no further"
    );
    let mut stream = read(&app, "slow").await.unwrap();
    assert_eq!(
        ids(&take_after_opening(&mut stream, 3, 2).await),
        ids(&events[3..])
    );
    drop(stream);

    // Idle past the limit: retention goes on, and the subscription is lost.
    retention.subscription_idle = Duration::ZERO;
    let pruned = app.store.prune(&retention, 100).await.unwrap();
    assert_eq!(pruned.events, 2);
    let status = read(&app, "slow").await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&status), "SUBSCRIPTION_LOST");
    let status = ack(&app, "slow", &events[4]).await.unwrap_err();
    assert_eq!(error_reason(&status), "SUBSCRIPTION_LOST");
    let listed = list(&app).await;
    assert!(listed[0].lost);
    assert!(
        listed[0]
            .lost_reason
            .contains("events through 5 were pruned"),
        "{}",
        listed[0].lost_reason
    );
}

/// A restore cuts the history behind a subscription's position: reading it is refused like a
/// cursor past the cut, and the consumer, after rebuilding from a snapshot, acknowledges where
/// it goes on (the head the refusal names), which moves the subscription there, back.
#[tokio::test]
async fn after_a_cut_a_subscription_is_refused_until_acknowledged_where_it_goes_on() {
    let app = spawn_app().await;
    create(&app, "after-cut", EventFilter::default(), false).await;
    for i in 0..5 {
        stock(&app, &format!("CUT-{i}"), 1).await;
    }
    assert_eq!(head(&app).await, 5);
    let mut stream = read(&app, "after-cut").await.unwrap();
    let seen = take_after_opening(&mut stream, 0, 5).await;
    drop(stream);
    ack(&app, "after-cut", &seen[4]).await.unwrap();

    crate::events::restore_stream_to(&app, 3).await;
    stock(&app, "AFTER", 1).await;
    assert_eq!(head(&app).await, 4);
    let status = read(&app, "after-cut").await.unwrap_err();
    assert_eq!(error_reason(&status), "CURSOR_NOT_IN_HISTORY");
    use tonic_types::StatusExt as _;
    let details = status.get_error_details();
    let metadata = &details.error_info().unwrap().metadata;
    let (head_then, epoch) = (metadata["head"].parse().unwrap(), metadata["epoch"].clone());

    // Rebuilt from a snapshot taken now: it goes on from the head the refusal named.
    let rebased = ack(
        &app,
        "after-cut",
        &Event {
            sequence: head_then,
            epoch: epoch.clone(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(rebased.acked_sequence, head_then);
    assert_eq!(rebased.acked_epoch, epoch);
    stock(&app, "LATER", 1).await;
    let mut stream = read(&app, "after-cut").await.unwrap();
    let next = take_after_opening(&mut stream, head_then, 1).await;
    assert_eq!(next[0].sequence, head_then + 1);
}

/// A tenant's subscriptions are bounded (`TENANT_MAX_SUBSCRIPTIONS`): one more is
/// `RESOURCE_EXHAUSTED` with the limit, even when several are created at once; one that exists
/// is still answered at the limit, and deleting one makes room.
#[tokio::test]
async fn a_tenants_subscriptions_are_bounded() {
    let mut settings = crate::helpers::test_settings(crate::helpers::fresh_database().await);
    settings.tenants.limits.max_subscriptions = Some(2);
    let app = crate::helpers::spawn_app_with(settings).await;
    let attempts = join_all((0..5).map(|n| {
        let mut client = app.client.clone();
        async move {
            client
                .create_subscription(CreateSubscriptionRequest {
                    name: format!("racer-{n}"),
                    filter: Some(held_of("A")),
                    from_oldest: false,
                })
                .await
        }
    }))
    .await;
    let made = attempts.iter().filter(|a| a.is_ok()).count();
    assert_eq!(made, 2, "{attempts:?}");
    for refused in attempts.iter().filter_map(|a| a.as_ref().err()) {
        assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
        assert_eq!(error_reason(refused), "TOO_MANY_SUBSCRIPTIONS");
    }
    assert_eq!(
        app.count("SELECT count(*) FROM event_subscriptions").await,
        2
    );
    let first = attempts
        .iter()
        .find_map(|a| a.as_ref().ok())
        .unwrap()
        .get_ref()
        .clone();
    // At the limit, one that exists is answered as it is.
    let again = create(&app, &first.name, held_of("A"), false).await;
    assert_eq!(again.name, first.name);
    app.client
        .clone()
        .delete_subscription(DeleteSubscriptionRequest {
            name: first.name.clone(),
            allow_missing: false,
        })
        .await
        .unwrap();
    create(&app, "after-delete", held_of("A"), false).await;
}
