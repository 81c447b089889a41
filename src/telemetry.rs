//! Logs, traces and metrics.
//!
//! - Logs: text or JSON lines (`LOG_FORMAT`), filtered by `RUST_LOG` (default `info`). JSON
//!   lines carry the current span, and with tracing on, its trace and span ids.
//! - Traces: the caller's W3C `traceparent` continues its trace (the propagator is set here;
//!   the SDK does not read `OTEL_PROPAGATORS`). Spans are exported over OTLP/gRPC when
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._TRACES_ENDPOINT`) is set, configured by the other
//!   standard `OTEL_*` variables. Export runs in the background: an unreachable collector
//!   never blocks serving.
//! - Metrics: one meter provider feeds both the Prometheus registry behind the admin
//!   `/metrics` page and, when an OTLP endpoint is set, the OTLP exporter.

use std::{future::Future, pin::Pin, task};

use opentelemetry::{
    global,
    propagation::Extractor,
    trace::{TraceContextExt as _, TracerProvider as _},
};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{
    Resource, metrics::SdkMeterProvider, propagation::TraceContextPropagator,
    trace::SdkTracerProvider,
};
use tonic::codegen::http;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::{EnvFilter, fmt, prelude::*};

use crate::config::LogFormat;

/// Where telemetry goes. `otlp_endpoint: None` means: as the `OTEL_*` variables say.
#[derive(Clone, Debug, Default)]
pub struct TelemetrySettings {
    pub otlp_endpoint: Option<String>,
}

/// Keeps the providers alive; [`Telemetry::shutdown`] flushes what is still buffered.
#[derive(Debug)]
pub struct Telemetry {
    tracer: Option<SdkTracerProvider>,
    meter: SdkMeterProvider,
    registry: prometheus::Registry,
}

impl Telemetry {
    /// The Prometheus registry behind `/metrics`.
    pub fn registry(&self) -> &prometheus::Registry {
        &self.registry
    }

    pub fn shutdown(self) {
        if let Some(tracer) = self.tracer {
            let _ = tracer.shutdown();
        }
        let _ = self.meter.shutdown();
    }
}

fn otlp_endpoint(settings: &TelemetrySettings) -> Option<String> {
    if std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true")) {
        return None;
    }
    settings.otlp_endpoint.clone().or_else(|| {
        [
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        ]
        .iter()
        .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    })
}

fn resource() -> Resource {
    let builder = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
        builder.build()
    } else {
        builder.with_service_name("inventory-server").build()
    }
}

/// Installs the global subscriber, propagator and providers. Call once per process.
pub fn init(format: LogFormat, settings: &TelemetrySettings) -> anyhow::Result<Telemetry> {
    global::set_text_map_propagator(TraceContextPropagator::new());
    let endpoint = otlp_endpoint(settings);

    let tracer = match &endpoint {
        Some(endpoint) => {
            let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            if settings.otlp_endpoint.is_some() {
                exporter = exporter.with_endpoint(endpoint.clone());
            }
            Some(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter.build()?)
                    .with_resource(resource())
                    .build(),
            )
        }
        None => None,
    };

    let registry = prometheus::Registry::new();
    let mut meter = SdkMeterProvider::builder()
        .with_resource(resource())
        .with_reader(
            opentelemetry_prometheus::exporter()
                .with_registry(registry.clone())
                .build()?,
        );
    if let Some(endpoint) = &endpoint {
        let mut exporter = opentelemetry_otlp::MetricExporter::builder().with_tonic();
        if settings.otlp_endpoint.is_some() {
            exporter = exporter.with_endpoint(endpoint.clone());
        }
        meter = meter.with_periodic_exporter(exporter.build()?);
    }
    let meter = meter.build();
    global::set_meter_provider(meter.clone());

    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let otel = tracer.as_ref().map(|provider| {
        tracing_opentelemetry::layer().with_tracer(provider.tracer("inventory-server"))
    });
    let registry_layers = tracing_subscriber::registry().with(filter).with(otel);
    let installed = match format {
        // Colour only on a terminal: a log file or a collector gets plain text.
        LogFormat::Text => registry_layers
            .with(
                fmt::layer()
                    .with_target(false)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout())),
            )
            .try_init(),
        LogFormat::Json => registry_layers
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(true)
                    .with_span_list(false),
            )
            .try_init(),
    };
    if installed.is_err() {
        tracing::debug!("a global subscriber was already installed");
    }
    Ok(Telemetry {
        tracer,
        meter,
        registry,
    })
}

/// Reads W3C trace context from HTTP/2 headers (gRPC metadata).
struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// A tower layer that opens the span of each call, continuing the caller's trace, and records
/// its duration and status code.
#[derive(Clone, Debug, Default)]
pub struct RpcLayer;

impl<S> tower::Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcService { inner }
    }
}

#[derive(Clone, Debug)]
pub struct RpcService<S> {
    inner: S,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, R> tower::Service<http::Request<B>> for RpcService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut task::Context<'_>) -> task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.uri().path().to_owned();
        let parent =
            global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(request.headers())));
        let span = tracing::info_span!(
            "rpc",
            otel.name = %method,
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.method = %method,
            rpc.grpc.status_code = tracing::field::Empty,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
        );
        let incoming = parent.span().span_context().clone();
        if incoming.is_valid() {
            let _ = span.set_parent(parent);
        }
        // Log lines inside the call carry the ids (JSON logs print the current span's fields).
        let context = span.context();
        let own = context.span().span_context().clone();
        let trace_id = if own.is_valid() {
            own.trace_id()
        } else {
            incoming.trace_id()
        };
        if trace_id != opentelemetry::trace::TraceId::INVALID {
            span.record("trace_id", trace_id.to_string());
        }
        if own.is_valid() {
            span.record("span_id", own.span_id().to_string());
        }
        let started = std::time::Instant::now();
        let future = self.inner.call(request);
        Box::pin(
            async move {
                let result = future.await;
                let code = match &result {
                    // A status in the headers is a trailers-only answer: an error. Success
                    // sends its status in the trailers.
                    Ok(response) => response
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<i32>().ok())
                        .unwrap_or(0),
                    Err(_) => 2,
                };
                let code = tonic::Code::from_i32(code);
                tracing::Span::current().record("rpc.grpc.status_code", format!("{code:?}"));
                crate::metrics::rpc_finished(&method, code, started.elapsed());
                result
            }
            .instrument(span),
        )
    }
}
