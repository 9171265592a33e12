//! Table tests of the RolloutStrategy state machine: every phase and failure path, decided
//! from hand-built observations.

use super::*;
use crate::api::rollout_strategy::ABORT_ANNOTATION;
use crate::api::{HookPhase, HookStatus};
use crate::controller::rollout_strategy::hooks;
use crate::controller::rollout_strategy::observe::{JobState, PodView, ReplicaSetView, Terminated};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::json;

const OLD: &str = "aaaaaaaaaa";
const NEW: &str = "bbbbbbbbbb";
const NEWER: &str = "cccccccccc";
const DEP_UID: &str = "dep-uid";

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
        uid: DEP_UID.into(),
        stalled: false,
        resource_version: "1".into(),
        generation: 2,
        observed_generation: 2,
        paused,
        replicas: 4,
        recreate: false,
        template: template().into(),
        template_json: json!({"rev": rev}).into(),
        revision: rev.into(),
        status_replicas: 4,
        updated_replicas: 4,
        ready_replicas: 4,
        available_replicas: 4,
        annotations: Default::default(),
        governed_label: false,
        phase_label: None,
        gate_shard: Some(crate::controller::rollout_strategy::gate::shard_of("web")),
        paused_by: paused.then(|| crate::k8s::ROLLOUT_STRATEGY_MANAGER.to_string()),
        replica_sets: vec![ReplicaSetView {
            name: format!("web-{rev}"),
            revision: rev.into(),
            replicas: 4,
            desired: 4,
            available: 4,
            created: Some(t(-1000)),
            template_json: Some(json!({"rev": rev})),
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
            desired: 4 - new + new.min(1),
            available: 4 - new,
            created: Some(t(-1000)),
            template_json: Some(json!({"rev": OLD})),
        },
        ReplicaSetView {
            name: "web-new".into(),
            revision: NEW.into(),
            replicas: new,
            desired: new,
            available: new,
            created: Some(t(-10)),
            template_json: Some(json!({"rev": NEW})),
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
        target_uid: Some(DEP_UID.into()),
        ..Default::default()
    }
}

fn entry(name: &str, point: HookPoint, phase: HookPhase, attempt: i32) -> HookStatus {
    HookStatus {
        name: name.into(),
        point,
        revision: NEW.into(),
        attempt,
        job_name: (phase != HookPhase::Waiting).then(|| hooks::job_name("web", name, NEW, attempt)),
        phase,
        start_time: Some(Time(t(0))),
        finish_time: matches!(phase, HookPhase::Succeeded | HookPhase::Failed).then(|| Time(t(10))),
        ..Default::default()
    }
}

fn ok(name: &str, point: HookPoint) -> HookStatus {
    entry(name, point, HookPhase::Succeeded, 1)
}

fn job(hook: &str, attempt: i32, state: JobState, pod: Option<PodView>) -> JobView {
    JobView {
        name: hooks::job_name("web", hook, NEW, attempt),
        target_uid: Some(DEP_UID.into()),
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
    abort: Option<&'a str>,
    governed_by: Option<&'a str>,
    live_pods: Vec<HookPod>,
    rejected: Option<Rejection>,
    now: i64,
    gate: Gate,
    target_marked: bool,
    target_shard_labelled: bool,
    webhooks: Webhooks,
}

impl<'a> Case<'a> {
    fn new(spec: RolloutStrategySpec, status: RolloutStrategyStatus, dep: DeploymentView) -> Self {
        Self {
            spec,
            status,
            dep: Some(dep),
            jobs: vec![],
            approve: None,
            retry: None,
            abort: None,
            governed_by: None,
            live_pods: vec![],
            rejected: None,
            now: 20,
            gate: Gate::PauseAtRest,
            target_marked: false,
            target_shard_labelled: true,
            webhooks: Webhooks {
                namespace: "shop".into(),
                uid: "uid-1".into(),
                ..Default::default()
            },
        }
    }

    /// With the revision gate (not paused at rest).
    fn admission(mut self) -> Self {
        self.gate = Gate::Admission;
        self
    }

    fn jobs(mut self, jobs: Vec<JobView>) -> Self {
        self.jobs = jobs;
        self
    }

    fn at(mut self, now: i64) -> Self {
        self.now = now;
        self
    }

    /// The decision, without the annotations and labels (tested on their own).
    fn decide(&self) -> Decision {
        let mut d = self.decide_all();
        d.effects
            .retain(|e| !matches!(e, Effect::Annotate(_) | Effect::MarkTarget(_)));
        d
    }

    fn decide_all(&self) -> Decision {
        decide(&self.input())
    }

    /// The machine's input for this case.
    fn input(&self) -> Input<'_> {
        Input {
            name: "web",
            generation: Some(1),
            spec: &self.spec,
            status: &self.status,
            approve: self.approve,
            retry: self.retry,
            abort: self.abort,
            deployment: self.dep.as_ref(),
            jobs: &self.jobs,
            now: t(self.now),
            governed_by: self.governed_by,
            live_pods: &self.live_pods,
            rejected: self.rejected.as_ref(),
            gate: self.gate,
            target_marked: self.target_marked,
            target_shard_labelled: self.target_shard_labelled,
            webhooks: &self.webhooks,
        }
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
    let s =
        spec("pre: [{name: migrate, failurePolicy: Retry, retries: 2, container: {from: app}}]");
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
    let rolling = d.status;
    // Whoever paused it (the gate, or a manifest that says `paused: true`), it is let go.
    let mut manifest = rolling_dep(0, true);
    manifest.paused_by = Some("kubectl-client-side-apply".into());
    for dep in [rolling_dep(0, true), manifest.clone()] {
        let d = Case::new(full(), rolling.clone(), dep).decide();
        assert_eq!(d.effects, [Effect::Unpause]);
        assert_eq!(d.status.released_revision.as_deref(), Some(NEW));
        assert_eq!(d.status.paused_by, None);
    }
    // The cache has not seen that unpause yet (the generation recorded with it): wait, and do
    // not take the pause let go for someone's new one.
    let mut released = Case::new(full(), rolling, manifest.clone()).decide().status;
    released.deployment_generation = Some(manifest.generation);
    let d = Case::new(full(), released, manifest).decide();
    assert!(d.effects.is_empty(), "{:?}", d.effects);
    assert_eq!(d.status.paused_by, None);
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
fn a_mid_point_pauses_when_scaled_to_and_runs_once_those_pods_are_available() {
    let s = spec("mid: [{name: smoke, at: 50%, container: {from: app}}]");
    // The Deployment controller has scaled the new ReplicaSet to 2 of 4; none available yet.
    let mut scaled = rolling_dep(0, false);
    scaled.replica_sets[1].desired = 2;
    let d = Case::new(
        s.clone(),
        status(RolloutPhase::Rolling, vec![]),
        scaled.clone(),
    )
    .decide();
    assert_eq!(
        d.effects,
        [Effect::Pause],
        "paused before it goes past the point"
    );
    assert_eq!(phase(&d), RolloutPhase::MidHook);
    // Paused, the pods of the step come up: the hook waits for them, and stays paused.
    scaled.paused = true;
    scaled.replica_sets[1].replicas = 2;
    scaled.replica_sets[1].available = 1;
    let st = d.status;
    let d = Case::new(s.clone(), st.clone(), scaled.clone()).decide();
    assert!(d.effects.is_empty(), "{:?}", d.effects);
    assert_eq!(phase(&d), RolloutPhase::MidHook);
    assert!(d.status.hooks.is_empty());
    assert!(d.requeue.is_some(), "the progress deadline is a timer");
    scaled.replica_sets[1].available = 2;
    let d = Case::new(s.clone(), d.status.clone(), scaled.clone()).decide();
    assert_eq!(hook(&d, "smoke").phase, HookPhase::Pending);
    assert!(!reasons(&d).contains(&"MidPointPassed"));
    // One surge step took the ReplicaSet past the point before the pause: said so.
    scaled.replica_sets[1].desired = 3;
    scaled.replica_sets[1].available = 3;
    let st = status(RolloutPhase::MidHook, vec![]);
    let d = Case::new(s, st, scaled).decide();
    assert_eq!(hook(&d, "smoke").phase, HookPhase::Pending);
    assert!(reasons(&d).contains(&"MidPointPassed"), "{:?}", reasons(&d));
}

#[test]
fn the_pause_for_a_mid_hook_is_not_undone_before_the_deployment_controller_sees_it() {
    // Pausing bumps the generation: until it is observed, the status is stale.
    let st = status(RolloutPhase::MidHook, vec![ok("migrate", HookPoint::Pre)]);
    let mut unseen = rolling_dep(2, true);
    unseen.generation = 3;
    unseen.replica_sets[1].available = 0;
    let d = Case::new(full(), st.clone(), unseen).decide();
    assert!(d.effects.is_empty(), "no unpause: {:?}", d.effects);
    assert_eq!(phase(&d), RolloutPhase::MidHook);
    assert!(d.requeue.is_some());
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
    assert!(d.effects.is_empty(), "the approval is recorded first");
    assert_eq!(hook(&d, "go-live").phase, HookPhase::Succeeded);
    assert_eq!(phase(&d), RolloutPhase::MidHook);
    assert_eq!(
        d.status
            .consumed_annotations
            .get(APPROVE_ANNOTATION)
            .map(String::as_str),
        Some(NEW)
    );
    // Next round (also after a crash between the two writes): the annotation goes, and nothing
    // else is decided, so it cannot approve another gate.
    let approved = d.status;
    let mut c = Case::new(s.clone(), approved.clone(), rolling_dep(1, true));
    c.approve = Some(NEW);
    let d = c.decide();
    assert_eq!(d.effects, [Effect::RemoveAnnotation(APPROVE_ANNOTATION)]);
    assert!(d.status.consumed_annotations.is_empty());
    assert_eq!(hook(&d, "go-live").phase, HookPhase::Succeeded);
    // Removed, but the record of it lost by a crash: the record is simply dropped.
    let d = Case::new(s, approved, rolling_dep(1, true)).decide();
    assert!(d.effects.is_empty());
    assert!(d.status.consumed_annotations.is_empty());
}

#[test]
fn an_approval_is_never_lost_nor_spent_twice_whatever_write_is_lost() {
    // Two gates of one revision at the same point: each needs its own approval.
    let s = spec("mid: [{name: one, at: 1, approval: {}}, {name: two, at: 1, approval: {}}]");
    let mut st = status(RolloutPhase::MidHook, vec![]);
    let mut annotation = Some(NEW);
    let mut rounds = 0;
    // The annotation stays until a RemoveAnnotation effect is performed; the status of each
    // round is written after its effects, as the reconciler does.
    while rounds < 10 {
        rounds += 1;
        let mut c = Case::new(s.clone(), st.clone(), rolling_dep(1, true));
        c.approve = annotation;
        let d = c.decide();
        if d.effects
            .contains(&Effect::RemoveAnnotation(APPROVE_ANNOTATION))
        {
            annotation = None;
        }
        st = d.status;
        if hook_status(&st, "one").phase == HookPhase::Succeeded && annotation.is_none() {
            break;
        }
    }
    assert_eq!(hook_status(&st, "one").phase, HookPhase::Succeeded);
    let d = Case::new(s.clone(), st.clone(), rolling_dep(1, true)).decide();
    assert_eq!(
        hook(&d, "two").phase,
        HookPhase::Waiting,
        "one approval, one gate"
    );
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
    assert!(d.effects.is_empty(), "the retry is recorded first");
    assert_eq!(phase(&d), RolloutPhase::PreHook);
    assert_eq!(d.status.attempt_offset, 1);
    let mut c2 = Case::new(c.spec.clone(), d.status, dep(NEW, true));
    c2.retry = Some(NEW);
    let d = c2.decide();
    assert_eq!(d.effects, [Effect::RemoveAnnotation(RETRY_ANNOTATION)]);
    let d = Case::new(c.spec.clone(), d.status, dep(NEW, true)).decide();
    assert_eq!(hook(&d, "migrate").attempt, 2);
}

#[test]
fn a_hook_renamed_while_it_runs_is_cancelled_and_runs_once_under_its_new_name() {
    let st = status(
        RolloutPhase::PreHook,
        vec![entry("migrate", HookPoint::Pre, HookPhase::Running, 1)],
    );
    let renamed = spec("pre: [{name: migrate-db, container: {from: app}}]");
    let running = job("migrate", 1, JobState::Active, running_pod(5));
    let d = Case::new(renamed.clone(), st, dep(NEW, true))
        .jobs(vec![running.clone()])
        .decide();
    assert_eq!(d.effects, [Effect::DeleteJob(running.name.clone())]);
    let old = hook(&d, "migrate");
    assert_eq!(old.phase, HookPhase::Failed);
    assert_eq!(old.reason.as_deref(), Some(CANCELLED));
    assert_eq!(reasons(&d), ["HookCancelled"]);
    // The Job gone, the hook runs under its new name; the old entry no longer shows running.
    let d = Case::new(renamed, d.status, dep(NEW, true)).decide();
    assert_eq!(hook(&d, "migrate-db").phase, HookPhase::Pending);
    assert_eq!(hook(&d, "migrate-db").attempt, 1);
    // Renamed back before the revision ends: a fresh attempt, not a failure of the revision.
    let mut back = d.status.clone();
    back.hooks.retain(|e| e.name == "migrate");
    let d = Case::new(
        spec("pre: [{name: migrate, container: {from: app}}]"),
        back,
        dep(NEW, true),
    )
    .decide();
    assert_eq!(hook(&d, "migrate").phase, HookPhase::Pending);
    assert_eq!(hook(&d, "migrate").attempt, 2);
    assert_ne!(phase(&d), RolloutPhase::Failed);
}

// ---- abort and approval deadlines ----

/// A revision NEW waiting at approval gate `go-live` (reached at t(0)), with `gate` as its
/// `approval:` and the Deployment paused at the point.
fn waiting_at_gate(gate: &str) -> (RolloutStrategySpec, RolloutStrategyStatus) {
    let s = spec(&format!(
        "mid: [{{name: go-live, at: 1, approval: {gate}}}]"
    ));
    let mut c = Case::new(
        s.clone(),
        status(RolloutPhase::MidHook, vec![]),
        rolling_dep(1, true),
    );
    c.now = 0;
    let d = c.decide();
    assert_eq!(phase(&d), RolloutPhase::WaitingApproval);
    (s, d.status)
}

/// Performs rounds of decisions as the reconciler would (effects, then status) with
/// annotation `key` present until removed, on `dep`; returns the status once nothing changes.
fn settle(
    s: &RolloutStrategySpec,
    mut st: RolloutStrategyStatus,
    dep: DeploymentView,
    abort: Option<&str>,
    now: i64,
) -> (RolloutStrategyStatus, Vec<Effect>, Vec<&'static str>) {
    let mut annotation = abort.map(str::to_string);
    let mut effects = vec![];
    let mut events = vec![];
    for _ in 0..10 {
        let mut c = Case::new(s.clone(), st.clone(), dep.clone()).at(now);
        c.abort = annotation.as_deref();
        let d = c.decide();
        if d.effects
            .contains(&Effect::RemoveAnnotation(ABORT_ANNOTATION))
        {
            annotation = None;
        }
        let done = !d.changes(&st);
        effects.extend(d.effects.clone());
        events.extend(reasons(&d));
        st = d.status;
        if done {
            break;
        }
    }
    (st, effects, events)
}

#[test]
fn abort_fails_the_waiting_revision_and_rolls_it_back() {
    let (s, waiting) = waiting_at_gate("{}");
    let mut c = Case::new(s.clone(), waiting.clone(), rolling_dep(1, true));
    c.abort = Some(NEW);
    let d = c.decide();
    assert!(d.effects.is_empty(), "the abort is recorded first");
    assert_eq!(phase(&d), RolloutPhase::Failed);
    assert_eq!(hook(&d, "go-live").phase, HookPhase::Failed);
    assert_eq!(hook(&d, "go-live").reason.as_deref(), Some(ABORTED));
    assert_eq!(
        d.status
            .consumed_annotations
            .get(ABORT_ANNOTATION)
            .map(String::as_str),
        Some(NEW)
    );
    assert!(
        d.status.message.as_deref().unwrap().contains("aborted"),
        "{:?}",
        d.status.message
    );
    assert_eq!(reasons(&d), ["RolloutFailed"]);
    // Next rounds: the annotation goes, then onFailure (Rollback) puts the stable template back.
    let (st, effects, events) = settle(&s, d.status, rolling_dep(1, true), Some(NEW), 20);
    assert_eq!(
        effects,
        [
            Effect::RemoveAnnotation(ABORT_ANNOTATION),
            Effect::RestoreTemplate
        ]
    );
    assert_eq!(events, ["RolledBack"]);
    assert_eq!(st.phase, Some(RolloutPhase::RolledBack));
}

#[test]
fn abort_with_halt_leaves_the_revision_paused_and_failed() {
    let (_, waiting) = waiting_at_gate("{}");
    let s = spec("onFailure: Halt\nmid: [{name: go-live, at: 1, approval: {}}]");
    let (st, effects, _) = settle(&s, waiting, rolling_dep(1, true), Some(NEW), 20);
    assert_eq!(effects, [Effect::RemoveAnnotation(ABORT_ANNOTATION)]);
    assert_eq!(st.phase, Some(RolloutPhase::Failed));
}

#[test]
fn abort_gives_up_the_running_hook_and_deletes_its_job() {
    let st = status(
        RolloutPhase::PreHook,
        vec![entry("migrate", HookPoint::Pre, HookPhase::Running, 1)],
    );
    let running = job("migrate", 1, JobState::Active, running_pod(5));
    let s = full();
    let mut c = Case::new(s.clone(), st, dep(NEW, true)).jobs(vec![running.clone()]);
    c.abort = Some(NEW);
    let d = c.decide();
    assert_eq!(phase(&d), RolloutPhase::Failed);
    assert_eq!(hook(&d, "migrate").reason.as_deref(), Some(ABORTED));
    c.status = d.status;
    let d = c.decide();
    assert_eq!(d.effects, [Effect::RemoveAnnotation(ABORT_ANNOTATION)]);
    c.status = d.status;
    c.abort = None;
    let d = c.decide();
    assert_eq!(
        d.effects,
        [Effect::DeleteJob(running.name.clone())],
        "the aborted hook's Job does not run on"
    );
}

#[test]
fn abort_of_another_revision_or_at_rest_is_refused_and_removed() {
    let (s, waiting) = waiting_at_gate("{}");
    let mut c = Case::new(s.clone(), waiting.clone(), rolling_dep(1, true));
    c.abort = Some(OLD);
    let d = c.decide();
    assert!(d.effects.is_empty());
    assert_eq!(phase(&d), RolloutPhase::WaitingApproval, "nothing aborted");
    assert_eq!(hook(&d, "go-live").phase, HookPhase::Waiting);
    assert_eq!(reasons(&d), ["AbortRefused"]);
    let msg = d.status.message.clone().unwrap();
    assert!(
        msg.contains(&format!("{ABORT_ANNOTATION}={OLD} refused")) && msg.contains(NEW),
        "{msg}"
    );
    let (st, effects, _) = settle(&s, d.status, rolling_dep(1, true), Some(OLD), 20);
    assert_eq!(effects, [Effect::RemoveAnnotation(ABORT_ANNOTATION)]);
    assert_eq!(st.phase, Some(RolloutPhase::WaitingApproval));

    // At rest there is nothing to abort.
    let mut done = status(RolloutPhase::Succeeded, vec![]);
    done.stable_revision = Some(NEW.into());
    done.stable_template = Some(json!({"rev": NEW}));
    let mut c = Case::new(full(), done, dep(NEW, false)).admission();
    c.abort = Some(NEW);
    let d = c.decide();
    assert_eq!(phase(&d), RolloutPhase::Succeeded);
    assert_eq!(reasons(&d), ["AbortRefused"]);
    assert!(
        d.status
            .message
            .as_deref()
            .unwrap()
            .contains("not under way (phase Succeeded)")
    );
}

#[test]
fn an_approval_gate_with_a_timeout_records_its_deadline_and_wakes_for_it() {
    let (s, waiting) = waiting_at_gate("{timeoutSeconds: 30}");
    let gate = hook_status(&waiting, "go-live");
    assert_eq!(gate.deadline, Some(Time(t(30))));
    assert!(
        waiting.message.as_deref().unwrap().contains("then aborted"),
        "{:?}",
        waiting.message
    );
    let d = Case::new(s, waiting.clone(), rolling_dep(1, true))
        .at(20)
        .decide();
    assert!(quiet(&d, &waiting));
    let requeue = d.requeue.expect("woken for the deadline").as_secs_f64();
    assert!((10.0..=11.0).contains(&requeue), "{requeue}");
}

#[test]
fn an_approval_gate_that_times_out_aborts_the_revision() {
    let (s, waiting) = waiting_at_gate("{timeoutSeconds: 30, onTimeout: Abort}");
    let d = Case::new(s.clone(), waiting, rolling_dep(1, true))
        .at(30)
        .decide();
    assert_eq!(phase(&d), RolloutPhase::Failed);
    let gate = hook(&d, "go-live");
    assert_eq!(gate.phase, HookPhase::Failed);
    assert_eq!(gate.reason.as_deref(), Some(APPROVAL_TIMEOUT));
    assert_eq!(reasons(&d), ["HookFailed", "RolloutFailed"]);
    let d = Case::new(s, d.status, rolling_dep(1, true)).at(31).decide();
    assert_eq!(d.effects, [Effect::RestoreTemplate]);
    assert_eq!(phase(&d), RolloutPhase::RolledBack);
}

#[test]
fn an_approval_gate_that_times_out_with_approve_opens() {
    let (s, waiting) = waiting_at_gate("{timeoutSeconds: 30, onTimeout: Approve}");
    assert!(
        waiting
            .message
            .as_deref()
            .unwrap()
            .contains("then approved")
    );
    let d = Case::new(s.clone(), waiting, rolling_dep(1, true))
        .at(31)
        .decide();
    let gate = hook(&d, "go-live");
    assert_eq!(gate.phase, HookPhase::Succeeded);
    assert_eq!(gate.reason.as_deref(), Some(APPROVAL_TIMEOUT));
    assert_eq!(phase(&d), RolloutPhase::MidHook);
    assert!(
        d.status.consumed_annotations.is_empty(),
        "no annotation used"
    );
    let d = Case::new(s.clone(), d.status, rolling_dep(1, true))
        .at(32)
        .decide();
    assert_eq!(phase(&d), RolloutPhase::Rolling);
    let d = Case::new(s, d.status, rolling_dep(1, true)).at(33).decide();
    assert_eq!(d.effects, [Effect::Unpause], "the rollout goes on");
}

#[test]
fn an_approval_before_the_deadline_wins_and_a_longer_timeout_moves_it() {
    let (s, waiting) = waiting_at_gate("{timeoutSeconds: 30}");
    let mut c = Case::new(s, waiting.clone(), rolling_dep(1, true)).at(29);
    c.approve = Some(NEW);
    let d = c.decide();
    assert_eq!(hook(&d, "go-live").reason.as_deref(), Some(APPROVED));
    // The timeout raised while it waits: the deadline follows the spec.
    let longer = spec("mid: [{name: go-live, at: 1, approval: {timeoutSeconds: 90}}]");
    let d = Case::new(longer, waiting, rolling_dep(1, true))
        .at(40)
        .decide();
    assert_eq!(phase(&d), RolloutPhase::WaitingApproval);
    assert_eq!(hook(&d, "go-live").deadline, Some(Time(t(90))));
}

#[test]
fn status_says_desired_and_ready_replicas_like_kubectl() {
    let mut d = rolling_dep(1, true);
    d.ready_replicas = 3;
    let st = Case::new(full(), status(RolloutPhase::Rolling, vec![]), d)
        .decide()
        .status;
    assert_eq!(st.desired_replicas, Some(4));
    assert_eq!(st.ready.as_deref(), Some("3/4"));
}

// ---- a new revision mid-sequence ----

#[test]
fn a_template_change_lets_the_running_hook_finish_first() {
    let st = status(
        RolloutPhase::PreHook,
        vec![entry("migrate", HookPoint::Pre, HookPhase::Running, 1)],
    );
    let mut newer = dep(NEWER, true);
    newer.template = template().into();
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
fn a_scale_during_a_recreate_mid_hook_is_restored_after_it_and_no_pod_comes_back_meanwhile() {
    let s = spec("mid: [{name: schema, at: 1, container: {from: app}}]");
    let mut st = status(
        RolloutPhase::MidHook,
        vec![entry("schema", HookPoint::Mid, HookPhase::Running, 1)],
    );
    st.original_replicas = Some(4);
    let mut scaled = dep(NEW, true);
    scaled.recreate = true;
    scaled.replicas = 5;
    let d = Case::new(s.clone(), st, scaled.clone())
        .jobs(vec![job("schema", 1, JobState::Active, running_pod(5))])
        .decide();
    assert_eq!(
        d.effects,
        [Effect::Scale(0)],
        "back to 0 while the hook runs"
    );
    assert_eq!(
        d.status.original_replicas,
        Some(5),
        "the user's count is the one to restore"
    );
    // Scaled back to the count set aside: still the user's, still 0 while the hook runs.
    let mut st = d.status;
    st.original_replicas = Some(4);
    scaled.replicas = 4;
    let d = Case::new(s, st, scaled).decide();
    assert_eq!(d.effects, [Effect::Scale(0)]);
    assert_eq!(d.status.original_replicas, Some(4));
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

// ---- hardening: nothing wedges, nothing is lost ----

#[test]
fn a_deployment_created_again_under_the_same_name_is_adopted_afresh() {
    let mut st = status(RolloutPhase::Succeeded, vec![ok("migrate", HookPoint::Pre)]);
    st.stable_revision = Some(NEW.into());
    st.original_replicas = Some(4);
    let mut again = dep(OLD, false);
    again.uid = "another-uid".into();
    let d = Case::new(full(), st, again).decide();
    assert_eq!(d.status.target_uid.as_deref(), Some("another-uid"));
    assert_eq!(d.status.stable_revision.as_deref(), Some(OLD));
    assert_eq!(d.status.stable_template, Some(json!({"rev": OLD})));
    assert_eq!(d.status.original_replicas, None, "nothing of the old one");
    assert!(d.status.hooks.is_empty());
    assert!(!d.effects.contains(&Effect::RestoreTemplate));
    assert_eq!(reasons(&d), ["TargetReplaced"]);
}

#[test]
fn jobs_of_a_deleted_deployment_of_the_same_name_are_neither_adopted_nor_kept() {
    let mut fresh = dep(NEW, true);
    fresh.uid = "another-uid".into();
    fresh.replica_sets.clear();
    let old_job = job("migrate", 1, JobState::Active, running_pod(0));
    let first = Case::new(full(), Default::default(), fresh.clone())
        .jobs(vec![old_job.clone()])
        .decide();
    assert_eq!(phase(&first), RolloutPhase::PreHook);
    let d = Case::new(full(), first.status.clone(), fresh)
        .jobs(vec![old_job.clone()])
        .decide();
    assert_eq!(d.effects, [Effect::DeleteJob(old_job.name)]);
}

#[test]
fn a_strategy_created_during_a_rollout_lets_it_finish_first() {
    let c = Case::new(full(), Default::default(), rolling_dep(2, false));
    let d = c.decide();
    assert!(
        d.effects.is_empty(),
        "no pause mid-rollout: {:?}",
        d.effects
    );
    assert_eq!(phase(&d), RolloutPhase::Idle);
    assert_eq!(d.status.stable_revision, None);
    assert!(
        d.status.message.as_deref().unwrap().contains("to complete"),
        "{:?}",
        d.status.message
    );
    // Once it completes, it is adopted (and paused at rest).
    let d = Case::new(full(), d.status.clone(), dep(NEW, false)).decide();
    assert_eq!(d.effects, [Effect::Pause]);
    assert_eq!(d.status.stable_revision.as_deref(), Some(NEW));
}

#[test]
fn a_rollout_that_missed_its_deadline_is_adopted_without_waiting() {
    let mut stuck = rolling_dep(2, false);
    stuck.stalled = true;
    let d = Case::new(full(), Default::default(), stuck).decide();
    assert_eq!(d.effects, [Effect::Pause]);
    assert_eq!(d.status.stable_revision.as_deref(), Some(NEW));
}

#[test]
fn a_running_pre_hook_survives_a_lost_status() {
    let mut pending = dep(OLD, true);
    pending.revision = NEW.into();
    let running = job("migrate", 1, JobState::Active, running_pod(5));
    let c = Case::new(full(), Default::default(), pending.clone()).jobs(vec![running.clone()]);
    let first = c.decide();
    assert!(first.effects.is_empty(), "{:?}", first.effects);
    let mut st = first.status;
    for _ in 0..3 {
        let d = Case::new(full(), st.clone(), pending.clone())
            .jobs(vec![running.clone()])
            .decide();
        assert!(
            d.effects.is_empty(),
            "adopted, not replaced: {:?}",
            d.effects
        );
        st = d.status;
    }
    let e = hook_status(&st, "migrate");
    assert_eq!(e.attempt, 1);
    assert_eq!(e.job_name, Some(hooks::job_name("web", "migrate", NEW, 1)));
}

#[test]
fn a_hook_that_succeeded_before_the_status_was_lost_is_not_run_again() {
    let mut pending = dep(OLD, true);
    pending.revision = NEW.into();
    let done = job(
        "migrate",
        1,
        JobState::Succeeded {
            finished: Some(t(5)),
        },
        None,
    );
    let mut st = Case::new(full(), Default::default(), pending.clone())
        .jobs(vec![done.clone()])
        .decide()
        .status;
    for _ in 0..3 {
        let d = Case::new(full(), st.clone(), pending.clone())
            .jobs(vec![done.clone()])
            .decide();
        assert!(
            !d.effects
                .iter()
                .any(|e| matches!(e, Effect::CreateJob { .. })),
            "{:?}",
            d.effects
        );
        st = d.status;
    }
    assert_eq!(hook_status(&st, "migrate").phase, HookPhase::Succeeded);
    assert_eq!(st.phase, Some(RolloutPhase::Rolling));
}

fn hook_status<'a>(st: &'a RolloutStrategyStatus, name: &str) -> &'a HookStatus {
    st.hooks.iter().find(|h| h.name == name).unwrap()
}

#[test]
fn a_rollout_of_ours_whose_status_was_lost_resumes_and_adopts_its_mid_hook() {
    let smoke = job("smoke", 1, JobState::Active, running_pod(5));
    let first = Case::new(full(), Default::default(), rolling_dep(2, true))
        .jobs(vec![smoke.clone()])
        .decide();
    assert_eq!(phase(&first), RolloutPhase::Rolling);
    assert_eq!(first.status.stable_revision.as_deref(), Some(OLD));
    // Rolling → the mid point (2 of 4) is reached: MidHook, which adopts the running Job.
    let mut st = first.status;
    let mut created = vec![];
    let mut paused = true;
    for _ in 0..5 {
        let d = Case::new(full(), st.clone(), rolling_dep(2, paused))
            .jobs(vec![smoke.clone()])
            .decide();
        for e in &d.effects {
            match e {
                Effect::Pause => paused = true,
                Effect::Unpause => paused = false,
                _ => {}
            }
        }
        created.extend(
            d.effects
                .iter()
                .filter(|e| matches!(e, Effect::CreateJob { .. }))
                .cloned(),
        );
        st = d.status;
    }
    assert!(created.is_empty(), "{created:?}");
    assert_eq!(st.phase, Some(RolloutPhase::MidHook));
    assert_eq!(hook_status(&st, "smoke").attempt, 1);
}

#[test]
fn a_hook_job_the_api_server_refuses_fails_the_hook_with_its_message() {
    let mut c = Case::new(
        full(),
        status(
            RolloutPhase::PreHook,
            vec![entry("migrate", HookPoint::Pre, HookPhase::Pending, 1)],
        ),
        dep(NEW, true),
    );
    c.status.hooks[0].job_name = None;
    let first = c.decide();
    let create = create("migrate", HookPoint::Pre, 1);
    assert_eq!(first.effects, std::slice::from_ref(&create));
    c.rejected = Some(Rejection {
        effect: create,
        code: 422,
        message:
            "Job.batch \"x\" is invalid: spec.template.spec.containers[0].image: Required value"
                .into(),
    });
    let d = c.decide();
    assert!(d.effects.is_empty());
    let e = hook(&d, "migrate");
    assert_eq!(e.phase, HookPhase::Failed);
    assert_eq!(e.reason.as_deref(), Some("JobRejected"));
    assert!(
        e.message
            .as_deref()
            .unwrap()
            .contains("image: Required value")
    );
    assert_eq!(phase(&d), RolloutPhase::Failed);
    assert!(reasons(&d).contains(&"HookFailed"));
}

#[test]
fn a_refused_deployment_write_fails_the_revision_instead_of_retrying_forever() {
    let mut c = Case::new(
        full(),
        status(RolloutPhase::PreHook, vec![]),
        dep(NEW, false),
    );
    let first = c.decide();
    assert_eq!(first.effects, [Effect::Pause]);
    c.rejected = Some(Rejection {
        effect: Effect::Pause,
        code: 403,
        message: "denied by policy".into(),
    });
    let d = c.decide();
    assert!(d.effects.is_empty());
    assert_eq!(phase(&d), RolloutPhase::Failed);
    assert!(
        d.status
            .message
            .as_deref()
            .unwrap()
            .contains("denied by policy")
    );
    // At rest, a refusal is recorded once.
    let mut rest = Case::new(
        full(),
        {
            let mut st = status(RolloutPhase::Succeeded, vec![]);
            st.stable_revision = Some(NEW.into());
            st
        },
        dep(NEW, false),
    );
    rest.rejected = Some(Rejection {
        effect: Effect::Pause,
        code: 403,
        message: "denied by policy".into(),
    });
    let d = rest.decide();
    assert!(d.effects.is_empty());
    assert_eq!(reasons(&d), ["WriteRejected"]);
    rest.status = d.status.clone();
    assert!(rest.decide().events.is_empty(), "no second Event");
}

#[test]
fn a_new_attempt_waits_until_the_previous_attempts_pod_is_gone() {
    let spec = spec(
        "pre: [{name: migrate, container: {from: app}, failurePolicy: Retry, retries: 2, pendingTimeoutSeconds: 60}]",
    );
    let mut e = entry("migrate", HookPoint::Pre, HookPhase::Pending, 2);
    e.job_name = None;
    e.start_time = Some(Time(t(20)));
    let mut c = Case::new(spec, status(RolloutPhase::PreHook, vec![e]), dep(NEW, true)).at(30);
    c.live_pods = vec![HookPod {
        name: "web-migrate-1-xyz".into(),
        job: hooks::job_name("web", "migrate", NEW, 1),
    }];
    let d = c.decide();
    assert!(d.effects.is_empty(), "{:?}", d.effects);
    assert!(d.status.message.as_deref().unwrap().contains("terminating"));
    // The wait is bounded by the pending timeout.
    c.now = 90;
    let d = c.decide();
    assert_eq!(hook(&d, "migrate").phase, HookPhase::Failed);
    // Once the pod is gone, attempt 2 starts.
    c.live_pods.clear();
    c.now = 31;
    let d = c.decide();
    assert_eq!(d.effects, [create("migrate", HookPoint::Pre, 2)]);
}

#[test]
fn a_hook_renamed_while_it_runs_is_stopped_before_the_new_name_runs() {
    let renamed = spec("pre: [{name: migrate2, container: {from: app}}]");
    let st = status(
        RolloutPhase::PreHook,
        vec![entry("migrate", HookPoint::Pre, HookPhase::Running, 1)],
    );
    let old = job("migrate", 1, JobState::Active, running_pod(5));
    let d = Case::new(renamed.clone(), st.clone(), dep(NEW, true))
        .jobs(vec![old.clone()])
        .decide();
    assert_eq!(d.effects, [Effect::DeleteJob(old.name.clone())]);
    let mut c = Case::new(renamed, st, dep(NEW, true));
    c.live_pods = vec![HookPod {
        name: "p".into(),
        job: old.name.clone(),
    }];
    let d = c.decide();
    assert!(
        !d.effects
            .iter()
            .any(|e| matches!(e, Effect::CreateJob { .. })),
        "never two pods of one hook: {:?}",
        d.effects
    );
}

// ---- the revision gate (admission): not paused at rest ----

fn at_rest(rev: &str) -> RolloutStrategyStatus {
    let mut st = status(RolloutPhase::Succeeded, vec![]);
    st.stable_revision = Some(rev.into());
    st.stable_template = Some(json!({"rev": rev}));
    st.current_revision = Some(rev.into());
    st
}

#[test]
fn with_the_gate_adoption_leaves_the_deployment_unpaused() {
    let d = Case::new(full(), Default::default(), dep(OLD, false))
        .admission()
        .decide();
    assert!(d.effects.is_empty(), "{:?}", d.effects);
    assert_eq!(phase(&d), RolloutPhase::Idle);
    assert_eq!(d.status.gate, Some(Gate::Admission));
    assert_eq!(d.status.stable_revision.as_deref(), Some(OLD));
}

#[test]
fn with_the_gate_a_deployment_ballast_paused_at_rest_is_unpaused() {
    // Upgrading from pause-at-rest: ballast's own pause at rest goes; a revision never does.
    let d = Case::new(full(), at_rest(NEW), dep(NEW, true))
        .admission()
        .decide();
    assert_eq!(d.effects, [Effect::Unpause]);
    assert_eq!(phase(&d), RolloutPhase::Succeeded);
    // The same on adoption.
    let d = Case::new(full(), Default::default(), dep(OLD, true))
        .admission()
        .decide();
    assert_eq!(d.effects, [Effect::Unpause]);
    // A pending template is a revision: paused, hooked.
    let mut pending = dep(OLD, true);
    pending.revision = NEW.into();
    let d = Case::new(full(), at_rest(OLD), pending)
        .admission()
        .decide();
    assert!(d.effects.is_empty(), "{:?}", d.effects);
    assert_eq!(phase(&d), RolloutPhase::PreHook);
}

#[test]
fn with_the_gate_a_pause_by_someone_else_is_left_alone_and_said() {
    let mut paused = dep(NEW, true);
    paused.paused_by = Some("kubectl-rollout".into());
    let d = Case::new(full(), at_rest(NEW), paused).admission().decide();
    assert!(d.effects.is_empty(), "{:?}", d.effects);
    assert!(
        d.status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("paused by kubectl-rollout")),
        "{:?}",
        d.status.message
    );
    // In pause-at-rest mode ballast owns `paused` at rest anyway.
    let d = Case::new(full(), at_rest(NEW), dep(NEW, false)).decide();
    assert_eq!(d.effects, [Effect::Pause]);
}

#[test]
fn with_the_gate_a_new_revision_paused_by_admission_starts_its_pre_hooks() {
    let d = Case::new(full(), at_rest(OLD), dep(NEW, true))
        .admission()
        .decide();
    assert!(d.effects.is_empty());
    assert_eq!(phase(&d), RolloutPhase::PreHook);
    assert_eq!(reasons(&d), ["RolloutStarted"]);
}

#[test]
fn with_the_gate_a_revision_it_missed_is_paused_late_and_warned_about() {
    let d = Case::new(full(), at_rest(OLD), dep(NEW, false))
        .admission()
        .decide();
    assert_eq!(d.effects, [Effect::Pause]);
    assert_eq!(phase(&d), RolloutPhase::PreHook);
    assert_eq!(reasons(&d), ["RevisionNotGated", "RolloutStarted"]);
    // Without the gate that is just how a revision starts.
    let d = Case::new(full(), at_rest(OLD), dep(NEW, false)).decide();
    assert_eq!(reasons(&d), ["RolloutStarted"]);
}

#[test]
fn with_the_gate_a_revision_without_pre_hooks_is_never_paused_to_start() {
    // What the gate lets through (config/admission/revision_gate.yaml pauses only for a strategy
    // with pre hooks) rolls out at once: no pause, no RevisionNotGated, straight to Rolling.
    for hooks in [
        "mid: [{name: smoke, at: 50%, container: {from: app}}]",
        "post: [{name: purge, container: {from: app}}]",
        "",
    ] {
        let s = spec(hooks);
        let mut d = Case::new(s.clone(), at_rest(OLD), dep(NEW, false))
            .admission()
            .decide();
        assert!(d.effects.is_empty(), "{hooks}: {:?}", d.effects);
        assert_eq!(reasons(&d), ["RolloutStarted"], "{hooks}");
        // The next decision (on what was recorded) goes on rolling, still without a pause.
        for _ in 0..3 {
            if phase(&d) == RolloutPhase::Rolling {
                break;
            }
            d = Case::new(s.clone(), d.status.clone(), dep(NEW, false))
                .admission()
                .decide();
            assert!(
                !d.effects.contains(&Effect::Pause),
                "{hooks}: {:?}",
                d.effects
            );
        }
        assert_eq!(phase(&d), RolloutPhase::Rolling, "{hooks}");
    }
    // A superseded revision of such a strategy is not paused either; with pre hooks it is.
    let rolling = || status(RolloutPhase::Rolling, vec![]);
    let d = Case::new(
        spec("post: [{name: purge, container: {from: app}}]"),
        rolling(),
        dep("r3", false),
    )
    .admission()
    .decide();
    assert!(!d.effects.contains(&Effect::Pause), "{:?}", d.effects);
    let d = Case::new(full(), rolling(), dep("r3", false))
        .admission()
        .decide();
    assert_eq!(d.effects, [Effect::Pause]);
}

#[test]
fn a_recreate_deployments_revision_is_held_for_its_mid_hooks_as_for_pre_hooks() {
    // Recreate mid hooks run with no pod of either revision: unheld, the Deployment controller
    // would start the new pods as soon as the old ones are gone (the gate's CEL pauses it too).
    let s = spec("mid: [{name: schema, at: 1, container: {from: app}}]");
    let mut recreate = dep(NEW, false);
    recreate.recreate = true;
    // Missed by the gate: paused at once, and said.
    let d = Case::new(s.clone(), at_rest(OLD), recreate.clone())
        .admission()
        .decide();
    assert_eq!(d.effects, [Effect::Pause]);
    assert_eq!(reasons(&d), ["RevisionNotGated", "RolloutStarted"]);
    // Unpaused in PreHook (a `kubectl rollout resume`): paused again, not rolled.
    let d = Case::new(
        s.clone(),
        status(RolloutPhase::PreHook, vec![]),
        recreate.clone(),
    )
    .decide();
    assert_eq!(d.effects, [Effect::Pause]);
    // Superseded while rolling: held too.
    let mut newer = recreate;
    newer.revision = "r3".into();
    let d = Case::new(s.clone(), status(RolloutPhase::Rolling, vec![]), newer)
        .admission()
        .decide();
    assert_eq!(d.effects, [Effect::Pause]);
    // The same strategy on a rolling update is not held: its mid hook pauses at its point.
    let d = Case::new(s, at_rest(OLD), dep(NEW, false))
        .admission()
        .decide();
    assert!(d.effects.is_empty(), "{:?}", d.effects);
}

#[test]
fn with_the_gate_post_hooks_run_unpaused_and_the_revision_ends_unpaused() {
    let done = vec![ok("migrate", HookPoint::Pre), ok("smoke", HookPoint::Mid)];
    let d = Case::new(
        full(),
        status(RolloutPhase::Rolling, done.clone()),
        dep(NEW, false),
    )
    .admission()
    .decide();
    assert!(d.effects.is_empty(), "no pause: {:?}", d.effects);
    assert_eq!(phase(&d), RolloutPhase::PostHook);
    let d = Case::new(full(), d.status.clone(), dep(NEW, false))
        .admission()
        .decide();
    assert!(d.effects.is_empty(), "intent first: {:?}", d.effects);
    let d = Case::new(full(), d.status.clone(), dep(NEW, false))
        .admission()
        .decide();
    assert_eq!(d.effects, [create("purge", HookPoint::Post, 1)]);
    let mut all = done;
    all.push(ok("purge", HookPoint::Post));
    let d = Case::new(full(), status(RolloutPhase::PostHook, all), dep(NEW, false))
        .admission()
        .decide();
    assert_eq!(phase(&d), RolloutPhase::Succeeded);
    let rest = Case::new(full(), d.status.clone(), dep(NEW, false))
        .admission()
        .decide();
    assert!(quiet(&rest, &d.status), "{rest:?}");
}

#[test]
fn after_a_rollback_an_unobserved_status_or_a_users_pause_is_never_unpaused() {
    let mut rolled = status(RolloutPhase::RolledBack, vec![]);
    rolled.current_revision = Some(NEW.into());
    rolled.stable_revision = Some(OLD.into());
    // Back on the stable template, not complete yet, and paused by the gate a moment ago:
    // the Deployment controller has not seen that spec yet.
    let mut back = rolling_dep(1, true);
    back.revision = OLD.into();
    back.generation = 5;
    back.observed_generation = 4;
    for gate in [Gate::Admission, Gate::PauseAtRest] {
        let mut c = Case::new(full(), rolled.clone(), back.clone());
        c.gate = gate;
        assert!(c.decide().effects.is_empty(), "{gate:?}");
    }
    // Observed: let go, to finish the way back.
    let mut seen = back.clone();
    seen.observed_generation = 5;
    let d = Case::new(full(), rolled.clone(), seen.clone())
        .admission()
        .decide();
    assert_eq!(d.effects, [Effect::Unpause]);
    // Unless someone else paused it (`kubectl rollout pause`).
    seen.paused_by = Some("kubectl".into());
    let d = Case::new(full(), rolled, seen).admission().decide();
    assert!(d.effects.is_empty(), "{:?}", d.effects);
}

#[test]
fn a_users_pause_while_rolling_is_left_alone_and_not_counted_against_the_deadline() {
    let mut st = status(RolloutPhase::Rolling, vec![ok("migrate", HookPoint::Pre)]);
    st.phase_transition_time = Some(Time(t(0)));
    st.released_revision = Some(NEW.into());
    let mut held = rolling_dep(1, true);
    held.paused_by = Some("kubectl-rollout".into());
    for gate in [Gate::Admission, Gate::PauseAtRest] {
        let mut c = Case::new(full(), st.clone(), held.clone()).at(100_000);
        c.gate = gate;
        let d = c.decide();
        assert!(d.effects.is_empty(), "{gate:?}: {:?}", d.effects);
        assert_eq!(
            phase(&d),
            RolloutPhase::Rolling,
            "not failed past the deadline"
        );
        assert_eq!(d.status.paused_by.as_deref(), Some("kubectl-rollout"));
        assert!(
            d.status
                .message
                .as_deref()
                .unwrap()
                .contains("kubectl-rollout")
        );
        assert_eq!(d.requeue, None, "nothing to wait for but the resume");
    }
    // Resumed a day later: rolling again, the deadline counts from the resume.
    let paused = Case::new(full(), st, held).admission().at(100_000).decide();
    let d = Case::new(full(), paused.status, rolling_dep(1, false))
        .admission()
        .at(100_010)
        .decide();
    assert_eq!(phase(&d), RolloutPhase::Rolling);
    assert_eq!(d.status.paused_by, None);
    assert_eq!(d.status.phase_transition_time, Some(Time(t(100_010))));
}

#[test]
fn with_the_gate_a_rollback_lets_the_gates_pause_go_and_stays_unpaused() {
    let mut st = status(RolloutPhase::Failed, vec![]);
    st.message = Some("pre hook migrate failed".into());
    // The restored template is paused by the gate; the stable ReplicaSet needs no hooks.
    let mut back = rolling_dep(1, true);
    back.revision = OLD.into();
    let mut rolled = Case::new(full(), st, back.clone()).admission().decide();
    rolled.status.phase = Some(RolloutPhase::RolledBack);
    let d = Case::new(full(), rolled.status.clone(), back)
        .admission()
        .decide();
    assert_eq!(d.effects, [Effect::Unpause]);
    let d = Case::new(full(), rolled.status.clone(), dep(OLD, false))
        .admission()
        .decide();
    assert!(d.effects.is_empty(), "{:?}", d.effects);
}

#[test]
fn the_deployment_is_annotated_with_its_strategy_and_phase_and_labelled_governed() {
    let c = Case::new(full(), at_rest(OLD), dep(NEW, true));
    let d = c.decide_all();
    // Labelled, then marked, in that order (a failed label write stops before the mark).
    assert_eq!(
        d.effects,
        [
            Effect::Annotate(RolloutPhase::PreHook),
            Effect::MarkTarget(true)
        ]
    );
    let mut annotated = dep(NEW, true);
    annotated.annotations = [(STRATEGY_ANNOTATION.to_string(), "web".to_string())].into();
    annotated.phase_label = Some("PreHook".into());
    // Annotated but not labelled (`kubectl label ... ballast.dev/governed-` without the gate):
    // written again.
    let d = Case::new(full(), d.status.clone(), annotated.clone()).decide_all();
    assert!(
        d.effects.contains(&Effect::Annotate(RolloutPhase::PreHook)),
        "{:?}",
        d.effects
    );
    annotated.governed_label = true;
    let mut c = Case::new(full(), d.status.clone(), annotated);
    c.target_marked = true;
    let d = c.decide_all();
    assert!(
        !d.effects
            .iter()
            .any(|e| matches!(e, Effect::Annotate(_) | Effect::MarkTarget(_))),
        "{:?}",
        d.effects
    );
    // A strategy standing aside does not annotate.
    let mut c = Case::new(full(), Default::default(), dep(OLD, true));
    c.governed_by = Some("older");
    assert!(c.decide_all().effects.is_empty());
}

#[test]
fn a_deployment_and_its_strategy_are_kept_labelled_with_the_gate_shard() {
    use crate::controller::rollout_strategy::gate::shard_of;
    let mut labelled = dep(OLD, false);
    labelled.governed_label = true;
    labelled.phase_label = Some("Succeeded".into());
    labelled.annotations = [(STRATEGY_ANNOTATION.to_string(), "web".to_string())].into();
    let effects = |c: &Case| c.decide_all().effects;
    let mut c = Case::new(full(), at_rest(OLD), labelled.clone()).admission();
    c.target_marked = true;
    let settled = effects(&c);
    assert!(
        !settled
            .iter()
            .any(|e| matches!(e, Effect::Annotate(_) | Effect::MarkTarget(_))),
        "{settled:?}"
    );
    // The Deployment's shard missing (an earlier version) or not its own (edited by hand):
    // written again, as the other labels are.
    for shard in [None, Some(if shard_of("web") == "0" { "1" } else { "0" })] {
        let mut d = labelled.clone();
        d.gate_shard = shard.map(str::to_string);
        let mut c = Case::new(full(), at_rest(OLD), d).admission();
        c.target_marked = true;
        assert!(
            effects(&c).iter().any(|e| matches!(e, Effect::Annotate(_))),
            "{shard:?}"
        );
    }
    // The strategy marked but without its shard: marked again, which labels it.
    let mut c = Case::new(full(), at_rest(OLD), labelled.clone()).admission();
    c.target_marked = true;
    c.target_shard_labelled = false;
    assert_eq!(
        effects(&c)
            .into_iter()
            .filter(|e| matches!(e, Effect::MarkTarget(_)))
            .collect::<Vec<_>>(),
        [Effect::MarkTarget(true)]
    );
    // Not covered (its Deployment unlabelled, governed by an older strategy): the mark stays
    // off, whatever the shard.
    let mut c = Case::new(full(), Default::default(), dep(OLD, false));
    c.governed_by = Some("older");
    c.target_shard_labelled = false;
    assert!(
        !effects(&c)
            .iter()
            .any(|e| matches!(e, Effect::MarkTarget(_))),
    );
}

#[test]
fn the_strategy_is_marked_once_its_deployment_is_labelled_or_absent() {
    let mut labelled = dep(OLD, false);
    labelled.governed_label = true;
    let marks = |c: &Case| -> Vec<Effect> {
        c.decide_all()
            .effects
            .into_iter()
            .filter(|e| matches!(e, Effect::MarkTarget(_)))
            .collect()
    };
    // Labelled: marked, so the binding that sees every update may leave it out.
    let c = Case::new(full(), at_rest(OLD), labelled.clone()).admission();
    assert_eq!(marks(&c), [Effect::MarkTarget(true)]);
    // Not labelled: labelled and marked in one decision, the label first.
    let c = Case::new(full(), at_rest(OLD), dep(OLD, false)).admission();
    let d = c.decide_all();
    let annotate = d
        .effects
        .iter()
        .position(|e| matches!(e, Effect::Annotate(_)));
    let mark = d
        .effects
        .iter()
        .position(|e| *e == Effect::MarkTarget(true));
    assert!(annotate.is_some() && annotate < mark, "{:?}", d.effects);
    // Not labelled and governed by an older strategy (which will label it): not marked; a mark
    // left from before is removed.
    let mut c = Case::new(full(), Default::default(), dep(OLD, false));
    c.governed_by = Some("older");
    assert!(marks(&c).is_empty());
    c.target_marked = true;
    assert_eq!(marks(&c), [Effect::MarkTarget(false)]);
    // No Deployment: only a create can make one, which the gate covers anyway.
    let mut c = Case::new(full(), Default::default(), dep(OLD, false));
    c.dep = None;
    assert_eq!(marks(&c), [Effect::MarkTarget(true)]);
    c.target_marked = true;
    assert!(c.decide_all().effects.is_empty());
    // A strategy standing aside is marked too (the older one labels the Deployment).
    let mut c = Case::new(full(), Default::default(), labelled);
    c.governed_by = Some("older");
    assert_eq!(c.decide_all().effects, [Effect::MarkTarget(true)]);
}

#[test]
fn the_deployment_generation_is_recorded_once_its_revision_is_taken_up() {
    let mut changed = dep(NEW, true);
    changed.generation = 7;
    let mut st = at_rest(OLD);
    st.deployment_generation = Some(6);
    let d = Case::new(full(), st.clone(), changed.clone()).decide();
    assert_eq!(phase(&d), RolloutPhase::PreHook);
    assert_eq!(d.status.deployment_generation, Some(7));
    let ready = |d: &Decision| {
        d.status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .unwrap()
            .status
            .clone()
    };
    assert_eq!(ready(&d), "False", "never the previous revision's Ready");
    // A round that only deletes a stray Job has not taken the new revision up.
    let mut stray = job("migrate", 1, JobState::Active, running_pod(0));
    stray.revision = NEWER.into();
    let d = Case::new(full(), st, changed).jobs(vec![stray]).decide();
    assert!(matches!(d.effects[..], [Effect::DeleteJob(_)]));
    assert_eq!(d.status.deployment_generation, Some(6));
}

#[test]
fn kstatus_conditions_follow_the_phase() {
    let get = |d: &Decision, t: &str| {
        d.status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .unwrap()
            .status
            .clone()
    };
    let d = Case::new(
        full(),
        status(RolloutPhase::MidHook, vec![]),
        rolling_dep(2, true),
    )
    .decide();
    assert_eq!(
        (get(&d, "Ready"), get(&d, "Reconciling"), get(&d, "Stalled")),
        ("False".into(), "True".into(), "False".into())
    );
    let d = Case::new(
        full(),
        status(RolloutPhase::RolledBack, vec![]),
        dep(OLD, true),
    )
    .decide();
    assert_eq!(
        (get(&d, "Ready"), get(&d, "Reconciling"), get(&d, "Stalled")),
        ("False".into(), "False".into(), "True".into())
    );
    let d = Case::new(full(), at_rest(NEW), dep(NEW, true)).decide();
    assert_eq!(
        (get(&d, "Ready"), get(&d, "Reconciling"), get(&d, "Stalled")),
        ("True".into(), "False".into(), "False".into())
    );
}

mod plan;
mod webhook;
