//! `kubectl ballast` against the real local control plane and the real operator: the status
//! tree's content, approve/abort refused and acted on, `wait`'s exit codes (0, 1, 2, and the
//! previous revision's success never passing), `logs` from the recorded tail, and approval
//! gates that time out with both `onTimeout` values.

mod support;

use ballast::api::{HookPhase, RolloutPhase};
use std::process::{Command, Output};
use support::rollout::*;

/// Runs the plugin in the test's namespace.
fn plugin(env: &Env, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-ballast"))
        .arg("--kubeconfig")
        .arg(&env.c.kubeconfig)
        .args(["-n", &env.ns.name])
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("running kubectl-ballast")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn gate(timeout: &str) -> String {
    format!("  mid: [{{name: go-live, at: 50%, approval: {timeout}}}]\n")
}

#[tokio::test]
async fn approve_and_abort_are_refused_unless_they_apply_and_abort_rolls_back() {
    let env = Env::new("plug-abort").await;
    let stable = adopt(&env, 2, &gate("{}")).await;
    // Right after the change the status still shows the previous revision's success: `wait`
    // does not pass on it, it times out (2) while the gate waits.
    env.set_image("web", "web:2").await;
    let o = plugin(&env, &["wait", "web", "--timeout", "4s"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let s = env
        .wait_phase("web", RolloutPhase::WaitingApproval, None, 40)
        .await;
    let rev = s.current_revision.clone().unwrap();

    let tree = text(&plugin(&env, &["status", "web"]));
    for want in [
        "RolloutStrategy web",
        "Phase:     || WaitingApproval",
        &format!("Revision:  {stable} -> {rev}"),
        "Image:     app: web:1 -> web:2",
        "Replicas:  desired 2",
        "go-live@1",
        "? mid  go-live at 50% [approval]  Waiting",
        &format!(
            "kubectl ballast approve web -n {} --revision {rev}",
            env.ns.name
        ),
    ] {
        assert!(tree.contains(want), "missing {want:?} in\n{tree}");
    }

    let o = plugin(&env, &["approve", "web", "--revision", &stable]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("is on revision {rev}")),
        "{}",
        text(&o)
    );
    let o = plugin(&env, &["retry", "web"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("not failed or rolled back"),
        "{}",
        text(&o)
    );

    let o = plugin(&env, &["abort", "web"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = plugin(
        &env,
        &["wait", "web", "--revision", &rev, "--timeout", "40s"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("aborted by ballast.dev/abort"),
        "{}",
        text(&o)
    );
    let s = env
        .wait_phase("web", RolloutPhase::RolledBack, Some(&rev), 30)
        .await;
    assert_eq!(s.hooks[0].reason.as_deref(), Some("Aborted"));
    assert!(s.consumed_annotations.is_empty());
    wait_available(&env, "web", 2).await;
    assert_eq!(image_of(&env.deployment("web").await), "web:1");
}

#[tokio::test]
async fn an_approval_that_times_out_with_approve_rolls_out_and_wait_exits_0() {
    let env = Env::new("plug-tapprove").await;
    adopt(&env, 2, &gate("{timeoutSeconds: 4, onTimeout: Approve}")).await;
    env.set_image("web", "web:2").await;
    let o = plugin(&env, &["wait", "web", "--timeout", "60s"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let s = env.status("web").await;
    assert_eq!(s.phase, Some(RolloutPhase::Succeeded));
    let g = &s.hooks[0];
    assert_eq!(
        (g.phase, g.reason.as_deref()),
        (HookPhase::Succeeded, Some("ApprovalTimeout"))
    );
    let (start, end) = (ts(&g.start_time), ts(&g.finish_time));
    let waited = end.duration_since(start).as_secs_f64();
    assert!((4.0..15.0).contains(&waited), "the gate waited {waited}s");
    assert_eq!(ts(&g.deadline).duration_since(start).as_secs(), 4);
}

#[tokio::test]
async fn an_approval_that_times_out_with_abort_rolls_back_and_wait_exits_1() {
    let env = Env::new("plug-tabort").await;
    adopt(&env, 2, &gate("{timeoutSeconds: 4}")).await;
    env.set_image("web", "web:2").await;
    let o = plugin(&env, &["wait", "web", "--timeout", "60s"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("failed hook: go-live"), "{out}");
    assert!(out.contains("reason ApprovalTimeout"), "{out}");
    let s = env
        .wait_phase("web", RolloutPhase::RolledBack, None, 30)
        .await;
    assert_eq!(s.hooks[0].reason.as_deref(), Some("ApprovalTimeout"));
    wait_available(&env, "web", 2).await;
    assert_eq!(image_of(&env.deployment("web").await), "web:1");
}

#[tokio::test]
async fn a_failed_hook_shows_in_wait_and_logs_falls_back_to_the_recorded_tail() {
    let env = Env::new("plug-logs").await;
    adopt(
        &env,
        1,
        &format!(
            "  onFailure: Halt\n  pre: [{{name: migrate, job: {}}}]\n",
            job_hook("m:1", "1s", true)
        ),
    )
    .await;
    env.set_image("web", "web:2").await;
    let o = plugin(&env, &["wait", "web", "--timeout", "60s"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains("failed hook: migrate (pre attempt 1)"),
        "{out}"
    );
    assert!(out.contains("exit code 1"), "{out}");
    let s = env.status("web").await;
    let tail = s.hooks[0].log_tail.clone().expect("a recorded log tail");
    // kwok's pods have no kubelet to serve their log: the recorded tail is what there is.
    let o = plugin(&env, &["logs", "web", "migrate"]);
    let out = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("the log tail recorded in status"), "{out}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(tail.trim()),
        "{out}"
    );
    // With the Job (and its pod) gone, the same.
    env.jobs()
        .delete_collection(
            &kube::api::DeleteParams::background(),
            &kube::api::ListParams::default().labels("ballast.dev/hook=migrate"),
        )
        .await
        .unwrap();
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(env.client(), &env.ns.name);
    support::wait_until(
        "the hook pod gone",
        std::time::Duration::from_secs(30),
        || async {
            pods.list(&kube::api::ListParams::default().labels("ballast.dev/hook=migrate"))
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        },
    )
    .await;
    let o = plugin(&env, &["logs", "web", "migrate"]);
    let out = text(&o);
    assert!(out.contains("is left"), "{out}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(tail.trim()),
        "{out}"
    );
}
