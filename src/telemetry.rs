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

mod rpc;

pub use rpc::{Method, OTHER, RpcLayer, RpcService, is_server_error, recognise};

use opentelemetry::{global, trace::TracerProvider as _};
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::{
    Resource, metrics::SdkMeterProvider, propagation::TraceContextPropagator,
    trace::SdkTracerProvider,
};
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
    // CPU, memory, open files and threads of this process (Linux), as `process_*`.
    #[cfg(target_os = "linux")]
    registry.register(Box::new(
        prometheus::process_collector::ProcessCollector::for_self(),
    ))?;
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
