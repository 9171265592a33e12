//! A Deployment or StatefulSet as the SpreadPolicy controller sees it: only
//! the fields its decisions need, extracted once from the cached object.

use crate::api::spread_policy::WorkloadKind;
use k8s_openapi::api::{
    apps::v1::{Deployment, StatefulSet},
    core::v1::{Affinity, PodSpec, Toleration, TopologySpreadConstraint},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// Whether a workload is rolling out right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rollout {
    /// Every replica runs the current template.
    #[default]
    Complete,
    /// The controller has not caught up, or old pods are still being replaced.
    InProgress,
    /// The rollout cannot move on its own: paused, past its progress
    /// deadline, or an `OnDelete` StatefulSet.
    Stalled,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub resource_version: Option<String>,
    pub selector: LabelSelector,
    pub replicas: i32,
    pub affinity: Affinity,
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    pub tolerations: Vec<Toleration>,
    pub node_selector: BTreeMap<String, String>,
    pub rollout: Rollout,
}

impl Workload {
    /// `Deployment/web`, as messages name it.
    pub fn display(&self) -> String {
        format!("{:?}/{}", self.kind, self.name)
    }

    fn with_pod_spec(mut self, spec: Option<&PodSpec>) -> Self {
        if let Some(s) = spec {
            self.affinity = s.affinity.clone().unwrap_or_default();
            self.topology_spread_constraints =
                s.topology_spread_constraints.clone().unwrap_or_default();
            self.tolerations = s.tolerations.clone().unwrap_or_default();
            self.node_selector = s.node_selector.clone().unwrap_or_default();
        }
        self
    }

    pub fn from_deployment(d: &Deployment) -> Self {
        let spec = d.spec.as_ref();
        let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
        let base = Workload {
            kind: WorkloadKind::Deployment,
            name: d.name_any(),
            namespace: d.namespace().unwrap_or_default(),
            labels: d.labels().clone(),
            annotations: d.annotations().clone(),
            resource_version: d.resource_version(),
            selector: spec.map(|s| s.selector.clone()).unwrap_or_default(),
            replicas,
            rollout: deployment_rollout(d),
            ..Default::default()
        };
        base.with_pod_spec(spec.and_then(|s| s.template.spec.as_ref()))
    }

    pub fn from_stateful_set(s: &StatefulSet) -> Self {
        let spec = s.spec.as_ref();
        let base = Workload {
            kind: WorkloadKind::StatefulSet,
            name: s.name_any(),
            namespace: s.namespace().unwrap_or_default(),
            labels: s.labels().clone(),
            annotations: s.annotations().clone(),
            resource_version: s.resource_version(),
            selector: spec.map(|s| s.selector.clone()).unwrap_or_default(),
            replicas: spec.and_then(|s| s.replicas).unwrap_or(1),
            rollout: stateful_set_rollout(s),
            ..Default::default()
        };
        base.with_pod_spec(spec.and_then(|s| s.template.spec.as_ref()))
    }
}

/// `kubectl rollout status` semantics for a Deployment.
pub fn deployment_rollout(d: &Deployment) -> Rollout {
    let Some(spec) = &d.spec else {
        return Rollout::Complete;
    };
    let status = d.status.clone().unwrap_or_default();
    if status.observed_generation.unwrap_or(0) < d.metadata.generation.unwrap_or(0) {
        return Rollout::InProgress;
    }
    if spec.paused == Some(true) {
        return Rollout::Stalled;
    }
    let deadline_exceeded = status.conditions.iter().flatten().any(|c| {
        c.type_ == "Progressing"
            && c.status == "False"
            && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    });
    if deadline_exceeded {
        return Rollout::Stalled;
    }
    let want = spec.replicas.unwrap_or(1);
    let updated = status.updated_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    if updated < want || total > updated || available < updated {
        Rollout::InProgress
    } else {
        Rollout::Complete
    }
}

/// `kubectl rollout status` semantics for a StatefulSet.
pub fn stateful_set_rollout(s: &StatefulSet) -> Rollout {
    let Some(spec) = &s.spec else {
        return Rollout::Complete;
    };
    let status = s.status.clone().unwrap_or_default();
    if status.observed_generation.unwrap_or(0) < s.metadata.generation.unwrap_or(0) {
        return Rollout::InProgress;
    }
    let strategy = spec.update_strategy.as_ref();
    if strategy.and_then(|u| u.type_.as_deref()) == Some("OnDelete") {
        return Rollout::Stalled;
    }
    let want = spec.replicas.unwrap_or(1);
    let partition = strategy
        .and_then(|u| u.rolling_update.as_ref())
        .and_then(|r| r.partition)
        .unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    let ready = status.ready_replicas.unwrap_or(0);
    if partition > 0 {
        return if updated >= want - partition && ready >= want {
            Rollout::Complete
        } else {
            Rollout::InProgress
        };
    }
    if status.update_revision.is_some() && status.current_revision != status.update_revision
        || updated < want
        || ready < want
    {
        Rollout::InProgress
    } else {
        Rollout::Complete
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(status: serde_json::Value, generation: i64) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "generation": generation},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"spec": {"containers": []}}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_deployment_whose_controller_has_not_observed_the_change_is_rolling() {
        let d = deployment(
            json!({"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3}),
            2,
        );
        assert_eq!(deployment_rollout(&d), Rollout::InProgress);
    }

    #[test]
    fn a_deployment_with_old_pods_left_is_rolling() {
        let d = deployment(
            json!({"observedGeneration": 2, "replicas": 4, "updatedReplicas": 3, "availableReplicas": 3}),
            2,
        );
        assert_eq!(deployment_rollout(&d), Rollout::InProgress);
    }

    #[test]
    fn a_deployment_with_every_replica_updated_and_available_is_complete() {
        let d = deployment(
            json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3}),
            2,
        );
        assert_eq!(deployment_rollout(&d), Rollout::Complete);
    }

    #[test]
    fn a_deployment_past_its_progress_deadline_is_stalled() {
        let d = deployment(
            json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 0,
                   "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}),
            2,
        );
        assert_eq!(deployment_rollout(&d), Rollout::Stalled);
    }
}
