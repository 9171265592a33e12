//! The foundation, against the local control plane: the kustomize package
//! installs, the API server enforces the CRDs' validation, and the manager
//! runs under its own ServiceAccount with leader election.

mod support;

use serde::Deserialize;
use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
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
        ["NAME", "MATCHED", "APPLIED", "READY", "INFEASIBLE", "AGE"],
        "{spol}"
    );
    let wide = c.kubectl_ok(&["get", "spreadpolicies", "-n", &ns.name, "-o", "wide"]);
    assert!(wide.lines().next().unwrap().ends_with("MESSAGE"), "{wide}");
    let rost = c.kubectl_ok(&["get", "rolloutstrategies", "-n", &ns.name]);
    let header: Vec<&str> = rost.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "TARGET", "PHASE", "HOOK", "REVISION", "DESIRED", "UPDATED", "READY", "AGE"
        ],
        "{rost}"
    );
    let wide = c.kubectl_ok(&["get", "rolloutstrategies", "-n", &ns.name, "-o", "wide"]);
    assert!(wide.lines().next().unwrap().ends_with("MESSAGE"), "{wide}");
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

/// `make run` applies every example into one namespace: two files that declare the same object
/// would fight over it, and each apply would start a revision of the other's template.
#[test]
fn no_two_examples_declare_the_same_object() {
    let mut seen = std::collections::BTreeMap::new();
    let mut clashes = Vec::new();
    for entry in std::fs::read_dir(repo_root().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v = serde_json::Value::deserialize(doc).expect("example YAML");
            let (Some(kind), Some(name)) = (v["kind"].as_str(), v["metadata"]["name"].as_str())
            else {
                continue;
            };
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            if let Some(other) = seen.insert(format!("{kind}/{name}"), file.clone()) {
                clashes.push(format!("{kind}/{name}: {other} and {file}"));
            }
        }
    }
    assert!(clashes.is_empty(), "{clashes:#?}");
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

#[tokio::test]
async fn a_manager_that_loses_its_lease_exits_at_once() {
    let c = cluster().await;
    let ns = TestNamespace::new(&c, "lease-lost").await;
    let lease = format!("ballast-{}", ns.name);
    let mut op = Operator::start_with(&c, &ns.name, &lease, &["--lease-duration-seconds", "6"]);
    wait_until(
        "the controllers to start",
        Duration::from_secs(60),
        || async { op.logs().contains("starting controllers").then_some(()) },
    )
    .await;
    // Another holder, as after a partition: the manager must not act once more.
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    c.kubectl_ok(&[
        "patch",
        "lease",
        &lease,
        "-n",
        "ballast-system",
        "--type=merge",
        "-p",
        &format!(
            r#"{{"spec":{{"holderIdentity":"intruder","renewTime":"{now}","leaseDurationSeconds":60}}}}"#
        ),
    ]);
    let taken = std::time::Instant::now();
    wait_exit(&mut op, Duration::from_secs(10)).await;
    let status = op.terminate().expect("was started");
    assert!(!status.success(), "exits non-zero: {status:?}");
    assert!(
        taken.elapsed() < Duration::from_secs(5),
        "exits within a renewal: {:?}",
        taken.elapsed()
    );
    let logs = op.logs();
    assert!(logs.contains("lost the leader lease"), "{logs}");
    assert!(
        !logs.contains("released leader lease") && !logs.contains("finishing in-flight"),
        "no drain, no release of a Lease that is not ours:\n{logs}"
    );
    assert_eq!(lease_holder(&c, &lease), "intruder");
}

#[tokio::test]
async fn healthz_fails_and_the_manager_exits_when_its_watches_keep_failing() {
    let c = cluster().await;
    let ns = TestNamespace::new(&c, "healthz").await;
    // A ServiceAccount without any RBAC: every watch of the manager is refused.
    c.kubectl_ok(&["create", "serviceaccount", "no-rbac", "-n", &ns.name]);
    let kubeconfig = support::repo_root()
        .join("target")
        .join(format!("no-rbac-{}.kubeconfig", ns.name));
    write_kubeconfig_for(&c, &ns.name, "no-rbac", &kubeconfig);
    let mut op = Operator::start_with(
        &c,
        &ns.name,
        "unused",
        &[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--leader-elect=false",
            "--watch-stale-seconds",
            "8",
        ],
    );
    let (code, _) = wait_until("/healthz to answer", Duration::from_secs(30), || async {
        op.http_get("/healthz").await
    })
    .await;
    assert_eq!(
        code, 200,
        "a watch failing for less than the limit is tolerated"
    );
    let (code, body) = wait_until("/healthz to fail", Duration::from_secs(30), || async {
        op.http_get("/healthz")
            .await
            .filter(|(code, _)| *code != 200)
    })
    .await;
    assert_eq!(code, 500, "{body}");
    // Every watch fails; whichever went stale first is named.
    assert!(
        (body.contains("watch rollout-strategy/") || body.contains("watch spread-policy/"))
            && body.contains("failing for"),
        "{body}"
    );
    wait_exit(&mut op, Duration::from_secs(20)).await;
    let status = op.terminate().expect("was started");
    assert!(!status.success(), "exits non-zero: {status:?}");
    let _ = std::fs::remove_file(&kubeconfig);
}

async fn wait_exit(op: &mut Operator, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    while op.is_running() {
        assert!(
            std::time::Instant::now() < deadline,
            "the manager still runs after {timeout:?}:\n{}",
            op.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Writes a kubeconfig that authenticates as ServiceAccount `sa` of `namespace`.
fn write_kubeconfig_for(c: &support::Cluster, namespace: &str, sa: &str, path: &Path) {
    let token = c.kubectl_ok(&["create", "token", sa, "-n", namespace, "--duration=1h"]);
    let view = |jsonpath: &str| {
        c.kubectl_ok(&[
            "config",
            "view",
            "--raw",
            "--minify",
            "-o",
            &format!("jsonpath={jsonpath}"),
        ])
    };
    let server = view("{.clusters[0].cluster.server}");
    let ca = view("{.clusters[0].cluster.certificate-authority-data}");
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n- name: sa\n  user:\n    token: {}\ncontexts:\n- name: sa\n  context: {{cluster: local, user: sa, namespace: {namespace}}}\n\
         current-context: sa\n",
        token.trim()
    );
    std::fs::write(path, yaml).expect("writing a kubeconfig");
}

/// A TCP relay to the API server that can be cut: from then on it forwards nothing either way
/// and closes nothing, as a network partition looks to a client.
struct Partition {
    url: String,
    cut: Arc<AtomicBool>,
}

impl Partition {
    async fn to(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let flag = cut.clone();
        tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let Ok(up) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                tokio::spawn(pump(dr, uw, flag.clone()));
                tokio::spawn(pump(ur, dw, flag.clone()));
            }
        });
        Self {
            url: format!("https://127.0.0.1:{port}"),
            cut,
        }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                if cut.load(Ordering::SeqCst) {
                    // A partition closes nothing.
                    std::future::pending::<()>().await;
                }
                return;
            }
            Ok(n) => n,
        };
        if cut.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// The admin kubeconfig's config, and the same through `partition`.
async fn configs_through(c: &support::Cluster) -> (kube::Config, Partition, kube::Config) {
    let kc = kube::config::Kubeconfig::read_from(&c.kubeconfig).unwrap();
    let direct = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let upstream = direct.cluster_url.authority().unwrap().to_string();
    assert!(upstream.starts_with("127.0.0.1:"), "{upstream}");
    let partition = Partition::to(upstream).await;
    let mut cut_off = direct.clone();
    cut_off.cluster_url = partition.url.parse().unwrap();
    (direct, partition, cut_off)
}

/// The scenario `src/leader.rs` is built for: the leader is cut off from the API server while
/// a standby waits. The cut-off leader must stop before the standby starts.
#[tokio::test]
async fn a_leader_cut_off_from_the_api_server_steps_down_before_another_leads() {
    use ballast::leader::{LeaderElector, LeaseTimings, Lost};
    let c = cluster().await;
    let ns = TestNamespace::new(&c, "partition").await;
    let (direct, partition, cut_off) = configs_through(&c).await;
    let timings = LeaseTimings::for_duration(Duration::from_secs(6));
    // A plain client, without the manager's request deadline: the elector alone must bound
    // its calls.
    let a = LeaderElector::new(
        kube::Client::try_from(cut_off).unwrap(),
        &ns.name,
        "lease",
        "a",
        timings.clone(),
    );
    let b = LeaderElector::new(
        kube::Client::try_from(direct).unwrap(),
        &ns.name,
        "lease",
        "b",
        timings,
    );
    let renewed = tokio::time::timeout(Duration::from_secs(30), a.acquire())
        .await
        .expect("a leads");
    let a_holds = async {
        let lost = a.hold(renewed).await;
        (lost, std::time::Instant::now())
    };
    let b_acquires = async {
        b.acquire().await;
        std::time::Instant::now()
    };
    let cut_at = async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        partition.cut();
        std::time::Instant::now()
    };
    let ((lost, a_stopped), b_started, cut_at) = tokio::time::timeout(
        Duration::from_secs(60),
        futures::future::join3(a_holds, b_acquires, cut_at),
    )
    .await
    .expect("a steps down and b takes over");
    assert_eq!(lost, Lost::Deadline);
    assert!(
        a_stopped < b_started,
        "a stopped {:?} after the cut, b started {:?} after it: two leaders at once",
        a_stopped - cut_at,
        b_started.saturating_duration_since(cut_at)
    );
    eprintln!(
        "cut-off leader stopped {:?} after the cut, the standby took over {:?} after it",
        a_stopped - cut_at,
        b_started - cut_at
    );
}

/// Evidence for `src/leader.rs` keeping its own election: the same scenario with
/// kube-lease-manager. It passes while the crate lets a cut-off leader go on leading after
/// another took the Lease; when it fails, the crate steps down and can replace our module.
#[tokio::test]
async fn kube_lease_manager_keeps_leading_while_cut_off_from_the_api_server() {
    use kube_lease_manager::LeaseManagerBuilder;
    let c = cluster().await;
    let ns = TestNamespace::new(&c, "klm").await;
    let (direct, partition, cut_off) = configs_through(&c).await;
    let metrics = ballast::metrics::Metrics::default();
    // Fair to the crate: its calls get the manager's request deadline, so they fail instead
    // of hanging.
    let cut_off_client = ballast::client::build(cut_off, &metrics, Duration::from_secs(3)).unwrap();
    let manager = |client: kube::Client, id: &str| {
        LeaseManagerBuilder::new(client, "lease")
            .with_namespace(ns.name.clone())
            .with_identity(id)
            .with_duration(6)
            .with_grace(2)
            .build()
    };
    let a = manager(cut_off_client, "a").await.unwrap();
    let (mut a_leads, a_task) = a.watch().await;
    tokio::time::timeout(Duration::from_secs(30), a_leads.wait_for(|l| *l))
        .await
        .expect("a leads")
        .unwrap();
    let b = manager(kube::Client::try_from(direct).unwrap(), "b")
        .await
        .unwrap();
    let (mut b_leads, b_task) = b.watch().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    partition.cut();
    let cut_at = std::time::Instant::now();
    tokio::time::timeout(Duration::from_secs(60), b_leads.wait_for(|l| *l))
        .await
        .expect("b takes the expired Lease")
        .unwrap();
    let b_started = cut_at.elapsed();
    let a_still_leads = *a_leads.borrow();
    let stepped_down = tokio::time::timeout(Duration::from_secs(20), a_leads.wait_for(|l| !*l))
        .await
        .is_ok();
    eprintln!(
        "kube-lease-manager: b leads {b_started:?} after the cut; a still says it leads then: \
         {a_still_leads}; a stepped down within 20 s more: {stepped_down}"
    );
    a_task.abort();
    b_task.abort();
    assert!(
        a_still_leads && !stepped_down,
        "kube-lease-manager now steps down when cut off: src/leader.rs can switch to it"
    );
}

/// Granted to the manager for a feature the flows below do not reach, each with that feature.
/// A rule here must still be granted; a rule granted and neither used nor listed here fails.
const REQUIRED_BY_FEATURE: &[(&str, &str, &str, &str)] = &[
    (
        "events.k8s.io",
        "events",
        "patch",
        "kube-runtime's Recorder sends an Event repeated within its cache time as a series: a patch of the first",
    ),
    (
        "",
        "pods/eviction",
        "create",
        "SpreadPolicy rebalance evicts pods of a skewed workload; tests/spread_rebalance.rs runs it under this ClusterRole",
    ),
];

/// (group, resource, verb) of every rule in an RBAC YAML file of `config/rbac`.
fn granted_in(file: &str) -> std::collections::BTreeSet<(String, String, String)> {
    let text = std::fs::read_to_string(support::repo_root().join("config/rbac").join(file))
        .expect("reading an RBAC file");
    let doc: serde_json::Value = serde_yaml::from_str(&text).expect("RBAC YAML");
    let mut out = std::collections::BTreeSet::new();
    for rule in doc["rules"].as_array().expect("rules") {
        let strings = |k: &str| -> Vec<String> {
            rule[k]
                .as_array()
                .unwrap_or(&Vec::new())
                .iter()
                .map(|v| v.as_str().expect("a string").to_string())
                .collect()
        };
        // A rule narrowed by resourceNames is checked by (group, resource, verb) like any
        // other: the requests that use it name those objects.
        assert!(
            rule.get("nonResourceURLs").is_none(),
            "{file}: a rule this test cannot check: {rule}"
        );
        for g in strings("apiGroups") {
            for r in strings("resources") {
                for v in strings("verbs") {
                    assert!(
                        !g.contains('*') && !r.contains('*') && !v.contains('*'),
                        "{file}: wildcard in {rule}"
                    );
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

/// (group, resource, verb, code) of each request `ballast_api_requests_total` counted.
fn requests_in(metrics: &str) -> Vec<(String, String, String, String)> {
    support::api_requests(metrics)
        .into_iter()
        .map(|((verb, group, resource, code), _)| (group, resource, verb, code))
        .collect()
}

/// Runs the real manager, under the ServiceAccount and RBAC of `config/`, through both
/// controllers' flows (a SpreadPolicy writing to a Deployment and a StatefulSet and removed; a
/// RolloutStrategy whose failing, ignored pre hook runs over two revisions, is pruned, and which
/// is deleted), then compares every request it made with what its ClusterRole and leader
/// election Role grant.
#[tokio::test]
async fn every_permission_the_manager_is_granted_is_used() {
    use support::rollout::{Env, adopt, job_hook};
    // `auto` reads the revision gate's policy and binding.
    let env = Env::with_args("rbac", &["--gate=auto"]).await;
    let ns = env.ns.name.clone();

    // SpreadPolicy: terms into a Deployment and a StatefulSet, then the policy is removed.
    env.apply(
        r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, labels: {tier: db}}
spec:
  replicas: 1
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: db, image: registry.example/db:1}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: api, labels: {tier: db}}
spec:
  replicas: 1
  selector: {matchLabels: {app: api}}
  template:
    metadata: {labels: {app: api}}
    spec: {containers: [{name: api, image: registry.example/api:1}]}
---
apiVersion: ballast.dev/v1alpha1
kind: SpreadPolicy
metadata: {name: db-zones}
spec:
  selector: {matchLabels: {tier: db}}
  scaleDown: Balanced
  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Preferred}]
"#,
    );
    wait_until(
        "the policy applied to both workloads",
        Duration::from_secs(60),
        || async {
            let out = env.c.kubectl(&[
                "get",
                "spol",
                "db-zones",
                "-n",
                &ns,
                "-o",
                "jsonpath={.status.applied}",
            ]);
            (String::from_utf8_lossy(&out.stdout).trim() == "2").then_some(())
        },
    )
    .await;
    // scaleDown: Balanced puts a deletion cost on the Deployment's pod (a pod patch).
    wait_until("the api pod's deletion cost", Duration::from_secs(60), || async {
        let out = env.c.kubectl(&[
            "get", "pods", "-n", &ns, "-l", "app=api", "-o",
            "jsonpath={.items[*].metadata.annotations.controller\\.kubernetes\\.io/pod-deletion-cost}",
        ]);
        (String::from_utf8_lossy(&out.stdout).trim() == "-1").then_some(())
    })
    .await;
    env.c
        .kubectl_ok(&["delete", "spol", "db-zones", "-n", &ns, "--timeout=60s"]);

    // ClusterSpreadPolicy: its finalizer and status (patches), then deleted.
    let cspol = format!("rbac-{}", support::random_suffix());
    env.c.kubectl_ok(&[
        "label",
        "namespace",
        &ns,
        &format!("ballast.dev/test-rbac={cspol}"),
    ]);
    env.apply(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: ClusterSpreadPolicy\nmetadata: {{name: {cspol}}}\nspec:\n  namespaceSelector: {{matchLabels: {{ballast.dev/test-rbac: {cspol}}}}}\n  selector: {{matchLabels: {{tier: db}}}}\n  spread: [{{topologyKey: kubernetes.io/hostname, mode: Preferred}}]\n"
    ));
    wait_until(
        "the cluster policy applied",
        Duration::from_secs(60),
        || async {
            let out = env
                .c
                .kubectl(&["get", "cspol", &cspol, "-o", "jsonpath={.status.applied}"]);
            (String::from_utf8_lossy(&out.stdout).trim() == "2").then_some(())
        },
    )
    .await;
    env.c
        .kubectl_ok(&["delete", "cspol", &cspol, "--timeout=60s"]);

    // RolloutStrategy: a failing pre hook (its log is read), ignored, over two revisions, so
    // that the first revision's Job is pruned; then the strategy is deleted.
    let stable = adopt(
        &env,
        1,
        &format!(
            "  hookHistoryLimit: 1\n  pre: [{{name: migrate, failurePolicy: Ignore, job: {}}}]\n",
            job_hook("m:1", "1s", true)
        ),
    )
    .await;
    env.set_image("web", "web:2").await;
    let s = env.wait_succeeded_after("web", &stable, 90).await;
    let second = s.current_revision.clone().unwrap();
    env.set_image("web", "web:3").await;
    env.wait_succeeded_after("web", &second, 90).await;
    let jobs = env.jobs();
    wait_until(
        "the first revision's Job pruned",
        Duration::from_secs(30),
        || async {
            let n = jobs.list(&Default::default()).await.ok()?.items.len();
            (n == 1).then_some(())
        },
    )
    .await;
    env.c
        .kubectl_ok(&["delete", "rost", "web", "-n", &ns, "--timeout=60s"]);

    let (_, metrics) = env.op.http_get("/metrics").await.expect("/metrics answers");
    // What each watch received is counted: every watch above saw objects come (listed or
    // applied), and the deletions of the policy and of the pruned Job went through theirs.
    let received = |watch: &str, event: &str| support::watch_events(&metrics, watch, Some(event));
    for watch in [
        "spread-policy/deployments",
        "spread-policy/statefulsets",
        "spread-policy/pods",
        "spread-policy/nodes",
        "spread-policy/spreadpolicies",
        "spread-policy/clusterspreadpolicies",
        "rollout-strategy/rolloutstrategies",
        "rollout-strategy/deployments",
        "rollout-strategy/replicasets",
        "rollout-strategy/jobs",
        "rollout-strategy/pods",
    ] {
        assert!(
            received(watch, "list") + received(watch, "apply") > 0.0,
            "no object counted for the watch {watch}:\n{metrics}"
        );
    }
    for watch in ["spread-policy/spreadpolicies", "rollout-strategy/jobs"] {
        assert!(
            received(watch, "delete") > 0.0,
            "no deletion counted for the watch {watch}:\n{metrics}"
        );
    }
    let requests = requests_in(&metrics);
    let forbidden: Vec<_> = requests.iter().filter(|r| r.3 == "403").collect();
    assert!(forbidden.is_empty(), "refused by RBAC: {forbidden:?}");
    let used: std::collections::BTreeSet<(String, String, String)> = requests
        .iter()
        .filter(|(_, resource, ..)| !resource.starts_with('/'))
        .map(|(g, r, v, _)| (g.clone(), r.clone(), v.clone()))
        .collect();
    let mut granted = granted_in("role.yaml");
    granted.extend(granted_in("leader_election_role.yaml"));

    let named: std::collections::BTreeSet<(String, String, String)> = REQUIRED_BY_FEATURE
        .iter()
        .map(|(g, r, v, _)| (g.to_string(), r.to_string(), v.to_string()))
        .collect();
    let stale: Vec<_> = named.difference(&granted).collect();
    assert!(
        stale.is_empty(),
        "REQUIRED_BY_FEATURE names rules that are not granted: {stale:?}"
    );
    let unused: Vec<_> = granted
        .iter()
        .filter(|g| !used.contains(*g) && !named.contains(*g))
        .collect();
    assert!(
        unused.is_empty(),
        "granted, but nothing the manager did used it, and no feature in REQUIRED_BY_FEATURE \
         needs it: {unused:?}\nused: {used:?}"
    );
    let ungranted: Vec<_> = used.difference(&granted).collect();
    assert!(
        ungranted.is_empty(),
        "used, but not granted by config/rbac (allowed by some other binding): {ungranted:?}"
    );
    eprintln!("every granted permission was used or is named: used {used:?}");
}
