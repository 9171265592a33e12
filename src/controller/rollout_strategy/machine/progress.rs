//! A revision under way: pre hooks while paused, the rolling phase and its mid points, and the
//! post hooks once the rollout is complete.

use super::super::observe::DeploymentView;
use super::{CANCELLED, Effect, Machine, ROLLOUT_SUCCEEDED, Run};
use crate::api::rollout_strategy::progress_point;
use crate::api::{FailurePolicy, Hook, HookPhase, HookPoint, RolloutPhase};
use jiff::SignedDuration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

impl Machine<'_> {
    pub(super) fn progress(&mut self, dep: &DeploymentView) {
        let cur = self.current();
        if dep.revision != cur {
            self.superseded(dep);
            return;
        }
        match self.phase() {
            RolloutPhase::PreHook => self.pre(dep),
            RolloutPhase::Rolling => self.rolling(dep),
            RolloutPhase::MidHook | RolloutPhase::WaitingApproval => self.mid(dep),
            // A webhook's engine decides: at the point of that hook.
            RolloutPhase::WaitingExternal => match self.waiting_point() {
                Some(HookPoint::Pre) => self.pre(dep),
                Some(HookPoint::Mid) => self.mid(dep),
                _ => self.post(dep),
            },
            _ => self.post(dep),
        }
    }

    /// The point of the hook the revision waits on (phase `WaitingExternal`).
    fn waiting_point(&self) -> Option<HookPoint> {
        let cur = self.current();
        self.st
            .hooks
            .iter()
            .filter(|e| e.revision == cur)
            .find(|e| e.phase == HookPhase::Waiting)
            .or_else(|| {
                self.st
                    .hooks
                    .iter()
                    .find(|e| Some(&e.name) == self.st.current_hook.as_ref())
            })
            .map(|e| e.point)
    }

    pub(super) fn pre(&mut self, dep: &DeploymentView) {
        if !dep.paused && self.holds_new_revisions(dep) {
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
    pub(super) fn restore_replicas(&mut self, dep: &DeploymentView, unpause: bool) -> bool {
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

    /// While replicas are set aside for Recreate mid hooks, a count other than 0 and the one set
    /// aside is the user's (`kubectl scale`): it replaces the one to restore.
    pub(super) fn take_user_scale(&mut self, dep: &DeploymentView) {
        if let Some(orig) = self.st.original_replicas
            && dep.replicas != 0
            && dep.replicas != orig
        {
            self.st.original_replicas = Some(dep.replicas);
            self.st.message = Some(format!(
                "revision {}: scaled to {} during the mid hooks; restored after them",
                dep.revision, dep.replicas
            ));
        }
    }

    /// Whether a hook needs nothing more (succeeded, or failed and ignored).
    pub(super) fn done(&self, h: &Hook) -> bool {
        self.st.hooks.iter().any(|e| {
            e.name == h.name
                && (matches!(e.phase, HookPhase::Succeeded | HookPhase::Skipped)
                    || (e.phase == HookPhase::Failed
                        && h.failure_policy == FailurePolicy::Ignore
                        && e.reason.as_deref() != Some(CANCELLED)))
        })
    }

    pub(super) fn started(&self, h: &Hook) -> bool {
        self.st.hooks.iter().any(|e| e.name == h.name)
    }

    /// The number of new replicas at which a mid hook runs.
    pub(super) fn point_of(h: &Hook, dep: &DeploymentView) -> i32 {
        h.at.as_ref()
            .and_then(|at| progress_point(at, dep.replicas))
            .unwrap_or(dep.replicas)
    }

    /// Whether the Deployment controller has scaled the new revision up to a mid hook's point:
    /// the moment to pause, so the rollout goes no further than that step.
    pub(super) fn scaled_to(&self, h: &Hook, dep: &DeploymentView) -> bool {
        dep.desired_of(&dep.revision) >= Self::point_of(h, dep)
    }

    /// Whether the new revision's available replicas reached a mid hook's point: the moment
    /// the hook may start.
    pub(super) fn reached(&self, h: &Hook, dep: &DeploymentView) -> bool {
        dep.observed() && dep.available_of(&dep.revision) >= Self::point_of(h, dep)
    }

    pub(super) fn rolling(&mut self, dep: &DeploymentView) {
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
                self.take_user_scale(dep);
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
        // `kubectl rollout pause` while the revision rolls out: left alone, as Kubernetes
        // does, and not counted against the deadline. Only once ballast has let the revision
        // go (a pause it finds before that, such as one from a manifest that says `paused:
        // true`, is the revision's own and let go with it), and only when the Deployment was
        // written since the last decision: a cache that still shows the pause let go a moment
        // ago has the generation recorded then.
        let released = self.st.released_revision.as_deref() == Some(dep.revision.as_str());
        if let Some(who) = dep.paused_by_someone_else()
            && released
        {
            let new = self.st.paused_by.is_some()
                || self
                    .st
                    .deployment_generation
                    .is_none_or(|g| dep.generation > g);
            if new {
                self.st.paused_by = Some(who.to_string());
                self.st.message = Some(format!(
                    "revision {}: paused by {who} while rolling out; ballast goes on after `kubectl rollout resume`",
                    dep.revision
                ));
            }
            // Else the pause let go, as the cache still shows it: wait for the cache.
            return;
        }
        self.st.released_revision = Some(dep.revision.clone());
        if dep.paused {
            self.effect(Effect::Unpause);
            return;
        }
        if self.st.paused_by.take().is_some() {
            // Resumed: the deadline counts from now.
            self.st.phase_transition_time = Some(Time(self.now()));
            self.st.message = Some(format!("revision {}: rolling out", dep.revision));
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
                    // Post hooks run with the Deployment as it is at rest.
                    if !self.admission() {
                        self.effect(Effect::Pause);
                    }
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
    pub(super) fn deadline(&mut self) {
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

    pub(super) fn mid(&mut self, dep: &DeploymentView) {
        if !dep.paused {
            self.effect(Effect::Pause);
            return;
        }
        let mid = self.i.spec.mid.clone();
        if dep.recreate {
            // Scaled by the user while the hooks run: that count is the one to restore, and
            // no pod comes back before the hooks are done.
            self.take_user_scale(dep);
            if dep.replicas != 0 && self.st.original_replicas.is_some() {
                self.effect(Effect::Scale(0));
                return;
            }
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
                self.note_overshoot(hook, dep);
            }
            match self.run_hook(HookPoint::Mid, hook, dep) {
                Run::Done => {}
                _ => return,
            }
        }
        self.resume_rolling(dep);
    }

    /// A surge step can scale the new ReplicaSet past a mid point in one go, before the pause
    /// lands: the hook then starts with more new replicas than `at`, and says by how many.
    fn note_overshoot(&mut self, hook: &Hook, dep: &DeploymentView) {
        let point = Self::point_of(hook, dep);
        let scaled = dep.desired_of(&dep.revision);
        if scaled > point {
            self.event(
                false,
                "MidPointPassed",
                format!(
                    "mid hook {} of revision {}: the Deployment controller's step scaled the new ReplicaSet to {scaled}, {} past the point {point}, before the pause",
                    hook.name,
                    dep.revision,
                    scaled - point
                ),
            );
        }
    }

    pub(super) fn resume_rolling(&mut self, dep: &DeploymentView) {
        self.st.current_hook = None;
        self.set_phase(RolloutPhase::Rolling);
        self.st.message = Some(format!("revision {}: rolling out", dep.revision));
    }

    pub(super) fn post(&mut self, dep: &DeploymentView) {
        if !dep.paused && !self.admission() {
            self.effect(Effect::Pause);
            return;
        }
        let hooks = self.i.spec.post.clone();
        if self.run_hooks(HookPoint::Post, &hooks, dep) == Run::Done {
            self.st.current_hook = None;
            self.st.stable_revision = Some(dep.revision.clone());
            self.st.stable_template = Some((*dep.template_json).clone());
            self.set_phase(RolloutPhase::Succeeded);
            self.st.message = Some(format!("revision {} rolled out", dep.revision));
            self.event(
                false,
                ROLLOUT_SUCCEEDED,
                format!("revision {} rolled out", dep.revision),
            );
        }
    }
}
