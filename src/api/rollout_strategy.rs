//! The `RolloutStrategy` kind: lifecycle hooks (pre, mid, post) around the rollout of one plain
//! Deployment, and the status that records every step so a restarted operator resumes.
//!
//! Shapes, ranges and the cross-field rules are declared here as schema and CEL, so the API
//! server rejects a bad strategy before the controller ever sees it.

use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::common::{
    DNS_LABEL_PATTERN, DNS_SUBDOMAIN_PATTERN, conditions_schema, env_vars_schema,
    int_or_string_schema, preserve_unknown_object_schema, time_schema, unwrap_descriptions,
};
use super::webhook::WebhookHook;

/// Annotation on a RolloutStrategy that opens an approval gate: `ballast.dev/approve=<revision>`.
pub const APPROVE_ANNOTATION: &str = "ballast.dev/approve";
/// Annotation on a RolloutStrategy that retries a failed revision: `ballast.dev/retry=<revision>`.
pub const RETRY_ANNOTATION: &str = "ballast.dev/retry";
/// Annotation on a RolloutStrategy that fails the revision under way, with `onFailure` applied:
/// `ballast.dev/abort=<revision>`.
pub const ABORT_ANNOTATION: &str = "ballast.dev/abort";

/// Longest hook name: leaves room in the 63-character Job name for the strategy name, the
/// revision and the attempt.
pub const HOOK_NAME_MAX_LENGTH: u32 = 40;
/// Message of the rules that keep hook names unique (they name Jobs and status entries).
const UNIQUE_HOOK_NAMES: &str = "hook names must be unique across pre, mid and post";

/// Most hooks at one point (pre, mid or post).
pub const MAX_HOOKS_PER_POINT: u32 = 20;

/// Longest timeout or deadline, in seconds (7 days). Every integer the API accepts is bounded
/// so that the controller can hold it (and do arithmetic on it) without overflow.
pub const MAX_SECONDS: i32 = 604_800;

/// The Deployment to drive and its hooks. At rest the Deployment is paused; a new revision
/// (a change of its pod template) runs: pre hooks while the old pods keep serving, then the
/// rollout with mid hooks at their progress points, then post hooks. A failed hook either rolls
/// the Deployment back to its last good template or halts it, as `onFailure` says.
// Each printcolumn(...) repeats `type_ = ...`; clippy mistakes that for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ballast.dev",
    version = "v1alpha1",
    kind = "RolloutStrategy",
    plural = "rolloutstrategies",
    singular = "rolloutstrategy",
    shortname = "rost",
    category = "ballast",
    namespaced,
    status = "RolloutStrategyStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Sequences the rollout of a Deployment with container-based lifecycle hooks: pre (before any new pod starts), mid (at progress points) and post (after the rollout).",
    printcolumn(
        name = "Target",
        type_ = "string",
        description = "The Deployment",
        json_path = ".spec.targetRef.name"
    ),
    printcolumn(
        name = "Phase",
        type_ = "string",
        description = "Where the current revision is",
        json_path = ".status.phase"
    ),
    printcolumn(
        name = "Hook",
        type_ = "string",
        description = "The hook running or waiting",
        json_path = ".status.currentHook"
    ),
    printcolumn(
        name = "Revision",
        type_ = "string",
        description = "Revision being rolled out",
        json_path = ".status.currentRevision"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        description = "Replicas the Deployment wants",
        json_path = ".status.desiredReplicas"
    ),
    printcolumn(
        name = "Updated",
        type_ = "integer",
        description = "Replicas of the current revision",
        json_path = ".status.updatedReplicas"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        description = "Ready replicas of the desired ones",
        json_path = ".status.ready"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        description = "What the strategy is doing or waiting for",
        json_path = ".status.message",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "(!has(self.pre) || self.pre.all(p, (!has(self.mid) || !self.mid.exists(m, m.name == p.name)) && (!has(self.post) || !self.post.exists(q, q.name == p.name)))) && (!has(self.mid) || !has(self.post) || self.mid.all(m, !self.post.exists(q, q.name == m.name)))"
).message(UNIQUE_HOOK_NAMES))]
#[schemars(transform = unwrap_descriptions)]
pub struct RolloutStrategySpec {
    /// The Deployment (in this namespace) whose rollouts this strategy sequences. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("targetRef is immutable"))]
    pub target_ref: TargetRef,

    /// Hooks run before any pod of the new revision starts, while the old pods keep serving
    /// (e.g. a database migration). They run in the order listed; at most 20.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_HOOKS_PER_POINT))]
    #[x_kube(
        validation = Rule::new("self.all(a, self.exists_one(b, b.name == a.name))")
            .message(UNIQUE_HOOK_NAMES),
        validation = Rule::new("self.all(h, !has(h.at))")
            .message("at is only allowed in mid hooks")
            .reason(Reason::FieldValueForbidden),
        validation = Rule::new("self.all(h, !has(h.approval))")
            .message("approval is only allowed in mid hooks")
            .reason(Reason::FieldValueForbidden)
    )]
    pub pre: Vec<Hook>,

    /// Hooks run part-way through the rollout, each when its `at` progress point is reached:
    /// the Deployment is paused, the hook runs, and the rollout resumes (e.g. a smoke test, or
    /// an approval gate). They run in the order listed; at most 20.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_HOOKS_PER_POINT))]
    #[x_kube(
        validation = Rule::new("self.all(a, self.exists_one(b, b.name == a.name))")
            .message(UNIQUE_HOOK_NAMES),
        validation = Rule::new("self.all(h, has(h.at))")
            .message("every mid hook needs at: a replica count or a percent")
            .reason(Reason::FieldValueRequired)
    )]
    pub mid: Vec<Hook>,

    /// Hooks run after the rollout completes (e.g. purging shared caches). They run in the
    /// order listed; at most 20.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_HOOKS_PER_POINT))]
    #[x_kube(
        validation = Rule::new("self.all(a, self.exists_one(b, b.name == a.name))")
            .message(UNIQUE_HOOK_NAMES),
        validation = Rule::new("self.all(h, !has(h.at))")
            .message("at is only allowed in mid hooks")
            .reason(Reason::FieldValueForbidden),
        validation = Rule::new("self.all(h, !has(h.approval))")
            .message("approval is only allowed in mid hooks")
            .reason(Reason::FieldValueForbidden)
    )]
    pub post: Vec<Hook>,

    /// What a failed hook (with failurePolicy `Abort`, or `Retry` out of retries) or a missed
    /// progress deadline does: `Rollback` (default) puts the last good pod template back, so no
    /// pod of the failed revision stays; `Halt` leaves the Deployment paused where it is.
    /// Either way the phase is `Failed` or `RolledBack` until a new template or the
    /// `ballast.dev/retry=<revision>` annotation starts again.
    #[serde(default)]
    pub on_failure: OnFailure,

    /// Seconds each progress phase of the rollout (between hooks) may take before the revision
    /// fails, 1..604800 (7 days). Paused Deployments have no deadline of their own, so this one
    /// applies. Default 600.
    #[serde(default = "default_progress_deadline_seconds")]
    #[schemars(range(min = 1, max = MAX_SECONDS))]
    pub progress_deadline_seconds: i32,

    /// Finished hook Jobs kept per hook (older ones are deleted), 0..100. Default 3.
    #[serde(default = "default_hook_history_limit")]
    #[schemars(range(min = 0, max = 100))]
    pub hook_history_limit: i32,
}

fn default_progress_deadline_seconds() -> i32 {
    600
}

fn default_hook_history_limit() -> i32 {
    3
}

impl RolloutStrategySpec {
    /// The hooks at one point, in the order they run.
    pub fn hooks_at(&self, point: HookPoint) -> &[Hook] {
        match point {
            HookPoint::Pre => &self.pre,
            HookPoint::Mid => &self.mid,
            HookPoint::Post => &self.post,
        }
    }

    /// Every hook with its point, in the order they run in a rollout.
    pub fn hooks(&self) -> impl Iterator<Item = (HookPoint, &Hook)> {
        [HookPoint::Pre, HookPoint::Mid, HookPoint::Post]
            .into_iter()
            .flat_map(move |point| self.hooks_at(point).iter().map(move |h| (point, h)))
    }
}

/// The Deployment a strategy drives.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TargetRef {
    /// Name of a Deployment in this namespace.
    #[schemars(length(min = 1, max = 253), pattern(DNS_SUBDOMAIN_PATTERN))]
    pub name: String,
}

/// One lifecycle hook: a Job built from the new revision's container, a full Job, a call to an
/// external engine, or (mid only) a manual approval gate. Exactly one of `container`, `job`,
/// `webhook` and `approval` is set.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("(has(self.container) ? 1 : 0) + (has(self.job) ? 1 : 0) + (has(self.webhook) ? 1 : 0) + (has(self.approval) ? 1 : 0) == 1")
        .message("exactly one of container, job, webhook or approval must be set"),
    validation = Rule::new("!has(self.serviceAccountName) || has(self.container) || has(self.job)")
        .message("serviceAccountName is only for container and job hooks")
        .field_path(".serviceAccountName")
        .reason(Reason::FieldValueForbidden),
    validation = Rule::new("!has(self.retries) || self.retries == 0 || (has(self.failurePolicy) && self.failurePolicy == 'Retry')")
        .message("retries is only allowed when failurePolicy is Retry")
        .field_path(".retries")
        .reason(Reason::FieldValueForbidden),
    validation = Rule::new("!has(self.failurePolicy) || self.failurePolicy != 'Retry' || (has(self.retries) && self.retries >= 1)")
        .message("failurePolicy Retry needs retries between 1 and 10")
        .field_path(".retries")
        .reason(Reason::FieldValueRequired),
)]
pub struct Hook {
    /// Name of the hook: a DNS label of at most 40 characters, unique across pre, mid and post.
    /// It is part of the hook Job's name and of its `ballast.dev/hook` label.
    #[schemars(length(min = 1, max = HOOK_NAME_MAX_LENGTH), pattern(DNS_LABEL_PATTERN))]
    pub name: String,

    /// Mid hooks only, and required there: the progress point, as a count of updated and
    /// available replicas (e.g. `2`) or a percent of `spec.replicas` from `1%` to `100%`
    /// (e.g. `50%`, rounded up, but a percent below 100% always leaves one old replica:
    /// `90%` of 4 is 3). A point beyond `spec.replicas` is reached when all replicas are
    /// updated. With the `Recreate` strategy a mid hook runs once the old pods are gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "int_or_string_schema")]
    #[x_kube(
        validation = Rule::new("type(self) == int ? self >= 1 : self.matches('^([1-9][0-9]?|100)%$')")
            .message("at must be a positive replica count or a percent from 1% to 100%"),
        validation = Rule::new("type(self) != int || self <= 1000000")
            .message("at: a replica count must be at most 1000000")
    )]
    pub at: Option<IntOrString>,

    /// Run a Job built from a container of the new revision's pod template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerHook>,

    /// Run a Job with this spec (a batch/v1 JobSpec: `template` is required). The API server
    /// validates it when the hook Job is created; ballast adds its labels, env and owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "job_spec_schema")]
    pub job: Option<serde_json::Value>,

    /// Call an external engine over HTTP: a 2xx answer passes the hook, `202 Accepted` waits for
    /// its decision (`ballast.dev/approve` or `ballast.dev/abort` for the revision, within
    /// `timeoutSeconds`), anything else fails it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<WebhookHook>,

    /// Mid hooks only: a manual gate. The rollout waits, paused, until this RolloutStrategy is
    /// annotated `ballast.dev/approve=<revision>` (the revision in `status.currentRevision`),
    /// or, with `approval.timeoutSeconds`, until that deadline passes (then `onTimeout`).
    /// The hook's timeoutSeconds, pendingTimeoutSeconds, retries and failurePolicy do not apply
    /// to a gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalGate>,

    /// What a failure of this hook does: `Abort` (default) fails the revision, and
    /// `spec.onFailure` decides what happens to the Deployment; `Retry` runs a new Job up to
    /// `retries` more times with backoff, then aborts; `Ignore` records the failure and goes on.
    #[serde(default)]
    pub failure_policy: FailurePolicy,

    /// Extra attempts after a failure, 0..10, with exponential backoff. Only with failurePolicy
    /// `Retry`, which needs at least 1. Default 0.
    #[serde(default)]
    #[schemars(range(min = 0, max = 10))]
    pub retries: i32,

    /// Seconds a hook Job may run (from its pod starting) before it is failed, 1..604800 (7
    /// days); for a webhook, how long it may wait for the engine's decision after a `202
    /// Accepted`. Default 600.
    #[serde(default = "default_timeout_seconds")]
    #[schemars(range(min = 1, max = MAX_SECONDS))]
    pub timeout_seconds: i32,

    /// Seconds a hook Job may stay unable to start (Pending, unschedulable, pulling or failing
    /// to pull its image, or refused by the API server) before it is failed, 1..604800 (7
    /// days). Default 300. Not used by webhooks (see `webhook.requestTimeoutSeconds`).
    #[serde(default = "default_pending_timeout_seconds")]
    #[schemars(range(min = 1, max = MAX_SECONDS))]
    pub pending_timeout_seconds: i32,

    /// ServiceAccount the hook Job's pod runs as (container and job hooks only). Default: the
    /// namespace's `default` ServiceAccount (not the Deployment's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), pattern(DNS_SUBDOMAIN_PATTERN))]
    pub service_account_name: Option<String>,
}

fn default_timeout_seconds() -> i32 {
    600
}

fn default_pending_timeout_seconds() -> i32 {
    300
}

/// The kinds of action a hook can take, borrowed from a [`Hook`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum HookAction<'a> {
    /// A Job built from a container of the new revision.
    Container(&'a ContainerHook),
    /// A Job with a user-written JobSpec.
    Job(&'a serde_json::Value),
    /// A call to an external engine.
    Webhook(&'a WebhookHook),
    /// A manual approval gate.
    Approval,
}

impl Hook {
    /// What this hook does; `None` only for a spec the API server would have rejected.
    pub fn action(&self) -> Option<HookAction<'_>> {
        match (&self.container, &self.job, &self.webhook, &self.approval) {
            (Some(c), None, None, None) => Some(HookAction::Container(c)),
            (None, Some(j), None, None) => Some(HookAction::Job(j)),
            (None, None, Some(w), None) => Some(HookAction::Webhook(w)),
            (None, None, None, Some(_)) => Some(HookAction::Approval),
            _ => None,
        }
    }
}

/// The replica count at which a mid hook with this `at` runs, for a Deployment that wants
/// `desired` replicas: a count as is, capped at `desired`; a percent of `desired` rounded up,
/// except that a percent below 100 always leaves at least one old replica (at most
/// `desired - 1`), so the point comes before the rollout is complete (`90%` of 4 is 3, not 4).
/// `None` when `at` is not a valid progress point.
pub fn progress_point(at: &IntOrString, desired: i32) -> Option<i32> {
    let desired = desired.max(0);
    match at {
        IntOrString::Int(n) if *n >= 1 => Some((*n).min(desired)),
        IntOrString::String(s) => {
            let percent: i64 = s.strip_suffix('%')?.parse().ok()?;
            if !(1..=100).contains(&percent) {
                return None;
            }
            let up = i32::try_from((percent * i64::from(desired) + 99) / 100).ok()?;
            Some(if percent < 100 {
                up.min(desired - 1).max(0)
            } else {
                up.min(desired)
            })
        }
        IntOrString::Int(_) => None,
    }
}

fn job_spec_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "required": ["template"],
        "properties": {
            "template": {
                "type": "object",
                "description": "Pod template of the Job (a core/v1 PodTemplateSpec); restartPolicy must be Never or OnFailure.",
                "x-kubernetes-preserve-unknown-fields": true,
            },
        },
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// A hook Job built from a container of the new revision's pod template.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerHook {
    /// Name of the container in the Deployment's pod template to copy. The hook gets its image,
    /// env, envFrom, volumeMounts (and the volumes they use), workingDir, resources and
    /// securityContext, and the pod's imagePullSecrets, all of the NEW revision.
    #[schemars(length(min = 1, max = 63), pattern(DNS_LABEL_PATTERN))]
    pub from: String,

    /// Entrypoint of the hook container. Not inherited: when empty, the image's ENTRYPOINT runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 4096)))]
    pub command: Vec<String>,

    /// Arguments to the entrypoint. Not inherited: when empty, the image's CMD is used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 4096)))]
    pub args: Vec<String>,

    /// Environment variables added to the inherited ones; on a name clash these win. The hook
    /// also gets BALLAST_STRATEGY, BALLAST_DEPLOYMENT, BALLAST_HOOK, BALLAST_HOOK_POINT,
    /// BALLAST_FROM_REVISION, BALLAST_TO_REVISION and BALLAST_ATTEMPT.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "env_vars_schema")]
    pub env: Vec<EnvVar>,
}

/// A manual approval gate: `approval: {}` waits for `ballast.dev/approve=<revision>` for as long
/// as it takes; `approval: {timeoutSeconds: 3600, onTimeout: Abort}` waits at most that long.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.onTimeout) || has(self.timeoutSeconds)")
        .message("onTimeout needs timeoutSeconds")
        .field_path(".onTimeout")
        .reason(Reason::FieldValueForbidden),
)]
#[schemars(transform = unwrap_descriptions)]
pub struct ApprovalGate {
    /// Seconds the gate waits for its approval, from the moment it is reached, 1..604800 (7
    /// days); then `onTimeout` decides. Unset: the gate waits until approved (or aborted).
    /// The deadline is in `status.hooks[].deadline`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_SECONDS))]
    pub timeout_seconds: Option<i32>,

    /// What the gate does when `timeoutSeconds` pass without an approval: `Abort` (default)
    /// fails the revision (then `spec.onFailure` applies, as for a failed hook); `Approve`
    /// opens the gate as an approval would. Only with `timeoutSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_timeout: Option<OnTimeout>,
}

impl ApprovalGate {
    /// What a timeout does (`Abort` unless said otherwise).
    pub fn on_timeout(&self) -> OnTimeout {
        self.on_timeout.unwrap_or_default()
    }
}

/// What an approval gate does when its `timeoutSeconds` pass: `Abort` or `Approve`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OnTimeout {
    #[default]
    Abort,
    Approve,
}

/// What a failed hook does: `Abort`, `Retry` or `Ignore`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum FailurePolicy {
    #[default]
    Abort,
    Retry,
    Ignore,
}

/// What a failed revision does to the Deployment: `Rollback` or `Halt`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum OnFailure {
    #[default]
    Rollback,
    Halt,
}

/// Where a hook runs: `Pre`, `Mid` or `Post`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum HookPoint {
    #[default]
    Pre,
    Mid,
    Post,
}

impl HookPoint {
    /// Lower-case name, as used in Job names, labels and `BALLAST_HOOK_POINT`.
    pub fn as_str(self) -> &'static str {
        match self {
            HookPoint::Pre => "pre",
            HookPoint::Mid => "mid",
            HookPoint::Post => "post",
        }
    }
}

/// Phase of a rollout: `Idle`, `PreHook`, `Rolling`, `MidHook`, `WaitingApproval`,
/// `WaitingExternal` (a webhook hook answered `202 Accepted`: its engine decides), `PostHook`,
/// `Succeeded`, `Failed` or `RolledBack`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RolloutPhase {
    #[default]
    Idle,
    PreHook,
    Rolling,
    MidHook,
    WaitingApproval,
    WaitingExternal,
    PostHook,
    Succeeded,
    Failed,
    RolledBack,
}

/// How the operator holds a governed Deployment while a revision's hooks run:
/// - `Admission`: the revision gate of `config/admission` pauses the Deployment in the very
///   write that creates a new revision; at rest it is not paused.
/// - `PauseAtRest`: where that gate cannot be used, the Deployment is kept paused at rest, so a
///   new template waits for the operator (which then runs the hooks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Gate {
    #[default]
    Admission,
    PauseAtRest,
}

impl Gate {
    pub fn as_str(self) -> &'static str {
        match self {
            Gate::Admission => "Admission",
            Gate::PauseAtRest => "PauseAtRest",
        }
    }
}

/// Phase of one hook run: `Pending`, `Running`, `Succeeded`, `Failed`, `Skipped` or `Waiting`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum HookPhase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
    Skipped,
    Waiting,
}

/// Observed state of a RolloutStrategy. Written by the operator only; all progress lives here,
/// so a restarted operator resumes where it was.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = unwrap_descriptions)]
pub struct RolloutStrategyStatus {
    /// The `.metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// kstatus conditions: `Ready` (at rest on a revision that rolled out), `Reconciling` (a
    /// revision is in progress) and `Stalled` (the revision failed, was rolled back or halted);
    /// and, kept for earlier readers, `Progressing` (as `Reconciling`) and `Failed`.
    /// `lastTransitionTime` moves only when a condition's status changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,

    /// Idle, PreHook, Rolling, MidHook, WaitingApproval, WaitingExternal, PostHook, Succeeded,
    /// Failed or RolledBack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<RolloutPhase>,

    /// The `.metadata.generation` of the target Deployment that this status describes: set
    /// once the operator has taken up what that generation holds (a new template's sequence
    /// started, or nothing to do). Wait for it to reach the Deployment's generation, then for
    /// `Ready` or `Stalled`, to wait for *this* revision (docs/rollout-strategy.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_generation: Option<i64>,

    /// How the Deployment is held while hooks run: `Admission` (paused by the admission gate
    /// for a new revision only) or `PauseAtRest` (kept paused at rest; the gate is not
    /// installed or not served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<Gate>,

    /// Revision (ballast's hash of the pod template) of the last template that rolled out
    /// completely.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_revision: Option<String>,

    /// Revision being rolled out, or the last one attempted. Approve and retry name this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<String>,

    /// The hook running or waiting, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_hook: Option<String>,

    /// Replicas of the Deployment, all revisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,

    /// Replicas of the current revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_replicas: Option<i32>,

    /// Ready replicas, all revisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_replicas: Option<i32>,

    /// Available replicas, all revisions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available_replicas: Option<i32>,

    /// The Deployment's `spec.replicas`: how many replicas it wants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,

    /// Ready replicas of all revisions against the desired count, as `kubectl get deploy`
    /// prints it, e.g. `3/4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,

    /// Human-readable summary of the phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,

    /// The field manager (e.g. `kubectl-rollout`) that paused the Deployment while its revision
    /// was rolling out. ballast leaves that pause alone, and `progressDeadlineSeconds` counts
    /// again from the resume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_by: Option<String>,

    /// The latest run of each hook for the current revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<HookStatus>,

    /// The last good pod template (of `stableRevision`), put back on rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserve_unknown_object_schema")]
    pub stable_template: Option<serde_json::Value>,

    /// Bookkeeping for the operator: the revision it has let roll out (unpaused once its pre
    /// hooks passed). A pause by someone else after that is theirs, and left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_revision: Option<String>,

    /// Bookkeeping for the operator: the Deployment's `spec.replicas` when the current rollout
    /// began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_replicas: Option<i32>,

    /// When `phase` last changed; progress deadlines count from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub phase_transition_time: Option<Time>,

    /// Bookkeeping for the operator: attempts of the current revision's hooks used by earlier
    /// runs (a `ballast.dev/retry` continues numbering after them, so no Job name repeats).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt_offset: i32,

    /// UID of the Deployment this status describes. A Deployment deleted and created again
    /// under the same name is a new object: it is adopted afresh, and nothing recorded for the
    /// old one (its stable template, its hooks) carries over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_uid: Option<String>,

    /// Bookkeeping for the operator: `ballast.dev/approve`, `ballast.dev/retry` and
    /// `ballast.dev/abort` values it has acted on (recorded here first), removed from the
    /// annotations next. A crash between the two writes neither loses an approval (or an abort)
    /// nor lets one approve a second gate.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub consumed_annotations: BTreeMap<String, String>,
}

/// One run of a hook.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookStatus {
    /// Name of the hook.
    pub name: String,
    /// `Pre`, `Mid` or `Post`.
    pub point: HookPoint,
    /// Revision the hook ran for.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub revision: String,
    /// Attempt number, from 1.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt: i32,
    /// Name of the hook Job (none for an approval gate or a webhook).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_name: Option<String>,
    /// Pending, Running, Succeeded, Failed, Skipped or Waiting (an approval gate, or a webhook
    /// whose engine answered `202 Accepted`).
    pub phase: HookPhase,
    /// Exit code of the hook container, once it terminated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// CamelCase reason of a failure, e.g. `Error`, `DeadlineExceeded`, `ImagePullBackOff`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Human-readable details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Last lines of the hook container's log, kept when the hook failed; for a webhook, the
    /// first lines of the answer's body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_tail: Option<String>,
    /// A webhook: the HTTP status of the engine's answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<i32>,
    /// A webhook: the `Idempotency-Key` of its call, recorded before the call is made. A call
    /// made again (the operator restarted while it was under way) carries the same key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// When the hook Job was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub start_time: Option<Time>,
    /// When the hook finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub finish_time: Option<Time>,
    /// An approval gate with `timeoutSeconds`: when it stops waiting and `onTimeout` applies; a
    /// webhook waiting for its engine's decision: when it fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub deadline: Option<Time>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    /// The RolloutStrategy example of DESIGN.md, verbatim.
    const DESIGN_EXAMPLE: &str = r#"
apiVersion: ballast.dev/v1alpha1
kind: RolloutStrategy
metadata: {name: web, namespace: shop}
spec:
  targetRef: {name: web}
  pre:
    - name: migrate
      container:
        from: app
        command: [bin/migrate, up]
        env: [{name: LOG_LEVEL, value: info}]
      failurePolicy: Abort
      retries: 2
      timeoutSeconds: 600
      pendingTimeoutSeconds: 120
      serviceAccountName: migrator
  mid:
    - name: smoke
      at: 50%
      job: {template: {spec: {restartPolicy: Never, containers: [{name: t, image: acme/smoke:1, args: [http://web]}]}}}
    - name: go-live
      at: 90%
      approval: {}
  post:
    - name: purge-cache
      container: {from: app, command: [bin/purge-cache]}
      failurePolicy: Ignore
  onFailure: Rollback
  progressDeadlineSeconds: 600
  hookHistoryLimit: 3
"#;

    #[test]
    fn design_example_deserializes() {
        let r: RolloutStrategy = serde_yaml::from_str(DESIGN_EXAMPLE).unwrap();
        assert_eq!(r.spec.target_ref.name, "web");
        let migrate = &r.spec.pre[0];
        assert_eq!(migrate.pending_timeout_seconds, 120);
        assert_eq!(migrate.service_account_name.as_deref(), Some("migrator"));
        let Some(HookAction::Container(c)) = migrate.action() else {
            panic!("migrate is a container hook");
        };
        assert_eq!(c.env[0].name, "LOG_LEVEL");
        assert_eq!(r.spec.mid[0].at, Some(IntOrString::String("50%".into())));
        assert!(matches!(r.spec.mid[0].action(), Some(HookAction::Job(_))));
        assert_eq!(r.spec.mid[1].action(), Some(HookAction::Approval));
        assert_eq!(r.spec.post[0].failure_policy, FailurePolicy::Ignore);
        let order: Vec<_> = r.spec.hooks().map(|(p, h)| (p, h.name.as_str())).collect();
        assert_eq!(
            order,
            [
                (HookPoint::Pre, "migrate"),
                (HookPoint::Mid, "smoke"),
                (HookPoint::Mid, "go-live"),
                (HookPoint::Post, "purge-cache"),
            ]
        );
    }

    #[test]
    fn minimal_spec_gets_documented_defaults() {
        let spec: RolloutStrategySpec = serde_yaml::from_str(
            "targetRef: {name: web}\npre: [{name: migrate, container: {from: app}}]",
        )
        .unwrap();
        assert_eq!(spec.on_failure, OnFailure::Rollback);
        assert_eq!(spec.progress_deadline_seconds, 600);
        assert_eq!(spec.hook_history_limit, 3);
        let hook = &spec.pre[0];
        assert_eq!(hook.failure_policy, FailurePolicy::Abort);
        assert_eq!(hook.retries, 0);
        assert_eq!(hook.timeout_seconds, 600);
        assert_eq!(hook.pending_timeout_seconds, 300);
        assert_eq!(hook.service_account_name, None);
    }

    #[test]
    fn integer_at_deserializes_as_count() {
        let hook: Hook = serde_yaml::from_str("{name: smoke, at: 2, approval: {}}").unwrap();
        assert_eq!(hook.at, Some(IntOrString::Int(2)));
    }

    #[test]
    fn progress_point_rounds_percent_up_and_caps_at_desired() {
        let pct = |s: &str| IntOrString::String(s.into());
        assert_eq!(progress_point(&pct("50%"), 3), Some(2));
        assert_eq!(progress_point(&pct("50%"), 4), Some(2));
        assert_eq!(progress_point(&pct("1%"), 10), Some(1));
        assert_eq!(progress_point(&pct("100%"), 7), Some(7));
        // Below 100%, at least one old replica is left: the point comes before completion.
        assert_eq!(progress_point(&pct("90%"), 4), Some(3));
        assert_eq!(progress_point(&pct("99%"), 10), Some(9));
        assert_eq!(progress_point(&pct("90%"), 100), Some(90));
        assert_eq!(progress_point(&pct("50%"), 1), Some(0));
        assert_eq!(progress_point(&pct("50%"), 0), Some(0));
        assert_eq!(progress_point(&IntOrString::Int(5), 3), Some(3));
        assert_eq!(progress_point(&IntOrString::Int(2), 3), Some(2));
        assert_eq!(progress_point(&pct("0%"), 3), None);
        assert_eq!(progress_point(&pct("150%"), 3), None);
        assert_eq!(progress_point(&pct("5"), 3), None);
        assert_eq!(progress_point(&IntOrString::Int(0), 3), None);
    }

    #[test]
    fn empty_status_serializes_to_empty_object() {
        let json = serde_json::to_value(RolloutStrategyStatus::default()).unwrap();
        assert_eq!(json, serde_json::json!({}));
    }

    fn schema() -> serde_json::Value {
        let crd = RolloutStrategy::crd();
        serde_json::to_value(&crd.spec.versions[0].schema).unwrap()["openAPIV3Schema"].clone()
    }

    #[test]
    fn schema_declares_defaults() {
        let spec = &schema()["properties"]["spec"]["properties"];
        assert_eq!(spec["onFailure"]["default"], "Rollback");
        assert_eq!(spec["progressDeadlineSeconds"]["default"], 600);
        assert_eq!(spec["hookHistoryLimit"]["default"], 3);
        let hook = &spec["pre"]["items"]["properties"];
        assert_eq!(hook["failurePolicy"]["default"], "Abort");
        assert_eq!(hook["retries"]["default"], 0);
        assert_eq!(hook["timeoutSeconds"]["default"], 600);
        assert_eq!(hook["pendingTimeoutSeconds"]["default"], 300);
    }

    #[test]
    fn schema_carries_cross_field_rules() {
        let text = serde_json::to_string(&schema()).unwrap();
        for message in [
            "hook names must be unique across pre, mid and post",
            "targetRef is immutable",
            "exactly one of container, job, webhook or approval must be set",
            "serviceAccountName is only for container and job hooks",
            "exactly one of service or url must be set",
            "url may not carry credentials",
            "approval is only allowed in mid hooks",
            "at is only allowed in mid hooks",
            "every mid hook needs at",
            "retries is only allowed when failurePolicy is Retry",
            "onTimeout needs timeoutSeconds",
            "at must be a positive replica count or a percent from 1% to 100%",
        ] {
            assert!(text.contains(message), "missing rule: {message}");
        }
    }

    #[test]
    fn job_is_a_small_preserved_object() {
        let job =
            &schema()["properties"]["spec"]["properties"]["mid"]["items"]["properties"]["job"];
        assert_eq!(job["x-kubernetes-preserve-unknown-fields"], true);
        assert_eq!(job["required"], serde_json::json!(["template"]));
    }
}
