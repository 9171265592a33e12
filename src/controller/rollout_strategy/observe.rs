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

use super::cache::CachedDeployment;
use super::hooks::{
    ANNOTATION_TARGET_UID, LABEL_ATTEMPT, LABEL_HOOK, LABEL_REVISION, LABEL_STRATEGY, label_value,
};
use super::replica_sets::ReplicaSets;
use super::revision;
use crate::api::{HookPhase, RolloutStrategyStatus};
use jiff::Timestamp;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, LogParams, ObjectMeta},
    runtime::reflector::{ObjectRef, Store},
};
use std::sync::Arc;
use std::time::Duration;

/// Lines of a failed hook's log kept in status.
pub const LOG_TAIL_LINES: i64 = 20;
/// Longest log tail kept in status, in bytes.
pub const LOG_TAIL_BYTES: usize = 2048;

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
    /// keeps only its revision (see [`super::cache::CachedReplicaSet`]).
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
    /// ([`CachedDeployment::trim`](super::cache::CachedDeployment::trim)) and copied into each
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
    /// The Deployment carries [`super::gate::GOVERNED_LABEL`].
    pub governed_label: bool,
    /// The Deployment's label [`super::machine::PHASE_LABEL`].
    pub phase_label: Option<String>,
    /// The Deployment's label [`super::gate::SHARD_LABEL`].
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
    /// the cache's index, without templates ([`ReplicaSets::of`]).
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
            governed_label: d.labels().contains_key(super::gate::GOVERNED_LABEL),
            phase_label: d.labels().get(super::machine::PHASE_LABEL).cloned(),
            gate_shard: d.labels().get(super::gate::SHARD_LABEL).cloned(),
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

/// How a hook container ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Terminated {
    /// The container that ended (the first that failed, if any did).
    pub container: String,
    pub exit_code: i32,
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// The newest pod of a hook Job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodView {
    pub name: String,
    /// When its container started running, if it did.
    pub running_since: Option<Timestamp>,
    /// Why it is not running yet (`Unschedulable`, `ImagePullBackOff`, ...).
    pub waiting_reason: Option<String>,
    pub waiting_message: Option<String>,
    pub terminated: Option<Terminated>,
}

/// Where a hook Job is.
#[derive(Clone, Debug, PartialEq)]
pub enum JobState {
    Active,
    Succeeded {
        finished: Option<Timestamp>,
    },
    Failed {
        reason: String,
        message: String,
        finished: Option<Timestamp>,
    },
}

/// A hook Job of the strategy.
#[derive(Clone, Debug, PartialEq)]
pub struct JobView {
    pub name: String,
    /// UID of the Deployment the Job was made for (`None` for Jobs of older versions).
    pub target_uid: Option<String>,
    pub hook: String,
    pub revision: String,
    pub attempt: i32,
    pub created: Option<Timestamp>,
    pub state: JobState,
    pub pod: Option<PodView>,
    pub log_tail: Option<String>,
}

impl JobView {
    pub fn finished(&self) -> bool {
        !matches!(self.state, JobState::Active)
    }

    /// Whether the Job was made for the Deployment with `uid` (Jobs that do not say are taken
    /// to be).
    pub fn targets(&self, uid: &str) -> bool {
        self.target_uid.as_deref().is_none_or(|u| u == uid)
    }

    pub fn from_parts(job: &Job, pods: &[Pod]) -> Self {
        let labels = job.labels();
        let status = job.status.clone().unwrap_or_default();
        let cond = |t: &str| {
            status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == t && c.status == "True")
                .cloned()
        };
        let state = if let Some(c) = cond("Complete") {
            JobState::Succeeded {
                finished: status
                    .completion_time
                    .map(|t| t.0)
                    .or(c.last_transition_time.map(|t| t.0)),
            }
        } else if let Some(c) = cond("Failed") {
            JobState::Failed {
                reason: c.reason.unwrap_or_else(|| "Failed".into()),
                message: c.message.unwrap_or_default(),
                finished: c.last_transition_time.map(|t| t.0),
            }
        } else {
            JobState::Active
        };
        let uid = job.uid();
        let pod = pods
            .iter()
            .filter(|p| {
                p.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == uid.as_ref())
            })
            .max_by_key(|p| p.creation_timestamp().map(|t| t.0))
            .map(pod_view);
        Self {
            name: job.name_any(),
            target_uid: job.annotations().get(ANNOTATION_TARGET_UID).cloned(),
            hook: labels.get(LABEL_HOOK).cloned().unwrap_or_default(),
            revision: labels.get(LABEL_REVISION).cloned().unwrap_or_default(),
            attempt: labels
                .get(LABEL_ATTEMPT)
                .and_then(|a| a.parse().ok())
                .unwrap_or(0),
            created: job.creation_timestamp().map(|t| t.0),
            state,
            pod,
            log_tail: None,
        }
    }
}

fn pod_view(p: &Pod) -> PodView {
    let status = p.status.clone().unwrap_or_default();
    let cs = status.container_statuses.unwrap_or_default();
    let mut view = PodView {
        name: p.name_any(),
        ..Default::default()
    };
    for c in &cs {
        let Some(state) = &c.state else { continue };
        if let Some(r) = &state.running {
            view.running_since = r
                .started_at
                .as_ref()
                .map(|t| t.0)
                .or(Some(Timestamp::now()));
        }
        if let Some(w) = &state.waiting {
            view.waiting_reason = w.reason.clone();
            view.waiting_message = w.message.clone();
        }
        if let Some(t) = &state.terminated {
            // The first failure explains the pod best; a success never hides one.
            if view.terminated.as_ref().is_some_and(|x| x.exit_code != 0) {
                continue;
            }
            view.terminated = Some(Terminated {
                container: c.name.clone(),
                exit_code: t.exit_code,
                reason: t.reason.clone(),
                message: t.message.clone(),
            });
            view.running_since = view.running_since.or(t.started_at.as_ref().map(|s| s.0));
        }
    }
    if view.running_since.is_none()
        && view.waiting_reason.is_none()
        && let Some(c) = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
    {
        view.waiting_reason = c.reason.clone();
        view.waiting_message = c.message.clone();
    }
    view
}

/// A pod of a hook Job that has not terminated (a deleting one included).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HookPod {
    pub name: String,
    /// Its Job (which may already be deleted).
    pub job: String,
}

impl HookPod {
    /// `Some` for a pod of a hook Job that is not in a terminal phase.
    pub fn live(p: &Pod) -> Option<Self> {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return None;
        }
        let job = p
            .owner_references()
            .iter()
            .find(|o| o.kind == "Job")
            .map(|o| o.name.clone())
            .or_else(|| p.labels().get("batch.kubernetes.io/job-name").cloned())
            .unwrap_or_default();
        Some(Self {
            name: p.name_any(),
            job,
        })
    }
}

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

/// Whether the decision about `observed`'s Deployment needs it read afresh: the cache shows no
/// Deployment not labelled governed (its absence there does not mean it does not exist), nor
/// the template of any ReplicaSet, which adoption (no revision recorded in `status` yet) reads.
pub fn needs_fresh_target(status: &RolloutStrategyStatus, observed: &Observed) -> bool {
    let adopting = status.stable_revision.is_none() && status.current_revision.is_none();
    observed
        .deployment
        .as_ref()
        .is_none_or(|d| adopting || !d.governed_label)
}

/// The first wait before a target that was not found is looked for again ([`Looks`]).
pub const FIRST_LOOK: Duration = Duration::from_secs(10);
/// The longest wait between two looks for a target that stays missing, with the revision gate:
/// it labels a Deployment in the write that creates it, so only one created in the moment before
/// the API server's gate saw its strategy is missed, and that within [`FIRST_LOOK`] of the
/// strategy's first look. Held paused at rest, no gate labels a Deployment created after its
/// strategy, and the looks stay [`FIRST_LOOK`] apart.
pub const LAST_LOOK: Duration = Duration::from_secs(300);

/// When each strategy whose Deployment the cache does not show looks for it afresh again. The
/// cache shows only Deployments labelled governed, and a Deployment can exist without the label
/// where nothing would wake its strategy: created while the manager holds Deployments paused at
/// rest (no revision gate labels it), or in the moment before the API server's gate saw a
/// strategy created just before it. Such a strategy looks [`FIRST_LOOK`] after a look that did
/// not find it, then twice as long each time, up to [`LAST_LOOK`] with the gate and
/// [`FIRST_LOOK`] paused at rest: a GET now and then for a strategy whose Deployment does not
/// exist, none for one whose Deployment the cache shows. A look that did not find the target is
/// a failure of the controller's keyed backoff ([`Backoff`](crate::controller::backoff::Backoff)).
#[derive(Debug)]
pub struct Looks(crate::controller::backoff::Backoff);

impl Default for Looks {
    fn default() -> Self {
        Self(crate::controller::backoff::Backoff::new(
            FIRST_LOOK, LAST_LOOK,
        ))
    }
}

impl Looks {
    /// The longest wait between two looks with `gate` in force ([`LAST_LOOK`], [`FIRST_LOOK`]).
    pub fn longest(gate: crate::api::Gate) -> Duration {
        match gate {
            crate::api::Gate::Admission => LAST_LOOK,
            crate::api::Gate::PauseAtRest => FIRST_LOOK,
        }
    }

    /// Records that strategy `key` read its target afresh now with `gate` in force, and whether
    /// it was `found`.
    pub fn looked(&self, key: &str, found: bool, gate: crate::api::Gate) {
        if found {
            self.0.succeeded(key);
        } else {
            self.0.failed_within(key, Self::longest(gate));
        }
    }

    /// How long until strategy `key`, whose target the cache does not show, looks for it again
    /// with `gate` in force: zero when it may look now (it never looked, or found it last time).
    /// A wait set under the gate is cut to [`FIRST_LOOK`] once the manager holds Deployments
    /// paused at rest.
    pub fn wait(&self, key: &str, gate: crate::api::Gate) -> Duration {
        self.0.remaining_within(key, Self::longest(gate))
    }

    /// Forgets strategy `key` (deleted).
    pub fn forget(&self, key: &str) {
        self.0.succeeded(key);
    }
}

/// Reads Deployment `target` of `ns` afresh, with its ReplicaSets (one GET, and one LIST by its
/// selector when it exists): the view of it the cache does not keep whole.
pub async fn read_target(
    client: &Client,
    ns: &str,
    target: &str,
) -> kube::Result<Option<DeploymentView>> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let Some(mut d) = deployments.get_opt(target).await? else {
        return Ok(None);
    };
    trim_deployment(&mut d);
    let selector = d
        .spec
        .as_ref()
        .map(|s| s.selector.clone())
        .and_then(|s| kube::core::Selector::try_from(s).ok());
    let replica_sets = match selector {
        Some(selector) => {
            Api::<ReplicaSet>::namespaced(client.clone(), ns)
                .list(&ListParams::default().labels_from(&selector))
                .await?
                .items
        }
        None => Vec::new(),
    };
    Ok(Some(DeploymentView::from_parts(&d, &replica_sets)))
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

/// Fetches the log tail of the failed Jobs named in `want_logs` (the hooks whose end is about
/// to be recorded): one request each.
pub async fn read_log_tails(
    client: &Client,
    ns: &str,
    observed: &mut Observed,
    want_logs: &[String],
) {
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    for v in observed.jobs.iter_mut() {
        if !want_logs.contains(&v.name) || !matches!(v.state, JobState::Failed { .. }) {
            continue;
        }
        let Some(pod) = &v.pod else { continue };
        let container = pod.terminated.as_ref().map(|t| t.container.clone());
        v.log_tail = log_tail(&pods_api, &pod.name, container).await;
    }
}

/// The Jobs that `status` records as created for a hook still running (an open entry with a
/// Job name) but that `observed` lacks: either deleted, or created so recently that the Job
/// cache has not seen them yet. Deciding on the latter would record the hook as failed
/// ("deleted before it finished"), so they are looked up before any decision is acted on.
pub fn unseen_jobs(status: &RolloutStrategyStatus, observed: &Observed) -> Vec<String> {
    status
        .hooks
        .iter()
        .filter(|h| matches!(h.phase, HookPhase::Pending | HookPhase::Running))
        .filter_map(|h| h.job_name.clone())
        .filter(|name| !observed.jobs.iter().any(|j| &j.name == name))
        .collect()
}

/// Whether any of the Jobs `names` exists in `ns`, read from the API server (a LIST by name,
/// which the Jobs permission already allows).
pub async fn any_job_exists(client: &Client, ns: &str, names: &[String]) -> kube::Result<bool> {
    let api: Api<Job> = Api::namespaced(client.clone(), ns);
    for name in names {
        let lp = ListParams::default().fields(&format!("metadata.name={name}"));
        if !api.list_metadata(&lp).await?.items.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The last lines of a pod's log, or `None` when there is none to read (kwok pods, pods whose
/// node is gone) — callers fall back to the terminated state.
async fn log_tail(pods: &Api<Pod>, name: &str, container: Option<String>) -> Option<String> {
    let params = LogParams {
        container,
        tail_lines: Some(LOG_TAIL_LINES),
        limit_bytes: Some(LOG_TAIL_BYTES as i64 * 4),
        ..Default::default()
    };
    let text = tokio::time::timeout(Duration::from_secs(3), pods.logs(name, &params))
        .await
        .ok()?
        .ok()?;
    let text = text.trim_end();
    if text.is_empty() {
        return None;
    }
    let start = text.len().saturating_sub(LOG_TAIL_BYTES);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    Some(text[start..].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment() -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "uid": "d1", "generation": 3, "resourceVersion": "7"},
            "spec": {
                "paused": true, "replicas": 3,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "app", "image": "web:2"}]}}
            },
            "status": {"observedGeneration": 3, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3, "availableReplicas": 3}
        }))
        .unwrap()
    }

    fn replica_set(owner: &str, image: &str, available: i32) -> ReplicaSet {
        serde_json::from_value(json!({
            "metadata": {"name": format!("web-{image}"), "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": owner, "controller": true}]},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web", "pod-template-hash": "abc"}}, "spec": {"containers": [{"name": "app", "image": image}]}}},
            "status": {"replicas": available, "availableReplicas": available}
        }))
        .unwrap()
    }

    #[test]
    fn adoption_and_a_deployment_not_labelled_governed_are_read_afresh() {
        let mut governed = deployment();
        governed.metadata.labels = Some(
            [(
                super::super::gate::GOVERNED_LABEL.to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        let other = deployment();
        let adopted = RolloutStrategyStatus {
            stable_revision: Some("r1".into()),
            ..Default::default()
        };
        let seen = |d: &Deployment| Observed {
            deployment: Some(DeploymentView::from_parts(d, &[])),
            ..Default::default()
        };
        assert!(!needs_fresh_target(&adopted, &seen(&governed)));
        assert!(needs_fresh_target(&adopted, &seen(&other)));
        assert!(needs_fresh_target(
            &RolloutStrategyStatus::default(),
            &seen(&governed)
        ));
        // Not in the cache: not labelled governed yet, or not there; only a GET tells.
        assert!(needs_fresh_target(&adopted, &Observed::default()));
    }

    #[test]
    fn a_missing_target_is_looked_for_less_and_less_often_and_at_once_once_found() {
        use crate::api::Gate;
        let looks = Looks::default();
        assert_eq!(
            looks.wait("shop/web", Gate::Admission),
            Duration::ZERO,
            "never looked: now"
        );
        looks.looked("shop/web", false, Gate::Admission);
        let w = looks.wait("shop/web", Gate::Admission);
        assert!(
            w > FIRST_LOOK - Duration::from_secs(1) && w <= FIRST_LOOK,
            "{w:?}"
        );
        looks.looked("shop/web", false, Gate::Admission);
        assert!(
            looks.wait("shop/web", Gate::Admission) > FIRST_LOOK,
            "twice as long"
        );
        for _ in 0..10 {
            looks.looked("shop/web", false, Gate::Admission);
        }
        assert!(
            looks.wait("shop/web", Gate::Admission) <= LAST_LOOK,
            "never longer than LAST_LOOK"
        );
        assert!(looks.wait("shop/web", Gate::Admission) > LAST_LOOK - Duration::from_secs(1));
        assert_eq!(
            looks.wait("shop/api", Gate::Admission),
            Duration::ZERO,
            "per strategy"
        );
        // Found: should the cache lose it again, the next look is at once, and starts over.
        looks.looked("shop/web", true, Gate::Admission);
        assert_eq!(looks.wait("shop/web", Gate::Admission), Duration::ZERO);
        looks.looked("shop/web", false, Gate::Admission);
        assert!(looks.wait("shop/web", Gate::Admission) <= FIRST_LOOK);
        looks.forget("shop/web");
        assert_eq!(looks.wait("shop/web", Gate::Admission), Duration::ZERO);
        // Paused at rest, no gate labels a new Deployment: the looks stay FIRST_LOOK apart.
        for _ in 0..5 {
            looks.looked("shop/late", false, Gate::PauseAtRest);
        }
        assert!(looks.wait("shop/late", Gate::PauseAtRest) <= FIRST_LOOK);
        // The gate comes back: the looks grow again from there (20 s), not from the count.
        looks.looked("shop/late", false, Gate::Admission);
        let w = looks.wait("shop/late", Gate::Admission);
        assert!(w > FIRST_LOOK && w <= 2 * FIRST_LOOK, "{w:?}");
        // The gate goes away: a long wait set under it is cut to FIRST_LOOK.
        for _ in 0..5 {
            looks.looked("shop/long", false, Gate::Admission);
        }
        assert!(looks.wait("shop/long", Gate::Admission) > 10 * FIRST_LOOK);
        let w = looks.wait("shop/long", Gate::PauseAtRest);
        assert!(
            w > FIRST_LOOK - Duration::from_secs(1) && w <= FIRST_LOOK,
            "{w:?}"
        );
    }

    #[test]
    fn deployment_view_knows_its_revision_and_its_replica_sets() {
        let d = deployment();
        let rss = [
            replica_set("d1", "web:2", 3),
            replica_set("d1", "web:1", 0),
            replica_set("other", "web:2", 5),
        ];
        let v = DeploymentView::from_parts(&d, &rss);
        assert!(v.paused && v.recreate && v.observed());
        assert_eq!(v.replicas, 3);
        assert_eq!(v.replica_sets.len(), 2, "only its own ReplicaSets");
        assert_eq!(v.available_of(&v.revision), 3);
        assert!(v.has_replica_set_of(&v.revision));
        assert!(v.complete());
        assert!(v.ever_rolled_out());
    }

    #[test]
    fn a_deployment_not_yet_observed_is_not_complete() {
        let mut d = deployment();
        d.metadata.generation = Some(4);
        let v = DeploymentView::from_parts(&d, &[replica_set("d1", "web:2", 3)]);
        assert!(!v.complete());
    }

    fn job(status: serde_json::Value) -> Job {
        serde_json::from_value(json!({
            "metadata": {"name": "web-migrate-b-1", "uid": "j1", "labels": {"ballast.dev/hook": "migrate", "ballast.dev/revision": "b", "ballast.dev/attempt": "1"}},
            "status": status
        }))
        .unwrap()
    }

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "web-migrate-b-1", "uid": "j1"}]},
            "status": status
        }))
        .unwrap()
    }

    #[test]
    fn a_failed_job_carries_its_pods_exit_code() {
        let j = job(
            json!({"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "m"}]}),
        );
        let p = pod(
            json!({"phase": "Failed", "containerStatuses": [{"name": "t", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "boom"}}}]}),
        );
        let v = JobView::from_parts(&j, &[p]);
        assert_eq!((v.hook.as_str(), v.attempt), ("migrate", 1));
        assert!(
            matches!(v.state, JobState::Failed { ref reason, .. } if reason == "BackoffLimitExceeded")
        );
        let t = v.pod.unwrap().terminated.unwrap();
        assert_eq!((t.exit_code, t.message.as_deref()), (1, Some("boom")));
    }

    #[test]
    fn an_unschedulable_pod_says_why_it_waits() {
        let j = job(json!({"active": 1}));
        let p = pod(
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/6 nodes"}]}),
        );
        let v = JobView::from_parts(&j, &[p]);
        assert_eq!(v.state, JobState::Active);
        let p = v.pod.unwrap();
        assert_eq!(p.waiting_reason.as_deref(), Some("Unschedulable"));
        assert!(p.running_since.is_none());
    }

    fn labelled(mut meta: ObjectMeta, strategy: &str) -> ObjectMeta {
        meta.labels
            .get_or_insert_default()
            .insert(LABEL_STRATEGY.into(), label_value(strategy));
        meta
    }

    #[test]
    fn reduce_keeps_only_the_strategys_jobs_and_pods() {
        let mut mine = job(json!({"active": 1}));
        mine.metadata = labelled(mine.metadata, "web");
        let mut other = job(json!({"active": 1}));
        other.metadata = labelled(other.metadata, "api");
        other.metadata.name = Some("api-migrate-b-1".into());
        let mut running = pod(json!({"phase": "Running"}));
        running.metadata = labelled(running.metadata, "web");
        let mut theirs = pod(json!({"phase": "Running"}));
        theirs.metadata = labelled(theirs.metadata, "api");
        theirs.metadata.name = Some("q".into());
        let o = reduce(
            "web",
            Some(&deployment()),
            &[
                replica_set("d1", "web:2", 3),
                replica_set("other", "web:1", 1),
            ],
            &[mine, other],
            &[running, theirs],
        );
        let names: Vec<&str> = o.jobs.iter().map(|j| j.name.as_str()).collect();
        assert_eq!(names, ["web-migrate-b-1"]);
        assert_eq!(o.jobs[0].pod.as_ref().map(|p| p.name.as_str()), Some("p"));
        assert_eq!(o.live_pods.len(), 1);
        assert_eq!(o.live_pods[0].job, "web-migrate-b-1");
        assert_eq!(o.deployment.unwrap().replica_sets.len(), 1);
        assert!(reduce("web", None, &[], &[], &[]).deployment.is_none());
    }

    #[test]
    fn a_job_status_names_but_the_cache_lacks_is_unseen() {
        use crate::api::HookStatus;
        let entry = |name: &str, phase: HookPhase| HookStatus {
            name: name.into(),
            phase,
            job_name: Some(format!("web-{name}-b-1")),
            ..Default::default()
        };
        let status = RolloutStrategyStatus {
            hooks: vec![
                entry("migrate", HookPhase::Running),
                entry("seed", HookPhase::Pending),
                entry("purge", HookPhase::Succeeded),
            ],
            ..Default::default()
        };
        let cached = Observed {
            deployment: None,
            jobs: vec![JobView::from_parts(&job(json!({"active": 1})), &[])],
            live_pods: vec![],
        };
        // migrate's Job is cached; purge ended, so its Job no longer matters.
        assert_eq!(unseen_jobs(&status, &cached), ["web-seed-b-1"]);
    }

    #[test]
    fn the_trimmed_cache_still_knows_who_paused_the_deployment() {
        let mut d: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "uid": "u", "managedFields": [
                {"manager": "kubectl-client-side-apply", "operation": "Update", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {}}}},
                {"manager": "kubectl-rollout", "operation": "Update", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:spec": {"f:paused": {}}}}
            ]},
            "spec": {"paused": true, "selector": {}, "template": {}}
        }))
        .unwrap();
        trim_deployment(&mut d);
        let fields = d.metadata.managed_fields.as_ref().unwrap();
        assert_eq!(fields.len(), 1, "only the owner of spec.paused is kept");
        let v = DeploymentView::from_parts(&d, &[]);
        assert_eq!(v.paused_by_someone_else(), Some("kubectl-rollout"));
    }

    #[test]
    fn a_complete_job_succeeded() {
        let j = job(
            json!({"conditions": [{"type": "Complete", "status": "True"}], "completionTime": "2026-01-01T00:00:00Z"}),
        );
        let v = JobView::from_parts(&j, &[]);
        assert!(matches!(v.state, JobState::Succeeded { finished: Some(_) }));
        assert!(v.finished());
    }
}
