//! The manager's HTTP endpoints: `/metrics` (Prometheus text), `/healthz`
//! (the process is alive) and `/readyz` (it has reached the API server and
//! its controllers are running or it is a healthy standby).

use crate::metrics::Metrics;
use axum::{
    Router, extract::State, http::StatusCode, http::header, response::IntoResponse, routing::get,
};
use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

/// Shared with the rest of the manager: flip `ready` once it can serve.
#[derive(Clone)]
pub struct HttpState {
    pub metrics: Metrics,
    pub ready: Arc<AtomicBool>,
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(State(s): State<HttpState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
}

async fn readyz(State(s): State<HttpState>) -> impl IntoResponse {
    if s.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: HttpState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
}
