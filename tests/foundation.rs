//! The foundation, against the local control plane: the kustomize package
//! installs, the API server enforces the CRDs' validation, and the manager
//! runs under its own ServiceAccount with leader election.

mod support;

use std::{path::Path, time::Duration};
use support::{Operator, TestNamespace, cluster, repo_root, wait_until};

#[tokio::test]
async fn config_default_installs_and_kubectl_get_shows_the_printer_columns() {
    let c = cluster().await;
    // install() is `kubectl apply --server-side -k config/default`; run it
    // again here so its output is checked, not just its side effects.
    c.install();
    let out = c.kubectl_ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-k",
        "config/default",
    ]);
    for obj in [
        "customresourcedefinition.apiextensions.k8s.io/spreadpolicies.ballast.dev",
        "customresourcedefinition.apiextensions.k8s.io/rolloutstrategies.ballast.dev",
        "serviceaccount/ballast-controller-manager",
        "clusterrole.rbac.authorization.k8s.io/ballast-manager-role",
        "deployment.apps/ballast-controller-manager",
    ] {
        assert!(out.contains(obj), "{obj} missing from:\n{out}");
    }
    let ns = TestNamespace::new(&c, "columns").await;
    c.apply_yaml(
        &ns.name,
        r#"
apiVersion: ballast.dev/v1alpha1
kind: SpreadPolicy
metadata: {name: web-ha}
spec:
  selector: {matchLabels: {tier: web}}
  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Required}]
---
apiVersion: ballast.dev/v1alpha1
kind: RolloutStrategy
metadata: {name: web}
spec:
  targetRef: {name: web}
  pre: [{name: migrate, container: {from: app, command: [bin/migrate]}}]
"#,
    );
    let spol = c.kubectl_ok(&["get", "spreadpolicies", "-n", &ns.name]);
    let header: Vec<&str> = spol.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "MATCHED", "APPLIED", "READY", "AGE"],
        "{spol}"
    );
    let rost = c.kubectl_ok(&["get", "rolloutstrategies", "-n", &ns.name]);
    let header: Vec<&str> = rost.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "TARGET", "PHASE", "HOOK", "REVISION", "UPDATED", "AGE"
        ],
        "{rost}"
    );
    assert!(rost.contains("web"), "{rost}");
    // Short names and the category work too.
    c.kubectl_ok(&["get", "spol,rost", "-n", &ns.name]);
    let all = c.kubectl_ok(&["get", "ballast", "-n", &ns.name, "-o", "name"]);
    assert!(
        all.contains("spreadpolicy.ballast.dev/web-ha")
            && all.contains("rolloutstrategy.ballast.dev/web"),
        "{all}"
    );
}

fn expectation(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("# expect:"))
        .unwrap_or_else(|| panic!("{} has no '# expect:' line", path.display()))
        .trim()
        .to_string()
}

#[tokio::test]
async fn every_invalid_fixture_is_rejected_by_the_api_server_naming_the_field() {
    let c = cluster().await;
    c.install();
    let ns = TestNamespace::new(&c, "invalid").await;
    let dir = repo_root().join("tests/fixtures/invalid");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert!(
        files.len() >= 25,
        "expected a table of invalid resources, found {}",
        files.len()
    );
    let mut failures = Vec::new();
    for f in &files {
        let expect = expectation(f);
        let out = c.kubectl(&[
            "apply",
            "--dry-run=server",
            "-n",
            &ns.name,
            "-f",
            f.to_str().unwrap(),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            failures.push(format!(
                "{}: accepted, expected rejection with {expect:?}",
                f.display()
            ));
        } else if !stderr.contains(&expect) {
            failures.push(format!(
                "{}: rejected without {expect:?}:\n{stderr}",
                f.display()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn every_example_is_accepted() {
    let c = cluster().await;
    c.install();
    let ns = TestNamespace::new(&c, "examples").await;
    let mut files: Vec<_> = std::fs::read_dir(repo_root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 6);
    for f in &files {
        let out = c.kubectl(&[
            "apply",
            "--dry-run=server",
            "-n",
            &ns.name,
            "-f",
            f.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{} rejected:\n{}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn a_rollout_strategys_target_ref_is_immutable() {
    let c = cluster().await;
    c.install();
    let ns = TestNamespace::new(&c, "immutable").await;
    c.apply_yaml(
        &ns.name,
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {name: web}\nspec: {targetRef: {name: web}}\n",
    );
    let out = c.kubectl(&[
        "patch",
        "rolloutstrategy",
        "web",
        "-n",
        &ns.name,
        "--type=merge",
        "-p",
        r#"{"spec":{"targetRef":{"name":"other"}}}"#,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("spec.targetRef") && stderr.contains("immutable"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_manager_runs_as_its_service_account_and_logs_no_rbac_error() {
    let c = cluster().await;
    let ns = TestNamespace::new(&c, "manager").await;
    // The ServiceAccount from config/ is not an admin.
    let sa = "system:serviceaccount:ballast-system:ballast-controller-manager";
    for (verb, resource, allowed) in [
        ("list", "secrets", "no"),
        ("create", "deployments.apps", "no"),
        ("patch", "deployments.apps", "yes"),
        ("create", "jobs.batch", "yes"),
        ("escalate", "clusterroles.rbac.authorization.k8s.io", "no"),
        ("impersonate", "users", "no"),
    ] {
        let out = c.kubectl(&["auth", "can-i", verb, resource, "--as", sa, "-n", &ns.name]);
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert_eq!(answer, allowed, "can {sa} {verb} {resource}?");
    }

    let op = Operator::start(&c, &ns.name);
    let (code, _) = wait_until("/readyz to answer 200", Duration::from_secs(60), || async {
        op.http_get("/readyz")
            .await
            .filter(|(code, _)| *code == 200)
    })
    .await;
    assert_eq!(code, 200);
    wait_until(
        "the controllers to start",
        Duration::from_secs(60),
        || async { op.logs().contains("starting controllers").then_some(()) },
    )
    .await;
    // Both controllers act: observedGeneration is written for each kind.
    c.apply_yaml(
        &ns.name,
        r#"
apiVersion: ballast.dev/v1alpha1
kind: SpreadPolicy
metadata: {name: p}
spec:
  selector: {matchLabels: {tier: none}}
  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Preferred}]
"#,
    );
    wait_until(
        "SpreadPolicy status.observedGeneration",
        Duration::from_secs(60),
        || async {
            let out = c.kubectl(&[
                "get",
                "spol",
                "p",
                "-n",
                &ns.name,
                "-o",
                "jsonpath={.status.observedGeneration}",
            ]);
            (String::from_utf8_lossy(&out.stdout).trim() == "1").then_some(())
        },
    )
    .await;
    let (_, metrics) = op.http_get("/metrics").await.expect("/metrics answers");
    assert!(
        metrics.contains("ballast_reconciles_total{controller=\"spread-policy\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("ballast_leader 1"), "{metrics}");
    assert_eq!(op.http_get("/healthz").await.map(|(c, _)| c), Some(200));
    let logs = op.logs();
    for bad in ["forbidden", "Forbidden", "cannot list", "cannot watch"] {
        assert!(
            !logs.contains(bad),
            "RBAC error ({bad}) in the operator log:\n{logs}"
        );
    }
}

fn lease_holder(c: &support::Cluster, lease: &str) -> String {
    let out = c.kubectl(&[
        "get",
        "lease",
        lease,
        "-n",
        "ballast-system",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test]
async fn of_two_managers_only_one_leads_and_losing_it_hands_over() {
    let c = cluster().await;
    let ns = TestNamespace::new(&c, "leader").await;
    let lease = format!("ballast-{}", ns.name);
    let mut a = Operator::start_with(
        &c,
        &ns.name,
        &lease,
        &["--identity", "manager-a", "--lease-duration-seconds", "6"],
    );
    let mut b = Operator::start_with(
        &c,
        &ns.name,
        &lease,
        &["--identity", "manager-b", "--lease-duration-seconds", "6"],
    );
    let first = wait_until("a leader", Duration::from_secs(60), || async {
        let h = lease_holder(&c, &lease);
        (!h.is_empty()).then_some(h)
    })
    .await;
    // Give the other one time to (wrongly) act; it must keep waiting.
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        lease_holder(&c, &lease),
        first,
        "the lease stays with the first leader"
    );
    let (leader, follower) = if first == "manager-a" {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let leading = |o: &Operator| o.logs().contains("starting controllers");
    assert!(leading(leader), "the leader runs the controllers");
    assert!(
        !leading(follower),
        "the standby does not:\n{}",
        follower.logs()
    );

    // SIGKILL: no release; the standby takes over once the lease expires.
    leader.kill();
    let second = if first == "manager-a" {
        "manager-b"
    } else {
        "manager-a"
    };
    wait_until(
        "the standby to take over",
        Duration::from_secs(30),
        || async { (lease_holder(&c, &lease) == second).then_some(()) },
    )
    .await;
    wait_until(
        "the new leader to start its controllers",
        Duration::from_secs(30),
        || async { leading(follower).then_some(()) },
    )
    .await;

    // SIGTERM: a graceful exit releases the lease.
    let status = follower.terminate().expect("was running");
    assert!(
        status.success(),
        "graceful shutdown exits 0: {status:?}\n{}",
        follower.logs()
    );
    assert!(
        follower.logs().contains("released leader lease"),
        "{}",
        follower.logs()
    );
    assert_eq!(
        lease_holder(&c, &lease),
        "",
        "the lease is free for the next replica at once"
    );
}

#[tokio::test]
async fn kubectl_explain_documents_the_fields() {
    let c = cluster().await;
    c.install();
    let spread = c.kubectl_ok(&["explain", "spreadpolicy.spec.spread"]);
    for needle in [
        "siblings",
        "pod-template-hash",
        "topologyKey",
        "mode",
        "method",
        "weight",
    ] {
        assert!(
            spread.contains(needle),
            "explain spreadpolicy.spec.spread lacks {needle:?}:\n{spread}"
        );
    }
    let pre = c.kubectl_ok(&["explain", "rolloutstrategy.spec.pre"]);
    for needle in [
        "before any pod of the new revision",
        "failurePolicy",
        "timeoutSeconds",
        "container",
    ] {
        assert!(
            pre.contains(needle),
            "explain rolloutstrategy.spec.pre lacks {needle:?}:\n{pre}"
        );
    }
}
