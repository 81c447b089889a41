//! Tenants: one deployment serving several brands, each blind to the others.
//!
//! The matrix test makes every RPC as tenant B's callers on tenant A's objects, and again on
//! objects that exist nowhere: the answers must be the same (up to the name asked about), and
//! A's data must be exactly as it was.

use std::time::Duration;

use inventory_core::domain::Tenant;
use inventory_postgres::{PgConfig, Schema};
use inventory_server::{
    auth::{Authenticator, TENANT_HEADER, digest_hex},
    proto::{
        BatchSetStockRequest, CancelOrderRequest, ExtendReservationRequest, ListLocationsRequest,
        ListReservationsRequest, ListStockMovementsRequest, TransferStockRequest,
        UpsertLocationRequest, WatchEventsRequest, event,
        inventory_service_client::InventoryServiceClient,
    },
    tenants::{TenantLimits, TenantSettings},
};
use tonic::{Code, transport::Channel};

use crate::helpers::{
    TestApp, adjust, confirm, error_reason, fresh_database, get_reservation, get_stock, release,
    reserve, restock, set_stock, spawn_app_with, test_settings, with_token,
};

const A_ADMIN: &str = "a-admin-token";
const A_SHOP: &str = "a-shop-token";
const A_SHOP_2: &str = "a-shop-2-token";
const B_ADMIN: &str = "b-admin-token";
const B_SHOP: &str = "b-shop-token";
const OPERATOR: &str = "operator-token";
const ELSEWHERE: &str = "elsewhere-token";

/// Creates and migrates the schema of each tenant but `default` (whose schema, `public`,
/// the template has already).
pub async fn migrate_tenants(database: &PgConfig, tenants: &[&str]) {
    for name in tenants {
        let schema = Schema::of_tenant(&Tenant::parse(name).unwrap());
        inventory_postgres::migrate::run(&database.clone().in_schema(schema))
            .await
            .expect("migrate the tenant's schema");
    }
}

fn credentials() -> String {
    let line = |name: &str, role: &str, token: &str, options: &str| {
        format!(
            "{name} {role} token-sha256:{} {options}\n",
            digest_hex(token.as_bytes())
        )
    };
    [
        line("a-admin", "admin", A_ADMIN, "tenant=brand_a"),
        line("a-shop", "reserver", A_SHOP, "tenant=brand_a"),
        line("a-shop-2", "reserver", A_SHOP_2, "tenant=brand_a"),
        line("b-admin", "admin", B_ADMIN, "tenant=brand_b"),
        line("b-shop", "reserver", B_SHOP, "tenant=brand_b"),
        line("support", "operator", OPERATOR, ""),
        line("stray", "admin", ELSEWHERE, "tenant=brand_z"),
    ]
    .concat()
}

/// Settings serving `default`, brand_a and brand_b (their schemas migrated) to the callers
/// of [`credentials`].
async fn tenant_settings(
    database: PgConfig,
    limits: TenantLimits,
) -> inventory_server::config::Settings {
    migrate_tenants(&database, &["brand_a", "brand_b"]).await;
    let mut settings = test_settings(database);
    settings.auth.authenticator = Authenticator::parse(&credentials()).unwrap();
    settings.tenants = TenantSettings::parse("default,brand_a,brand_b", limits).unwrap();
    settings
}

async fn spawn_tenants(limits: TenantLimits) -> TestApp {
    spawn_app_with(tenant_settings(fresh_database().await, limits).await).await
}

/// Sets `sku` to `units` in the tenant of each admin token.
async fn stock_in(app: &TestApp, sku: &str, units: i64, admins: &[&str]) {
    for token in admins {
        app.client
            .clone()
            .set_stock(with_token(
                set_stock(sku, units, None, &fresh("set")),
                Some(token),
            ))
            .await
            .unwrap();
    }
}

type HeldCall = tokio::task::JoinHandle<
    Result<tonic::Response<inventory_server::proto::Reservation>, tonic::Status>,
>;

/// A `Reserve` of one unit of `sku` by `token`, held right after its lease was granted.
async fn hold_after_lease(
    app: &TestApp,
    token: &'static str,
    sku: &'static str,
) -> (inventory_core::pause::Held, HeldCall) {
    let mut held = app
        .pauses
        .arm(inventory_core::pause::PausePoint::LeaseGranted);
    let mut client = app.client.clone();
    let call = tokio::spawn(async move {
        client
            .reserve(with_token(
                reserve(&fresh("held"), &[(sku, 1)]),
                Some(token),
            ))
            .await
    });
    held.reached().await;
    (held, call)
}

/// What a call answered, with `name` (the object asked about) replaced, so an answer about
/// A's object and one about a missing object compare equal when they say the same thing.
/// Successful writes are compared by code alone (they carry fresh ids and times).
fn seen<T: std::fmt::Debug>(
    result: Result<tonic::Response<T>, tonic::Status>,
    name: &str,
    compare_body: bool,
) -> String {
    match result {
        Ok(response) if compare_body => {
            format!("OK {:?}", response.into_inner()).replace(name, "<name>")
        }
        Ok(_) => "OK".to_owned(),
        Err(status) => {
            let reason = tonic_types::StatusExt::get_details_error_info(&status)
                .map(|info| info.reason)
                .unwrap_or_default();
            format!("{:?} {} {reason}", status.code(), status.message()).replace(name, "<name>")
        }
    }
}

fn fresh(kind: &str) -> String {
    format!("{kind}-{}", uuid::Uuid::new_v4().simple())
}

/// Every RPC as `token` (a caller of tenant B) about `sku`, `location`, `reservation` and
/// `order`: what each answered, by RPC name.
async fn every_rpc(
    client: &mut InventoryServiceClient<Channel>,
    token: &str,
    sku: &str,
    location: &str,
    reservation: &str,
    order: &str,
) -> Vec<(&'static str, String)> {
    let t = Some(token);
    let mut seen_all = Vec::new();
    let r = client.get_stock(with_token(get_stock(&[sku]), t)).await;
    seen_all.push(("GetStock", seen(r, sku, true)));
    let r = client
        .adjust_stock(with_token(adjust(sku, -1, &fresh("adj")), t))
        .await;
    seen_all.push(("AdjustStock", seen(r, sku, false)));
    // Conditional on a version A's SKU has: B has no such SKU.
    let r = client
        .set_stock(with_token(set_stock(sku, 1, Some(1), &fresh("set")), t))
        .await;
    seen_all.push(("SetStock", seen(r, sku, false)));
    let r = client
        .batch_set_stock(with_token(
            BatchSetStockRequest {
                requests: vec![set_stock(sku, 1, Some(1), "")],
                idempotency_key: fresh("batch"),
            },
            t,
        ))
        .await;
    seen_all.push(("BatchSetStock", seen(r, sku, false)));
    let r = client
        .list_stock_movements(with_token(
            ListStockMovementsRequest {
                sku: sku.into(),
                ..Default::default()
            },
            t,
        ))
        .await;
    seen_all.push(("ListStockMovements", seen(r, sku, true)));
    let r = client
        .transfer_stock(with_token(
            TransferStockRequest {
                sku: sku.into(),
                from_location_id: location.into(),
                to_location_id: "default".into(),
                quantity: 1,
                idempotency_key: fresh("move"),
                reason: String::new(),
            },
            t,
        ))
        .await;
    seen_all.push((
        "TransferStock",
        seen(r, sku, false).replace(location, "<location>"),
    ));
    let r = client
        .reserve(with_token(reserve(&fresh("r"), &[(sku, 1)]), t))
        .await;
    seen_all.push(("Reserve", seen(r, sku, false)));
    let r = client
        .get_reservation(with_token(get_reservation(reservation), t))
        .await;
    seen_all.push(("GetReservation", seen(r, reservation, true)));
    let r = client
        .extend_reservation(with_token(
            ExtendReservationRequest {
                reservation_id: reservation.into(),
                ttl: Some(prost_types::Duration {
                    seconds: 600,
                    nanos: 0,
                }),
            },
            t,
        ))
        .await;
    seen_all.push(("ExtendReservation", seen(r, reservation, true)));
    let r = client
        .confirm_reservation(with_token(confirm(reservation), t))
        .await;
    seen_all.push(("ConfirmReservation", seen(r, reservation, true)));
    let r = client
        .release_reservation(with_token(release(reservation), t))
        .await;
    seen_all.push(("ReleaseReservation", seen(r, reservation, true)));
    for (rpc, request) in [
        (
            "ListReservations(order)",
            ListReservationsRequest {
                order_id: order.into(),
                ..Default::default()
            },
        ),
        (
            "ListReservations(sku)",
            ListReservationsRequest {
                sku: sku.into(),
                ..Default::default()
            },
        ),
    ] {
        let r = client.list_reservations(with_token(request, t)).await;
        seen_all.push((rpc, seen(r, order, true).replace(sku, "<name>")));
    }
    let r = client
        .cancel_order(with_token(
            CancelOrderRequest {
                order_id: order.into(),
                idempotency_key: fresh("cancel"),
                reason: String::new(),
            },
            t,
        ))
        .await;
    seen_all.push(("CancelOrder", seen(r, order, true)));
    // Last: B gets a location of that name, its own.
    let r = client
        .upsert_location(with_token(
            UpsertLocationRequest {
                location_id: location.into(),
                priority: 9,
                active: false,
            },
            t,
        ))
        .await;
    seen_all.push(("UpsertLocation", seen(r, location, true)));
    seen_all
}

#[tokio::test]
async fn another_tenants_objects_answer_exactly_as_missing_ones_and_stay_untouched() {
    let mut app = spawn_tenants(TenantLimits::default()).await;
    let a = Some(A_ADMIN);
    // Tenant A: a location with stock of SKU "TWIN-1", and a live hold of an order.
    app.client
        .upsert_location(with_token(
            UpsertLocationRequest {
                location_id: "wh-a".into(),
                priority: 1,
                active: true,
            },
            a,
        ))
        .await
        .unwrap();
    app.client
        .adjust_stock(with_token(restock("TWIN-1", "wh-a", 10), a))
        .await
        .unwrap();
    let mut order = reserve("a-key", &[("TWIN-1", 3)]);
    order.order_id = "order-a".into();
    let held = app
        .client
        .reserve(with_token(order, Some(A_SHOP)))
        .await
        .unwrap()
        .into_inner();
    let a_level = app
        .client
        .get_stock(with_token(get_stock(&["TWIN-1"]), a))
        .await
        .unwrap()
        .into_inner();

    // Listings in B never include A's objects.
    let locations = app
        .client
        .list_locations(with_token(ListLocationsRequest {}, Some(B_ADMIN)))
        .await
        .unwrap()
        .into_inner();
    assert!(
        locations.locations.iter().all(|l| l.location_id != "wh-a"),
        "{locations:?}"
    );

    for token in [B_ADMIN, B_SHOP] {
        let mut client = app.client.clone();
        let on_a = every_rpc(
            &mut client,
            token,
            "TWIN-1",
            "wh-a",
            &held.reservation_id,
            "order-a",
        )
        .await;
        let on_missing = every_rpc(
            &mut client,
            token,
            &fresh("NONE"),
            "wh-nowhere",
            &uuid::Uuid::new_v4().to_string(),
            &fresh("order"),
        )
        .await;
        // The missing names differ per call; compare with each call's own name replaced.
        for ((rpc, got), (_, missing)) in on_a.iter().zip(&on_missing) {
            let missing = normalise_fresh(missing);
            assert_eq!(
                normalise_fresh(got),
                missing,
                "{rpc} as {token} on tenant A's object must answer as on a missing one"
            );
        }
    }
    // A's data is exactly as it was: the hold is live, the stock unmoved.
    let after = app
        .client
        .get_stock(with_token(get_stock(&["TWIN-1"]), a))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after, a_level, "tenant B's calls changed tenant A's stock");
    let still = app
        .client
        .get_reservation(with_token(
            get_reservation(&held.reservation_id),
            Some(A_SHOP),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(still.state, held.state);
    assert_eq!(still.expires_at, held.expires_at);

    // The same SKU name sells in B on its own: B's units are B's.
    app.client
        .set_stock(with_token(
            set_stock("TWIN-1", 2, None, "b-set"),
            Some(B_ADMIN),
        ))
        .await
        .unwrap();
    app.client
        .reserve(with_token(reserve("b-key", &[("TWIN-1", 2)]), Some(B_SHOP)))
        .await
        .unwrap();
    let sold_out = app
        .client
        .reserve(with_token(
            reserve("b-key-2", &[("TWIN-1", 1)]),
            Some(B_SHOP),
        ))
        .await
        .unwrap_err();
    assert_eq!(sold_out.code(), Code::FailedPrecondition, "{sold_out:?}");
    let after = app
        .client
        .get_stock(with_token(get_stock(&["TWIN-1"]), a))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after, a_level, "selling out B's TWIN-1 moved A's");

    // The same idempotency key in two tenants is two keys.
    let replay_a = app
        .client
        .reserve(with_token(
            {
                let mut order = reserve("a-key", &[("TWIN-1", 3)]);
                order.order_id = "order-a".into();
                order
            },
            Some(A_SHOP),
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay_a.reservation_id, held.reservation_id);

    // Redis: B's keys carry its segment, A's theirs, the hash tag is the SKU.
    for tenant in ["brand_a", "brand_b"] {
        let key = format!("{}:{tenant}:{{TWIN-1}}:fence", app.key_prefix);
        let found: i64 = fred::interfaces::KeysInterface::exists(&app.redis, &key)
            .await
            .unwrap();
        assert_eq!(found, 1, "no {key}");
    }
    let unprefixed = format!("{}:{{TWIN-1}}:fence", app.key_prefix);
    let found: i64 = fred::interfaces::KeysInterface::exists(&app.redis, &unprefixed)
        .await
        .unwrap();
    assert_eq!(found, 0, "tenant default never sold TWIN-1");
    app.stop().await.unwrap();
}

/// Fresh ids (a uuid, or the 32 hex digits of a fresh name) replaced by `<id>`, so answers
/// naming different fresh keys compare equal.
fn normalise_fresh(text: &str) -> String {
    let is_hex = |c: char| c.is_ascii_hexdigit() && !c.is_ascii_uppercase();
    let mut out = String::new();
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        let parts: Vec<&str> = run.split('-').collect();
        let lengths: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        if lengths == [8, 4, 4, 4, 12] {
            out.push_str("<id>");
        } else {
            let rebuilt: Vec<&str> = parts
                .iter()
                .map(|p| if p.len() == 32 { "<id>" } else { p })
                .collect();
            out.push_str(&rebuilt.join("-"));
        }
        run.clear();
    };
    for c in text.chars() {
        if is_hex(c) || c == '-' {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

#[tokio::test]
async fn each_tenants_event_stream_is_dense_and_its_own() {
    let app = spawn_tenants(TenantLimits::default()).await;
    // Interleaved writes: A, B, A, B, A.
    for (i, token) in [A_ADMIN, B_ADMIN, A_ADMIN, B_ADMIN, A_ADMIN]
        .into_iter()
        .enumerate()
    {
        let sku = if token == A_ADMIN { "A-ONLY" } else { "B-ONLY" };
        app.client
            .clone()
            .adjust_stock(with_token(adjust(sku, 1, &format!("ev-{i}")), Some(token)))
            .await
            .unwrap();
    }
    for (token, sku, count) in [(A_ADMIN, "A-ONLY", 3), (B_ADMIN, "B-ONLY", 2)] {
        let mut stream = app
            .client
            .clone()
            .watch_events(with_token(WatchEventsRequest::default(), Some(token)))
            .await
            .unwrap()
            .into_inner();
        let mut positions = Vec::new();
        while positions.len() < count {
            let event = tokio::time::timeout(Duration::from_secs(20), stream.message())
                .await
                .expect("the tenant's events arrive")
                .unwrap()
                .unwrap();
            assert_eq!(
                event.subject,
                Some(event::Subject::Sku(sku.into())),
                "a watcher of {sku}'s tenant saw {event:?}"
            );
            positions.push(event.sequence);
        }
        let dense: Vec<i64> = (1..=count as i64).collect();
        assert_eq!(positions, dense, "{sku}'s tenant's positions");
        // Nothing of the other tenant follows.
        let next = tokio::time::timeout(Duration::from_millis(300), stream.message()).await;
        assert!(next.is_err(), "an event past the tenant's own: {next:?}");
    }
    app.stop().await.unwrap();
}

#[tokio::test]
async fn only_an_operator_chooses_a_tenant_and_a_tenant_not_served_is_refused() {
    let mut app = spawn_tenants(TenantLimits::default()).await;
    app.client
        .set_stock(with_token(
            set_stock("OPS-1", 7, None, "ops-a"),
            Some(A_ADMIN),
        ))
        .await
        .unwrap();
    let in_tenant = |token: &str, tenant: Option<&str>| {
        let mut request = with_token(get_stock(&["OPS-1"]), Some(token));
        if let Some(tenant) = tenant {
            request
                .metadata_mut()
                .insert(TENANT_HEADER, tenant.parse().unwrap());
        }
        request
    };
    // The operator reads brand_a's stock when it names brand_a, and tenant default's (where
    // OPS-1 does not exist) when it names none.
    let seen_by_operator = app
        .client
        .get_stock(in_tenant(OPERATOR, Some("brand_a")))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(seen_by_operator.levels[0].on_hand, 7);
    let in_default = app.client.get_stock(in_tenant(OPERATOR, None)).await;
    let in_b = app
        .client
        .get_stock(in_tenant(B_ADMIN, None))
        .await
        .map(|r| r.into_inner());
    assert_eq!(
        in_default.map(|r| r.into_inner()).map_err(|s| s.code()),
        in_b.map_err(|s| s.code()),
        "OPS-1 is brand_a's only"
    );
    // An admin of brand_b naming brand_a is refused, and changes nothing.
    let refused = app
        .client
        .set_stock({
            let mut request = with_token(set_stock("OPS-1", 0, None, "steal"), Some(B_ADMIN));
            request
                .metadata_mut()
                .insert(TENANT_HEADER, "brand_a".parse().unwrap());
            request
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // Naming its own tenant is fine: brand_b's answer, where OPS-1 does not exist.
    let own = app
        .client
        .get_stock(in_tenant(B_ADMIN, Some("brand_b")))
        .await
        .unwrap_err();
    assert_eq!(own.code(), Code::NotFound, "{own:?}");
    let level = app
        .client
        .get_stock(in_tenant(A_ADMIN, None))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(level.levels[0].on_hand, 7);
    // A caller of a tenant this deployment does not serve reaches nothing.
    let elsewhere = app
        .client
        .get_stock(in_tenant(ELSEWHERE, None))
        .await
        .unwrap_err();
    assert_eq!(elsewhere.code(), Code::FailedPrecondition, "{elsewhere:?}");
    assert_eq!(error_reason(&elsewhere), "TENANT_NOT_SERVED");
    let bad = app
        .client
        .get_stock(in_tenant(OPERATOR, Some("Not A Tenant")))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument, "{bad:?}");
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_tenants_callers_share_its_cap_on_holds_and_other_tenants_sell_on() {
    let mut app = spawn_tenants(TenantLimits {
        max_in_flight: None,
        caps: inventory_core::quota::HoldCaps {
            max_holds: Some(2),
            max_held_units: None,
        },
        max_subscriptions: None,
    })
    .await;
    stock_in(&app, "CAP-1", 100, &[A_ADMIN, B_ADMIN]).await;
    app.client
        .reserve(with_token(reserve("c1", &[("CAP-1", 1)]), Some(A_SHOP)))
        .await
        .unwrap();
    app.client
        .reserve(with_token(reserve("c2", &[("CAP-1", 1)]), Some(A_SHOP_2)))
        .await
        .unwrap();
    let refused = app
        .client
        .reserve(with_token(reserve("c3", &[("CAP-1", 1)]), Some(A_SHOP)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(error_reason(&refused), "TENANT_QUOTA_EXCEEDED");
    // A retry of a hold already made replays; brand_b is not held back by brand_a.
    app.client
        .reserve(with_token(reserve("c1", &[("CAP-1", 1)]), Some(A_SHOP)))
        .await
        .unwrap();
    app.client
        .reserve(with_token(reserve("b1", &[("CAP-1", 1)]), Some(B_SHOP)))
        .await
        .unwrap();
    let level = app
        .client
        .get_stock(with_token(get_stock(&["CAP-1"]), Some(A_ADMIN)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        level.levels[0].reserved, 2,
        "the refused hold reserved nothing"
    );
    app.stop().await.unwrap();
}

/// A database from before tenants: its rows are tenant `default`'s as they stand, and adding
/// tenants creates their schemas beside it.
#[tokio::test]
async fn an_existing_database_is_tenant_default_and_gains_tenants_in_place() {
    let database = fresh_database().await;
    // Written by a deployment that knows no tenants.
    let single = spawn_app_with(test_settings(database.clone())).await;
    single
        .client
        .clone()
        .set_stock(set_stock("OLD-1", 5, None, "old"))
        .await
        .unwrap();
    let old_hold = single.hold("old-key", &[("OLD-1", 2)]).await.reservation_id;
    single.stop().await.unwrap();

    migrate_tenants(&database, &["brand_a"]).await;
    let mut settings = test_settings(database);
    settings.auth.authenticator = Authenticator::parse(&credentials()).unwrap();
    settings.tenants = TenantSettings::parse("default,brand_a", TenantLimits::default()).unwrap();
    let mut app = spawn_app_with(settings).await;
    // Tenant default's callers (the operator naming none) see the old rows, brand_a none.
    let old = app
        .client
        .get_reservation(with_token(get_reservation(&old_hold), Some(OPERATOR)))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(old.reservation_id, old_hold);
    let in_a = app
        .client
        .get_reservation(with_token(get_reservation(&old_hold), Some(A_ADMIN)))
        .await
        .unwrap_err();
    assert_eq!(in_a.code(), Code::NotFound);
    let tables: i64 = app
        .db
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'tenant_brand_a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let public_tables: i64 = app
        .db
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(tables, public_tables, "brand_a's schema has every table");
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_tenants_callers_share_its_calls_in_flight_and_other_tenants_are_served() {
    let app = spawn_tenants(TenantLimits {
        max_in_flight: Some(1),
        caps: Default::default(),
        max_subscriptions: None,
    })
    .await;
    stock_in(&app, "FLY-1", 10, &[A_ADMIN, B_ADMIN]).await;
    // One call of brand_a held after its lease: brand_a's one place in flight is taken.
    let (held, call) = hold_after_lease(&app, A_SHOP, "FLY-1").await;
    let refused = app
        .client
        .clone()
        .get_stock(with_token(get_stock(&["FLY-1"]), Some(A_SHOP_2)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(error_reason(&refused), "TENANT_SATURATED");
    app.client
        .clone()
        .get_stock(with_token(get_stock(&["FLY-1"]), Some(B_SHOP)))
        .await
        .expect("another tenant is served");
    held.resume();
    call.await.unwrap().unwrap();
    app.client
        .clone()
        .get_stock(with_token(get_stock(&["FLY-1"]), Some(A_SHOP_2)))
        .await
        .expect("the place is given back when the call ends");
    app.stop().await.unwrap();
}

#[tokio::test]
async fn metrics_carry_the_tenant_and_the_access_log_marks_an_operators_calls() {
    use inventory_server::access::{AccessLogSettings, Sink};
    let mut settings = tenant_settings(fresh_database().await, TenantLimits::default()).await;
    settings.server.admin_listen_addr = Some("127.0.0.1:0".parse().unwrap());
    let (lines, received) = std::sync::mpsc::channel();
    settings.server.access_log = AccessLogSettings {
        enabled: true,
        read_sample: 1.0,
        sink: Sink::Channel(lines),
    };
    let telemetry = inventory_server::telemetry::init(
        inventory_server::config::LogFormat::Text,
        &inventory_server::telemetry::TelemetrySettings::default(),
    )
    .unwrap();
    let app = crate::helpers::spawn_app_exporting(settings, telemetry.registry().clone()).await;
    let mut client = app.client.clone();
    client
        .set_stock(with_token(
            set_stock("LOG-1", 1, None, "log"),
            Some(A_ADMIN),
        ))
        .await
        .unwrap();
    let mut as_operator = with_token(get_stock(&["LOG-1"]), Some(OPERATOR));
    as_operator
        .metadata_mut()
        .insert(TENANT_HEADER, "brand_a".parse().unwrap());
    client.get_stock(as_operator).await.unwrap();
    // A caller of a tenant not served here: the metric does not name it.
    client
        .get_stock(with_token(get_stock(&["LOG-1"]), Some(ELSEWHERE)))
        .await
        .unwrap_err();
    // Unknown credentials: no tenant known.
    client
        .get_stock(with_token(get_stock(&["LOG-1"]), Some("stolen")))
        .await
        .unwrap_err();

    let mut log = Vec::new();
    while log.len() < 4 {
        let line = received
            .recv_timeout(Duration::from_secs(20))
            .expect("an access-log line per call");
        log.push(serde_json::from_str::<serde_json::Value>(&line).unwrap());
    }
    assert_eq!(log[0]["tenant"], "brand_a", "{log:#?}");
    assert!(log[0].get("operator").is_none(), "{log:#?}");
    assert_eq!(log[1]["caller"], "support");
    assert_eq!(log[1]["tenant"], "brand_a");
    assert_eq!(log[1]["operator"], true);
    assert_eq!(log[2]["tenant"], "brand_z", "{log:#?}");
    assert!(log[3].get("tenant").is_none(), "{log:#?}");

    let page = crate::telemetry::scrape(app.admin_addr.unwrap()).await;
    let series = |tenant: &str, method: &str| {
        page.lines().any(|line| {
            line.starts_with("rpc_server_duration_milliseconds_count")
                && line.contains(&format!("tenant=\"{tenant}\""))
                && line.contains(&format!("rpc_method=\"{method}\""))
        })
    };
    assert!(series("brand_a", "SetStock"), "{page}");
    assert!(series("brand_a", "GetStock"), "{page}");
    assert!(series("_OTHER", "GetStock"), "{page}");
    assert!(!page.contains("tenant=\"brand_z\""), "{page}");
    app.stop().await.unwrap();
}

/// A hot SKU of one tenant, forwarded between replicas: the call runs in that tenant on the
/// replica holding the lease, never in the holder's default tenant.
#[tokio::test]
async fn a_forwarded_call_runs_in_its_callers_tenant_on_the_holder() {
    use inventory_core::domain::Sku;
    let database = fresh_database().await;
    let mut apps = Vec::new();
    let mut prefix = None;
    for _ in 0..2 {
        let mut settings = tenant_settings(database.clone(), TenantLimits::default()).await;
        let prefix = prefix.get_or_insert_with(|| settings.redis.client.key_prefix.clone());
        settings.redis.client.key_prefix = prefix.clone();
        settings.peer = Some(inventory_server::config::PeerSettings {
            listen_addr: "127.0.0.1:0".parse().unwrap(),
            advertise_addr: None,
            secret: b"a peer secret of at least 32 bytes, for tests"
                .to_vec()
                .into(),
        });
        apps.push(spawn_app_with(settings).await);
    }
    let (a, b) = (&apps[0], &apps[1]);
    // brand_a's HOT and tenant default's HOT (the operator naming no tenant).
    stock_in(a, "HOT", 10, &[A_ADMIN, OPERATOR]).await;
    // A holds brand_a's HOT lease, paused right after the grant.
    let (held, leader) = hold_after_lease(a, A_SHOP, "HOT").await;

    // B's call for brand_a's HOT goes to A and queues behind A's brand_a leader.
    let mut client = b.client.clone();
    let call = tokio::spawn(async move {
        client
            .reserve(with_token(reserve("via-b", &[("HOT", 2)]), Some(A_SHOP_2)))
            .await
    });
    let brand_a = Tenant::parse("brand_a").unwrap();
    let sku = Sku::parse("HOT").unwrap();
    let at_a = std::sync::Arc::clone(&a.tenants.core(&brand_a).unwrap().inventory);
    while at_a.queued(&sku) == 0 {
        assert!(!call.is_finished(), "B answered instead of forwarding to A");
        tokio::task::yield_now().await;
    }
    held.resume();
    leader.await.unwrap().unwrap();
    call.await.unwrap().expect("answered by A");
    let at_b = &b.tenants.core(&brand_a).unwrap().inventory;
    assert_eq!(
        at_b.forwards()
            .answered
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    let level = |token: &'static str| {
        let mut client = b.client.clone();
        async move {
            let level = client
                .get_stock(with_token(get_stock(&["HOT"]), Some(token)))
                .await
                .unwrap()
                .into_inner();
            (level.levels[0].on_hand, level.levels[0].reserved)
        }
    };
    assert_eq!(level(A_ADMIN).await, (10, 3), "both holds are brand_a's");
    assert_eq!(
        level(OPERATOR).await,
        (10, 0),
        "tenant default's HOT is untouched"
    );
}

/// The order locks of `Reserve` and `CancelOrder` are per tenant: brand_b cancelling an order
/// id brand_a is reserving under does not wait for brand_a's transaction.
#[tokio::test]
async fn the_same_order_id_in_two_tenants_never_waits_on_the_other() {
    use inventory_server::proto::CancelOrderRequest;
    let app = spawn_tenants(TenantLimits::default()).await;
    stock_in(&app, "ORD-1", 5, &[A_ADMIN]).await;
    // brand_a's Reserve for order-shared, held with the order's lock taken.
    let mut held = app
        .pauses
        .arm(inventory_core::pause::PausePoint::OrderChecked);
    let mut client = app.client.clone();
    let reserving = tokio::spawn(async move {
        let mut request = reserve("a-shared", &[("ORD-1", 1)]);
        request.order_id = "order-shared".into();
        client.reserve(with_token(request, Some(A_SHOP))).await
    });
    held.reached().await;
    // brand_b cancels its own order of that id while brand_a's transaction holds its lock.
    let cancelled = tokio::time::timeout(
        Duration::from_secs(20),
        app.client.clone().cancel_order(with_token(
            CancelOrderRequest {
                order_id: "order-shared".into(),
                idempotency_key: "b-cancel".into(),
                reason: String::new(),
            },
            Some(B_SHOP),
        )),
    )
    .await
    .expect("brand_b's cancel does not wait for brand_a's order lock");
    cancelled.unwrap();
    held.resume();
    // brand_a's order is not cancelled: its hold is made.
    reserving.await.unwrap().unwrap();
    app.stop().await.unwrap();
}

/// Subscriptions are a tenant's own: the same name in two tenants is two subscriptions, and
/// one tenant lists only its own.
#[tokio::test]
async fn each_tenant_has_its_own_subscriptions() {
    use inventory_server::proto::{
        CreateSubscriptionRequest, EventFilter, ListSubscriptionsRequest,
    };
    let app = spawn_tenants(TenantLimits::default()).await;
    let create = |token: &'static str, sku: &str| {
        let mut client = app.client.clone();
        let request = CreateSubscriptionRequest {
            name: "orders".into(),
            filter: Some(EventFilter {
                skus: vec![sku.into()],
                ..Default::default()
            }),
            from_oldest: false,
        };
        async move {
            client
                .create_subscription(with_token(request, Some(token)))
                .await
        }
    };
    create(A_ADMIN, "A-SKU").await.unwrap();
    // Another filter under the same name: brand_b's own subscription, not a conflict.
    create(B_ADMIN, "B-SKU").await.unwrap();
    for (token, sku) in [(A_ADMIN, "A-SKU"), (B_ADMIN, "B-SKU")] {
        let listed = app
            .client
            .clone()
            .list_subscriptions(with_token(ListSubscriptionsRequest {}, Some(token)))
            .await
            .unwrap()
            .into_inner()
            .subscriptions;
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].filter.as_ref().unwrap().skus, [sku]);
    }
    app.stop().await.unwrap();
}
