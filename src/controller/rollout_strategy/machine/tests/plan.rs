//! Table tests of [`plan`]: which steps one reconcile takes together, and which it leaves for
//! the next one because a write needs the status before it recorded.

use super::*;

impl Case<'_> {
    /// The plan, without the labels and marks (tested on their own).
    pub(super) fn plan(&self) -> Plan {
        let mut p = self.plan_all();
        p.decision
            .effects
            .retain(|e| !matches!(e, Effect::Annotate(_) | Effect::MarkTarget(_)));
        p
    }

    fn plan_all(&self) -> Plan {
        plan(&self.input())
    }
}

fn pre_only() -> RolloutStrategySpec {
    spec("pre: [{name: migrate, container: {from: app}}]")
}

fn no_hooks() -> RolloutStrategySpec {
    spec("")
}

fn running(name: &str, point: HookPoint) -> HookStatus {
    entry(name, point, HookPhase::Running, 1)
}

fn succeeded_job(name: &str) -> JobView {
    job(
        name,
        1,
        JobState::Succeeded {
            finished: Some(t(15)),
        },
        None,
    )
}

/// The plans one reconcile makes in turn: each next one on the status the previous wrote, with
/// the Deployment as observed (its writes are not in this view).
fn rounds(c: &Case) -> Vec<Plan> {
    let mut out = vec![];
    let mut status = c.status.clone();
    loop {
        let p = Case {
            status: status.clone(),
            spec: c.spec.clone(),
            dep: c.dep.clone(),
            jobs: c.jobs.clone(),
            live_pods: c.live_pods.clone(),
            rejected: c.rejected.clone(),
            webhooks: c.webhooks.clone(),
            ..*c
        }
        .plan();
        status = p.decision.status.clone();
        let more = p.more;
        out.push(p);
        if !more {
            return out;
        }
    }
}

#[test]
fn a_pre_hook_that_completes_is_recorded_then_the_deployment_unpaused_in_one_reconcile() {
    for gate in [Gate::Admission, Gate::PauseAtRest] {
        let mut c = Case::new(
            pre_only(),
            status(
                RolloutPhase::PreHook,
                vec![running("migrate", HookPoint::Pre)],
            ),
            dep(NEW, true),
        )
        .jobs(vec![succeeded_job("migrate")]);
        c.gate = gate;
        let r = rounds(&c);
        assert_eq!(r.len(), 2, "{gate:?}: {r:?}");
        // First the record: the hook succeeded, the revision rolls.
        let first = &r[0].decision;
        assert!(first.effects.is_empty(), "{:?}", first.effects);
        assert_eq!(first.status.phase, Some(RolloutPhase::Rolling));
        assert_eq!(hook(first, "migrate").phase, HookPhase::Succeeded);
        assert_eq!(first.status.released_revision, None);
        assert_eq!(reasons(first), ["HookSucceeded"]);
        assert_eq!(first.hook_results.len(), 1);
        // Then the unpause, and that it was let go.
        let second = &r[1].decision;
        assert_eq!(second.effects, [Effect::Unpause]);
        assert_eq!(second.status.released_revision.as_deref(), Some(NEW));
    }
}

#[test]
fn a_revision_without_hooks_is_let_go_in_one_reconcile_and_succeeds_in_one_plan() {
    let r = rounds(&Case::new(no_hooks(), at_rest(OLD), dep(NEW, true)).admission());
    assert_eq!(r.len(), 2, "{r:?}");
    let first = &r[0].decision;
    assert!(first.effects.is_empty(), "{:?}", first.effects);
    assert_eq!(
        first.status.phase,
        Some(RolloutPhase::Rolling),
        "no PreHook of its own"
    );
    assert_eq!(first.status.current_revision.as_deref(), Some(NEW));
    assert_eq!(reasons(first), [ROLLOUT_STARTED]);
    assert_eq!(r[1].decision.effects, [Effect::Unpause]);
    // Rolled out: no post hook, so straight to Succeeded.
    let p = Case::new(no_hooks(), r[1].decision.status.clone(), dep(NEW, false))
        .admission()
        .plan();
    assert!(p.decision.effects.is_empty(), "{:?}", p.decision.effects);
    assert!(!p.more);
    assert_eq!(p.decision.status.phase, Some(RolloutPhase::Succeeded));
    assert_eq!(p.decision.status.stable_revision.as_deref(), Some(NEW));
    assert_eq!(reasons(&p.decision), [ROLLOUT_SUCCEEDED]);
}

#[test]
fn without_the_gate_a_revision_without_hooks_is_paused_for_its_end_then_succeeds() {
    let mut st = at_rest(OLD);
    st.phase = Some(RolloutPhase::Rolling);
    st.current_revision = Some(NEW.into());
    st.released_revision = Some(NEW.into());
    let p = Case::new(no_hooks(), st, dep(NEW, false)).plan();
    assert_eq!(p.decision.effects, [Effect::Pause]);
    assert_eq!(p.decision.status.phase, Some(RolloutPhase::PostHook));
    let p = Case::new(no_hooks(), p.decision.status, dep(NEW, true)).plan();
    assert!(p.decision.effects.is_empty());
    assert_eq!(p.decision.status.phase, Some(RolloutPhase::Succeeded));
}

#[test]
fn a_hook_attempt_is_recorded_before_its_job_is_created() {
    let p = Case::new(pre_only(), at_rest(OLD), dep(NEW, true))
        .admission()
        .plan();
    assert!(p.decision.effects.is_empty(), "{:?}", p.decision.effects);
    assert!(p.more, "the Job comes once the attempt is recorded");
    assert_eq!(p.decision.status.phase, Some(RolloutPhase::PreHook));
    let h = hook(&p.decision, "migrate");
    assert_eq!(
        (h.phase, h.attempt, h.job_name.as_deref()),
        (HookPhase::Pending, 1, None)
    );
    assert_eq!(reasons(&p.decision), [ROLLOUT_STARTED, "HookStarted"]);
    let p = Case::new(pre_only(), p.decision.status, dep(NEW, true))
        .admission()
        .plan();
    assert_eq!(p.decision.effects, [create("migrate", HookPoint::Pre, 1)]);
    assert!(!p.more);
    assert!(hook(&p.decision, "migrate").job_name.is_some());
}

#[test]
fn replicas_set_aside_are_recorded_before_the_scale_to_zero() {
    let s = spec("mid: [{name: schema, at: 1, container: {from: app}}]");
    let mut d0 = dep(NEW, true);
    d0.recreate = true;
    d0.updated_replicas = 0;
    let p = Case::new(s.clone(), at_rest(OLD), d0.clone())
        .admission()
        .plan();
    assert!(p.decision.effects.is_empty(), "{:?}", p.decision.effects);
    assert!(p.more);
    assert_eq!(p.decision.status.original_replicas, Some(4));
    let p = Case::new(s, p.decision.status, d0).admission().plan();
    assert_eq!(p.decision.effects, [Effect::Scale(0)]);
}

#[test]
fn a_failure_is_recorded_before_the_rollback() {
    let st = status(
        RolloutPhase::PreHook,
        vec![running("migrate", HookPoint::Pre)],
    );
    let p = Case::new(pre_only(), st, dep(NEW, true))
        .jobs(vec![failed_job("migrate", 1)])
        .admission()
        .plan();
    assert!(p.decision.effects.is_empty(), "{:?}", p.decision.effects);
    assert!(p.more);
    assert_eq!(p.decision.status.phase, Some(RolloutPhase::Failed));
    let p = Case::new(pre_only(), p.decision.status, dep(NEW, true))
        .admission()
        .plan();
    assert_eq!(p.decision.effects, [Effect::RestoreTemplate]);
    assert_eq!(p.decision.status.phase, Some(RolloutPhase::RolledBack));
}

#[test]
fn an_unpause_carries_the_phase_label_and_the_mark_follows_it() {
    let mut c = Case::new(no_hooks(), at_rest(OLD), dep(NEW, true)).admission();
    let first = c.plan_all();
    assert!(first.more);
    assert!(
        first.decision.effects.is_empty(),
        "no label write of its own before the unpause: {:?}",
        first.decision.effects
    );
    c.status = first.decision.status;
    assert_eq!(
        c.plan_all().decision.effects,
        [Effect::Unpause, Effect::MarkTarget(true)],
        "the unpause labels; the mark follows it"
    );
    // A decision without a pause or an unpause labels on its own.
    let p = Case::new(pre_only(), at_rest(OLD), dep(NEW, true))
        .admission()
        .plan_all();
    assert_eq!(
        p.decision.effects,
        [
            Effect::Annotate(RolloutPhase::PreHook),
            Effect::MarkTarget(true)
        ]
    );
}

#[test]
fn a_plan_that_changes_nothing_is_one_quiet_step() {
    let settled = Case::new(no_hooks(), at_rest(NEW), dep(NEW, false))
        .admission()
        .decide()
        .status;
    let c = Case::new(no_hooks(), settled, dep(NEW, false)).admission();
    let p = c.plan();
    assert!(!p.more);
    assert!(!p.decision.changes(&c.status), "{:?}", p.decision);
    assert_eq!(p.decision, c.decide());
}

#[test]
fn replica_counts_alone_are_not_a_step() {
    let mut st = status(RolloutPhase::Rolling, vec![ok("migrate", HookPoint::Pre)]);
    st.released_revision = Some(NEW.into());
    let first = Case::new(pre_only(), st, rolling_dep(1, false))
        .admission()
        .plan()
        .decision;
    let later = Case::new(pre_only(), first.status.clone(), rolling_dep(3, false))
        .admission()
        .plan()
        .decision;
    assert!(later.changes(&first.status), "the counts moved");
    assert!(!later.steps(&first.status), "{later:?}");
    assert_eq!(later.status.updated_replicas, Some(3));
}
