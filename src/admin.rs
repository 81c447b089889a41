//! The admin HTTP port (`ADMIN_LISTEN_ADDR`, plaintext): `/metrics` in the Prometheus text
//! format, for scrapers that do not take OTLP. Nothing else is served there.

use axum::{Router, extract::State, http::header, response::IntoResponse, routing::get};
use prometheus::{Encoder as _, TextEncoder};
use tokio::net::TcpListener;

async fn metrics(State(registry): State<prometheus::Registry>) -> impl IntoResponse {
    let mut body = Vec::new();
    let encoder = TextEncoder::new();
    if let Err(error) = encoder.encode(&registry.gather(), &mut body) {
        tracing::warn!(%error, "cannot encode metrics");
    }
    (
        [(header::CONTENT_TYPE, encoder.format_type().to_owned())],
        body,
    )
}

/// Serves until `stop` completes.
pub async fn serve(
    listener: TcpListener,
    registry: prometheus::Registry,
    stop: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .with_state(registry);
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await
}
