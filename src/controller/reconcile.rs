//! What a reconcile of either controller shares around its own steps: the metric guard (every
//! reconcile counted and timed), the error policy with per-object backoff, and one "stale"
//! outcome (a read or write that lost a race: retried soon, never backed off, since the newer
//! object is already on its way). Each controller's folder then reads the same way:
//! read → decide (pure) → write → record, with this around it.

use super::backoff::Backoff;
use crate::metrics::Metrics;
use kube::{ResourceExt, runtime::controller::Action};
use std::time::{Duration, Instant};

/// How soon a stale outcome is looked at again.
pub const STALE_RETRY: Duration = Duration::from_millis(500);

/// An error of a controller's reconcile, as the shared error policy needs it.
pub trait ReconcileError: std::fmt::Display {
    /// CamelCase reason, for metrics and logs.
    fn reason(&self) -> &'static str;
    /// Whether it is the stale outcome (see the module docs).
    fn is_stale(&self) -> bool;
}

/// The key of an object in the backoff: `namespace/name`.
pub fn key<K: ResourceExt>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

/// Counts, times and backs off the reconciles of one controller.
pub struct Outcomes {
    controller: &'static str,
    metrics: Metrics,
    backoff: Backoff,
}

impl Outcomes {
    pub fn new(controller: &'static str, metrics: Metrics) -> Self {
        Self {
            controller,
            metrics,
            backoff: Backoff::default(),
        }
    }

    /// Runs one reconcile of the object with `key`: counts it and its duration, and on success
    /// starts its backoff over.
    pub async fn run<E>(
        &self,
        key: &str,
        reconcile: impl Future<Output = Result<Action, E>>,
    ) -> Result<Action, E> {
        let start = Instant::now();
        let result = reconcile.await;
        self.metrics
            .count_reconcile(self.controller, start.elapsed().as_secs_f64());
        if result.is_ok() {
            self.backoff.succeeded(key);
        }
        result
    }

    /// The error policy: counts the error; the stale outcome is looked at again after
    /// [`STALE_RETRY`], any other after the object's backoff (1 s doubling to 5 min).
    pub fn on_error<E: ReconcileError>(&self, key: &str, err: &E) -> Action {
        self.metrics.count_error(self.controller, err.reason());
        if err.is_stale() {
            tracing::debug!(controller = self.controller, object = key, error = %err, "stale; looking again soon");
            return Action::requeue(STALE_RETRY);
        }
        let delay = self.backoff.failed(key);
        tracing::warn!(controller = self.controller, object = key, error = %err, reason = err.reason(), retry_in = ?delay, "reconcile failed");
        Action::requeue(delay)
    }
}
