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
use super::observe::{DeploymentView, JobState, JobView};
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
    m.step();
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
        self.st.replicas = Some(dep.status_replicas);
        self.st.updated_replicas = Some(dep.updated_replicas);
        self.st.ready_replicas = Some(dep.ready_replicas);
        self.st.available_replicas = Some(dep.available_replicas);

        if let Some(job) = self.stray_active_job() {
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

    /// A Job that still runs but that no open hook entry tracks (its hook timed out, or was
    /// otherwise given up): it is deleted so nothing of it keeps running.
    fn stray_active_job(&self) -> Option<String> {
        let tracked: Vec<String> = self
            .st
            .hooks
            .iter()
            .filter(|e| Self::is_open(e))
            .map(|e| self.job_name(e))
            .collect();
        self.i
            .jobs
            .iter()
            .find(|j| !j.finished() && !tracked.contains(&j.name))
            .map(|j| j.name.clone())
    }

    fn adopt(&mut self, dep: &DeploymentView) {
        if dep.paused && !dep.ever_rolled_out() {
            self.start_sequence(dep.revision.clone(), false);
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
            self.start_sequence(dep.revision.clone(), false);
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

    fn start_sequence(&mut self, revision: String, retry: bool) {
        // Attempts continue after any earlier run of this revision (a retry, or the revision
        // coming back after another one), so an old Job is never taken for a new run.
        let earlier_jobs = self
            .i
            .jobs
            .iter()
            .filter(|j| j.revision == revision)
            .map(|j| j.attempt)
            .max()
            .unwrap_or(0);
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
        self.start_sequence(dep.revision.clone(), false);
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

    fn reached(&self, h: &Hook, dep: &DeploymentView) -> bool {
        let point =
            h.at.as_ref()
                .and_then(|at| progress_point(at, dep.replicas))
                .unwrap_or(dep.replicas);
        dep.observed() && dep.available_of(&dep.revision) >= point
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
                if self.reached(&h, dep) {
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
        let hooks: Vec<Hook> = if dep.recreate {
            mid
        } else {
            mid.into_iter()
                .take_while(|h| self.started(h) || self.reached(h, dep))
                .collect()
        };
        if self.run_hooks(HookPoint::Mid, &hooks, dep) == Run::Done {
            self.st.current_hook = None;
            self.set_phase(RolloutPhase::Rolling);
            self.st.message = Some(format!("revision {}: rolling out", dep.revision));
        }
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
            let attempt = self.st.attempt_offset + 1;
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
                    self.effect(Effect::RemoveAnnotation(APPROVE_ANNOTATION));
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
                self.effect(Effect::CreateJob {
                    point,
                    hook: hook.name.clone(),
                    revision: e.revision.clone(),
                    attempt: e.attempt,
                });
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
                let start = e
                    .start_time
                    .as_ref()
                    .map(|t| t.0)
                    .or(job.created)
                    .unwrap_or(self.now());
                let limit = SignedDuration::from_secs(i64::from(hook.pending_timeout_seconds));
                let left = limit - self.now().duration_since(start);
                if left.is_negative() {
                    let why = pod
                        .waiting_reason
                        .clone()
                        .unwrap_or_else(|| "PendingTimeout".into());
                    let detail = pod.waiting_message.clone().unwrap_or_default();
                    return self.record_failure(
                        idx,
                        point,
                        hook,
                        None,
                        why,
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
        }
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
                self.effect(Effect::RemoveAnnotation(RETRY_ANNOTATION));
                if !dep.paused {
                    self.effect(Effect::Pause);
                }
                self.start_sequence(dep.revision.clone(), true);
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
        self.start_sequence(dep.revision.clone(), false);
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
mod tests {
    use super::*;
    use crate::controller::rollout_strategy::observe::{PodView, ReplicaSetView, Terminated};
    use k8s_openapi::api::core::v1::PodTemplateSpec;
    use serde_json::json;

    const OLD: &str = "aaaaaaaaaa";
    const NEW: &str = "bbbbbbbbbb";
    const NEWER: &str = "cccccccccc";

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn spec(yaml: &str) -> RolloutStrategySpec {
        serde_yaml::from_str(&format!("targetRef: {{name: web}}\n{yaml}")).unwrap()
    }

    /// The usual strategy: one hook at each point.
    fn full() -> RolloutStrategySpec {
        spec(
            "pre: [{name: migrate, container: {from: app}}]\nmid: [{name: smoke, at: 50%, container: {from: app}}]\npost: [{name: purge, container: {from: app}}]",
        )
    }

    fn template() -> PodTemplateSpec {
        serde_json::from_value(json!({"spec": {"containers": [{"name": "app", "image": "web:2"}]}}))
            .unwrap()
    }

    /// Deployment `web` of `rev`, 4 replicas, observed, paused or not, all on `rev`.
    fn dep(rev: &str, paused: bool) -> DeploymentView {
        DeploymentView {
            name: "web".into(),
            resource_version: "1".into(),
            generation: 2,
            observed_generation: 2,
            paused,
            replicas: 4,
            recreate: false,
            template: template(),
            template_json: json!({"rev": rev}),
            revision: rev.into(),
            status_replicas: 4,
            updated_replicas: 4,
            ready_replicas: 4,
            available_replicas: 4,
            replica_sets: vec![ReplicaSetView {
                name: format!("web-{rev}"),
                revision: rev.into(),
                replicas: 4,
                available: 4,
                created: Some(t(-1000)),
                template_json: json!({"rev": rev}),
            }],
        }
    }

    /// Deployment half-way from OLD to NEW: `new` of 4 replicas updated and available.
    fn rolling_dep(new: i32, paused: bool) -> DeploymentView {
        let mut d = dep(NEW, paused);
        d.updated_replicas = new;
        d.status_replicas = 4 + new.min(1);
        d.replica_sets = vec![
            ReplicaSetView {
                name: "web-old".into(),
                revision: OLD.into(),
                replicas: 4 - new + new.min(1),
                available: 4 - new,
                created: Some(t(-1000)),
                template_json: json!({"rev": OLD}),
            },
            ReplicaSetView {
                name: "web-new".into(),
                revision: NEW.into(),
                replicas: new,
                available: new,
                created: Some(t(-10)),
                template_json: json!({"rev": NEW}),
            },
        ];
        d
    }

    /// Status of a revision NEW under way in `phase`, from the stable OLD.
    fn status(phase: RolloutPhase, hooks: Vec<HookStatus>) -> RolloutStrategyStatus {
        RolloutStrategyStatus {
            phase: Some(phase),
            phase_transition_time: Some(Time(t(0))),
            stable_revision: Some(OLD.into()),
            stable_template: Some(json!({"rev": OLD})),
            current_revision: Some(NEW.into()),
            hooks,
            ..Default::default()
        }
    }

    fn entry(name: &str, point: HookPoint, phase: HookPhase, attempt: i32) -> HookStatus {
        HookStatus {
            name: name.into(),
            point,
            revision: NEW.into(),
            attempt,
            job_name: (phase != HookPhase::Waiting)
                .then(|| hooks::job_name("web", name, NEW, attempt)),
            phase,
            start_time: Some(Time(t(0))),
            finish_time: matches!(phase, HookPhase::Succeeded | HookPhase::Failed)
                .then(|| Time(t(10))),
            ..Default::default()
        }
    }

    fn ok(name: &str, point: HookPoint) -> HookStatus {
        entry(name, point, HookPhase::Succeeded, 1)
    }

    fn job(hook: &str, attempt: i32, state: JobState, pod: Option<PodView>) -> JobView {
        JobView {
            name: hooks::job_name("web", hook, NEW, attempt),
            hook: hook.into(),
            revision: NEW.into(),
            attempt,
            created: Some(t(0)),
            state,
            pod,
            log_tail: None,
        }
    }

    fn running_pod(since: i64) -> Option<PodView> {
        Some(PodView {
            name: "p".into(),
            running_since: Some(t(since)),
            ..Default::default()
        })
    }

    fn failed_job(hook: &str, attempt: i32) -> JobView {
        job(
            hook,
            attempt,
            JobState::Failed {
                reason: "BackoffLimitExceeded".into(),
                message: "Job has reached the specified backoff limit".into(),
                finished: Some(t(10)),
            },
            Some(PodView {
                name: "p".into(),
                terminated: Some(Terminated {
                    container: "t".into(),
                    exit_code: 1,
                    reason: Some("Error".into()),
                    message: Some("migration 42 failed".into()),
                }),
                ..Default::default()
            }),
        )
    }

    struct Case<'a> {
        spec: RolloutStrategySpec,
        status: RolloutStrategyStatus,
        dep: Option<DeploymentView>,
        jobs: Vec<JobView>,
        approve: Option<&'a str>,
        retry: Option<&'a str>,
        governed_by: Option<&'a str>,
        now: i64,
    }

    impl<'a> Case<'a> {
        fn new(
            spec: RolloutStrategySpec,
            status: RolloutStrategyStatus,
            dep: DeploymentView,
        ) -> Self {
            Self {
                spec,
                status,
                dep: Some(dep),
                jobs: vec![],
                approve: None,
                retry: None,
                governed_by: None,
                now: 20,
            }
        }

        fn jobs(mut self, jobs: Vec<JobView>) -> Self {
            self.jobs = jobs;
            self
        }

        fn at(mut self, now: i64) -> Self {
            self.now = now;
            self
        }

        fn decide(&self) -> Decision {
            decide(&Input {
                name: "web",
                generation: Some(1),
                spec: &self.spec,
                status: &self.status,
                approve: self.approve,
                retry: self.retry,
                deployment: self.dep.as_ref(),
                jobs: &self.jobs,
                now: t(self.now),
                governed_by: self.governed_by,
            })
        }
    }

    fn phase(d: &Decision) -> RolloutPhase {
        d.status.phase.unwrap()
    }

    /// Nothing but bookkeeping (conditions, counts) changes: no write, no step.
    fn quiet(d: &Decision, st: &RolloutStrategyStatus) -> bool {
        d.effects.is_empty()
            && d.events.is_empty()
            && d.status.phase == st.phase
            && d.status.hooks == st.hooks
            && d.status.current_revision == st.current_revision
    }

    fn reasons(d: &Decision) -> Vec<&'static str> {
        d.events.iter().map(|e| e.reason).collect()
    }

    fn hook<'a>(d: &'a Decision, name: &str) -> &'a HookStatus {
        d.status.hooks.iter().find(|h| h.name == name).unwrap()
    }

    fn create(hook: &str, point: HookPoint, attempt: i32) -> Effect {
        Effect::CreateJob {
            point,
            hook: hook.into(),
            revision: NEW.into(),
            attempt,
        }
    }

    // ---- adoption and rest ----

    #[test]
    fn adopting_a_running_deployment_pauses_it_and_records_it_as_stable() {
        let c = Case::new(full(), Default::default(), dep(OLD, false));
        let d = c.decide();
        assert_eq!(d.effects, [Effect::Pause]);
        assert_eq!(phase(&d), RolloutPhase::Idle);
        assert_eq!(d.status.stable_revision.as_deref(), Some(OLD));
        assert_eq!(d.status.stable_template, Some(json!({"rev": OLD})));
        assert!(d.status.hooks.is_empty(), "no hook runs on adoption");
    }

    #[test]
    fn a_paused_deployment_that_never_rolled_out_gets_its_pre_hooks() {
        let mut fresh = dep(NEW, true);
        fresh.replica_sets.clear();
        let d = Case::new(full(), Default::default(), fresh).decide();
        assert!(d.effects.is_empty());
        assert_eq!(phase(&d), RolloutPhase::PreHook);
        assert_eq!(d.status.current_revision.as_deref(), Some(NEW));
        assert_eq!(d.status.stable_revision, None);
        assert_eq!(reasons(&d), ["RolloutStarted"]);
    }

    #[test]
    fn adopting_a_paused_deployment_with_a_pending_change_runs_hooks_for_the_change() {
        let mut pending = dep(OLD, true);
        pending.revision = NEW.into();
        let d = Case::new(full(), Default::default(), pending).decide();
        assert!(d.effects.is_empty());
        assert_eq!(
            d.status.stable_revision.as_deref(),
            Some(OLD),
            "what runs is stable"
        );
        assert_eq!(d.status.stable_template, Some(json!({"rev": OLD})));
        assert_eq!(d.status.current_revision.as_deref(), Some(NEW));
        assert_eq!(phase(&d), RolloutPhase::PreHook);
    }

    #[test]
    fn a_converged_strategy_changes_nothing() {
        let mut st = status(RolloutPhase::Succeeded, vec![]);
        st.stable_revision = Some(NEW.into());
        let first = Case::new(full(), st, dep(NEW, true)).decide();
        let again = Case::new(full(), first.status.clone(), dep(NEW, true)).decide();
        assert!(!again.changes(&first.status), "{again:?}");
    }

    #[test]
    fn a_deployment_resumed_by_hand_at_rest_is_paused_again() {
        let mut st = status(RolloutPhase::Succeeded, vec![]);
        st.stable_revision = Some(NEW.into());
        let d = Case::new(full(), st, dep(NEW, false)).decide();
        assert_eq!(d.effects, [Effect::Pause]);
    }

    #[test]
    fn a_new_template_starts_the_pre_hooks_with_the_deployment_paused() {
        let mut st = status(RolloutPhase::Succeeded, vec![ok("migrate", HookPoint::Pre)]);
        st.current_revision = Some(OLD.into());
        let d = Case::new(full(), st, dep(NEW, true)).decide();
        assert!(d.effects.is_empty());
        assert_eq!(phase(&d), RolloutPhase::PreHook);
        assert_eq!(d.status.current_revision.as_deref(), Some(NEW));
        assert!(
            d.status.hooks.is_empty(),
            "hooks of the last revision are cleared"
        );
        assert_eq!(reasons(&d), ["RolloutStarted"]);
    }

    #[test]
    fn a_second_strategy_for_the_same_deployment_stands_aside() {
        let mut c = Case::new(full(), Default::default(), dep(OLD, false));
        c.governed_by = Some("first");
        let d = c.decide();
        assert!(
            d.effects.is_empty(),
            "never pauses what another strategy governs"
        );
        assert_eq!(d.status.stable_revision, None);
        assert!(d.status.message.as_deref().unwrap().contains("first"));
        let ready = d
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "Conflicted")
        );
    }

    #[test]
    fn a_missing_deployment_is_reported_and_nothing_is_written() {
        let mut c = Case::new(full(), Default::default(), dep(OLD, false));
        c.dep = None;
        let d = c.decide();
        assert!(d.effects.is_empty());
        assert!(d.status.message.unwrap().contains("not found"));
    }

    // ---- hooks ----

    #[test]
    fn pre_hook_is_recorded_before_its_job_is_created() {
        let d = Case::new(
            full(),
            status(RolloutPhase::PreHook, vec![]),
            dep(NEW, true),
        )
        .decide();
        assert!(d.effects.is_empty(), "intent first");
        let h = hook(&d, "migrate");
        assert_eq!(
            (h.phase, h.attempt, h.job_name.clone()),
            (HookPhase::Pending, 1, None)
        );
        assert_eq!(d.status.current_hook.as_deref(), Some("migrate"));
        assert_eq!(reasons(&d), ["HookStarted"]);

        let d2 = Case::new(full(), d.status, dep(NEW, true)).decide();
        assert_eq!(d2.effects, [create("migrate", HookPoint::Pre, 1)]);
        assert_eq!(
            hook(&d2, "migrate").job_name.as_deref(),
            Some(hooks::job_name("web", "migrate", NEW, 1).as_str())
        );
    }

    #[test]
    fn a_job_created_before_a_restart_is_adopted_not_created_again() {
        let mut e = entry("migrate", HookPoint::Pre, HookPhase::Pending, 1);
        e.job_name = None;
        let d = Case::new(
            full(),
            status(RolloutPhase::PreHook, vec![e]),
            dep(NEW, true),
        )
        .jobs(vec![job("migrate", 1, JobState::Active, None)])
        .decide();
        assert!(d.effects.is_empty());
        assert!(hook(&d, "migrate").job_name.is_some());
    }

    #[test]
    fn pre_hooks_keep_the_deployment_paused() {
        let d = Case::new(
            full(),
            status(RolloutPhase::PreHook, vec![]),
            dep(NEW, false),
        )
        .decide();
        assert_eq!(d.effects, [Effect::Pause]);
    }

    #[test]
    fn table_of_hook_job_outcomes() {
        let pending = |secs| {
            Some(PodView {
                name: "p".into(),
                waiting_reason: Some("Unschedulable".into()),
                waiting_message: Some("0/6 nodes are available".into()),
                running_since: None,
                terminated: None,
            })
            .filter(|_| secs >= 0)
        };
        // (job, now, expected hook phase, expected reason, phase of the rollout)
        let cases: Vec<(JobView, i64, HookPhase, Option<&str>, RolloutPhase)> = vec![
            (
                job(
                    "migrate",
                    1,
                    JobState::Succeeded {
                        finished: Some(t(5)),
                    },
                    None,
                ),
                20,
                HookPhase::Succeeded,
                None,
                RolloutPhase::PreHook,
            ),
            (
                failed_job("migrate", 1),
                20,
                HookPhase::Failed,
                Some("Error"),
                RolloutPhase::Failed,
            ),
            (
                job("migrate", 1, JobState::Active, running_pod(5)),
                20,
                HookPhase::Running,
                None,
                RolloutPhase::PreHook,
            ),
            (
                job("migrate", 1, JobState::Active, running_pod(5)),
                700,
                HookPhase::Failed,
                Some("DeadlineExceeded"),
                RolloutPhase::Failed,
            ),
            (
                job("migrate", 1, JobState::Active, pending(0)),
                100,
                HookPhase::Pending,
                None,
                RolloutPhase::PreHook,
            ),
            (
                job("migrate", 1, JobState::Active, pending(0)),
                400,
                HookPhase::Failed,
                Some("Unschedulable"),
                RolloutPhase::Failed,
            ),
            (
                job("migrate", 1, JobState::Active, None),
                400,
                HookPhase::Failed,
                Some("PendingTimeout"),
                RolloutPhase::Failed,
            ),
            (
                job(
                    "migrate",
                    1,
                    JobState::Failed {
                        reason: "DeadlineExceeded".into(),
                        message: "Job was active longer than specified deadline".into(),
                        finished: None,
                    },
                    None,
                ),
                20,
                HookPhase::Failed,
                Some("DeadlineExceeded"),
                RolloutPhase::Failed,
            ),
        ];
        for (j, now, want, reason, rollout) in cases {
            let st = status(
                RolloutPhase::PreHook,
                vec![entry("migrate", HookPoint::Pre, HookPhase::Pending, 1)],
            );
            let d = Case::new(full(), st, dep(NEW, true))
                .jobs(vec![j.clone()])
                .at(now)
                .decide();
            let h = hook(&d, "migrate");
            assert_eq!(h.phase, want, "{j:?} at {now}");
            assert_eq!(h.reason.as_deref(), reason, "{j:?} at {now}");
            assert_eq!(phase(&d), rollout, "{j:?} at {now}");
        }
    }

    #[test]
    fn a_failed_hook_keeps_exit_code_reason_and_log_and_warns() {
        let mut j = failed_job("migrate", 1);
        j.log_tail = Some("ERROR: relation exists".into());
        let st = status(
            RolloutPhase::PreHook,
            vec![entry("migrate", HookPoint::Pre, HookPhase::Running, 1)],
        );
        let d = Case::new(full(), st, dep(NEW, true)).jobs(vec![j]).decide();
        let h = hook(&d, "migrate");
        assert_eq!(h.exit_code, Some(1));
        assert_eq!(h.reason.as_deref(), Some("Error"));
        assert_eq!(h.message.as_deref(), Some("migration 42 failed"));
        assert_eq!(h.log_tail.as_deref(), Some("ERROR: relation exists"));
        assert_eq!(reasons(&d), ["HookFailed", "RolloutFailed"]);
        assert!(d.events.iter().all(|e| e.warning));
        assert!(d.events[0].message.contains("exit code 1"));
        assert!(d.events[0].message.contains("ERROR: relation exists"));
        assert_eq!(d.hook_results[0].result, "failed");
    }

    #[test]
    fn without_logs_the_terminated_message_is_the_log_tail() {
        let st = status(
            RolloutPhase::PreHook,
            vec![entry("migrate", HookPoint::Pre, HookPhase::Running, 1)],
        );
        let d = Case::new(full(), st, dep(NEW, true))
            .jobs(vec![failed_job("migrate", 1)])
            .decide();
        assert_eq!(
            hook(&d, "migrate").log_tail.as_deref(),
            Some("migration 42 failed")
        );
    }

    #[test]
    fn a_hook_job_deleted_while_running_fails_the_hook() {
        let st = status(
            RolloutPhase::PreHook,
            vec![entry("migrate", HookPoint::Pre, HookPhase::Running, 1)],
        );
        let d = Case::new(full(), st, dep(NEW, true)).decide();
        assert_eq!(hook(&d, "migrate").reason.as_deref(), Some("JobDeleted"));
        assert!(d.effects.is_empty(), "never created again");
    }

    #[test]
    fn a_hook_whose_container_is_missing_fails_without_a_job() {
        let s = spec("pre: [{name: migrate, container: {from: nope}}]");
        let st = status(
            RolloutPhase::PreHook,
            vec![{
                let mut e = entry("migrate", HookPoint::Pre, HookPhase::Pending, 1);
                e.job_name = None;
                e
            }],
        );
        let d = Case::new(s, st, dep(NEW, true)).decide();
        assert!(d.effects.is_empty());
        assert_eq!(hook(&d, "migrate").reason.as_deref(), Some("InvalidHook"));
        assert_eq!(phase(&d), RolloutPhase::Failed);
    }

    #[test]
    fn a_job_that_timed_out_is_deleted() {
        let mut e = entry("migrate", HookPoint::Pre, HookPhase::Failed, 1);
        e.reason = Some("DeadlineExceeded".into());
        let d = Case::new(
            full(),
            status(RolloutPhase::Failed, vec![e]),
            dep(NEW, true),
        )
        .jobs(vec![job("migrate", 1, JobState::Active, running_pod(0))])
        .decide();
        assert_eq!(
            d.effects,
            [Effect::DeleteJob(hooks::job_name("web", "migrate", NEW, 1))]
        );
    }

    #[test]
    fn retry_waits_its_backoff_then_makes_a_new_attempt_then_aborts() {
        let s = spec(
            "pre: [{name: migrate, failurePolicy: Retry, retries: 2, container: {from: app}}]",
        );
        let failed = |attempt| {
            let mut e = entry("migrate", HookPoint::Pre, HookPhase::Failed, attempt);
            e.finish_time = Some(Time(t(10)));
            e
        };
        // Attempt 1 failed at t=10: the backoff is 5s.
        let st = status(RolloutPhase::PreHook, vec![failed(1)]);
        let d = Case::new(s.clone(), st.clone(), dep(NEW, true))
            .at(12)
            .decide();
        assert!(quiet(&d, &st));
        let r = d.requeue.unwrap().as_secs_f64();
        assert!((3.0..=4.0).contains(&r), "{r}");
        let d = Case::new(s.clone(), st, dep(NEW, true)).at(15).decide();
        let h = hook(&d, "migrate");
        assert_eq!((h.attempt, h.phase), (2, HookPhase::Pending));
        // Attempt 2 failed: 10s.
        let st = status(RolloutPhase::PreHook, vec![failed(2)]);
        assert!(quiet(
            &Case::new(s.clone(), st.clone(), dep(NEW, true))
                .at(19)
                .decide(),
            &st
        ));
        assert_eq!(
            hook(
                &Case::new(s.clone(), st, dep(NEW, true)).at(20).decide(),
                "migrate"
            )
            .attempt,
            3
        );
        // Attempt 3 failing uses the last retry: the revision fails.
        let st = status(
            RolloutPhase::PreHook,
            vec![entry("migrate", HookPoint::Pre, HookPhase::Running, 3)],
        );
        let d = Case::new(s, st, dep(NEW, true))
            .jobs(vec![failed_job("migrate", 3)])
            .decide();
        assert_eq!(phase(&d), RolloutPhase::Failed);
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let secs: Vec<i64> = (1..=9).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
    }

    #[test]
    fn an_ignored_failure_goes_on_to_the_next_step() {
        let s = spec("pre: [{name: migrate, failurePolicy: Ignore, container: {from: app}}]");
        let st = status(
            RolloutPhase::PreHook,
            vec![entry("migrate", HookPoint::Pre, HookPhase::Running, 1)],
        );
        let d = Case::new(s.clone(), st, dep(NEW, true))
            .jobs(vec![failed_job("migrate", 1)])
            .decide();
        assert_eq!(hook(&d, "migrate").phase, HookPhase::Failed);
        assert_eq!(phase(&d), RolloutPhase::PreHook);
        assert_eq!(d.hook_results[0].result, "ignored");
        let d = Case::new(s, d.status, dep(NEW, true)).decide();
        assert_eq!(phase(&d), RolloutPhase::Rolling);
    }

    // ---- the rollout ----

    #[test]
    fn after_the_pre_hooks_the_deployment_is_unpaused() {
        let st = status(RolloutPhase::PreHook, vec![ok("migrate", HookPoint::Pre)]);
        let d = Case::new(full(), st, dep(NEW, true)).decide();
        assert_eq!(phase(&d), RolloutPhase::Rolling);
        assert!(d.effects.is_empty(), "recorded first");
        let d = Case::new(full(), d.status, rolling_dep(0, true)).decide();
        assert_eq!(d.effects, [Effect::Unpause]);
    }

    #[test]
    fn table_of_mid_hook_progress_points() {
        // (at, updated-and-available of 4, reached)
        for (at, new, reached) in [
            ("50%", 1, false),
            ("50%", 2, true),
            ("50%", 3, true),
            ("1", 0, false),
            ("1", 1, true),
            ("75%", 2, false),
            ("75%", 3, true),
            ("10", 3, false),
            ("10", 4, true),
        ] {
            let s = spec(&format!(
                "mid: [{{name: smoke, at: {at}, container: {{from: app}}}}]"
            ));
            let st = status(RolloutPhase::Rolling, vec![]);
            let d = Case::new(s, st, rolling_dep(new, false)).decide();
            if reached {
                assert_eq!(d.effects, [Effect::Pause], "at {at}, {new} new");
                assert_eq!(phase(&d), RolloutPhase::MidHook, "at {at}, {new} new");
            } else {
                assert!(d.effects.is_empty(), "at {at}, {new} new");
                assert_eq!(phase(&d), RolloutPhase::Rolling, "at {at}, {new} new");
                assert!(d.requeue.is_some(), "the progress deadline is a timer");
            }
        }
    }

    #[test]
    fn mid_hook_runs_paused_then_the_rollout_resumes() {
        let st = status(RolloutPhase::MidHook, vec![ok("migrate", HookPoint::Pre)]);
        let d = Case::new(full(), st, rolling_dep(2, true)).decide();
        assert_eq!(hook(&d, "smoke").phase, HookPhase::Pending);
        let st = status(
            RolloutPhase::MidHook,
            vec![ok("migrate", HookPoint::Pre), ok("smoke", HookPoint::Mid)],
        );
        let d = Case::new(full(), st, rolling_dep(2, true)).decide();
        assert_eq!(phase(&d), RolloutPhase::Rolling);
        let d = Case::new(full(), d.status, rolling_dep(2, true)).decide();
        assert_eq!(d.effects, [Effect::Unpause]);
    }

    #[test]
    fn a_complete_rollout_is_paused_and_runs_the_post_hooks_then_succeeds() {
        let done = vec![ok("migrate", HookPoint::Pre), ok("smoke", HookPoint::Mid)];
        let d = Case::new(
            full(),
            status(RolloutPhase::Rolling, done.clone()),
            dep(NEW, false),
        )
        .decide();
        assert_eq!(d.effects, [Effect::Pause]);
        assert_eq!(phase(&d), RolloutPhase::PostHook);
        let mut all = done;
        all.push(ok("purge", HookPoint::Post));
        let d = Case::new(full(), status(RolloutPhase::PostHook, all), dep(NEW, true)).decide();
        assert_eq!(phase(&d), RolloutPhase::Succeeded);
        assert_eq!(d.status.stable_revision.as_deref(), Some(NEW));
        assert_eq!(d.status.stable_template, Some(json!({"rev": NEW})));
        assert_eq!(d.status.current_hook, None);
        assert_eq!(reasons(&d), ["RolloutSucceeded"]);
    }

    #[test]
    fn a_rollout_without_progress_fails_at_the_deadline() {
        let s = spec("progressDeadlineSeconds: 60");
        let st = status(RolloutPhase::Rolling, vec![]);
        let d = Case::new(s.clone(), st.clone(), rolling_dep(1, false))
            .at(30)
            .decide();
        assert_eq!(phase(&d), RolloutPhase::Rolling);
        assert_eq!(d.requeue.map(|r| r.as_secs()), Some(30));
        let d = Case::new(s, st, rolling_dep(1, false)).at(61).decide();
        assert_eq!(phase(&d), RolloutPhase::Failed);
        assert!(
            d.status
                .message
                .unwrap()
                .contains("progressDeadlineSeconds")
        );
    }

    // ---- failure policies ----

    #[test]
    fn table_of_what_a_failed_revision_does_to_the_deployment() {
        // (onFailure, has stable template, template now, paused, effects, phase)
        let cases = [
            (
                "Rollback",
                true,
                NEW,
                true,
                vec![Effect::RestoreTemplate],
                RolloutPhase::RolledBack,
            ),
            (
                "Rollback",
                true,
                OLD,
                true,
                vec![],
                RolloutPhase::RolledBack,
            ),
            ("Rollback", false, NEW, true, vec![], RolloutPhase::Failed),
            ("Halt", true, NEW, true, vec![], RolloutPhase::Failed),
            (
                "Halt",
                true,
                NEW,
                false,
                vec![Effect::Pause],
                RolloutPhase::Failed,
            ),
        ];
        for (policy, stable, now, paused, effects, want) in cases {
            let mut st = status(RolloutPhase::Failed, vec![]);
            if !stable {
                st.stable_revision = None;
                st.stable_template = None;
            }
            let d = Case::new(spec(&format!("onFailure: {policy}")), st, dep(now, paused)).decide();
            assert_eq!(d.effects, effects, "{policy} {stable} {now} {paused}");
            assert_eq!(phase(&d), want, "{policy} {stable} {now} {paused}");
        }
    }

    #[test]
    fn a_rolled_back_deployment_is_let_converge_then_paused() {
        let st = status(RolloutPhase::RolledBack, vec![]);
        let mut back = rolling_dep(2, true);
        back.revision = OLD.into();
        back.updated_replicas = 2;
        let d = Case::new(full(), st.clone(), back).decide();
        assert_eq!(d.effects, [Effect::Unpause]);
        let d = Case::new(full(), st, dep(OLD, false)).decide();
        assert_eq!(d.effects, [Effect::Pause]);
    }

    #[test]
    fn a_failed_revision_is_not_started_again_by_itself() {
        let st = status(RolloutPhase::Failed, vec![]);
        let d = Case::new(spec("onFailure: Halt"), st.clone(), dep(NEW, true)).decide();
        assert!(quiet(&d, &st));
    }

    // ---- gates and annotations ----

    #[test]
    fn approval_gate_waits_for_its_own_revision() {
        let s = spec("mid: [{name: go-live, at: 1, approval: {}}]");
        let st = status(RolloutPhase::MidHook, vec![]);
        let d = Case::new(s.clone(), st, rolling_dep(1, true)).decide();
        assert_eq!(phase(&d), RolloutPhase::WaitingApproval);
        assert_eq!(hook(&d, "go-live").phase, HookPhase::Waiting);
        let waiting = d.status;
        let mut c = Case::new(s.clone(), waiting.clone(), rolling_dep(1, true));
        c.approve = Some(OLD);
        assert!(quiet(&c.decide(), &waiting), "another revision's approval");
        c.approve = Some(NEW);
        let d = c.decide();
        assert_eq!(d.effects, [Effect::RemoveAnnotation(APPROVE_ANNOTATION)]);
        assert_eq!(hook(&d, "go-live").phase, HookPhase::Succeeded);
        assert_eq!(phase(&d), RolloutPhase::MidHook);
    }

    #[test]
    fn retry_annotation_reruns_the_failed_revision_with_fresh_attempt_numbers() {
        let mut e = entry("migrate", HookPoint::Pre, HookPhase::Failed, 1);
        e.reason = Some("Error".into());
        let st = status(RolloutPhase::Failed, vec![e]);
        let mut c = Case::new(
            spec("onFailure: Halt\npre: [{name: migrate, container: {from: app}}]"),
            st.clone(),
            dep(NEW, true),
        );
        c.retry = Some(OLD);
        assert!(c.decide().effects.is_empty(), "a retry of another revision");
        c.retry = Some(NEW);
        let d = c.decide();
        assert_eq!(d.effects, [Effect::RemoveAnnotation(RETRY_ANNOTATION)]);
        assert_eq!(phase(&d), RolloutPhase::PreHook);
        assert_eq!(d.status.attempt_offset, 1);
        let d = Case::new(c.spec.clone(), d.status, dep(NEW, true)).decide();
        assert_eq!(hook(&d, "migrate").attempt, 2);
    }

    // ---- a new revision mid-sequence ----

    #[test]
    fn a_template_change_lets_the_running_hook_finish_first() {
        let st = status(
            RolloutPhase::PreHook,
            vec![entry("migrate", HookPoint::Pre, HookPhase::Running, 1)],
        );
        let mut newer = dep(NEWER, true);
        newer.template = template();
        let d = Case::new(full(), st.clone(), newer.clone())
            .jobs(vec![job("migrate", 1, JobState::Active, running_pod(5))])
            .decide();
        assert!(quiet(&d, &st), "still following the running hook: {d:?}");
        let d = Case::new(full(), st, newer.clone())
            .jobs(vec![job(
                "migrate",
                1,
                JobState::Succeeded {
                    finished: Some(t(15)),
                },
                None,
            )])
            .decide();
        assert_eq!(hook(&d, "migrate").phase, HookPhase::Succeeded);
        assert_eq!(d.status.current_revision.as_deref(), Some(NEW));
        let d = Case::new(full(), d.status, newer).decide();
        assert_eq!(d.status.current_revision.as_deref(), Some(NEWER));
        assert_eq!(phase(&d), RolloutPhase::PreHook);
        assert!(d.status.hooks.is_empty());
    }

    #[test]
    fn a_revision_that_comes_back_runs_its_hooks_anew() {
        let mut st = status(RolloutPhase::Succeeded, vec![]);
        st.stable_revision = Some(OLD.into());
        st.current_revision = Some(OLD.into());
        let old_run = job("migrate", 2, JobState::Succeeded { finished: None }, None);
        let d = Case::new(full(), st, dep(NEW, true))
            .jobs(vec![old_run])
            .decide();
        assert_eq!(phase(&d), RolloutPhase::PreHook);
        assert_eq!(d.status.attempt_offset, 2);
        let d = Case::new(full(), d.status, dep(NEW, true)).decide();
        assert_eq!(
            hook(&d, "migrate").attempt,
            3,
            "a fresh Job, not the old one"
        );
    }

    #[test]
    fn a_template_change_while_rolling_pauses_and_starts_over() {
        let st = status(RolloutPhase::Rolling, vec![ok("migrate", HookPoint::Pre)]);
        let d = Case::new(full(), st.clone(), dep(NEWER, false)).decide();
        assert_eq!(d.effects, [Effect::Pause]);
        let d = Case::new(full(), st, dep(NEWER, true)).decide();
        assert_eq!(d.status.current_revision.as_deref(), Some(NEWER));
        assert_eq!(phase(&d), RolloutPhase::PreHook);
    }

    #[test]
    fn a_template_put_back_to_stable_mid_sequence_ends_as_rolled_back() {
        let st = status(RolloutPhase::PreHook, vec![]);
        let d = Case::new(full(), st, dep(OLD, true)).decide();
        assert_eq!(phase(&d), RolloutPhase::RolledBack);
    }

    // ---- Recreate ----

    #[test]
    fn recreate_sets_replicas_aside_runs_mid_hooks_with_no_pods_and_restores_them() {
        let s = spec("mid: [{name: schema, at: 1, container: {from: app}}]");
        let mut d0 = dep(NEW, true);
        d0.recreate = true;
        d0.updated_replicas = 0;
        let st = status(RolloutPhase::Rolling, vec![]);
        // 1. the replica count is recorded first
        let d = Case::new(s.clone(), st, d0.clone()).decide();
        assert_eq!(d.status.original_replicas, Some(4));
        assert!(d.effects.is_empty());
        // 2. scaled to 0 while paused
        let d = Case::new(s.clone(), d.status, d0.clone()).decide();
        assert_eq!(d.effects, [Effect::Scale(0)]);
        // 3. waits for the old pods to go
        let mut zero = d0.clone();
        zero.replicas = 0;
        let d = Case::new(s.clone(), d.status.clone(), zero.clone()).decide();
        assert_eq!(phase(&d), RolloutPhase::Rolling);
        assert!(d.effects.is_empty());
        zero.status_replicas = 0;
        let d = Case::new(s.clone(), d.status, zero.clone()).decide();
        assert_eq!(phase(&d), RolloutPhase::MidHook);
        // 4. after the mid hook: unpaused, then the replicas come back, then forgotten
        let mut st = d.status;
        st.hooks = vec![ok("schema", HookPoint::Mid)];
        let d = Case::new(s.clone(), st, zero.clone()).decide();
        assert_eq!(phase(&d), RolloutPhase::Rolling);
        let d = Case::new(s.clone(), d.status, zero).decide();
        assert_eq!(d.effects, [Effect::Unpause, Effect::Scale(4)]);
        let mut back = d0;
        back.paused = false;
        let d = Case::new(s, d.status, back).decide();
        assert_eq!(d.status.original_replicas, None);
    }

    #[test]
    fn replicas_set_aside_come_back_when_the_revision_fails() {
        let mut st = status(RolloutPhase::Failed, vec![]);
        st.original_replicas = Some(3);
        let mut d0 = dep(NEW, true);
        d0.replicas = 0;
        let d = Case::new(spec("onFailure: Halt"), st, d0).decide();
        assert_eq!(d.effects, [Effect::Scale(3)]);
    }

    // ---- history ----

    #[test]
    fn finished_jobs_beyond_the_history_limit_are_pruned_newest_kept() {
        let s = spec("hookHistoryLimit: 1\npre: [{name: migrate, container: {from: app}}]");
        let mut st = status(RolloutPhase::Succeeded, vec![ok("migrate", HookPoint::Pre)]);
        st.stable_revision = Some(NEW.into());
        let mut old_job = job("migrate", 1, JobState::Succeeded { finished: None }, None);
        old_job.name = "web-migrate-old-1".into();
        old_job.created = Some(t(-100));
        let new_job = job("migrate", 1, JobState::Succeeded { finished: None }, None);
        let first = Case::new(s.clone(), st, dep(NEW, true)).decide();
        let d = Case::new(s, first.status.clone(), dep(NEW, true))
            .jobs(vec![old_job, new_job])
            .decide();
        assert!(!d.changes(&first.status));
        assert_eq!(d.prune, ["web-migrate-old-1"]);
    }

    #[test]
    fn conditions_follow_the_phase() {
        let d = Case::new(full(), status(RolloutPhase::Failed, vec![]), dep(NEW, true)).decide();
        let cs = &d.status.conditions;
        let get = |t: &str| cs.iter().find(|c| c.type_ == t).unwrap().status.clone();
        assert_eq!(get("Failed"), "True");
        assert_eq!(get("Ready"), "False");
        assert_eq!(get("Progressing"), "False");
    }
}
