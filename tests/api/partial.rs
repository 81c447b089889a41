//! Partial confirm and release: only the units named move, the line counts and the stock
//! levels add up after every step, expiry and cancel return only what is still held, a key
//! makes a partial call act once, and lines asking for more than is held change nothing.

use std::time::Duration;

use futures::future::join_all;
use inventory_server::proto::{
    CancelOrderRequest, EventType, ListReservationsRequest, Reservation, ReservationState, event,
};
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::{
    events::{take, watch},
    helpers::{
        TestApp, confirm_part, error_reason, release_part, spawn_app, stock, violated_fields,
    },
};

/// `(sku, quantity, held, confirmed, released)` of every line, checking each adds up.
fn counts(reservation: &Reservation) -> Vec<(String, i64, i64, i64, i64)> {
    reservation
        .lines
        .iter()
        .map(|l| {
            assert_eq!(
                l.held + l.confirmed + l.released,
                l.quantity,
                "a line's units add up: {l:?}"
            );
            (l.sku.clone(), l.quantity, l.held, l.confirmed, l.released)
        })
        .collect()
}

fn line(
    sku: &str,
    quantity: i64,
    held: i64,
    confirmed: i64,
    released: i64,
) -> (String, i64, i64, i64, i64) {
    (sku.into(), quantity, held, confirmed, released)
}

/// Each SKU's `reserved` is what its live holds still hold: the levels and the line counts
/// agree.
async fn assert_levels_match_holds(app: &TestApp) {
    let mismatched = app
        .count(
            "SELECT count(*) FROM stock s WHERE s.reserved <> COALESCE((
                 SELECT sum(l.quantity - l.confirmed - l.released)
                 FROM reservation_lines l JOIN reservations r USING (reservation_id)
                 WHERE l.sku = s.sku AND r.state = 'HELD'), 0)",
        )
        .await;
    assert_eq!(mismatched, 0, "reserved equals the units still held");
}

async fn overdue(app: &TestApp, id: &str) {
    app.db
        .execute(
            "UPDATE reservations SET created_at = clock_timestamp() - interval '1 hour',
             expires_at = clock_timestamp() - interval '1 second' WHERE reservation_id = $1",
            &[&uuid::Uuid::parse_str(id).unwrap()],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn partial_confirm_partial_release_and_expiry_of_the_rest_add_up_at_every_step() {
    let mut app = spawn_app().await;
    stock(&app, "MUG", 10).await;
    stock(&app, "CAP", 10).await;
    let held = app.hold("order", &[("MUG", 5), ("CAP", 3)]).await;
    let id = held.reservation_id.clone();
    assert_eq!(
        counts(&held),
        [line("CAP", 3, 3, 0, 0), line("MUG", 5, 5, 0, 0)]
    );

    // Two mugs ship.
    let shipped = app
        .client
        .confirm_reservation(confirm_part(&id, "ship-1", &[("MUG", 2)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(shipped.state(), ReservationState::Held);
    assert_eq!(
        counts(&shipped),
        [line("CAP", 3, 3, 0, 0), line("MUG", 5, 3, 2, 0)]
    );
    assert_eq!(app.reservation(&id).await, shipped);
    assert_eq!(app.level("MUG").await, (8, 3), "two mugs left the stock");
    assert_eq!(app.level("CAP").await, (10, 3));
    assert_levels_match_holds(&app).await;

    // One mug and a cap are dropped from the order.
    let dropped = app
        .client
        .release_reservation(release_part(&id, "drop-1", &[("CAP", 1), ("MUG", 1)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(dropped.state(), ReservationState::Held);
    assert_eq!(
        counts(&dropped),
        [line("CAP", 3, 2, 0, 1), line("MUG", 5, 2, 2, 1)]
    );
    assert_eq!(app.level("MUG").await, (8, 2));
    assert_eq!(app.level("CAP").await, (10, 2));
    assert_levels_match_holds(&app).await;

    // The rest expires: swept or not, it reads the same, CONFIRMED since mugs shipped.
    overdue(&app, &id).await;
    let expired = app.reservation(&id).await;
    assert_eq!(expired.state(), ReservationState::Confirmed);
    assert_eq!(
        counts(&expired),
        [line("CAP", 3, 0, 0, 3), line("MUG", 5, 0, 2, 3)]
    );
    let listed = |state: ReservationState| ListReservationsRequest {
        state: state.into(),
        ..Default::default()
    };
    let confirmed = app
        .client
        .list_reservations(listed(ReservationState::Confirmed))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(confirmed.reservations, std::slice::from_ref(&expired));
    let expired_list = app
        .client
        .list_reservations(listed(ReservationState::Expired))
        .await
        .unwrap()
        .into_inner();
    assert!(expired_list.reservations.is_empty());

    inventory_testkit::process::eventually(
        "the sweeper ends the hold",
        Duration::from_secs(10),
        || async { app.level("MUG").await == (8, 0) && app.level("CAP").await == (10, 0) },
    )
    .await
    .unwrap();
    assert_eq!(
        app.reservation(&id).await,
        expired,
        "swept, it reads the same"
    );
    assert_levels_match_holds(&app).await;

    // One event per change, with the counts after it.
    let events = take(&mut watch(&app, 2).await, 4).await;
    let types: Vec<EventType> = events.iter().map(|e| e.r#type()).collect();
    assert_eq!(
        types,
        [
            EventType::ReservationHeld,
            EventType::ReservationPartiallyConfirmed,
            EventType::ReservationPartiallyReleased,
            EventType::ReservationExpired,
        ]
    );
    let changed: Vec<_> = events
        .iter()
        .map(|e| match &e.payload {
            Some(event::Payload::ReservationChanged(changed)) => changed.clone(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(changed[1].state(), ReservationState::Held);
    assert_eq!(changed[1].lines, shipped.lines);
    assert_eq!(
        changed[1]
            .levels
            .iter()
            .map(|l| (l.sku.as_str(), l.on_hand, l.reserved))
            .collect::<Vec<_>>(),
        [("MUG", 8, 3)],
        "only the SKUs that moved"
    );
    assert_eq!(changed[2].lines, dropped.lines);
    assert_eq!(changed[3].state(), ReservationState::Confirmed);
    assert_eq!(changed[3].lines, expired.lines);
}

#[tokio::test]
async fn a_partial_call_needs_a_key_and_acts_once_however_often_it_is_sent() {
    let mut app = spawn_app().await;
    stock(&app, "MUG", 10).await;
    let id = app.hold("order", &[("MUG", 5)]).await.reservation_id;

    let keyless = app
        .client
        .confirm_reservation(confirm_part(&id, "", &[("MUG", 1)]))
        .await
        .unwrap_err();
    assert_eq!(violated_fields(&keyless), ["idempotency_key"]);

    let first = app
        .client
        .confirm_reservation(confirm_part(&id, "ship-1", &[("MUG", 2)]))
        .await
        .unwrap()
        .into_inner();
    for _ in 0..3 {
        let again = app
            .client
            .confirm_reservation(confirm_part(&id, "ship-1", &[("MUG", 2)]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(again, first, "a repeat answers and moves nothing");
    }
    assert_eq!(app.level("MUG").await, (8, 3));
    let reused = app
        .client
        .confirm_reservation(confirm_part(&id, "ship-1", &[("MUG", 1)]))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::AlreadyExists, "{reused:?}");
    // The same key for a release is another request.
    let reused = app
        .client
        .release_reservation(release_part(&id, "ship-1", &[("MUG", 2)]))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Code::AlreadyExists, "{reused:?}");
    assert_eq!(
        app.count(
            "SELECT count(*) FROM outbox WHERE event_type = 'RESERVATION_PARTIALLY_CONFIRMED'"
        )
        .await,
        1
    );

    // Concurrent partial calls for more than is held together: the reservation's lock
    // serialises them, and exactly one is refused.
    let calls = (0..2).map(|i| {
        let mut client = app.client.clone();
        let request = confirm_part(&id, &format!("race-{i}"), &[("MUG", 2)]);
        async move { client.confirm_reservation(request).await }
    });
    let results = join_all(calls).await;
    let refused: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert_eq!(refused.len(), 1, "{results:?}");
    assert_eq!(error_reason(refused[0]), "NOT_HELD");
    assert_eq!(app.level("MUG").await, (6, 1));
    assert_levels_match_holds(&app).await;
}

#[tokio::test]
async fn lines_not_held_are_refused_by_name_and_change_nothing() {
    let mut app = spawn_app().await;
    stock(&app, "MUG", 10).await;
    stock(&app, "CAP", 10).await;
    stock(&app, "HAT", 10).await;
    let id = app
        .hold("order", &[("MUG", 2), ("CAP", 1)])
        .await
        .reservation_id;
    let before = app.row_counts().await;

    let refused = app
        .client
        .release_reservation(release_part(
            &id,
            "r1",
            &[("MUG", 3), ("CAP", 1), ("HAT", 1)],
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(error_reason(&refused), "NOT_HELD");
    let violations: Vec<(String, String)> = refused
        .get_details_precondition_failure()
        .expect("PreconditionFailure details")
        .violations
        .into_iter()
        .map(|v| (v.subject, v.description))
        .collect();
    assert_eq!(
        violations,
        [
            (
                "lines[0]".to_string(),
                "asks for 3 units of MUG; 2 held".to_string()
            ),
            (
                "lines[2]".to_string(),
                "HAT is not a line of the reservation".to_string()
            ),
        ]
    );
    assert_eq!(app.row_counts().await, before, "nothing was written");
    assert_eq!(app.level("MUG").await, (10, 2));

    // The refusal did not use the key up: corrected, the call goes through.
    let fixed = app
        .client
        .release_reservation(release_part(&id, "r1", &[("MUG", 2)]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        counts(&fixed),
        [line("CAP", 1, 1, 0, 0), line("MUG", 2, 0, 0, 2)]
    );

    // Lines on a reservation that holds nothing any more: its state, not the lines.
    app.client
        .release_reservation(release_part(&id, "", &[]))
        .await
        .unwrap();
    let late = app
        .client
        .confirm_reservation(confirm_part(&id, "c1", &[("CAP", 1)]))
        .await
        .unwrap_err();
    assert_eq!(error_reason(&late), "INVALID_RESERVATION_STATE");
}

#[tokio::test]
async fn releasing_the_rest_of_a_partly_confirmed_hold_leaves_it_confirmed_and_repeats_change_nothing()
 {
    let mut app = spawn_app().await;
    stock(&app, "MUG", 10).await;
    let id = app.hold("order", &[("MUG", 4)]).await.reservation_id;
    app.client
        .confirm_reservation(confirm_part(&id, "ship-1", &[("MUG", 1)]))
        .await
        .unwrap();
    let rest = app
        .client
        .release_reservation(release_part(&id, "", &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rest.state(), ReservationState::Confirmed);
    assert_eq!(counts(&rest), [line("MUG", 4, 0, 1, 3)]);
    assert_eq!(app.level("MUG").await, (9, 0));
    // Retried without a key, the release answers the reservation unchanged; a whole confirm
    // is refused (three of its units went back to stock), and changes nothing either.
    for _ in 0..2 {
        let again = app
            .client
            .release_reservation(release_part(&id, "", &[]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(again, rest);
        let refused = app
            .client
            .confirm_reservation(confirm_part(&id, "", &[]))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition);
        assert_eq!(error_reason(&refused), "PARTLY_RELEASED");
    }
    assert_eq!(app.level("MUG").await, (9, 0));
    let (kind, state): (String, String) = {
        let row = app
            .db
            .query_one(
                "SELECT event_type, payload->>'state' FROM outbox ORDER BY sequence DESC LIMIT 1",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(
        (kind.as_str(), state.as_str()),
        ("RESERVATION_RELEASED", "CONFIRMED")
    );

    // A reservation confirmed in one step writes no line counts and reads by its state.
    let whole = app.hold("whole", &[("MUG", 2)]).await.reservation_id;
    let confirmed = app
        .client
        .confirm_reservation(confirm_part(&whole, "", &[]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(counts(&confirmed), [line("MUG", 2, 0, 2, 0)]);
    assert_eq!(app.reservation(&whole).await, confirmed);
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM reservation_lines
             WHERE reservation_id = '{whole}' AND confirmed = 0 AND released = 0"
        ))
        .await,
        1
    );
    assert_levels_match_holds(&app).await;
}

/// A checkout that reads only the status code must never hear OK for units that went back
/// to stock: a whole confirm of a reservation confirmed in part, whose rest expired, is
/// refused with each line's counts. A whole confirm that did confirm every unit still
/// answers OK when repeated, with or without its key.
#[tokio::test]
async fn a_whole_confirm_after_a_partial_confirm_and_an_expiry_is_refused_with_the_counts() {
    let mut app = spawn_app().await;
    stock(&app, "MUG", 10).await;
    stock(&app, "CAP", 10).await;
    let id = app
        .hold("order", &[("MUG", 4), ("CAP", 2)])
        .await
        .reservation_id;
    app.client
        .confirm_reservation(confirm_part(&id, "ship-1", &[("MUG", 1)]))
        .await
        .unwrap();
    overdue(&app, &id).await;
    let expired = app.reservation(&id).await;
    assert_eq!(expired.state(), ReservationState::Confirmed);

    for key in ["", "confirm-all"] {
        let refused = app
            .client
            .confirm_reservation(confirm_part(&id, key, &[]))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        assert_eq!(error_reason(&refused), "PARTLY_RELEASED");
        let details = refused.get_error_details();
        let info = details.error_info().expect("ErrorInfo");
        assert_eq!(info.metadata["reservation_id"], id);
        assert_eq!(info.metadata["confirmed"], "1");
        assert_eq!(info.metadata["released"], "5");
        let lines: Vec<(String, String)> = details
            .precondition_failure()
            .expect("PreconditionFailure")
            .violations
            .iter()
            .map(|v| (v.subject.clone(), v.description.clone()))
            .collect();
        assert_eq!(
            lines,
            [
                (
                    "CAP".into(),
                    "2 reserved: 0 confirmed, 2 went back to stock".into()
                ),
                (
                    "MUG".into(),
                    "4 reserved: 1 confirmed, 3 went back to stock".into()
                ),
            ]
        );
    }
    assert_eq!(app.reservation(&id).await, expired, "nothing changed");
    // The refusal was not stored: the key is still free for another request.
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE key = 'confirm-all'")
            .await,
        0
    );

    // Confirmed whole, a reservation answers a whole confirm as it is, however often, and
    // so does the key of the call that confirmed it.
    let whole = app.hold("whole", &[("MUG", 2)]).await.reservation_id;
    let confirmed = app
        .client
        .confirm_reservation(confirm_part(&whole, "all-of-it", &[]))
        .await
        .unwrap()
        .into_inner();
    for key in ["", "all-of-it"] {
        let again = app
            .client
            .confirm_reservation(confirm_part(&whole, key, &[]))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(again, confirmed);
    }
    assert_levels_match_holds(&app).await;
}

#[tokio::test]
async fn a_cancel_releases_only_what_is_still_held() {
    let mut app = spawn_app().await;
    stock(&app, "MUG", 10).await;
    stock(&app, "CAP", 10).await;
    let id = app
        .hold("order", &[("MUG", 3), ("CAP", 2)])
        .await
        .reservation_id;
    app.client
        .confirm_reservation(confirm_part(&id, "ship-1", &[("MUG", 3), ("CAP", 1)]))
        .await
        .unwrap();
    let cancelled = app
        .client
        .cancel_order(CancelOrderRequest {
            order_id: "order-order".into(),
            idempotency_key: "cancel".into(),
            reason: "rest not wanted".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cancelled.reservations.len(), 1);
    let after = &cancelled.reservations[0];
    assert_eq!(after.state(), ReservationState::Confirmed);
    assert_eq!(
        counts(after),
        [line("CAP", 2, 0, 1, 1), line("MUG", 3, 0, 3, 0)]
    );
    assert_eq!(app.level("MUG").await, (7, 0));
    assert_eq!(app.level("CAP").await, (9, 0));
    assert_eq!(&app.reservation(&id).await, after);
    assert_levels_match_holds(&app).await;
}
