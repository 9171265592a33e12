//! The fault-injection suite, RolloutStrategy side: the real operator against the local control
//! plane, with faults from the cluster itself (unreadable objects, refused writes, replaced
//! targets, lost status, slow pod deletion). Each scenario records its row of the fault table
//! (`target/fault-results/`, printed by `hack/fault-table.sh`) before it asserts, so a failing
//! scenario shows in the table too. See docs/reliability.md.

mod support;

use ballast::api::{HookPhase, RolloutPhase};
use jiff::Timestamp;
use k8s_openapi::api::{apps::v1::ReplicaSet, batch::v1::Job, core::v1::Pod};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use serde_json::json;
use std::time::{Duration, Instant};
use support::faults::{Row, record};
use support::rollout::*;
use support::wait_until;

fn strategy(hooks: &str) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {{name: web}}\nspec:\n  targetRef: {{name: web}}\n{hooks}"
    )
}

/// Records the row, then fails with what went wrong (if anything did).
fn verdict(id: &str, fault: &str, checked: &str, failures: &[String]) {
    record(&Row {
        id,
        fault,
        runs: 1,
        passed: u32::from(failures.is_empty()),
        checked,
    });
    assert!(failures.is_empty(), "{id}: {failures:#?}");
}

fn check(failures: &mut Vec<String>, ok: bool, what: impl Into<String>) {
    if !ok {
        failures.push(what.into());
    }
}

/// A promise of "nothing lost" that ballast cannot keep against a user's own write to the
/// Deployment (`kubectl scale` while a Recreate mid hook holds it at 0; in pause-at-rest mode
/// also `kubectl rollout resume`): the Deployment controller acts on it before ballast sees
/// it. Measured and written into the row, not failed.
fn gap(gaps: &mut Vec<String>, ok: bool, what: impl Into<String>) {
    if !ok {
        gaps.push(what.into());
    }
}

/// A promise the revision hold keeps (a user's resume is refused while hooks run): a `check`
/// with the admission gate, a `gap` in pause-at-rest mode.
fn held(
    env: &Env,
    failures: &mut Vec<String>,
    gaps: &mut Vec<String>,
    ok: bool,
    what: impl Into<String>,
) {
    if env.admission() {
        check(failures, ok, what);
    } else {
        gap(gaps, ok, what);
    }
}

/// The CRD of RolloutStrategy as `crds/` has it, less the rule that bounds `at`, so that the
/// API server stores an `at` no controller can hold (as a CRD from before the bound would).
fn unbounded_crd() -> String {
    let text = std::fs::read_to_string(
        support::repo_root().join("crds/ballast.dev_rolloutstrategies.yaml"),
    )
    .unwrap();
    let mut out = Vec::new();
    let mut skip = 0;
    for line in text.lines() {
        if skip > 0 {
            skip -= 1;
            continue;
        }
        if line.trim_start() == "- message: 'at: a replica count must be at most 1000000'" {
            skip = 1; // its `rule:` line
            continue;
        }
        out.push(line);
    }
    let removed = text.lines().count() - out.len();
    assert!(
        removed >= 2 && removed.is_multiple_of(2),
        "the bound rule is in crds/"
    );
    out.join("\n")
}

#[tokio::test]
async fn f7_a_poison_strategy_does_not_stop_the_others() {
    let mut env = Env::new("f7-poison").await;
    let stable = adopt(
        &env,
        2,
        &format!(
            "  pre: [{{name: migrate, job: {}}}]\n",
            job_hook("m:1", "2s", false)
        ),
    )
    .await;
    // A strategy the controller cannot read, stored while the CRD lacked the bound.
    let crds = "crd/rolloutstrategies.ballast.dev";
    env.c.kubectl_stdin(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&unbounded_crd()),
    );
    env.c
        .kubectl_ok(&["wait", "--for=condition=Established", crds]);
    let poison = "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {name: poison}\nspec:\n  targetRef: {name: other}\n  mid: [{name: gate, at: 2147483648, approval: {}}]\n";
    wait_until("the poison stored", Duration::from_secs(30), || async {
        let out = env
            .c
            .kubectl_stdin(&["apply", "-n", &env.ns.name, "-f", "-"], Some(poison));
        out.status.success().then_some(())
    })
    .await;
    env.c.kubectl_ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "crds/ballast.dev_rolloutstrategies.yaml",
    ]);
    env.restart(1);
    env.set_image("web", "web:2").await;
    let s = env.wait_succeeded_after("web", &stable, 90).await;
    let poisoned = wait_until(
        "InvalidSpec on the poison",
        Duration::from_secs(30),
        || async {
            let out = env.c.kubectl(&[
                "get",
                "rolloutstrategy",
                "poison",
                "-n",
                &env.ns.name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}",
            ]);
            let reason = String::from_utf8_lossy(&out.stdout).to_string();
            (reason == "InvalidSpec").then_some(reason)
        },
    )
    .await;
    // Sent after the status write that set the condition.
    let warned = env.find_event("InvalidSpec", |_| true).await.is_ok();
    let mut failures = vec![];
    check(
        &mut failures,
        s.hooks.len() == 1 && s.hooks[0].phase == HookPhase::Succeeded,
        format!("the healthy strategy's hooks: {:?}", s.hooks),
    );
    check(
        &mut failures,
        poisoned == "InvalidSpec",
        "InvalidSpec condition",
    );
    check(&mut failures, warned, "a Warning Event InvalidSpec");
    // Deleting the unreadable object finishes.
    env.c.kubectl_ok(&[
        "delete",
        "rolloutstrategy",
        "poison",
        "-n",
        &env.ns.name,
        "--timeout=60s",
    ]);
    verdict(
        "F7",
        "a strategy that cannot be decoded (at: 2147483648), then a restart",
        "the other strategy's rollout runs its hook once and succeeds; the poison shows Ready=False InvalidSpec and a Warning Event; deleting it finishes",
        &failures,
    );
}

#[tokio::test]
async fn f8_a_hook_job_the_api_server_refuses_ends_the_revision_in_time() {
    let env = Env::new("f8-refused").await;
    let stable = adopt(
        &env,
        2,
        "  pre: [{name: migrate, pendingTimeoutSeconds: 30, job: {template: {spec: {restartPolicy: Never, containers: [{name: t}]}}}}]\n",
    )
    .await;
    let start = Instant::now();
    env.set_image("web", "web:2").await;
    let s = env
        .wait_status("web", "a terminal phase", 60, |s| {
            matches!(
                s.phase,
                Some(RolloutPhase::RolledBack | RolloutPhase::Failed)
            )
        })
        .await;
    let took = start.elapsed();
    let hook = &s.hooks[0];
    let first_revision = hook.revision.clone();
    let mut failures = vec![];
    check(
        &mut failures,
        took < Duration::from_secs(60),
        format!("terminal after {took:?}"),
    );
    check(
        &mut failures,
        hook.reason.as_deref() == Some("JobRejected")
            && hook.message.as_deref().is_some_and(|m| m.contains("image")),
        format!("the API server's message in status: {hook:?}"),
    );
    // Events follow the status write they tell of: the terminal phase can be seen a moment
    // before its Event is.
    let event = env.find_event("HookFailed", |_| true).await.is_ok();
    check(&mut failures, event, "a HookFailed Warning Event");
    // Failed is recorded first; the rollback is the next step.
    let s = env
        .wait_phase("web", RolloutPhase::RolledBack, None, 20)
        .await;
    let d = env.deployment("web").await;
    check(
        &mut failures,
        image_of(&d) == "web:1" && s.stable_revision.as_deref() == Some(stable.as_str()),
        "rolled back to the stable template",
    );

    // The same with a Job quota of 0: the refusal is a 403.
    env.apply("apiVersion: v1\nkind: ResourceQuota\nmetadata: {name: no-jobs}\nspec: {hard: {count/jobs.batch: \"0\"}}\n");
    env.apply(&strategy(
        "  pre: [{name: migrate, pendingTimeoutSeconds: 30, container: {from: app}}]\n",
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.set_image("web", "web:3").await;
    let s = env
        .wait_status("web", "a terminal phase for web:3", 60, |s| {
            matches!(
                s.phase,
                Some(RolloutPhase::RolledBack | RolloutPhase::Failed)
            ) && s
                .hooks
                .iter()
                .any(|h| h.reason.as_deref() == Some("JobRejected") && h.revision != first_revision)
        })
        .await;
    check(
        &mut failures,
        s.hooks[0]
            .message
            .as_deref()
            .is_some_and(|m| m.contains("quota")),
        format!("quota message in status: {:?}", s.hooks[0]),
    );
    verdict(
        "F8",
        "a hook Job refused by the API server (no image: 422; Job quota 0: 403)",
        "terminal phase within pendingTimeoutSeconds + 30 s, reason JobRejected with the API server's message, a Warning Event, rolled back",
        &failures,
    );
}

#[tokio::test]
async fn f9_a_deployment_created_again_under_the_same_name_is_adopted_afresh() {
    let env = Env::new("f9-replaced").await;
    let mut failures = vec![];
    // During Idle.
    adopt(
        &env,
        2,
        &format!(
            "  pre: [{{name: migrate, job: {}}}]\n",
            job_hook("m:1", "2s", false)
        ),
    )
    .await;
    let old_uid = env.deployment("web").await.uid();
    env.deployments()
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    let api = env.deployments();
    wait_until("the Deployment gone", Duration::from_secs(30), || async {
        api.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    env.apply(&deployment_yaml("web", "web:5", 2, false, ROLLING));
    let new_uid = env.deployment("web").await.uid();
    let s = env
        // With the revision gate the new object is created paused (its strategy exists) and
        // gets its pre hooks before its first pod: Succeeded. In pause-at-rest mode it rolls out
        // at once and is adopted: Idle.
        .wait_status("web", "adopted afresh", 60, |s| {
            s.target_uid == new_uid
                && matches!(s.phase, Some(RolloutPhase::Idle | RolloutPhase::Succeeded))
                && s.stable_revision.is_some()
        })
        .await;
    let tmpl = serde_json::to_string(&s.stable_template).unwrap();
    check(&mut failures, old_uid != new_uid, "a new object");
    check(
        &mut failures,
        tmpl.contains("web:5") && !tmpl.contains("web:1"),
        format!("the stable template is the new one's: {tmpl}"),
    );
    check(
        &mut failures,
        image_of(&env.deployment("web").await) == "web:5",
        "the old template never reappears (Idle)",
    );

    // During PreHook: the old revision's running hook is stopped, the new object starts over.
    env.apply(&strategy(&format!(
        "  pre: [{{name: migrate, job: {}}}]\n",
        job_hook("m:1", "20s", false)
    )));
    env.set_image("web", "web:6").await;
    env.wait_status("web", "migrate running", 40, |s| {
        s.phase == Some(RolloutPhase::PreHook) && s.hooks.iter().any(|h| h.job_name.is_some())
    })
    .await;
    env.deployments()
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    wait_until("the Deployment gone", Duration::from_secs(30), || async {
        api.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    env.apply(&deployment_yaml("web", "web:7", 2, true, ROLLING));
    let uid7 = env.deployment("web").await.uid();
    let s = env
        .wait_status("web", "web:7 rolled out", 120, |s| {
            s.target_uid == uid7 && s.phase == Some(RolloutPhase::Succeeded)
        })
        .await;
    let d = env.deployment("web").await;
    check(
        &mut failures,
        image_of(&d) == "web:7",
        format!(
            "the old template never reappears (PreHook): {}",
            image_of(&d)
        ),
    );
    let rss: Vec<ReplicaSet> = env.replica_sets().await;
    check(
        &mut failures,
        rss.iter()
            .all(|r| rs_of_image(std::slice::from_ref(r), "web:7").is_some()),
        "the new Deployment only ever had web:7 pods",
    );
    check(
        &mut failures,
        s.hooks.len() == 1 && s.hooks[0].phase == HookPhase::Succeeded,
        format!("the new object's pre hook ran: {:?}", s.hooks),
    );
    f9_recreate_mid_hook(&env, &mut failures).await;
    verdict(
        "F9",
        "Deployment deleted and created again with the same name during Idle, PreHook, and a Recreate mid hook",
        "status tied to the new UID; stable template is the new object's; the old template never reappears; the new one's pre hook runs before its first pods; Recreate: the old object's mid hook Job is cancelled and never succeeds, the new one's mid hook runs once before any of its ReplicaSets exists, and the replica count is the new object's, not the one the old object had set aside",
        &failures,
    );
}

/// F9, Recreate: the Deployment is deleted while its mid hook runs, i.e. while ballast holds it
/// scaled to 0 with its replica count set aside in status. The new object (created paused, with
/// its own replica count) is a new target: nothing set aside for the old one is given to it, the
/// old one's mid hook Job is stopped, and the new one's mid hook runs once, before any of its pods.
async fn f9_recreate_mid_hook(env: &Env, failures: &mut Vec<String>) {
    const RECREATE: &str = "{type: Recreate}";
    env.apply(&strategy(&format!(
        "  mid: [{{name: smoke, at: 1, job: {}}}]\n",
        job_hook("s:1", "20s", false)
    )));
    env.deployments()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"spec": {"strategy": {"type": "Recreate", "rollingUpdate": null}}}),
            ),
        )
        .await
        .unwrap();
    let old_uid = env.deployment("web").await.uid().unwrap();
    env.set_image("web", "web:8").await;
    env.wait_status("web", "smoke running on the scaled-down web:8", 60, |s| {
        s.phase == Some(RolloutPhase::MidHook) && running(s, "smoke")
    })
    .await;
    let before = env.deployment("web").await;
    check(
        failures,
        before.spec.as_ref().and_then(|s| s.replicas) == Some(0),
        "Recreate: scaled to 0 while the mid hook runs",
    );
    let sampler = Sampler::start(env);
    env.deployments()
        .delete("web", &DeleteParams::foreground())
        .await
        .unwrap();
    let api = env.deployments();
    wait_until("the Deployment gone", Duration::from_secs(30), || async {
        api.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    let created = Instant::now();
    env.apply(&deployment_yaml("web", "web:9", 3, true, RECREATE));
    let uid9 = env.deployment("web").await.uid();
    let s = env
        .wait_status("web", "web:9 rolled out", 120, |s| {
            s.target_uid == uid9 && s.phase == Some(RolloutPhase::Succeeded)
        })
        .await;
    wait_available(env, "web", 3).await;
    let snaps = sampler.stop().await;
    let d = env.deployment("web").await;
    let rev9 = s.current_revision.clone().unwrap_or_default();
    check(
        failures,
        image_of(&d) == "web:9" && d.spec.as_ref().and_then(|s| s.replicas) == Some(3),
        format!(
            "Recreate: the new object keeps its template and its 3 replicas: {} x {:?}",
            image_of(&d),
            d.spec.as_ref().and_then(|s| s.replicas)
        ),
    );
    check(
        failures,
        s.original_replicas.is_none(),
        format!("nothing left set aside: {:?}", s.original_replicas),
    );
    let foreign: Vec<&String> = snaps
        .iter()
        .filter(|s| s.at > created)
        .flat_map(|s| s.rs_replicas.iter().map(|(i, _)| i).chain(&s.app_images))
        .filter(|i| *i != "web:9")
        .collect();
    check(
        failures,
        foreign.is_empty(),
        format!("Recreate: the old template never reappears (ReplicaSets or pods of {foreign:?})"),
    );
    let jobs = env.all_jobs().await;
    let uid_of = |j: &k8s_openapi::api::batch::v1::Job| {
        j.annotations().get("ballast.dev/target-uid").cloned()
    };
    let old_smoke_succeeded = snaps
        .iter()
        .flat_map(|s| s.succeeded_jobs.iter())
        .any(|n| n.starts_with("web-smoke-") && !n.contains(&rev9));
    check(
        failures,
        !old_smoke_succeeded
            && !job_of(&jobs, "smoke").iter().any(|j| {
                uid_of(j).as_deref() == Some(old_uid.as_str())
                    && j.status.as_ref().and_then(|s| s.succeeded) == Some(1)
            }),
        "Recreate: the old object's mid hook Job never succeeded (it was stopped)",
    );
    let new_smoke: Vec<_> = job_of(&jobs, "smoke")
        .into_iter()
        .filter(|j| uid_of(j) == uid9)
        .collect();
    check(
        failures,
        new_smoke.len() == 1
            && new_smoke[0]
                .labels()
                .get("ballast.dev/attempt")
                .map(String::as_str)
                == Some("1")
            && new_smoke[0].status.as_ref().and_then(|s| s.succeeded) == Some(1),
        format!(
            "Recreate: one smoke Job for the new object, attempt 1, succeeded: {:?}",
            new_smoke.iter().map(|j| j.name_any()).collect::<Vec<_>>()
        ),
    );
    check(
        failures,
        most_live_hook_pods(&snaps, &["smoke"], &rev9) == 1,
        "Recreate: never two smoke pods of the new object live at once (and its one pod seen)",
    );
    let rss = env.replica_sets().await;
    let first_rs = rss.iter().map(|r| ts(&r.metadata.creation_timestamp)).min();
    let smoke_done = job_completed(&jobs, "smoke", &rev9);
    check(
        failures,
        matches!((first_rs, smoke_done), (Some(rs), Some(done)) if rs >= done),
        format!(
            "Recreate: the new object's first ReplicaSet ({first_rs:?}) only after its mid hook completed ({smoke_done:?})"
        ),
    );
}

/// Applies the strategy with `hooks` and waits until the controller has seen that spec, so the
/// next template change is decided under it.
async fn apply_strategy(env: &Env, hooks: &str) {
    env.apply(&strategy(hooks));
    let api = env.strategies();
    wait_until(
        "the strategy's spec observed",
        Duration::from_secs(30),
        || async {
            let s = api.get("web").await.ok()?;
            (s.status?.observed_generation == s.metadata.generation).then_some(())
        },
    )
    .await;
}

/// The one Job of `hook` for `revision`: attempt 1 and succeeded, else what there is.
fn one_successful_job(jobs: &[Job], hook: &str, revision: &str) -> Result<(), String> {
    let of = jobs_of_revision(jobs, hook, revision);
    let ok = of.len() == 1
        && of[0]
            .labels()
            .get("ballast.dev/attempt")
            .map(String::as_str)
            == Some("1")
        && of[0].status.as_ref().and_then(|s| s.succeeded) == Some(1);
    if ok {
        return Ok(());
    }
    Err(format!(
        "one {hook} Job for revision {revision}, attempt 1, succeeded; found {:?}",
        of.iter()
            .map(|j| (j.name_any(), j.status.as_ref().and_then(|s| s.succeeded)))
            .collect::<Vec<_>>()
    ))
}

/// When each pod of `web` of `image` became Ready (pods that never did are left out).
async fn ready_times(env: &Env, image: &str) -> Vec<Timestamp> {
    let pods: Api<Pod> = Api::namespaced(env.client(), &env.ns.name);
    pods.list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.containers[0].image.as_deref())
                == Some(image)
        })
        .filter_map(|p| {
            let c = p
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .find(|c| c.type_ == "Ready" && c.status == "True")?;
            c.last_transition_time.as_ref().map(|t| t.0)
        })
        .collect()
}

async fn set_min_ready(env: &Env, secs: i32) {
    env.deployments()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"minReadySeconds": secs}})),
        )
        .await
        .unwrap();
}

async fn updated(env: &Env) -> i32 {
    env.deployment("web")
        .await
        .status
        .and_then(|s| s.updated_replicas)
        .unwrap_or(0)
}

/// Sets `web`'s image and waits until `hook` runs in `phase`; returns the new revision.
async fn start_revision(
    env: &Env,
    image: &str,
    phase: RolloutPhase,
    hook: &str,
    secs: u64,
) -> String {
    env.set_image("web", image).await;
    env.wait_status("web", &format!("{hook} running for {image}"), secs, |s| {
        s.phase == Some(phase) && running(s, hook)
    })
    .await
    .current_revision
    .unwrap()
}

/// `kubectl rollout resume`. With the admission gate the revision hold refuses it while pre or
/// mid hooks run: that refusal, with its reason, is checked; in pause-at-rest mode it passes.
fn resume(env: &Env, failures: &mut Vec<String>, phase: &str) {
    let out = env
        .c
        .kubectl(&["rollout", "resume", "deployment/web", "-n", &env.ns.name]);
    let err = String::from_utf8_lossy(&out.stderr);
    if env.admission() {
        check(
            failures,
            !out.status.success() && err.contains("held by RolloutStrategy web"),
            format!("{phase}: the resume refused by the revision hold, saying why ({err})"),
        );
    } else {
        check(
            failures,
            out.status.success(),
            format!("{phase}: kubectl rollout resume works ({err})"),
        );
    }
}

async fn wait_paused_again(env: &Env) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if env.paused("web").await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// F10: what users do with `kubectl` to a governed Deployment and its strategy mid-rollout.
///
/// - `kubectl rollout resume` is not a way around a hook. With the admission gate the revision
///   hold refuses it (checked, with its message): no pod of the new revision before the pre hook
///   passes, no step past an approval gate. In pause-at-rest mode ballast pauses the Deployment
///   again and an approval gate stays closed until it is approved, but before ballast sees the
///   resume the Deployment controller may take one rollout step (a new ReplicaSet, up to
///   maxSurge + maxUnavailable pods): that step is bounded, and measured as a `gap`.
/// - `kubectl scale` during a mid hook is the user's: the hook runs once, the rollout completes
///   at the new count, and the post hooks run after that. With Recreate (ballast holds the
///   Deployment at 0 while its mid hooks run), old pods the scale brings back are gone again at
///   once, and the rollout ends at the user's new count, not at the count ballast set aside.
/// - Renaming the hook that runs: hooks are identified by name, so the old name is a hook that
///   left the spec. Its Job is cancelled (deleted with its pod, never counted as a success), and
///   the hook under its new name runs once for the revision, only after the cancelled pod is
///   gone: never two pods of it at once, never a completed run under each name.
#[tokio::test]
async fn f10_a_resume_a_scale_and_a_rename_lose_nothing() {
    let env = Env::new("f10-user").await;
    let mut failures = vec![];
    // What pause-at-rest cannot promise against a user's own write to the Deployment: measured
    // and written in the row, not failed (see `gap`).
    let mut gaps = vec![];
    let stable = adopt(
        &env,
        4,
        &format!(
            "  pre: [{{name: migrate, job: {}}}]\n",
            job_hook("m:1", "10s", false)
        ),
    )
    .await;

    // `kubectl rollout resume` while the pre hook runs.
    let sampler = Sampler::start(&env);
    let rev2 = start_revision(&env, "web:2", RolloutPhase::PreHook, "migrate", 40).await;
    resume(&env, &mut failures, "PreHook");
    check(
        &mut failures,
        wait_paused_again(&env).await,
        "PreHook: paused again within 10 s of the resume",
    );
    let s = env.wait_succeeded_after("web", &stable, 90).await;
    let stable = s.stable_revision.clone().unwrap();
    let snaps = sampler.stop().await;
    let jobs = env.all_jobs().await;
    if let Err(e) = one_successful_job(&jobs, "migrate", &rev2) {
        failures.push(format!("PreHook resume: {e}"));
    }
    let migrate_done = job_completed(&jobs, "migrate", &rev2);
    let rss = env.replica_sets().await;
    let rs2 = rs_of_image(&rss, "web:2").map(|r| ts(&r.metadata.creation_timestamp));
    held(
        &env,
        &mut failures,
        &mut gaps,
        matches!((rs2, migrate_done), (Some(rs), Some(done)) if rs >= done),
        format!(
            "PreHook resume: a ReplicaSet of web:2 existed before migrate passed (created {rs2:?}, migrate completed {migrate_done:?})"
        ),
    );
    let migrate_job = jobs_of_revision(&jobs, "migrate", &rev2)
        .first()
        .map(|j| j.name_any())
        .unwrap_or_default();
    let before_migrate: Vec<&Snap> = snaps
        .iter()
        .take_while(|s| !s.succeeded_jobs.contains(&migrate_job))
        .collect();
    let early = before_migrate
        .iter()
        .filter(|s| s.app_images.iter().any(|i| i == "web:2"))
        .count();
    let early_rs = before_migrate
        .iter()
        .flat_map(|s| s.rs_replicas.iter())
        .filter(|(i, _)| i == "web:2")
        .map(|(_, n)| *n)
        .max();
    held(
        &env,
        &mut failures,
        &mut gaps,
        early == 0,
        format!(
            "PreHook resume: pods of web:2 before migrate passed (in {early} of {} looks; ReplicaSet replicas up to {early_rs:?})",
            before_migrate.len()
        ),
    );
    // What re-pausing does guarantee: the Deployment controller gets one step, no more
    // (maxSurge 1 + maxUnavailable 1 of 4).
    check(
        &mut failures,
        early_rs.unwrap_or(0) <= 2,
        format!(
            "PreHook resume: web:2 held to one rollout step before migrate passed (ReplicaSet replicas up to {early_rs:?})"
        ),
    );

    // `kubectl rollout resume` while an approval gate waits.
    apply_strategy(&env, "  mid: [{name: gate, at: 2, approval: {}}]\n").await;
    // New pods count as available 3 s after they are ready, so the rollout moves one pod at a
    // time slowly enough that a point between its start and its end exists to hold at.
    set_min_ready(&env, 3).await;
    let sampler = Sampler::start(&env);
    env.set_image("web", "web:3").await;
    let s = env
        .wait_phase("web", RolloutPhase::WaitingApproval, None, 60)
        .await;
    let rev3 = s.current_revision.clone().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let at_gate = rs_of_image(&env.replica_sets().await, "web:3")
        .and_then(|r| r.spec.as_ref()?.replicas)
        .unwrap_or(0);
    let updated_at_gate = updated(&env).await;
    check(
        &mut failures,
        updated_at_gate < 4,
        format!(
            "WaitingApproval: before any resume, the gate holds the rollout short of completion ({updated_at_gate} of 4 updated, ReplicaSet at {at_gate})"
        ),
    );
    let resumed = Instant::now();
    resume(&env, &mut failures, "WaitingApproval");
    check(
        &mut failures,
        wait_paused_again(&env).await,
        "WaitingApproval: paused again within 10 s of the resume",
    );
    // Time for a rollout let loose to move on.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let s = env.status("web").await;
    let updated_after = updated(&env).await;
    check(
        &mut failures,
        s.phase == Some(RolloutPhase::WaitingApproval)
            && s.hooks
                .iter()
                .any(|h| h.name == "gate" && h.phase == HookPhase::Waiting),
        format!(
            "WaitingApproval resume: the gate stays closed: {:?} {:?}",
            s.phase, s.hooks
        ),
    );
    held(
        &env,
        &mut failures,
        &mut gaps,
        updated_after <= updated_at_gate,
        format!(
            "WaitingApproval resume: pods updated without the approval ({updated_at_gate} at the gate, {updated_after} 5 s after the resume)"
        ),
    );
    check(
        &mut failures,
        updated_after <= updated_at_gate + 1 && updated_after < 4,
        format!(
            "WaitingApproval resume: at most one more pod updated without the approval, never all ({updated_at_gate} at the gate, {updated_after} 5 s after the resume)"
        ),
    );
    let approved = Instant::now();
    env.annotate("web", "ballast.dev/approve", &rev3).await;
    let s = env.wait_succeeded_after("web", &stable, 90).await;
    let stable = s.stable_revision.clone().unwrap();
    set_min_ready(&env, 0).await;
    let snaps = sampler.stop().await;
    let past_gate = snaps
        .iter()
        .filter(|s| s.at > resumed && s.at < approved)
        .flat_map(|s| s.rs_replicas.iter())
        .filter(|(i, _)| i == "web:3")
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(0);
    held(
        &env,
        &mut failures,
        &mut gaps,
        past_gate <= at_gate,
        format!(
            "WaitingApproval resume: the new ReplicaSet grew past the gate ({at_gate} replicas at the gate, {past_gate} before the approval)"
        ),
    );
    check(
        &mut failures,
        past_gate <= at_gate + 1,
        format!(
            "WaitingApproval resume: the new ReplicaSet grew by at most one step before the approval ({at_gate} replicas at the gate, {past_gate} before it)"
        ),
    );
    check(
        &mut failures,
        s.hooks
            .iter()
            .any(|h| h.name == "gate" && h.reason.as_deref() == Some("Approved")),
        format!("the gate opened by the approval: {:?}", s.hooks),
    );

    // `kubectl scale` while a mid hook runs.
    apply_strategy(
        &env,
        &format!(
            "  mid: [{{name: smoke, at: 50%, job: {}}}]\n  post: [{{name: purge, job: {}}}]\n",
            job_hook("s:1", "15s", false),
            job_hook("p:1", "1s", false)
        ),
    )
    .await;
    let sampler = Sampler::start(&env);
    let rev4 = start_revision(&env, "web:4", RolloutPhase::MidHook, "smoke", 60).await;
    env.c.kubectl_ok(&[
        "scale",
        "deployment/web",
        "--replicas=6",
        "-n",
        &env.ns.name,
    ]);
    let s = env.wait_succeeded_after("web", &stable, 120).await;
    let stable = s.stable_revision.clone().unwrap();
    let snaps = sampler.stop().await;
    let jobs = env.all_jobs().await;
    for hook in ["smoke", "purge"] {
        if let Err(e) = one_successful_job(&jobs, hook, &rev4) {
            failures.push(format!("scale: {e}"));
        }
    }
    check(
        &mut failures,
        most_live_hook_pods(&snaps, &["smoke"], &rev4) == 1,
        "scale: never two smoke pods live at once (and its one pod seen)",
    );
    let ready = ready_times(&env, "web:4").await;
    let created = |hook: &str| {
        jobs_of_revision(&jobs, hook, &rev4)
            .first()
            .map(|j| ts(&j.metadata.creation_timestamp))
    };
    let (smoke_at, purge_at) = (created("smoke"), created("purge"));
    let ready_before =
        |t: Option<Timestamp>| t.map_or(0, |t| ready.iter().filter(|r| **r <= t).count());
    check(
        &mut failures,
        ready_before(smoke_at) >= 2,
        format!(
            "scale: smoke started once 2 (50% of 4) web:4 pods were available ({} were)",
            ready_before(smoke_at)
        ),
    );
    check(
        &mut failures,
        ready.len() == 6 && ready_before(purge_at) == 6,
        format!(
            "scale: purge started once all 6 web:4 pods were available ({} of {} were)",
            ready_before(purge_at),
            ready.len()
        ),
    );
    wait_available(&env, "web", 6).await;
    let d = env.deployment("web").await;
    check(
        &mut failures,
        image_of(&d) == "web:4" && d.spec.as_ref().and_then(|s| s.replicas) == Some(6),
        "scale: the user's 6 replicas of web:4",
    );

    // The hook that runs is renamed.
    apply_strategy(
        &env,
        &format!(
            "  pre: [{{name: migrate, job: {}}}]\n",
            job_hook("m:1", "20s", false)
        ),
    )
    .await;
    let sampler = Sampler::start(&env);
    let rev5 = start_revision(&env, "web:5", RolloutPhase::PreHook, "migrate", 40).await;
    apply_strategy(
        &env,
        &format!(
            "  pre: [{{name: migrate-db, job: {}}}]\n",
            job_hook("m:1", "5s", false)
        ),
    )
    .await;
    let s = env.wait_succeeded_after("web", &stable, 120).await;
    let snaps = sampler.stop().await;
    let jobs = env.all_jobs().await;
    let old: Vec<String> = jobs_of_revision(&jobs, "migrate", &rev5)
        .iter()
        .map(|j| j.name_any())
        .collect();
    let old_succeeded = snaps.iter().flat_map(|s| s.succeeded_jobs.iter()).any(|n| {
        n.starts_with("web-migrate-") && n.contains(&rev5) && !n.starts_with("web-migrate-db-")
    });
    check(
        &mut failures,
        !old_succeeded && old.is_empty(),
        format!(
            "rename: the Job under the old name was cancelled, never succeeded (left: {old:?})"
        ),
    );
    if let Err(e) = one_successful_job(&jobs, "migrate-db", &rev5) {
        failures.push(format!("rename: {e}"));
    }
    let most = most_live_hook_pods(&snaps, &["migrate", "migrate-db"], &rev5);
    check(
        &mut failures,
        most == 1,
        format!("rename: never two pods of the hook (either name) live at once, one seen ({most})"),
    );
    let listed: Vec<_> = s
        .hooks
        .iter()
        .map(|h| (h.name.as_str(), h.phase, h.attempt, h.job_name.as_deref()))
        .collect();
    check(
        &mut failures,
        s.hooks
            .iter()
            .any(|h| h.name == "migrate-db" && h.phase == HookPhase::Succeeded),
        format!("rename: migrate-db recorded as succeeded: {listed:?}"),
    );
    check(
        &mut failures,
        !s.hooks.iter().any(|h| {
            h.name != "migrate-db" && matches!(h.phase, HookPhase::Pending | HookPhase::Running)
        }),
        format!(
            "rename: no hook shown Running whose Job was cancelled (status.hooks after Succeeded: {listed:?})"
        ),
    );
    let rss = env.replica_sets().await;
    let rs5 = rs_of_image(&rss, "web:5").map(|r| ts(&r.metadata.creation_timestamp));
    let done = job_completed(&jobs, "migrate-db", &rev5);
    check(
        &mut failures,
        matches!((rs5, done), (Some(rs), Some(done)) if rs >= done),
        format!("rename: no ReplicaSet of web:5 ({rs5:?}) before migrate-db passed ({done:?})"),
    );

    // `kubectl scale` while a Recreate mid hook runs, i.e. while ballast holds the Deployment at
    // 0 with the count set aside: the user's new count is the one to end with, and the old pods
    // do not come back while the hook runs.
    let stable = s.stable_revision.clone().unwrap();
    env.deployments()
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"spec": {"strategy": {"type": "Recreate", "rollingUpdate": null}}}),
            ),
        )
        .await
        .unwrap();
    apply_strategy(
        &env,
        &format!(
            "  mid: [{{name: smoke, at: 1, job: {}}}]\n",
            job_hook("s:1", "15s", false)
        ),
    )
    .await;
    let sampler = Sampler::start(&env);
    let rev6 = start_revision(&env, "web:6", RolloutPhase::MidHook, "smoke", 60).await;
    let scaled = Instant::now();
    env.c.kubectl_ok(&[
        "scale",
        "deployment/web",
        "--replicas=5",
        "-n",
        &env.ns.name,
    ]);
    let s = env.wait_succeeded_after("web", &stable, 120).await;
    let snaps = sampler.stop().await;
    let jobs = env.all_jobs().await;
    if let Err(e) = one_successful_job(&jobs, "smoke", &rev6) {
        failures.push(format!("Recreate scale: {e}"));
    }
    let smoke_job = jobs_of_revision(&jobs, "smoke", &rev6)
        .first()
        .map(|j| j.name_any())
        .unwrap_or_default();
    let during: Vec<&Snap> = snaps
        .iter()
        .filter(|s| s.at > scaled)
        .take_while(|s| !s.succeeded_jobs.contains(&smoke_job))
        .collect();
    let old_back = during
        .iter()
        .filter(|s| s.app_images.iter().any(|i| i != "web:6"))
        .count();
    let old_rs = during
        .iter()
        .flat_map(|s| s.rs_replicas.iter())
        .filter(|(i, _)| i != "web:6")
        .map(|(_, n)| *n)
        .max();
    gap(
        &mut gaps,
        old_back == 0,
        format!(
            "Recreate scale: old pods came back while the mid hook ran (in {old_back} of {} looks; old ReplicaSet replicas up to {old_rs:?})",
            during.len()
        ),
    );
    let last_old = during
        .iter()
        .filter(|s| s.app_images.iter().any(|i| i != "web:6"))
        .map(|s| s.at.duration_since(scaled))
        .max();
    check(
        &mut failures,
        last_old.is_none_or(|d| d < Duration::from_secs(10)),
        format!(
            "Recreate scale: old pods gone again within 10 s of the scale while the mid hook ran (last seen {last_old:?} after it)"
        ),
    );
    let d = env.deployment("web").await;
    check(
        &mut failures,
        image_of(&d) == "web:6"
            && d.spec.as_ref().and_then(|s| s.replicas) == Some(5)
            && s.original_replicas.is_none(),
        format!(
            "Recreate scale: the user's 5 replicas of web:6, nothing left set aside: {} x {:?}, {:?}",
            image_of(&d),
            d.spec.as_ref().and_then(|s| s.replicas),
            s.original_replicas
        ),
    );

    // Released: the user's last template and replica count, not paused.
    env.strategies()
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    let api = env.strategies();
    wait_until("the strategy gone", Duration::from_secs(60), || async {
        api.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    let d = env.deployment("web").await;
    check(
        &mut failures,
        image_of(&d) == "web:6"
            && d.spec.as_ref().and_then(|s| s.replicas) == Some(5)
            && !env.paused("web").await,
        format!(
            "released with web:6 x 5, not paused: {} x {:?}, paused {}",
            image_of(&d),
            d.spec.as_ref().and_then(|s| s.replicas),
            env.paused("web").await
        ),
    );
    let checked = format!(
        "resume: refused by the revision hold (pause-at-rest: paused again within 10 s), no pod of the new revision before the pre hook passed and no step past the approval gate (pause-at-rest: one step at most), the pre hook's Job succeeded once, an approval gate stays closed; scale: one Job per hook, the mid hook started at its point, the post hook after all 6 pods were available, the user's count kept; Recreate scale: old pods gone within 10 s, the user's count at the end, not the one set aside; rename: the old name's Job cancelled and never succeeded, the new name runs once (attempt 1), never two pods of it at once, no ReplicaSet before it passed; released unpaused with the last template and count. {}",
        if gaps.is_empty() {
            "Not seen this run: any step of the Deployment controller between a user's write and ballast's answer.".to_string()
        } else {
            format!(
                "Seen this run, and beyond what ballast can prevent, since it answers a user's write only after the Deployment controller acted on it: {}",
                gaps.join("; ")
            )
        }
    );
    verdict(
        "F10",
        "kubectl rollout resume during PreHook and WaitingApproval; kubectl scale during a mid hook (RollingUpdate and Recreate); the running hook renamed",
        &checked,
        &failures,
    );
}

#[tokio::test]
async fn f11_a_strategy_created_during_a_rollout_lets_it_complete() {
    let env = Env::new("f11-midway").await;
    let mut yaml = deployment_yaml("web", "web:1", 4, false, ROLLING);
    yaml = yaml.replace("  replicas: 4\n", "  replicas: 4\n  minReadySeconds: 4\n");
    env.apply(&yaml);
    wait_until("web available", Duration::from_secs(60), || async {
        let s = env.deployment("web").await.status?;
        (s.available_replicas == Some(4) && s.updated_replicas == Some(4)).then_some(())
    })
    .await;
    env.set_image("web", "web:2").await;
    env.apply(&strategy(&format!(
        "  pre: [{{name: migrate, job: {}}}]\n",
        job_hook("m:1", "2s", false)
    )));
    let mut failures = vec![];
    let s = env
        .wait_status("web", "waiting for the rollout", 30, |s| {
            s.message
                .as_deref()
                .is_some_and(|m| m.contains("to complete"))
                || s.stable_revision.is_some()
        })
        .await;
    check(
        &mut failures,
        s.stable_revision.is_none(),
        "it waited instead of adopting a half-done rollout",
    );
    let mut paused_mid = false;
    let s = loop {
        let d = env.deployment("web").await;
        let st = d.status.clone().unwrap_or_default();
        let done = st.updated_replicas == Some(4)
            && st.replicas == Some(4)
            && st.available_replicas == Some(4);
        if d.spec.as_ref().unwrap().paused == Some(true) && !done {
            paused_mid = true;
        }
        let s = env.status("web").await;
        if s.stable_revision.is_some() {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    check(
        &mut failures,
        !paused_mid,
        "never paused before the rollout completed",
    );
    let rss = env.replica_sets().await;
    let serving: Vec<_> = rss
        .iter()
        .filter(|r| r.status.as_ref().is_some_and(|s| s.replicas > 0))
        .collect();
    check(
        &mut failures,
        serving.len() == 1 && image_of(&env.deployment("web").await) == "web:2",
        format!(
            "one ReplicaSet serves, of web:2 ({} serving)",
            serving.len()
        ),
    );
    check(
        &mut failures,
        env.all_jobs().await.is_empty() && s.phase == Some(RolloutPhase::Idle),
        "adopted without hooks, then governs",
    );
    // Then it governs: the next image change runs the hook.
    env.set_image("web", "web:3").await;
    let s = env
        .wait_succeeded_after("web", s.stable_revision.as_deref().unwrap(), 90)
        .await;
    check(
        &mut failures,
        s.hooks.len() == 1,
        "the next revision ran its hook",
    );
    verdict(
        "F11",
        "a strategy created while its Deployment rolls out",
        "not paused before the rollout completes; one ReplicaSet serves; then adopted and the next revision runs its hooks",
        &failures,
    );
}

#[tokio::test]
async fn f12_a_retry_waits_for_the_previous_attempts_pod_to_go() {
    let env = Env::new("f12-slow-delete").await;
    // A pod that runs for 10 minutes and, once deleted, lingers until the test lets it go.
    let hold = "ballast.dev/test-hold";
    let job = format!(
        r#"{{backoffLimit: 0, template: {{metadata: {{finalizers: ["{hold}"], annotations: {{pod-complete.stage.kwok.x-k8s.io/delay: "600s", pod-complete.stage.kwok.x-k8s.io/jitter-delay: "600s"}}}}, spec: {{restartPolicy: Never, containers: [{{name: t, image: "m:1"}}]}}}}}}"#
    );
    adopt(
        &env,
        1,
        &format!("  pre: [{{name: migrate, timeoutSeconds: 5, pendingTimeoutSeconds: 60, failurePolicy: Retry, retries: 1, job: {job}}}]\n"),
    )
    .await;
    env.set_image("web", "web:2").await;
    let pods: Api<Pod> = Api::namespaced(env.client(), &env.ns.name);
    let lp = ListParams::default().labels("ballast.dev/hook=migrate");
    // Attempt 1 times out; its Job is deleted; its pod lingers.
    wait_until(
        "attempt 1's pod terminating",
        Duration::from_secs(60),
        || async {
            let ps = pods.list(&lp).await.ok()?.items;
            ps.iter()
                .any(|p| p.metadata.deletion_timestamp.is_some())
                .then_some(())
        },
    )
    .await;
    let mut most_running = 0;
    let mut attempt2_before_gone = false;
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        let ps = pods.list(&lp).await.unwrap().items;
        let live = ps
            .iter()
            .filter(|p| {
                !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            })
            .count();
        most_running = most_running.max(live);
        attempt2_before_gone |= ps
            .iter()
            .any(|p| p.labels().get("ballast.dev/attempt").map(String::as_str) == Some("2"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the old pod go: attempt 2 starts.
    for p in pods.list(&lp).await.unwrap().items {
        let _ = pods
            .patch(
                &p.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
    let s = env
        .wait_status("web", "attempt 2 started", 60, |s| {
            s.hooks
                .iter()
                .any(|h| h.attempt == 2 && h.job_name.is_some())
        })
        .await;
    let mut failures = vec![];
    check(
        &mut failures,
        !attempt2_before_gone,
        "no pod of attempt 2 while attempt 1's pod was still there",
    );
    check(
        &mut failures,
        most_running <= 1,
        format!("at most one live hook pod ({most_running})"),
    );
    check(&mut failures, s.hooks[0].attempt == 2, "attempt 2 followed");
    // Clean up the held pods so the namespace can go.
    for p in pods.list(&lp).await.unwrap().items {
        let _ = pods
            .patch(
                &p.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
    verdict(
        "F12",
        "Retry after a timeout while the timed-out pod is slow to delete",
        "no pod of attempt N+1 while attempt N's pod exists; never two live pods of the hook; attempt N+1 starts once it is gone",
        &failures,
    );
}

#[tokio::test]
async fn f15_a_cleared_status_and_a_zero_ttl_lose_nothing() {
    let env = Env::new("f15-status").await;
    let stable = adopt(
        &env,
        2,
        &format!(
            "  pre: [{{name: migrate, job: {}}}]\n  post: [{{name: purge, job: {}}}]\n",
            job_hook("m:1", "12s", false),
            job_hook("p:1", "1s", false).replacen(
                "{backoffLimit: 0,",
                "{backoffLimit: 0, ttlSecondsAfterFinished: 0,",
                1
            )
        ),
    )
    .await;
    env.set_image("web", "web:2").await;
    env.wait_status("web", "migrate running", 40, |s| {
        s.hooks
            .iter()
            .any(|h| h.name == "migrate" && h.phase == HookPhase::Running)
    })
    .await;
    // Someone clears the status subresource while the hook runs.
    env.strategies()
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": null})),
        )
        .await
        .unwrap();
    let s = env.wait_succeeded_after("web", &stable, 120).await;
    let jobs = env.all_jobs().await;
    let migrate = jobs
        .iter()
        .filter(|j| j.labels().get("ballast.dev/hook").map(String::as_str) == Some("migrate"))
        .count();
    let mut failures = vec![];
    check(
        &mut failures,
        migrate == 1,
        format!("one migrate Job ({migrate})"),
    );
    check(
        &mut failures,
        s.hooks
            .iter()
            .all(|h| h.phase == HookPhase::Succeeded && h.attempt == 1),
        format!("every hook succeeded at attempt 1: {:?}", s.hooks),
    );
    check(
        &mut failures,
        env.events("HookFailed").await.is_empty(),
        "no failure recorded (the TTL 0 post hook succeeded)",
    );
    check(
        &mut failures,
        image_of(&env.deployment("web").await) == "web:2",
        "rolled out",
    );
    verdict(
        "F15",
        "status subresource cleared mid-hook; a job hook with ttlSecondsAfterFinished: 0",
        "the running hook is adopted (one Job, attempt 1), the rollout completes; the TTL-0 hook's success is recorded as a success",
        &failures,
    );
}

#[tokio::test]
async fn container_hooks_run_in_a_restricted_namespace() {
    let env = Env::new("psa-restricted").await;
    env.c.kubectl_ok(&[
        "label",
        "namespace",
        &env.ns.name,
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    let mut yaml = deployment_yaml("web", "web:1", 1, false, ROLLING);
    yaml = yaml.replace(
        "      imagePullSecrets: [{name: regcred}]\n",
        "      imagePullSecrets: [{name: regcred}]\n      securityContext: {runAsNonRoot: true, runAsUser: 1000, seccompProfile: {type: RuntimeDefault}}\n",
    );
    yaml = yaml.replace(
        "          securityContext: {runAsNonRoot: true}\n",
        "          securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}\n",
    );
    env.apply(&yaml);
    wait_until("web available", Duration::from_secs(60), || async {
        let s = env.deployment("web").await.status?;
        (s.available_replicas == Some(1)).then_some(())
    })
    .await;
    env.apply(&strategy(
        "  pre: [{name: migrate, container: {from: app, command: [migrate]}}]\n",
    ));
    let stable = env
        .wait_phase("web", RolloutPhase::Idle, None, 30)
        .await
        .stable_revision
        .unwrap();
    env.set_image("web", "web:2").await;
    let s = env.wait_succeeded_after("web", &stable, 90).await;
    assert_eq!(s.hooks[0].phase, HookPhase::Succeeded, "{:?}", s.hooks);
}
