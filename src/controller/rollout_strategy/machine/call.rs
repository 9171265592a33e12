//! Running one webhook hook: its entry is recorded Running with its idempotency key before the
//! call is asked for ([`Effect::StartCall`]), the answer (which the caller keeps by key until
//! it is in status) passes, fails or hands the decision to the engine (`202 Accepted`: the
//! hook waits, phase `WaitingExternal`, for `ballast.dev/approve` or `ballast.dev/abort` of the
//! revision, at most `timeoutSeconds` from the hook's start).
//!
//! At most one call per hook, revision and attempt: this process asks for a key's call once
//! (the caller refuses a key it knows); a Running entry whose call this process does not know
//! (the operator restarted mid-call) is called again with the same key, never a new one.

use super::super::observe::DeploymentView;
use super::super::webhook::{self, Answer, CallState};
use super::{APPROVED, Effect, HookResult, Machine, Run, WEBHOOK_DECISION_TIMEOUT, point_phase};
use crate::api::rollout_strategy::{ABORT_ANNOTATION, APPROVE_ANNOTATION};
use crate::api::{Hook, HookPhase, HookPoint, HookStatus, RolloutPhase};
use jiff::SignedDuration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

impl Machine<'_> {
    /// The idempotency key of attempt `attempt` of `hook` for `rev`.
    pub(super) fn call_key(&self, hook: &str, rev: &str, attempt: i32) -> String {
        webhook::idempotency_key(&self.i.webhooks.uid, hook, rev, attempt)
    }

    /// Whether this process has made the call of a Running webhook entry and has not recorded
    /// its answer yet. A superseded revision's call is followed to its end, as its Job would
    /// be: the engine may be migrating for it. A call this process does not know (made before
    /// a restart) is not sent again for a revision that is no longer wanted, and a `202`
    /// decision still pending is dropped with its revision.
    pub(super) fn call_under_way(&self, e: &HookStatus) -> bool {
        e.phase == HookPhase::Running
            && e.idempotency_key.as_ref().is_some_and(|k| {
                matches!(
                    self.i.webhooks.call(k),
                    CallState::InFlight
                        | CallState::Answered(Answer::Passed { .. } | Answer::Failed(_))
                )
            })
    }

    /// Follows the call of an open webhook entry (Pending or Running).
    pub(super) fn track_call(
        &mut self,
        idx: usize,
        point: HookPoint,
        hook: &Hook,
        _dep: &DeploymentView,
    ) -> Run {
        let Some(w) = hook.webhook.as_ref() else {
            return Run::Done;
        };
        let e = self.st.hooks[idx].clone();
        let key = match e.idempotency_key.clone() {
            Some(k) if e.phase == HookPhase::Running => k,
            _ => {
                // Recorded first; the call is asked for once this is written.
                let key = self.call_key(&hook.name, &e.revision, e.attempt);
                let entry = &mut self.st.hooks[idx];
                entry.phase = HookPhase::Running;
                entry.idempotency_key = Some(key);
                return Run::Acted;
            }
        };
        match self.i.webhooks.call(&key) {
            CallState::Unknown => {
                let target = match webhook::target(
                    w,
                    &self.i.webhooks.namespace,
                    &self.i.webhooks.allowed,
                ) {
                    Ok(t) => t,
                    Err(f) => {
                        return self.record_failure(
                            idx,
                            point,
                            hook,
                            None,
                            f.reason.into(),
                            f.message,
                            None,
                        );
                    }
                };
                self.st.message = Some(format!(
                    "revision {}: {} hook {} calls {target} (attempt {})",
                    e.revision,
                    point.as_str(),
                    hook.name,
                    e.attempt
                ));
                self.effect(Effect::StartCall {
                    point,
                    hook: hook.name.clone(),
                    revision: e.revision.clone(),
                    attempt: e.attempt,
                    key,
                });
                Run::Acted
            }
            // The answer wakes the strategy; the call's own timeout bounds the wait.
            CallState::InFlight => Run::Waiting,
            CallState::Answered(Answer::Passed { status }) => {
                self.st.hooks[idx].http_status = Some(i32::from(status));
                let now = self.now();
                self.succeeded(idx, point, now, &format!("webhook answered {status}"))
            }
            CallState::Answered(Answer::Accepted) => {
                let since = e.start_time.as_ref().map_or(self.now(), |t| t.0);
                let deadline = since + SignedDuration::from_secs(i64::from(hook.timeout_seconds));
                let entry = &mut self.st.hooks[idx];
                entry.phase = HookPhase::Waiting;
                entry.http_status = Some(202);
                entry.deadline = Some(Time(deadline));
                let rev = e.revision.clone();
                self.event(
                    false,
                    "HookAccepted",
                    format!(
                        "{} hook {} of revision {rev}: the webhook answered 202 Accepted; waiting for {APPROVE_ANNOTATION}={rev} or {ABORT_ANNOTATION}={rev} (until {})",
                        point.as_str(),
                        hook.name,
                        deadline.round(jiff::Unit::Second).unwrap_or(deadline)
                    ),
                );
                Run::Acted
            }
            CallState::Answered(Answer::Failed(f)) => {
                self.st.hooks[idx].http_status = f.status.map(i32::from);
                self.record_failure(idx, point, hook, None, f.reason.into(), f.message, f.body)
            }
        }
    }

    /// A webhook whose engine answered `202 Accepted`: waits for its decision.
    pub(super) fn wait_external(&mut self, idx: usize, point: HookPoint, hook: &Hook) -> Run {
        let rev = self.current();
        let e = self.st.hooks[idx].clone();
        let since = e.start_time.as_ref().map_or(self.now(), |t| t.0);
        // Follows the spec (a timeout changed while it waits), from the hook's start.
        let deadline = since + SignedDuration::from_secs(i64::from(hook.timeout_seconds));
        self.st.hooks[idx].deadline = Some(Time(deadline));
        if self.i.approve == Some(rev.as_str()) {
            self.consume(APPROVE_ANNOTATION, &rev);
            let now = self.now();
            let message = format!("approved by {APPROVE_ANNOTATION}={rev}");
            let entry = &mut self.st.hooks[idx];
            entry.phase = HookPhase::Succeeded;
            entry.reason = Some(APPROVED.into());
            entry.message = Some(message.clone());
            entry.finish_time = Some(Time(now));
            self.d.hook_results.push(HookResult {
                point,
                result: "succeeded",
                seconds: now.duration_since(since).as_secs_f64().max(0.0),
            });
            self.set_phase(point_phase(point));
            self.event(
                false,
                "HookSucceeded",
                format!(
                    "{} hook {} of revision {rev}: {message}",
                    point.as_str(),
                    hook.name
                ),
            );
            return Run::Acted;
        }
        if self.now() >= deadline {
            return self.record_failure(
                idx,
                point,
                hook,
                None,
                WEBHOOK_DECISION_TIMEOUT.into(),
                format!(
                    "the webhook answered 202 Accepted, then no {APPROVE_ANNOTATION}={rev} or {ABORT_ANNOTATION}={rev} came within timeoutSeconds ({}s)",
                    hook.timeout_seconds
                ),
                None,
            );
        }
        self.requeue_in(deadline.duration_since(self.now()));
        self.st.message = Some(format!(
            "waiting for the engine of webhook hook {}: annotate this RolloutStrategy {APPROVE_ANNOTATION}={rev} or {ABORT_ANNOTATION}={rev} (until {})",
            hook.name,
            deadline.round(jiff::Unit::Second).unwrap_or(deadline)
        ));
        self.set_phase(RolloutPhase::WaitingExternal);
        Run::Waiting
    }
}
