//! Taking up a Deployment: adoption (a new strategy or a lost status), a replaced target,
//! refused writes, and starting a revision's sequence, also when a newer template supersedes it.

use super::super::hooks;
use super::super::observe::DeploymentView;
use super::{CANCELLED, Effect, Machine, ROLLOUT_STARTED, Rejection, Start, in_progress, short};
use crate::api::{HookPhase, HookStatus, RolloutPhase, RolloutStrategyStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

impl Machine<'_> {
    /// The name of a hook entry's Job for the current revision.
    pub(super) fn job_name(&self, e: &HookStatus) -> String {
        hooks::job_name(self.i.name, &e.name, &e.revision, e.attempt)
    }

    /// An entry that is running or about to run.
    pub(super) fn is_open(e: &HookStatus) -> bool {
        matches!(e.phase, HookPhase::Pending | HookPhase::Running)
    }

    /// Whether the spec still has a hook of this name (at any point).
    fn in_spec(&self, hook: &str) -> bool {
        self.i.spec.hooks().any(|(_, h)| h.name == hook)
    }

    /// A hook renamed or removed while it ran or waited: its entry ends as Failed with reason
    /// `Cancelled` (its Job is deleted as stray), so status never shows it running for good. A
    /// hook of that name that comes back later runs afresh, with the next attempt.
    pub(super) fn cancel_removed_hooks(&mut self) {
        let now = self.now();
        let removed: Vec<String> = self
            .st
            .hooks
            .iter()
            .filter(|e| Self::is_open(e) || e.phase == HookPhase::Waiting)
            .filter(|e| !self.in_spec(&e.name))
            .map(|e| e.name.clone())
            .collect();
        for e in self
            .st
            .hooks
            .iter_mut()
            .filter(|e| removed.contains(&e.name))
        {
            e.phase = HookPhase::Failed;
            e.reason = Some(CANCELLED.into());
            e.message = Some("the hook left the spec while it ran; its Job is deleted".into());
            e.finish_time = Some(Time(now));
        }
        for name in removed {
            if self.st.current_hook.as_deref() == Some(name.as_str()) {
                self.st.current_hook = None;
            }
            self.event(
                false,
                "HookCancelled",
                format!("hook {name} was removed from the spec while it ran; its Job is deleted"),
            );
        }
    }

    /// A Job that still runs but that nothing will follow: its hook timed out or was given up,
    /// it belongs to another revision or to a Deployment of the same name that was deleted, or
    /// its hook is no longer in the spec (renamed or removed while it ran). It is deleted so
    /// nothing of it keeps running. Before the current revision is known (no status yet),
    /// nothing is stray: a running Job of the revision about to start is adopted instead.
    pub(super) fn stray_active_job(&self, dep: &DeploymentView) -> Option<String> {
        let cur = self.st.current_revision.as_deref()?;
        self.i
            .jobs
            .iter()
            .filter(|j| !j.finished())
            .find(|j| {
                if !j.targets(&dep.uid) || j.revision != cur || !self.in_spec(&j.hook) {
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
    pub(super) fn replaced(&mut self, dep: &DeploymentView) {
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
    pub(super) fn write_refused(&mut self, r: &Rejection) {
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

    pub(super) fn adopt(&mut self, dep: &DeploymentView) {
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
            self.st.stable_template = rs.template_json.clone();
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
        self.st.stable_revision = Some(dep.revision.clone());
        self.st.stable_template = Some((*dep.template_json).clone());
        self.st.current_revision = Some(dep.revision.clone());
        self.set_phase(RolloutPhase::Idle);
        self.st.message = Some(if self.admission() {
            format!(
                "adopted Deployment {} at revision {}; the revision gate pauses its next revision for the hooks",
                dep.name, dep.revision
            )
        } else {
            format!(
                "adopted Deployment {} at revision {}; it stays paused until a new revision",
                dep.name, dep.revision
            )
        });
        self.hold_at_rest(dep);
    }

    /// A rollout of ours whose status was lost (cleared, or restored from an old backup) while
    /// the new revision's pods were rolling out: the revision resumes at `Rolling`, and the Jobs
    /// of its mid hooks that exist are adopted when their points are reached, never run again.
    pub(super) fn resume_lost(&mut self, dep: &DeploymentView) {
        if let Some(rs) = dep
            .replica_sets
            .iter()
            .filter(|r| r.revision != dep.revision)
            .max_by_key(|r| (r.replicas, r.created))
        {
            self.st.stable_revision = Some(rs.revision.clone());
            self.st.stable_template = rs.template_json.clone();
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

    pub(super) fn start_sequence(&mut self, revision: String, start: Start) {
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
            ROLLOUT_STARTED,
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
        self.st.released_revision = None;
        self.set_phase(RolloutPhase::PreHook);
        self.st.message = Some(format!("revision {revision}: pre hooks"));
    }

    /// The template changed while a revision was under way: a hook Job that already runs is
    /// followed to its end (its result is recorded, a failure applies its policy), then the
    /// new revision starts from its pre hooks.
    pub(super) fn superseded(&mut self, dep: &DeploymentView) {
        let running = self.st.hooks.iter().position(|e| {
            Self::is_open(e)
                && (e.job_name.is_some()
                    || self.i.jobs.iter().any(|j| j.name == self.job_name(e))
                    || self.call_under_way(e))
        });
        // Held while a hook of the old revision is followed to its end, or as any new revision.
        if !dep.paused && (running.is_some() || self.holds_new_revisions(dep)) {
            self.effect(Effect::Pause);
            return;
        }
        if let Some(idx) = running {
            let name = self.st.hooks[idx].name.clone();
            if let Some((point, hook)) = self.i.spec.hooks().find(|(_, h)| h.name == name) {
                let hook = hook.clone();
                if hook.webhook.is_some() {
                    self.track_call(idx, point, &hook, dep);
                } else {
                    self.track(idx, point, &hook, None);
                }
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
}
