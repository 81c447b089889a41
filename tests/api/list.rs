//! `ListReservations`: filters that combine, the caller's reservations only, stable paging
//! with tokens bound to their filters, and the index that keeps listing an order cheap.

use std::collections::HashSet;

use inventory_server::proto::{
    ListReservationsRequest, ListReservationsResponse, Reservation, ReservationState,
};
use tonic::Code;

use crate::helpers::{TestApp, confirm, release, reserve, spawn_app, stock, violated_fields};

fn list(order: &str, state: ReservationState, sku: &str) -> ListReservationsRequest {
    ListReservationsRequest {
        order_id: order.into(),
        state: state.into(),
        sku: sku.into(),
        page_size: 0,
        page_token: String::new(),
    }
}

async fn page(app: &TestApp, request: ListReservationsRequest) -> ListReservationsResponse {
    app.client
        .clone()
        .list_reservations(request)
        .await
        .unwrap()
        .into_inner()
}

async fn ids(app: &TestApp, request: ListReservationsRequest) -> Vec<String> {
    let response = page(app, request).await;
    assert!(response.next_page_token.is_empty());
    response
        .reservations
        .into_iter()
        .map(|r| r.reservation_id)
        .collect()
}

async fn hold(app: &TestApp, key: &str, order: &str, lines: &[(&str, i64)]) -> Reservation {
    let mut request = reserve(key, lines);
    request.order_id = order.into();
    app.client
        .clone()
        .reserve(request)
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn filters_combine_and_states_read_as_every_reader_sees_them() {
    let app = spawn_app().await;
    stock(&app, "MUG", 100).await;
    stock(&app, "CAP", 100).await;
    let a1 = hold(&app, "a1", "order-a", &[("MUG", 1)]).await;
    let a2 = hold(&app, "a2", "order-a", &[("MUG", 1), ("CAP", 2)]).await;
    let a3 = hold(&app, "a3", "order-a", &[("CAP", 1)]).await;
    let b1 = hold(&app, "b1", "order-b", &[("MUG", 3)]).await;
    app.client
        .clone()
        .confirm_reservation(confirm(&a2.reservation_id))
        .await
        .unwrap();
    app.client
        .clone()
        .release_reservation(release(&a3.reservation_id))
        .await
        .unwrap();
    // Overdue: reads as EXPIRED whether or not the sweeper got to it.
    app.db
        .execute(
            "UPDATE reservations SET created_at = created_at - interval '1 hour', \
             expires_at = clock_timestamp() - interval '1 second' WHERE reservation_id = $1",
            &[&uuid::Uuid::parse_str(&b1.reservation_id).unwrap()],
        )
        .await
        .unwrap();
    use ReservationState::{Confirmed, Expired, Held, Released, Unspecified as Any};

    let all = page(&app, list("order-a", Any, "")).await.reservations;
    let listed: Vec<&str> = all.iter().map(|r| r.reservation_id.as_str()).collect();
    assert_eq!(
        listed,
        [&a1.reservation_id, &a2.reservation_id, &a3.reservation_id].map(String::as_str),
        "oldest first"
    );
    assert_eq!(all[1].lines.len(), 2, "each with its lines");
    assert_eq!(all[1].state(), Confirmed);
    assert_eq!(
        ids(&app, list("order-a", Held, "")).await,
        std::slice::from_ref(&a1.reservation_id)
    );
    assert_eq!(
        ids(&app, list("order-a", Released, "")).await,
        std::slice::from_ref(&a3.reservation_id)
    );
    assert_eq!(
        ids(&app, list("order-a", Any, "CAP")).await,
        [a2.reservation_id.clone(), a3.reservation_id.clone()]
    );
    assert_eq!(
        ids(&app, list("order-a", Confirmed, "CAP")).await,
        std::slice::from_ref(&a2.reservation_id)
    );
    assert!(ids(&app, list("order-a", Held, "CAP")).await.is_empty());
    assert_eq!(
        ids(&app, list("", Expired, "")).await,
        std::slice::from_ref(&b1.reservation_id)
    );
    assert_eq!(ids(&app, list("", Any, "MUG")).await.len(), 3);
    assert!(ids(&app, list("order-none", Any, "")).await.is_empty());
}

#[tokio::test]
async fn paging_sees_each_reservation_once_while_others_are_added() {
    let app = spawn_app().await;
    stock(&app, "SKU-1", 100).await;
    // 1,000 reservations of one order, written directly: the listing is under test.
    app.db
        .batch_execute(
            "INSERT INTO reservations (reservation_id, order_id, state, caller, idempotency_key, \
                                       created_at, expires_at)
             SELECT gen_random_uuid(), 'big-order', 'RELEASED', 'anonymous', 'k-' || g,
                    now() - interval '1 hour' + g * interval '1 millisecond', now() + interval '1 hour'
             FROM generate_series(1, 1000) g;
             INSERT INTO reservation_lines (reservation_id, sku, quantity, fence_token)
             SELECT reservation_id, 'SKU-1', 1, 0 FROM reservations WHERE order_id = 'big-order';",
        )
        .await
        .unwrap();
    let mut seen: Vec<String> = Vec::new();
    let mut token = String::new();
    let mut pages = 0;
    loop {
        let mut request = list("big-order", ReservationState::Unspecified, "");
        request.page_size = 37;
        request.page_token = token;
        let response = page(&app, request).await;
        assert!(response.reservations.len() <= 37);
        seen.extend(response.reservations.into_iter().map(|r| r.reservation_id));
        pages += 1;
        // Others keep arriving while the caller pages (they list after the ones before them).
        hold(&app, &format!("late-{pages}"), "big-order", &[("SKU-1", 1)]).await;
        token = response.next_page_token;
        if token.is_empty() {
            break;
        }
    }
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no reservation listed twice");
    let originals: HashSet<String> = app
        .db
        .query(
            "SELECT reservation_id::text FROM reservations WHERE idempotency_key LIKE 'k-%'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(originals.len(), 1_000);
    assert!(
        originals.iter().all(|id| unique.contains(id)),
        "every reservation that existed when paging began was listed"
    );
    assert!(pages >= 28, "{pages} pages of at most 37");
}

#[tokio::test]
async fn page_sizes_default_and_cap_and_tokens_are_bound_to_their_filters() {
    let app = spawn_app().await;
    app.db
        .batch_execute(
            "INSERT INTO reservations (reservation_id, order_id, state, caller, idempotency_key, \
                                       created_at, expires_at)
             SELECT gen_random_uuid(), 'o-' || (g % 2), 'RELEASED', 'anonymous', 'k-' || g,
                    now() - interval '1 hour' + g * interval '1 millisecond', now() + interval '1 hour'
             FROM generate_series(1, 1200) g;",
        )
        .await
        .unwrap();
    let first = page(&app, list("o-0", ReservationState::Unspecified, "")).await;
    assert_eq!(first.reservations.len(), 50, "page_size 0 means 50");
    let mut big = list("", ReservationState::Unspecified, "");
    big.page_size = 100_000;
    assert_eq!(page(&app, big).await.reservations.len(), 500, "at most 500");

    let mut other_filters = list("o-1", ReservationState::Unspecified, "");
    other_filters.page_token = first.next_page_token.clone();
    let mut forged = list("o-0", ReservationState::Unspecified, "");
    forged.page_token = "0123456789abcdef".into();
    let mut negative = list("o-0", ReservationState::Unspecified, "");
    negative.page_size = -1;
    let mut bad_state = list("o-0", ReservationState::Unspecified, "");
    bad_state.state = 42;
    let mut bad_sku = list("o-0", ReservationState::Unspecified, "no spaces");
    bad_sku.page_token = first.next_page_token.clone();
    for (request, fields) in [
        (other_filters, vec!["page_token"]),
        (forged, vec!["page_token"]),
        (negative, vec!["page_size"]),
        (bad_state, vec!["state"]),
        (bad_sku, vec!["sku"]),
    ] {
        let refused = app
            .client
            .clone()
            .list_reservations(request)
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert_eq!(violated_fields(&refused), fields);
    }
    let mut next = list("o-0", ReservationState::Unspecified, "");
    next.page_token = first.next_page_token;
    let second = page(&app, next).await;
    assert_eq!(second.reservations.len(), 50);
    assert!(
        {
            let at = |r: &Reservation| r.created_at.map(|t| (t.seconds, t.nanos));
            at(&second.reservations[0]) > at(&first.reservations[49])
        },
        "the next page follows"
    );
}

#[tokio::test]
async fn listing_an_order_uses_its_index() {
    let app = spawn_app().await;
    app.db
        .batch_execute(
            "INSERT INTO reservations (reservation_id, order_id, state, caller, idempotency_key, \
                                       created_at, expires_at)
             SELECT gen_random_uuid(), 'o-' || (g % 20000), 'RELEASED', 'anonymous', 'k-' || g,
                    now() - interval '1 hour', now() + interval '1 hour'
             FROM generate_series(1, 60000) g;
             ANALYZE reservations;",
        )
        .await
        .unwrap();
    let scans = || async {
        app.db
            .query_one(
                "SELECT coalesce(sum(idx_scan), 0)::bigint FROM pg_stat_user_indexes \
                 WHERE indexrelname = 'reservations_by_order'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    let before = scans().await;
    let listed = page(&app, list("o-7", ReservationState::Unspecified, "")).await;
    assert_eq!(listed.reservations.len(), 3);
    // Statistics reach the view when the server's session reports them: poll.
    inventory_testkit::eventually(
        "an index scan of reservations_by_order",
        std::time::Duration::from_secs(10),
        || async { scans().await > before },
    )
    .await
    .unwrap();
}
