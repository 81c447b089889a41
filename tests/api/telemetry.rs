//! Traces reach an OTLP collector under the caller's trace; metrics show on `/metrics`.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::join_all;
use inventory_core::pause::PausePoint;
use inventory_server::telemetry::{self, TelemetrySettings};
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value::Value,
    trace::v1::{Span, span::SpanKind, status::StatusCode},
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_stream::wrappers::TcpListenerStream;

use crate::{
    coalescing::{hold_leader, queue},
    helpers::{
        TestApp, confirm, fresh_database, reserve, spawn_app_exporting, spawn_app_with, stock,
        test_settings,
    },
};

/// An OTLP trace collector that keeps what it receives.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// Every span received, after `telemetry` was shut down (which flushes them).
    async fn spans_after(&self, telemetry: telemetry::Telemetry) -> Vec<Span> {
        tokio::task::spawn_blocking(move || telemetry.shutdown())
            .await
            .unwrap();
        self.0
            .lock()
            .unwrap()
            .iter()
            .flat_map(|export| &export.resource_spans)
            .flat_map(|resource| &resource.scope_spans)
            .flat_map(|scope| &scope.spans)
            .cloned()
            .collect()
    }
}

/// This process's telemetry, exporting spans to an in-test OTLP collector.
async fn tracing_to_collector() -> (Collector, telemetry::Telemetry) {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let telemetry = telemetry::init(
        inventory_server::config::LogFormat::Text,
        &TelemetrySettings {
            otlp_endpoint: Some(endpoint),
        },
    )
    .unwrap();
    (collector, telemetry)
}

// The exporters run on the runtime while shutdown blocks a thread: two workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spans_of_one_reserve_reach_the_collector_under_the_callers_trace() {
    let (collector, telemetry) = tracing_to_collector().await;

    let app = spawn_app_with(test_settings(fresh_database().await)).await;
    stock(&app, "SKU-1", 5).await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_id = "00f067aa0ba902b7";
    let mut request = tonic::Request::new(reserve("traced", &[("SKU-1", 1)]));
    request.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{parent_id}-01").parse().unwrap(),
    );
    app.client.clone().reserve(request).await.unwrap();

    let spans = collector.spans_after(telemetry).await;
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let ours: Vec<_> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == trace_id)
        .collect();
    let names: Vec<&str> = ours.iter().map(|s| s.name.as_str()).collect();
    let rpc = ours
        .iter()
        .find(|s| s.name == "inventory.v1.InventoryService/Reserve")
        .unwrap_or_else(|| panic!("no RPC span in {names:?}"));
    assert_eq!(
        hex(&rpc.parent_span_id),
        parent_id,
        "continues the caller's span"
    );
    assert_eq!(rpc.kind, SpanKind::Server as i32);
    assert_eq!(attribute(rpc, "rpc.system"), Some(text("grpc")));
    assert_eq!(
        attribute(rpc, "rpc.service"),
        Some(text("inventory.v1.InventoryService"))
    );
    assert_eq!(attribute(rpc, "rpc.method"), Some(text("Reserve")));
    assert_eq!(
        attribute(rpc, "rpc.grpc.status_code"),
        Some(Value::IntValue(0))
    );
    assert_ne!(
        rpc.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32),
        "a success is no error"
    );
    // The RPC, the use case (core), the lease wait (Redis) and the SQL transaction (PostgreSQL).
    for expected in ["lease.acquire", "reserve", "sql.reserve"] {
        assert!(
            names.iter().filter(|n| **n == expected).count() >= 1,
            "{expected} missing from {names:?}"
        );
    }
    let lease = ours.iter().find(|s| s.name == "lease.acquire").unwrap();
    let attributes: Vec<&str> = lease.attributes.iter().map(|kv| kv.key.as_str()).collect();
    assert!(
        attributes.contains(&"attempts") && attributes.contains(&"wait_ms"),
        "{attributes:?}"
    );
}

pub(crate) async fn scrape(addr: std::net::SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: inventory\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).await.unwrap();
    page
}

/// The value of the first sample whose line starts with `name` (labels allowed).
fn sample(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.starts_with(&format!("{name}{{")) || line.starts_with(&format!("{name} "))
        })
        .map(|line| line.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[tokio::test]
async fn metrics_show_on_the_admin_port_after_a_contended_run() {
    let telemetry = telemetry::init(
        inventory_server::config::LogFormat::Text,
        &TelemetrySettings::default(),
    )
    .unwrap();
    let mut settings = test_settings(fresh_database().await);
    settings.server.admin_listen_addr = Some("127.0.0.1:0".parse().unwrap());
    let application = inventory_server::startup::Application::build_with_registry(
        settings,
        telemetry.registry().clone(),
    )
    .await
    .unwrap();
    let admin = application.admin_addr().unwrap();
    let addr = application.local_addr();
    let (_stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(application.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let client =
        inventory_server::proto::inventory_service_client::InventoryServiceClient::connect(
            format!("http://{addr}"),
        )
        .await
        .unwrap();
    let app_like = crate::helpers::TestClient(client.clone());
    app_like.stock("HOT", 5).await;

    // A contended run: 30 racers for 5 units, a replay and a key conflict.
    let calls = (0..30).map(|i| {
        let mut client = client.clone();
        async move {
            client
                .reserve(reserve(&format!("m{i}"), &[("HOT", 1)]))
                .await
        }
    });
    join_all(calls).await;
    let mut client2 = client.clone();
    let _ = client2.reserve(reserve("m0", &[("HOT", 1)])).await;
    let _ = client2.reserve(reserve("m0", &[("HOT", 2)])).await;

    let page = inventory_testkit::process::eventually_ok(
        "the metrics page shows inventory_reservations",
        Duration::from_secs(5),
        || async {
            let page = scrape(admin).await;
            if page.contains("inventory_reservations") {
                Ok(page)
            } else {
                Err("not yet")
            }
        },
    )
    .await
    .unwrap();
    for name in [
        "inventory_rpc_duration_seconds_count",
        "inventory_lease_acquire_duration_seconds_count",
        "inventory_reserve_batch_size_count",
        "inventory_stock_insufficient_total",
        "inventory_idempotency_replays_total",
        "inventory_idempotency_conflicts_total",
        "inventory_reservations_total",
    ] {
        assert!(
            sample(&page, name) > 0.0,
            "{name} is zero or missing in:\n{page}"
        );
    }
    assert!(page.contains("inventory_outbox_unpositioned"), "{page}");
}

fn attribute(span: &Span, key: &str) -> Option<Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref())
        .and_then(|v| v.value.clone())
}

fn text(value: &str) -> Value {
    Value::StringValue(value.to_owned())
}

/// Calls `path` on the gRPC port with an empty `GetStockRequest`, whatever the path names.
async fn call_path(app: &TestApp, path: &str) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(app.channel().await);
    grpc.ready().await.unwrap();
    let codec = tonic_prost::ProstCodec::<
        inventory_server::proto::GetStockRequest,
        inventory_server::proto::GetStockResponse,
    >::default();
    grpc.unary(
        tonic::Request::new(inventory_server::proto::GetStockRequest::default()),
        tonic::codegen::http::uri::PathAndQuery::try_from(path.to_owned()).unwrap(),
        codec,
    )
    .await
    .unwrap_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_failures_mark_the_span_an_error_and_unknown_methods_are_other() {
    let (collector, telemetry) = tracing_to_collector().await;
    let app = spawn_app_with(test_settings(fresh_database().await)).await;

    // UNIMPLEMENTED: a failure of the server's, by the conventions' list.
    let unknown = call_path(&app, "/inventory.v1.InventoryService/Nope").await;
    assert_eq!(unknown.code(), tonic::Code::Unimplemented);
    // INVALID_ARGUMENT: the caller's mistake, not the server's.
    let invalid = app
        .client
        .clone()
        .reserve(reserve("bad", &[]))
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), tonic::Code::InvalidArgument);

    let spans: Vec<Span> = collector
        .spans_after(telemetry)
        .await
        .into_iter()
        .filter(|span| span.kind == SpanKind::Server as i32)
        .collect();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert!(
        !names.iter().any(|n| n.contains("Nope")),
        "an unknown method names no span: {names:?}"
    );
    let other = spans
        .iter()
        .find(|s| s.name == "_OTHER")
        .unwrap_or_else(|| panic!("no _OTHER span in {names:?}"));
    assert_eq!(attribute(other, "rpc.method"), Some(text("_OTHER")));
    assert_eq!(
        attribute(other, "rpc.method_original"),
        Some(text("/inventory.v1.InventoryService/Nope"))
    );
    assert_eq!(
        attribute(other, "rpc.grpc.status_code"),
        Some(Value::IntValue(12))
    );
    assert_eq!(
        other.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32)
    );
    let refused = spans
        .iter()
        .find(|s| s.name == "inventory.v1.InventoryService/Reserve")
        .unwrap_or_else(|| panic!("no Reserve span in {names:?}"));
    assert_eq!(
        attribute(refused, "rpc.grpc.status_code"),
        Some(Value::IntValue(3))
    );
    assert_ne!(
        refused.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32),
        "INVALID_ARGUMENT is the caller's error, not the server's"
    );
}

/// An app whose `/metrics` serves what this process's telemetry records.
async fn exporting_app() -> (TestApp, telemetry::Telemetry) {
    let telemetry = telemetry::init(
        inventory_server::config::LogFormat::Text,
        &TelemetrySettings::default(),
    )
    .unwrap();
    let mut settings = test_settings(fresh_database().await);
    settings.server.admin_listen_addr = Some("127.0.0.1:0".parse().unwrap());
    let app = spawn_app_exporting(settings, telemetry.registry().clone()).await;
    (app, telemetry)
}

/// Every sample of `name` with its labels.
fn samples(page: &str, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, labels) = match series.split_once('{') {
                Some((metric, rest)) => (metric, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            (metric == name).then(|| {
                let labels = labels
                    .split("\",")
                    .filter(|kv| !kv.is_empty())
                    .filter_map(|kv| {
                        let (k, v) = kv.split_once('=')?;
                        Some((k.to_owned(), v.trim_matches('"').to_owned()))
                    })
                    .collect();
                (labels, value.parse().unwrap())
            })
        })
        .collect()
}

/// The sum of `name`'s samples whose labels include every pair of `with`.
fn total(page: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    samples(page, name)
        .into_iter()
        .filter(|(labels, _)| {
            with.iter()
                .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, value)| value)
        .sum()
}

/// Bucket bounds of a histogram, and how many samples fell in each bucket (not cumulative),
/// over all its series.
fn buckets(page: &str, histogram: &str) -> Vec<(f64, f64)> {
    let mut series: std::collections::BTreeMap<String, Vec<(f64, f64)>> = Default::default();
    for (labels, cumulative) in samples(page, &format!("{histogram}_bucket")) {
        let le = labels.iter().find(|(k, _)| k == "le").unwrap().1.clone();
        let rest: Vec<String> = labels
            .iter()
            .filter(|(k, _)| k != "le")
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().unwrap()
        };
        series
            .entry(rest.join(","))
            .or_default()
            .push((bound, cumulative));
    }
    let mut per_bound: std::collections::BTreeMap<u64, (f64, f64)> = Default::default();
    for (_, mut points) in series {
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut below = 0.0;
        for (bound, cumulative) in points {
            let entry = per_bound.entry(bound.to_bits()).or_insert((bound, 0.0));
            entry.1 += cumulative - below;
            below = cumulative;
        }
    }
    let mut out: Vec<(f64, f64)> = per_bound.into_values().collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_histograms_have_buckets_in_seconds_and_samples_spread_over_them() {
    let (app, _telemetry) = exporting_app().await;
    for sku in ["SLOW", "FAST", "HOT"] {
        stock(&app, sku, 10).await;
    }
    // One Reserve held inside its transaction (it checked its order, then waits), one not.
    let mut held = app.pauses.arm(PausePoint::OrderChecked);
    let mut client = app.client.clone();
    let slow = tokio::spawn(async move { client.reserve(reserve("slow", &[("SLOW", 1)])).await });
    held.reached().await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    held.resume();
    slow.await.unwrap().unwrap();
    app.client
        .clone()
        .reserve(reserve("fast", &[("FAST", 1)]))
        .await
        .unwrap();
    // A coalesced batch: two calls queued behind a leader held at its lease.
    let (held, leader) = hold_leader(&app, "HOT").await;
    let a = queue(&app, "HOT", reserve("a", &[("HOT", 1)])).await;
    let b = queue(&app, "HOT", reserve("b", &[("HOT", 1)])).await;
    held.resume();
    for call in [leader, a, b] {
        call.await.unwrap().unwrap();
    }

    let page = scrape(app.admin_addr.unwrap()).await;
    for histogram in [
        "inventory_rpc_duration_seconds",
        "inventory_reserve_transaction_duration_seconds",
        "inventory_reserve_commit_duration_seconds",
        "inventory_lease_acquire_duration_seconds",
        "inventory_redis_command_duration_seconds",
    ] {
        let bounds: Vec<f64> = buckets(&page, histogram).iter().map(|b| b.0).collect();
        assert_eq!(
            bounds,
            [
                0.0005,
                0.001,
                0.0025,
                0.005,
                0.01,
                0.025,
                0.05,
                0.1,
                0.25,
                0.5,
                1.0,
                2.5,
                5.0,
                10.0,
                f64::INFINITY
            ],
            "{histogram}:\n{page}"
        );
    }
    let ms: Vec<f64> = buckets(&page, "rpc_server_duration_milliseconds")
        .iter()
        .map(|b| b.0)
        .collect();
    assert_eq!(ms.first(), Some(&0.5), "{page}");
    // The slow Reserve (above 0.5 s) and the rest land apart: the quantiles mean something.
    let slow_transactions: f64 = buckets(&page, "inventory_reserve_transaction_duration_seconds")
        .iter()
        .filter(|(bound, _)| *bound > 0.5)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(slow_transactions, 1.0, "{page}");
    for histogram in [
        "inventory_rpc_duration_seconds",
        "inventory_reserve_transaction_duration_seconds",
        "rpc_server_duration_milliseconds",
    ] {
        let occupied = buckets(&page, histogram)
            .iter()
            .filter(|(_, n)| *n > 0.0)
            .count();
        assert!(
            occupied >= 2,
            "{histogram} uses {occupied} bucket(s):\n{page}"
        );
    }
    // Both Reserve paths record their transactions.
    for path in ["single", "coalesced"] {
        assert!(
            total(
                &page,
                "inventory_reserve_transaction_duration_seconds_count",
                &[("path", path)]
            ) >= 1.0,
            "{path}:\n{page}"
        );
    }
}

#[tokio::test]
async fn unknown_paths_share_one_series_and_leave_no_trace_of_their_names() {
    let (app, _telemetry) = exporting_app().await;
    let paths = [
        "/inventory.v1.InventoryService/Nope",
        "/inventory.v1.Other/Reserve",
        "/wp-login.php",
        "/a/b/c",
        "/x7f3a9",
    ];
    for path in paths {
        call_path(&app, path).await;
    }
    let page = scrape(app.admin_addr.unwrap()).await;
    for path in paths {
        assert!(!page.contains(path), "{path} became a label:\n{page}");
    }
    assert_eq!(
        total(
            &page,
            "inventory_rpc_duration_seconds_count",
            &[("rpc_method", "_OTHER")]
        ),
        paths.len() as f64,
        "{page}"
    );
    assert_eq!(
        total(
            &page,
            "rpc_server_duration_milliseconds_count",
            &[
                ("rpc_method", "_OTHER"),
                ("rpc_service", "_OTHER"),
                ("rpc_grpc_status_code", "12")
            ]
        ),
        paths.len() as f64,
        "{page}"
    );
}

#[tokio::test]
async fn saturation_build_and_process_metrics_show_what_is_happening() {
    let (app, _telemetry) = exporting_app().await;
    stock(&app, "SKU-1", 10).await;
    app.client
        .clone()
        .reserve(reserve("first", &[("SKU-1", 2)]))
        .await
        .unwrap();
    let _watching = crate::events::watch(&app, 0).await;
    // One call in flight, held inside its transaction, while the page is read.
    let mut held = app.pauses.arm(PausePoint::OrderChecked);
    let mut client = app.client.clone();
    let in_flight =
        tokio::spawn(async move { client.reserve(reserve("second", &[("SKU-1", 1)])).await });
    held.reached().await;
    let page = scrape(app.admin_addr.unwrap()).await;
    held.resume();
    in_flight.await.unwrap().unwrap();

    assert_eq!(total(&page, "inventory_rpc_in_flight", &[]), 1.0, "{page}");
    assert_eq!(
        total(&page, "inventory_rpc_in_flight_limit", &[]),
        1024.0,
        "MAX_IN_FLIGHT of the test settings"
    );
    // The held call's connection at least (a watcher or the sweeper may hold another).
    let used = total(&page, "inventory_db_pool_connections", &[("state", "used")]);
    assert!(used >= 1.0, "{page}");
    assert!(used <= total(&page, "inventory_db_pool_connections", &[("state", "max")]));
    assert!(total(&page, "inventory_db_pool_connections", &[("state", "max")]) >= 1.0);
    assert_eq!(
        total(&page, "inventory_db_pool_waiting", &[]),
        0.0,
        "{page}"
    );
    assert_eq!(
        total(&page, "inventory_events_watchers", &[]),
        1.0,
        "{page}"
    );
    assert_eq!(
        total(
            &page,
            "inventory_build_info",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", inventory_server::metrics::BUILD_COMMIT)
            ]
        ),
        1.0,
        "{page}"
    );
    assert!(
        total(&page, "process_resident_memory_bytes", &[]) > 0.0,
        "{page}"
    );
    assert!(total(&page, "process_open_fds", &[]) > 0.0, "{page}");
    assert!(
        total(
            &page,
            "inventory_redis_command_duration_seconds_count",
            &[("command", "acquire"), ("outcome", "ok")]
        ) >= 1.0,
        "{page}"
    );
    assert!(total(&page, "inventory_reserve_queue_depth_count", &[]) >= 1.0);
    // Counters without labels are there before their first event.
    for counter in ["inventory_lease_lost_total", "inventory_fence_raised_total"] {
        assert_eq!(samples(&page, counter).len(), 1, "{counter}:\n{page}");
    }

    // The held gauges, as the sweeper counts them: 3 units in 2 holds, none overdue.
    let totals = app.store.refresh_held_gauges().await.unwrap();
    assert_eq!(
        totals,
        inventory_postgres::HeldTotals {
            reservations: 2,
            overdue: 0,
            units: 3
        }
    );
    let page = scrape(app.admin_addr.unwrap()).await;
    assert_eq!(total(&page, "inventory_reservations_held", &[]), 2.0);
    assert_eq!(total(&page, "inventory_stock_reserved_units", &[]), 3.0);
    assert_eq!(total(&page, "inventory_reservations_overdue", &[]), 0.0);
}

/// Metric names in PromQL expressions: identifiers of ours, the conventions' and the
/// process's.
fn metric_names(exprs: &[String]) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for expr in exprs {
        let mut word = String::new();
        for c in expr.chars().chain([' ']) {
            if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
                word.push(c);
                continue;
            }
            if ["inventory_", "rpc_server_", "process_", "kube_"]
                .iter()
                .any(|prefix| word.starts_with(prefix))
                && c != '='
                && c != '!'
            {
                names.insert(word.clone());
            }
            word.clear();
        }
    }
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_alerts_read_is_exported_and_documented() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("deploy/grafana/inventory.json")).unwrap(),
    )
    .unwrap();
    let mut dashboard_exprs = Vec::new();
    // Panels, and those inside collapsed rows.
    let panels = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|panel| {
            std::iter::once(panel).chain(panel["panels"].as_array().into_iter().flatten())
        });
    for panel in panels {
        for target in panel["targets"].as_array().into_iter().flatten() {
            dashboard_exprs.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(query) = variable["query"]["query"].as_str() {
            dashboard_exprs.push(query.to_owned());
        }
    }
    let rules =
        std::fs::read_to_string(root.join("deploy/k8s/components/monitoring/prometheusrule.yaml"))
            .unwrap();
    let rule_exprs: Vec<String> = rules
        .lines()
        .filter_map(|line| line.trim().strip_prefix("expr:"))
        .map(str::to_owned)
        .collect();
    assert!(rule_exprs.len() >= 10, "{rule_exprs:?}");

    // A workload that touches every path: both Reserve paths, a confirm, a watcher, a sweep.
    let (app, _telemetry) = exporting_app().await;
    stock(&app, "SKU-1", 10).await;
    stock(&app, "HOT", 10).await;
    let held_one = app
        .client
        .clone()
        .reserve(reserve("one", &[("SKU-1", 1)]))
        .await
        .unwrap()
        .into_inner();
    // A replay, and a key reused for another request.
    app.client
        .clone()
        .reserve(reserve("one", &[("SKU-1", 1)]))
        .await
        .unwrap();
    app.client
        .clone()
        .reserve(reserve("one", &[("SKU-1", 2)]))
        .await
        .unwrap_err();
    app.client
        .clone()
        .confirm_reservation(confirm(&held_one.reservation_id))
        .await
        .unwrap();
    let (held, leader) = hold_leader(&app, "HOT").await;
    let a = queue(&app, "HOT", reserve("a", &[("HOT", 1)])).await;
    let b = queue(&app, "HOT", reserve("b", &[("HOT", 1)])).await;
    held.resume();
    for call in [leader, a, b] {
        call.await.unwrap().unwrap();
    }
    let _watching = crate::events::watch(&app, 0).await;
    app.inventory.expire_due(100).await.unwrap();
    app.inventory.refill_waiting(100).await.unwrap();
    app.store.refresh_held_gauges().await.unwrap();
    app.client
        .clone()
        .create_subscription(inventory_server::proto::CreateSubscriptionRequest {
            name: "storefront".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    app.store.refresh_subscription_gauges().await.unwrap();
    let page = inventory_testkit::process::eventually_ok(
        "the sequencer reported its lag",
        Duration::from_secs(10),
        || async {
            let page = scrape(app.admin_addr.unwrap()).await;
            if page.contains("inventory_outbox_unpositioned") {
                Ok(page)
            } else {
                Err("not yet")
            }
        },
    )
    .await
    .unwrap();
    let exported: std::collections::BTreeSet<&str> = page
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.split(['{', ' ']).next())
        .collect();

    for name in metric_names(&dashboard_exprs) {
        assert!(
            exported.contains(name.as_str()),
            "the dashboard reads {name}, which /metrics does not show:\n{page}"
        );
    }
    // Exported elsewhere: `verify` sends its gauge over OTLP when it exits; the certificate
    // gauge exists with TLS on; kube-state-metrics reports Jobs.
    let elsewhere = [
        "inventory_verify_drift",
        "inventory_tls_certificate_not_after_seconds",
        "kube_cronjob_status_last_successful_time",
        // The relay process's own page.
        "inventory_relay_lag",
        "inventory_relay_active",
        "inventory_relay_published_total",
        "inventory_relay_publish_errors_total",
    ];
    for name in metric_names(&rule_exprs) {
        assert!(
            exported.contains(name.as_str()) || elsewhere.contains(&name.as_str()),
            "an alert reads {name}, which /metrics does not show:\n{page}"
        );
    }

    // The README's telemetry table names every metric of ours the page shows.
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let telemetry_section = readme
        .split("## Telemetry")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    for line in page.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let name = rest.split(' ').next().unwrap();
        if name.starts_with("inventory_") || name.starts_with("rpc_") {
            assert!(
                telemetry_section.contains(&format!("`{name}")),
                "README's Telemetry section does not list {name}"
            );
        }
    }
    for name in elsewhere.iter().take(2) {
        assert!(telemetry_section.contains(&format!("`{name}")), "{name}");
    }
    // Every runbook an alert links to is a section of the operations guide.
    let operations = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    for anchor in rules.lines().filter_map(|line| {
        line.trim()
            .strip_prefix("runbook_url: https://")
            .and_then(|url| url.split_once("/docs/operations.md#"))
            .map(|(_, anchor)| anchor)
    }) {
        let heading = operations.lines().any(|line| {
            line.starts_with('#')
                && line
                    .trim_start_matches('#')
                    .trim()
                    .to_lowercase()
                    .replace(|c: char| !c.is_alphanumeric() && c != ' ' && c != '-', "")
                    .replace(' ', "-")
                    == anchor
        });
        assert!(heading, "docs/operations.md has no section #{anchor}");
    }
}

#[tokio::test]
async fn the_certificate_gauge_says_when_the_server_certificate_and_client_ca_expire() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.not_after = rcgen::date_time_ymd(2031, 6, 1);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let mut server_params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    server_params.not_after = rcgen::date_time_ymd(2030, 1, 1);
    let key = KeyPair::generate().unwrap();
    let server = server_params.signed_by(&key, &ca).unwrap();

    let telemetry = telemetry::init(
        inventory_server::config::LogFormat::Text,
        &TelemetrySettings::default(),
    )
    .unwrap();
    let mut settings = test_settings(fresh_database().await);
    settings.server.admin_listen_addr = Some("127.0.0.1:0".parse().unwrap());
    settings.server.tls = Some(inventory_server::config::TlsSettings {
        cert_pem: server.pem().into_bytes(),
        key_pem: key.serialize_pem().into_bytes().into(),
        client_ca_pem: Some(ca.pem().into_bytes()),
    });
    let app = spawn_app_exporting(settings, telemetry.registry().clone()).await;
    let page = scrape(app.admin_addr.unwrap()).await;
    let gauge = "inventory_tls_certificate_not_after_seconds";
    // 2030-01-01 and 2031-06-01, 00:00 UTC.
    assert_eq!(
        total(&page, gauge, &[("certificate", "server")]),
        1_893_456_000.0,
        "{page}"
    );
    assert_eq!(
        total(&page, gauge, &[("certificate", "client_ca")]),
        1_938_038_400.0,
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_its_caller_abandons_is_recorded_as_cancelled() {
    let (app, _telemetry) = exporting_app().await;
    stock(&app, "SKU-1", 5).await;
    // A Reserve held inside its transaction, and its caller walks away (the stream is reset).
    let mut held = app.pauses.arm(PausePoint::OrderChecked);
    let mut client = app.client.clone();
    let call = tokio::spawn(async move { client.reserve(reserve("gone", &[("SKU-1", 1)])).await });
    held.reached().await;
    call.abort();
    let page = inventory_testkit::process::eventually_ok(
        "the abandoned call is recorded",
        Duration::from_secs(10),
        || async {
            let page = scrape(app.admin_addr.unwrap()).await;
            let cancelled = total(
                &page,
                "inventory_rpc_duration_seconds_count",
                &[
                    ("rpc_method", "/inventory.v1.InventoryService/Reserve"),
                    ("rpc_grpc_status_code", "Cancelled"),
                ],
            );
            if cancelled == 1.0 {
                Ok(page)
            } else {
                Err("not yet")
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        total(
            &page,
            "rpc_server_duration_milliseconds_count",
            &[("rpc_method", "Reserve"), ("rpc_grpc_status_code", "1")]
        ),
        1.0,
        "{page}"
    );
    held.resume();
}
