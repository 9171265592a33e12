//! THE state machine of a RolloutStrategy: `(observed state) -> next action`, pure.
//!
//! [`decide`] gets the strategy's spec and status, the target Deployment, the hook Jobs and the
//! time, and returns one [`Decision`]: the writes to make (in order), the status to record after
//! them, the Events to publish and when to look again. The caller performs it and calls
//! [`decide`] again with what it then observes, until a decision changes nothing. Every step is
//! derived from status plus observation, so a restart at any moment resumes where it was: each
//! write is either recorded in status before the next step depends on it, or can be seen on the
//! cluster (a Job exists, the Deployment is paused, the template is the stable one).

use super::hooks;
use super::observe::{DeploymentView, HookPod, JobState, JobView};
use crate::api::rollout_strategy::{APPROVE_ANNOTATION, RETRY_ANNOTATION, progress_point};
use crate::api::{
    FailurePolicy, Hook, HookPhase, HookPoint, HookStatus, OnFailure, RolloutPhase,
    RolloutStrategySpec, RolloutStrategyStatus,
};
use crate::k8s::conditions::{Status, set_condition};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

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
    /// Remove an annotation of the strategy once acted on.
    RemoveAnnotation(&'static str),
}

impl Effect {
    /// Whether this effect writes the Deployment (rather than a Job or the strategy).
    pub fn writes_deployment(&self) -> bool {
        matches!(
            self,
            Effect::Pause | Effect::Unpause | Effect::Scale(_) | Effect::RestoreTemplate
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
            Effect::RemoveAnnotation(a) => format!("removing annotation {a}"),
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
        }
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

        if let Some(r) = self.i.rejected.filter(|r| r.effect.writes_deployment()) {
            self.write_refused(r);
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

    /// The name of a hook entry's Job for the current revision.
    fn job_name(&self, e: &HookStatus) -> String {
        hooks::job_name(self.i.name, &e.name, &e.revision, e.attempt)
    }

    /// An entry that is running or about to run.
    fn is_open(e: &HookStatus) -> bool {
        matches!(e.phase, HookPhase::Pending | HookPhase::Running)
    }

    /// A Job that still runs but that nothing will follow: its hook timed out or was given up,
    /// it belongs to another revision or to a Deployment of the same name that was deleted, or
    /// its hook is no longer in the spec (renamed or removed while it ran). It is deleted so
    /// nothing of it keeps running. Before the current revision is known (no status yet),
    /// nothing is stray: a running Job of the revision about to start is adopted instead.
    fn stray_active_job(&self, dep: &DeploymentView) -> Option<String> {
        let cur = self.st.current_revision.as_deref()?;
        let in_spec = |hook: &str| self.i.spec.hooks().any(|(_, h)| h.name == hook);
        self.i
            .jobs
            .iter()
            .filter(|j| !j.finished())
            .find(|j| {
                if !j.targets(&dep.uid) || j.revision != cur || !in_spec(&j.hook) {
                    return true;
                }
                match self.st.hooks.iter().find(|e| e.name == j.hook) {
                    // Not started in status yet: adopted when its turn comes.
                    None => false,
                    Some(e) => !(Self::is_open(e) && self.job_name(e) == j.name),
                }
            })
            .map(|j| j.name.clone())
    }

    /// The Deployment was deleted and created again under the same name: nothing recorded for
    /// the old object (stable template, hooks, replicas set aside) applies to the new one, which
    /// is adopted afresh.
    fn replaced(&mut self, dep: &DeploymentView) {
        let old = self.st.target_uid.clone().unwrap_or_default();
        self.st = RolloutStrategyStatus {
            observed_generation: self.st.observed_generation,
            conditions: std::mem::take(&mut self.st.conditions),
            ..Default::default()
        };
        self.event(
            false,
            "TargetReplaced",
            format!(
                "Deployment {} was deleted and created again (uid {old} → {}): adopting the new one afresh",
                dep.name, dep.uid
            ),
        );
    }

    /// A write to the Deployment was refused by the API server. A revision under way fails
    /// (then `onFailure` applies); at rest the refusal is recorded. Either way the same write is
    /// not repeated in this decision: the reconcile backs off.
    fn write_refused(&mut self, r: &Rejection) {
        let msg = format!(
            "the API server refused {} (HTTP {}): {}",
            r.effect.describe(),
            r.code,
            r.message
        );
        if in_progress(self.phase()) {
            self.fail(msg);
            return;
        }
        if self.st.message.as_deref() != Some(msg.as_str()) {
            self.event(true, "WriteRejected", msg.clone());
            self.st.message = Some(msg);
        }
    }

    fn adopt(&mut self, dep: &DeploymentView) {
        if dep.paused && !dep.ever_rolled_out() {
            self.start_sequence(dep.revision.clone(), Start::Adopt);
            return;
        }
        if dep.paused
            && !dep.has_replica_set_of(&dep.revision)
            && let Some(rs) = dep.serving_replica_set()
        {
            // Paused with a template change pending: what runs is stable, the change gets its
            // hooks.
            self.st.stable_revision = Some(rs.revision.clone());
            self.st.stable_template = Some(rs.template_json.clone());
            self.start_sequence(dep.revision.clone(), Start::Adopt);
            return;
        }
        if !dep.complete() && !dep.stalled {
            let ours = self
                .i
                .jobs
                .iter()
                .any(|j| j.revision == dep.revision && j.targets(&dep.uid));
            if dep.paused && ours {
                self.resume_lost(dep);
                return;
            }
            // Someone else's rollout is under way: freezing it now would leave it with mixed
            // ReplicaSets. It finishes (or misses its progress deadline) first.
            if self.st.phase.is_none() {
                self.set_phase(RolloutPhase::Idle);
            }
            self.st.message = Some(format!(
                "waiting for the rollout in progress of Deployment {} (revision {}) to complete before governing it{}",
                dep.name,
                dep.revision,
                if dep.paused {
                    "; it is paused: `kubectl rollout resume` lets it finish"
                } else {
                    ""
                }
            ));
            return;
        }
        if !dep.paused {
            self.effect(Effect::Pause);
        }
        self.st.stable_revision = Some(dep.revision.clone());
        self.st.stable_template = Some(dep.template_json.clone());
        self.st.current_revision = Some(dep.revision.clone());
        self.set_phase(RolloutPhase::Idle);
        self.st.message = Some(format!(
            "adopted Deployment {} at revision {}; it stays paused until a new revision",
            dep.name, dep.revision
        ));
    }

    /// A rollout of ours whose status was lost (cleared, or restored from an old backup) while
    /// the new revision's pods were rolling out: the revision resumes at `Rolling`, and the Jobs
    /// of its mid hooks that exist are adopted when their points are reached, never run again.
    fn resume_lost(&mut self, dep: &DeploymentView) {
        if let Some(rs) = dep
            .replica_sets
            .iter()
            .filter(|r| r.revision != dep.revision)
            .max_by_key(|r| (r.replicas, r.created))
        {
            self.st.stable_revision = Some(rs.revision.clone());
            self.st.stable_template = Some(rs.template_json.clone());
        }
        self.st.current_revision = Some(dep.revision.clone());
        self.st.hooks.clear();
        self.st.attempt_offset = 0;
        self.set_phase(RolloutPhase::Rolling);
        self.st.message = Some(format!(
            "revision {}: resumed the rollout in progress (its status was lost)",
            dep.revision
        ));
    }

    fn start_sequence(&mut self, revision: String, start: Start) {
        let retry = start == Start::Retry;
        // Attempts continue after any earlier run of this revision (a retry, or the revision
        // coming back after another one), so an old Job is never taken for a new run.
        let earlier_jobs = if start == Start::Adopt {
            0
        } else {
            self.i
                .jobs
                .iter()
                .filter(|j| j.revision == revision)
                .map(|j| j.attempt)
                .max()
                .unwrap_or(0)
        };
        let earlier_runs = if retry {
            self.st
                .hooks
                .iter()
                .map(|h| h.attempt)
                .max()
                .unwrap_or(0)
                .max(self.st.attempt_offset)
        } else {
            0
        };
        let offset = earlier_jobs.max(earlier_runs);
        let from = self.st.stable_revision.clone();
        self.event(
            false,
            "RolloutStarted",
            format!(
                "{} revision {revision} (from {})",
                if retry { "retrying" } else { "rolling out" },
                short(from.as_deref())
            ),
        );
        self.st.current_revision = Some(revision.clone());
        self.st.hooks.clear();
        self.st.attempt_offset = offset;
        self.st.current_hook = None;
        self.set_phase(RolloutPhase::PreHook);
        self.st.message = Some(format!("revision {revision}: pre hooks"));
    }

    fn progress(&mut self, dep: &DeploymentView) {
        let cur = self.current();
        if dep.revision != cur {
            self.superseded(dep);
            return;
        }
        match self.phase() {
            RolloutPhase::PreHook => self.pre(dep),
            RolloutPhase::Rolling => self.rolling(dep),
            RolloutPhase::MidHook | RolloutPhase::WaitingApproval => self.mid(dep),
            _ => self.post(dep),
        }
    }

    /// The template changed while a revision was under way: a hook Job that already runs is
    /// followed to its end (its result is recorded, a failure applies its policy), then the
    /// new revision starts from its pre hooks.
    fn superseded(&mut self, dep: &DeploymentView) {
        if !dep.paused {
            self.effect(Effect::Pause);
            return;
        }
        let running = self.st.hooks.iter().position(|e| {
            Self::is_open(e)
                && (e.job_name.is_some() || self.i.jobs.iter().any(|j| j.name == self.job_name(e)))
        });
        if let Some(idx) = running {
            let name = self.st.hooks[idx].name.clone();
            if let Some((point, hook)) = self.i.spec.hooks().find(|(_, h)| h.name == name) {
                let hook = hook.clone();
                self.track(idx, point, &hook, None);
                return;
            }
        }
        let old = self.current();
        if Some(&dep.revision) == self.st.stable_revision.as_ref() {
            self.st.current_hook = None;
            self.set_phase(RolloutPhase::RolledBack);
            self.st.message = Some(format!(
                "revision {old} was abandoned: the template went back to the stable revision {}",
                dep.revision
            ));
            self.event(
                false,
                "RolledBack",
                self.st.message.clone().unwrap_or_default(),
            );
            return;
        }
        self.start_sequence(dep.revision.clone(), Start::New);
        self.st.message = Some(format!(
            "revision {}: pre hooks (revision {old} was superseded)",
            dep.revision
        ));
    }

    fn pre(&mut self, dep: &DeploymentView) {
        if !dep.paused {
            self.effect(Effect::Pause);
            return;
        }
        if self.restore_replicas(dep, false) {
            return;
        }
        let hooks = self.i.spec.pre.clone();
        if self.run_hooks(HookPoint::Pre, &hooks, dep) == Run::Done {
            self.st.current_hook = None;
            self.set_phase(RolloutPhase::Rolling);
            self.st.message = Some(format!("revision {}: rolling out", dep.revision));
        }
    }

    /// Brings back replicas set aside for Recreate mid hooks. Returns whether it acted.
    fn restore_replicas(&mut self, dep: &DeploymentView, unpause: bool) -> bool {
        let Some(orig) = self.st.original_replicas else {
            return false;
        };
        if dep.replicas != orig {
            if unpause && dep.paused {
                self.effect(Effect::Unpause);
            }
            self.effect(Effect::Scale(orig));
        } else {
            self.st.original_replicas = None;
        }
        true
    }

    /// Whether a hook needs nothing more (succeeded, or failed and ignored).
    fn done(&self, h: &Hook) -> bool {
        self.st.hooks.iter().any(|e| {
            e.name == h.name
                && (matches!(e.phase, HookPhase::Succeeded | HookPhase::Skipped)
                    || (e.phase == HookPhase::Failed && h.failure_policy == FailurePolicy::Ignore))
        })
    }

    fn started(&self, h: &Hook) -> bool {
        self.st.hooks.iter().any(|e| e.name == h.name)
    }

    /// The number of new replicas at which a mid hook runs.
    fn point_of(h: &Hook, dep: &DeploymentView) -> i32 {
        h.at.as_ref()
            .and_then(|at| progress_point(at, dep.replicas))
            .unwrap_or(dep.replicas)
    }

    /// Whether the Deployment controller has scaled the new revision up to a mid hook's point:
    /// the moment to pause, so the rollout goes no further than that step.
    fn scaled_to(&self, h: &Hook, dep: &DeploymentView) -> bool {
        dep.desired_of(&dep.revision) >= Self::point_of(h, dep)
    }

    /// Whether the new revision's available replicas reached a mid hook's point: the moment
    /// the hook may start.
    fn reached(&self, h: &Hook, dep: &DeploymentView) -> bool {
        dep.observed() && dep.available_of(&dep.revision) >= Self::point_of(h, dep)
    }

    fn rolling(&mut self, dep: &DeploymentView) {
        let mid = self.i.spec.mid.clone();
        let next_mid = mid.iter().find(|h| !self.done(h)).cloned();
        if dep.recreate && !mid.is_empty() {
            if next_mid.is_some() {
                if self.st.original_replicas.is_none() {
                    self.st.original_replicas = Some(dep.replicas);
                    self.st.message = Some(format!(
                        "revision {}: Recreate: scaling to 0 for the mid hooks",
                        dep.revision
                    ));
                    return;
                }
                if !dep.paused {
                    self.effect(Effect::Pause);
                    return;
                }
                if dep.replicas != 0 {
                    self.effect(Effect::Scale(0));
                    return;
                }
                if !dep.observed() || dep.status_replicas > 0 {
                    self.deadline();
                    return;
                }
                self.set_phase(RolloutPhase::MidHook);
                self.st.message = Some(format!(
                    "revision {}: old pods are gone; mid hooks",
                    dep.revision
                ));
                return;
            }
            if self.restore_replicas(dep, true) {
                return;
            }
        }
        if dep.paused {
            self.effect(Effect::Unpause);
            return;
        }
        match next_mid {
            Some(h) if !dep.recreate => {
                // Paused as soon as the new revision is scaled to the point, so the rollout
                // goes no further while the hook waits for those pods and runs.
                if self.scaled_to(&h, dep) {
                    self.effect(Effect::Pause);
                    self.set_phase(RolloutPhase::MidHook);
                    self.st.message = Some(format!(
                        "revision {}: progress point of mid hook {} reached",
                        dep.revision, h.name
                    ));
                    return;
                }
            }
            _ => {
                if dep.complete() {
                    self.effect(Effect::Pause);
                    self.set_phase(RolloutPhase::PostHook);
                    self.st.message =
                        Some(format!("revision {}: rolled out; post hooks", dep.revision));
                    return;
                }
            }
        }
        self.deadline();
    }

    /// Fails the revision once the current progress phase has taken longer than
    /// `progressDeadlineSeconds`; otherwise looks again when it would have.
    fn deadline(&mut self) {
        let limit = SignedDuration::from_secs(i64::from(self.i.spec.progress_deadline_seconds));
        let since = self
            .st
            .phase_transition_time
            .as_ref()
            .map_or(self.now(), |t| t.0);
        let left = limit - self.now().duration_since(since);
        if left.is_negative() {
            let msg = format!(
                "revision {} made no progress within progressDeadlineSeconds ({}s)",
                self.current(),
                self.i.spec.progress_deadline_seconds
            );
            self.fail(msg);
        } else {
            self.requeue_in(left);
        }
    }

    fn mid(&mut self, dep: &DeploymentView) {
        if !dep.paused {
            self.effect(Effect::Pause);
            return;
        }
        let mid = self.i.spec.mid.clone();
        if dep.recreate {
            if self.run_hooks(HookPoint::Mid, &mid, dep) == Run::Done {
                self.resume_rolling(dep);
            }
            return;
        }
        // Until the Deployment controller has seen the pause, its status says nothing about
        // where the rollout stands.
        if !dep.observed() {
            self.requeue_in(SignedDuration::from_secs(1));
            return;
        }
        for hook in &mid {
            if self.done(hook) {
                continue;
            }
            if !self.started(hook) {
                if !self.scaled_to(hook, dep) {
                    // Every hook due at this step has run.
                    break;
                }
                if !self.reached(hook, dep) {
                    // Paused at the point; its pods are not all available yet.
                    self.st.message = Some(format!(
                        "revision {}: mid hook {} waits for {} available new replicas",
                        dep.revision,
                        hook.name,
                        Self::point_of(hook, dep)
                    ));
                    self.deadline();
                    return;
                }
            }
            match self.run_hook(HookPoint::Mid, hook, dep) {
                Run::Done => {}
                _ => return,
            }
        }
        self.resume_rolling(dep);
    }

    fn resume_rolling(&mut self, dep: &DeploymentView) {
        self.st.current_hook = None;
        self.set_phase(RolloutPhase::Rolling);
        self.st.message = Some(format!("revision {}: rolling out", dep.revision));
    }

    fn post(&mut self, dep: &DeploymentView) {
        if !dep.paused {
            self.effect(Effect::Pause);
            return;
        }
        let hooks = self.i.spec.post.clone();
        if self.run_hooks(HookPoint::Post, &hooks, dep) == Run::Done {
            self.st.current_hook = None;
            self.st.stable_revision = Some(dep.revision.clone());
            self.st.stable_template = Some(dep.template_json.clone());
            self.set_phase(RolloutPhase::Succeeded);
            self.st.message = Some(format!("revision {} rolled out", dep.revision));
            self.event(
                false,
                "RolloutSucceeded",
                format!("revision {} rolled out", dep.revision),
            );
        }
    }

    fn run_hooks(&mut self, point: HookPoint, hooks: &[Hook], dep: &DeploymentView) -> Run {
        for hook in hooks {
            match self.run_hook(point, hook, dep) {
                Run::Done => continue,
                other => return other,
            }
        }
        Run::Done
    }

    fn run_hook(&mut self, point: HookPoint, hook: &Hook, dep: &DeploymentView) -> Run {
        let rev = self.current();
        let gate = hook.approval.is_some();
        let Some(idx) = self.st.hooks.iter().position(|e| e.name == hook.name) else {
            // A Job of this hook and revision beyond the attempts already used (one made before
            // the status was lost) is this run: it is adopted, never run a second time.
            let uid = dep.uid.as_str();
            let attempt = self
                .i
                .jobs
                .iter()
                .filter(|j| j.hook == hook.name && j.revision == rev && j.targets(uid))
                .map(|j| j.attempt)
                .filter(|a| *a > self.st.attempt_offset)
                .max()
                .unwrap_or(self.st.attempt_offset + 1);
            self.st.hooks.push(HookStatus {
                name: hook.name.clone(),
                point,
                revision: rev.clone(),
                attempt,
                phase: if gate {
                    HookPhase::Waiting
                } else {
                    HookPhase::Pending
                },
                start_time: Some(Time(self.now())),
                ..Default::default()
            });
            self.st.current_hook = Some(hook.name.clone());
            if gate {
                self.set_phase(RolloutPhase::WaitingApproval);
                self.st.message = Some(format!(
                    "waiting for approval: annotate this RolloutStrategy {APPROVE_ANNOTATION}={rev}"
                ));
                self.event(
                    false,
                    "HookStarted",
                    format!(
                        "approval gate {} waits for {APPROVE_ANNOTATION}={rev}",
                        hook.name
                    ),
                );
            } else {
                self.set_phase(point_phase(point));
                self.st.message = Some(format!(
                    "revision {rev}: {} hook {} (attempt {attempt})",
                    point.as_str(),
                    hook.name
                ));
                self.event(
                    false,
                    "HookStarted",
                    format!(
                        "{} hook {} for revision {rev}, attempt {attempt}",
                        point.as_str(),
                        hook.name
                    ),
                );
            }
            return Run::Acted;
        };
        let e = self.st.hooks[idx].clone();
        match e.phase {
            HookPhase::Succeeded | HookPhase::Skipped => Run::Done,
            HookPhase::Failed => {
                if hook.failure_policy == FailurePolicy::Ignore {
                    return Run::Done;
                }
                let used = e.attempt - self.st.attempt_offset;
                if hook.failure_policy == FailurePolicy::Retry && used <= hook.retries {
                    self.set_phase(point_phase(point));
                    self.st.current_hook = Some(hook.name.clone());
                    let finished = e.finish_time.as_ref().map_or(self.now(), |t| t.0);
                    let ready_at = finished + backoff(used);
                    if self.now() < ready_at {
                        self.requeue_in(ready_at.duration_since(self.now()));
                        return Run::Waiting;
                    }
                    let attempt = e.attempt + 1;
                    self.st.hooks[idx] = HookStatus {
                        name: hook.name.clone(),
                        point,
                        revision: rev.clone(),
                        attempt,
                        phase: HookPhase::Pending,
                        start_time: Some(Time(self.now())),
                        ..Default::default()
                    };
                    self.st.message = Some(format!(
                        "revision {rev}: {} hook {} (attempt {attempt})",
                        point.as_str(),
                        hook.name
                    ));
                    self.event(
                        false,
                        "HookStarted",
                        format!(
                            "{} hook {} for revision {rev}, attempt {attempt} (retry)",
                            point.as_str(),
                            hook.name
                        ),
                    );
                    return Run::Acted;
                }
                let msg = format!("hook {} failed", hook.name);
                self.fail(msg);
                Run::Failed
            }
            HookPhase::Waiting => {
                self.st.current_hook = Some(hook.name.clone());
                if self.i.approve == Some(rev.as_str()) {
                    self.consume(APPROVE_ANNOTATION, &rev);
                    let entry = &mut self.st.hooks[idx];
                    entry.phase = HookPhase::Succeeded;
                    entry.reason = Some("Approved".into());
                    entry.message = Some(format!("approved by {APPROVE_ANNOTATION}={rev}"));
                    entry.finish_time = Some(Time(self.i.now));
                    self.set_phase(point_phase(point));
                    self.event(
                        false,
                        "HookSucceeded",
                        format!("approval gate {} approved for revision {rev}", hook.name),
                    );
                    return Run::Acted;
                }
                self.set_phase(RolloutPhase::WaitingApproval);
                Run::Waiting
            }
            HookPhase::Pending | HookPhase::Running => {
                self.st.current_hook = Some(hook.name.clone());
                self.track(idx, point, hook, Some(dep))
            }
        }
    }

    /// Follows the Job of an open hook entry: creates or adopts it, records how it ended, and
    /// fails it when it cannot start or runs too long. `dep` is `None` for a hook of a
    /// superseded revision, whose Job is never created anew.
    fn track(
        &mut self,
        idx: usize,
        point: HookPoint,
        hook: &Hook,
        dep: Option<&DeploymentView>,
    ) -> Run {
        let e = self.st.hooks[idx].clone();
        let name = self.job_name(&e);
        let Some(job) = self.i.jobs.iter().find(|j| j.name == name) else {
            if e.job_name.is_none() {
                let Some(dep) = dep else { return Run::Done };
                let create = Effect::CreateJob {
                    point,
                    hook: hook.name.clone(),
                    revision: e.revision.clone(),
                    attempt: e.attempt,
                };
                if let Some(r) = self.i.rejected.filter(|r| r.effect == create) {
                    return self.record_failure(
                        idx,
                        point,
                        hook,
                        None,
                        "JobRejected".into(),
                        format!(
                            "the API server refused to create Job {name} (HTTP {}): {}",
                            r.code, r.message
                        ),
                        None,
                    );
                }
                if let Some(p) = self.i.live_pods.iter().find(|p| p.job != name) {
                    // An earlier attempt (or a renamed hook) still has a pod: the next one
                    // starts once it is gone (the pod watch says when). Bounded by the pending
                    // timeout.
                    let detail = format!("pod {} of Job {} is still terminating", p.name, p.job);
                    self.st.message = Some(format!(
                        "revision {}: {} hook {} waits: {detail}",
                        e.revision,
                        point.as_str(),
                        hook.name,
                    ));
                    return self.pending_deadline(idx, point, hook, None, "PendingTimeout", detail);
                }
                if let Err(err) = hooks::validate(hook, &dep.template) {
                    return self.record_failure(
                        idx,
                        point,
                        hook,
                        None,
                        "InvalidHook".into(),
                        err.to_string(),
                        None,
                    );
                }
                self.effect(create);
                self.st.hooks[idx].job_name = Some(name);
                return Run::Acted;
            }
            return self.record_failure(
                idx,
                point,
                hook,
                None,
                "JobDeleted".into(),
                format!("hook Job {name} was deleted before it finished"),
                None,
            );
        };
        if e.job_name.is_none() {
            // Created before a restart and adopted now.
            self.st.hooks[idx].job_name = Some(name.clone());
        }
        match &job.state {
            JobState::Succeeded { finished } => {
                let finished = finished.unwrap_or(self.now());
                let entry = &mut self.st.hooks[idx];
                entry.phase = HookPhase::Succeeded;
                entry.exit_code = Some(0);
                entry.finish_time = Some(Time(finished));
                let seconds = entry
                    .start_time
                    .as_ref()
                    .map_or(0.0, |s| finished.duration_since(s.0).as_secs_f64().max(0.0));
                self.d.hook_results.push(HookResult {
                    point,
                    result: "succeeded",
                    seconds,
                });
                self.event(
                    false,
                    "HookSucceeded",
                    format!(
                        "{} hook {} succeeded for revision {} (attempt {}, Job {name})",
                        point.as_str(),
                        hook.name,
                        e.revision,
                        e.attempt
                    ),
                );
                Run::Acted
            }
            JobState::Failed {
                reason, message, ..
            } => {
                let term = job.pod.as_ref().and_then(|p| p.terminated.clone());
                let exit = term.as_ref().map(|t| t.exit_code);
                let (reason, message) = match (&term, reason.as_str()) {
                    (Some(t), "BackoffLimitExceeded" | "PodFailurePolicy") => (
                        t.reason.clone().unwrap_or_else(|| reason.clone()),
                        t.message.clone().unwrap_or_else(|| message.clone()),
                    ),
                    _ => (reason.clone(), message.clone()),
                };
                let tail = job.log_tail.clone().or_else(|| {
                    term.as_ref()
                        .and_then(|t| t.message.clone())
                        .filter(|m| !m.is_empty())
                });
                self.record_failure(idx, point, hook, exit, reason, message, tail)
            }
            JobState::Active => {
                let pod = job.pod.clone().unwrap_or_default();
                if let Some(since) = pod.running_since {
                    if e.phase == HookPhase::Pending {
                        self.st.hooks[idx].phase = HookPhase::Running;
                    }
                    let limit = SignedDuration::from_secs(i64::from(hook.timeout_seconds));
                    let left = limit - self.now().duration_since(since);
                    if left.is_negative() {
                        return self.record_failure(
                            idx,
                            point,
                            hook,
                            None,
                            "DeadlineExceeded".into(),
                            format!("ran longer than timeoutSeconds ({}s)", hook.timeout_seconds),
                            None,
                        );
                    }
                    self.requeue_in(left);
                    return Run::Waiting;
                }
                let why = pod.waiting_reason.as_deref().unwrap_or("PendingTimeout");
                let detail = pod.waiting_message.clone().unwrap_or_default();
                self.pending_deadline(idx, point, hook, job.created, why, detail)
            }
        }
    }

    /// Fails a hook that has not started within `pendingTimeoutSeconds` of its entry, with
    /// `why` (CamelCase) and `detail`; otherwise looks again when the limit would pass.
    fn pending_deadline(
        &mut self,
        idx: usize,
        point: HookPoint,
        hook: &Hook,
        created: Option<Timestamp>,
        why: &str,
        detail: String,
    ) -> Run {
        let e = &self.st.hooks[idx];
        let start = e
            .start_time
            .as_ref()
            .map(|t| t.0)
            .or(created)
            .unwrap_or(self.now());
        let limit = SignedDuration::from_secs(i64::from(hook.pending_timeout_seconds));
        let left = limit - self.now().duration_since(start);
        if left.is_negative() {
            return self.record_failure(
                idx,
                point,
                hook,
                None,
                why.to_string(),
                format!(
                    "did not start within pendingTimeoutSeconds ({}s){}{}",
                    hook.pending_timeout_seconds,
                    if detail.is_empty() { "" } else { ": " },
                    detail
                ),
                None,
            );
        }
        self.requeue_in(left);
        Run::Waiting
    }

    #[allow(clippy::too_many_arguments)]
    fn record_failure(
        &mut self,
        idx: usize,
        point: HookPoint,
        hook: &Hook,
        exit_code: Option<i32>,
        reason: String,
        message: String,
        log_tail: Option<String>,
    ) -> Run {
        let now = self.now();
        let entry = &mut self.st.hooks[idx];
        entry.phase = HookPhase::Failed;
        entry.exit_code = exit_code;
        entry.reason = Some(reason.clone());
        entry.message = Some(message.clone());
        entry.log_tail = log_tail.clone();
        entry.finish_time = Some(Time(now));
        let seconds = entry
            .start_time
            .as_ref()
            .map_or(0.0, |s| now.duration_since(s.0).as_secs_f64().max(0.0));
        let (attempt, revision) = (entry.attempt, entry.revision.clone());
        let used = attempt - self.st.attempt_offset;
        let retrying = hook.failure_policy == FailurePolicy::Retry && used <= hook.retries;
        let ignored = hook.failure_policy == FailurePolicy::Ignore;
        self.d.hook_results.push(HookResult {
            point,
            result: if ignored { "ignored" } else { "failed" },
            seconds,
        });
        let mut note = format!(
            "{} hook {} failed for revision {revision} (attempt {attempt}): {reason}",
            point.as_str(),
            hook.name
        );
        if let Some(code) = exit_code {
            note.push_str(&format!(", exit code {code}"));
        }
        if !message.is_empty() {
            note.push_str(&format!(": {message}"));
        }
        if let Some(tail) = &log_tail {
            note.push_str(&format!("; log: {tail}"));
        }
        note.push_str(if retrying {
            "; retrying"
        } else if ignored {
            "; ignored (failurePolicy Ignore)"
        } else {
            ""
        });
        self.event(true, "HookFailed", note.clone());
        if retrying || ignored {
            return Run::Acted;
        }
        self.fail(note);
        Run::Failed
    }

    /// The current revision failed; what happens to the Deployment is decided at rest.
    fn fail(&mut self, message: String) {
        self.set_phase(RolloutPhase::Failed);
        self.st.message = Some(message.clone());
        self.event(true, "RolloutFailed", message);
    }

    fn at_rest(&mut self, dep: &DeploymentView) {
        let cur = self.st.current_revision.clone();
        let stable = self.st.stable_revision.clone();
        let rev = Some(dep.revision.clone());
        let phase = self.phase();
        let failed = matches!(phase, RolloutPhase::Failed | RolloutPhase::RolledBack);

        if phase == RolloutPhase::Failed
            && self.i.spec.on_failure == OnFailure::Rollback
            && self.st.stable_template.is_some()
            && (rev == cur || rev == stable)
            && cur != stable
        {
            if rev == cur {
                self.effect(Effect::RestoreTemplate);
            }
            self.set_phase(RolloutPhase::RolledBack);
            let msg = format!(
                "revision {} failed; rolled back to revision {}",
                short(cur.as_deref()),
                short(stable.as_deref())
            );
            self.event(true, "RolledBack", msg.clone());
            let why = self.st.message.take().unwrap_or_default();
            self.st.message = Some(format!("{msg}: {why}"));
            return;
        }
        if self.restore_replicas(dep, false) {
            return;
        }
        if failed && self.i.retry.is_some() && self.i.retry == cur.as_deref() {
            if rev == cur {
                self.consume(RETRY_ANNOTATION, &dep.revision);
                if !dep.paused {
                    self.effect(Effect::Pause);
                }
                self.start_sequence(dep.revision.clone(), Start::Retry);
                return;
            }
            self.st.message = Some(format!(
                "{RETRY_ANNOTATION}={}: the Deployment's template is no longer that revision; apply it again to retry",
                short(cur.as_deref())
            ));
        }
        if rev == stable {
            if failed && !dep.complete() {
                // Back to the stable ReplicaSet: let the Deployment controller finish that.
                if dep.paused {
                    self.effect(Effect::Unpause);
                }
                return;
            }
            if !dep.paused {
                self.effect(Effect::Pause);
            }
            return;
        }
        if failed && rev == cur {
            if !dep.paused {
                self.effect(Effect::Pause);
            }
            return;
        }
        if !dep.paused {
            self.effect(Effect::Pause);
        }
        self.start_sequence(dep.revision.clone(), Start::New);
    }

    /// Finished hook Jobs beyond `hookHistoryLimit` per hook, newest kept.
    fn prunable(&self) -> Vec<String> {
        let limit = usize::try_from(self.i.spec.hook_history_limit.max(0)).unwrap_or(0);
        let open: Vec<String> = self
            .st
            .hooks
            .iter()
            .filter(|e| Self::is_open(e))
            .map(|e| self.job_name(e))
            .collect();
        let mut by_hook: std::collections::BTreeMap<&str, Vec<&JobView>> = Default::default();
        for j in self.i.jobs.iter().filter(|j| j.finished()) {
            by_hook.entry(j.hook.as_str()).or_default().push(j);
        }
        let mut out = vec![];
        for (_, mut jobs) in by_hook {
            jobs.sort_by(|a, b| b.created.cmp(&a.created).then(b.name.cmp(&a.name)));
            out.extend(
                jobs.into_iter()
                    .skip(limit)
                    .filter(|j| !open.contains(&j.name))
                    .map(|j| j.name.clone()),
            );
        }
        out
    }

    fn finish(mut self) -> Decision {
        let phase = self.phase();
        let generation = self.i.generation;
        let now = self.now();
        let reason = phase_name(phase);
        let message = self.st.message.clone().unwrap_or_default();
        let ready = matches!(phase, RolloutPhase::Idle | RolloutPhase::Succeeded)
            && self.i.governed_by.is_none();
        let reason = if self.i.governed_by.is_some() {
            "Conflicted"
        } else {
            reason
        };
        let failed = matches!(phase, RolloutPhase::Failed | RolloutPhase::RolledBack);
        let c = &mut self.st.conditions;
        set_condition(
            c,
            "Ready",
            Status::from(ready),
            reason,
            &message,
            generation,
            now,
        );
        set_condition(
            c,
            "Progressing",
            Status::from(in_progress(phase)),
            reason,
            &message,
            generation,
            now,
        );
        set_condition(
            c,
            "Failed",
            Status::from(failed),
            reason,
            &message,
            generation,
            now,
        );
        let mut d = self.d;
        d.status = self.st;
        if d.effects.is_empty() && d.status == *self.i.status {
            let m = Machine {
                i: self.i,
                st: d.status.clone(),
                d: Decision::default(),
            };
            d.prune = m.prunable();
        }
        d
    }
}

#[cfg(test)]
mod tests;
