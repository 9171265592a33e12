//! A revision's end: failure, what happens to the Deployment at rest (rollback, halt, retry),
//! and which finished hook Jobs to prune.

use super::super::observe::{DeploymentView, JobView};
use super::{ABORTED, Effect, Machine, Start, in_progress, phase_name, short};
use crate::api::rollout_strategy::{ABORT_ANNOTATION, RETRY_ANNOTATION};
use crate::api::{HookPhase, OnFailure, RolloutPhase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

impl Machine<'_> {
    /// The current revision failed; what happens to the Deployment is decided at rest.
    pub(super) fn fail(&mut self, message: String) {
        self.set_phase(RolloutPhase::Failed);
        self.st.message = Some(message.clone());
        self.event(true, "RolloutFailed", message);
    }

    /// `ballast.dev/abort=<revision>`: the revision under way fails as a failed hook would fail
    /// it (then `onFailure` applies, at rest). A hook Job still running is given up (its entry
    /// ends `Aborted`, so it is deleted as stray) and an approval gate waits no longer. An abort
    /// that names another revision than the one under way, or comes when none is, is refused:
    /// the status message and a Warning Event say why. Either way the annotation is recorded in
    /// status first and removed next round, like an approval. Returns whether there was one.
    pub(super) fn abort(&mut self, dep: &DeploymentView) -> bool {
        let Some(value) = self.i.abort else {
            return false;
        };
        let cur = self.current();
        self.consume(ABORT_ANNOTATION, value);
        let phase = self.phase();
        if in_progress(phase) && value == cur && dep.revision == cur {
            let now = Time(self.now());
            for e in self
                .st
                .hooks
                .iter_mut()
                .filter(|e| Self::is_open(e) || e.phase == HookPhase::Waiting)
            {
                e.phase = HookPhase::Failed;
                e.reason = Some(ABORTED.into());
                e.message = Some(format!("the revision was aborted by {ABORT_ANNOTATION}"));
                e.finish_time = Some(now.clone());
            }
            let at = self
                .st
                .current_hook
                .take()
                .map(|h| format!(" at hook {h}"))
                .unwrap_or_default();
            self.fail(format!(
                "revision {cur} aborted by {ABORT_ANNOTATION}={value} in phase {}{at}",
                phase_name(phase)
            ));
            return true;
        }
        let why = if value != cur {
            format!("the revision under way is {}", short(Some(&cur)))
        } else if in_progress(phase) {
            format!(
                "the Deployment's template is revision {} now; revision {cur} is being superseded",
                dep.revision
            )
        } else {
            format!(
                "revision {cur} is not under way (phase {})",
                phase_name(phase)
            )
        };
        let msg = format!("{ABORT_ANNOTATION}={value} refused: {why}");
        self.event(true, "AbortRefused", msg.clone());
        self.st.message = Some(msg);
        true
    }

    pub(super) fn at_rest(&mut self, dep: &DeploymentView) {
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
                // A status the Deployment controller has not caught up with (our own write
                // of a moment ago, or someone's pause) says nothing yet: wait for it.
                if !dep.observed() {
                    return;
                }
                // Back to the stable ReplicaSet: let the Deployment controller finish that,
                // unless someone else paused it meanwhile.
                if dep.paused && dep.paused_by_someone_else().is_none() {
                    self.effect(Effect::Unpause);
                }
                return;
            }
            self.hold_at_rest(dep);
            return;
        }
        if failed && rev == cur {
            // Halted (or failed with nothing to roll back to): held on the failed revision.
            if !dep.paused {
                self.effect(Effect::Pause);
            }
            return;
        }
        if !dep.paused && self.holds_new_revisions(dep) {
            if self.admission() {
                self.event(
                    true,
                    "RevisionNotGated",
                    format!(
                        "revision {} of Deployment {} was not paused by the revision gate (is config/admission installed, and was this strategy created before the change?): paused now; pods of it may have started before its hooks",
                        dep.revision, dep.name
                    ),
                );
            }
            self.effect(Effect::Pause);
        }
        self.start_sequence(dep.revision.clone(), Start::New);
    }

    /// A Deployment between revisions: kept paused in pause-at-rest mode; unpaused with the
    /// revision gate (which pauses the next revision itself), unless someone else paused it —
    /// `kubectl rollout pause`, or a manifest that says `paused: true` —, which ballast leaves
    /// alone and says so.
    pub(super) fn hold_at_rest(&mut self, dep: &DeploymentView) {
        if !self.admission() {
            if !dep.paused {
                self.effect(Effect::Pause);
            }
            return;
        }
        if let Some(who) = dep.paused_by_someone_else() {
            self.st.message = Some(format!(
                "revision {} is at rest; Deployment {} is paused by {who}, which ballast leaves alone (`kubectl rollout resume`, or remove `paused: true` from the manifest)",
                dep.revision, dep.name
            ));
            return;
        }
        if dep.paused {
            self.effect(Effect::Unpause);
        }
    }

    /// Finished hook Jobs beyond `hookHistoryLimit` per hook, newest kept.
    pub(super) fn prunable(&self) -> Vec<String> {
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
}
