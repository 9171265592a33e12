//! The revision gate (issue 14) against the real local control plane: the MutatingAdmissionPolicy
//! of `config/admission` pauses a governed Deployment in the write that creates a new revision,
//! so `kubectl rollout restart/undo`, `set image`, `apply` and a GitOps server-side apply each run
//! the hooks before the first pod of the revision, while an ungoverned Deployment is never
//! touched; the hold refuses a user's resume while hooks run; the Deployment says who governs
//! it; `--gate=auto` falls back to pause-at-rest when the gate is not installed; and the wait
//! recipe of docs/rollout-strategy.md never passes on the previous revision's `Ready`.
//!
//! These tests choose the mode themselves (`--gate=admission` or `auto`), whatever
//! `BALLAST_TEST_GATE` says.

mod support;

use ballast::api::{Gate, RolloutPhase};
use k8s_openapi::api::{apps::v1::ReplicaSet, batch::v1::Job};
use kube::{
    ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use std::time::{Duration, Instant};
use support::rollout::*;
use support::{Operator, wait_until};

/// A namespace and an operator for it with `--gate=<gate>` (and `extra`).
async fn env_with(prefix: &str, gate: &str, extra: &[&str]) -> Env {
    let mut args = vec![format!("--gate={gate}")];
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Env::with_args(prefix, &args).await
}

/// The pre hook of [`STRATEGY`], as [`adopt`] takes it.
const MIGRATE: &str = "  pre: [{name: migrate, container: {from: app, command: [migrate]}}]\n";

const STRATEGY: &str = r#"
apiVersion: ballast.dev/v1alpha1
kind: RolloutStrategy
metadata: {name: web}
spec:
  targetRef: {name: web}
  pre: [{name: migrate, container: {from: app, command: [migrate]}}]
"#;

async fn rs_names(env: &Env) -> Vec<String> {
    env.replica_sets()
        .await
        .iter()
        .map(|r| r.name_any())
        .collect()
}

/// When the container of the newest pod of hook `hook`'s Jobs for `revision` finished.
async fn hook_finished(env: &Env, hook: &str, revision: &str) -> jiff::Timestamp {
    let jobs: Vec<Job> = env.all_jobs().await;
    let job = jobs_of_revision(&jobs, hook, revision)
        .into_iter()
        .max_by_key(|j| j.metadata.creation_timestamp.clone())
        .unwrap_or_else(|| panic!("a Job of hook {hook} for revision {revision}"))
        .name_any();
    pod_finished(env, &job)
        .await
        .unwrap_or_else(|| panic!("the pod of {job} finished"))
}

/// Adopts `web` (web:1 x `replicas`) under [`STRATEGY`] with a manager in pause-at-rest mode,
/// and waits until it says so and holds the Deployment paused at rest.
async fn adopted_paused_at_rest(env: &Env, replicas: i32) {
    adopt(env, replicas, MIGRATE).await;
    assert_eq!(env.status("web").await.gate, Some(Gate::PauseAtRest));
    wait_until("paused at rest", Duration::from_secs(20), || async {
        env.paused("web").await.then_some(())
    })
    .await;
}

/// Runs one revision started by `change` (a kubectl command) end to end and checks the cluster's
/// truth: the command works, the Deployment is paused by the gate in that write, the pre hook's
/// pod finished before the revision's ReplicaSet was created, and at rest it is unpaused again.
/// Returns the new revision.
async fn revision_by(env: &Env, what: &str, change: &[&str]) -> String {
    let stable = env.status("web").await.stable_revision.unwrap();
    let before = rs_names(env).await;
    let out = env.c.kubectl(change);
    assert!(
        out.status.success(),
        "{what}: kubectl {} failed: {}",
        change.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    // The gate paused it in the same write: no ReplicaSet of the revision exists now.
    let d = env.deployment("web").await;
    assert_eq!(
        d.spec.as_ref().unwrap().paused,
        Some(true),
        "{what}: paused by the gate in the write itself"
    );
    let s = env.wait_succeeded_after("web", &stable, 90).await;
    let rev = s.current_revision.clone().unwrap();
    let rss: Vec<ReplicaSet> = env.replica_sets().await;
    let new: Vec<&ReplicaSet> = rss
        .iter()
        .filter(|r| !before.contains(&r.name_any()))
        .collect();
    assert!(
        new.len() <= 1,
        "{what}: one new ReplicaSet at most: {:?}",
        new.iter().map(|r| r.name_any()).collect::<Vec<_>>()
    );
    if let Some(rs) = new.first() {
        let created = ts(&rs.metadata.creation_timestamp);
        let finished = hook_finished(env, "migrate", &rev).await;
        // creationTimestamp has one-second resolution.
        assert!(
            finished <= created + jiff::SignedDuration::from_secs(1),
            "{what}: the pre hook finished at {finished}, the ReplicaSet was created at {created}"
        );
    }
    wait_until(
        &format!("{what}: unpaused at rest"),
        Duration::from_secs(20),
        || async { (!env.paused("web").await).then_some(()) },
    )
    .await;
    rev
}

#[tokio::test]
async fn kubectl_rollout_restart_undo_set_image_apply_and_gitops_apply_each_run_the_hooks() {
    let env = env_with("rgate-tools", "admission", &[]).await;
    adopt(&env, 2, MIGRATE).await;
    assert_eq!(env.status("web").await.gate, Some(Gate::Admission));
    assert!(!env.paused("web").await, "not paused at rest");
    let ns = env.ns.name.clone();

    let r1 = revision_by(
        &env,
        "rollout restart",
        &["rollout", "restart", "deployment/web", "-n", &ns],
    )
    .await;
    let r2 = revision_by(
        &env,
        "rollout undo",
        &["rollout", "undo", "deployment/web", "-n", &ns],
    )
    .await;
    assert_ne!(r1, r2);
    revision_by(
        &env,
        "set image",
        &["set", "image", "deployment/web", "app=web:2", "-n", &ns],
    )
    .await;

    // kubectl apply (client side) of a changed manifest.
    let path = env.c.dir.join(format!("rgate-{ns}.yaml"));
    std::fs::write(&path, deployment_yaml("web", "web:3", 2, false, ROLLING)).unwrap();
    let file = path.to_string_lossy().to_string();
    revision_by(&env, "kubectl apply", &["apply", "-n", &ns, "-f", &file]).await;

    // A GitOps tool's server-side apply (Argo CD's field manager), with a new image.
    std::fs::write(
        &path,
        deployment_yaml("web", "web:4", 2, false, ROLLING).replace("  paused: false\n", ""),
    )
    .unwrap();
    let gitops = [
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=argocd-controller",
        "-n",
        &ns,
        "-f",
        &file,
    ];
    revision_by(&env, "server-side apply", &gitops).await;
    // The same manifest again changes nothing: no revision, no pause.
    let generation = env.deployment("web").await.metadata.generation;
    env.c.kubectl_ok(&gitops);
    let d = env.deployment("web").await;
    assert_eq!(
        d.metadata.generation, generation,
        "a no-op apply is a no-op"
    );
    assert_ne!(d.spec.as_ref().unwrap().paused, Some(true));
    let _ = std::fs::remove_file(&path);

    // A scale is not a revision: never paused.
    env.c
        .kubectl_ok(&["scale", "deployment/web", "--replicas=3", "-n", &ns]);
    assert_ne!(env.deployment("web").await.spec.unwrap().paused, Some(true));
    wait_available(&env, "web", 3).await;

    // The Deployment tells the story: who governs it, in which phase, and the Events.
    let d = env.deployment("web").await;
    assert_eq!(
        d.annotations()
            .get("ballast.dev/rollout-strategy")
            .map(String::as_str),
        Some("web")
    );
    assert_eq!(
        d.labels()
            .get("ballast.dev/rollout-phase")
            .map(String::as_str),
        Some("Succeeded")
    );
    assert!(!d.annotations().contains_key("ballast.dev/rollout-phase"));
    // The phase is a label: `kubectl get -L` shows it.
    let listed = env.c.kubectl_ok(&[
        "get",
        "deployment/web",
        "-n",
        &ns,
        "-L",
        "ballast.dev/rollout-phase",
    ]);
    assert!(listed.contains("Succeeded"), "{listed}");
    let described = env.c.kubectl_ok(&["describe", "deployment/web", "-n", &ns]);
    for needle in [
        "ballast.dev/rollout-strategy: web",
        "RolloutStarted",
        "RolloutSucceeded",
    ] {
        assert!(
            described.contains(needle),
            "kubectl describe deploy shows {needle}:\n{described}"
        );
    }
}

/// The labels that keep the gate's cost off ungoverned Deployments (config/admission): the
/// governed Deployment carries `ballast.dev/governed` and keeps it, each strategy is marked
/// `ballast.dev/target-governed` once its Deployment is labelled or absent, so no strategy is
/// left for the binding that sees every update of the namespace; and none of that opens a gap:
/// a Deployment created after its strategy, deleted and created again, or replaced without the
/// label still has every revision gated, and deleting the strategy takes it all away.
#[tokio::test]
async fn governed_deployments_are_labelled_strategies_marked_and_every_revision_still_gated() {
    let env = env_with("rgate-label", "admission", &[]).await;
    let ns = env.ns.name.clone();
    let label = |d: &k8s_openapi::api::apps::v1::Deployment| {
        d.labels().get("ballast.dev/governed").cloned()
    };
    let unmarked = || {
        env.c.kubectl_ok(&[
            "get",
            "rolloutstrategies",
            "-n",
            &ns,
            "-l",
            "!ballast.dev/target-governed",
            "-o",
            "name",
        ])
    };
    adopt(&env, 2, MIGRATE).await;
    assert_eq!(label(&env.deployment("web").await).as_deref(), Some("true"));
    // Deployment and strategy in the same gate shard, the shard bindings' (config/admission).
    let shard = ballast::controller::rollout_strategy::gate::shard_of("web");
    let shard_of_deployment = |d: &k8s_openapi::api::apps::v1::Deployment| {
        d.labels().get("ballast.dev/gate-shard").cloned()
    };
    assert_eq!(
        shard_of_deployment(&env.deployment("web").await),
        Some(shard.clone())
    );
    wait_until(
        "the strategy labelled with its Deployment's gate shard",
        Duration::from_secs(20),
        || async {
            let got = env.c.kubectl_ok(&[
                "get",
                "rolloutstrategy/web",
                "-n",
                &ns,
                "-o",
                "jsonpath={.metadata.labels.ballast\\.dev/gate-shard}",
            ]);
            (got.trim() == shard).then_some(())
        },
    )
    .await;
    // Another shard set by hand is undone by the gate in that same write.
    let other = if shard == "0" { "1" } else { "0" };
    env.c.kubectl_ok(&[
        "label",
        "deployment/web",
        &format!("ballast.dev/gate-shard={other}"),
        "--overwrite",
        "-n",
        &ns,
    ]);
    assert_eq!(
        shard_of_deployment(&env.deployment("web").await),
        Some(shard.clone())
    );
    // A strategy whose Deployment does not exist yet: marked too (only a create can make it).
    env.apply(&STRATEGY.replace("name: web}", "name: later}"));
    wait_until(
        "both strategies marked",
        Duration::from_secs(20),
        || async { unmarked().trim().is_empty().then_some(()) },
    )
    .await;

    // Created after its strategy: paused and labelled in its create; hooks before the first pod.
    env.apply(
        &deployment_yaml("later", "later:1", 1, false, ROLLING).replace("  paused: false\n", ""),
    );
    let d = env.deployment("later").await;
    assert_eq!(
        d.spec.as_ref().unwrap().paused,
        Some(true),
        "created paused"
    );
    assert_eq!(label(&d).as_deref(), Some("true"), "labelled in its create");
    env.wait_phase("later", RolloutPhase::Succeeded, None, 60)
        .await;

    // A label dropped by hand comes back in the same write.
    env.c.kubectl_ok(&[
        "label",
        "deployment/web",
        "ballast.dev/governed-",
        "-n",
        &ns,
    ]);
    assert_eq!(label(&env.deployment("web").await).as_deref(), Some("true"));

    // `kubectl replace` of a manifest without the label and with a new image: gated.
    let path = env.c.dir.join(format!("rgate-{ns}.yaml"));
    std::fs::write(&path, deployment_yaml("web", "web:2", 2, false, ROLLING)).unwrap();
    let file = path.to_string_lossy().to_string();
    revision_by(
        &env,
        "kubectl replace",
        &["replace", "-n", &ns, "-f", &file],
    )
    .await;
    assert_eq!(label(&env.deployment("web").await).as_deref(), Some("true"));
    let _ = std::fs::remove_file(&path);

    // Deleted and created again while its strategy stays marked: gated by the create.
    env.c
        .kubectl_ok(&["delete", "deployment/web", "-n", &ns, "--wait=true"]);
    assert!(unmarked().trim().is_empty(), "still marked: {}", unmarked());
    let stable = env.status("web").await.stable_revision.unwrap();
    env.apply(&deployment_yaml("web", "web:3", 2, false, ROLLING).replace("  paused: false\n", ""));
    let d = env.deployment("web").await;
    assert_eq!(
        d.spec.as_ref().unwrap().paused,
        Some(true),
        "created again, paused"
    );
    assert!(
        rs_of_image(&env.replica_sets().await, "web:3").is_none(),
        "no ReplicaSet of the new Deployment before its pre hooks"
    );
    let s = env.wait_succeeded_after("web", &stable, 90).await;
    let rev = s.current_revision.unwrap();
    let rs = rs_of_image(&env.replica_sets().await, "web:3")
        .expect("the ReplicaSet of web:3")
        .clone();
    let finished = hook_finished(&env, "migrate", &rev).await;
    assert!(finished <= ts(&rs.metadata.creation_timestamp) + jiff::SignedDuration::from_secs(1));

    // The strategy deleted: the Deployment is let go, unlabelled and unannotated.
    env.c
        .kubectl_ok(&["delete", "rolloutstrategy/web", "-n", &ns, "--wait=true"]);
    let d = env.deployment("web").await;
    assert_eq!(label(&d), None, "{:?}", d.labels());
    assert!(!d.labels().contains_key("ballast.dev/rollout-phase"));
    assert_eq!(shard_of_deployment(&d), None);
    assert!(!d.annotations().contains_key("ballast.dev/rollout-strategy"));
    assert_ne!(d.spec.as_ref().unwrap().paused, Some(true));
    // And its template changes are no longer paused.
    env.c
        .kubectl_ok(&["set", "image", "deployment/web", "app=web:4", "-n", &ns]);
    assert_ne!(env.deployment("web").await.spec.unwrap().paused, Some(true));
}

/// Before the operator has ever seen a strategy (it is down, or a moment after the strategy's
/// creation), the strategy is not marked `ballast.dev/target-governed`, and the binding for
/// unlabelled Deployments gates its existing Deployment: nothing depends on the operator.
#[tokio::test]
async fn with_no_operator_a_new_strategy_gates_its_existing_deployment() {
    let c = support::cluster().await;
    // No operator starts here to install config/default: the gate and the CRDs come from it.
    c.install();
    let ns = support::TestNamespace::new(&c, "rgate-down").await;
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(c.client.clone(), &ns.name);
    c.apply_yaml(
        &ns.name,
        &deployment_yaml("web", "web:1", 1, false, ROLLING),
    );
    c.apply_yaml(&ns.name, STRATEGY);
    let d = deployments.get("web").await.unwrap();
    assert!(
        d.labels().get("ballast.dev/governed").is_none(),
        "nobody labelled it"
    );
    assert_ne!(d.spec.as_ref().unwrap().paused, Some(true));
    for image in ["app=web:2", "app=web:3"] {
        c.kubectl_ok(&["set", "image", "deployment/web", image, "-n", &ns.name]);
        let d = deployments.get("web").await.unwrap();
        assert_eq!(
            d.spec.as_ref().unwrap().paused,
            Some(true),
            "{image}: paused"
        );
        assert_eq!(
            d.labels().get("ballast.dev/governed").map(String::as_str),
            Some("true"),
            "{image}: labelled by the gate"
        );
        // And in the phase the manager will take it up in, which binds the revision hold.
        assert_eq!(
            d.labels()
                .get("ballast.dev/rollout-phase")
                .map(String::as_str),
            Some("PreHook"),
            "{image}: labelled PreHook by the gate"
        );
    }
    // No ReplicaSet of either new template: both wait for the operator.
    let rss: kube::Api<ReplicaSet> = kube::Api::namespaced(c.client.clone(), &ns.name);
    let rss = rss.list(&Default::default()).await.unwrap().items;
    assert!(rs_of_image(&rss, "web:2").is_none() && rs_of_image(&rss, "web:3").is_none());

    // Mid hooks only: a Recreate Deployment is held (they run with no pod of either
    // revision), a rolling update is not (its mid hook pauses it at its point).
    for (name, strategy, held) in [("batch", "{type: Recreate}", true), ("api", ROLLING, false)] {
        c.apply_yaml(
            &ns.name,
            &deployment_yaml(name, "web:1", 1, false, strategy),
        );
        c.apply_yaml(
            &ns.name,
            &format!(
                "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {{name: {name}}}\nspec:\n  targetRef: {{name: {name}}}\n  mid: [{{name: schema, at: 1, container: {{from: app}}}}]\n"
            ),
        );
        c.kubectl_ok(&[
            "set",
            "image",
            &format!("deployment/{name}"),
            "app=web:2",
            "-n",
            &ns.name,
        ]);
        let d = deployments.get(name).await.unwrap();
        assert_eq!(
            d.spec.as_ref().unwrap().paused == Some(true),
            held,
            "{name} ({strategy}): paused by the gate"
        );
        // No pre hooks, so no PreHook label from the gate; a revision it lets through is
        // labelled Rolling, the phase the manager takes it up in (no write of its own).
        assert_eq!(
            d.labels()
                .get("ballast.dev/rollout-phase")
                .map(String::as_str),
            (!held).then_some("Rolling"),
            "{name}: the phase label from the gate"
        );
    }
    // The gate's Rolling label never overrides a phase written on purpose, nor one that holds
    // a revision (the hold must stay bound until the manager takes the new revision up), and a
    // paused Deployment is not rolling.
    let phase = |d: &k8s_openapi::api::apps::v1::Deployment| {
        d.labels().get("ballast.dev/rollout-phase").cloned()
    };
    for (label, image, want) in [
        // Set by the write itself (Rolling before it, from the gate).
        (None, "app=web:3", "Succeeded"),
        // Holding before the write.
        (Some("MidHook"), "app=web:4", "MidHook"),
    ] {
        if let Some(l) = label {
            c.kubectl_ok(&[
                "label",
                "--overwrite",
                "deployment/api",
                &format!("ballast.dev/rollout-phase={l}"),
                "-n",
                &ns.name,
            ]);
        }
        let patch = format!(
            r#"{{"metadata":{{"labels":{{"ballast.dev/rollout-phase":"{want}"}}}},"spec":{{"template":{{"spec":{{"containers":[{{"name":"app","image":"{}"}}]}}}}}}}}"#,
            image.trim_start_matches("app=")
        );
        c.kubectl_ok(&["patch", "deployment/api", "-n", &ns.name, "-p", &patch]);
        let d = deployments.get("api").await.unwrap();
        assert_eq!(phase(&d).as_deref(), Some(want), "{image}: kept {want}");
    }
    c.kubectl_ok(&["rollout", "pause", "deployment/api", "-n", &ns.name]);
    c.kubectl_ok(&[
        "label",
        "--overwrite",
        "deployment/api",
        "ballast.dev/rollout-phase=Succeeded",
        "-n",
        &ns.name,
    ]);
    c.kubectl_ok(&[
        "set",
        "image",
        "deployment/api",
        "app=web:5",
        "-n",
        &ns.name,
    ]);
    let d = deployments.get("api").await.unwrap();
    assert_eq!(
        phase(&d).as_deref(),
        Some("Succeeded"),
        "paused: not rolling"
    );
}

/// The hold in `WaitingExternal` (a webhook hook answered 202 Accepted) refuses a user's resume
/// only while the waiting hook of the current revision is a pre or mid hook: at a post hook the
/// revision is rolled out and its Deployment unpaused. No operator: the status is written by the
/// test, so each case is exactly the one named.
#[tokio::test]
async fn the_hold_refuses_a_resume_while_a_pre_or_mid_webhook_waits_for_its_engine_only() {
    let c = support::cluster().await;
    c.install();
    let ns = support::TestNamespace::new(&c, "rgate-xhold").await;
    c.apply_yaml(
        &ns.name,
        &deployment_yaml("web", "web:1", 1, false, ROLLING),
    );
    c.apply_yaml(
        &ns.name,
        r#"
apiVersion: ballast.dev/v1alpha1
kind: RolloutStrategy
metadata: {name: web}
spec:
  targetRef: {name: web}
  pre: [{name: ticket, webhook: {service: {name: engine, port: 8443}}}]
  mid: [{name: canary, at: 50%, webhook: {service: {name: engine, port: 8443}}}]
  post: [{name: notify, webhook: {service: {name: engine, port: 8443}}}]
"#,
    );
    let status = |hooks: serde_json::Value| {
        let patch = json!({"status": {
            "phase": "WaitingExternal", "currentRevision": "bbbbbbbbbb", "hooks": hooks,
        }});
        c.kubectl_ok(&[
            "patch",
            "rolloutstrategy/web",
            "-n",
            &ns.name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch.to_string(),
        ]);
    };
    let waiting = |name: &str, point: &str, revision: &str| {
        json!({"name": name, "point": point, "revision": revision, "attempt": 1,
               "phase": "Waiting", "httpStatus": 202})
    };
    let passed = |name: &str, point: &str| {
        json!({"name": name, "point": point, "revision": "bbbbbbbbbb", "attempt": 1,
               "phase": "Succeeded", "httpStatus": 200})
    };
    // The gate pauses the new revision; each case tries to resume it.
    let resume = |image: &str| {
        c.kubectl_ok(&[
            "set",
            "image",
            "deployment/web",
            &format!("app={image}"),
            "-n",
            &ns.name,
        ]);
        c.kubectl(&["rollout", "resume", "deployment/web", "-n", &ns.name])
    };
    for (case, hooks, image) in [
        (
            "pre",
            json!([waiting("ticket", "Pre", "bbbbbbbbbb")]),
            "web:2",
        ),
        (
            "mid",
            json!([
                passed("ticket", "Pre"),
                waiting("canary", "Mid", "bbbbbbbbbb")
            ]),
            "web:3",
        ),
    ] {
        status(hooks);
        let out = resume(image);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{case}: the resume is refused");
        assert!(
            err.contains("held by RolloutStrategy web") && err.contains("(phase WaitingExternal)"),
            "{case}: the refusal says why: {err}"
        );
    }
    for (case, hooks, image) in [
        (
            "post",
            json!([
                passed("ticket", "Pre"),
                passed("canary", "Mid"),
                waiting("notify", "Post", "bbbbbbbbbb")
            ]),
            "web:4",
        ),
        // A pre hook left Waiting by an earlier revision does not hold this one.
        (
            "another revision's pre",
            json!([
                waiting("ticket", "Pre", "aaaaaaaaaa"),
                waiting("notify", "Post", "bbbbbbbbbb")
            ]),
            "web:5",
        ),
    ] {
        status(hooks);
        let out = resume(image);
        assert!(
            out.status.success(),
            "{case}: the resume is let through: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `kubectl rollout pause` while a revision rolls out is the user's: ballast leaves the
/// Deployment paused and says who paused it, and goes on after `kubectl rollout resume`.
#[tokio::test]
async fn a_users_rollout_pause_while_rolling_is_left_alone_until_resumed() {
    let env = env_with("rgate-upause", "admission", &[]).await;
    let ns = env.ns.name.clone();
    let stable = adopt(&env, 4, MIGRATE).await;
    // Each new pod needs 5 s to count as available: a rollout of 4 takes about 20 s.
    env.c.kubectl_ok(&[
        "patch",
        "deployment/web",
        "-n",
        &ns,
        "--type=merge",
        "-p",
        r#"{"spec": {"minReadySeconds": 5}}"#,
    ]);
    env.c
        .kubectl_ok(&["set", "image", "deployment/web", "app=web:2", "-n", &ns]);
    env.wait_phase("web", RolloutPhase::Rolling, None, 60).await;
    // The operator writes Rolling one round before it unpauses; `kubectl rollout pause` of a
    // Deployment still paused fails ("already paused").
    wait_until("the revision let go", Duration::from_secs(20), || async {
        (!env.paused("web").await).then_some(())
    })
    .await;
    env.c
        .kubectl_ok(&["rollout", "pause", "deployment/web", "-n", &ns]);
    let s = env
        .wait_status("web", "pausedBy", 20, |s| s.paused_by.is_some())
        .await;
    assert_eq!(s.phase, Some(RolloutPhase::Rolling));
    assert_eq!(
        s.paused_by.as_deref(),
        Some("kubectl-rollout"),
        "{:?}",
        s.message
    );
    // It stays paused: ballast does not undo it.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(env.paused("web").await, "still paused");
    let updated = env.deployment("web").await.status.unwrap().updated_replicas;
    assert!(
        updated < Some(4),
        "the rollout stopped where it was paused: {updated:?}"
    );
    env.c
        .kubectl_ok(&["rollout", "resume", "deployment/web", "-n", &ns]);
    let s = env.wait_succeeded_after("web", &stable, 90).await;
    assert_eq!(s.paused_by, None);
    wait_available(&env, "web", 4).await;
}

#[tokio::test]
async fn a_strategy_applied_with_its_deployment_runs_the_pre_hooks_before_the_first_pod() {
    let env = env_with("rgate-first", "admission", &[]).await;
    // One apply, strategy first; the manifest does not say `paused`.
    env.apply(&format!(
        "{STRATEGY}\n---\n{}",
        deployment_yaml("web", "web:1", 2, false, ROLLING).replace("  paused: false\n", "")
    ));
    assert_eq!(
        env.deployment("web").await.spec.unwrap().paused,
        Some(true),
        "created paused by the gate"
    );
    assert!(env.replica_sets().await.is_empty(), "no ReplicaSet yet");
    let s = env
        .wait_phase("web", RolloutPhase::Succeeded, None, 60)
        .await;
    let rev = s.current_revision.unwrap();
    let rss = env.replica_sets().await;
    assert_eq!(rss.len(), 1);
    let created = ts(&rss[0].metadata.creation_timestamp);
    let finished = hook_finished(&env, "migrate", &rev).await;
    assert!(finished <= created + jiff::SignedDuration::from_secs(1));
    wait_available(&env, "web", 2).await;
    wait_until("unpaused at rest", Duration::from_secs(20), || async {
        (!env.paused("web").await).then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_ungoverned_deployment_is_never_paused_even_beside_a_strategy() {
    let env = env_with("rgate-free", "admission", &[]).await;
    // A strategy in the namespace, for another Deployment.
    env.apply(STRATEGY);
    env.apply(&deployment_yaml("free", "free:1", 1, false, ROLLING));
    wait_available(&env, "free", 1).await;
    for image in ["free:2", "free:3"] {
        env.c.kubectl_ok(&[
            "set",
            "image",
            "deployment/free",
            &format!("app={image}"),
            "-n",
            &env.ns.name,
        ]);
        let d = env.deployment("free").await;
        assert_ne!(d.spec.as_ref().unwrap().paused, Some(true), "{image}");
        wait_until("the new ReplicaSet", Duration::from_secs(20), || async {
            rs_of_image(&env.replica_sets().await, image).map(|_| ())
        })
        .await;
    }
    env.c
        .kubectl_ok(&["rollout", "restart", "deployment/free", "-n", &env.ns.name]);
    assert_ne!(
        env.deployment("free").await.spec.unwrap().paused,
        Some(true)
    );
    let free = env.deployment("free").await;
    assert!(
        free.annotations()
            .get("ballast.dev/rollout-strategy")
            .is_none()
    );
    assert!(free.labels().get("ballast.dev/governed").is_none());
}

#[tokio::test]
async fn a_users_resume_while_pre_hooks_run_is_refused_and_nothing_starts() {
    let env = env_with("rgate-hold", "admission", &[]).await;
    let stable = adopt(
        &env,
        2,
        &format!(
            "  pre: [{{name: migrate, job: {}}}]\n",
            job_hook("m:1", "8s", false)
        ),
    )
    .await;
    env.set_image("web", "web:2").await;
    env.wait_status("web", "migrate running", 30, |s| {
        s.phase == Some(RolloutPhase::PreHook) && running(s, "migrate")
    })
    .await;
    let out = env
        .c
        .kubectl(&["rollout", "resume", "deployment/web", "-n", &env.ns.name]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the resume is refused");
    assert!(
        err.contains("held by RolloutStrategy web") && err.contains("PreHook"),
        "the refusal says why: {err}"
    );
    // A merge patch that says `paused: false` is refused the same way.
    let refused = env
        .deployments()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(env.paused("web").await);
    assert!(rs_of_image(&env.replica_sets().await, "web:2").is_none());
    let s = env.wait_succeeded_after("web", &stable, 60).await;
    let finished = hook_finished(&env, "migrate", &s.current_revision.unwrap()).await;
    let rss = env.replica_sets().await;
    let created = ts(&rs_of_image(&rss, "web:2")
        .unwrap()
        .metadata
        .creation_timestamp);
    assert!(finished <= created + jiff::SignedDuration::from_secs(1));
}

#[tokio::test]
async fn the_wait_recipe_waits_for_this_revision_not_the_previous_ready() {
    let env = env_with("rgate-wait", "admission", &[]).await;
    adopt(
        &env,
        1,
        &format!(
            "  pre: [{{name: migrate, job: {}}}]\n",
            job_hook("m:1", "6s", false)
        ),
    )
    .await;
    let ns = env.ns.name.clone();
    // Ready is True now, for the revision at rest.
    env.c.kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        "rolloutstrategy/web",
        "-n",
        &ns,
        "--timeout=10s",
    ]);
    let changed = Instant::now();
    env.set_image("web", "web:2").await;
    let gen_at_change = env.deployment("web").await.metadata.generation.unwrap();
    // The recipe of docs/rollout-strategy.md, run right after the change, as a CI step would.
    let recipe = format!(
        r#"set -eu
gen=$(kubectl get deployment/web -n {ns} -o jsonpath='{{.metadata.generation}}')
for _ in $(seq 120); do
  seen=$(kubectl get rolloutstrategy/web -n {ns} -o jsonpath='{{.status.deploymentGeneration}}')
  [ "${{seen:-0}}" -ge "$gen" ] && break
  sleep 1
done
kubectl wait rolloutstrategy/web -n {ns} --for=condition=Ready --timeout=120s
"#
    );
    let run = || {
        std::process::Command::new("bash")
            .args(["-c", &recipe])
            .env("KUBECONFIG", &env.c.kubeconfig)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    env.c.kubectl.parent().unwrap().display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .output()
            .unwrap()
    };
    let out = run();
    let waited = changed.elapsed();
    assert!(
        out.status.success(),
        "the recipe: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = env.status("web").await;
    assert_eq!(
        s.phase,
        Some(RolloutPhase::Succeeded),
        "the recipe returned on this revision's end: {s:?}"
    );
    assert_ne!(s.stable_revision, None);
    let d = env.deployment("web").await;
    assert!(s.deployment_generation >= Some(gen_at_change), "{s:?}");
    assert_eq!(image_of(&d), "web:2");
    assert!(
        waited >= Duration::from_secs(5),
        "the recipe waited for the 6 s pre hook, not the previous Ready: {waited:?}"
    );
    // Run late (ballast's writes have moved the generation on since), it returns at once.
    let late = Instant::now();
    let out = run();
    assert!(
        out.status.success() && late.elapsed() < Duration::from_secs(10),
        "the recipe run late: {:?} {}",
        late.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn upgrading_from_pause_at_rest_unpauses_at_rest_and_hooks_the_next_revision() {
    let mut env = env_with("rgate-upgrade", "pause-at-rest", &[]).await;
    adopted_paused_at_rest(&env, 2).await;
    env.op.kill();
    env.op = Operator::start_with(
        &env.c,
        &env.ns.name,
        &format!("ballast-{}-2", env.ns.name),
        &["--gate=admission"],
    );
    env.wait_status("web", "the gate in status", 30, |s| {
        s.gate == Some(Gate::Admission)
    })
    .await;
    wait_until("unpaused at rest", Duration::from_secs(20), || async {
        (!env.paused("web").await).then_some(())
    })
    .await;
    revision_by(
        &env,
        "set image after the upgrade",
        &[
            "set",
            "image",
            "deployment/web",
            "app=web:2",
            "-n",
            &env.ns.name,
        ],
    )
    .await;
}

#[tokio::test]
async fn auto_falls_back_to_pause_at_rest_when_the_gate_is_not_installed_and_says_so() {
    // The shared cluster has the gate; a policy name that does not exist stands for a cluster
    // without it (e.g. a manager started without config/).
    let env = env_with(
        "rgate-auto",
        "auto",
        &["--gate-policy-name=ballast-no-such-gate"],
    )
    .await;
    adopted_paused_at_rest(&env, 1).await;
    let logs = env.op.logs();
    assert!(
        // (The manager's RBAC reads only the shipped name: here the read is refused, which
        // counts as not installed.)
        logs.contains("falling back to pause-at-rest") && logs.contains("ballast-no-such-gate"),
        "a log line says why:\n{}",
        tail(&logs, 20)
    );
    let (_, metrics) = env.op.http_get("/metrics").await.unwrap();
    assert!(
        metrics.contains(r#"ballast_gate{mode="pause-at-rest"} 1"#)
            && metrics.contains(r#"ballast_gate{mode="admission"} 0"#),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("ballast_gate"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // And with the real name, auto finds the gate installed.
    let env2 = env_with("rgate-auto2", "auto", &[]).await;
    adopt(&env2, 1, MIGRATE).await;
    assert_eq!(env2.status("web").await.gate, Some(Gate::Admission));
    let (_, metrics) = env2.op.http_get("/metrics").await.unwrap();
    assert!(metrics.contains(r#"ballast_gate{mode="admission"} 1"#));
}
