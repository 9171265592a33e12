//! Recording what the machine decided: the status (server-side apply of the whole status, which
//! the operator alone owns), the Events of the transitions, and the metrics of hook results and
//! phase changes. Also the pace at which status follows the Deployment between transitions
//! ([`Pace`]).

use super::error::Error;
use super::machine::{Decision, Note, ROLLOUT_STARTED, ROLLOUT_SUCCEEDED, phase_name};
use super::observe::DeploymentView;
use crate::api::{HookPoint, RolloutStrategy, RolloutStrategyStatus};
use crate::k8s::{ROLLOUT_STRATEGY_MANAGER, apply};
use crate::metrics::{HookLabels, Metrics, PhaseLabels};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Api, Resource, ResourceExt,
    runtime::events::{Event, EventType},
};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often at most the status is written only to follow the Deployment (its replica counts,
/// the generation taken up) between a revision's transitions, which are written at once. The
/// printer columns DESIRED, UPDATED and READY lag the Deployment by at most this much.
pub const FOLLOW_EVERY: Duration = Duration::from_secs(5);

/// When each strategy's status was last written, for [`FOLLOW_EVERY`].
#[derive(Debug, Default)]
pub struct Pace {
    last: Mutex<HashMap<String, Instant>>,
}

impl Pace {
    /// Records a status write of strategy `key` now.
    pub fn wrote(&self, key: &str) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.insert(key.to_string(), Instant::now());
    }

    /// How long until a status that only follows the Deployment may be written for `key`: zero
    /// when it may be now.
    pub fn wait(&self, key: &str) -> Duration {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.get(key)
            .map_or(Duration::ZERO, |t| FOLLOW_EVERY.saturating_sub(t.elapsed()))
    }

    /// Forgets strategy `key` (deleted).
    pub fn forget(&self, key: &str) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.remove(key);
    }
}

/// Writes `status`, only on the strategy at `resource_version` (a precondition: a status decided
/// on an older copy never replaces a newer one; 409, decided again). Returns the
/// resourceVersion written.
pub async fn write(
    api: &Api<RolloutStrategy>,
    name: &str,
    resource_version: Option<&str>,
    new: &RolloutStrategyStatus,
) -> Result<Option<String>, Error> {
    apply::apply_status_at(api, ROLLOUT_STRATEGY_MANAGER, name, resource_version, new)
        .await
        .map(|s| s.resource_version())
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 409 => Error::Conflict,
            e => Error::Status(e),
        })
}

/// Counts the hook results and the phase entered (if it changed).
pub fn count(metrics: &Metrics, old: &RolloutStrategyStatus, d: &Decision) {
    for r in &d.hook_results {
        let labels = HookLabels {
            point: point_label(r.point),
            result: r.result,
        };
        metrics.hook_runs.get_or_create(&labels).inc();
        metrics
            .hook_duration
            .get_or_create(&labels)
            .observe(r.seconds);
    }
    if let Some(p) = d.status.phase.filter(|p| old.phase != Some(*p)) {
        metrics
            .rollout_phases
            .get_or_create(&PhaseLabels {
                phase: phase_name(p),
            })
            .inc();
    }
}

fn point_label(p: HookPoint) -> &'static str {
    p.as_str()
}

/// Whether an Event goes on the Deployment too: a revision's start and end, and every warning.
/// The steps between (a hook started, a hook succeeded) are the strategy's story;
/// `kubectl describe deploy` tells which revisions ballast took up, and what went wrong.
pub fn on_deployment(n: &Note) -> bool {
    n.warning || [ROLLOUT_STARTED, ROLLOUT_SUCCEEDED].contains(&n.reason)
}

/// Publishes the Events of a decision on the strategy, and those [`on_deployment`] says on its
/// Deployment too, so that `kubectl describe deploy` tells the story of its revisions.
pub async fn publish(
    recorder: &crate::controller::events::Publisher,
    strategy: &RolloutStrategy,
    deployment: Option<&DeploymentView>,
    notes: &[Note],
) {
    let own = strategy.object_ref(&());
    let target = deployment.map(|d| ObjectReference {
        api_version: Some("apps/v1".into()),
        kind: Some("Deployment".into()),
        name: Some(d.name.clone()),
        namespace: strategy.metadata.namespace.clone(),
        uid: Some(d.uid.clone()),
        ..Default::default()
    });
    for n in notes {
        let refs = std::iter::once(&own).chain(target.as_ref().filter(|_| on_deployment(n)));
        let ev = Event {
            type_: if n.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: n.reason.into(),
            note: Some(n.message.chars().take(1000).collect()),
            action: "Rollout".into(),
            secondary: None,
        };
        for r in refs {
            if let Err(e) = recorder.publish(&ev, r).await {
                tracing::warn!(error = %e, reason = n.reason, "could not publish event");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(warning: bool, reason: &'static str) -> Note {
        Note {
            warning,
            reason,
            message: String::new(),
        }
    }

    #[test]
    fn the_deployment_hears_of_a_revisions_start_and_end_and_of_every_warning() {
        assert!(on_deployment(&note(false, ROLLOUT_STARTED)));
        assert!(on_deployment(&note(false, ROLLOUT_SUCCEEDED)));
        assert!(on_deployment(&note(true, "HookFailed")));
        assert!(on_deployment(&note(true, "RolledBack")));
        assert!(!on_deployment(&note(false, "HookStarted")));
        assert!(!on_deployment(&note(false, "HookSucceeded")));
    }

    #[test]
    fn status_follows_the_deployment_at_most_once_per_pace() {
        let p = Pace::default();
        assert_eq!(p.wait("ns/web"), Duration::ZERO, "never written: now");
        p.wrote("ns/web");
        let w = p.wait("ns/web");
        assert!(
            w > FOLLOW_EVERY - Duration::from_secs(1) && w <= FOLLOW_EVERY,
            "{w:?}"
        );
        assert_eq!(p.wait("ns/api"), Duration::ZERO);
        p.forget("ns/web");
        assert_eq!(p.wait("ns/web"), Duration::ZERO);
    }
}
