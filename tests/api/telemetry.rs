//! Traces reach an OTLP collector under the caller's trace; metrics show on `/metrics`.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::future::join_all;
use inventory_server::telemetry::{self, TelemetrySettings};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
    trace_service_server::{TraceService, TraceServiceServer},
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_stream::wrappers::TcpListenerStream;

use crate::{
    helpers::{fresh_database, spawn_app_with, test_settings},
    reservations::{reserve, stock},
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

// The exporters run on the runtime while shutdown blocks a thread: two workers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_spans_of_one_reserve_reach_the_collector_under_the_callers_trace() {
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

    // Flushes every finished span to the collector.
    tokio::task::spawn_blocking(move || telemetry.shutdown())
        .await
        .unwrap();
    let spans: Vec<_> = collector
        .0
        .lock()
        .unwrap()
        .iter()
        .flat_map(|export| &export.resource_spans)
        .flat_map(|resource| &resource.scope_spans)
        .flat_map(|scope| &scope.spans)
        .cloned()
        .collect();
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let ours: Vec<_> = spans
        .iter()
        .filter(|s| hex(&s.trace_id) == trace_id)
        .collect();
    let names: Vec<&str> = ours.iter().map(|s| s.name.as_str()).collect();
    let rpc = ours
        .iter()
        .find(|s| s.name == "/inventory.v1.InventoryService/Reserve")
        .unwrap_or_else(|| panic!("no RPC span in {names:?}"));
    assert_eq!(
        hex(&rpc.parent_span_id),
        parent_id,
        "continues the caller's span"
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

async fn scrape(addr: std::net::SocketAddr) -> String {
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
