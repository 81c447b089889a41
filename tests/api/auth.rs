//! Authentication and roles: every boundary refused and changing nothing, keys per caller.

use inventory_server::{
    auth::{Authenticator, digest_hex},
    proto::{
        CancelOrderRequest, ExtendReservationRequest, ListReservationsRequest,
        ListStockMovementsRequest, WatchEventsRequest,
        inventory_service_client::InventoryServiceClient,
    },
};
use tonic::{Code, Request, Status, transport::Channel};

use crate::helpers::{
    TestApp, adjust, confirm, fresh_database, get_reservation, get_stock, release, reserve,
    set_stock, spawn_app_with, test_settings, with_token,
};

const READER: &str = "reader-token";
const RESERVER: &str = "reserver-token";
const OTHER_RESERVER: &str = "other-reserver-token";
const WATCHER: &str = "watcher-token";
const ADMIN: &str = "admin-token";

async fn spawn_secured_app() -> TestApp {
    let mut settings = test_settings(fresh_database().await);
    let credentials = format!(
        "dashboard reader token-sha256:{}\n\
         order-service reserver token-sha256:{}\n\
         other-shop reserver token-sha256:{}\n\
         fulfilment watcher token-sha256:{}\n\
         ops admin token-sha256:{}\n",
        digest_hex(READER.as_bytes()),
        digest_hex(RESERVER.as_bytes()),
        digest_hex(OTHER_RESERVER.as_bytes()),
        digest_hex(WATCHER.as_bytes()),
        digest_hex(ADMIN.as_bytes()),
    );
    settings.auth.authenticator = Authenticator::parse(&credentials).unwrap();
    spawn_app_with(settings).await
}

/// Every RPC, made with `token`; the codes it got, in a fixed order.
async fn codes(
    client: &mut InventoryServiceClient<Channel>,
    token: Option<&str>,
    reservation: &str,
) -> Vec<Code> {
    let code = |result: Result<(), Status>| match result {
        Ok(()) => Code::Ok,
        // Reaching the service and being refused for the data is not an auth failure.
        Err(status) if matches!(status.code(), Code::NotFound | Code::FailedPrecondition) => {
            Code::Ok
        }
        Err(status) => status.code(),
    };
    let adjust = client
        .adjust_stock(with_token(
            adjust("SKU-1", 1, &format!("adjust-{}", uuid::Uuid::new_v4())),
            token,
        ))
        .await
        .map(|_| ());
    let get_stock = client
        .get_stock(with_token(get_stock(&["SKU-1"]), token))
        .await
        .map(|_| ());
    let reserve_call = client
        .reserve(with_token(
            reserve(&format!("r-{}", uuid::Uuid::new_v4()), &[("SKU-1", 1)]),
            token,
        ))
        .await
        .map(|_| ());
    let get = client
        .get_reservation(with_token(get_reservation(reservation), token))
        .await
        .map(|_| ());
    let extend = client
        .extend_reservation(with_token(
            ExtendReservationRequest {
                reservation_id: reservation.into(),
                ttl: Some(prost_types::Duration {
                    seconds: 600,
                    nanos: 0,
                }),
            },
            token,
        ))
        .await
        .map(|_| ());
    let release = client
        .release_reservation(with_token(release(reservation), token))
        .await
        .map(|_| ());
    let confirm = client
        .confirm_reservation(with_token(confirm(reservation), token))
        .await
        .map(|_| ());
    let list = client
        .list_reservations(with_token(ListReservationsRequest::default(), token))
        .await
        .map(|_| ());
    let cancel = client
        .cancel_order(with_token(
            CancelOrderRequest {
                order_id: "codes-order".into(),
                idempotency_key: format!("cancel-{}", uuid::Uuid::new_v4()),
                reason: String::new(),
            },
            token,
        ))
        .await
        .map(|_| ());
    let watch = client
        .watch_events(with_token(
            WatchEventsRequest {
                after_sequence: 0,
                ..Default::default()
            },
            token,
        ))
        .await
        .map(|_| ());
    let set = client
        .set_stock(with_token(
            set_stock("SKU-1", 100, None, &format!("set-{}", uuid::Uuid::new_v4())),
            token,
        ))
        .await
        .map(|_| ());
    let movements = client
        .list_stock_movements(with_token(
            ListStockMovementsRequest {
                sku: "SKU-1".into(),
                ..Default::default()
            },
            token,
        ))
        .await
        .map(|_| ());
    [
        adjust,
        get_stock,
        reserve_call,
        get,
        extend,
        release,
        confirm,
        list,
        cancel,
        watch,
        set,
        movements,
    ]
    .into_iter()
    .map(code)
    .collect()
}

#[tokio::test]
async fn each_role_may_make_exactly_its_calls_and_refusals_change_nothing() {
    let mut app = spawn_secured_app().await;
    app.client
        .adjust_stock(with_token(adjust("SKU-1", 100, "seed"), Some(ADMIN)))
        .await
        .unwrap();
    let held = app
        .client
        .reserve(with_token(reserve("held", &[("SKU-1", 1)]), Some(RESERVER)))
        .await
        .unwrap()
        .into_inner();
    let id = held.reservation_id;
    use Code::{Ok as Allowed, PermissionDenied as Denied, Unauthenticated as NoAuth};

    let before = app.row_counts().await;
    let mut client = app.client.clone();
    assert_eq!(codes(&mut client, None, &id).await, [NoAuth; 12]);
    assert_eq!(
        codes(&mut client, Some("wrong-token"), &id).await,
        [NoAuth; 12]
    );
    // The event stream shows every caller's orders: only watcher and admin may follow it.
    assert_eq!(
        codes(&mut client, Some(READER), &id).await,
        [
            Denied, Allowed, Denied, Allowed, Denied, Denied, Denied, Allowed, Denied, Denied,
            Denied, Denied
        ]
    );
    assert_eq!(
        codes(&mut client, Some(WATCHER), &id).await,
        [
            Denied, Allowed, Denied, Allowed, Denied, Denied, Denied, Allowed, Denied, Allowed,
            Denied, Allowed
        ]
    );
    assert_eq!(
        app.row_counts().await,
        before,
        "refused calls changed nothing"
    );

    assert_eq!(
        codes(&mut client, Some(RESERVER), &id).await,
        [
            Denied, Allowed, Allowed, Allowed, Allowed, Allowed, Allowed, Allowed, Allowed, Denied,
            Denied, Denied
        ]
    );
    assert_eq!(codes(&mut client, Some(ADMIN), &id).await, [Allowed; 12]);
}

/// The status a caller gets for `id`, with the id itself masked, so a stranger's
/// reservation and a missing one can be compared word for word.
fn masked(result: Result<tonic::Response<impl Sized>, Status>, id: &str) -> (Code, String) {
    let status = result.map(|_| ()).unwrap_err();
    (status.code(), status.message().replace(id, "<id>"))
}

#[tokio::test]
async fn another_callers_reservation_is_not_found_and_untouched_until_admin_releases_it() {
    let app = spawn_secured_app().await;
    let mut client = app.client.clone();
    client
        .adjust_stock(with_token(adjust("LAST-ONE", 1, "seed"), Some(ADMIN)))
        .await
        .unwrap();
    let hold = client
        .reserve(with_token(
            reserve("a-1", &[("LAST-ONE", 1)]),
            Some(RESERVER),
        ))
        .await
        .unwrap()
        .into_inner();
    let id = hold.reservation_id.clone();
    let missing = uuid::Uuid::new_v4().to_string();
    let before = app.row_counts().await;

    // Listing the order shows B nothing, the owner and the admin its reservation.
    let order = ListReservationsRequest {
        order_id: hold.order_id.clone(),
        ..ListReservationsRequest::default()
    };
    for (token, expected) in [(OTHER_RESERVER, 0), (READER, 0), (RESERVER, 1), (ADMIN, 1)] {
        let listed = client
            .list_reservations(with_token(order.clone(), Some(token)))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(listed.reservations.len(), expected, "{token}");
    }

    // B, another reserver, tries everything on A's hold: each answer is the one a missing id
    // gets, word for word, so B cannot even learn that it exists.
    for token in [OTHER_RESERVER, READER] {
        for target in [&id, &missing] {
            let get = get_reservation(target);
            let answer = masked(
                client.get_reservation(with_token(get, Some(token))).await,
                target,
            );
            assert_eq!(answer.0, Code::NotFound, "{token} get: {answer:?}");
            if target == &missing {
                continue;
            }
            let expected = masked(
                client
                    .get_reservation(with_token(get_reservation(&missing), Some(token)))
                    .await,
                &missing,
            );
            assert_eq!(answer, expected);
        }
    }
    for target in [&id, &missing] {
        let release = client
            .release_reservation(with_token(release(target), Some(OTHER_RESERVER)))
            .await;
        let confirm = client
            .confirm_reservation(with_token(confirm(target), Some(OTHER_RESERVER)))
            .await;
        let extend = client
            .extend_reservation(with_token(
                ExtendReservationRequest {
                    reservation_id: target.clone(),
                    ttl: Some(prost_types::Duration {
                        seconds: 600,
                        nanos: 0,
                    }),
                },
                Some(OTHER_RESERVER),
            ))
            .await;
        assert_eq!(masked(release, target).0, Code::NotFound);
        assert_eq!(masked(confirm, target).0, Code::NotFound);
        assert_eq!(masked(extend, target).0, Code::NotFound);
    }
    assert_eq!(
        masked(
            client
                .release_reservation(with_token(release(&id), Some(OTHER_RESERVER),))
                .await,
            &id
        ),
        masked(
            client
                .release_reservation(with_token(release(&missing), Some(OTHER_RESERVER),))
                .await,
            &missing
        ),
    );
    assert_eq!(
        app.row_counts().await,
        before,
        "nothing B did changed a row"
    );
    // The unit is still A's: B cannot take it.
    let taken = client
        .reserve(with_token(
            reserve("b-1", &[("LAST-ONE", 1)]),
            Some(OTHER_RESERVER),
        ))
        .await
        .unwrap_err();
    assert_eq!(taken.code(), Code::FailedPrecondition);
    assert_eq!(app.level("LAST-ONE").await, (1, 1));

    // A watcher follows every order, so it may read A's hold, but not change it.
    let seen = client
        .get_reservation(with_token(get_reservation(&id), Some(WATCHER)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(seen.order_id, hold.order_id);

    // An operator may act on any reservation.
    let released = client
        .release_reservation(with_token(release(&id), Some(ADMIN)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        released.state,
        inventory_server::proto::ReservationState::Released as i32
    );
    assert_eq!(app.level("LAST-ONE").await, (1, 0));
    let own = client
        .get_reservation(with_token(get_reservation(&id), Some(RESERVER)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(own.state, released.state, "A sees what the operator did");
}

#[tokio::test]
async fn a_malformed_authorization_header_is_unauthenticated_and_not_echoed() {
    let app = spawn_secured_app().await;
    let mut request = Request::new(get_stock(&["SKU-1"]));
    request
        .metadata_mut()
        .insert("authorization", "Basic c2VjcmV0LXZhbHVl".parse().unwrap());
    let status = app.client.clone().get_stock(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert!(!status.message().contains("c2VjcmV0LXZhbHVl"), "{status:?}");
}

#[tokio::test]
async fn idempotency_keys_are_scoped_to_the_caller() {
    let mut app = spawn_secured_app().await;
    app.client
        .adjust_stock(with_token(adjust("SKU-1", 10, "seed"), Some(ADMIN)))
        .await
        .unwrap();
    // Two clients pick the same key for different requests: neither sees the other's.
    let mine = app
        .client
        .reserve(with_token(
            reserve("shared-key", &[("SKU-1", 1)]),
            Some(RESERVER),
        ))
        .await
        .unwrap()
        .into_inner();
    let theirs = app
        .client
        .reserve(with_token(
            reserve("shared-key", &[("SKU-1", 3)]),
            Some(OTHER_RESERVER),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_ne!(mine.reservation_id, theirs.reservation_id);
    let replay = app
        .client
        .reserve(with_token(
            reserve("shared-key", &[("SKU-1", 1)]),
            Some(RESERVER),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay.reservation_id, mine.reservation_id);
    assert_eq!(app.level("SKU-1").await, (10, 4));
    let callers: Vec<String> = app
        .db
        .query(
            "SELECT caller FROM idempotency_keys WHERE key = 'shared-key' ORDER BY caller",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(callers, ["order-service", "other-shop"]);
}

#[test]
fn the_server_refuses_to_start_without_credentials_unless_told_to() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_inventory-server"))
        .arg("serve")
        .env_clear()
        .env("DATABASE_URL", "postgres://127.0.0.1:1/none")
        .env("REDIS_URL", "redis://127.0.0.1:1")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("AUTH_TOKENS_FILE") && stderr.contains("AUTH_DISABLED"),
        "{stderr}"
    );
}

#[test]
fn hash_token_prints_the_credential_for_the_file() {
    use std::io::Write as _;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_inventory-server"))
        .arg("hash-token")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"s3cret\n").unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success());
    assert_eq!(
        String::from_utf8(output.stdout).unwrap().trim(),
        format!("token-sha256:{}", digest_hex(b"s3cret"))
    );
}

#[test]
fn bearer_tokens_never_travel_in_the_clear_unless_told_to() {
    use clap::Parser as _;
    use inventory_server::config::{Cli, Command, Settings};
    let dir = std::env::temp_dir().join(format!("inventory-plain-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens");
    std::fs::write(
        &tokens,
        format!("ops admin token-sha256:{}\n", digest_hex(b"t")),
    )
    .unwrap();
    let settings = |extra: &[&str]| {
        let mut args = vec![
            "inventory-server",
            "serve",
            "--database-url",
            "postgres://127.0.0.1:1/none",
            "--redis-url",
            "redis://127.0.0.1:1",
            "--auth-tokens-file",
            tokens.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let Command::Serve(serve) = Cli::try_parse_from(args).unwrap().command else {
            panic!("serve")
        };
        Settings::from_args(&serve)
    };
    let refused = settings(&["--listen-addr", "0.0.0.0:50051"]).unwrap_err();
    let message = refused.to_string();
    assert!(
        message.contains("in the clear") && message.contains("ALLOW_PLAINTEXT_TOKENS"),
        "{message}"
    );
    // Loopback never leaves the machine; a mesh sidecar terminating TLS is an explicit choice.
    assert!(settings(&["--listen-addr", "127.0.0.1:50051"]).is_ok());
    assert!(settings(&["--listen-addr", "[::1]:50051"]).is_ok());
    assert!(settings(&["--listen-addr", "0.0.0.0:50051", "--allow-plaintext-tokens"]).is_ok());
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn a_cancel_stops_only_the_cancelling_callers_order_unless_the_admin_cancels() {
    let app = spawn_secured_app().await;
    let mut client = app.client.clone();
    client
        .adjust_stock(with_token(adjust("SKU-1", 10, "seed"), Some(ADMIN)))
        .await
        .unwrap();
    let mut request = reserve("a-1", &[("SKU-1", 2)]);
    request.order_id = "shared-id".into();
    let held = client
        .reserve(with_token(request, Some(RESERVER)))
        .await
        .unwrap()
        .into_inner();
    let cancel = |key: &str| CancelOrderRequest {
        order_id: "shared-id".into(),
        idempotency_key: key.into(),
        reason: String::new(),
    };

    // B's order of the same id is B's: A's hold and A's next Reserve are untouched.
    let answer = client
        .cancel_order(with_token(cancel("b-cancel"), Some(OTHER_RESERVER)))
        .await
        .unwrap()
        .into_inner();
    assert!(answer.reservations.is_empty());
    let mut again = reserve("a-2", &[("SKU-1", 1)]);
    again.order_id = "shared-id".into();
    client
        .reserve(with_token(again, Some(RESERVER)))
        .await
        .unwrap();
    assert_eq!(app.level("SKU-1").await, (10, 3));

    // The admin's cancel reaches every caller's order of that id, including a first Reserve
    // still in flight for a caller who has none committed yet.
    let mut paused = app
        .pauses
        .arm(inventory_core::pause::PausePoint::LeaseGranted);
    let mut other = client.clone();
    let in_flight = tokio::spawn(async move {
        let mut request = reserve("b-1", &[("SKU-1", 1)]);
        request.order_id = "shared-id".into();
        other
            .reserve(with_token(request, Some(OTHER_RESERVER)))
            .await
    });
    paused.reached().await;
    let answer = client
        .cancel_order(with_token(cancel("admin-cancel"), Some(ADMIN)))
        .await
        .unwrap()
        .into_inner();
    paused.resume();
    assert_eq!(answer.reservations.len(), 2, "A's two holds");
    assert!(
        answer
            .reservations
            .iter()
            .all(|r| r.state() == inventory_server::proto::ReservationState::Released)
    );
    let refused = in_flight.await.unwrap().unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition);
    assert_eq!(crate::helpers::error_reason(&refused), "ORDER_CANCELLED");
    let mut late = reserve("a-3", &[("SKU-1", 1)]);
    late.order_id = "shared-id".into();
    let refused = client
        .reserve(with_token(late, Some(RESERVER)))
        .await
        .unwrap_err();
    assert_eq!(crate::helpers::error_reason(&refused), "ORDER_CANCELLED");
    assert_eq!(app.level("SKU-1").await, (10, 0));
    assert_eq!(
        held.state(),
        inventory_server::proto::ReservationState::Held
    );
}

/// A watcher uses subscriptions, but the event relay's own (`relay.*`, whose position decides
/// what retention may remove before the relay published it) only an admin may touch.
#[tokio::test]
async fn the_relays_subscriptions_are_an_admins_alone() {
    use inventory_server::proto::{
        AckEventsRequest, CreateSubscriptionRequest, DeleteSubscriptionRequest,
    };
    let app = spawn_secured_app().await;
    let mut client = app.client.clone();
    let create = |name: &str| CreateSubscriptionRequest {
        name: name.into(),
        ..Default::default()
    };
    client
        .create_subscription(with_token(create("fulfilment"), Some(WATCHER)))
        .await
        .unwrap();
    for denied in [
        client
            .create_subscription(with_token(create("relay.jetstream"), Some(WATCHER)))
            .await
            .map(drop),
        client
            .ack_events(with_token(
                AckEventsRequest {
                    subscription: "relay.jetstream".into(),
                    ..Default::default()
                },
                Some(WATCHER),
            ))
            .await
            .map(drop),
        client
            .delete_subscription(with_token(
                DeleteSubscriptionRequest {
                    name: "relay.jetstream".into(),
                    allow_missing: true,
                },
                Some(WATCHER),
            ))
            .await
            .map(drop),
        client
            .watch_events(with_token(
                WatchEventsRequest {
                    subscription: "relay.jetstream".into(),
                    ..Default::default()
                },
                Some(WATCHER),
            ))
            .await
            .map(drop),
    ] {
        assert_eq!(denied.unwrap_err().code(), Code::PermissionDenied);
    }
    assert_eq!(
        app.count("SELECT count(*) FROM event_subscriptions WHERE name LIKE 'relay.%'")
            .await,
        0
    );
    client
        .create_subscription(with_token(create("relay.jetstream"), Some(ADMIN)))
        .await
        .unwrap();
}
