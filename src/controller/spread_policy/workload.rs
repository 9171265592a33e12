//! A Deployment or StatefulSet as the SpreadPolicy controller sees it: only
//! the fields its decisions need, extracted once from the cached object.
//!
//! Whether a workload is rolling out decides pacing, so it follows what the
//! workload's own controller says rather than its health: a rollout is under
//! way until every replica runs the current template (paused ones included,
//! since a paused Deployment with a new template has not rolled it out). A
//! workload that completed its rollout and lost availability afterwards (a
//! scale-up into an infeasible spread, crashing pods) is not rolling out.

use super::plan::ANNOTATION_TERMS;
use crate::api::spread_policy::WorkloadKind;
use crate::k8s::compact::StrMap;
use jiff::Timestamp;
use k8s_openapi::api::{
    apps::v1::{Deployment, StatefulSet},
    core::v1::{Affinity, PodSpec, PodTemplateSpec, Toleration, TopologySpreadConstraint},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::ResourceExt;
use std::{collections::BTreeMap, sync::Arc, time::Duration};

/// How long a workload may go without progress and still count as rolling
/// out when it names no progress deadline of its own (StatefulSets; the
/// Deployment default is the same).
pub const DEFAULT_PROGRESS_DEADLINE: Duration = Duration::from_secs(600);
/// The longest a workload counts as rolling out without progress, whatever
/// its `progressDeadlineSeconds` (which may be "never"): every wait has a bound.
pub const MAX_PROGRESS_DEADLINE: Duration = Duration::from_secs(3600);

/// Added to a workload's own deadline before it stops counting as rolling
/// out, so that its controller has said so first (`ProgressDeadlineExceeded`)
/// and anyone watching both never sees ballast move on while the workload
/// still claims to be progressing.
pub const BOUND_GRACE: Duration = Duration::from_secs(5);

/// The Deployment condition reason that says its latest rollout completed.
const NEW_RS_AVAILABLE: &str = "NewReplicaSetAvailable";

/// Whether a workload is rolling out right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rollout {
    /// Every replica runs the current template (whether or not all are available).
    #[default]
    Complete,
    /// The controller has not caught up, old pods are still being replaced,
    /// or a paused Deployment has a template it has not rolled out yet.
    InProgress,
    /// The rollout is not moving on its own: past its progress deadline, an
    /// `OnDelete` StatefulSet, or without progress for longer than ballast
    /// waits (see [`bound`]).
    Stalled,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub name: String,
    pub namespace: String,
    pub uid: Option<String>,
    pub generation: Option<i64>,
    /// Being deleted: nothing is written to it and it holds up nothing.
    pub deleting: bool,
    pub labels: StrMap,
    /// ballast's annotations only (`ballast.dev/`): no decision reads another.
    pub annotations: StrMap,
    /// The record of ballast's terms in the pod template (`ballast.dev/spread-terms`
    /// on `spec.template.metadata`): it travels with the template through
    /// `kubectl rollout undo` and rollbacks, so it always describes the terms
    /// of the template it sits in.
    pub record: Option<String>,
    pub resource_version: Option<String>,
    pub selector: PodSelector,
    pub replicas: i32,
    pub affinity: Affinity,
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    pub tolerations: Vec<Toleration>,
    pub node_selector: StrMap,
    pub rollout: Rollout,
    /// The last progress the workload's controller reported (a Deployment's
    /// `Progressing` condition), once it has observed the current generation.
    pub progress_at: Option<Timestamp>,
    /// How long without progress the rollout still counts as under way.
    pub progress_deadline: Duration,
    /// The workload's controller has not observed its current generation yet: its status
    /// still describes the spec before the last change.
    pub unobserved: bool,
    /// A hash of the whole pod template: the controller tells a change of the template (a
    /// rollout) from any other change of the spec (a scale) by it (see `tracker.rs`).
    pub template_hash: u64,
}

impl Workload {
    /// `Deployment/web`, as messages name it.
    pub fn display(&self) -> String {
        format!("{:?}/{}", self.kind, self.name)
    }

    fn with_template(mut self, template: Option<&PodTemplateSpec>) -> Self {
        let Some(t) = template else { return self };
        self.template_hash = crate::k8s::digest::json(t);
        self.record = t
            .metadata
            .as_ref()
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(ANNOTATION_TERMS))
            .cloned();
        if let Some(s) = t.spec.as_ref() {
            self = self.with_pod_spec(s);
        }
        self
    }

    fn with_pod_spec(mut self, s: &PodSpec) -> Self {
        self.affinity = s.affinity.clone().unwrap_or_default();
        self.topology_spread_constraints =
            s.topology_spread_constraints.clone().unwrap_or_default();
        self.tolerations = s.tolerations.clone().unwrap_or_default();
        self.node_selector = s
            .node_selector
            .as_ref()
            .map(StrMap::from)
            .unwrap_or_default();
        self
    }

    pub fn from_deployment(d: &Deployment) -> Self {
        let spec = d.spec.as_ref();
        let replicas = spec.and_then(|s| s.replicas).unwrap_or(1);
        let deadline = spec
            .and_then(|s| s.progress_deadline_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map_or(DEFAULT_PROGRESS_DEADLINE, Duration::from_secs);
        let base = Workload {
            kind: WorkloadKind::Deployment,
            name: d.name_any(),
            namespace: d.namespace().unwrap_or_default(),
            uid: d.uid(),
            generation: d.metadata.generation,
            deleting: d.metadata.deletion_timestamp.is_some(),
            labels: d.labels().into(),
            annotations: ours(d.annotations()),
            resource_version: d.resource_version(),
            selector: spec.map(|s| (&s.selector).into()).unwrap_or_default(),
            replicas,
            rollout: deployment_rollout(d),
            unobserved: !observed_current(
                d.metadata.generation,
                d.status.as_ref().and_then(|s| s.observed_generation),
            ),
            progress_at: deployment_progress_at(d),
            progress_deadline: deadline.min(MAX_PROGRESS_DEADLINE),
            ..Default::default()
        };
        base.with_template(spec.map(|s| &s.template))
    }

    pub fn from_stateful_set(s: &StatefulSet) -> Self {
        let spec = s.spec.as_ref();
        let base = Workload {
            kind: WorkloadKind::StatefulSet,
            name: s.name_any(),
            namespace: s.namespace().unwrap_or_default(),
            uid: s.uid(),
            generation: s.metadata.generation,
            deleting: s.metadata.deletion_timestamp.is_some(),
            labels: s.labels().into(),
            annotations: ours(s.annotations()),
            resource_version: s.resource_version(),
            selector: spec.map(|s| (&s.selector).into()).unwrap_or_default(),
            replicas: spec.and_then(|s| s.replicas).unwrap_or(1),
            rollout: stateful_set_rollout(s),
            unobserved: !observed_current(
                s.metadata.generation,
                s.status.as_ref().and_then(|s| s.observed_generation),
            ),
            progress_deadline: DEFAULT_PROGRESS_DEADLINE,
            ..Default::default()
        };
        base.with_template(spec.map(|s| &s.template))
    }
}

/// ballast's annotations of `all`.
fn ours(all: &BTreeMap<String, String>) -> StrMap {
    all.iter().filter(|(k, _)| is_ours(k)).collect()
}

/// An annotation of ballast's (`ballast.dev/`): the only ones a view keeps.
pub fn is_ours(annotation: &str) -> bool {
    annotation.starts_with("ballast.dev/")
}

/// A workload's `spec.selector`, kept compact ([`StrMap`]): it becomes the label selector of
/// the terms ballast writes ([`PodSelector::to_label_selector`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodSelector {
    pub match_labels: StrMap,
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

impl PodSelector {
    /// The selector as the API writes it (`matchLabels` and `matchExpressions` left out when
    /// empty, as they were read).
    pub fn to_label_selector(&self) -> LabelSelector {
        LabelSelector {
            match_labels: (!self.match_labels.is_empty()).then(|| self.match_labels.to_btree()),
            match_expressions: (!self.match_expressions.is_empty())
                .then(|| self.match_expressions.clone()),
        }
    }
}

impl From<&LabelSelector> for PodSelector {
    fn from(s: &LabelSelector) -> Self {
        Self {
            match_labels: s
                .match_labels
                .as_ref()
                .map(StrMap::from)
                .unwrap_or_default(),
            match_expressions: s.match_expressions.clone().unwrap_or_default(),
        }
    }
}

fn observed_current(generation: Option<i64>, observed: Option<i64>) -> bool {
    observed.unwrap_or(0) >= generation.unwrap_or(0)
}

/// When the Deployment's controller last saw progress (or paused or resumed
/// it): the `lastUpdateTime` of its `Progressing` condition, once the status
/// describes the current generation (before that it describes the last rollout).
fn deployment_progress_at(d: &Deployment) -> Option<Timestamp> {
    let status = d.status.as_ref()?;
    if !observed_current(d.metadata.generation, status.observed_generation) {
        return None;
    }
    status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Progressing")
        .and_then(|c| c.last_update_time.as_ref())
        .map(|t| t.0)
}

/// Whether a Deployment is rolling out: `kubectl rollout status`, except that
/// a paused Deployment with a template it has not rolled out is rolling out
/// (a RolloutStrategy holds it paused while its hooks run), and a rollout that
/// completed does not start again when pods become unavailable later.
pub fn deployment_rollout(d: &Deployment) -> Rollout {
    let Some(spec) = &d.spec else {
        return Rollout::Complete;
    };
    let status = d.status.clone().unwrap_or_default();
    if !observed_current(d.metadata.generation, status.observed_generation) {
        return Rollout::InProgress;
    }
    let progressing = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Progressing");
    if progressing.is_some_and(|c| {
        c.status == "False" && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
    }) {
        return Rollout::Stalled;
    }
    let want = spec.replicas.unwrap_or(1);
    let updated = status.updated_replicas.unwrap_or(0);
    let total = status.replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    if total > updated {
        return Rollout::InProgress;
    }
    // Every pod runs the current template. The Deployment controller says
    // `NewReplicaSetAvailable` once that rollout completed, and keeps saying
    // it through what comes later without a new template: pods that become
    // unavailable, and a scale, whose status shows fewer updated replicas
    // than wanted until the ReplicaSet's new pods are counted. Neither is a
    // rollout. (A new template is never observed with that reason: the
    // controller replaces it when it creates the new ReplicaSet, before it
    // records the new generation as observed.)
    let completed = progressing.is_some_and(|c| c.reason.as_deref() == Some(NEW_RS_AVAILABLE));
    if completed || (updated >= want && available >= updated) {
        Rollout::Complete
    } else {
        Rollout::InProgress
    }
}

/// Whether a StatefulSet is rolling out. Its controller moves
/// `currentRevision` to `updateRevision` once every replica is updated and
/// ready; after that, a replica that stops being ready is not a rollout.
pub fn stateful_set_rollout(s: &StatefulSet) -> Rollout {
    let Some(spec) = &s.spec else {
        return Rollout::Complete;
    };
    let status = s.status.clone().unwrap_or_default();
    if !observed_current(s.metadata.generation, status.observed_generation) {
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
        return if updated >= want.saturating_sub(partition) && ready >= want {
            Rollout::Complete
        } else {
            Rollout::InProgress
        };
    }
    if status.update_revision.is_some() && status.current_revision != status.update_revision
        || updated < want
    {
        Rollout::InProgress
    } else {
        Rollout::Complete
    }
}

/// Bounds how long `w` counts as rolling out: at most its progress deadline
/// (plus [`BOUND_GRACE`]) past the later of its last reported progress and
/// `first_seen` (when the controller first saw this rollout under way). Past that, the rollout is
/// [`Rollout::Stalled`] and holds up nothing. Returns how long until that
/// happens, while it is still ahead. Pure: the caller supplies the clock. The shared view is
/// copied only when it is marked stalled.
pub fn bound(w: &mut Arc<Workload>, first_seen: Timestamp, now: Timestamp) -> Option<Duration> {
    if w.rollout != Rollout::InProgress {
        return None;
    }
    let since = w.progress_at.map_or(first_seen, |p| p.max(first_seen));
    let deadline = jiff::SignedDuration::try_from(w.progress_deadline + BOUND_GRACE)
        .unwrap_or(jiff::SignedDuration::MAX);
    let until = since.checked_add(deadline).unwrap_or(Timestamp::MAX);
    if now >= until {
        Arc::make_mut(w).rollout = Rollout::Stalled;
        return None;
    }
    Duration::try_from(until.duration_since(now)).ok()
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

    fn paused(mut d: Deployment) -> Deployment {
        d.spec.as_mut().unwrap().paused = Some(true);
        d
    }

    fn progressing(reason: &str, at: &str) -> serde_json::Value {
        json!([{"type": "Progressing", "status": "True", "reason": reason, "lastUpdateTime": at}])
    }

    #[test]
    fn a_paused_deployment_with_a_template_not_rolled_out_is_rolling() {
        // What a RolloutStrategy's gate leaves while the pre hooks run: the
        // new template has no ReplicaSet yet.
        let d = paused(deployment(
            json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 0, "availableReplicas": 3,
                   "conditions": [{"type": "Progressing", "status": "Unknown", "reason": "DeploymentPaused"}]}),
            2,
        ));
        assert_eq!(deployment_rollout(&d), Rollout::InProgress);
    }

    #[test]
    fn a_paused_deployment_at_rest_is_complete() {
        let d = paused(deployment(
            json!({"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3}),
            2,
        ));
        assert_eq!(deployment_rollout(&d), Rollout::Complete);
    }

    #[test]
    fn a_completed_rollout_that_lost_availability_is_not_rolling() {
        // Scaled from 3 to 5 into a required spread over 3 zones: 2 Pending.
        let d = deployment(
            json!({"observedGeneration": 3, "replicas": 5, "updatedReplicas": 5, "availableReplicas": 3,
                   "conditions": progressing("NewReplicaSetAvailable", "2026-01-01T00:00:00Z")}),
            3,
        );
        let mut d = d;
        d.spec.as_mut().unwrap().replicas = Some(5);
        assert_eq!(deployment_rollout(&d), Rollout::Complete);
        // The same counts while the last new pods are still starting are a rollout.
        let mut starting = d.clone();
        starting.status.as_mut().unwrap().conditions =
            serde_json::from_value(progressing("ReplicaSetUpdated", "2026-01-01T00:00:00Z"))
                .unwrap();
        assert_eq!(deployment_rollout(&starting), Rollout::InProgress);
    }

    #[test]
    fn a_scale_of_a_completed_rollout_is_not_rolling() {
        // The Deployment controller records the new generation of a scale
        // before the ReplicaSet's new pods are counted: for a moment, fewer
        // updated replicas than wanted, and the rollout still complete.
        let mut d = deployment(
            json!({"observedGeneration": 3, "replicas": 3, "updatedReplicas": 3, "availableReplicas": 3,
                   "conditions": progressing("NewReplicaSetAvailable", "2026-01-01T00:00:00Z")}),
            3,
        );
        d.spec.as_mut().unwrap().replicas = Some(5);
        assert_eq!(deployment_rollout(&d), Rollout::Complete);
        // The same counts in a rollout that has not completed are a rollout.
        let mut rolling = d.clone();
        rolling.status.as_mut().unwrap().conditions =
            serde_json::from_value(progressing("ReplicaSetUpdated", "2026-01-01T00:00:00Z"))
                .unwrap();
        assert_eq!(deployment_rollout(&rolling), Rollout::InProgress);
    }

    #[test]
    fn progress_is_read_only_once_the_current_generation_is_observed() {
        let cond = progressing("ReplicaSetUpdated", "2026-01-01T00:10:00Z");
        let d = deployment(json!({"observedGeneration": 2, "conditions": cond}), 2);
        assert_eq!(
            deployment_progress_at(&d),
            Some("2026-01-01T00:10:00Z".parse().unwrap())
        );
        let behind = deployment(json!({"observedGeneration": 1, "conditions": cond}), 2);
        assert_eq!(deployment_progress_at(&behind), None);
    }

    fn rolling(progress_at: Option<&str>) -> Workload {
        Workload {
            rollout: Rollout::InProgress,
            progress_at: progress_at.map(|t| t.parse().unwrap()),
            progress_deadline: Duration::from_secs(600),
            ..Default::default()
        }
    }

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_rollout_without_progress_stops_counting_after_its_deadline() {
        let first = t("2026-01-01T00:00:00Z");
        let mut w = Arc::new(rolling(None));
        assert_eq!(
            bound(&mut w, first, t("2026-01-01T00:09:00Z")),
            Some(Duration::from_secs(65))
        );
        assert_eq!(w.rollout, Rollout::InProgress);
        assert_eq!(bound(&mut w, first, t("2026-01-01T00:10:05Z")), None);
        assert_eq!(w.rollout, Rollout::Stalled);
    }

    #[test]
    fn reported_progress_extends_the_bound_and_an_old_one_does_not_shorten_it() {
        let first = t("2026-01-01T00:00:00Z");
        let mut moving = Arc::new(rolling(Some("2026-01-01T00:08:00Z")));
        assert_eq!(
            bound(&mut moving, first, t("2026-01-01T00:12:00Z")),
            Some(Duration::from_secs(365))
        );
        // A Deployment paused days ago: its condition is old, the wait starts
        // when the controller first saw the rollout.
        let mut old = Arc::new(rolling(Some("2025-06-01T00:00:00Z")));
        assert!(bound(&mut old, first, t("2026-01-01T00:01:00Z")).is_some());
        assert_eq!(old.rollout, Rollout::InProgress);
    }

    #[test]
    fn the_progress_deadline_is_capped() {
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "generation": 1},
            "spec": {"progressDeadlineSeconds": i32::MAX, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"annotations": {"ballast.dev/spread-terms": "{}"}},
                                  "spec": {"containers": []}}},
        }))
        .unwrap();
        let w = Workload::from_deployment(&d);
        assert_eq!(w.progress_deadline, MAX_PROGRESS_DEADLINE);
        assert_eq!(w.record.as_deref(), Some("{}"));
    }

    #[test]
    fn a_stateful_set_that_completed_and_lost_a_ready_replica_is_not_rolling() {
        let s: StatefulSet = serde_json::from_value(json!({
            "metadata": {"name": "db", "namespace": "shop", "generation": 2},
            "spec": {"replicas": 3, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                     "template": {"spec": {"containers": []}}},
            "status": {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 2,
                       "currentRevision": "db-2", "updateRevision": "db-2"},
        }))
        .unwrap();
        assert_eq!(stateful_set_rollout(&s), Rollout::Complete);
        let mut rolling = s.clone();
        rolling.status.as_mut().unwrap().current_revision = Some("db-1".into());
        assert_eq!(stateful_set_rollout(&rolling), Rollout::InProgress);
    }
}
