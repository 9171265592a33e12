//! Issue #11 against the real local control plane with the real operator: `ballast.dev/abort`,
//! approval deadlines (`approval: {timeoutSeconds, onTimeout}`), and the `kubectl-ballast`
//! plugin's subcommands, run as the binary a user runs.

mod support;

use ballast::api::{HookPhase, RolloutPhase};
use kube::ResourceExt;
use std::time::Duration;
use support::rollout::*;

const GATE_ABORT: &str =
    "  mid: [{name: go-live, at: 50%, approval: {timeoutSeconds: 4, onTimeout: Abort}}]\n";
const GATE_APPROVE: &str =
    "  mid: [{name: go-live, at: 50%, approval: {timeoutSeconds: 4, onTimeout: Approve}}]\n";

#[tokio::test]
async fn an_approval_that_times_out_with_abort_rolls_the_revision_back() {
    let env = Env::new("plug-tmo-abort").await;
    let stable = adopt(&env, 2, GATE_ABORT).await;
    env.set_image("web", "web:2").await;
    let s = env
        .wait_phase("web", RolloutPhase::WaitingApproval, None, 40)
        .await;
    let gate = s.hooks.iter().find(|h| h.name == "go-live").unwrap();
    let (started, deadline) = (ts(&gate.start_time), ts(&gate.deadline));
    assert_eq!(deadline.duration_since(started).as_secs(), 4, "{gate:?}");
    assert!(
        s.message.as_deref().unwrap().contains("then aborted"),
        "{:?}",
        s.message
    );
    let s = env
        .wait_phase("web", RolloutPhase::RolledBack, None, 30)
        .await;
    let gate = s.hooks.iter().find(|h| h.name == "go-live").unwrap();
    assert_eq!(gate.phase, HookPhase::Failed);
    assert_eq!(gate.reason.as_deref(), Some("ApprovalTimeout"));
    // Woken for the deadline, not by a poll long after it.
    let late = ts(&gate.finish_time).duration_since(deadline).as_secs_f64();
    assert!(
        (0.0..3.0).contains(&late),
        "closed {late}s after the deadline"
    );
    assert_eq!(s.stable_revision.as_deref(), Some(stable.as_str()));
    wait_available(&env, "web", 2).await;
    assert_eq!(image_of(&env.deployment("web").await), "web:1");
}

#[tokio::test]
async fn an_approval_that_times_out_with_approve_completes_the_rollout() {
    let env = Env::new("plug-tmo-approve").await;
    let stable = adopt(&env, 2, GATE_APPROVE).await;
    env.set_image("web", "web:2").await;
    let s = env
        .wait_phase("web", RolloutPhase::WaitingApproval, None, 40)
        .await;
    assert!(s.message.as_deref().unwrap().contains("then approved"));
    let s = env.wait_succeeded_after("web", &stable, 40).await;
    let gate = s.hooks.iter().find(|h| h.name == "go-live").unwrap();
    assert_eq!(gate.phase, HookPhase::Succeeded);
    assert_eq!(gate.reason.as_deref(), Some("ApprovalTimeout"));
    assert_eq!(image_of(&env.deployment("web").await), "web:2");
}

#[tokio::test]
async fn abort_refuses_another_revision_then_fails_the_current_one() {
    let env = Env::new("plug-abort").await;
    let stable = adopt(&env, 2, "  mid: [{name: go-live, at: 50%, approval: {}}]\n").await;
    env.set_image("web", "web:2").await;
    let s = env
        .wait_phase("web", RolloutPhase::WaitingApproval, None, 40)
        .await;
    let rev = s.current_revision.clone().unwrap();
    env.annotate("web", "ballast.dev/abort", &stable).await;
    let s = env
        .wait_status("web", "the abort refused", 20, |s| {
            s.message.as_deref().is_some_and(|m| m.contains("refused"))
        })
        .await;
    assert_eq!(s.phase, Some(RolloutPhase::WaitingApproval));
    assert!(s.message.unwrap().contains(&rev));
    env.annotate("web", "ballast.dev/abort", &rev).await;
    let s = env
        .wait_phase("web", RolloutPhase::RolledBack, None, 30)
        .await;
    let gate = s.hooks.iter().find(|h| h.name == "go-live").unwrap();
    assert_eq!(gate.reason.as_deref(), Some("Aborted"));
    let obj = env.strategies().get("web").await.unwrap();
    assert!(!obj.annotations().contains_key("ballast.dev/abort"));
    wait_available(&env, "web", 2).await;
    assert_eq!(image_of(&env.deployment("web").await), "web:1");
    assert!(!env.events("RolloutFailed").await.is_empty());
    tokio::time::sleep(Duration::from_millis(10)).await;
}
