//! RolloutStrategy against the real local control plane: the Deployment, ReplicaSet and Job
//! controllers run, kwok plays the pods (Job pods complete after a few seconds; a pod labelled
//! `pod-container-running-failed.stage.kwok.x-k8s.io: "true"` fails with exit code 1), and the
//! operator runs as its own ServiceAccount under `config/rbac`.

mod support;

use ballast::api::{HookPhase, RolloutPhase, RolloutStrategyStatus};
use k8s_openapi::api::{apps::v1::ReplicaSet, batch::v1::Job};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::json;
use std::time::Duration;
use support::rollout::*;
use support::wait_until;

#[tokio::test]
async fn adoption_pauses_without_hooks_and_deletion_unpauses() {
    let env = Env::new("rost-adopt").await;
    env.apply(&deployment_yaml("web", "web:1", 2, false, ROLLING));
    wait_available(&env, "web", 2).await;
    env.apply(
        r#"
apiVersion: ballast.dev/v1alpha1
kind: RolloutStrategy
metadata: {name: web}
spec:
  targetRef: {name: web}
  pre: [{name: migrate, container: {from: app, command: [migrate]}}]
"#,
    );
    let s = env.wait_phase("web", RolloutPhase::Idle, None, 30).await;
    assert!(s.stable_revision.is_some());
    assert_eq!(s.stable_revision, s.current_revision);
    assert!(s.stable_template.is_some());
    assert_eq!(
        env.paused("web").await,
        !env.admission(),
        "adopted: paused at rest only without the revision gate"
    );
    assert!(env.all_jobs().await.is_empty(), "adoption runs no hook");

    env.strategies()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let api = env.strategies();
    wait_until("the strategy gone", Duration::from_secs(30), || async {
        api.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    assert!(!env.paused("web").await, "released Deployment is unpaused");
}

#[tokio::test]
async fn paused_new_deployment_runs_pre_hooks_before_its_first_pods() {
    let env = Env::new("rost-first").await;
    env.apply(
        r#"
apiVersion: ballast.dev/v1alpha1
kind: RolloutStrategy
metadata: {name: web}
spec:
  targetRef: {name: web}
  pre: [{name: migrate, container: {from: app, command: [migrate]}}]
"#,
    );
    // With the revision gate the manifest needs no `paused: true`: the gate pauses it on create.
    env.apply(&deployment_yaml(
        "web",
        "web:1",
        2,
        !env.admission(),
        ROLLING,
    ));
    let s = env
        .wait_phase("web", RolloutPhase::Succeeded, None, 60)
        .await;
    assert_eq!(s.hooks.len(), 1);
    assert_eq!(s.hooks[0].phase, HookPhase::Succeeded);
    let jobs = env.all_jobs().await;
    let migrate = job_of(&jobs, "migrate");
    assert_eq!(migrate.len(), 1);
    let done = ts(&migrate[0].status.as_ref().unwrap().completion_time);
    let rss = env.replica_sets().await;
    assert_eq!(rss.len(), 1);
    assert!(
        ts(&rss[0].metadata.creation_timestamp) >= done - jiff::SignedDuration::from_secs(1),
        "the first ReplicaSet appears only after the pre hook completed"
    );
    wait_until(
        "at rest as the gate mode wants it",
        Duration::from_secs(20),
        || async { (env.paused("web").await != env.admission()).then_some(()) },
    )
    .await;
    wait_available(&env, "web", 2).await;
}

#[tokio::test]
async fn image_change_runs_pre_then_mid_at_its_point_then_post() {
    let env = Env::new("rost-seq").await;
    env.apply(&deployment_yaml("web", "web:1", 4, false, ROLLING));
    wait_available(&env, "web", 4).await;
    env.apply(&format!(
        r#"
apiVersion: ballast.dev/v1alpha1
kind: RolloutStrategy
metadata: {{name: web}}
spec:
  targetRef: {{name: web}}
  pre: [{{name: migrate, container: {{from: app, command: [migrate]}}}}]
  mid: [{{name: smoke, at: 50%, job: {}}}]
  post: [{{name: purge, container: {{from: app, command: [purge]}}}}]
"#,
        job_hook("smoke:1", "3s", false)
    ));
    env.wait_phase("web", RolloutPhase::Idle, None, 30).await;
    env.set_image("web", "web:2").await;

    // Watch the whole sequence and check what must hold at each phase. The four reads are not
    // one snapshot: the hook may end, the operator unpause and the Deployment controller create
    // the new ReplicaSet between them. The operator records a hook's end in status before it
    // lets the Deployment go on, so what the status read *after* the Deployment and its
    // ReplicaSets still says held while they were read; only that is judged. (CI once read
    // PreHook, then a paused Deployment, then the new ReplicaSet of the unpause in between.)
    let mut seen = vec![];
    let (mut judged_pre, mut judged_mid) = (0, 0);
    let smoke_running = |s: &RolloutStrategyStatus| {
        s.phase == Some(RolloutPhase::MidHook)
            && s.hooks
                .iter()
                .any(|h| h.name == "smoke" && h.phase == HookPhase::Running)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "sequence did not finish: {seen:?}"
        );
        let s = env.status("web").await;
        let d = env.deployment("web").await;
        let rss = env.replica_sets().await;
        let after = env.status("web").await;
        let phase = s.phase.unwrap();
        for p in [phase, after.phase.unwrap()] {
            if seen.last() != Some(&p) {
                seen.push(p);
            }
        }
        let paused = d.spec.as_ref().unwrap().paused == Some(true);
        let new_rs = rs_of_image(&rss, "web:2");
        if phase == RolloutPhase::PreHook && after.phase == Some(RolloutPhase::PreHook) {
            judged_pre += 1;
            assert!(paused, "paused during pre hooks");
            assert!(
                new_rs.is_none(),
                "no ReplicaSet of the new revision during pre hooks: {:?} created at {:?}",
                new_rs.map(|r| r.name_any()),
                new_rs.map(|r| ts(&r.metadata.creation_timestamp)),
            );
        } else if smoke_running(&s) && smoke_running(&after) {
            judged_mid += 1;
            assert!(paused, "paused during the mid hook");
            let available = new_rs
                .and_then(|r| r.status.as_ref()?.available_replicas)
                .unwrap_or(0);
            assert!(available >= 2, "mid hook runs at 50% of 4: {available}");
        } else if after.phase == Some(RolloutPhase::Succeeded)
            && after.stable_revision == after.current_revision
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Both were judged many times (11 to 25 reads each in local runs): the smoke hook runs 3 s,
    // the migration about a second on kwok.
    assert!(
        judged_mid > 0,
        "the mid hook was judged while it ran: {seen:?}"
    );
    assert!(
        judged_pre > 0,
        "the pre hook was judged while it ran: {seen:?}"
    );
    for p in [
        RolloutPhase::PreHook,
        RolloutPhase::Rolling,
        RolloutPhase::MidHook,
        RolloutPhase::PostHook,
        RolloutPhase::Succeeded,
    ] {
        assert!(seen.contains(&p), "phase {p:?} was seen: {seen:?}");
    }
    let order: Vec<_> = seen.iter().filter(|p| **p != RolloutPhase::Idle).collect();
    assert_eq!(order.first(), Some(&&RolloutPhase::PreHook), "{seen:?}");

    let jobs = env.all_jobs().await;
    let rss = env.replica_sets().await;
    let new_rs = rs_of_image(&rss, "web:2").unwrap();
    let migrate = job_of(&jobs, "migrate")[0];
    let smoke = job_of(&jobs, "smoke")[0];
    let purge = job_of(&jobs, "purge")[0];
    let done = |j: &Job| ts(&j.status.as_ref().unwrap().completion_time);
    let created = |j: &Job| ts(&j.metadata.creation_timestamp);
    let slack = jiff::SignedDuration::from_secs(1);
    let rs_created = ts(&new_rs.metadata.creation_timestamp);
    // The migration's container had finished before the first pod of the
    // new revision could exist. (The pod's own finish time, not the Job's
    // completionTime, which the Job controller may stamp late under load.)
    let finished = pod_finished(&env, &migrate.name_any())
        .await
        .expect("the migrate pod finished");
    assert!(
        finished <= rs_created + slack,
        "migrate finished at {finished} but the new ReplicaSet was created at {rs_created}"
    );
    // creationTimestamps have one-second resolution: a mid hook created in
    // the same second as the ReplicaSet is equal, not earlier. (That the new
    // revision already had available pods during the hook is asserted above,
    // while it ran.)
    assert!(
        created(smoke) >= rs_created,
        "smoke created at {} vs ReplicaSet at {rs_created}",
        created(smoke)
    );
    assert!(
        created(purge) + slack >= done(smoke),
        "purge created at {} vs smoke done at {}",
        created(purge),
        done(smoke)
    );
    let d = env.deployment("web").await;
    assert_eq!(
        d.spec.as_ref().unwrap().paused.unwrap_or(false),
        !env.admission(),
        "paused again at rest only without the revision gate"
    );
    let st = d.status.unwrap();
    assert_eq!(st.updated_replicas, Some(4));
    assert_eq!(st.available_replicas, Some(4));
    for reason in [
        "RolloutStarted",
        "HookStarted",
        "HookSucceeded",
        "RolloutSucceeded",
    ] {
        env.wait_event(reason, |_| true).await;
    }
    let s = env.status("web").await;
    assert_eq!(s.hooks.len(), 3);
    assert!(s.hooks.iter().all(|h| h.phase == HookPhase::Succeeded));
    assert!(s.current_hook.is_none());
    let (code, metrics) = env.op.http_get("/metrics").await.expect("metrics served");
    assert_eq!(code, 200);
    for line in [
        "ballast_hook_runs_total{point=\"pre\",result=\"succeeded\"} 1",
        "ballast_hook_runs_total{point=\"mid\",result=\"succeeded\"} 1",
        "ballast_hook_runs_total{point=\"post\",result=\"succeeded\"} 1",
        "ballast_rollout_phase_transitions_total{phase=\"Succeeded\"} 1",
        "ballast_hook_duration_seconds_count{point=\"pre\",result=\"succeeded\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
    let out = env
        .c
        .kubectl_ok(&["get", "rolloutstrategies", "-n", &env.ns.name]);
    for col in [
        "TARGET",
        "PHASE",
        "HOOK",
        "REVISION",
        "UPDATED",
        "AGE",
        "Succeeded",
    ] {
        assert!(out.contains(col), "{out}");
    }
    // Each hook's start is an Event of its own, with its own message: the same reason on the
    // same object is not folded into the first one (as kube's Recorder alone would do).
    let started: Vec<String> = env
        .events("HookStarted")
        .await
        .into_iter()
        .filter_map(|e| e.message)
        .collect();
    for hook in ["migrate", "smoke", "purge"] {
        assert!(
            started.iter().any(|m| m.contains(&format!("hook {hook} "))),
            "a HookStarted Event names {hook}: {started:?}"
        );
    }
}

#[tokio::test]
async fn container_hooks_inherit_the_new_revision_and_jobs_are_named_owned_and_pruned() {
    let env = Env::new("rost-inherit").await;
    env.apply(&deployment_yaml("web", "web:1", 1, false, ROLLING));
    wait_available(&env, "web", 1).await;
    env.apply(
        r#"
apiVersion: ballast.dev/v1alpha1
kind: RolloutStrategy
metadata: {name: web}
spec:
  targetRef: {name: web}
  hookHistoryLimit: 1
  pre:
    - name: migrate
      serviceAccountName: default
      container: {from: app, command: [bin/migrate], args: [up], env: [{name: LOG_LEVEL, value: info}]}
"#,
    );
    env.wait_phase("web", RolloutPhase::Idle, None, 30).await;
    let from = env.status("web").await.stable_revision.unwrap();
    env.set_image("web", "web:2").await;
    let s = env.wait_succeeded_after("web", &from, 60).await;
    let rev = s.current_revision.clone().unwrap();
    let name = format!("web-migrate-{rev}-1");
    assert_eq!(s.hooks[0].job_name.as_deref(), Some(name.as_str()));
    let job = env.jobs().get(&name).await.unwrap();
    let labels = job.labels();
    assert_eq!(labels["ballast.dev/strategy"], "web");
    assert_eq!(labels["ballast.dev/hook"], "migrate");
    assert_eq!(labels["ballast.dev/revision"], rev);
    let owner = &job.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("RolloutStrategy", Some(true))
    );
    let spec = job.spec.clone().unwrap();
    assert_eq!(spec.backoff_limit, Some(0));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "regcred");
    assert_eq!(pod.service_account_name.as_deref(), Some("default"));
    let vols: Vec<_> = pod.volumes.unwrap().into_iter().map(|v| v.name).collect();
    assert_eq!(vols, ["config"]);
    let c = &pod.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some("web:2"),
        "the NEW revision's image"
    );
    assert_eq!(c.command, Some(vec!["bin/migrate".to_string()]));
    assert_eq!(c.args, Some(vec!["up".to_string()]));
    assert_eq!(c.working_dir.as_deref(), Some("/srv"));
    assert!(c.env_from.is_some());
    assert_eq!(c.volume_mounts.as_ref().unwrap()[0].mount_path, "/etc/app");
    assert!(c.resources.as_ref().unwrap().requests.is_some());
    assert_eq!(
        c.security_context.as_ref().unwrap().run_as_non_root,
        Some(true)
    );
    let env_of: std::collections::BTreeMap<String, String> = c
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect();
    assert_eq!(env_of["DB"], "pg");
    assert_eq!(env_of["LOG_LEVEL"], "info");
    assert_eq!(env_of["BALLAST_STRATEGY"], "web");
    assert_eq!(env_of["BALLAST_DEPLOYMENT"], "web");
    assert_eq!(env_of["BALLAST_HOOK"], "migrate");
    assert_eq!(env_of["BALLAST_HOOK_POINT"], "pre");
    assert_eq!(env_of["BALLAST_FROM_REVISION"], from);
    assert_eq!(env_of["BALLAST_TO_REVISION"], rev);
    assert_eq!(env_of["BALLAST_ATTEMPT"], "1");

    // A second revision: the first revision's Job is pruned (hookHistoryLimit 1).
    env.set_image("web", "web:3").await;
    let s2 = env.wait_succeeded_after("web", &rev, 60).await;
    assert_ne!(s2.current_revision, s.current_revision);
    let api = env.jobs();
    wait_until(
        "the old hook Job pruned",
        Duration::from_secs(20),
        || async {
            let jobs = api.list(&ListParams::default()).await.ok()?.items;
            (jobs.len() == 1 && jobs[0].name_any() != name).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn failed_pre_hook_rolls_back_and_leaves_old_pods_untouched() {
    let env = Env::new("rost-prefail").await;
    adopt(
        &env,
        2,
        &format!(
            "  onFailure: Rollback\n  pre: [{{name: migrate, job: {}}}]\n",
            job_hook("m:1", "1s", true)
        ),
    )
    .await;
    let before = pod_uids(&env).await;
    env.set_image("web", "web:2").await;
    let s = env
        .wait_phase("web", RolloutPhase::RolledBack, None, 60)
        .await;
    let h = &s.hooks[0];
    assert_eq!(h.phase, HookPhase::Failed);
    assert_eq!(h.exit_code, Some(1));
    assert_eq!(h.reason.as_deref(), Some("containerFailed"));
    assert_eq!(h.message.as_deref(), Some("container failed"));
    assert_eq!(
        h.log_tail.as_deref(),
        Some("container failed"),
        "kwok has no logs: the terminated message"
    );
    let d = env.deployment("web").await;
    assert_eq!(image_of(&d), "web:1", "the stable template is back");
    wait_until(
        "at rest as the gate mode wants it",
        Duration::from_secs(20),
        || async { (env.paused("web").await != env.admission()).then_some(()) },
    )
    .await;
    assert!(rs_of_image(&env.replica_sets().await, "web:2").is_none());
    assert_eq!(pod_uids(&env).await, before, "old pods untouched");
    env.wait_event("HookFailed", |e| {
        e.type_.as_deref() == Some("Warning")
            && e.message
                .as_deref()
                .unwrap_or_default()
                .contains("exit code 1")
    })
    .await;
    env.wait_event("RolloutFailed", |_| true).await;
    env.wait_event("RolledBack", |_| true).await;
}

#[tokio::test]
async fn failed_pre_hook_with_halt_stays_paused_on_the_new_template() {
    let env = Env::new("rost-halt").await;
    adopt(
        &env,
        2,
        &format!(
            "  onFailure: Halt\n  pre: [{{name: migrate, job: {}}}]\n",
            job_hook("m:1", "1s", true)
        ),
    )
    .await;
    let before = pod_uids(&env).await;
    env.set_image("web", "web:2").await;
    let s = env.wait_phase("web", RolloutPhase::Failed, None, 60).await;
    assert_eq!(s.hooks[0].exit_code, Some(1));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let d = env.deployment("web").await;
    assert_eq!(image_of(&d), "web:2");
    assert_eq!(d.spec.unwrap().paused, Some(true));
    assert!(rs_of_image(&env.replica_sets().await, "web:2").is_none());
    assert_eq!(pod_uids(&env).await, before);
    assert_eq!(env.status("web").await.phase, Some(RolloutPhase::Failed));
}

#[tokio::test]
async fn failed_mid_hook_rolls_back_to_the_stable_replica_set() {
    let env = Env::new("rost-midfail").await;
    adopt(
        &env,
        4,
        &format!(
            "  mid: [{{name: smoke, at: 50%, job: {}}}]\n",
            job_hook("s:1", "1s", true)
        ),
    )
    .await;
    env.set_image("web", "web:2").await;
    env.wait_phase("web", RolloutPhase::RolledBack, None, 60)
        .await;
    let api = env.deployments();
    let rs_api: Api<ReplicaSet> = Api::namespaced(env.client(), &env.ns.name);
    wait_until(
        "back on the stable ReplicaSet",
        Duration::from_secs(40),
        || async {
            let d = api.get("web").await.ok()?;
            let rss = rs_api.list(&ListParams::default()).await.ok()?.items;
            let old = rs_of_image(&rss, "web:1")?.status.clone()?;
            let new = rs_of_image(&rss, "web:2")?.status.clone()?;
            (image_of(&d) == "web:1"
                && d.spec.as_ref()?.paused.unwrap_or(false) != env.admission()
                && old.available_replicas == Some(4)
                && new.replicas == 0)
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn retry_makes_new_attempts_with_backoff_then_aborts() {
    let env = Env::new("rost-retry").await;
    adopt(
        &env,
        1,
        &format!(
            "  onFailure: Halt\n  pre: [{{name: migrate, failurePolicy: Retry, retries: 2, job: {}}}]\n",
            job_hook("m:1", "1s", true)
        ),
    )
    .await;
    env.set_image("web", "web:2").await;
    let s = env.wait_phase("web", RolloutPhase::Failed, None, 90).await;
    assert_eq!(s.hooks[0].attempt, 3);
    let mut jobs = job_of(&env.all_jobs().await, "migrate")
        .into_iter()
        .cloned()
        .collect::<Vec<_>>();
    jobs.sort_by_key(|j| j.labels()["ballast.dev/attempt"].clone());
    let attempts: Vec<_> = jobs
        .iter()
        .map(|j| j.labels()["ballast.dev/attempt"].clone())
        .collect();
    assert_eq!(attempts, ["1", "2", "3"]);
    let created = |j: &Job| ts(&j.metadata.creation_timestamp);
    let gap1 = created(&jobs[1]).duration_since(created(&jobs[0]));
    let gap2 = created(&jobs[2]).duration_since(created(&jobs[1]));
    assert!(gap1.as_secs() >= 5, "first backoff 5s: {gap1:?}");
    assert!(gap2.as_secs() >= 10, "second backoff 10s: {gap2:?}");
}

#[tokio::test]
async fn ignored_failure_goes_on() {
    let env = Env::new("rost-ignore").await;
    let stable = adopt(
        &env,
        1,
        &format!(
            "  post: [{{name: purge, failurePolicy: Ignore, job: {}}}]\n",
            job_hook("p:1", "1s", true)
        ),
    )
    .await;
    env.set_image("web", "web:2").await;
    let s = env.wait_succeeded_after("web", &stable, 60).await;
    assert_eq!(s.hooks[0].phase, HookPhase::Failed);
    assert_eq!(s.hooks[0].exit_code, Some(1));
    assert_eq!(image_of(&env.deployment("web").await), "web:2");
}

#[tokio::test]
async fn unschedulable_hook_fails_after_pending_timeout() {
    let env = Env::new("rost-pending").await;
    adopt(
        &env,
        1,
        "  onFailure: Halt\n  pre:\n  - name: migrate\n    pendingTimeoutSeconds: 3\n    job: {backoffLimit: 0, template: {spec: {restartPolicy: Never, nodeSelector: {no-such-label: x}, containers: [{name: t, image: m}]}}}\n",
    )
    .await;
    env.set_image("web", "web:2").await;
    let s = env.wait_phase("web", RolloutPhase::Failed, None, 40).await;
    let h = &s.hooks[0];
    assert_eq!(h.reason.as_deref(), Some("Unschedulable"), "{h:?}");
    assert!(
        h.message
            .as_deref()
            .unwrap()
            .contains("pendingTimeoutSeconds (3s)")
    );
    let api = env.jobs();
    wait_until(
        "the timed-out Job deleted",
        Duration::from_secs(20),
        || async {
            api.list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn long_running_hook_fails_after_timeout() {
    let env = Env::new("rost-timeout").await;
    adopt(
        &env,
        1,
        &format!(
            "  onFailure: Halt\n  pre: [{{name: migrate, timeoutSeconds: 3, job: {}}}]\n",
            job_hook("m:1", "60s", false)
        ),
    )
    .await;
    env.set_image("web", "web:2").await;
    let s = env.wait_phase("web", RolloutPhase::Failed, None, 40).await;
    assert_eq!(
        s.hooks[0].reason.as_deref(),
        Some("DeadlineExceeded"),
        "{:?}",
        s.hooks[0]
    );
}

#[tokio::test]
async fn rollout_that_does_not_progress_fails_after_the_deadline() {
    let env = Env::new("rost-deadline").await;
    adopt(
        &env,
        2,
        "  progressDeadlineSeconds: 5\n  onFailure: Rollback\n",
    )
    .await;
    // The new revision's pods can never be scheduled.
    let patch = json!({"spec": {"template": {"spec": {"nodeSelector": {"no-such-label": "x"}}}}});
    env.deployments()
        .patch("web", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap();
    let s = env
        .wait_phase("web", RolloutPhase::RolledBack, None, 40)
        .await;
    assert!(s.message.unwrap().contains("progressDeadlineSeconds"));
    let api = env.deployments();
    wait_until(
        "the stable template back and complete",
        Duration::from_secs(30),
        || async {
            let d = api.get("web").await.ok()?;
            let st = d.status.clone()?;
            (d.spec
                .as_ref()?
                .template
                .spec
                .as_ref()?
                .node_selector
                .is_none()
                && st.updated_replicas == Some(2)
                && st.replicas == Some(2)
                && d.spec.as_ref()?.paused.unwrap_or(false) != env.admission())
            .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn approval_gate_opens_only_for_its_revision() {
    let env = Env::new("rost-approve").await;
    let stable = adopt(&env, 4, "  mid: [{name: go-live, at: 50%, approval: {}}]\n").await;
    env.set_image("web", "web:2").await;
    let s = env
        .wait_phase("web", RolloutPhase::WaitingApproval, None, 40)
        .await;
    let rev = s.current_revision.clone().unwrap();
    assert_eq!(s.current_hook.as_deref(), Some("go-live"));
    assert!(env.paused("web").await);
    env.annotate("web", "ballast.dev/approve", &stable).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        env.status("web").await.phase,
        Some(RolloutPhase::WaitingApproval),
        "another revision's approval does not count"
    );
    env.annotate("web", "ballast.dev/approve", &rev).await;
    let s = env.wait_succeeded_after("web", &stable, 40).await;
    assert_eq!(s.hooks[0].phase, HookPhase::Succeeded);
    let obj = env.strategies().get("web").await.unwrap();
    assert!(
        !obj.annotations().contains_key("ballast.dev/approve"),
        "an approval is used once"
    );
}

#[tokio::test]
async fn retry_annotation_reruns_a_failed_revision_with_new_attempts() {
    let env = Env::new("rost-retryann").await;
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
    let s = env.wait_phase("web", RolloutPhase::Failed, None, 40).await;
    let rev = s.current_revision.clone().unwrap();
    // Fix the hook, then ask for a retry of the failed revision.
    env.apply(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {{name: web}}\nspec:\n  targetRef: {{name: web}}\n  onFailure: Halt\n  pre: [{{name: migrate, job: {}}}]\n",
        job_hook("m:1", "1s", false)
    ));
    env.annotate("web", "ballast.dev/retry", &rev).await;
    let s = env
        .wait_phase("web", RolloutPhase::Succeeded, Some(&rev), 40)
        .await;
    assert_eq!(s.hooks[0].attempt, 2);
    assert_eq!(
        s.hooks[0].job_name.as_deref(),
        Some(format!("web-migrate-{rev}-2").as_str())
    );
    let obj = env.strategies().get("web").await.unwrap();
    assert!(!obj.annotations().contains_key("ballast.dev/retry"));
    assert_eq!(image_of(&env.deployment("web").await), "web:2");
}

#[tokio::test]
async fn sigkill_at_every_step_resumes_without_duplicates_or_skips() {
    let mut env = Env::new("rost-crash").await;
    // New pods count as available only after 2 s, so the rolling phase before the mid point
    // lasts long enough to be seen (and a restart made in it): ballast unpauses and pauses at
    // the point within a fraction of the 250 ms the test polls at.
    env.apply(
        &deployment_yaml("web", "web:1", 4, false, ROLLING)
            .replace("  replicas: 4\n", "  replicas: 4\n  minReadySeconds: 2\n"),
    );
    wait_available(&env, "web", 4).await;
    env.apply(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {{name: web}}\nspec:\n  targetRef: {{name: web}}\n  pre: [{{name: migrate, job: {}}}]\n  mid: [{{name: smoke, at: 50%, job: {}}}]\n  post: [{{name: purge, job: {}}}]\n",
        job_hook("m:1", "4s", false),
        job_hook("s:1", "4s", false),
        job_hook("p:1", "4s", false)
    ));
    let stable = env
        .wait_phase("web", RolloutPhase::Idle, None, 30)
        .await
        .stable_revision
        .unwrap();
    env.set_image("web", "web:2").await;
    let mut restarts = 0;
    for (phase, hook) in [
        (RolloutPhase::PreHook, "migrate"),
        (RolloutPhase::MidHook, "smoke"),
        (RolloutPhase::PostHook, "purge"),
    ] {
        env.wait_status("web", &format!("{hook} running"), 40, |s| {
            s.phase == Some(phase) && running(s, hook)
        })
        .await;
        // Down while the hook finishes: the next operator finds it done, records it and goes
        // on (between the hook's success and the next write).
        env.kill();
        env.wait_job_complete(hook).await;
        if phase != RolloutPhase::PostHook || !env.admission() {
            assert!(
                env.paused("web").await,
                "nothing moves while the operator is down"
            );
        }
        restarts += 1;
        env.restart(restarts);
        if phase == RolloutPhase::PreHook {
            // Once more while the rollout progresses towards the mid point. The pods are ready
            // at once on kwok, so that can be over before a look sees it: then the restart
            // lands while the mid hook runs, a crash point as good (the next step kills there
            // again). Never once the mid hook is done: then there would be nothing left to kill.
            env.wait_status("web", "rolling towards smoke", 30, |s| {
                (s.phase == Some(RolloutPhase::Rolling)
                    && !s.hooks.iter().any(|h| h.name == "smoke"))
                    || (s.phase == Some(RolloutPhase::MidHook) && running(s, "smoke"))
            })
            .await;
            restarts += 1;
            env.restart(restarts);
        }
    }
    let s = env.wait_succeeded_after("web", &stable, 60).await;
    assert_eq!(s.hooks.len(), 3);
    assert!(
        s.hooks
            .iter()
            .all(|h| h.phase == HookPhase::Succeeded && h.attempt == 1)
    );
    let jobs = env.all_jobs().await;
    assert_eq!(
        jobs.len(),
        3,
        "one Job per hook: {:?}",
        jobs.iter().map(|j| j.name_any()).collect::<Vec<_>>()
    );
    let d = env.deployment("web").await;
    assert_eq!(image_of(&d), "web:2");
    assert_eq!(d.spec.unwrap().paused.unwrap_or(false), !env.admission());
    assert_eq!(d.status.unwrap().updated_replicas, Some(4));
}

#[tokio::test]
async fn recreate_runs_mid_hooks_with_no_pods_and_restores_replicas_after_a_crash() {
    let mut env = Env::new("rost-recreate").await;
    env.apply(&deployment_yaml(
        "web",
        "web:1",
        3,
        false,
        "{type: Recreate}",
    ));
    wait_available(&env, "web", 3).await;
    env.apply(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {{name: web}}\nspec:\n  targetRef: {{name: web}}\n  mid: [{{name: schema, at: 1, job: {}}}]\n",
        job_hook("s:1", "4s", false)
    ));
    let stable = env
        .wait_phase("web", RolloutPhase::Idle, None, 30)
        .await
        .stable_revision
        .unwrap();
    env.set_image("web", "web:2").await;
    let s = env
        .wait_status("web", "schema running", 40, |s| running(s, "schema"))
        .await;
    assert_eq!(s.original_replicas, Some(3));
    let d = env.deployment("web").await;
    assert_eq!(d.spec.as_ref().unwrap().replicas, Some(0));
    assert_eq!(
        d.status.as_ref().unwrap().replicas.unwrap_or(0),
        0,
        "old pods are gone"
    );
    assert!(
        rs_of_image(&env.replica_sets().await, "web:2").is_none(),
        "no new pods yet"
    );
    env.kill();
    env.wait_job_complete("schema").await;
    env.restart(1);
    let s = env.wait_succeeded_after("web", &stable, 60).await;
    assert_eq!(s.original_replicas, None);
    let d = env.deployment("web").await;
    assert_eq!(
        d.spec.as_ref().unwrap().replicas,
        Some(3),
        "replicas restored"
    );
    assert_eq!(image_of(&d), "web:2");
    wait_available(&env, "web", 3).await;
}

#[tokio::test]
async fn new_revision_during_a_hook_waits_for_it_then_starts_over() {
    let env = Env::new("rost-supersede").await;
    let stable = adopt(
        &env,
        1,
        &format!(
            "  pre: [{{name: migrate, job: {}}}]\n",
            job_hook("m:1", "5s", false)
        ),
    )
    .await;
    env.set_image("web", "web:2").await;
    let first = env
        .wait_status("web", "migrate running", 30, |s| running(s, "migrate"))
        .await
        .current_revision
        .unwrap();
    env.set_image("web", "web:3").await;
    let s = env.wait_succeeded_after("web", &stable, 60).await;
    assert_ne!(s.current_revision.as_deref(), Some(first.as_str()));
    assert_eq!(image_of(&env.deployment("web").await), "web:3");
    let jobs = env.all_jobs().await;
    let mut names: Vec<_> = jobs.iter().map(|j| j.name_any()).collect();
    names.sort();
    assert_eq!(names.len(), 2, "one Job per revision: {names:?}");
    let first_job = jobs
        .iter()
        .find(|j| j.labels()["ballast.dev/revision"] == first)
        .unwrap();
    assert_eq!(
        first_job.status.as_ref().unwrap().succeeded,
        Some(1),
        "the running hook was let finish"
    );
    let second_job = jobs
        .iter()
        .find(|j| j.labels()["ballast.dev/revision"] != first)
        .unwrap();
    assert!(
        ts(&second_job.metadata.creation_timestamp)
            >= ts(&first_job.status.as_ref().unwrap().completion_time)
                - jiff::SignedDuration::from_secs(1)
    );
    assert!(
        rs_of_image(&env.replica_sets().await, "web:2").is_none(),
        "web:2 never rolled out"
    );
}

#[tokio::test]
async fn a_spread_policy_change_goes_through_the_strategy_hooks() {
    let env = Env::new("rost-spread").await;
    let stable = adopt(
        &env,
        2,
        &format!(
            "  pre: [{{name: migrate, job: {}}}]\n",
            job_hook("m:1", "2s", false)
        ),
    )
    .await;
    let patch = json!({"metadata": {"labels": {"tier": "web"}}});
    env.deployments()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    env.apply(
        r#"
apiVersion: ballast.dev/v1alpha1
kind: SpreadPolicy
metadata: {name: web-zones}
spec:
  selector: {matchLabels: {tier: web}}
  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Preferred, weight: 100}]
"#,
    );
    let s = env.wait_succeeded_after("web", &stable, 60).await;
    let d = env.deployment("web").await;
    let template = d.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert!(
        template.affinity.is_some(),
        "the policy's terms are in the template"
    );
    let jobs = env.all_jobs().await;
    let migrate = job_of(&jobs, "migrate");
    assert_eq!(migrate.len(), 1);
    assert_eq!(
        migrate[0].labels()["ballast.dev/revision"],
        s.current_revision.clone().unwrap()
    );
    let done = ts(&migrate[0].status.as_ref().unwrap().completion_time);
    let rss = env.replica_sets().await;
    let newest = rss
        .iter()
        .max_by_key(|r| ts(&r.metadata.creation_timestamp))
        .unwrap();
    assert!(
        ts(&newest.metadata.creation_timestamp) >= done - jiff::SignedDuration::from_secs(1),
        "the policy's template rolled out only after the pre hook"
    );
}

#[tokio::test]
async fn deleting_the_strategy_during_a_recreate_mid_hook_gives_everything_back() {
    let env = Env::new("rost-release").await;
    env.apply(&deployment_yaml(
        "web",
        "web:1",
        2,
        false,
        "{type: Recreate}",
    ));
    wait_available(&env, "web", 2).await;
    env.apply(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {{name: web}}\nspec:\n  targetRef: {{name: web}}\n  mid: [{{name: schema, at: 1, job: {}}}]\n",
        job_hook("s:1", "30s", false)
    ));
    env.wait_phase("web", RolloutPhase::Idle, None, 30).await;
    env.set_image("web", "web:2").await;
    env.wait_status("web", "schema running", 40, |s| running(s, "schema"))
        .await;
    assert_eq!(env.deployment("web").await.spec.unwrap().replicas, Some(0));
    env.strategies()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let api = env.deployments();
    wait_until(
        "the Deployment unpaused with its replicas",
        Duration::from_secs(30),
        || async {
            let d = api.get("web").await.ok()?;
            let spec = d.spec?;
            (spec.paused != Some(true) && spec.replicas == Some(2)).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_second_strategy_for_the_same_deployment_stands_aside() {
    let env = Env::new("rost-two").await;
    adopt(&env, 1, "").await;
    env.apply(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {name: web-2}\nspec:\n  targetRef: {name: web}\n",
    );
    let s = env
        .wait_status("web-2", "Conflicted", 30, |s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "Conflicted")
        })
        .await;
    assert!(
        s.message
            .unwrap()
            .contains("governed by RolloutStrategy web")
    );
    env.strategies()
        .delete("web-2", &DeleteParams::default())
        .await
        .unwrap();
    let api = env.strategies();
    wait_until("web-2 gone", Duration::from_secs(30), || async {
        api.get_opt("web-2").await.unwrap().is_none().then_some(())
    })
    .await;
    let d = env.deployment("web").await;
    assert_eq!(
        d.spec.as_ref().unwrap().paused.unwrap_or(false),
        !env.admission(),
        "the governing strategy keeps holding it"
    );
    assert_eq!(
        d.annotations()
            .get("ballast.dev/rollout-strategy")
            .map(String::as_str),
        Some("web"),
        "the Deployment still names its governing strategy"
    );
}

#[tokio::test]
async fn adopting_a_paused_deployment_with_a_pending_change_hooks_the_change() {
    let env = Env::new("rost-pending-change").await;
    env.apply(&deployment_yaml("web", "web:1", 2, false, ROLLING));
    wait_available(&env, "web", 2).await;
    let before = pod_uids(&env).await;
    env.c
        .kubectl_ok(&["rollout", "pause", "deployment/web", "-n", &env.ns.name]);
    env.set_image("web", "web:2").await;
    env.apply(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {{name: web}}\nspec:\n  targetRef: {{name: web}}\n  pre: [{{name: migrate, job: {}}}]\n",
        job_hook("m:1", "1s", true)
    ));
    // The pending change gets its pre hook, which fails: the running template comes back.
    let s = env
        .wait_phase("web", RolloutPhase::RolledBack, None, 40)
        .await;
    assert_eq!(s.hooks[0].name, "migrate");
    let d = env.deployment("web").await;
    assert_eq!(image_of(&d), "web:1");
    assert_eq!(d.spec.unwrap().paused, Some(true));
    assert!(rs_of_image(&env.replica_sets().await, "web:2").is_none());
    assert_eq!(pod_uids(&env).await, before);
    assert_eq!(
        env.replica_sets().await.len(),
        1,
        "the same ReplicaSet serves"
    );
}

/// Issue 14's bound on pause writes: a revision with k mid hooks writes `spec.paused` at most
/// 2k + 2 times (unpaused after the pre hooks, paused and unpaused at each mid point, paused for
/// the post hooks in pause-at-rest mode; 2k + 1 with the revision gate, which pauses the
/// revision itself), counted at the API server's door by the fault proxy.
/// And while a mid hook runs, the new ReplicaSet is not scaled: the rollout holds at its point.
#[tokio::test]
async fn a_revision_with_k_mid_hooks_writes_paused_at_most_2k_plus_2_times() {
    use support::Operator;
    use support::proxy::FaultProxy;
    let mut env = Env::new("rost-pauses").await;
    // The operator, through a proxy that records its writes.
    let proxy = FaultProxy::start(&env.c);
    env.op.kill();
    env.op = Operator::start_with_kubeconfig(
        &proxy.operator_kubeconfig(&env.c),
        &env.ns.name,
        &format!("ballast-{}-1", env.ns.name),
        &[],
    );
    // Simulated pods are ready at once; a pod counts as available 3 s later, so each step of
    // the Deployment controller takes that long, as with real pods starting.
    env.apply(
        &deployment_yaml("web", "web:1", 4, false, ROLLING)
            .replace("  replicas: 4\n", "  replicas: 4\n  minReadySeconds: 3\n"),
    );
    wait_available(&env, "web", 4).await;
    env.apply(&format!(
        r#"
apiVersion: ballast.dev/v1alpha1
kind: RolloutStrategy
metadata: {{name: web}}
spec:
  targetRef: {{name: web}}
  pre: [{{name: migrate, container: {{from: app, command: [migrate]}}}}]
  mid:
  - {{name: smoke, at: 1, job: {smoke}}}
  - {{name: check, at: 75%, job: {check}}}
  post: [{{name: purge, container: {{from: app, command: [purge]}}}}]
"#,
        smoke = job_hook("smoke:1", "3s", false),
        check = job_hook("check:1", "3s", false),
    ));
    env.wait_phase("web", RolloutPhase::Idle, None, 30).await;
    let deployment_path = format!("/apis/apps/v1/namespaces/{}/deployments/web", env.ns.name);
    let deployment_writes = || {
        proxy
            .writes()
            .into_iter()
            // Server-side applies (force): `spec.paused`; the phase annotations are merge
            // patches and do not count.
            .filter(|w| w.path == deployment_path && w.applied() && w.query.contains("force=true"))
            .count()
    };
    let before = deployment_writes();
    env.set_image("web", "web:2").await;

    // (hook, new ReplicaSet's spec.replicas when it was first seen running, every value seen
    // while it ran)
    let mut held: Vec<(String, i32, Vec<i32>)> = vec![];
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        assert!(std::time::Instant::now() < deadline, "no success in time");
        let s = env.status("web").await;
        if s.phase == Some(RolloutPhase::Succeeded) && s.stable_revision == s.current_revision {
            break;
        }
        let rss = env.replica_sets().await;
        // Judged only for hooks that a status read after the ReplicaSets still shows running:
        // a hook's end, the unpause and the next scale step can fall between the two reads
        // (the operator writes the end to status before it unpauses).
        let after = env.status("web").await;
        let scaled = rs_of_image(&rss, "web:2")
            .and_then(|r| r.spec.as_ref()?.replicas)
            .unwrap_or(0);
        let running = |h: &ballast::api::HookStatus| {
            h.point == ballast::api::HookPoint::Mid && h.phase == HookPhase::Running
        };
        for h in s.hooks.iter().filter(|h| running(h)).filter(|h| {
            after
                .hooks
                .iter()
                .any(|a| a.name == h.name && a.revision == h.revision && running(a))
        }) {
            match held.iter_mut().find(|(name, _, _)| *name == h.name) {
                Some((_, _, seen)) => seen.push(scaled),
                None => held.push((h.name.clone(), scaled, vec![scaled])),
            }
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // Every applied Deployment write of this revision is a pause or an unpause: no Recreate, no
    // rollback.
    let writes = deployment_writes() - before;
    let k = 2;
    // With the revision gate there is no pause for the post hooks: 2k + 1.
    let bound = if env.admission() {
        2 * k + 1
    } else {
        2 * k + 2
    };
    assert!(
        writes <= bound,
        "{writes} writes of spec.paused for {k} mid hooks (at most {bound})"
    );
    assert_eq!(held.len(), k, "both mid hooks were seen running: {held:?}");
    for (hook, at_start, seen) in &held {
        assert!(
            seen.iter().all(|n| n == at_start),
            "the new ReplicaSet was scaled while mid hook {hook} ran: {seen:?}"
        );
    }
    // maxSurge 1, maxUnavailable 0: each step adds one pod, and a step takes 3 s, so the pause
    // lands on the points exactly.
    assert_eq!(
        held.iter().map(|(_, n, _)| *n).collect::<Vec<_>>(),
        [1, 3],
        "mid hooks at 1 and 75% of 4"
    );
    assert!(
        env.events("MidPointPassed").await.is_empty(),
        "no point passed with single-pod steps"
    );
}

/// A strategy without pre hooks holds nothing back at the start of a revision: with the
/// revision gate the template change is never paused (the gate pauses only for pre hooks), the
/// new ReplicaSet exists at once, and the post hook still runs once, after the rollout is
/// complete. Without the gate the Deployment is paused at rest, and the revision is let go.
#[tokio::test]
async fn a_revision_without_pre_hooks_is_not_held_and_its_post_hook_runs_once_after_it() {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let env = Env::new("rost-nopre").await;
    let stable = adopt(
        &env,
        2,
        "  post: [{name: purge, container: {from: app, command: [purge]}}]\n",
    )
    .await;
    // Every copy of the Deployment the API server sends from now on: (paused, image).
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(bool, String)>::new()));
    let watch = {
        let seen = seen.clone();
        let stream = watcher(
            env.deployments(),
            watcher::Config::default().fields("metadata.name=web"),
        )
        .applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(d)) = stream.next().await {
                let spec = d.spec.unwrap_or_default();
                let image = spec.template.spec.unwrap_or_default().containers[0]
                    .image
                    .clone()
                    .unwrap_or_default();
                seen.lock()
                    .unwrap()
                    .push((spec.paused.unwrap_or(false), image));
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let changed = jiff::Timestamp::now();
    env.set_image("web", "web:2").await;
    let s = env.wait_succeeded_after("web", &stable, 60).await;
    watch.abort();

    let rss = env.replica_sets().await;
    let rs2 = rs_of_image(&rss, "web:2").expect("the new ReplicaSet");
    let created = ts(&rs2.metadata.creation_timestamp);
    let jobs = env.all_jobs().await;
    let purge = job_of(&jobs, "purge");
    assert_eq!(purge.len(), 1, "one post hook Job");
    let purge_created = ts(&purge[0].metadata.creation_timestamp);
    assert!(
        purge_created >= created,
        "the post hook ran after the new ReplicaSet existed"
    );
    assert!(
        s.hooks
            .iter()
            .any(|h| h.name == "purge" && h.phase == HookPhase::Succeeded),
        "{:?}",
        s.hooks
    );
    if env.admission() {
        let seen = seen.lock().unwrap().clone();
        let held: Vec<_> = seen.iter().filter(|(p, i)| *p && i == "web:2").collect();
        assert!(
            held.is_empty(),
            "the revision of a strategy without pre hooks was paused: {seen:?}"
        );
        // Not held: the Deployment controller made the ReplicaSet as soon as it saw the change
        // (seconds, not the operator's reaction; the second is the timestamps' resolution).
        let lag = created.duration_since(changed);
        assert!(
            lag < jiff::SignedDuration::from_secs(5),
            "new ReplicaSet {lag} after the change"
        );
        assert!(
            env.events("RevisionNotGated").await.is_empty(),
            "nothing to warn about"
        );
        assert!(!env.paused("web").await, "at rest, not paused");
    } else {
        assert!(env.paused("web").await, "pause-at-rest: paused at rest");
    }
}

/// The controller watches only the Deployments labelled governed: the writes to a Deployment
/// no strategy governs (a SpreadPolicy's fan-out over thousands of them, say) never reach it,
/// while the SpreadPolicy controller's watch of the same namespace receives every one. Read
/// from the manager's `ballast_watch_events_total`.
#[tokio::test]
async fn writes_to_a_deployment_no_strategy_governs_never_reach_the_controller() {
    let env = Env::new("rost-watch").await;
    adopt(
        &env,
        1,
        "  pre: [{name: migrate, container: {from: app, command: [migrate]}}]\n",
    )
    .await;
    env.apply(&deployment_yaml("other", "other:1", 0, false, ROLLING));
    let received = |metrics: &str, watch: &str| support::watch_events(metrics, watch, None);
    let metrics = || async { env.op.http_get("/metrics").await.expect("/metrics").1 };
    // `other` is created, and `web`'s adoption has come back through the watches.
    let spread = "spread-policy/deployments";
    wait_until("other received", Duration::from_secs(30), || async {
        (received(&metrics().await, spread) >= 2.0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = metrics().await;
    const WRITES: usize = 10;
    for i in 0..WRITES {
        let patch = json!({"spec": {"template": {"metadata": {"annotations": {"test/revision": i.to_string()}}}}});
        env.deployments()
            .patch("other", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    let spread_before = received(&before, spread);
    wait_until(
        "the SpreadPolicy controller's watch received every write",
        Duration::from_secs(30),
        || async {
            (received(&metrics().await, spread) >= spread_before + WRITES as f64).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = metrics().await;
    let ours = "rollout-strategy/deployments";
    let got = received(&after, ours) - received(&before, ours);
    // `web` is at rest: nothing of it should come either; one late copy of it is tolerated.
    assert!(
        got <= 1.0,
        "the RolloutStrategy controller's watch received {got} Deployments while {WRITES} writes went to one it does not govern (its own: {} received in all; the SpreadPolicy controller's: {})",
        received(&after, ours),
        received(&after, spread) - spread_before
    );
    assert!(
        received(&after, ours) >= 1.0,
        "the governed Deployment came through the watch"
    );
}
