//! Table tests of webhook hooks in the machine: record before calling, one call per key, what
//! each answer becomes, the engine's decision after `202 Accepted`, and hosts not allowed.

use super::*;
use crate::controller::rollout_strategy::webhook::{
    self, AllowedHosts, Answer, CallState, Failure,
};

fn url_pre(timeout: i32) -> RolloutStrategySpec {
    spec(&format!(
        "pre: [{{name: notify, timeoutSeconds: {timeout}, webhook: {{url: 'http://127.0.0.1:9/hook'}}}}]"
    ))
}

fn allowing(mut c: Case<'_>) -> Case<'_> {
    c.webhooks.allowed = AllowedHosts::new(&["127.0.0.1".to_string()]);
    c
}

fn key(attempt: i32) -> String {
    webhook::idempotency_key("uid-1", "notify", NEW, attempt)
}

fn started(c: &Case) -> RolloutStrategyStatus {
    let d = c.decide();
    assert!(
        d.effects.is_empty(),
        "the entry is recorded before the call: {d:?}"
    );
    let h = hook(&d, "notify");
    assert_eq!(
        (
            h.phase,
            h.attempt,
            h.idempotency_key.clone(),
            h.job_name.clone()
        ),
        (HookPhase::Running, 1, Some(key(1)), None)
    );
    assert!(h.start_time.is_some());
    d.status
}

/// The status once the pre webhook (timeout 60 s) is recorded Running with its key.
fn running_call() -> RolloutStrategyStatus {
    started(&allowing(Case::new(
        url_pre(60),
        status(RolloutPhase::PreHook, vec![]),
        dep(NEW, true),
    )))
}

fn start_call(attempt: i32) -> Effect {
    Effect::StartCall {
        point: HookPoint::Pre,
        hook: "notify".into(),
        revision: NEW.into(),
        attempt,
        key: key(attempt),
    }
}

fn answered(mut c: Case<'_>, attempt: i32, a: Answer) -> Case<'_> {
    c.webhooks
        .calls
        .insert(key(attempt), CallState::Answered(a));
    c
}

#[test]
fn a_webhook_is_recorded_running_with_its_key_and_only_then_called() {
    let c = allowing(Case::new(
        url_pre(60),
        status(RolloutPhase::PreHook, vec![]),
        dep(NEW, true),
    ));
    let st = started(&c);
    let c = allowing(Case::new(url_pre(60), st.clone(), dep(NEW, true)));
    let d = c.decide();
    assert_eq!(d.effects, [start_call(1)]);
    assert_eq!(d.status.hooks, st.hooks, "the call changes no entry");
    // The plan stops before the call, so the entry is written first.
    let p = allowing(Case::new(
        url_pre(60),
        status(RolloutPhase::PreHook, vec![]),
        dep(NEW, true),
    ))
    .plan();
    assert!(
        p.more
            && !p
                .decision
                .effects
                .iter()
                .any(|e| matches!(e, Effect::StartCall { .. }))
    );
}

#[test]
fn a_call_under_way_is_not_asked_for_again() {
    let st = running_call();
    let mut c = allowing(Case::new(url_pre(60), st, dep(NEW, true)));
    c.webhooks.calls.insert(key(1), CallState::InFlight);
    let d = c.decide();
    assert!(d.effects.is_empty());
    assert_eq!(phase(&d), RolloutPhase::PreHook);
}

#[test]
fn after_a_restart_a_running_webhook_is_called_again_with_the_same_key() {
    // The entry says Running with key 1; this process knows nothing of the call.
    let st = running_call();
    let d = allowing(Case::new(url_pre(60), st, dep(NEW, true)))
        .at(500)
        .decide();
    assert_eq!(d.effects, [start_call(1)], "same attempt, same key");
}

#[test]
fn a_2xx_passes_the_hook_and_the_rollout_goes_on() {
    let st = running_call();
    let c = answered(
        allowing(Case::new(url_pre(60), st, dep(NEW, true))),
        1,
        Answer::Passed { status: 204 },
    );
    let d = c.decide();
    let h = hook(&d, "notify");
    assert_eq!((h.phase, h.http_status), (HookPhase::Succeeded, Some(204)));
    assert_eq!(reasons(&d), ["HookSucceeded"]);
    assert_eq!(d.hook_results[0].result, "succeeded");
}

#[test]
fn another_status_fails_the_hook_with_the_code_and_the_body() {
    let st = running_call();
    let c = answered(
        allowing(Case::new(url_pre(60), st, dep(NEW, true))),
        1,
        Answer::Failed(Failure {
            reason: webhook::reason::REJECTED,
            message: "the webhook answered 500".into(),
            status: Some(500),
            body: Some("database locked".into()),
        }),
    );
    let d = c.decide();
    let h = hook(&d, "notify");
    assert_eq!(
        (
            h.phase,
            h.http_status,
            h.reason.as_deref(),
            h.log_tail.as_deref()
        ),
        (
            HookPhase::Failed,
            Some(500),
            Some("WebhookRejected"),
            Some("database locked")
        )
    );
    assert_eq!(phase(&d), RolloutPhase::Failed);
    let warning = d.events.iter().find(|e| e.reason == "HookFailed").unwrap();
    assert!(
        warning.warning
            && warning.message.contains("500")
            && warning.message.contains("database locked")
    );
}

#[test]
fn a_retry_calls_again_with_the_next_attempts_key() {
    let spec = spec(
        "pre: [{name: notify, failurePolicy: Retry, retries: 1, webhook: {url: 'http://127.0.0.1:9/'}}]",
    );
    let mut e = entry("notify", HookPoint::Pre, HookPhase::Failed, 1);
    e.job_name = None;
    e.idempotency_key = Some(key(1));
    let c = allowing(Case::new(
        spec.clone(),
        status(RolloutPhase::PreHook, vec![e]),
        dep(NEW, true),
    ))
    .at(100);
    let d = c.decide();
    let h = hook(&d, "notify");
    assert_eq!(
        (h.phase, h.attempt, h.idempotency_key.clone()),
        (HookPhase::Running, 2, Some(key(2)))
    );
    assert!(d.effects.is_empty());
    let d = allowing(Case::new(spec, d.status, dep(NEW, true)))
        .at(100)
        .decide();
    assert_eq!(d.effects, [start_call(2)]);
}

#[test]
fn a_host_not_allowed_fails_the_hook_without_a_call() {
    let st = started(&Case::new(
        url_pre(60),
        status(RolloutPhase::PreHook, vec![]),
        dep(NEW, true),
    ));
    let d = Case::new(url_pre(60), st, dep(NEW, true)).decide();
    assert!(d.effects.is_empty(), "no call: {:?}", d.effects);
    let h = hook(&d, "notify");
    assert_eq!(
        (h.phase, h.reason.as_deref()),
        (HookPhase::Failed, Some("WebhookHostNotAllowed"))
    );
    assert!(h.message.as_deref().unwrap().contains("127.0.0.1"));
}

fn accepted(timeout: i32) -> RolloutStrategyStatus {
    let st = started(&allowing(Case::new(
        url_pre(timeout),
        status(RolloutPhase::PreHook, vec![]),
        dep(NEW, true),
    )));
    let d = answered(
        allowing(Case::new(url_pre(timeout), st, dep(NEW, true))),
        1,
        Answer::Accepted,
    )
    .decide();
    let h = hook(&d, "notify");
    assert_eq!((h.phase, h.http_status), (HookPhase::Waiting, Some(202)));
    assert_eq!(reasons(&d), ["HookAccepted"]);
    let d = allowing(Case::new(url_pre(timeout), d.status, dep(NEW, true))).decide();
    assert_eq!(phase(&d), RolloutPhase::WaitingExternal);
    assert!(
        d.status
            .message
            .as_deref()
            .unwrap()
            .contains(&format!("ballast.dev/approve={NEW}"))
    );
    assert!(d.requeue.is_some(), "the deadline wakes it");
    d.status
}

#[test]
fn a_202_waits_for_approval_then_passes() {
    let st = accepted(60);
    let mut c = allowing(Case::new(url_pre(60), st, dep(NEW, true)));
    c.approve = Some(NEW);
    let d = c.decide();
    let h = hook(&d, "notify");
    assert_eq!(
        (h.phase, h.reason.as_deref()),
        (HookPhase::Succeeded, Some("Approved"))
    );
    assert_eq!(
        d.status
            .consumed_annotations
            .get("ballast.dev/approve")
            .map(String::as_str),
        Some(NEW)
    );
    assert_ne!(phase(&d), RolloutPhase::WaitingExternal);
}

#[test]
fn a_202_then_abort_fails_the_revision() {
    let st = accepted(60);
    let mut c = allowing(Case::new(url_pre(60), st, dep(NEW, true)));
    c.abort = Some(NEW);
    let d = c.decide();
    assert_eq!(hook(&d, "notify").reason.as_deref(), Some("Aborted"));
    assert_eq!(phase(&d), RolloutPhase::Failed);
}

#[test]
fn a_202_without_a_decision_fails_at_timeout_seconds_from_the_start() {
    // Started at 20: the deadline is 20 + 30.
    let st = accepted(30);
    let d = allowing(Case::new(url_pre(30), st.clone(), dep(NEW, true)))
        .at(49)
        .decide();
    assert_eq!(phase(&d), RolloutPhase::WaitingExternal);
    let d = allowing(Case::new(url_pre(30), st, dep(NEW, true)))
        .at(50)
        .decide();
    let h = hook(&d, "notify");
    assert_eq!(
        (h.phase, h.reason.as_deref()),
        (HookPhase::Failed, Some(WEBHOOK_DECISION_TIMEOUT))
    );
    assert_eq!(phase(&d), RolloutPhase::Failed);
}

// ---- a new revision while a call is under way ----

#[test]
fn a_template_change_lets_the_call_under_way_finish_and_records_its_answer() {
    let st = running_call();
    // In flight: followed, the newer revision held and not started.
    let mut c = allowing(Case::new(url_pre(60), st.clone(), dep(NEWER, true)));
    c.webhooks.calls.insert(key(1), CallState::InFlight);
    let d = c.decide();
    assert!(d.effects.is_empty(), "no second call: {d:?}");
    assert_eq!(d.status.current_revision.as_deref(), Some(NEW));
    assert_eq!(hook(&d, "notify").phase, HookPhase::Running);
    // Unpaused behind our back meanwhile: paused again until the call ends.
    let mut c = allowing(Case::new(url_pre(60), st.clone(), dep(NEWER, false)));
    c.webhooks.calls.insert(key(1), CallState::InFlight);
    assert_eq!(c.decide().effects, [Effect::Pause]);
    // Answered: the answer is recorded for the old revision, then the newer one starts.
    let d = answered(
        allowing(Case::new(url_pre(60), st, dep(NEWER, true))),
        1,
        Answer::Passed { status: 200 },
    )
    .decide();
    let h = hook(&d, "notify");
    assert_eq!(
        (h.phase, h.http_status, h.revision.as_str()),
        (HookPhase::Succeeded, Some(200), NEW)
    );
    let d = allowing(Case::new(url_pre(60), d.status, dep(NEWER, true))).decide();
    assert_eq!(d.status.current_revision.as_deref(), Some(NEWER));
    assert_eq!(phase(&d), RolloutPhase::PreHook);
}

#[test]
fn a_template_change_drops_a_call_made_before_a_restart_and_a_pending_decision() {
    let st = running_call();
    // This process never made the call: it is not sent again for the old revision.
    let d = allowing(Case::new(url_pre(60), st, dep(NEWER, true))).decide();
    assert!(
        !d.effects.contains(&start_call(1)),
        "no call for the old revision: {d:?}"
    );
    assert_eq!(d.status.current_revision.as_deref(), Some(NEWER));
    // A 202 waiting for the engine: the decision goes with its revision.
    let d = allowing(Case::new(url_pre(60), accepted(60), dep(NEWER, true))).decide();
    assert_eq!(d.status.current_revision.as_deref(), Some(NEWER));
    assert_eq!(phase(&d), RolloutPhase::PreHook);
}
