//! Reading the world for one strategy: its Deployment (and that Deployment's ReplicaSets, with
//! the revision each was made from), its hook Jobs and their pods, and — for a failed hook —
//! the tail of the pod's log (kwok pods and pods whose node is gone have none: then the
//! terminated state's reason and message stand in). Everything but the log tail comes from the
//! controller's watch caches ([`Caches`], filled by the watches of `run`), confined to the
//! strategy's namespace, and is reduced without a request to the plain views the pure state
//! machine decides on. A log tail is one request, made only for a hook whose end is about to be
//! recorded; [`any_job_exists`] is one more, made only when status names a Job of ours that the
//! cache does not show (yet).
//!
//! The Deployment cache holds only the Deployments labelled governed
//! ([`GOVERNED_LABEL`](super::gate::GOVERNED_LABEL): the revision gate labels one in the write
//! that creates it, ballast when it adopts one), so the writes to the many Deployments no
//! strategy governs never reach this controller. The ReplicaSet cache holds every ReplicaSet
//! that a Deployment controls, and keeps little of each (see [`super::cache`]): no template.
//! What a decision reads that the caches do not keep is read afresh ([`needs_fresh_target`],
//! [`read_target`]: a GET of the Deployment and a LIST of its ReplicaSets): a target the cache
//! does not show (not labelled yet, or not there), and one being adopted (the only time a
//! ReplicaSet's template is read). A target that stays missing is looked for again now and
//! then ([`Looks`]), since nothing would tell the controller of one created without the label.
//!
//! One module each: `deployment` (the Deployment's view), `jobs` (hook Jobs and their pods),
//! `looks` (a target read afresh), `logs` (log tails); the caches and the views of one strategy
//! ([`Observed`]) are here.

mod deployment;
mod jobs;
mod logs;
mod looks;

pub use deployment::{DeploymentView, ReplicaSetView, keep_paused_owners, trim_deployment};
pub use jobs::{HookPod, JobState, JobView, PodView, Terminated, any_job_exists, unseen_jobs};
pub use logs::{LOG_TAIL_BYTES, LOG_TAIL_LINES, read_log_tails};
pub use looks::{FIRST_LOOK, LAST_LOOK, Looks, needs_fresh_target, read_target};

use super::cache::CachedDeployment;
use super::hooks::{LABEL_STRATEGY, label_value};
use super::replica_sets::ReplicaSets;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    api::ObjectMeta,
    runtime::reflector::{ObjectRef, Store},
};
use std::sync::Arc;

/// What one reconcile decides on.
#[derive(Default)]
pub struct Observed {
    pub deployment: Option<DeploymentView>,
    pub jobs: Vec<JobView>,
    pub live_pods: Vec<HookPod>,
}

/// The watch caches the controller reads instead of the API server.
#[derive(Clone)]
pub struct Caches {
    pub deployments: Store<CachedDeployment>,
    /// By their controlling Deployment.
    pub replica_sets: Arc<ReplicaSets>,
    /// Hook Jobs only (labelled with [`LABEL_STRATEGY`]).
    pub jobs: Store<Job>,
    /// Pods of hook Jobs only (labelled with [`LABEL_STRATEGY`]).
    pub pods: Store<Pod>,
}

impl Caches {
    /// The resourceVersion of hook Job `name` of `ns` in the cache, if it is there.
    pub fn job_version(&self, ns: &str, name: &str) -> Option<String> {
        self.jobs
            .get(&ObjectRef::new(name).within(ns))
            .and_then(|j| j.metadata.resource_version.clone())
    }

    /// What strategy `strategy` in `ns`, targeting Deployment `target`, decides on, from the
    /// caches alone (no log tails: see [`read_log_tails`]).
    pub fn observe(&self, ns: &str, strategy: &str, target: &str) -> Observed {
        let deployment = self.deployments.get(&ObjectRef::new(target).within(ns));
        let ours = |meta: &ObjectMeta| {
            meta.namespace.as_deref() == Some(ns)
                && meta
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_STRATEGY))
                    .is_some_and(|v| *v == label_value(strategy))
        };
        let jobs: Vec<Job> = self
            .jobs
            .state()
            .iter()
            .filter(|j| ours(&j.metadata))
            .map(|j| j.as_ref().clone())
            .collect();
        let pods: Vec<Pod> = self
            .pods
            .state()
            .iter()
            .filter(|p| ours(&p.metadata))
            .map(|p| p.as_ref().clone())
            .collect();
        let mut observed = reduce(strategy, None, &[], &jobs, &pods);
        observed.deployment = deployment.map(|d| {
            let replica_sets =
                self.replica_sets
                    .of(ns, target, d.metadata.uid.as_deref().unwrap_or_default());
            match &d.view {
                // Made as the watch delivered this version: no template hashed again.
                Some(view) => DeploymentView {
                    replica_sets,
                    ..(**view).clone()
                },
                None => DeploymentView::of(d.to_deployment(), replica_sets),
            }
        });
        observed
    }
}

/// Drops what no view reads from a cached object, so the caches stay small: managedFields and
/// the last-applied annotation.
pub fn trim(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(crate::k8s::LAST_APPLIED);
    }
}

/// Reduces the objects of the strategy's namespace to what strategy `strategy` decides on: the
/// Deployment with the ReplicaSets it controls, and the Jobs and pods labelled for the strategy.
pub fn reduce(
    strategy: &str,
    deployment: Option<&Deployment>,
    replica_sets: &[ReplicaSet],
    jobs: &[Job],
    pods: &[Pod],
) -> Observed {
    let value = label_value(strategy);
    let ours = |meta: &ObjectMeta| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get(LABEL_STRATEGY))
            .is_some_and(|v| *v == value)
    };
    let pods: Vec<Pod> = pods.iter().filter(|p| ours(&p.metadata)).cloned().collect();
    let mut views: Vec<JobView> = jobs
        .iter()
        .filter(|j| ours(&j.metadata))
        .map(|j| JobView::from_parts(j, &pods))
        .collect();
    views.sort_by(|a, b| a.name.cmp(&b.name));
    Observed {
        deployment: deployment.map(|d| DeploymentView::from_parts(d, replica_sets)),
        jobs: views,
        live_pods: pods.iter().filter_map(HookPod::live).collect(),
    }
}

#[cfg(test)]
mod tests;
