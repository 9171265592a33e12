//! THE state machine of a RolloutStrategy: `(observed state) -> next action`, pure.
//!
//! [`decide`] gets the strategy's spec and status, the target Deployment, the hook Jobs and the
//! time, and returns one [`Decision`]: the writes to make (in order), the status to record after
//! them, the Events to publish and when to look again. The caller performs it and calls
//! [`decide`] again with what it then observes, until a decision changes nothing. Every step is
//! derived from status plus observation, so a restart at any moment resumes where it was: each
//! write is either recorded in status before the next step depends on it, or can be seen on the
//! cluster (a Job exists, the Deployment is paused, the template is the stable one).

use super::observe::{DeploymentView, HookPod, JobView};
use super::webhook::{AllowedHosts, CallState};
use crate::api::rollout_strategy::{ABORT_ANNOTATION, APPROVE_ANNOTATION, RETRY_ANNOTATION};
use crate::api::{Gate, HookPoint, RolloutPhase, RolloutStrategySpec, RolloutStrategyStatus};
use crate::k8s::conditions::{Status, set_condition};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

/// Reason of a hook entry whose hook left the spec while it ran.
pub const CANCELLED: &str = "Cancelled";
/// Reason of a hook entry that was running or waiting when its revision was aborted
/// (`ballast.dev/abort`).
pub const ABORTED: &str = "Aborted";
/// Reason of an approval gate opened by `ballast.dev/approve`.
pub const APPROVED: &str = "Approved";
/// Reason of an approval gate whose `timeoutSeconds` passed: with `onTimeout: Approve` it is
/// opened, with `Abort` it fails the revision.
pub const APPROVAL_TIMEOUT: &str = "ApprovalTimeout";
/// Reason of a webhook hook whose engine answered `202 Accepted` and did not decide within the
/// hook's `timeoutSeconds` (from the hook's start).
pub const WEBHOOK_DECISION_TIMEOUT: &str = "WebhookDecisionTimeout";

/// Reason of the Event that a revision's sequence started.
pub const ROLLOUT_STARTED: &str = "RolloutStarted";
/// Reason of the Event that a revision rolled out and is the stable one now.
pub const ROLLOUT_SUCCEEDED: &str = "RolloutSucceeded";

/// First retry backoff; doubled per attempt.
pub const BACKOFF_BASE_SECONDS: i64 = 5;
/// Longest retry backoff.
pub const BACKOFF_MAX_SECONDS: i64 = 300;

/// A write the controller makes. Performed in the order given, before the status is recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// `spec.paused: true` (server-side apply).
    Pause,
    /// `spec.paused: false` (server-side apply).
    Unpause,
    /// `spec.replicas` (Recreate mid hooks, and bringing them back).
    Scale(i32),
    /// Put `status.stableTemplate` back as `spec.template`.
    RestoreTemplate,
    /// Create (or adopt) the Job of one attempt of a hook for `revision`.
    CreateJob {
        point: HookPoint,
        hook: String,
        revision: String,
        attempt: i32,
    },
    /// Delete a hook Job (and its pods).
    DeleteJob(String),
    /// Make the call of one attempt of a webhook hook for `revision`, off the reconcile path
    /// (its entry, Running with `key`, is recorded first). The caller makes at most one call
    /// per key in a process; the answer wakes the strategy.
    StartCall {
        point: HookPoint,
        hook: String,
        revision: String,
        attempt: i32,
        key: String,
    },
    /// Remove an annotation of the strategy once acted on.
    RemoveAnnotation(&'static str),
    /// Say on the Deployment which strategy governs it and the phase it is in
    /// ([`STRATEGY_ANNOTATION`], [`PHASE_LABEL`]), and label it [`GOVERNED_LABEL`] and with its
    /// gate shard ([`SHARD_LABEL`]).
    Annotate(RolloutPhase),
    /// Set (`true`) or remove the strategy's [`TARGET_GOVERNED_LABEL`]: whether the revision
    /// gate's cheap bindings cover its Deployment, so the costly one may leave the strategy out.
    /// Either way the strategy is labelled with its Deployment's gate shard ([`SHARD_LABEL`]).
    MarkTarget(bool),
}

pub use crate::controller::rollout_strategy::gate::{
    GOVERNED_LABEL, SHARD_LABEL, TARGET_GOVERNED_LABEL, shard_of,
};
pub use plan::{Plan, plan};

/// On a governed Deployment: the RolloutStrategy that governs it.
pub const STRATEGY_ANNOTATION: &str = "ballast.dev/rollout-strategy";
/// On a governed Deployment, a label: the phase of its strategy's current revision. A label,
/// not an annotation: a Deployment's annotations bump its generation and are copied to its
/// ReplicaSets, its labels are not (`kubectl get deploy -L ballast.dev/rollout-phase`).
pub const PHASE_LABEL: &str = "ballast.dev/rollout-phase";

impl Effect {
    /// Whether this effect pauses or unpauses the Deployment: a write that also carries its
    /// phase label and strategy annotation.
    pub fn holds_or_lets_go(&self) -> bool {
        matches!(self, Effect::Pause | Effect::Unpause)
    }

    /// Whether this effect writes the Deployment (rather than a Job or the strategy).
    pub fn writes_deployment(&self) -> bool {
        matches!(
            self,
            Effect::Pause
                | Effect::Unpause
                | Effect::Scale(_)
                | Effect::RestoreTemplate
                | Effect::Annotate(_)
        )
    }

    /// What the write does, for messages.
    pub fn describe(&self) -> String {
        match self {
            Effect::Pause => "pausing the Deployment".into(),
            Effect::Unpause => "unpausing the Deployment".into(),
            Effect::Scale(n) => format!("scaling the Deployment to {n}"),
            Effect::RestoreTemplate => "restoring the stable pod template".into(),
            Effect::CreateJob { hook, .. } => format!("creating the Job of hook {hook}"),
            Effect::DeleteJob(j) => format!("deleting Job {j}"),
            Effect::StartCall { hook, .. } => format!("calling the webhook of hook {hook}"),
            Effect::RemoveAnnotation(a) => format!("removing annotation {a}"),
            Effect::Annotate(p) => {
                format!("annotating the Deployment with phase {}", phase_name(*p))
            }
            Effect::MarkTarget(true) => format!("labelling the strategy {TARGET_GOVERNED_LABEL}"),
            Effect::MarkTarget(false) => {
                format!("removing the strategy's label {TARGET_GOVERNED_LABEL}")
            }
        }
    }
}

/// A write the API server refused for good (a 4xx other than a conflict or throttling): the
/// machine records it instead of trying the same write again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub effect: Effect,
    /// HTTP status code of the refusal.
    pub code: u16,
    /// The API server's message.
    pub message: String,
}

/// An Event to publish about a transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

/// A finished hook run, for metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct HookResult {
    pub point: HookPoint,
    pub result: &'static str,
    pub seconds: f64,
}

/// What to do now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    pub effects: Vec<Effect>,
    pub status: RolloutStrategyStatus,
    pub events: Vec<Note>,
    pub hook_results: Vec<HookResult>,
    /// Finished Jobs beyond `hookHistoryLimit` (only offered when nothing else is to be done).
    pub prune: Vec<String>,
    /// Look again after this long even without a change (a timeout or a backoff ends).
    pub requeue: Option<Duration>,
}

impl Decision {
    /// Whether performing this decision changes anything.
    pub fn changes(&self, old: &RolloutStrategyStatus) -> bool {
        !self.effects.is_empty() || self.status != *old
    }

    /// Whether this decision takes a step: a write, or a status change beyond the fields that
    /// follow the Deployment ([`without_following`]). A decision that only updates those is
    /// recorded with the next step or at a bounded pace (the controller's).
    pub fn steps(&self, old: &RolloutStrategyStatus) -> bool {
        !self.effects.is_empty() || without_following(&self.status) != without_following(old)
    }
}

/// `s` without the fields that follow the Deployment as it rolls out rather than the revision's
/// sequence: its replica counts and the Deployment generation taken up. A 10-replica rollout
/// changes them a dozen times; written with the revision's transitions and, in between, at a
/// bounded pace, they lag the Deployment by at most that pace.
pub fn without_following(s: &RolloutStrategyStatus) -> RolloutStrategyStatus {
    RolloutStrategyStatus {
        replicas: None,
        updated_replicas: None,
        ready_replicas: None,
        available_replicas: None,
        desired_replicas: None,
        ready: None,
        deployment_generation: None,
        ..s.clone()
    }
}

/// Everything a decision is made from.
pub struct Input<'a> {
    /// Name of the strategy (hook Job names start with it).
    pub name: &'a str,
    pub generation: Option<i64>,
    pub spec: &'a RolloutStrategySpec,
    pub status: &'a RolloutStrategyStatus,
    /// Value of `ballast.dev/approve`.
    pub approve: Option<&'a str>,
    /// Value of `ballast.dev/retry`.
    pub retry: Option<&'a str>,
    /// Value of `ballast.dev/abort`.
    pub abort: Option<&'a str>,
    pub deployment: Option<&'a DeploymentView>,
    pub jobs: &'a [JobView],
    pub now: Timestamp,
    /// An older RolloutStrategy that targets the same Deployment: this one then stands aside
    /// (writes nothing) and says so.
    pub governed_by: Option<&'a str>,
    /// Pods of this strategy's hook Jobs that have not terminated (deleting ones included): no
    /// new hook Job is created while one exists, so two pods of a hook never run at once.
    pub live_pods: &'a [HookPod],
    /// A write of the previous decision that the API server refused.
    pub rejected: Option<&'a Rejection>,
    /// How the Deployment is held while hooks run ([`Gate`]).
    pub gate: Gate,
    /// The strategy carries [`TARGET_GOVERNED_LABEL`].
    pub target_marked: bool,
    /// The strategy carries [`SHARD_LABEL`] with its Deployment's shard.
    pub target_shard_labelled: bool,
    /// What webhook hooks are decided on.
    pub webhooks: &'a Webhooks,
}

/// What the machine knows of webhook hooks: the strategy's namespace and UID (a call's target
/// and key), the hosts `url:` may name, and the calls of this process by key.
#[derive(Clone, Debug, Default)]
pub struct Webhooks {
    pub namespace: String,
    pub uid: String,
    pub allowed: AllowedHosts,
    /// Calls this process made or makes, by idempotency key; a key absent is
    /// [`CallState::Unknown`].
    pub calls: std::collections::BTreeMap<String, CallState>,
}

impl Webhooks {
    fn call(&self, key: &str) -> CallState {
        self.calls.get(key).cloned().unwrap_or(CallState::Unknown)
    }
}

/// How a revision's sequence starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Start {
    /// A new template: attempts continue after any earlier run of this revision, so an old Job
    /// is never taken for a new run.
    New,
    /// `ballast.dev/retry`: like `New`, after the attempts of the failed run too.
    Retry,
    /// Adoption with no status (a new strategy, or its status lost): the Jobs that exist for
    /// this revision are this sequence's own, and are adopted instead of run again.
    Adopt,
}

/// The CamelCase name of a phase.
pub fn phase_name(p: RolloutPhase) -> &'static str {
    match p {
        RolloutPhase::Idle => "Idle",
        RolloutPhase::PreHook => "PreHook",
        RolloutPhase::Rolling => "Rolling",
        RolloutPhase::MidHook => "MidHook",
        RolloutPhase::WaitingApproval => "WaitingApproval",
        RolloutPhase::WaitingExternal => "WaitingExternal",
        RolloutPhase::PostHook => "PostHook",
        RolloutPhase::Succeeded => "Succeeded",
        RolloutPhase::Failed => "Failed",
        RolloutPhase::RolledBack => "RolledBack",
    }
}

/// Whether a revision's sequence is under way.
pub fn in_progress(p: RolloutPhase) -> bool {
    matches!(
        p,
        RolloutPhase::PreHook
            | RolloutPhase::Rolling
            | RolloutPhase::MidHook
            | RolloutPhase::WaitingApproval
            | RolloutPhase::WaitingExternal
            | RolloutPhase::PostHook
    )
}

/// Backoff before attempt `n + 1` after the `n`th (from 1) failed: 5s·2^(n-1), capped.
pub fn backoff(n: i32) -> SignedDuration {
    let exp = u32::try_from(n.clamp(1, 20) - 1).unwrap_or(0);
    SignedDuration::from_secs(
        BACKOFF_BASE_SECONDS
            .saturating_mul(2i64.saturating_pow(exp))
            .min(BACKOFF_MAX_SECONDS),
    )
}

fn point_phase(p: HookPoint) -> RolloutPhase {
    match p {
        HookPoint::Pre => RolloutPhase::PreHook,
        HookPoint::Mid => RolloutPhase::MidHook,
        HookPoint::Post => RolloutPhase::PostHook,
    }
}

fn short(rev: Option<&str>) -> &str {
    rev.unwrap_or("none")
}

/// How far the hooks of one point got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Run {
    /// Something changed (recorded in status or an effect); decide again afterwards.
    Acted,
    /// A hook runs or waits.
    Waiting,
    /// The revision failed.
    Failed,
    /// Every hook is done.
    Done,
}

struct Machine<'a> {
    i: &'a Input<'a>,
    st: RolloutStrategyStatus,
    d: Decision,
}

/// Decides the next step. See the module documentation.
pub fn decide(i: &Input) -> Decision {
    let mut m = Machine {
        i,
        st: i.status.clone(),
        d: Decision::default(),
    };
    m.st.observed_generation = i.generation;
    if !m.clear_consumed() {
        m.step();
    }
    m.finish()
}

impl<'a> Machine<'a> {
    fn now(&self) -> Timestamp {
        self.i.now
    }

    fn phase(&self) -> RolloutPhase {
        self.st.phase.unwrap_or_default()
    }

    fn set_phase(&mut self, p: RolloutPhase) {
        if self.st.phase != Some(p) {
            self.st.phase = Some(p);
            self.st.phase_transition_time = Some(Time(self.now()));
            // Said of the rolling phase only.
            self.st.paused_by = None;
        }
    }

    /// Whether the revision gate holds new revisions (rather than pausing at rest).
    fn admission(&self) -> bool {
        self.i.gate == Gate::Admission
    }

    fn effect(&mut self, e: Effect) {
        self.d.effects.push(e);
    }

    fn event(&mut self, warning: bool, reason: &'static str, message: String) {
        self.d.events.push(Note {
            warning,
            reason,
            message,
        });
    }

    fn requeue_in(&mut self, d: SignedDuration) {
        let secs = d.as_secs_f64().max(0.0) + 0.5;
        let d = Duration::from_secs_f64(secs.min(3600.0));
        self.d.requeue = Some(self.d.requeue.map_or(d, |r| r.min(d)));
    }

    /// An approval or retry acted on is recorded in status first (`consume`); the annotation is
    /// removed in the next round, on its own, once that record is written. Returns whether there
    /// was one to clear (then nothing else is decided this round).
    fn clear_consumed(&mut self) -> bool {
        if self.st.consumed_annotations.is_empty() {
            return false;
        }
        for (key, value) in [
            (APPROVE_ANNOTATION, self.i.approve),
            (RETRY_ANNOTATION, self.i.retry),
            (ABORT_ANNOTATION, self.i.abort),
        ] {
            if value.is_some() && self.st.consumed_annotations.get(key).map(String::as_str) == value
            {
                self.effect(Effect::RemoveAnnotation(key));
            }
        }
        self.st.consumed_annotations.clear();
        true
    }

    /// Records that `key=value` was acted on; `clear_consumed` removes it next round.
    fn consume(&mut self, key: &'static str, value: &str) {
        self.st
            .consumed_annotations
            .insert(key.to_string(), value.to_string());
    }

    fn current(&self) -> String {
        self.st.current_revision.clone().unwrap_or_default()
    }

    fn step(&mut self) {
        let Some(dep) = self.i.deployment else {
            if self.st.phase.is_none() {
                self.set_phase(RolloutPhase::Idle);
            }
            self.st.message = Some(format!(
                "Deployment {} not found in this namespace",
                self.i.spec.target_ref.name
            ));
            return;
        };
        if let Some(other) = self.i.governed_by {
            if self.st.phase.is_none() {
                self.set_phase(RolloutPhase::Idle);
            }
            self.st.message = Some(format!(
                "Deployment {} is governed by RolloutStrategy {other}, the oldest strategy targeting it; this one does nothing",
                dep.name
            ));
            return;
        }
        if self
            .st
            .target_uid
            .as_deref()
            .is_some_and(|uid| uid != dep.uid)
        {
            self.replaced(dep);
        }
        self.st.target_uid = Some(dep.uid.clone());
        self.st.replicas = Some(dep.status_replicas);
        self.st.updated_replicas = Some(dep.updated_replicas);
        self.st.ready_replicas = Some(dep.ready_replicas);
        self.st.available_replicas = Some(dep.available_replicas);
        self.st.desired_replicas = Some(dep.replicas);
        self.st.ready = Some(format!("{}/{}", dep.ready_replicas, dep.replicas));

        if let Some(r) = self.i.rejected.filter(|r| r.effect.writes_deployment()) {
            self.write_refused(r);
            return;
        }
        self.cancel_removed_hooks();
        if self.abort(dep) {
            return;
        }
        if let Some(job) = self.stray_active_job(dep) {
            self.effect(Effect::DeleteJob(job));
            return;
        }
        if self.st.stable_revision.is_none() && self.st.current_revision.is_none() {
            self.adopt(dep);
        } else if in_progress(self.phase()) {
            self.progress(dep);
        } else {
            self.at_rest(dep);
        }
    }

    fn finish(mut self) -> Decision {
        let phase = self.phase();
        let generation = self.i.generation;
        let now = self.now();
        let conflicted = self.i.governed_by.is_some();
        let reason = if conflicted {
            "Conflicted"
        } else {
            phase_name(phase)
        };
        let message = self.st.message.clone().unwrap_or_default();
        let ready = matches!(phase, RolloutPhase::Idle | RolloutPhase::Succeeded) && !conflicted;
        let failed = matches!(phase, RolloutPhase::Failed | RolloutPhase::RolledBack);
        let reconciling = in_progress(phase) && !conflicted;
        let stalled = failed || conflicted;
        self.st.gate = Some(self.i.gate);
        if !conflicted && let Some(dep) = self.i.deployment {
            self.record_generation(dep);
            // A pause or an unpause carries the labels and the annotation itself, for the
            // phase this decision ends in (one write of the Deployment instead of two).
            if !self.holds_or_lets_go() {
                self.annotate(dep, phase);
            }
        }
        self.mark_target();
        let c = &mut self.st.conditions;
        for (kind, on) in [
            ("Ready", ready),
            ("Reconciling", reconciling),
            ("Stalled", stalled),
            ("Progressing", reconciling),
            ("Failed", failed),
        ] {
            set_condition(c, kind, Status::from(on), reason, &message, generation, now);
        }
        let mut d = self.d;
        d.status = self.st;
        let only_annotations = d
            .effects
            .iter()
            .all(|e| matches!(e, Effect::Annotate(_) | Effect::MarkTarget(_)));
        if only_annotations && d.status == *self.i.status {
            let m = Machine {
                i: self.i,
                st: d.status.clone(),
                d: Decision::default(),
            };
            d.prune = m.prunable();
        }
        d
    }

    /// `status.deploymentGeneration` names the Deployment generation this status has taken
    /// up: once the sequence of its template started (or it is the revision at rest). A
    /// round that only deleted a stray Job or cleared an annotation leaves it behind, so a
    /// waiter never reads the previous revision's `Ready` as this one's.
    fn record_generation(&mut self, dep: &DeploymentView) {
        let rev = Some(&dep.revision);
        let taken_up = self.st.current_revision.as_ref() == rev
            || (!in_progress(self.phase()) && self.st.stable_revision.as_ref() == rev);
        if taken_up && self.st.target_uid.as_deref() == Some(dep.uid.as_str()) {
            self.st.deployment_generation = Some(dep.generation);
        }
    }

    /// Whether a new revision is held (paused) before its pods start: for pre hooks, which
    /// must run before the new ReplicaSet exists, and for a Recreate Deployment's mid hooks,
    /// which run with no pod of either revision (unheld, the Deployment controller would start
    /// the new pods as soon as the old ones are gone). The revision gate's rule is the same
    /// (config/admission/revision_gate.yaml); a rolling update's mid hooks pause at their
    /// points, and post hooks run once the revision is out.
    fn holds_new_revisions(&self, dep: &DeploymentView) -> bool {
        !self.i.spec.pre.is_empty() || (dep.recreate && !self.i.spec.mid.is_empty())
    }

    /// Whether this decision pauses or unpauses the Deployment (a write that also carries its
    /// labels and annotation).
    fn holds_or_lets_go(&self) -> bool {
        self.d.effects.iter().any(Effect::holds_or_lets_go)
    }

    /// Keeps the Deployment's annotations naming this strategy and its phase, and its label.
    fn annotate(&mut self, dep: &DeploymentView, phase: RolloutPhase) {
        let name = phase_name(phase);
        if dep.annotation(STRATEGY_ANNOTATION) != Some(self.i.name)
            || dep.phase_label.as_deref() != Some(name)
            // Left by an earlier version, which kept the phase in an annotation.
            || dep.annotation(PHASE_LABEL).is_some()
            || !dep.governed_label
            || dep.gate_shard.as_deref() != Some(shard_of(&dep.name).as_str())
        {
            self.effect(Effect::Annotate(phase));
        }
    }

    /// Keeps [`TARGET_GOVERNED_LABEL`] on the strategy true: set once every write that could
    /// start a revision of its Deployment is covered without it (the Deployment carries
    /// [`GOVERNED_LABEL`], or gets it from an earlier effect of this decision, or does not
    /// exist, so only a create can make it), removed while the
    /// Deployment exists without the label. Whoever governs the Deployment (this strategy or
    /// an older one) labels it; a strategy standing aside is marked all the same, so it costs
    /// the namespace's other Deployments nothing either.
    fn mark_target(&mut self) {
        // Labelled by this very decision: the mark follows that write, which must succeed first.
        let labelling = self.holds_or_lets_go()
            || self
                .d
                .effects
                .iter()
                .any(|e| matches!(e, Effect::Annotate(_)));
        let covered = labelling || self.i.deployment.is_none_or(|d| d.governed_label);
        // Marked, it is labelled with its gate shard too (`config/admission`'s shard bindings).
        if covered != self.i.target_marked || (covered && !self.i.target_shard_labelled) {
            self.effect(Effect::MarkTarget(covered));
        }
    }
}

mod adopt;
mod call;
mod plan;
mod progress;
mod rest;
mod run;
#[cfg(test)]
mod tests;
