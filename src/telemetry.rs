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
//!   `/metrics` page and, when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `..._METRICS_ENDPOINT`) is
//!   set, the OTLP exporter. Each signal follows its own variable.

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

/// The signals exported over OTLP, each with the variable that names its own endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Signal {
    Traces,
    Metrics,
}

impl Signal {
    fn endpoint_variable(self) -> &'static str {
        match self {
            Self::Traces => "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            Self::Metrics => "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        }
    }
}

/// Where `signal` is exported, if anywhere: the configured endpoint, else the signal's own
/// variable, else `OTEL_EXPORTER_OTLP_ENDPOINT`, as the OpenTelemetry specification orders
/// them. A signal is exported only when one of them names an endpoint, so setting only
/// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` exports metrics and no traces.
fn otlp_endpoint(
    settings: &TelemetrySettings,
    signal: Signal,
    env: impl Fn(&str) -> Option<String>,
) -> Option<String> {
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return None;
    }
    settings.otlp_endpoint.clone().or_else(|| {
        [signal.endpoint_variable(), "OTEL_EXPORTER_OTLP_ENDPOINT"]
            .iter()
            .find_map(|name| env(name).filter(|v| !v.is_empty()))
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
    let env = |name: &str| std::env::var(name).ok();

    // Each exporter is given its endpoint explicitly: left to itself, the SDK would fall
    // back to localhost for a signal whose variable is unset.
    let tracer = match otlp_endpoint(settings, Signal::Traces, env) {
        Some(endpoint) => {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint);
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
    if let Some(endpoint) = otlp_endpoint(settings, Signal::Metrics, env) {
        let exporter = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(settings: Option<&str>, signal: Signal, vars: &[(&str, &str)]) -> Option<String> {
        let settings = TelemetrySettings {
            otlp_endpoint: settings.map(str::to_owned),
        };
        otlp_endpoint(&settings, signal, |name| {
            vars.iter()
                .find(|(key, _)| *key == name)
                .map(|(_, value)| (*value).to_owned())
        })
    }

    #[test]
    fn each_signal_is_exported_only_where_its_own_or_the_shared_variable_points() {
        let metrics_only = [("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:4317")];
        assert_eq!(
            endpoint(None, Signal::Metrics, &metrics_only).as_deref(),
            Some("http://m:4317")
        );
        assert_eq!(endpoint(None, Signal::Traces, &metrics_only), None);

        let traces_only = [("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://t:4317")];
        assert_eq!(endpoint(None, Signal::Metrics, &traces_only), None);
        assert_eq!(
            endpoint(None, Signal::Traces, &traces_only).as_deref(),
            Some("http://t:4317")
        );

        let both = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://shared:4317"),
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:4317"),
        ];
        assert_eq!(
            endpoint(None, Signal::Metrics, &both).as_deref(),
            Some("http://m:4317")
        );
        assert_eq!(
            endpoint(None, Signal::Traces, &both).as_deref(),
            Some("http://shared:4317")
        );
        assert_eq!(endpoint(None, Signal::Traces, &[]), None);
    }

    #[test]
    fn the_sdk_switch_and_the_configured_endpoint_win() {
        let disabled = [
            ("OTEL_SDK_DISABLED", "TRUE"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://shared:4317"),
        ];
        assert_eq!(endpoint(None, Signal::Metrics, &disabled), None);
        let set = [("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:4317")];
        assert_eq!(
            endpoint(Some("http://c:4317"), Signal::Metrics, &set).as_deref(),
            Some("http://c:4317")
        );
    }
}
