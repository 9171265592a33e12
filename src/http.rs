//! The manager's HTTP endpoints: `/metrics` (Prometheus text), `/healthz` (the manager is not
//! wedged: 500 once a watch has kept failing for longer than its limit, or once a controller
//! has stopped, so that kubelet restarts it) and `/readyz` (it has reached the API server and
//! its controllers are running or it is a healthy standby).

use crate::{health::Health, metrics::Metrics};
use axum::{
    Router, extract::State, http::StatusCode, http::header, response::IntoResponse, routing::get,
};
use std::{
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

/// Shared with the rest of the manager: flip `ready` once it can serve; set `failure` when a
/// part of the manager stopped for good.
#[derive(Clone)]
pub struct HttpState {
    pub metrics: Metrics,
    pub ready: Arc<AtomicBool>,
    /// The watches' record; `/healthz` fails when one has failed for longer than `stale_after`.
    pub health: Health,
    pub stale_after: Duration,
    /// The first fatal failure (a controller that stopped), if any.
    pub failure: Arc<OnceLock<String>>,
}

impl HttpState {
    /// `Err` with the reason when the manager is not healthy.
    pub fn healthy(&self) -> Result<(), String> {
        if let Some(f) = self.failure.get() {
            return Err(f.clone());
        }
        self.health.check(self.stale_after)
    }
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
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

async fn healthz(State(s): State<HttpState>) -> impl IntoResponse {
    match s.healthy() {
        Ok(()) => (StatusCode::OK, "ok".to_string()),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("unhealthy: {e}\n"),
        ),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> HttpState {
        HttpState {
            metrics: Metrics::default(),
            ready: Arc::default(),
            health: Health::default(),
            stale_after: Duration::from_millis(1),
            failure: Arc::default(),
        }
    }

    #[test]
    fn healthz_fails_on_a_stale_watch_and_on_a_stopped_controller() {
        let s = state();
        assert_eq!(s.healthy(), Ok(()));
        s.health.watch_failed("rollout-strategy/jobs");
        std::thread::sleep(Duration::from_millis(5));
        assert!(s.healthy().unwrap_err().contains("rollout-strategy/jobs"));
        s.health.watch_ok("rollout-strategy/jobs");
        assert_eq!(s.healthy(), Ok(()));
        let _ = s.failure.set("the spread-policy controller stopped".into());
        assert!(s.healthy().unwrap_err().contains("spread-policy"));
    }
}
