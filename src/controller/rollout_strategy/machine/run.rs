//! Running one hook: its status entry, its Job (created once per attempt, or adopted), how it
//! ended, timeouts, retries and approval gates.

use super::super::hooks;
use super::super::observe::{DeploymentView, JobState};
use super::{
    APPROVAL_TIMEOUT, APPROVED, CANCELLED, Effect, HookResult, Machine, Run, backoff, point_phase,
};
use crate::api::rollout_strategy::APPROVE_ANNOTATION;
use crate::api::{FailurePolicy, Hook, HookPhase, HookPoint, HookStatus, OnTimeout, RolloutPhase};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

impl Machine<'_> {
    /// Makes a new run of `hook` the current one: phase, message and a HookStarted Event.
    fn announce(&mut self, point: HookPoint, hook: &Hook, rev: &str, attempt: i32, why: &str) {
        self.st.current_hook = Some(hook.name.clone());
        if let Some(gate) = &hook.approval {
            self.set_phase(RolloutPhase::WaitingApproval);
            self.st.message = Some(Self::waiting_message(
                rev,
                gate.timeout_seconds
                    .map(|_| (self.gate_deadline(hook, self.now()), gate.on_timeout())),
            ));
            self.event(
                false,
                "HookStarted",
                format!(
                    "approval gate {} waits for {APPROVE_ANNOTATION}={rev}{why}",
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
                    "{} hook {} for revision {rev}, attempt {attempt}{why}",
                    point.as_str(),
                    hook.name
                ),
            );
        }
    }

    /// What a waiting approval gate says: the annotation that opens it, and its deadline.
    fn waiting_message(rev: &str, deadline: Option<(Timestamp, OnTimeout)>) -> String {
        let mut msg = format!(
            "waiting for approval: annotate this RolloutStrategy {APPROVE_ANNOTATION}={rev}"
        );
        if let Some((at, then)) = deadline {
            let then = match then {
                OnTimeout::Abort => "aborted",
                OnTimeout::Approve => "approved",
            };
            msg.push_str(&format!(
                " (until {}, then {then})",
                at.round(jiff::Unit::Second).unwrap_or(at)
            ));
        }
        msg
    }

    /// When an approval gate reached at `since` stops waiting (a gate without a timeout: never,
    /// and this is not asked).
    fn gate_deadline(&self, hook: &Hook, since: Timestamp) -> Timestamp {
        let secs = hook
            .approval
            .as_ref()
            .and_then(|g| g.timeout_seconds)
            .unwrap_or(0);
        since + SignedDuration::from_secs(i64::from(secs))
    }

    /// A new run of `hook`: Waiting for an approval gate, else Pending (its Job is next).
    fn open_entry(&self, hook: &Hook, point: HookPoint, rev: &str, attempt: i32) -> HookStatus {
        let gate_timeout = hook.approval.as_ref().and_then(|g| g.timeout_seconds);
        HookStatus {
            deadline: gate_timeout.map(|_| Time(self.gate_deadline(hook, self.now()))),
            name: hook.name.clone(),
            point,
            revision: rev.to_string(),
            attempt,
            // A webhook's key is recorded with its entry, before its call is asked for.
            idempotency_key: hook
                .webhook
                .is_some()
                .then(|| self.call_key(&hook.name, rev, attempt)),
            phase: if hook.approval.is_some() {
                HookPhase::Waiting
            } else if hook.webhook.is_some() {
                HookPhase::Running
            } else {
                HookPhase::Pending
            },
            start_time: Some(Time(self.now())),
            ..Default::default()
        }
    }

    pub(super) fn run_hooks(
        &mut self,
        point: HookPoint,
        hooks: &[Hook],
        dep: &DeploymentView,
    ) -> Run {
        for hook in hooks {
            match self.run_hook(point, hook, dep) {
                Run::Done => continue,
                other => return other,
            }
        }
        Run::Done
    }

    pub(super) fn run_hook(&mut self, point: HookPoint, hook: &Hook, dep: &DeploymentView) -> Run {
        let rev = self.current();
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
            let entry = self.open_entry(hook, point, &rev, attempt);
            self.st.hooks.push(entry);
            self.announce(point, hook, &rev, attempt, "");
            return Run::Acted;
        };
        let e = self.st.hooks[idx].clone();
        match e.phase {
            HookPhase::Succeeded | HookPhase::Skipped => Run::Done,
            HookPhase::Failed if e.reason.as_deref() == Some(CANCELLED) => {
                // Back in the spec after it was cancelled: a fresh run.
                let attempt = e.attempt + 1;
                self.st.hooks[idx] = self.open_entry(hook, point, &rev, attempt);
                self.announce(point, hook, &rev, attempt, " (after a cancelled run)");
                Run::Acted
            }
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
                    self.st.hooks[idx] = self.open_entry(hook, point, &rev, attempt);
                    self.announce(point, hook, &rev, attempt, " (retry)");
                    return Run::Acted;
                }
                let msg = format!("hook {} failed", hook.name);
                self.fail(msg);
                Run::Failed
            }
            HookPhase::Waiting if hook.webhook.is_some() => {
                self.st.current_hook = Some(hook.name.clone());
                self.wait_external(idx, point, hook)
            }
            HookPhase::Waiting => {
                self.st.current_hook = Some(hook.name.clone());
                let gate = hook.approval.clone().unwrap_or_default();
                // The deadline follows the spec (a timeout added, changed or removed while the
                // gate waits), counted from the moment the gate was reached.
                let since = e.start_time.as_ref().map_or(self.now(), |t| t.0);
                let deadline = gate
                    .timeout_seconds
                    .map(|_| self.gate_deadline(hook, since));
                self.st.hooks[idx].deadline = deadline.map(Time);
                let timed_out = deadline.is_some_and(|d| self.now() >= d);
                if self.i.approve == Some(rev.as_str()) {
                    self.consume(APPROVE_ANNOTATION, &rev);
                    return self.open_gate(
                        idx,
                        point,
                        hook,
                        APPROVED,
                        format!("approved by {APPROVE_ANNOTATION}={rev}"),
                    );
                }
                if timed_out {
                    let secs = gate.timeout_seconds.unwrap_or(0);
                    if gate.on_timeout() == OnTimeout::Approve {
                        return self.open_gate(
                            idx,
                            point,
                            hook,
                            APPROVAL_TIMEOUT,
                            format!("no approval within timeoutSeconds ({secs}s): approved (onTimeout: Approve)"),
                        );
                    }
                    let now = self.now();
                    let entry = &mut self.st.hooks[idx];
                    entry.phase = HookPhase::Failed;
                    entry.reason = Some(APPROVAL_TIMEOUT.into());
                    entry.message = Some(format!(
                        "no approval within timeoutSeconds ({secs}s): aborted (onTimeout: Abort)"
                    ));
                    entry.finish_time = Some(Time(now));
                    let note = format!(
                        "approval gate {} of revision {rev} had no approval within timeoutSeconds ({secs}s): the revision is aborted",
                        hook.name
                    );
                    self.event(true, "HookFailed", note.clone());
                    self.fail(note);
                    return Run::Failed;
                }
                if let Some(d) = deadline {
                    self.requeue_in(d.duration_since(self.now()));
                }
                self.st.message = Some(Self::waiting_message(
                    &rev,
                    deadline.map(|d| (d, gate.on_timeout())),
                ));
                self.set_phase(RolloutPhase::WaitingApproval);
                Run::Waiting
            }
            HookPhase::Pending | HookPhase::Running if hook.webhook.is_some() => {
                self.st.current_hook = Some(hook.name.clone());
                self.track_call(idx, point, hook, dep)
            }
            HookPhase::Pending | HookPhase::Running => {
                self.st.current_hook = Some(hook.name.clone());
                self.track(idx, point, hook, Some(dep))
            }
        }
    }

    /// Opens the approval gate at `idx` (approved, or its timeout with `onTimeout: Approve`).
    fn open_gate(
        &mut self,
        idx: usize,
        point: HookPoint,
        hook: &Hook,
        reason: &str,
        message: String,
    ) -> Run {
        let rev = self.current();
        let entry = &mut self.st.hooks[idx];
        entry.phase = HookPhase::Succeeded;
        entry.reason = Some(reason.into());
        entry.message = Some(message.clone());
        entry.finish_time = Some(Time(self.i.now));
        self.set_phase(point_phase(point));
        self.event(
            false,
            "HookSucceeded",
            format!("approval gate {} of revision {rev}: {message}", hook.name),
        );
        Run::Acted
    }

    /// Follows the Job of an open hook entry: creates or adopts it, records how it ended, and
    /// fails it when it cannot start or runs too long. `dep` is `None` for a hook of a
    /// superseded revision, whose Job is never created anew.
    /// Records the hook at `idx` as succeeded at `finished` (its duration and Event; `how` is
    /// the Job or the webhook's answer), for a Job and a webhook hook alike.
    pub(super) fn succeeded(
        &mut self,
        idx: usize,
        point: HookPoint,
        finished: jiff::Timestamp,
        how: &str,
    ) -> Run {
        let entry = &mut self.st.hooks[idx];
        entry.phase = HookPhase::Succeeded;
        entry.finish_time = Some(Time(finished));
        let seconds = entry
            .start_time
            .as_ref()
            .map_or(0.0, |s| finished.duration_since(s.0).as_secs_f64().max(0.0));
        let note = format!(
            "{} hook {} succeeded for revision {} (attempt {}, {how})",
            point.as_str(),
            entry.name,
            entry.revision,
            entry.attempt
        );
        self.d.hook_results.push(HookResult {
            point,
            result: "succeeded",
            seconds,
        });
        self.event(false, "HookSucceeded", note);
        Run::Acted
    }

    pub(super) fn track(
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
                self.st.hooks[idx].exit_code = Some(0);
                let finished = finished.unwrap_or(self.now());
                self.succeeded(idx, point, finished, &format!("Job {name}"))
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
    pub(super) fn pending_deadline(
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
    pub(super) fn record_failure(
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
}
