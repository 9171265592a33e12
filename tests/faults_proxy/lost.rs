//! "Nothing lost", checked on one rollout run through the fault proxy: a [`Case`] (a Deployment
//! and its hooks) is adopted, the image changes, one [`Fault`] hits the operator's traffic, a
//! killed operator is started again, and the run goes on until the new revision succeeded.
//! A [`Monitor`] polls the cluster all along for what must never be seen even for a moment (two
//! pods of one hook running, a new pod before the pre hooks passed, a mid hook before its point
//! or the rollout passing it while the hook runs, a post hook before the rollout completed); at
//! the end the proxy's record and the cluster are checked for the rest (one Job created per
//! hook, revision and attempt; one success per hook; the user's template and replicas; nothing
//! left paused once the strategy is gone).

use crate::monitor::{Monitor, Observed, image_of_rs};
use crate::support::proxy::{Fate, FaultProxy};
use crate::support::rollout::{ROLLING, deployment_yaml};
use crate::support::{Operator, TestNamespace, cluster, wait_until};
use ballast::api::rollout_strategy::APPROVE_ANNOTATION;
use ballast::api::{HookPhase, RolloutPhase, RolloutStrategy};
use jiff::SignedDuration;
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::PodTemplateSpec,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

/// A Deployment `web` (image web:1 → web:2) and the hooks of its strategy.
#[derive(Clone, Debug)]
pub struct Case {
    pub name: &'static str,
    pub replicas: i32,
    pub recreate: bool,
    /// Job hooks before the rollout.
    pub pre: Vec<&'static str>,
    /// Job hooks part-way: (name, at) in replicas (ignored by Recreate: there they run with no
    /// pod left).
    pub mid: Vec<(&'static str, i32)>,
    /// An approval gate at this many updated-and-available replicas.
    pub approval_at: Option<i32>,
    /// Job hooks after the rollout.
    pub post: Vec<&'static str>,
}

/// Each hook pod runs this long (kwok then completes it).
const HOOK_RUNS: &str = "1s";
/// Name of the approval gate.
pub const APPROVAL: &str = "go-live";
/// Seconds a new pod is ready before it counts as available (see [`run`]).
pub const MIN_READY_SECONDS: i32 = 1;
/// A RollingUpdate's surge: how far past a mid point the Deployment may get before the pause
/// lands.
pub const SURGE: i32 = 1;

impl Case {
    /// pre → mid (a smoke test, then an approval gate) → post, rolling one pod at a time.
    pub fn rolling() -> Self {
        Self {
            name: "rolling pre→mid(smoke, approval)→post",
            replicas: 4,
            recreate: false,
            pre: vec!["migrate"],
            mid: vec![("smoke", 1)],
            approval_at: Some(2),
            post: vec!["purge"],
        }
    }

    /// Recreate with a mid hook that runs between the old pods and the new ones.
    pub fn recreate() -> Self {
        Self {
            name: "Recreate with a mid hook",
            replicas: 2,
            recreate: true,
            pre: vec![],
            mid: vec![("schema", 1)],
            approval_at: None,
            post: vec![],
        }
    }

    fn strategy_yaml(&self) -> String {
        let job = |name: &str| {
            format!(
                "{{name: {name}, job: {}}}",
                crate::support::rollout::job_hook(&format!("{name}:1"), HOOK_RUNS, false)
            )
        };
        let mut mid: Vec<String> = self
            .mid
            .iter()
            .map(|(name, at)| {
                let j = job(name);
                format!("{{at: {at}, {}", &j[1..])
            })
            .collect();
        if let Some(at) = self.approval_at {
            mid.push(format!("{{name: {APPROVAL}, at: {at}, approval: {{}}}}"));
        }
        let list = |v: Vec<String>| format!("[{}]", v.join(", "));
        format!(
            "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {{name: web}}\nspec:\n  targetRef: {{name: web}}\n  pre: {}\n  mid: {}\n  post: {}\n",
            list(self.pre.iter().map(|h| job(h)).collect()),
            list(mid),
            list(self.post.iter().map(|h| job(h)).collect()),
        )
    }

    fn job_hooks(&self) -> Vec<&'static str> {
        let mut v = self.pre.clone();
        v.extend(self.mid.iter().map(|(n, _)| *n));
        v.extend(self.post.iter().copied());
        v
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    None,
    /// SIGKILL right after the Nth counted write of the rollout; then a new operator.
    KillAfter(u64),
    /// The Nth counted write is applied, its response dropped.
    DropResponseOf(u64),
    /// SIGKILL right after the first write of the strategy object itself (not its status):
    /// with an approval gate, the write that consumes the approval annotation.
    KillAfterStrategyWrite,
    /// The operator is restarted just before the image changes, and the new one gets every
    /// watch event this many milliseconds late for a minute.
    SlowWatchesAfterRestart(u64),
}

/// What one run saw.
#[derive(Debug)]
pub struct Outcome {
    pub fault: Fault,
    /// Counted writes from the image change until the run settled (before the release).
    pub writes: u64,
    /// Whether the fault was carried out (a short run may end before the Nth write).
    pub hit: bool,
    pub restarts: u32,
    /// Approvals the run had to give (more than one: an approval was lost).
    pub approvals: u32,
    pub elapsed: Duration,
    /// Mid points the Deployment controller had got past (beyond the surge) before the pause
    /// landed: documented ("a few more pods than `at`"), reported, not failed.
    pub overshoots: Vec<String>,
    /// Job creates the API server refused because the Job existed (harmless, but a sign the
    /// operator acted on a stale view).
    pub refused_creates: usize,
    pub failures: Vec<String>,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Runs `case` once with `fault` in a namespace of its own.
pub async fn run(case: &Case, fault: Fault, prefix: &str) -> Outcome {
    let started = Instant::now();
    let c = cluster().await;
    let ns = TestNamespace::new(&c, prefix).await;
    let client = c.client.clone();
    let proxy = FaultProxy::start(&c);
    let kubeconfig = proxy.operator_kubeconfig(&c);
    let lease = |n: u32| format!("ballast-{}-{n}", ns.name);
    let mut op = Operator::start_with_kubeconfig(&kubeconfig, &ns.name, &lease(0), &[]);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let strategies: Api<RolloutStrategy> = Api::namespaced(client.clone(), &ns.name);
    let mut failures = vec![];

    let kind = if case.recreate {
        "{type: Recreate}"
    } else {
        ROLLING
    };
    let mut d: Deployment =
        serde_yaml::from_str(&deployment_yaml("web", "web:1", case.replicas, false, kind)).unwrap();
    // kwok's pods are ready the moment they run; without a moment before they count as
    // available, the Deployment controller finishes the rollout before any pause can land.
    d.spec.as_mut().unwrap().min_ready_seconds = Some(MIN_READY_SECONDS);
    deployments
        .create(&PostParams::default(), &d)
        .await
        .unwrap();
    wait_rolled_out(&deployments, case.replicas, "web:1").await;
    let s: RolloutStrategy = serde_yaml::from_str(&case.strategy_yaml()).unwrap();
    strategies.create(&PostParams::default(), &s).await.unwrap();
    let stable = wait_until("the adoption", Duration::from_secs(60), || async {
        let s = strategies.get("web").await.ok()?.status?;
        (s.phase == Some(RolloutPhase::Idle))
            .then_some(s.stable_revision)
            .flatten()
    })
    .await;

    let before = proxy.counted_writes();
    let mut restarts = 0;
    let mut patience = Duration::from_secs(150);
    match fault {
        Fault::None => {}
        Fault::KillAfter(n) => proxy.kill_after_write(n, op.pid()),
        Fault::DropResponseOf(n) => proxy.drop_response_of_write(n),
        Fault::KillAfterStrategyWrite => {
            proxy.count_writes_where(|method, path| {
                method == "PATCH" && path.ends_with("/rolloutstrategies/web")
            });
            proxy.kill_after_write(1, op.pid());
        }
        Fault::SlowWatchesAfterRestart(ms) => {
            op.kill();
            proxy.delay_watch_events(Duration::from_millis(ms), Duration::from_secs(60));
            restarts += 1;
            op = Operator::start_with_kubeconfig(&kubeconfig, &ns.name, &lease(restarts), &[]);
            patience += Duration::from_secs(90);
        }
    }
    let approved = Arc::new(AtomicBool::new(false));
    let monitor = Monitor::spawn(client.clone(), &ns.name, case.clone(), approved.clone());
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "web:2"}]}}}});
    let user_template: PodTemplateSpec = deployments
        .patch("web", &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .unwrap()
        .spec
        .unwrap()
        .template;

    let mut approvals = 0;
    let mut last_approval = None;
    let deadline = Instant::now() + patience;
    let mut last = None;
    let done = loop {
        if !op.is_running() {
            restarts += 1;
            op = Operator::start_with_kubeconfig(&kubeconfig, &ns.name, &lease(restarts), &[]);
        }
        let obj = strategies.get("web").await.unwrap();
        let s = obj.status.clone().unwrap_or_default();
        // Approve once; approve again only if the gate still waits, without the annotation,
        // well after the last approval (the operator removes it when it records the
        // approval, and the status may lag that by a moment): then the approval was lost.
        if s.phase == Some(RolloutPhase::WaitingApproval)
            && let Some(rev) = s.current_revision.as_deref()
            && rev != stable
            && !obj.annotations().contains_key(APPROVE_ANNOTATION)
            && last_approval.is_none_or(|t: Instant| t.elapsed() > Duration::from_secs(5))
        {
            approved.store(true, Ordering::SeqCst);
            approvals += 1;
            last_approval = Some(Instant::now());
            let patch = json!({"metadata": {"annotations": {APPROVE_ANNOTATION: rev}}});
            strategies
                .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .unwrap();
        }
        if s.phase == Some(RolloutPhase::Succeeded)
            && s.stable_revision.as_deref().is_some_and(|r| r != stable)
        {
            break Some(s);
        }
        if matches!(
            s.phase,
            Some(RolloutPhase::Failed | RolloutPhase::RolledBack)
        ) {
            failures.push(format!("the revision ended {:?}: {:?}", s.phase, s.message));
            break None;
        }
        if Instant::now() > deadline {
            failures.push(format!(
                "wedged: no success within {patience:?}; last status {:?} / {:?} / {:?}",
                s.phase, s.current_hook, s.message
            ));
            break None;
        }
        last = Some(s);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = last;
    if approvals > 1 {
        failures.push(format!(
            "the approval was lost: the gate waited again without the annotation, {} approvals given",
            approvals
        ));
    }
    // Trailing writes (status, events, history) belong to the run.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes = proxy.counted_writes() - before;
    let hit = match fault {
        Fault::None | Fault::SlowWatchesAfterRestart(_) => true,
        Fault::KillAfter(_) | Fault::KillAfterStrategyWrite => !proxy.kills().is_empty(),
        Fault::DropResponseOf(_) => proxy
            .writes()
            .iter()
            .any(|w| w.fate == Fate::ResponseDropped),
    };
    proxy.disarm();
    // The proxy's record of the run, for a failure that needs reading.
    if let Some(dir) = std::env::var_os("BALLAST_FAULTS_DEBUG") {
        let text: String = proxy
            .log()
            .iter()
            .map(|e| {
                format!(
                    "{:?} {} {}?{} {:?} {:?}\n",
                    e.received.duration_since(started),
                    e.method,
                    e.path,
                    e.query,
                    e.status,
                    e.fate
                )
            })
            .collect();
        let path = std::path::Path::new(&dir).join(format!("{}-{fault:?}-{writes}.log", ns.name));
        let _ = std::fs::write(&path, text);
        let _ = std::fs::write(path.with_extension("operator.log"), op.logs());
    }
    // A kill at one of the trailing writes: the release below needs an operator.
    if !op.is_running() {
        restarts += 1;
        op = Operator::start_with_kubeconfig(&kubeconfig, &ns.name, &lease(restarts), &[]);
    }
    let refused_creates = proxy
        .writes_to("/jobs")
        .iter()
        .filter(|w| w.method == "POST" && w.status == Some(409))
        .count();
    let seen = monitor.stop().await;
    failures.extend(seen.violations.iter().cloned());
    let overshoots = seen
        .held
        .iter()
        .filter(|(_, (at, held))| *held > at + SURGE)
        .map(|(point, (at, held))| format!("{point} at {at} held at {held}"))
        .collect();

    if let Some(s) = &done {
        check_end(
            case,
            &client,
            &ns.name,
            &proxy,
            &seen,
            s,
            &user_template,
            &mut failures,
        )
        .await;
        // The strategy goes: the Deployment is released unpaused.
        strategies
            .delete("web", &DeleteParams::default())
            .await
            .unwrap();
        let gone = tokio::time::timeout(
            Duration::from_secs(30),
            wait_until("the strategy gone", Duration::from_secs(35), || async {
                strategies
                    .get_opt("web")
                    .await
                    .ok()?
                    .is_none()
                    .then_some(())
            }),
        )
        .await;
        if gone.is_err() {
            failures.push("the strategy's deletion did not finish in 30 s".into());
        }
        let d = deployments.get("web").await.unwrap();
        if d.spec.as_ref().unwrap().paused == Some(true) {
            failures.push("the Deployment is left paused after the strategy went".into());
        }
    }
    op.kill();
    Outcome {
        fault,
        writes,
        hit,
        restarts,
        approvals,
        elapsed: started.elapsed(),
        overshoots,
        refused_creates,
        failures,
    }
}

/// What is checked once the run succeeded.
#[allow(clippy::too_many_arguments)]
async fn check_end(
    case: &Case,
    client: &Client,
    ns: &str,
    proxy: &FaultProxy,
    seen: &Observed,
    s: &ballast::api::RolloutStrategyStatus,
    user_template: &PodTemplateSpec,
    failures: &mut Vec<String>,
) {
    // One Job created per (hook, revision, attempt): the name carries all three, so no name
    // may be created twice.
    let mut created: BTreeMap<String, usize> = BTreeMap::new();
    for w in proxy.writes_to("/jobs") {
        if w.method == "POST" && w.applied() {
            *created
                .entry(w.name.clone().unwrap_or_default())
                .or_default() += 1;
        }
    }
    for (name, n) in &created {
        if *n > 1 {
            failures.push(format!("Job {name} was created {n} times"));
        }
    }
    // Exactly one successful attempt per hook (per revision: there is one new revision).
    for hook in case.job_hooks() {
        let ok = seen
            .jobs
            .values()
            .filter(|j| j.hook == hook && j.succeeded)
            .count();
        if ok != 1 {
            failures.push(format!("hook {hook} succeeded {ok} times"));
        }
    }
    for h in &s.hooks {
        if h.phase != HookPhase::Succeeded {
            failures.push(format!("status of hook {}: {:?}", h.name, h.phase));
        }
    }
    // Two runs of one hook never overlapped (from the pods' own start and finish times).
    for (hook, runs) in seen.runs_by_hook() {
        for (i, a) in runs.iter().enumerate() {
            for b in &runs[i + 1..] {
                if a.0 < b.1 && b.0 < a.1 {
                    failures.push(format!("two runs of {hook} overlapped: {a:?} and {b:?}"));
                }
            }
        }
    }
    // The new ReplicaSet appeared only after the pre hooks' pods had finished.
    if !case.pre.is_empty() {
        let rss = Api::<ReplicaSet>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .unwrap();
        let new_rs = rss.items.iter().find(|r| image_of_rs(r) == "web:2");
        let pre_done = seen
            .pods
            .values()
            .filter(|p| case.pre.contains(&p.hook.as_str()) && p.succeeded)
            .filter_map(|p| p.finished)
            .max();
        match (new_rs, pre_done) {
            (Some(rs), Some(done)) => {
                let created = rs.metadata.creation_timestamp.as_ref().unwrap().0;
                if created + SignedDuration::from_secs(1) < done {
                    failures.push(format!(
                        "the new ReplicaSet was created at {created}, before the pre hook finished at {done}"
                    ));
                }
            }
            (rs, done) => failures.push(format!(
                "no new ReplicaSet ({}) or no finished pre hook pod ({done:?})",
                rs.is_some()
            )),
        }
    }
    // The user's template and replica count, all rolled out.
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get("web")
        .await
        .unwrap();
    let spec = d.spec.as_ref().unwrap();
    if &spec.template != user_template {
        failures.push(format!(
            "the Deployment's template is not the user's: {:?}",
            spec.template
        ));
    }
    if spec.replicas != Some(case.replicas) {
        failures.push(format!(
            "replicas {:?}, the user's {}",
            spec.replicas, case.replicas
        ));
    }
    let deps: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let rolled = tokio::time::timeout(
        Duration::from_secs(30),
        wait_rolled_out(&deps, case.replicas, "web:2"),
    )
    .await;
    if rolled.is_err() {
        failures.push("the new revision is not fully available".into());
    }
}

async fn wait_rolled_out(api: &Api<Deployment>, replicas: i32, image: &str) {
    wait_until(
        "the Deployment rolled out",
        Duration::from_secs(60),
        || async {
            let d = api.get("web").await.ok()?;
            let spec = d.spec.as_ref()?;
            let img = spec.template.spec.as_ref()?.containers[0].image.clone()?;
            let st = d.status?;
            (img == image
                && st.updated_replicas == Some(replicas)
                && st.available_replicas == Some(replicas)
                && st.replicas == Some(replicas))
            .then_some(())
        },
    )
    .await;
}
