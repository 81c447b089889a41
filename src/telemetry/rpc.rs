//! The server span and the duration metrics of every call, named as OpenTelemetry's RPC
//! conventions name them, so tracing backends draw service graphs and error rates from them
//! and dashboards built for any gRPC server read them.
//!
//! - Span name `inventory.v1.InventoryService/Reserve`; attributes `rpc.system` = `grpc`,
//!   `rpc.service`, `rpc.method`, `rpc.grpc.status_code` (the number); span status `Error`
//!   for the codes that mean the server failed (UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED,
//!   INTERNAL, UNAVAILABLE, DATA_LOSS), unset otherwise: a refusal the caller caused is not
//!   an error of the server.
//! - A path that names no method this server serves is `_OTHER` in every name and label
//!   (with the path in `rpc.method_original` on the span only), so a scanner sending random
//!   paths cannot mint new series. Unauthenticated calls are recorded the same way: they name
//!   a known method or `_OTHER`.
//! - Metrics: `rpc.server.duration` (the convention's, in milliseconds, with `rpc.system`,
//!   `rpc.service`, `rpc.method`, `rpc.grpc.status_code`) and our own
//!   `inventory.rpc.duration` (seconds, by request path and status name), both from the same
//!   clock, and both with `caller`: a configured caller's name or `_OTHER` (see
//!   [`crate::access`]).

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::OnceLock,
    task,
    time::{Duration, Instant},
};

use opentelemetry::{
    KeyValue, global,
    propagation::Extractor,
    trace::{TraceContextExt as _, TraceId},
};
use prost::Message as _;
use tonic::{Code, codegen::http};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::access::{AccessLog, CallNote, Entry};

/// The value standing for any method this server does not serve.
pub const OTHER: &str = "_OTHER";

/// One method this server serves.
#[derive(Debug, PartialEq, Eq)]
pub struct Method {
    /// `/inventory.v1.InventoryService/Reserve`: the request path, our metric's label.
    pub path: String,
    /// `inventory.v1.InventoryService/Reserve`: the span name.
    pub full: String,
    /// `inventory.v1.InventoryService`.
    pub service: String,
    /// `Reserve`.
    pub name: String,
}

/// Services served besides the API, whose descriptors are not in `proto/`.
const OTHER_SERVICES: &[(&str, &[&str])] = &[
    // The internal peer port's (see `crate::peer`).
    ("inventory.peer.v2.PeerService", &["Reserve"]),
    ("grpc.health.v1.Health", &["Check", "Watch", "List"]),
    (
        "grpc.reflection.v1.ServerReflection",
        &["ServerReflectionInfo"],
    ),
    (
        "grpc.reflection.v1alpha.ServerReflection",
        &["ServerReflectionInfo"],
    ),
];

/// Every method served, by its HTTP/2 path (`/inventory.v1.InventoryService/Reserve`): the
/// API's from its descriptors, so a new RPC is recognised without a change here.
fn methods() -> &'static HashMap<String, Method> {
    static METHODS: OnceLock<HashMap<String, Method>> = OnceLock::new();
    METHODS.get_or_init(|| {
        let mut methods = HashMap::new();
        let mut add = |service: &str, name: &str| {
            let full = format!("{service}/{name}");
            methods.insert(
                format!("/{full}"),
                Method {
                    path: format!("/{full}"),
                    full,
                    service: service.to_owned(),
                    name: name.to_owned(),
                },
            );
        };
        let descriptors =
            prost_types::FileDescriptorSet::decode(inventory_proto::FILE_DESCRIPTOR_SET)
                .expect("the embedded descriptor set decodes");
        for file in &descriptors.file {
            for service in &file.service {
                let service_name = format!("{}.{}", file.package(), service.name());
                for method in &service.method {
                    add(&service_name, method.name());
                }
            }
        }
        for (service, names) in OTHER_SERVICES {
            for name in *names {
                add(service, name);
            }
        }
        methods
    })
}

/// The method a request path names, if this server serves it.
pub fn recognise(path: &str) -> Option<&'static Method> {
    methods().get(path)
}

/// Whether a status code means the server failed, by the convention's list for server spans.
pub fn is_server_error(code: Code) -> bool {
    matches!(
        code,
        Code::Unknown
            | Code::DeadlineExceeded
            | Code::Unimplemented
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss
    )
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

/// A tower layer that opens the server span of each call, continuing the caller's trace, and
/// records its duration, status code and caller, and its access-log line.
#[derive(Clone, Debug, Default)]
pub struct RpcLayer {
    access: Option<AccessLog>,
    /// The tenants served, which bound the `tenant` attribute.
    tenants: Option<crate::tenants::Tenants>,
}

impl RpcLayer {
    /// Calls are also written to `access`.
    pub fn with_access_log(access: Option<AccessLog>) -> Self {
        Self {
            access,
            tenants: None,
        }
    }

    /// The `tenant` attribute names these tenants, and `_OTHER` for any other.
    pub fn with_tenants(mut self, tenants: crate::tenants::Tenants) -> Self {
        self.tenants = Some(tenants);
        self
    }
}

impl<S> tower::Layer<S> for RpcLayer {
    type Service = RpcService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcService {
            inner,
            access: self.access.clone(),
            tenants: self.tenants.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct RpcService<S> {
    inner: S,
    access: Option<AccessLog>,
    tenants: Option<crate::tenants::Tenants>,
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

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        let method = recognise(request.uri().path());
        let note = CallNote::default();
        request.extensions_mut().insert(note.clone());
        let span = server_span(method);
        if method.is_none() {
            span.record("rpc.method_original", request.uri().path());
        }
        continue_trace(&span, request.headers());
        let future = self.inner.call(request);
        let mut call = Call {
            method,
            span: span.clone(),
            started: Instant::now(),
            done: false,
            note,
            access: self.access.clone(),
            tenants: self.tenants.clone(),
        };
        Box::pin(
            async move {
                let result = future.await;
                let (code, message) = match &result {
                    Ok(response) => status_of(response.headers()),
                    Err(_) => (Code::Unknown, None),
                };
                call.finish(code, message);
                result
            }
            .instrument(span),
        )
    }
}

/// One call being answered. Dropped unfinished (the caller cancelled, disconnected or ran
/// out of its deadline, and the server stopped answering), it is recorded as `CANCELLED`, so
/// the slowest calls are not the ones missing from the latency.
struct Call {
    method: Option<&'static Method>,
    span: tracing::Span,
    started: Instant,
    done: bool,
    note: CallNote,
    access: Option<AccessLog>,
    tenants: Option<crate::tenants::Tenants>,
}

impl Call {
    /// The call's tenant as a metric attribute: a served tenant's name, else `_OTHER` (also
    /// for a call whose caller was never identified).
    fn tenant_label(&self) -> String {
        match (self.note.tenant(), &self.tenants) {
            (Some(tenant), Some(tenants)) => tenants.label(&tenant),
            (Some(tenant), None) if tenant.is_default() => tenant.as_str().to_owned(),
            _ => crate::auth::OTHER_CALLERS.to_owned(),
        }
    }

    fn finish(&mut self, code: Code, message: Option<String>) {
        self.done = true;
        self.span.record("rpc.grpc.status_code", code as i64);
        if is_server_error(code) {
            self.span.record("otel.status_code", "error");
            self.span.record(
                "otel.status_description",
                message.unwrap_or_else(|| code.description().to_owned()),
            );
        }
        let took = self.started.elapsed();
        finished(
            self.method,
            code,
            took,
            &self.note.label(),
            &self.tenant_label(),
        );
        if let Some(access) = &self.access {
            let (full, name) = self
                .method
                .map_or((OTHER, OTHER), |m| (m.full.as_str(), m.name.as_str()));
            let context = self.span.context();
            let trace = context.span().span_context().trace_id();
            access.record(Entry {
                at: std::time::SystemTime::now(),
                caller: self.note.name(),
                method: full,
                name,
                code,
                took,
                note: self.note.clone(),
                trace_id: (trace != TraceId::INVALID).then(|| trace.to_string()),
            });
        }
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        if !self.done {
            self.finish(Code::Cancelled, None);
        }
    }
}

fn server_span(method: Option<&'static Method>) -> tracing::Span {
    let (full, service, name) = match method {
        Some(m) => (m.full.as_str(), m.service.as_str(), m.name.as_str()),
        None => (OTHER, OTHER, OTHER),
    };
    tracing::info_span!(
        "rpc",
        otel.name = full,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = name,
        rpc.method_original = tracing::field::Empty,
        rpc.grpc.status_code = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
    )
}

/// Makes the span a child of the caller's (W3C `traceparent`), and records the trace and span
/// ids as fields, so log lines inside the call carry them.
fn continue_trace(span: &tracing::Span, headers: &http::HeaderMap) {
    let parent = global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(headers)));
    let incoming = parent.span().span_context().clone();
    if incoming.is_valid() {
        let _ = span.set_parent(parent);
    }
    let context = span.context();
    let own = context.span().span_context().clone();
    let trace_id = if own.is_valid() {
        own.trace_id()
    } else {
        incoming.trace_id()
    };
    if trace_id != TraceId::INVALID {
        span.record("trace_id", trace_id.to_string());
    }
    if own.is_valid() {
        span.record("span_id", own.span_id().to_string());
    }
}

/// The status of a response whose headers carry one: a trailers-only answer, which is how
/// every error leaves. A success sends its status in the trailers: OK.
fn status_of(headers: &http::HeaderMap) -> (Code, Option<String>) {
    tonic::Status::from_header_map(headers).map_or((Code::Ok, None), |status| {
        (status.code(), Some(status.message().to_owned()))
    })
}

/// Milliseconds buckets of the convention's duration metric: 0.5 ms to 10 s.
const MILLISECOND_BUCKETS: &[f64] = &[
    0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0,
];

struct Instruments {
    ours: opentelemetry::metrics::Histogram<f64>,
    convention: opentelemetry::metrics::Histogram<f64>,
}

fn instruments() -> &'static Instruments {
    static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meter = global::meter("inventory-server");
        Instruments {
            ours: meter
                .f64_histogram("inventory.rpc.duration")
                .with_unit("s")
                .with_description("Time to answer a call, by method and status code")
                .with_boundaries(crate::metrics::LATENCY_BUCKETS.to_vec())
                .build(),
            convention: meter
                .f64_histogram("rpc.server.duration")
                .with_unit("ms")
                .with_description("Duration of inbound RPCs (OpenTelemetry RPC conventions)")
                .with_boundaries(MILLISECOND_BUCKETS.to_vec())
                .build(),
        }
    })
}

/// Records a finished call. Every label but the caller's borrows from the static method
/// table; the caller is a configured caller's name or `_OTHER` (see
/// [`crate::auth::Authenticator::label`]), so the series stay bounded.
fn finished(
    method: Option<&'static Method>,
    code: Code,
    took: Duration,
    caller: &str,
    tenant: &str,
) {
    let (path, service, name): (&'static str, &'static str, &'static str) = match method {
        Some(m) => (&m.path, &m.service, &m.name),
        None => (OTHER, OTHER, OTHER),
    };
    let instruments = instruments();
    instruments.ours.record(
        took.as_secs_f64(),
        &[
            // The request path, as before the conventions came in (dashboards and alerts
            // written against it keep working); `_OTHER` for a path that names no method.
            KeyValue::new("rpc.method", path),
            KeyValue::new("rpc.grpc.status_code", format!("{code:?}")),
            KeyValue::new("caller", caller.to_owned()),
            KeyValue::new("tenant", tenant.to_owned()),
        ],
    );
    instruments.convention.record(
        took.as_secs_f64() * 1000.0,
        &[
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("rpc.service", service),
            KeyValue::new("rpc.method", name),
            KeyValue::new("rpc.grpc.status_code", code as i64),
            KeyValue::new("caller", caller.to_owned()),
            KeyValue::new("tenant", tenant.to_owned()),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_api_method_is_recognised_from_the_descriptors() {
        let reserve = recognise("/inventory.v1.InventoryService/Reserve").unwrap();
        assert_eq!(reserve.full, "inventory.v1.InventoryService/Reserve");
        assert_eq!(reserve.service, "inventory.v1.InventoryService");
        assert_eq!(reserve.name, "Reserve");
        for path in [
            "/inventory.v1.InventoryService/ListStockMovements",
            "/inventory.v1.InventoryService/WatchEvents",
            "/grpc.health.v1.Health/Check",
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        ] {
            assert!(recognise(path).is_some(), "{path}");
        }
    }

    #[test]
    fn unknown_paths_are_not_methods() {
        for path in [
            "/",
            "/inventory.v1.InventoryService/Nope",
            "/inventory.v1.InventoryService/Reserve/extra",
            "/wp-login.php",
            "inventory.v1.InventoryService/Reserve",
        ] {
            assert!(recognise(path).is_none(), "{path}");
        }
    }

    #[test]
    fn server_errors_follow_the_convention() {
        for code in [
            Code::Unknown,
            Code::DeadlineExceeded,
            Code::Unimplemented,
            Code::Internal,
            Code::Unavailable,
            Code::DataLoss,
        ] {
            assert!(is_server_error(code), "{code:?}");
        }
        for code in [
            Code::Ok,
            Code::InvalidArgument,
            Code::NotFound,
            Code::FailedPrecondition,
            Code::Aborted,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::ResourceExhausted,
            Code::AlreadyExists,
            Code::Cancelled,
            Code::OutOfRange,
        ] {
            assert!(!is_server_error(code), "{code:?}");
        }
    }
}
