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

/// Reconciles that write take turns, first come first served, at most `n` at once.
///
/// kube-runtime's own limit (`Config::concurrency`) is not fair: once every slot is busy, the
/// objects triggered meanwhile wait in a hash set, and a freed slot goes to the first of them
/// in that set's order, not to the one that waited longest. An object late in that order waits
/// for as long as others keep being triggered: under a steady stream of watch events (a few
/// dozen strategies rolling out at once) that was up to 88 s for a completed hook Job to be
/// acted on (docs/benchmarks.md). So a controller runs with kube-runtime's limit off, decides
/// on its caches at once (no request: most reconciles end there), and only a reconcile that
/// writes waits for a turn here: a FIFO semaphore (tokio's is fair), so every object is served
/// in the order it asked.
pub struct Turns {
    permits: tokio::sync::Semaphore,
}

impl Turns {
    pub fn new(n: usize) -> Self {
        Self {
            permits: tokio::sync::Semaphore::new(n),
        }
    }

    /// Waits for a turn; it ends when the permit is dropped.
    pub async fn take(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.permits
            .acquire()
            .await
            .expect("the semaphore is never closed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{
        controller::{Config, applier},
        reflector::{self, ObjectRef},
        watcher,
    };
    use std::{collections::BTreeMap, sync::Arc};

    #[derive(Debug, thiserror::Error)]
    #[error("never")]
    struct Never;

    const OBJECTS: usize = 8;
    const AT_ONCE: usize = 2;
    const RECONCILES: usize = 400;

    /// Reconciles of `OBJECTS` objects that each take 2 ms and ask to be reconciled again at
    /// once (as a strategy does while its Deployment rolls out), `AT_ONCE` at a time, limited by
    /// kube-runtime (`fair: false`) or by [`Turns`]; how many each object got of the first
    /// `RECONCILES`.
    async fn served(fair: bool) -> Vec<usize> {
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for i in 0..OBJECTS {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(format!("o{i}"));
            cm.metadata.namespace = Some("ns".into());
            writer.apply_watcher_event(&watcher::Event::InitApply(cm));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let counts = Arc::new(std::sync::Mutex::new(BTreeMap::<String, usize>::new()));
        let turns = Arc::new(Turns::new(AT_ONCE));
        let queue = futures::stream::iter(
            (0..OBJECTS).map(|i| Ok::<_, Never>(ObjectRef::new(&format!("o{i}")).within("ns"))),
        )
        .chain(futures::stream::pending());
        let config = Config::default().concurrency(if fair { 0 } else { AT_ONCE as u16 });
        let reconciles = {
            let counts = counts.clone();
            move |cm: Arc<ConfigMap>, turns: Arc<Turns>| {
                let counts = counts.clone();
                Box::pin(async move {
                    let _turn = if fair { Some(turns.take().await) } else { None };
                    *counts
                        .lock()
                        .unwrap()
                        .entry(cm.metadata.name.clone().unwrap())
                        .or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    Ok::<_, Never>(Action::requeue(Duration::ZERO))
                })
            }
        };
        applier(
            reconciles,
            |_, _, _| Action::await_change(),
            turns,
            store,
            queue,
            config,
        )
        .take(RECONCILES)
        .for_each(|_| async {})
        .await;
        let counts = counts.lock().unwrap();
        (0..OBJECTS)
            .map(|i| counts.get(&format!("o{i}")).copied().unwrap_or(0))
            .collect()
    }

    #[tokio::test]
    async fn a_saturated_controller_serves_every_object_in_turn() {
        let fair = served(true).await;
        let least = *fair.iter().min().unwrap();
        let most = *fair.iter().max().unwrap();
        assert!(
            most - least <= 2,
            "every object gets its turn with Turns: {fair:?}"
        );
        // What Turns is for: kube-runtime's own limit lets some objects wait while others are
        // reconciled again and again. (When this fails, kube-runtime became fair: Turns may go.)
        let unfair = served(false).await;
        assert!(
            unfair.iter().min() < Some(&(RECONCILES / OBJECTS / 4)),
            "kube-runtime's limit starves some: {unfair:?}"
        );
    }
}
