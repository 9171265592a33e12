//! `kubectl ballast` against the real local control plane and the real operator: the status
//! tree's content, approve/abort refused and acted on, `wait`'s exit codes (0, 1, 2, and the
//! previous revision's success never passing), `logs` from the recorded tail, approval gates
//! that time out with both `onTimeout` values, and a webhook hook whose engine answered 202
//! (`WaitingExternal`) shown, waited through and approved by a person.

mod support;

use ballast::api::{HookPhase, RolloutPhase};
use kube::ResourceExt;
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

/// An engine on 127.0.0.1 that answers every call `202 Accepted` and never decides itself.
fn engine_that_defers() -> u16 {
    use std::io::{BufRead, BufReader, Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream);
            let mut length = 0;
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if let Some((k, v)) = line.split_once(':')
                    && k.eq_ignore_ascii_case("content-length")
                {
                    length = v.trim().parse().unwrap_or(0);
                }
                line.clear();
            }
            let _ = reader.by_ref().take(length).read_to_end(&mut vec![]);
            let _ = reader.get_mut().write_all(
                b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    port
}

#[tokio::test]
async fn a_webhook_waiting_for_its_engine_is_shown_waited_through_and_approved_by_a_person() {
    let port = engine_that_defers();
    let env = Env::with_args("plug-ext", &["--webhook-allowed-hosts=127.0.0.1"]).await;
    adopt(
        &env,
        2,
        &format!(
            "  pre: [{{name: ticket, webhook: {{url: \"http://127.0.0.1:{port}/ballast\"}}}}]\n"
        ),
    )
    .await;
    env.set_image("web", "web:2").await;
    let s = env
        .wait_phase("web", RolloutPhase::WaitingExternal, None, 40)
        .await;
    let rev = s.current_revision.clone().unwrap();
    // Not terminal: `wait` times out (2) while the engine has not decided.
    let o = plugin(
        &env,
        &["wait", "web", "--revision", &rev, "--timeout", "3s"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("WaitingExternal"), "{}", text(&o));
    let tree = text(&plugin(&env, &["status", "web"]));
    for want in [
        "Phase:     || WaitingExternal",
        "? pre  ticket [webhook]  Waiting",
        "HTTP 202",
        "then failed)",
        "wait for the engine of webhook hook ticket to approve or abort",
        &format!(
            "kubectl ballast approve web -n {} --revision {rev}",
            env.ns.name
        ),
    ] {
        assert!(tree.contains(want), "missing {want:?} in\n{tree}");
    }
    assert!(env.paused("web").await, "held at a pre hook");
    // A person decides in the engine's place.
    let o = plugin(&env, &["approve", "web"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("approved webhook hook ticket of revision {rev}")),
        "{}",
        text(&o)
    );
    let o = plugin(
        &env,
        &["wait", "web", "--revision", &rev, "--timeout", "60s"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    wait_available(&env, "web", 2).await;
    assert_eq!(image_of(&env.deployment("web").await), "web:2");
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

#[tokio::test]
async fn spread_counts_equal_the_pods_real_nodes() {
    use k8s_openapi::api::core::v1::{Node, Pod};
    let env = Env::new("plug-spread").await;
    env.apply(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: api, labels: {tier: api}}
spec:
  replicas: 4
  selector: {matchLabels: {app: api}}
  template:
    metadata: {labels: {app: api}}
    spec: {containers: [{name: app, image: "api:1"}]}
---
apiVersion: ballast.dev/v1alpha1
kind: SpreadPolicy
metadata: {name: api-ha}
spec:
  selector: {matchLabels: {tier: api}}
  spread:
    - {topologyKey: topology.kubernetes.io/zone, mode: Required}
    - {topologyKey: kubernetes.io/hostname, mode: Preferred, weight: 100}
"#,
    );
    let pods: kube::Api<Pod> = kube::Api::namespaced(env.client(), &env.ns.name);
    let lp = kube::api::ListParams::default().labels("app=api");
    // 4 replicas of the policy's template in 3 zones: 3 scheduled, 1 Pending.
    let placed = support::wait_until(
        "the policy's pods placed",
        std::time::Duration::from_secs(60),
        || async {
            let items = pods.list(&lp).await.ok()?.items;
            let live: Vec<_> = items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .collect();
            // Only the policy's template left (the rollout it caused is over).
            let all_new = live
                .iter()
                .all(|p| p.spec.as_ref().is_some_and(|s| s.affinity.is_some()));
            (all_new && live.len() == 4 && items_scheduled(&live) == 3).then_some(live)
        },
    )
    .await;
    let nodes: kube::Api<Node> = kube::Api::all(env.client());
    let zone_of: std::collections::BTreeMap<String, String> = nodes
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| {
            let z = n.labels()["topology.kubernetes.io/zone"].clone();
            (n.metadata.name.unwrap(), z)
        })
        .collect();
    let mut want: std::collections::BTreeMap<String, i64> =
        zone_of.values().map(|z| (z.clone(), 0)).collect();
    for p in &placed {
        if let Some(n) = p.spec.as_ref().unwrap().node_name.as_ref() {
            *want.get_mut(&zone_of[n]).unwrap() += 1;
        }
    }
    let o = plugin(&env, &["spread", "api-ha", "-o", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let zone = &v["rows"][0];
    assert_eq!(zone["topologyKey"], "topology.kubernetes.io/zone");
    let got: std::collections::BTreeMap<String, i64> = zone["domains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| (d[0].as_str().unwrap().to_string(), d[1].as_i64().unwrap()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(zone["pending"], 1);
    assert_eq!(v["rows"][1]["topologyKey"], "kubernetes.io/hostname");
    let table = text(&plugin(&env, &["spread", "api-ha"]));
    assert!(table.contains("Deployment/api"), "{table}");
}

fn items_scheduled(pods: &[k8s_openapi::api::core::v1::Pod]) -> usize {
    pods.iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .count()
}
