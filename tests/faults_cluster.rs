//! The fault scenarios that disturb the control plane itself, F5 (kube-apiserver restarted and
//! kube-controller-manager stopped during a rollout) and F6 (the documented uninstall during a
//! pre hook). Restarting the API server and deleting the CRDs would break every test running
//! beside them, so they run on a cluster of their own: this target starts it with
//! hack/cluster-up.sh in `target/faults-cluster` on ports of its own, and stops it at the end.
//! A plain `cargo test` runs it beside everything else (it disturbs only its own cluster);
//! hack/test.sh skips it in the main run and gives it a phase of its own, so that two clusters
//! never share the machine's two cores: `cargo test --test faults_cluster`. Like
//! tests/faults.rs, each scenario records its row of the fault table before the test asserts.
//! See docs/reliability.md.
//!
//! Overrides: `BALLAST_FAULTS_CLUSTER_DIR`, `BALLAST_FAULTS_APISERVER_PORT` (17443),
//! `BALLAST_FAULTS_ETCD_PORT` (17379), `BALLAST_FAULTS_ETCD_PEER_PORT` (17380),
//! `BALLAST_FAULTS_KCM_PORT` (17257), `BALLAST_FAULTS_SCHEDULER_PORT` (17259),
//! `BALLAST_FAULTS_KWOK_PORT` (17247); `BALLAST_FAULTS_KEEP_CLUSTER=1` leaves it running.

mod support;

use ballast::api::{HookPhase, RolloutPhase};
use futures::StreamExt;
use k8s_openapi::api::{apps::v1::Deployment, batch::v1::Job, core::v1::Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;
use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};
use support::faults::{Row, record};
use support::rollout::*;
use support::{Cluster, Operator, own_cluster, wait_until};

/// The cluster's state directory and the hack/ scripts' port variables, with this target's
/// defaults (none of them the shared cluster's, and all below Linux's ephemeral range,
/// 32768-60999, where any outgoing connection of the tests may hold a port for a moment).
fn own_cluster_config() -> (PathBuf, Vec<(String, String)>) {
    let dir = std::env::var_os("BALLAST_FAULTS_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::repo_root().join("target/faults-cluster"));
    let ports = [
        ("APISERVER", 17443),
        ("ETCD", 17379),
        ("ETCD_PEER", 17380),
        ("KCM", 17257),
        ("SCHEDULER", 17259),
        ("KWOK", 17247),
    ]
    .iter()
    .map(|(what, default)| {
        let port = std::env::var(format!("BALLAST_FAULTS_{what}_PORT"))
            .unwrap_or_else(|_| default.to_string());
        (format!("BALLAST_{what}_PORT"), port)
    })
    .collect();
    (dir, ports)
}

/// Stops the cluster when the test ends, however it ends.
struct StopOnDrop(Cluster);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if std::env::var_os("BALLAST_FAULTS_KEEP_CLUSTER").is_some() {
            eprintln!(
                "keeping the cluster in {} (hack/cluster-down.sh with BALLAST_CLUSTER_DIR stops it)",
                self.0.dir.display()
            );
            return;
        }
        self.0.stop();
    }
}

/// One scenario: its row of the fault table and what it checks.
struct Scenario {
    id: &'static str,
    fault: &'static str,
    checked: &'static str,
}

const F5: Scenario = Scenario {
    id: "F5",
    fault: "kube-apiserver restarted and kube-controller-manager stopped for longer than the Deployment's progressDeadlineSeconds (ProgressDeadlineExceeded meanwhile), during Rolling",
    checked: "no failure or rollback (status, phases seen, Events); the revision succeeds after; one Job and one successful attempt of the hook; never two hook pods Running; no new pod before the hook passed; the new template and replica count; released unpaused",
};

const F6: Scenario = Scenario {
    id: "F6",
    fault: "the documented uninstall (CRs, then the rest) during PreHook, and of an Idle strategy",
    checked: "CRs deleted within the timeout with the operator running; the revision gate removed before the CRDs; both Deployments unpaused with the user's last template and replica count; no pod of the new template before the uninstall; hook Jobs and pods garbage-collected; CRDs gone; Deployments writable and not paused afterwards",
};

const F16: Scenario = Scenario {
    id: "F16",
    fault: "an API server that does not serve MutatingAdmissionPolicy (runtime-config and admission plugin off), manager with --gate=auto",
    checked: "the manager falls back to pause-at-rest and says so (log line with the reason, ballast_gate metric, status.gate); the Deployment is kept paused at rest; a new template runs its pre hook before its first pod; a Deployment created after its strategy (unlabelled: no gate) adopted within 45 s; the governed label a user takes away put back within 30 s",
};

/// Records the scenario's row (a panic inside it is a failure too) and returns its failures.
fn outcome(s: &Scenario, run: Result<Vec<String>, tokio::task::JoinError>) -> Vec<String> {
    let failures = match run {
        Ok(f) => f,
        Err(e) => {
            let msg = match e.try_into_panic() {
                Ok(p) => p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into()),
                Err(e) => e.to_string(),
            };
            vec![format!("panicked: {msg}")]
        }
    };
    record(&Row {
        id: s.id,
        fault: s.fault,
        runs: 1,
        passed: u32::from(failures.is_empty()),
        checked: s.checked,
    });
    failures
}

fn check(failures: &mut Vec<String>, ok: bool, what: impl Into<String>) {
    if !ok {
        failures.push(what.into());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outages_and_uninstall_on_a_cluster_of_their_own() {
    let (dir, ports) = own_cluster_config();
    assert!(
        dir != support::repo_root().join(".cluster") && ports.iter().all(|(_, p)| p != "16443"),
        "this target restarts the API server: never on the shared cluster"
    );
    // Two runs in one checkout would share the directory, and one would stop the other's
    // cluster: the second waits.
    let lock = std::fs::File::create(dir.with_extension("lock")).expect("creating the lock file");
    lock.lock().expect("locking the cluster's directory");
    let started = Instant::now();
    let c = match tokio::spawn(async move { own_cluster(&dir, &ports).await }).await {
        Ok(c) => c,
        Err(e) => {
            // The table shows both scenarios failed, then the test fails with the reason.
            outcome(&F5, Err(e));
            outcome(&F6, Ok(vec!["the cluster could not be started".into()]));
            panic!(
                "the cluster of F5 and F6 could not be started (see F5's row and the output above)"
            );
        }
    };
    let _stop = StopOnDrop(c.clone());
    eprintln!("own cluster up in {:?}", started.elapsed());
    // One after the other: F6 deletes the CRDs F5 needs. A panic in one is recorded, and the
    // other still runs.
    let f5 = outcome(&F5, tokio::spawn(f5_control_plane_outage(c.clone())).await);
    let f6 = outcome(
        &F6,
        tokio::spawn(f6_uninstall_during_pre_hook(c.clone())).await,
    );
    let f16 = outcome(&F16, tokio::spawn(f16_no_admission_api(c.clone())).await);
    eprintln!("faults_cluster took {:?}", started.elapsed());
    assert!(
        f5.is_empty() && f6.is_empty() && f16.is_empty(),
        "F5: {f5:#?}\nF6: {f6:#?}\nF16: {f16:#?}"
    );
}

/// Runs a hack/cluster-ctl.sh action off the async workers.
async fn ctl(c: &Cluster, action: &'static str, component: &'static str) {
    let c = c.clone();
    tokio::task::spawn_blocking(move || c.ctl(action, component))
        .await
        .unwrap();
}

/// What a sampler saw over the whole scenario.
#[derive(Default, Debug)]
struct Seen {
    most_hook_pods_running: usize,
    phases: Vec<RolloutPhase>,
    deadline_exceeded: bool,
}

/// Samples, every 200 ms until `stop`: hook pods Running at once and the strategy's phases;
/// reads that fail (the API server is down) are skipped. And watches (so that no update is
/// missed) whether the Deployment controller ever wrote `ProgressDeadlineExceeded`.
fn sample(client: Client, ns: String, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Seen> {
    tokio::spawn(async move {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
        let exceeded = Arc::new(AtomicBool::new(false));
        let deadline_exceeded = |d: Deployment| {
            d.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.reason.as_deref() == Some("ProgressDeadlineExceeded"))
        };
        let watch = {
            let exceeded = exceeded.clone();
            let deployments = deployments.clone();
            let config = watcher::Config::default().fields("metadata.name=web");
            tokio::spawn(async move {
                let mut events = watcher(deployments, config)
                    .default_backoff()
                    .applied_objects()
                    .boxed();
                while let Some(d) = events.next().await {
                    let Ok(d) = d else { continue };
                    if deadline_exceeded(d) {
                        exceeded.store(true, Ordering::Relaxed);
                    }
                }
            })
        };
        let strategies: Api<ballast::api::RolloutStrategy> = Api::namespaced(client, &ns);
        let lp = ListParams::default().labels("ballast.dev/hook");
        let mut seen = Seen::default();
        while !stop.load(Ordering::Relaxed) {
            if let Ok(list) = pods.list(&lp).await {
                let running = list
                    .items
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count();
                seen.most_hook_pods_running = seen.most_hook_pods_running.max(running);
            }
            if let Ok(Some(phase)) = strategies
                .get("web")
                .await
                .map(|s| s.status.and_then(|s| s.phase))
                && seen.phases.last() != Some(&phase)
            {
                seen.phases.push(phase);
            }
            // Read too: after the API server's restart the watch reconnects with a backoff that
            // can outlast the condition (written at 16 s, overwritten when the
            // controller-manager is back at 25 s).
            if let Ok(d) = deployments.get("web").await
                && deadline_exceeded(d)
            {
                exceeded.store(true, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        watch.abort();
        seen.deadline_exceeded = exceeded.load(Ordering::Relaxed);
        seen
    })
}

/// F5. The Deployment's own progress deadline is 15 s and kube-controller-manager stays away
/// 25 s, the Deployment marked `ProgressDeadlineExceeded` meanwhile; the strategy keeps its
/// default deadline (600 s), which the outage does not reach.
async fn f5_control_plane_outage(c: Cluster) -> Vec<String> {
    let mut env = Env::on(c.clone(), "f5-outage").await;
    let replicas = 6;
    // Slow enough (one surge pod at a time, each available 3 s after it is ready) that the
    // rollout is still under way when the outage begins.
    let yaml = deployment_yaml("web", "web:1", replicas, false, ROLLING).replace(
        "  replicas: 6\n",
        "  replicas: 6\n  minReadySeconds: 3\n  progressDeadlineSeconds: 15\n",
    );
    env.apply(&yaml);
    wait_until("web available", Duration::from_secs(60), || async {
        let s = env.deployment("web").await.status?;
        (s.available_replicas == Some(replicas) && s.updated_replicas == Some(replicas))
            .then_some(())
    })
    .await;
    env.apply(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {name: web}\nspec:\n  targetRef: {name: web}\n  pre: [{name: migrate, container: {from: app, command: [migrate]}}]\n",
    );
    let stable = env
        .wait_phase("web", RolloutPhase::Idle, None, 30)
        .await
        .stable_revision
        .unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(env.client(), env.ns.name.clone(), stop.clone());
    env.set_image("web", "web:2").await;
    let rolling = env.wait_phase("web", RolloutPhase::Rolling, None, 60).await;
    let hook_done = rolling
        .hooks
        .iter()
        .find(|h| h.name == "migrate")
        .and_then(|h| h.finish_time.clone());

    // The outage: the controller-manager stops first, so that nothing moves; the API server
    // restarts while it is away; it comes back once it has been away for 25 s.
    let outage = Instant::now();
    ctl(&c, "stop", "kube-controller-manager").await;
    ctl(&c, "restart", "kube-apiserver").await;
    let apiserver_back = outage.elapsed();
    // Once back, the Deployment controller does not reliably find its deadline passed (its
    // ReplicaSet controller records progress first), so the condition it writes when it does
    // is written here while it is away, for the operator to see mid-rollout.
    tokio::time::sleep(Duration::from_secs(16).saturating_sub(outage.elapsed())).await;
    let now = jiff::Timestamp::now().to_string();
    env.deployments()
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"status": {"conditions": [{
                "type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded",
                "message": "ReplicaSet has timed out progressing.",
                "lastUpdateTime": now, "lastTransitionTime": now,
            }]}})),
        )
        .await
        .expect("writing ProgressDeadlineExceeded");
    // A manager that lost its Lease while the API server was away has exited; its Deployment's
    // pod would be restarted, and so is the process here. It sees the condition mid-rollout
    // before the controller-manager comes back.
    let mut restarts = 0;
    if !env.op.is_running() {
        restarts += 1;
        env.op = Operator::start(&env.c, &env.ns.name);
    }
    wait_until(
        "the operator leading again",
        Duration::from_secs(60),
        || async { env.op.logs().contains("starting controllers").then_some(()) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    tokio::time::sleep(Duration::from_secs(25).saturating_sub(outage.elapsed())).await;
    ctl(&c, "start", "kube-controller-manager").await;
    let kcm_away = outage.elapsed();

    let deadline = Instant::now() + Duration::from_secs(240);
    let end = loop {
        if !env.op.is_running() {
            restarts += 1;
            env.op = Operator::start(&env.c, &env.ns.name);
        }
        if let Ok(Some(s)) = env
            .strategies()
            .get_opt("web")
            .await
            .map(|s| s.and_then(|s| s.status))
        {
            let done = s.phase == Some(RolloutPhase::Succeeded)
                && s.stable_revision.as_deref() != Some(stable.as_str());
            let failed = matches!(
                s.phase,
                Some(RolloutPhase::Failed | RolloutPhase::RolledBack)
            );
            if done || failed {
                break Some(s);
            }
        }
        if Instant::now() > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    stop.store(true, Ordering::Relaxed);
    let seen = sampler.await.unwrap();
    eprintln!(
        "F5: API server back after {apiserver_back:?}; controller-manager away {kcm_away:?}; \
         operator restarts: {restarts}; Deployment had ProgressDeadlineExceeded: {}; \
         phases: {:?}",
        seen.deadline_exceeded, seen.phases
    );

    let mut failures = vec![];
    check(
        &mut failures,
        seen.deadline_exceeded,
        "the Deployment showed ProgressDeadlineExceeded mid-rollout",
    );
    let Some(s) = end else {
        failures.push(format!(
            "the revision did not end within 240 s of the outage; status: {:#?}\noperator log tail:\n{}",
            env.status("web").await,
            tail(&env.op.logs(), 40)
        ));
        return failures;
    };
    check(
        &mut failures,
        s.phase == Some(RolloutPhase::Succeeded),
        format!(
            "the revision succeeded, not {:?}: {:?}\noperator log tail:\n{}",
            s.phase,
            s.message,
            tail(&env.op.logs(), 40)
        ),
    );
    check(
        &mut failures,
        !seen
            .phases
            .iter()
            .any(|p| matches!(p, RolloutPhase::Failed | RolloutPhase::RolledBack)),
        format!("never Failed or RolledBack: {:?}", seen.phases),
    );
    for reason in ["HookFailed", "RolloutFailed", "RolledBack"] {
        let events = env.events(reason).await;
        check(
            &mut failures,
            events.is_empty(),
            format!(
                "no {reason} Event: {:?}",
                events.iter().map(|e| &e.message).collect::<Vec<_>>()
            ),
        );
    }
    let jobs = env.all_jobs().await;
    let migrate = job_of(&jobs, "migrate");
    check(
        &mut failures,
        migrate.len() == 1,
        format!("one migrate Job ({})", migrate.len()),
    );
    check(
        &mut failures,
        s.hooks.len() == 1 && s.hooks[0].phase == HookPhase::Succeeded && s.hooks[0].attempt == 1,
        format!("one successful attempt of the hook: {:?}", s.hooks),
    );
    check(
        &mut failures,
        seen.most_hook_pods_running <= 1,
        format!(
            "at most one hook pod Running ({})",
            seen.most_hook_pods_running
        ),
    );
    let rss = env.replica_sets().await;
    let new_rs = rs_of_image(&rss, "web:2").and_then(|r| r.metadata.creation_timestamp.clone());
    check(
        &mut failures,
        matches!((&hook_done, &new_rs), (Some(h), Some(r)) if r.0 >= h.0),
        format!("the new ReplicaSet ({new_rs:?}) after the hook passed ({hook_done:?})"),
    );
    let d = env.deployment("web").await;
    let st = d.status.clone().unwrap_or_default();
    check(
        &mut failures,
        image_of(&d) == "web:2"
            && d.spec.as_ref().unwrap().replicas == Some(replicas)
            && st.updated_replicas == Some(replicas)
            && st.available_replicas == Some(replicas),
        format!(
            "web:2 x {replicas} rolled out: {} x {:?}, {st:?}",
            image_of(&d),
            d.spec.as_ref().unwrap().replicas
        ),
    );
    // At rest a governed Deployment is held paused (the gate of the next revision); deleting
    // the strategy releases it.
    env.strategies()
        .delete("web", &Default::default())
        .await
        .unwrap();
    let api = env.strategies();
    let gone = tokio::time::timeout(
        Duration::from_secs(60),
        wait_until("the strategy gone", Duration::from_secs(60), || async {
            api.get_opt("web").await.ok()?.is_none().then_some(())
        }),
    )
    .await;
    check(
        &mut failures,
        gone.is_ok(),
        "the strategy's deletion finished",
    );
    check(&mut failures, !env.paused("web").await, "released unpaused");
    failures
}

/// F6. The documented uninstall (docs/reliability.md "Uninstalling", `make undeploy`) while one
/// strategy's pre hook runs and another strategy is Idle: the CRs are deleted first, with the
/// operator running, and waited for; then the operator stops (here a process, in a cluster
/// the manager's Deployment that `config/default` removes) and the rest of `config/default`,
/// CRDs included, is deleted. The hook Jobs are owned by their strategy, so the garbage
/// collector deletes them (and their pods) once it is gone: none may be left.
async fn f6_uninstall_during_pre_hook(c: Cluster) -> Vec<String> {
    let mut env = Env::on(c.clone(), "f6-uninstall").await;
    // An Idle strategy on `api`.
    env.apply(&deployment_yaml("api", "api:1", 2, false, ROLLING));
    wait_available(&env, "api", 2).await;
    env.apply(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {name: api}\nspec:\n  targetRef: {name: api}\n  pre: [{name: check, container: {from: app}}]\n",
    );
    env.wait_phase("api", RolloutPhase::Idle, None, 30).await;
    // `web` in PreHook, its hook running for 10 minutes.
    adopt(
        &env,
        3,
        &format!(
            "  pre: [{{name: migrate, job: {}}}]\n",
            job_hook("m:1", "600s", false)
        ),
    )
    .await;
    env.set_image("web", "web:2").await;
    env.wait_status("web", "migrate running", 60, |s| {
        s.phase == Some(RolloutPhase::PreHook) && running(s, "migrate")
    })
    .await;
    let mut failures = vec![];
    check(
        &mut failures,
        env.paused("web").await && env.paused("api").await != env.admission(),
        "web paused by its pre hook before the uninstall (api at rest: paused only without the revision gate)",
    );
    check(
        &mut failures,
        rs_of_image(&env.replica_sets().await, "web:2").is_none(),
        "no pod of web:2 while its pre hook runs",
    );

    // Step 1: the CRs, with the operator running.
    let took = Instant::now();
    let kubectl = env.c.clone();
    let out = tokio::task::spawn_blocking(move || {
        kubectl.kubectl(&[
            "delete",
            "rolloutstrategies.ballast.dev,spreadpolicies.ballast.dev,clusterspreadpolicies.ballast.dev",
            "--all",
            "--all-namespaces",
            "--ignore-not-found",
            "--wait",
            "--timeout=180s",
        ])
    })
    .await
    .unwrap();
    let took = took.elapsed();
    check(
        &mut failures,
        out.status.success(),
        format!(
            "the CRs deleted within 180 s (after {took:?}): {}\noperator log tail:\n{}",
            String::from_utf8_lossy(&out.stderr),
            tail(&env.op.logs(), 30)
        ),
    );
    let left = env.c.kubectl(&[
        "get",
        "rolloutstrategies.ballast.dev,spreadpolicies.ballast.dev,clusterspreadpolicies.ballast.dev",
        "--all-namespaces",
        "-o",
        "name",
    ]);
    let left = String::from_utf8_lossy(&left.stdout).trim().to_string();
    check(
        &mut failures,
        left.is_empty(),
        format!("no CR left: {left}"),
    );

    // Step 2: the manager stops, the revision gate goes, then the rest.
    let status = env.op.terminate();
    check(
        &mut failures,
        status.is_some_and(|s| s.success()),
        format!("the operator exited cleanly: {status:?}"),
    );
    let out = env.c.kubectl(&[
        "delete",
        "mutatingadmissionpolicybindings,mutatingadmissionpolicies,validatingadmissionpolicybindings,validatingadmissionpolicies",
        "-l",
        "app.kubernetes.io/part-of=ballast,app.kubernetes.io/component=admission",
        "--ignore-not-found",
    ]);
    check(
        &mut failures,
        out.status.success(),
        format!(
            "the revision gate deleted: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    );
    let kubectl = env.c.clone();
    let out = tokio::task::spawn_blocking(move || {
        kubectl.kubectl(&[
            "delete",
            "-k",
            "config/default",
            "--ignore-not-found",
            "--timeout=180s",
        ])
    })
    .await
    .unwrap();
    check(
        &mut failures,
        out.status.success(),
        format!(
            "kubectl delete -k config/default: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    );
    let crds = env.c.kubectl(&["get", "crd", "-o", "name"]);
    let crds = String::from_utf8_lossy(&crds.stdout).to_string();
    check(
        &mut failures,
        !crds.contains("ballast.dev"),
        format!("the CRDs gone: {crds}"),
    );

    for (name, image, replicas) in [("web", "web:2", 3), ("api", "api:1", 2)] {
        let d = env.deployment(name).await;
        let spec = d.spec.as_ref().unwrap();
        check(
            &mut failures,
            spec.paused != Some(true),
            format!("{name} not left paused"),
        );
        check(
            &mut failures,
            image_of(&d) == image && spec.replicas == Some(replicas),
            format!(
                "{name} keeps the user's last template and replicas: {} x {:?}",
                image_of(&d),
                spec.replicas
            ),
        );
    }
    // Released, web rolls out the user's template (without its pre hook: nothing governs it).
    let api = env.deployments();
    let rolled = tokio::time::timeout(
        Duration::from_secs(60),
        wait_until("web:2 rolled out", Duration::from_secs(60), || async {
            let s = api.get("web").await.ok()?.status?;
            (s.updated_replicas == Some(3) && s.available_replicas == Some(3)).then_some(())
        }),
    )
    .await;
    check(
        &mut failures,
        rolled.is_ok(),
        "web:2 rolled out once released",
    );
    // Uninstalled in that order, the cluster's Deployments are writable and never paused.
    let out = env.c.kubectl(&[
        "set",
        "image",
        "deployment/api",
        "app=api:2",
        "-n",
        &env.ns.name,
    ]);
    let d = env.deployment("api").await;
    check(
        &mut failures,
        out.status.success() && d.spec.as_ref().unwrap().paused != Some(true),
        format!(
            "after the uninstall a template change is accepted and not paused: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    );

    let jobs: Api<Job> = env.jobs();
    let pods: Api<Pod> = Api::namespaced(env.client(), &env.ns.name);
    let lp = ListParams::default().labels("ballast.dev/hook");
    let collected = tokio::time::timeout(
        Duration::from_secs(60),
        wait_until(
            "hook Jobs and pods gone",
            Duration::from_secs(60),
            || async {
                let j = jobs.list(&lp).await.ok()?.items.len();
                let p = pods.list(&lp).await.ok()?.items.len();
                (j == 0 && p == 0).then_some(())
            },
        ),
    )
    .await;
    if collected.is_err() {
        let names = |items: Vec<String>| items.join(", ");
        let j = jobs.list(&lp).await.map(|l| {
            names(
                l.items
                    .iter()
                    .map(|j| {
                        format!(
                            "{} active={:?}",
                            j.metadata.name.clone().unwrap_or_default(),
                            j.status.as_ref().and_then(|s| s.active)
                        )
                    })
                    .collect(),
            )
        });
        failures.push(format!(
            "hook Jobs and pods garbage-collected within 60 s; left: {j:?}"
        ));
    }
    failures
}

/// F16. A cluster whose API server does not serve MutatingAdmissionPolicy (older clusters, or
/// the API turned off): `--gate=auto` must not believe in a gate that cannot exist. Runs after
/// F6 uninstalled everything: the API server restarts with the API off, `config/local` is
/// applied (its admission objects are refused: their kinds do not exist), the manager starts
/// with `--gate=auto`, and the whole pause-at-rest model is checked on the cluster's truth.
async fn f16_no_admission_api(c: Cluster) -> Vec<String> {
    let mut failures = vec![];
    // Both, as on a cluster without the feature: with the API off but the plugin on, the API
    // server never gets ready (the plugin waits for a cache of a kind it does not serve).
    let off = "--runtime-config=admissionregistration.k8s.io/v1/mutatingadmissionpolicies=false --disable-admission-plugins=MutatingAdmissionPolicy";
    {
        let c = c.clone();
        tokio::task::spawn_blocking(move || c.ctl_with("restart", "kube-apiserver", off))
            .await
            .unwrap();
    }
    let kinds = c.kubectl(&["api-resources", "--api-group=admissionregistration.k8s.io"]);
    let kinds = String::from_utf8_lossy(&kinds.stdout).to_string();
    check(
        &mut failures,
        !kinds.contains("mutatingadmissionpolicies"),
        format!("the API is off: {kinds}"),
    );
    // Everything but the gate, which this API server cannot take.
    c.kubectl(&["apply", "--server-side", "-k", "config/crd"]);
    c.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/rolloutstrategies.ballast.dev",
    ]);
    let _ = c.kubectl(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-k",
        "config/local",
    ]);
    c.forget_operator_kubeconfig();

    let ns = support::TestNamespace::new(&c, "f16-no-gate").await;
    let op = Operator::start_with(
        &c,
        &ns.name,
        &format!("ballast-{}", ns.name),
        &["--gate=auto"],
    );
    let env = Env {
        op,
        c: c.clone(),
        ns,
    };
    env.apply(&deployment_yaml("web", "web:1", 2, false, ROLLING));
    wait_available(&env, "web", 2).await;
    env.apply(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {{name: web}}\nspec:\n  targetRef: {{name: web}}\n  pre: [{{name: migrate, job: {}}}]\n",
        job_hook("m:1", "3s", false)
    ));
    let s = env.wait_phase("web", RolloutPhase::Idle, None, 60).await;
    check(
        &mut failures,
        s.gate == Some(ballast::api::Gate::PauseAtRest),
        format!("status.gate PauseAtRest: {:?}", s.gate),
    );
    let logs = env.op.logs();
    check(
        &mut failures,
        logs.contains("falling back to pause-at-rest") && logs.contains("does not serve"),
        format!("a log line says why:\n{}", tail(&logs, 15)),
    );
    let metrics = env
        .op
        .http_get("/metrics")
        .await
        .map(|m| m.1)
        .unwrap_or_default();
    check(
        &mut failures,
        metrics.contains(r#"ballast_gate{mode="pause-at-rest"} 1"#),
        "ballast_gate{mode=\"pause-at-rest\"} 1",
    );
    let paused = tokio::time::timeout(
        Duration::from_secs(20),
        wait_until("paused at rest", Duration::from_secs(20), || async {
            env.paused("web").await.then_some(())
        }),
    )
    .await;
    check(&mut failures, paused.is_ok(), "kept paused at rest");
    let stable = s.stable_revision.clone().unwrap_or_default();
    env.set_image("web", "web:2").await;
    let s = env.wait_succeeded_after("web", &stable, 90).await;
    let jobs = env.all_jobs().await;
    let done = job_completed(
        &jobs,
        "migrate",
        s.current_revision.as_deref().unwrap_or_default(),
    );
    let rss = env.replica_sets().await;
    let created = rs_of_image(&rss, "web:2").map(|r| ts(&r.metadata.creation_timestamp));
    check(
        &mut failures,
        matches!((done, created), (Some(d), Some(r)) if r >= d - jiff::SignedDuration::from_secs(1)),
        format!("the pre hook ({done:?}) before the new ReplicaSet ({created:?})"),
    );

    // With no gate, nothing labels a Deployment created after its strategy, and the manager
    // watches only Deployments labelled governed: the strategy finds it by looking afresh
    // (`observe::Looks`, 10 s after the look that did not find it), not by the resync of 5
    // minutes.
    env.apply(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {name: late}\nspec:\n  targetRef: {name: late}\n",
    );
    env.wait_status("late", "Deployment not found", 30, |s| {
        s.message
            .as_deref()
            .is_some_and(|m| m.contains("not found"))
    })
    .await;
    env.apply(&deployment_yaml("late", "late:1", 1, false, ROLLING));
    let created = std::time::Instant::now();
    let adopted = tokio::time::timeout(
        Duration::from_secs(45),
        wait_until("late adopted", Duration::from_secs(45), || async {
            let s = env.strategies().get("late").await.ok()?.status?;
            s.stable_revision.is_some().then_some(())
        }),
    )
    .await;
    let d = env.deployment("late").await;
    check(
        &mut failures,
        adopted.is_ok()
            && d.labels().get("ballast.dev/governed").map(String::as_str) == Some("true")
            && d.spec.as_ref().and_then(|s| s.paused) == Some(true),
        format!(
            "a Deployment created after its strategy adopted (labelled, paused at rest) within 45 s: after {:?}, labels {:?}, paused {:?}",
            created.elapsed(),
            d.labels(),
            d.spec.as_ref().and_then(|s| s.paused)
        ),
    );
    // A user takes the label away: the Deployment leaves the watch, its strategy looks afresh
    // and labels it again.
    c.kubectl_ok(&[
        "label",
        "deployment",
        "web",
        "ballast.dev/governed-",
        "-n",
        &env.ns.name,
    ]);
    let relabelled = tokio::time::timeout(
        Duration::from_secs(30),
        wait_until("web labelled again", Duration::from_secs(30), || async {
            let d = env.deployments().get("web").await.ok()?;
            d.labels()
                .contains_key("ballast.dev/governed")
                .then_some(())
        }),
    )
    .await;
    check(
        &mut failures,
        relabelled.is_ok() && env.paused("web").await,
        "the governed label a user took away put back within 30 s, the Deployment still paused at rest",
    );
    failures
}
