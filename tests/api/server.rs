//! The server as operators and people see it: health, reflection, grpcurl, shutdown, outages.

use std::{process::Command, time::Duration};

use fred::prelude::KeysInterface as _;
use inventory_server::proto::{AdjustStockRequest, ReservationLine, ReserveRequest};
use tokio_stream::StreamExt as _;
use tonic::Code;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_types::StatusExt as _;

use crate::helpers::{adjust, error_reason, grpcurl, spawn_app, test_settings};

const SERVICE: &str = "inventory.v1.InventoryService";

#[tokio::test]
async fn health_reports_serving_for_the_server_and_the_service() {
    let app = spawn_app().await;
    let mut health = HealthClient::new(app.channel().await);
    for service in ["", SERVICE] {
        let response = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap();
        assert_eq!(
            response.into_inner().status(),
            ServingStatus::Serving,
            "{service:?}"
        );
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "no.such.Service".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
}

#[tokio::test]
async fn shutdown_turns_health_not_serving_then_stops() {
    let app = spawn_app().await;
    let mut health = HealthClient::new(app.channel().await);
    let mut watch = health
        .watch(HealthCheckRequest {
            service: SERVICE.into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);

    let stopped = tokio::spawn(app.stop());
    let next = watch.next().await.unwrap().unwrap();
    assert_eq!(next.status(), ServingStatus::NotServing);
    // The open Watch stream never ends by itself: the grace period cuts it off.
    tokio::time::timeout(Duration::from_secs(10), stopped)
        .await
        .expect("stops within the grace period")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn reflection_serves_both_protocol_versions() {
    use tonic_reflection::pb::{v1, v1alpha};
    let app = spawn_app().await;

    let mut client = v1::server_reflection_client::ServerReflectionClient::new(app.channel().await);
    let request = v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(v1::server_reflection_request::MessageRequest::ListServices(
            String::new(),
        )),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let Some(v1::server_reflection_response::MessageResponse::ListServicesResponse(list)) =
        responses.next().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains(&SERVICE.to_string()), "{names:?}");
    assert!(
        names.contains(&"grpc.health.v1.Health".to_string()),
        "{names:?}"
    );

    let mut client =
        v1alpha::server_reflection_client::ServerReflectionClient::new(app.channel().await);
    let request = v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::FileContainingSymbol(
                "google.rpc.BadRequest".into(),
            ),
        ),
    };
    let mut responses = client
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let response = responses.next().await.unwrap().unwrap().message_response;
    assert!(
        matches!(
            response,
            Some(v1alpha::server_reflection_response::MessageResponse::FileDescriptorResponse(_))
        ),
        "error-detail descriptors are served: {response:?}"
    );
}

fn run_grpcurl(args: &[&str]) -> (bool, String, String) {
    let output = Command::new(grpcurl())
        .args(args)
        .output()
        .expect("run grpcurl");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn grpcurl_drives_the_server_through_reflection() {
    let app = spawn_app().await;
    let addr = app.addr.to_string();
    let result = tokio::task::spawn_blocking(move || {
        let listed = run_grpcurl(&["-plaintext", &addr, "list"]);
        let described = run_grpcurl(&["-plaintext", &addr, "describe", SERVICE]);
        let adjusted = run_grpcurl(&[
            "-plaintext",
            "-d",
            r#"{"sku":"SKU-1","delta":7,"idempotency_key":"grpcurl-1","reason":"by hand"}"#,
            &addr,
            "inventory.v1.InventoryService/AdjustStock",
        ]);
        let read = run_grpcurl(&[
            "-plaintext",
            "-emit-defaults",
            "-d",
            r#"{"skus":["SKU-1"]}"#,
            &addr,
            "inventory.v1.InventoryService/GetStock",
        ]);
        let invalid = run_grpcurl(&[
            "-plaintext",
            "-d",
            r#"{"sku":"","delta":7,"idempotency_key":"grpcurl-2"}"#,
            &addr,
            "inventory.v1.InventoryService/AdjustStock",
        ]);
        (listed, described, adjusted, read, invalid)
    })
    .await
    .unwrap();
    let (listed, described, adjusted, read, invalid) = result;

    assert!(listed.0, "{listed:?}");
    assert!(listed.1.lines().any(|l| l == SERVICE), "{}", listed.1);
    assert!(
        listed.1.lines().any(|l| l == "grpc.health.v1.Health"),
        "{}",
        listed.1
    );
    assert!(described.1.contains("rpc Reserve"), "{}", described.1);

    assert!(adjusted.0, "{adjusted:?}");
    let level: serde_json::Value = serde_json::from_str(&adjusted.1).unwrap();
    // int64 fields are strings in the protobuf JSON mapping.
    assert_eq!(level["onHand"], "7");
    assert_eq!(level["available"], "7");

    assert!(read.0, "{read:?}");
    let levels: serde_json::Value = serde_json::from_str(&read.1).unwrap();
    assert_eq!(levels["levels"][0]["sku"], "SKU-1");
    // As the README calls it (`-emit-defaults`): nothing reserved still reads as 0.
    assert_eq!(levels["levels"][0]["reserved"], "0", "{}", read.1);
    // Without it, a zero is left out (which reads as missing).
    assert!(adjusted.1.find("reserved").is_none(), "{}", adjusted.1);

    // grpcurl decodes the field violations because reflection serves their descriptors.
    assert!(!invalid.0);
    assert!(invalid.2.contains("InvalidArgument"), "{}", invalid.2);
    assert!(invalid.2.contains("google.rpc.BadRequest"), "{}", invalid.2);
    assert!(invalid.2.contains(r#""field":"sku""#), "{}", invalid.2);
}

/// The README's order lifecycle by hand: hold, ship part, release the rest.
#[tokio::test]
async fn grpcurl_confirms_part_of_a_hold_as_the_readme_shows() {
    let app = spawn_app().await;
    crate::helpers::stock(&app, "DEMO-POSTER", 5).await;
    let addr = app.addr.to_string();
    let call = move |method: &str, body: String| {
        let (ok, out, err) = run_grpcurl(&[
            "-plaintext",
            "-d",
            &body,
            &addr,
            &format!("inventory.v1.InventoryService/{method}"),
        ]);
        assert!(ok, "{method}: {err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let result = tokio::task::spawn_blocking(move || {
        let held = call(
            "Reserve",
            r#"{"idempotency_key":"order-42-try-1","order_id":"order-42","lines":[{"sku":"DEMO-POSTER","quantity":3}],"ttl":"600s"}"#.into(),
        );
        let id = held["reservationId"].as_str().unwrap().to_owned();
        let shipped = call(
            "ConfirmReservation",
            format!(
                r#"{{"reservation_id":"{id}","lines":[{{"sku":"DEMO-POSTER","quantity":1}}],"idempotency_key":"ship-42-1"}}"#
            ),
        );
        let rest = call(
            "ReleaseReservation",
            format!(r#"{{"reservation_id":"{id}"}}"#),
        );
        (shipped, rest)
    })
    .await
    .unwrap();
    let (shipped, rest) = result;
    assert_eq!(shipped["state"], "RESERVATION_STATE_HELD");
    let line = &shipped["lines"][0];
    assert_eq!(
        (&line["quantity"], &line["held"], &line["confirmed"]),
        (&"3".into(), &"2".into(), &"1".into()),
        "{shipped}"
    );
    assert_eq!(rest["state"], "RESERVATION_STATE_CONFIRMED", "{rest}");
    assert_eq!(rest["lines"][0]["released"], "2", "{rest}");
    assert_eq!(app.level("DEMO-POSTER").await, (4, 0));
}

#[tokio::test]
async fn postgres_down_is_unavailable_with_retry_advice() {
    // Nothing listens on port 1: every connection attempt is refused at once.
    let settings = test_settings("postgres://postgres@127.0.0.1:1/inventory".parse().unwrap());
    let mut app = spawn_app_with_unreachable_database(settings).await;
    let status = app
        .client
        .adjust_stock(adjust("SKU-1", 1, "k"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(error_reason(&status), "POSTGRES_UNAVAILABLE");
    assert!(status.get_details_retry_info().is_some());
    // No driver text leaks into the message.
    assert_eq!(status.message(), "PostgreSQL is unavailable");

    // Reserve gets its lease, fails on PostgreSQL, and gives the lease back.
    let status = app
        .client
        .reserve(ReserveRequest {
            idempotency_key: "k".into(),
            order_id: "o".into(),
            lines: vec![ReservationLine {
                sku: "SKU-1".into(),
                quantity: 1,
                ..Default::default()
            }],
            ttl: None,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(error_reason(&status), "POSTGRES_UNAVAILABLE");
    let sku = inventory_core::domain::Sku::parse("SKU-1").unwrap();
    let lease: Option<String> = app.redis.get(app.key_prefix.lease(&sku)).await.unwrap();
    assert_eq!(lease, None, "the lease was released");
}

/// Like `spawn_app_with`, for settings whose database cannot be reached (the harness's direct
/// database connection would fail).
async fn spawn_app_with_unreachable_database(
    settings: inventory_server::config::Settings,
) -> UnreachableApp {
    let key_prefix = settings.redis.client.key_prefix.clone();
    let redis = fred::types::Builder::from_config(settings.redis.config.clone())
        .build()
        .unwrap();
    fred::prelude::ClientLike::init(&redis).await.unwrap();
    let application = inventory_server::startup::Application::build(settings)
        .await
        .unwrap();
    let addr = application.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(application.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let client =
        inventory_server::proto::inventory_service_client::InventoryServiceClient::connect(
            format!("http://{addr}"),
        )
        .await
        .unwrap();
    UnreachableApp {
        client,
        redis,
        key_prefix,
        _stop: stop,
    }
}

struct UnreachableApp {
    client: inventory_server::proto::inventory_service_client::InventoryServiceClient<
        tonic::transport::Channel,
    >,
    redis: fred::clients::Client,
    key_prefix: inventory_redis::KeyPrefix,
    _stop: tokio::sync::oneshot::Sender<()>,
}

async fn readiness(app: &crate::helpers::TestApp) -> (ServingStatus, ServingStatus) {
    let mut health = HealthClient::new(app.channel().await);
    let mut statuses = Vec::new();
    for service in ["", SERVICE] {
        let request = HealthCheckRequest {
            service: service.into(),
        };
        statuses.push(health.check(request).await.unwrap().into_inner().status());
    }
    (statuses[0], statuses[1])
}

#[tokio::test]
async fn a_replica_is_ready_only_once_the_schema_it_needs_is_there() {
    let database = crate::helpers::empty_database().await;
    let app = crate::helpers::spawn_app_with(test_settings(database.clone())).await;
    assert_eq!(
        readiness(&app).await,
        (ServingStatus::Serving, ServingStatus::NotServing),
        "alive, but not ready on a database without its schema"
    );
    inventory_postgres::migrate::run(&database).await.unwrap();
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while readiness(&app).await.1 != ServingStatus::Serving {
        assert!(std::time::Instant::now() < give_up, "ready after migrate");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_older_binary_is_ready_on_a_newer_schema_and_a_newer_binary_is_not() {
    let needed = inventory_postgres::migrate::expected_version();
    // A schema one migration ahead of this binary (a rollout's new version migrated first).
    let ahead = crate::helpers::fresh_database().await;
    crate::helpers::connect(&ahead)
        .await
        .execute(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
             VALUES ($1, 'from_the_future', '2026-12-03', '0')",
            &[&(needed + 1)],
        )
        .await
        .unwrap();
    let app = crate::helpers::spawn_app_with(test_settings(ahead)).await;
    assert_eq!(readiness(&app).await.1, ServingStatus::Serving);

    // A schema one migration behind this binary: it waits for `migrate`.
    let behind = crate::helpers::fresh_database().await;
    crate::helpers::connect(&behind)
        .await
        .execute(
            "DELETE FROM refinery_schema_history WHERE version = $1",
            &[&needed],
        )
        .await
        .unwrap();
    let app = crate::helpers::spawn_app_with(test_settings(behind)).await;
    assert_eq!(readiness(&app).await.1, ServingStatus::NotServing);
}

/// The README's block of commands under `heading`, each `grpcurl` command (continued over
/// lines ending in `\`) split into its words as a shell would: single quotes only.
fn readme_commands(heading: &str) -> Vec<Vec<String>> {
    let readme = include_str!("../../README.md");
    let start = readme.find(heading).expect("the README has the heading");
    let block = readme[start..]
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("a sh block follows the heading");
    let joined = block.replace("\\\n", " ");
    joined
        .lines()
        .filter(|l| l.starts_with("grpcurl "))
        .map(|line| {
            let (mut words, mut word, mut quoted) = (Vec::new(), String::new(), false);
            for c in line.chars() {
                match c {
                    '\'' => quoted = !quoted,
                    ' ' if !quoted => {
                        if !word.is_empty() {
                            words.push(std::mem::take(&mut word));
                        }
                    }
                    c => word.push(c),
                }
            }
            assert!(!quoted, "unbalanced quotes: {line}");
            words.push(word);
            words.remove(0);
            words
        })
        .collect()
}

/// The README's locations walk-through, run word for word (only the address and the
/// reservation id substituted): a split, a pin, a shipment from one location, a transfer and
/// a location closed.
#[tokio::test]
async fn grpcurl_runs_the_readme_stock_states_walk_through() {
    let app = spawn_app().await;
    let addr = app.addr.to_string();
    let commands = readme_commands("Stock states: a damaged unit, a buffer");
    assert_eq!(commands.len(), 11, "{commands:?}");
    let answers = tokio::task::spawn_blocking(move || {
        let mut answers: Vec<serde_json::Value> = Vec::new();
        let mut order_61 = String::new();
        for words in commands {
            let words: Vec<String> = words
                .into_iter()
                .map(|w| {
                    w.replace("127.0.0.1:50051", &addr)
                        .replace("<id from order-61>", &order_61)
                })
                .collect();
            let args: Vec<&str> = words.iter().map(String::as_str).collect();
            let (ok, out, err) = run_grpcurl(&args);
            assert!(ok, "{words:?}: {err}");
            let answer: serde_json::Value = serde_json::from_str(&out).unwrap();
            if words.iter().any(|w| w.contains(r#""order_id":"order-61""#)) {
                order_61 = answer["reservationId"].as_str().unwrap().to_owned();
            }
            answers.push(answer);
        }
        answers
    })
    .await
    .unwrap();
    let fields = |answer: &serde_json::Value, names: &[&str]| -> Vec<String> {
        names
            .iter()
            .map(|n| {
                answer[*n]
                    .as_str()
                    .unwrap_or_else(|| panic!("{n} in {answer}"))
                    .to_owned()
            })
            .collect()
    };
    // The chipped jug: on hand, unsellable, not available; then written off.
    assert_eq!(
        fields(
            &answers[1],
            &["onHand", "unsellable", "damaged", "available"]
        ),
        ["5", "1", "1", "4"]
    );
    assert_eq!(
        fields(&answers[2], &["onHand", "damaged", "available"]),
        ["4", "0", "4"]
    );
    // Two kept back.
    assert_eq!(
        fields(&answers[3], &["safetyStock", "available"]),
        ["2", "2"]
    );
    // The cart of 4: 2 held, 2 backordered.
    let line = &answers[5]["lines"][0];
    assert_eq!(fields(line, &["held", "backordered"]), ["2", "2"], "{line}");
    // Ten due on 14 June: what may be promised by then is 8 (the backorder takes 2).
    let level = &answers[7]["levels"][0];
    assert_eq!(fields(level, &["incoming", "backordered"]), ["10", "2"]);
    let steps = level["availableToPromise"].as_array().unwrap();
    assert_eq!(steps.len(), 1, "{level}");
    // The receipt's date, or now once that is past (never a date in the past).
    let due = "2027-06-14T00:00:00Z";
    let at = steps[0]["at"].as_str().unwrap();
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    if now.as_str() < due {
        assert_eq!(at, due, "{level}");
    } else {
        assert!(at > due, "{level}");
    }
    assert_eq!(steps[0]["quantity"], "8", "{level}");
    // The pre-order is pegged to the receipt.
    let line = &answers[8]["lines"][0];
    assert_eq!(
        fields(line, &["held", "preordered", "receiptId"]),
        ["0", "3", "PO-4711-1"]
    );
    assert_eq!(line["preorderExpectedAt"], "2027-06-14T00:00:00Z", "{line}");
    // Received: both carts hold every unit, nothing waits.
    let received = &answers[9];
    assert_eq!(
        fields(received, &["state", "preordered"]),
        ["RECEIPT_STATE_RECEIVED", "0"]
    );
    assert_eq!(
        fields(
            &received["level"],
            &[
                "onHand",
                "reserved",
                "backordered",
                "preordered",
                "incoming"
            ]
        ),
        ["14", "7", "0", "0", "0"]
    );
    let line = &answers[10]["lines"][0];
    assert_eq!(fields(line, &["held", "preordered"]), ["3", "0"], "{line}");
    let (clean, report) = app.verify().await;
    assert!(clean, "{report}");
}

#[tokio::test]
async fn grpcurl_runs_the_readme_locations_walk_through() {
    let app = spawn_app().await;
    let addr = app.addr.to_string();
    let commands = readme_commands("Stock at several locations");
    assert_eq!(commands.len(), 11, "{commands:?}");
    let answers = tokio::task::spawn_blocking(move || {
        let mut answers: Vec<serde_json::Value> = Vec::new();
        let mut order_50 = String::new();
        for words in commands {
            let words: Vec<String> = words
                .into_iter()
                .map(|w| {
                    w.replace("127.0.0.1:50051", &addr)
                        .replace("<id from order-50>", &order_50)
                })
                .collect();
            let args: Vec<&str> = words.iter().map(String::as_str).collect();
            let (ok, out, err) = run_grpcurl(&args);
            assert!(ok, "{words:?}: {err}");
            let answer: serde_json::Value = serde_json::from_str(&out).unwrap();
            if words.iter().any(|w| w.contains(r#""order_id":"order-50""#)) {
                order_50 = answer["reservationId"].as_str().unwrap().to_owned();
            }
            answers.push(answer);
        }
        answers
    })
    .await
    .unwrap();

    let listed = &answers[2]["locations"];
    let ids: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["locationId"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains(&"berlin") && ids.contains(&"paris"),
        "{listed}"
    );

    let read = &answers[5];
    assert_eq!(read["levels"][0]["onHand"], "7", "{read}");
    assert_eq!(read["levels"][0]["locationId"], "", "{read}");
    let at = |answer: &serde_json::Value, location: &str| -> (String, String) {
        let level = answer["locationLevels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["locationId"] == location)
            .unwrap_or_else(|| panic!("{location} in {answer}"));
        (
            level["onHand"].as_str().unwrap().to_owned(),
            level["reserved"].as_str().unwrap().to_owned(),
        )
    };
    assert_eq!(at(read, "berlin"), ("2".into(), "0".into()));
    assert_eq!(at(read, "paris"), ("5".into(), "0".into()));

    // No warehouse has 4: berlin (priority 1) gives its 2, paris the rest.
    let allocations = |answer: &serde_json::Value| -> Vec<(String, String)> {
        answer["lines"][0]["allocations"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
            .iter()
            .map(|a| (a["locationId"].to_string(), a["quantity"].to_string()))
            .collect()
    };
    let pair = |location: &str, quantity: &str| (format!("{location:?}"), format!("{quantity:?}"));
    assert_eq!(
        allocations(&answers[6]),
        [pair("berlin", "2"), pair("paris", "2")]
    );
    assert_eq!(allocations(&answers[7]), [pair("paris", "1")]);
    // Shipping paris's 2 leaves berlin's 2 held.
    let shipped = &answers[8];
    assert_eq!(shipped["state"], "RESERVATION_STATE_HELD", "{shipped}");
    assert_eq!(shipped["lines"][0]["held"], "2", "{shipped}");
    assert_eq!(shipped["lines"][0]["confirmed"], "2", "{shipped}");

    // The transfer moved one of paris's 2 available units; its held unit stayed.
    let moved = &answers[9];
    assert_eq!(moved["level"]["onHand"], "5", "{moved}");
    let sides: Vec<_> = moved["locationLevels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (&l["locationId"], &l["onHand"], &l["reserved"]))
        .collect();
    assert_eq!(
        sides,
        [
            (&"paris".into(), &"2".into(), &"1".into()),
            (&"berlin".into(), &"3".into(), &"2".into())
        ],
        "{moved}"
    );
    assert_eq!(answers[10]["active"], false, "{}", answers[10]);
    assert_eq!(app.level("DEMO-LAMP").await, (5, 3));

    let mut client = app.client.clone();
    let read = client
        .get_stock(inventory_server::proto::GetStockRequest {
            skus: vec!["DEMO-LAMP".into()],
            by_location: true,
        })
        .await
        .unwrap()
        .into_inner();
    let at = |location: &str| {
        let l = read
            .location_levels
            .iter()
            .find(|l| l.location_id == location)
            .unwrap();
        (l.on_hand, l.reserved)
    };
    assert_eq!((at("berlin"), at("paris")), ((3, 2), (2, 1)));
}

/// The schema compatibility contract: once a migration raised the floor above this release
/// (the oldest release that may still write), a replica of it refuses every write in the
/// statement itself, whatever it believed when it started (`FAILED_PRECONDITION`,
/// `SCHEMA_TOO_NEW`, nothing changed), leaves readiness, and a new one never becomes ready.
#[tokio::test]
async fn a_release_below_the_schema_floor_refuses_writes_and_is_not_ready() {
    let release = inventory_postgres::migrate::release();
    let database = crate::helpers::fresh_database().await;
    let app = crate::helpers::spawn_app_with(test_settings(database.clone())).await;
    let mut client = app.client.clone();
    crate::helpers::stock(&app, "FLOOR-1", 5).await;
    inventory_testkit::process::eventually("ready", Duration::from_secs(10), || async {
        readiness(&app).await.1 == ServingStatus::Serving
    })
    .await
    .unwrap();
    assert_eq!(
        inventory_server::startup::schema_ready(app.store.pool()).await,
        Ok(())
    );

    // A newer release migrated a change this one would corrupt.
    app.db
        .batch_execute(&format!(
            "INSERT INTO refinery_schema_history (version, name, applied_on, checksum)
             VALUES ({ahead}, 'raises_the_floor', '2026-12-06', '0');
             UPDATE schema_floor SET floor = {ahead};",
            ahead = release + 1
        ))
        .await
        .unwrap();
    assert_eq!(
        inventory_server::startup::schema_ready(app.store.pool()).await,
        Err(inventory_server::startup::NotReady::BelowFloor {
            release,
            floor: release + 1
        })
    );

    let adjust = |sku: &str| AdjustStockRequest {
        sku: sku.into(),
        delta: 1,
        idempotency_key: format!("adjust-{sku}"),
        ..Default::default()
    };
    let reserve = crate::helpers::reserve("below-floor", &[("FLOOR-1", 1)]);
    for refused in [
        client.adjust_stock(adjust("FLOOR-1")).await.unwrap_err(),
        client.adjust_stock(adjust("FLOOR-NEW")).await.unwrap_err(),
        client.reserve(reserve).await.unwrap_err(),
    ] {
        assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
        assert_eq!(error_reason(&refused), "SCHEMA_TOO_NEW");
        let details = refused.get_error_details();
        let info = details.error_info().unwrap();
        assert_eq!(info.metadata["release"], release.to_string());
        assert_eq!(info.metadata["floor"], (release + 1).to_string());
    }
    assert_eq!(app.level("FLOOR-1").await, (5, 0), "nothing changed");
    assert_eq!(
        app.count("SELECT count(*) FROM stock WHERE sku = 'FLOOR-NEW'")
            .await,
        0
    );
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys").await,
        1,
        "only the stocking call's key: the refused ones stored nothing"
    );
    inventory_testkit::process::eventually(
        "the running replica leaves readiness",
        Duration::from_secs(20),
        || async { readiness(&app).await.1 == ServingStatus::NotServing },
    )
    .await
    .unwrap();
}

/// The README's subscription walk-through, run word for word (only the address, the
/// reservation id and the acknowledged event substituted): a subscription created, an order
/// confirmed, the confirmation read through the subscription and acknowledged.
#[tokio::test]
async fn grpcurl_runs_the_readme_subscription_walk_through() {
    let app = spawn_app().await;
    crate::helpers::stock(&app, "DEMO-MUG", 5).await;
    let addr = app.addr.to_string();
    let commands = readme_commands("Fulfilment, reading the confirmations");
    assert_eq!(commands.len(), 6, "{commands:?}");
    let (answers, watched) = tokio::task::spawn_blocking(move || {
        let mut answers: Vec<serde_json::Value> = Vec::new();
        let mut watched: Vec<serde_json::Value> = Vec::new();
        let (mut reservation, mut sequence, mut epoch) =
            (String::new(), String::new(), String::new());
        for words in commands {
            let words: Vec<String> = words
                .into_iter()
                .map(|w| {
                    w.replace("127.0.0.1:50051", &addr)
                        .replace("<id from order-sub-1>", &reservation)
                        .replace("<sequence of the confirmation>", &sequence)
                        .replace("<its epoch>", &epoch)
                })
                .collect();
            let args: Vec<&str> = words.iter().map(String::as_str).collect();
            let (ok, out, err) = run_grpcurl(&args);
            if words.iter().any(|w| w.ends_with("/WatchEvents")) {
                // `-max-time` ends the read.
                assert!(!ok && err.contains("DeadlineExceeded"), "{err}");
                watched = serde_json::Deserializer::from_str(&out)
                    .into_iter::<serde_json::Value>()
                    .map(Result::unwrap)
                    .collect();
                let confirmation = watched
                    .iter()
                    .find(|e| e["type"] == "EVENT_TYPE_RESERVATION_CONFIRMED")
                    .unwrap_or_else(|| panic!("{out}"));
                sequence = confirmation["sequence"].as_str().unwrap().to_owned();
                epoch = confirmation["epoch"].as_str().unwrap().to_owned();
                continue;
            }
            assert!(ok, "{words:?}: {err}");
            let answer: serde_json::Value = serde_json::from_str(&out).unwrap();
            if words.iter().any(|w| w.ends_with("/Reserve")) {
                reservation = answer["reservationId"].as_str().unwrap().to_owned();
            }
            answers.push(answer);
        }
        (answers, watched)
    })
    .await
    .unwrap();
    assert_eq!(answers[0]["name"], "fulfilment", "{}", answers[0]);
    // The opening heartbeat where the subscription started, then only the confirmation
    // (the hold did not pass the filter).
    let types: Vec<&str> = watched
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        ["EVENT_TYPE_HEARTBEAT", "EVENT_TYPE_RESERVATION_CONFIRMED"],
        "{watched:?}"
    );
    // int64 in JSON is a string, and 0 is left out.
    let started = answers[0]["ackedSequence"].as_str().unwrap_or("0");
    assert_eq!(watched[0]["sequence"].as_str().unwrap_or("0"), started);
    let acked = &answers[3];
    assert_eq!(acked["ackedSequence"], watched[1]["sequence"], "{acked}");
    let listed = &answers[4]["subscriptions"][0];
    assert_eq!(listed["name"], "fulfilment", "{listed}");
    assert_eq!(listed["ackedSequence"], watched[1]["sequence"], "{listed}");
}
