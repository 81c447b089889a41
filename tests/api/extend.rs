//! `ExtendReservation`: a live hold's expiry moves to `ttl` after the call, within
//! `MAX_HOLD` of its creation, with an event; anything but a live hold is refused and
//! nothing changes.

use std::time::{Duration, SystemTime};

use inventory_server::proto::{
    EventType, ExtendReservationRequest, Reservation, ReservationState, event,
};
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::{
    events::{take, watch},
    helpers::{
        TestApp, confirm, error_reason, fresh_database, release, reserve, spawn_app,
        spawn_app_with, stock, test_settings, violated_fields,
    },
};

fn extend(id: &str, seconds: i64) -> ExtendReservationRequest {
    ExtendReservationRequest {
        reservation_id: id.into(),
        ttl: Some(prost_types::Duration { seconds, nanos: 0 }),
    }
}

fn time(timestamp: &Option<prost_types::Timestamp>) -> SystemTime {
    let timestamp = *timestamp;
    SystemTime::try_from(timestamp.expect("a timestamp")).unwrap()
}

async fn hold_for(app: &TestApp, key: &str, seconds: i64) -> Reservation {
    let mut request = reserve(key, &[("SKU-1", 2)]);
    request.ttl = Some(prost_types::Duration { seconds, nanos: 0 });
    app.client
        .clone()
        .reserve(request)
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn a_hold_is_extended_from_now_and_its_event_carries_the_new_expiry() {
    let mut app = spawn_app().await;
    stock(&app, "SKU-1", 5).await;
    let held = hold_for(&app, "k1", 60).await;
    let before_call = SystemTime::now();
    let extended = app
        .client
        .extend_reservation(extend(&held.reservation_id, 3_600))
        .await
        .unwrap()
        .into_inner();
    let after_call = SystemTime::now();

    assert_eq!(extended.state(), ReservationState::Held);
    assert_eq!(extended.created_at, held.created_at);
    assert_eq!(extended.lines, held.lines);
    let expires = time(&extended.expires_at);
    // PostgreSQL's clock is this machine's: the new expiry is an hour after the call.
    assert!(
        expires >= before_call + Duration::from_secs(3_599),
        "{expires:?}"
    );
    assert!(
        expires <= after_call + Duration::from_secs(3_601),
        "{expires:?}"
    );
    assert_eq!(app.reservation(&held.reservation_id).await, extended);
    assert_eq!(app.level("SKU-1").await, (5, 2), "no stock moved");

    let events = take(&mut watch(&app, 0).await, 3).await;
    let types: Vec<EventType> = events.iter().map(|e| e.r#type()).collect();
    assert_eq!(
        types,
        [
            EventType::StockAdjusted,
            EventType::ReservationHeld,
            EventType::ReservationExtended
        ]
    );
    let changed = |e: &inventory_server::proto::Event| match &e.payload {
        Some(event::Payload::ReservationChanged(changed)) => changed.clone(),
        other => panic!("{other:?}"),
    };
    let held_event = changed(&events[1]);
    assert_eq!(
        held_event.expires_at, held.expires_at,
        "a hold's event has its expiry"
    );
    let extended_event = changed(&events[2]);
    assert_eq!(extended_event.expires_at, extended.expires_at);
    assert_eq!(extended_event.state(), ReservationState::Held);
    assert!(extended_event.levels.is_empty(), "no stock changed");
    assert_eq!(extended_event.lines, held.lines);
}

#[tokio::test]
async fn an_extended_hold_outlives_its_old_expiry() {
    let mut app = spawn_app().await;
    stock(&app, "SKU-1", 5).await;
    let held = hold_for(&app, "k1", 1).await;
    app.client
        .extend_reservation(extend(&held.reservation_id, 3_600))
        .await
        .unwrap();
    // Wait until PostgreSQL's clock is past the old expiry, a few sweeps (every 100 ms) on.
    let old_expiry = time(&held.expires_at) + Duration::from_millis(500);
    inventory_testkit::process::eventually(
        "the old expiry passed",
        Duration::from_secs(10),
        || async {
            let now: SystemTime = app
                .db
                .query_one("SELECT clock_timestamp()", &[])
                .await
                .unwrap()
                .get(0);
            now > old_expiry
        },
    )
    .await
    .unwrap();
    assert_eq!(
        app.reservation(&held.reservation_id).await.state(),
        ReservationState::Held
    );
    assert_eq!(app.level("SKU-1").await, (5, 2), "the units are still held");
}

#[tokio::test]
async fn only_a_live_hold_is_extended_and_a_refusal_changes_nothing() {
    let mut app = spawn_app().await;
    stock(&app, "SKU-1", 10).await;
    let confirmed = hold_for(&app, "confirmed", 600).await;
    app.client
        .confirm_reservation(confirm(&confirmed.reservation_id))
        .await
        .unwrap();
    let released = hold_for(&app, "released", 600).await;
    app.client
        .release_reservation(release(&released.reservation_id))
        .await
        .unwrap();
    let overdue = hold_for(&app, "overdue", 600).await;
    // Overdue by PostgreSQL's clock (the sweeper may or may not have got to it yet: both read
    // as EXPIRED).
    app.db
        .execute(
            "UPDATE reservations SET created_at = clock_timestamp() - interval '1 hour', \
             expires_at = clock_timestamp() - interval '1 second' WHERE reservation_id = $1",
            &[&uuid::Uuid::parse_str(&overdue.reservation_id).unwrap()],
        )
        .await
        .unwrap();
    let before = app.row_counts().await;
    for (reservation, state) in [
        (&confirmed, "CONFIRMED"),
        (&released, "RELEASED"),
        (&overdue, "EXPIRED"),
    ] {
        let refused = app
            .client
            .extend_reservation(extend(&reservation.reservation_id, 600))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        assert_eq!(error_reason(&refused), "INVALID_RESERVATION_STATE");
        assert!(refused.message().contains(state), "{refused:?}");
    }
    let unknown = app
        .client
        .extend_reservation(extend(&uuid::Uuid::new_v4().to_string(), 600))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    // The sweeper may have expired the overdue hold meanwhile; nothing else may differ.
    let after = app.row_counts().await;
    let events = |counts: &[(String, i64)]| {
        counts
            .iter()
            .find(|(table, _)| table == "outbox")
            .map(|(_, n)| *n)
    };
    assert!(
        events(&after) <= events(&before).map(|n| n + 1),
        "{before:?} {after:?}"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM outbox WHERE event_type = 'RESERVATION_EXTENDED'")
            .await,
        0
    );
}

#[tokio::test]
async fn a_hold_never_outlives_max_hold() {
    let mut settings = test_settings(fresh_database().await);
    settings.inventory.max_hold = Duration::from_secs(3_600);
    let mut app = spawn_app_with(settings).await;
    stock(&app, "SKU-1", 5).await;
    let held = hold_for(&app, "k1", 600).await;

    // Up to created_at + MAX_HOLD is fine (the call comes a little after created_at).
    app.client
        .extend_reservation(extend(&held.reservation_id, 3_500))
        .await
        .unwrap();
    let before = app.reservation(&held.reservation_id).await;
    let refused = app
        .client
        .extend_reservation(extend(&held.reservation_id, 3_600))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(error_reason(&refused), "MAX_HOLD_EXCEEDED");
    let latest = refused
        .get_details_error_info()
        .unwrap()
        .metadata
        .get("latest_expires_at")
        .cloned()
        .expect("the latest allowed expiry");
    let latest: SystemTime = humantime::parse_rfc3339(&latest).unwrap();
    assert_eq!(
        latest,
        time(&held.created_at) + Duration::from_secs(3_600),
        "created_at + MAX_HOLD"
    );
    assert_eq!(
        app.reservation(&held.reservation_id).await,
        before,
        "nothing changed"
    );

    // A new hold may not ask for more than MAX_HOLD either.
    let mut request = reserve("k2", &[("SKU-1", 1)]);
    request.ttl = Some(prost_types::Duration {
        seconds: 3_601,
        nanos: 0,
    });
    let refused = app.client.reserve(request).await.unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&refused), ["ttl"]);
    assert_eq!(app.level("SKU-1").await, (5, 2));
}

#[tokio::test]
async fn malformed_extensions_name_their_fields() {
    let mut app = spawn_app().await;
    let no_ttl = app
        .client
        .extend_reservation(ExtendReservationRequest {
            reservation_id: "not-a-uuid".into(),
            ttl: None,
        })
        .await
        .unwrap_err();
    assert_eq!(no_ttl.code(), Code::InvalidArgument);
    assert_eq!(violated_fields(&no_ttl), ["reservation_id", "ttl"]);
    for seconds in [0, 24 * 3600 + 1, -5] {
        let bad = app
            .client
            .extend_reservation(extend(&uuid::Uuid::new_v4().to_string(), seconds))
            .await
            .unwrap_err();
        assert_eq!(bad.code(), Code::InvalidArgument, "{seconds}");
        assert_eq!(violated_fields(&bad), ["ttl"]);
    }
}
