//! Recording what the machine decided: the status (server-side apply of the whole status, which
//! the operator alone owns), the Events of the transitions, and the metrics of hook results and
//! phase changes.

use super::error::Error;
use super::machine::{Decision, Note, phase_name};
use super::observe::DeploymentView;
use crate::api::{HookPoint, RolloutStrategy, RolloutStrategyStatus};
use crate::k8s::{ROLLOUT_STRATEGY_MANAGER, apply};
use crate::metrics::{HookLabels, Metrics, PhaseLabels};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Api, Resource,
    runtime::events::{Event, EventType},
};

/// Writes `status` unless it is what the strategy already has.
pub async fn write(
    api: &Api<RolloutStrategy>,
    name: &str,
    old: &RolloutStrategyStatus,
    new: &RolloutStrategyStatus,
) -> Result<bool, Error> {
    if old == new {
        return Ok(false);
    }
    apply::apply_status(api, ROLLOUT_STRATEGY_MANAGER, name, new)
        .await
        .map_err(Error::Status)?;
    Ok(true)
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

/// Publishes the Events of a decision on the strategy, and on its Deployment too, so that
/// `kubectl describe deploy` tells the story of its revisions.
pub async fn publish(
    recorder: &crate::controller::events::Publisher,
    strategy: &RolloutStrategy,
    deployment: Option<&DeploymentView>,
    notes: &[Note],
) {
    let mut refs = vec![strategy.object_ref(&())];
    if let Some(d) = deployment {
        refs.push(ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some("Deployment".into()),
            name: Some(d.name.clone()),
            namespace: strategy.metadata.namespace.clone(),
            uid: Some(d.uid.clone()),
            ..Default::default()
        });
    }
    for n in notes {
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
        for r in &refs {
            if let Err(e) = recorder.publish(&ev, r).await {
                tracing::warn!(error = %e, reason = n.reason, "could not publish event");
            }
        }
    }
}
