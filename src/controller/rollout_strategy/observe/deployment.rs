//! The target Deployment's view ([`DeploymentView`], with its [`ReplicaSetView`]s), and what
//! of a Deployment the caches keep for it: who set `spec.paused` ([`keep_paused_owners`]).

use super::super::revision;
use super::trim;
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::{ResourceExt, api::ObjectMeta};
use std::sync::Arc;

/// A ReplicaSet of the Deployment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplicaSetView {
    pub name: String,
    /// The revision of the template it was made from.
    pub revision: String,
    /// `status.replicas`: pods that exist.
    pub replicas: i32,
    /// `spec.replicas`: what the Deployment controller has scaled it to.
    pub desired: i32,
    pub available: i32,
    pub created: Option<Timestamp>,
    /// The Deployment template it was made from; `None` when it comes from the cache, which
    /// keeps only its revision (see [`super::super::cache::CachedReplicaSet`]).
    pub template_json: Option<serde_json::Value>,
}

/// The target Deployment, as decisions need it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeploymentView {
    pub name: String,
    /// Tells this Deployment from an earlier one of the same name.
    pub uid: String,
    pub resource_version: String,
    pub generation: i64,
    pub observed_generation: i64,
    pub paused: bool,
    /// `spec.replicas` (default 1).
    pub replicas: i32,
    /// `spec.strategy.type == Recreate`.
    pub recreate: bool,
    /// Shared: a view is made once per cached version of the Deployment
    /// ([`CachedDeployment::trim`](super::super::cache::CachedDeployment::trim)) and copied into each
    /// decision about it.
    pub template: Arc<PodTemplateSpec>,
    pub template_json: Arc<serde_json::Value>,
    /// ballast's revision of `spec.template`.
    pub revision: String,
    pub status_replicas: i32,
    pub updated_replicas: i32,
    pub ready_replicas: i32,
    pub available_replicas: i32,
    /// The Deployment controller gave up on its rollout (`Progressing=False`,
    /// `ProgressDeadlineExceeded`).
    pub stalled: bool,
    pub replica_sets: Vec<ReplicaSetView>,
    /// The Deployment's `ballast.dev/*` annotations.
    pub annotations: std::collections::BTreeMap<String, String>,
    /// The Deployment carries [`super::super::gate::GOVERNED_LABEL`].
    pub governed_label: bool,
    /// The Deployment's label [`super::super::machine::PHASE_LABEL`].
    pub phase_label: Option<String>,
    /// The Deployment's label [`super::super::gate::SHARD_LABEL`].
    pub gate_shard: Option<String>,
    /// The field manager that set `spec.paused`, if the API server credits one (a change made
    /// by admission, such as the revision gate's, is credited to nobody).
    pub paused_by: Option<String>,
}

impl DeploymentView {
    /// The value of one of the Deployment's `ballast.dev/*` annotations.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.get(key).map(String::as_str)
    }

    /// Whether someone other than this controller (or admission) paused the Deployment, e.g.
    /// `kubectl rollout pause` or a manifest that says `paused: true`.
    pub fn paused_by_someone_else(&self) -> Option<&str> {
        self.paused_by
            .as_deref()
            .filter(|m| self.paused && *m != crate::k8s::ROLLOUT_STRATEGY_MANAGER)
    }

    /// Whether the Deployment controller has seen the current spec.
    pub fn observed(&self) -> bool {
        self.observed_generation >= self.generation
    }

    /// Whether any pod of any revision was ever created (a ReplicaSet exists).
    pub fn ever_rolled_out(&self) -> bool {
        !self.replica_sets.is_empty()
    }

    /// Available replicas of the ReplicaSet made from `revision`.
    pub fn available_of(&self, revision: &str) -> i32 {
        self.replica_sets
            .iter()
            .filter(|r| r.revision == revision)
            .map(|r| r.available)
            .sum()
    }

    /// Replicas the Deployment controller has scaled the ReplicaSets of `revision` to.
    pub fn desired_of(&self, revision: &str) -> i32 {
        self.replica_sets
            .iter()
            .filter(|r| r.revision == revision)
            .map(|r| r.desired)
            .sum()
    }

    /// Whether a ReplicaSet of `revision` exists.
    pub fn has_replica_set_of(&self, revision: &str) -> bool {
        self.replica_sets.iter().any(|r| r.revision == revision)
    }

    /// The ReplicaSet whose pods serve: the one with the most replicas, else the newest.
    pub fn serving_replica_set(&self) -> Option<&ReplicaSetView> {
        self.replica_sets
            .iter()
            .max_by_key(|r| (r.replicas, r.created))
    }

    /// Every replica is of the current template and available, and no other pod is left.
    pub fn complete(&self) -> bool {
        self.observed()
            && self.updated_replicas == self.replicas
            && self.status_replicas == self.replicas
            && self.available_replicas >= self.replicas
            && self.available_of(&self.revision) >= self.replicas
    }

    /// The view of `d`, from ReplicaSets read whole (a fresh read): those it controls.
    pub fn from_parts(d: &Deployment, replica_sets: &[ReplicaSet]) -> Self {
        let uid = d.uid();
        let rs = replica_sets
            .iter()
            .filter(|r| controlled_by(r.owner_references(), uid.as_deref()))
            .map(|r| {
                let rspec = r.spec.as_ref();
                let rstatus = r.status.clone().unwrap_or_default();
                let template = revision::deployment_template_of(
                    rspec.and_then(|s| s.template.clone()).unwrap_or_default(),
                );
                ReplicaSetView {
                    name: r.name_any(),
                    revision: revision::of_template(&template),
                    replicas: rstatus.replicas,
                    desired: rspec.and_then(|s| s.replicas).unwrap_or(1),
                    available: rstatus.available_replicas.unwrap_or(0),
                    created: r.creation_timestamp().map(|t| t.0),
                    template_json: Some(serde_json::to_value(&template).unwrap_or_default()),
                }
            })
            .collect();
        Self::new(d, rs)
    }

    /// The view of `d` with `rs`, its ReplicaSets: read whole ([`Self::from_parts`]) or from
    /// the cache's index, without templates ([`ReplicaSets::of`](super::super::replica_sets::ReplicaSets::of)).
    pub fn new(d: &Deployment, rs: Vec<ReplicaSetView>) -> Self {
        Self::of(d.clone(), rs)
    }

    /// [`Self::new`] of a Deployment given away: its template is moved, not copied.
    pub fn of(mut d: Deployment, rs: Vec<ReplicaSetView>) -> Self {
        let spec = d.spec.take().unwrap_or_default();
        let status = d.status.take().unwrap_or_default();
        let d = &d;
        let uid = d.uid();
        let stalled = status.conditions.iter().flatten().any(|c| {
            c.type_ == "Progressing"
                && c.status == "False"
                && c.reason.as_deref() == Some("ProgressDeadlineExceeded")
        });
        Self {
            name: d.name_any(),
            uid: uid.clone().unwrap_or_default(),
            stalled,
            resource_version: d.resource_version().unwrap_or_default(),
            generation: d.metadata.generation.unwrap_or(0),
            observed_generation: status.observed_generation.unwrap_or(0),
            paused: spec.paused.unwrap_or(false),
            replicas: spec.replicas.unwrap_or(1),
            recreate: spec
                .strategy
                .as_ref()
                .and_then(|s| s.type_.as_deref())
                .is_some_and(|t| t == "Recreate"),
            template_json: Arc::new(serde_json::to_value(&spec.template).unwrap_or_default()),
            revision: revision::of_template(&spec.template),
            template: Arc::new(spec.template),
            status_replicas: status.replicas.unwrap_or(0),
            updated_replicas: status.updated_replicas.unwrap_or(0),
            ready_replicas: status.ready_replicas.unwrap_or(0),
            available_replicas: status.available_replicas.unwrap_or(0),
            replica_sets: rs,
            annotations: d
                .annotations()
                .iter()
                .filter(|(k, _)| k.starts_with("ballast.dev/"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            paused_by: paused_by(d),
            governed_label: d.labels().contains_key(super::super::gate::GOVERNED_LABEL),
            phase_label: d.labels().get(super::super::machine::PHASE_LABEL).cloned(),
            gate_shard: d.labels().get(super::super::gate::SHARD_LABEL).cloned(),
        }
    }
}

/// Whether `owners` name Deployment `uid` as the controller.
fn controlled_by(
    owners: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference],
    uid: Option<&str>,
) -> bool {
    owners
        .iter()
        .any(|o| Some(o.uid.as_str()) == uid && o.controller == Some(true))
}

/// The manager credited with `spec.paused` in `managedFields`: another than this controller
/// when several share it.
fn paused_by(d: &Deployment) -> Option<String> {
    let owners: Vec<String> = d
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .and_then(|f| f.0.pointer("/f:spec/f:paused"))
                .is_some()
        })
        .filter_map(|m| m.manager.clone())
        .collect();
    owners
        .iter()
        .find(|m| *m != crate::k8s::ROLLOUT_STRATEGY_MANAGER)
        .or(owners.first())
        .cloned()
}

/// As [`trim`], for a Deployment, but keeps who set `spec.paused` (the managedFields entries that
/// own it, cut down to that one field): [`DeploymentView::paused_by`] tells a pause by someone
/// else, which ballast leaves alone, from its own.
pub fn trim_deployment(d: &mut Deployment) {
    keep_paused_owners(&mut d.metadata);
}

/// [`trim`], but keeps the managedFields entries that own `spec.paused`, cut down to that field.
pub fn keep_paused_owners(meta: &mut ObjectMeta) {
    let owners: Vec<_> = meta
        .managed_fields
        .take()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| {
            m.fields_v1
                .as_ref()
                .and_then(|f| f.0.pointer("/f:spec/f:paused"))
                .is_some()
        })
        .map(|mut m| {
            m.fields_v1 = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1(
                serde_json::json!({"f:spec": {"f:paused": {}}}),
            ));
            m
        })
        .collect();
    trim(meta);
    if !owners.is_empty() {
        meta.managed_fields = Some(owners);
    }
}

#[cfg(test)]
#[path = "deployment_tests.rs"]
pub(crate) mod tests;
