//! What the RolloutStrategy tests share: an [`Env`] (the cluster, a namespace and an operator
//! for it) with the reads and waits the tests make, and the Deployment and hook YAML they apply.

use super::{Cluster, Operator, TestNamespace, cluster, wait_until};
use ballast::api::{HookPhase, RolloutPhase, RolloutStrategy, RolloutStrategyStatus};
use jiff::Timestamp;
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    batch::v1::Job,
    core::v1::Event,
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;
use std::time::Duration;

pub const FAIL_LABEL: &str = "pod-container-running-failed.stage.kwok.x-k8s.io";

/// Fields drop in order: the operator stops before its namespace goes.
pub struct Env {
    pub op: Operator,
    pub c: Cluster,
    pub ns: TestNamespace,
}

impl Env {
    pub async fn new(prefix: &str) -> Self {
        Self::on(cluster().await, prefix).await
    }

    /// With operator arguments of its own (e.g. `--gate=auto`).
    pub async fn with_args(prefix: &str, extra: &[&str]) -> Self {
        let c = cluster().await;
        let ns = TestNamespace::new(&c, prefix).await;
        let op = Operator::start_with(&c, &ns.name, &format!("ballast-{}", ns.name), extra);
        Self { c, ns, op }
    }

    /// The same on `c`, e.g. a cluster of its own ([`super::own_cluster`]).
    pub async fn on(c: Cluster, prefix: &str) -> Self {
        let ns = TestNamespace::new(&c, prefix).await;
        let op = Operator::start(&c, &ns.name);
        Self { c, ns, op }
    }

    /// Whether this run's operators use the revision gate (governed Deployments unpaused at
    /// rest) rather than pausing at rest ([`super::admission`]).
    pub fn admission(&self) -> bool {
        super::admission()
    }

    pub fn client(&self) -> Client {
        self.c.client.clone()
    }

    pub fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client(), &self.ns.name)
    }

    pub fn strategies(&self) -> Api<RolloutStrategy> {
        Api::namespaced(self.client(), &self.ns.name)
    }

    pub fn jobs(&self) -> Api<Job> {
        Api::namespaced(self.client(), &self.ns.name)
    }

    pub fn apply(&self, yaml: &str) {
        self.c.apply_yaml(&self.ns.name, yaml);
    }

    pub async fn status(&self, name: &str) -> RolloutStrategyStatus {
        self.strategies()
            .get(name)
            .await
            .unwrap()
            .status
            .unwrap_or_default()
    }

    /// Waits until the strategy's phase is `phase` (and its revision is `rev`, when given).
    pub async fn wait_phase(
        &self,
        name: &str,
        phase: RolloutPhase,
        rev: Option<&str>,
        secs: u64,
    ) -> RolloutStrategyStatus {
        let rev = rev.map(str::to_string);
        self.wait_status(name, &format!("phase {phase:?}"), secs, move |s| {
            s.phase == Some(phase)
                && rev
                    .as_deref()
                    .is_none_or(|r| s.current_revision.as_deref() == Some(r))
        })
        .await
    }

    /// Waits until the strategy's status satisfies `pred`.
    pub async fn wait_status(
        &self,
        name: &str,
        what: &str,
        secs: u64,
        pred: impl Fn(&RolloutStrategyStatus) -> bool,
    ) -> RolloutStrategyStatus {
        let what = format!("{what} of {name}");
        let api = self.strategies();
        let pred = &pred;
        let out = tokio::time::timeout(
            Duration::from_secs(secs),
            wait_until(&what, Duration::from_secs(secs + 5), || async {
                let s = api.get(name).await.ok()?.status?;
                pred(&s).then_some(s)
            }),
        )
        .await;
        match out {
            Ok(s) => s,
            Err(_) => panic!(
                "timed out waiting for {what}; status: {:#?}\noperator log tail:\n{}",
                self.status(name).await,
                tail(&self.op.logs(), 40)
            ),
        }
    }

    /// Waits until a revision other than `old` has succeeded.
    pub async fn wait_succeeded_after(
        &self,
        name: &str,
        old: &str,
        secs: u64,
    ) -> RolloutStrategyStatus {
        let old = old.to_string();
        self.wait_status(name, "a new revision Succeeded", secs, move |s| {
            s.phase == Some(RolloutPhase::Succeeded)
                && s.stable_revision.as_deref() != Some(old.as_str())
        })
        .await
    }

    pub async fn deployment(&self, name: &str) -> Deployment {
        self.deployments().get(name).await.unwrap()
    }

    pub async fn paused(&self, name: &str) -> bool {
        self.deployment(name)
            .await
            .spec
            .unwrap()
            .paused
            .unwrap_or(false)
    }

    pub async fn set_image(&self, name: &str, image: &str) {
        let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": image}]}}}});
        self.deployments()
            .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .unwrap();
    }

    pub async fn replica_sets(&self) -> Vec<ReplicaSet> {
        Api::<ReplicaSet>::namespaced(self.client(), &self.ns.name)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    pub async fn all_jobs(&self) -> Vec<Job> {
        self.jobs()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
    }

    pub async fn events(&self, reason: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.client(), &self.ns.name)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .collect()
    }

    /// The first Event of `reason` that `matches`, waited for up to 10 s: the operator sends a
    /// reconcile's Events after its status write, so a test that has just seen the status may
    /// list the Events before they are there. `Err` holds those of that reason seen last.
    pub async fn find_event(
        &self,
        reason: &str,
        matches: impl Fn(&Event) -> bool,
    ) -> Result<Event, Vec<Event>> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let events = self.events(reason).await;
            if let Some(e) = events.iter().find(|e| matches(e)) {
                return Ok(e.clone());
            }
            if std::time::Instant::now() >= deadline {
                return Err(events);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// [`Env::find_event`], or a panic at the caller's line naming the Events of that reason.
    #[track_caller]
    pub fn wait_event<'a>(
        &'a self,
        reason: &'a str,
        matches: impl Fn(&Event) -> bool + 'a,
    ) -> impl Future<Output = Event> + 'a {
        let caller = std::panic::Location::caller();
        async move {
            self.find_event(reason, matches)
                .await
                .unwrap_or_else(|seen| {
                    panic!(
                        "no matching {reason} Event within 10 s (at {caller}): {:#?}",
                        seen.iter().map(|e| &e.message).collect::<Vec<_>>()
                    )
                })
        }
    }

    pub async fn annotate(&self, name: &str, key: &str, value: &str) {
        let patch = json!({"metadata": {"annotations": {key: value}}});
        self.strategies()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A Deployment `name` of `image` whose container `app` has env, a mounted ConfigMap volume, a
/// working dir, resources and a security context to inherit.
pub fn deployment_yaml(
    name: &str,
    image: &str,
    replicas: i32,
    paused: bool,
    strategy: &str,
) -> String {
    format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  paused: {paused}
  replicas: {replicas}
  strategy: {strategy}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      imagePullSecrets: [{{name: regcred}}]
      volumes:
        - {{name: config, configMap: {{name: {name}-config}}}}
        - {{name: scratch, emptyDir: {{}}}}
      containers:
        - name: app
          image: {image}
          workingDir: /srv
          env: [{{name: DB, value: pg}}, {{name: LOG_LEVEL, value: debug}}]
          envFrom: [{{configMapRef: {{name: {name}-env}}}}]
          volumeMounts: [{{name: config, mountPath: /etc/app}}]
          resources: {{requests: {{cpu: 10m}}}}
          securityContext: {{runAsNonRoot: true}}
"#
    )
}

pub const ROLLING: &str = "{type: RollingUpdate, rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}";

pub fn ts(t: &Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> Timestamp {
    t.as_ref().expect("a timestamp").0
}

pub fn rs_of_image<'a>(rss: &'a [ReplicaSet], image: &str) -> Option<&'a ReplicaSet> {
    rss.iter().find(|r| {
        r.spec
            .as_ref()
            .unwrap()
            .template
            .as_ref()
            .unwrap()
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .image
            .as_deref()
            == Some(image)
    })
}

pub fn job_of<'a>(jobs: &'a [Job], hook: &str) -> Vec<&'a Job> {
    jobs.iter()
        .filter(|j| j.labels().get("ballast.dev/hook").map(String::as_str) == Some(hook))
        .collect()
}

pub async fn wait_available(env: &Env, name: &str, n: i32) {
    let api = env.deployments();
    wait_until(
        "the Deployment available",
        Duration::from_secs(30),
        || async {
            let d = api.get(name).await.ok()?;
            let s = d.status?;
            (s.available_replicas == Some(n) && s.updated_replicas == Some(n)).then_some(())
        },
    )
    .await;
}

/// A `job:` hook whose pod runs for `delay` (kwok completes it then; its jitter-delay is the
/// upper bound of the delay, so it is set to the same value), or fails when `fail`.
pub fn job_hook(image: &str, delay: &str, fail: bool) -> String {
    let labels = if fail {
        format!("{{{FAIL_LABEL}: \"true\"}}")
    } else {
        "{team: qa}".to_string()
    };
    format!(
        r#"{{backoffLimit: 0, template: {{metadata: {{labels: {labels}, annotations: {{pod-complete.stage.kwok.x-k8s.io/delay: "{delay}", pod-complete.stage.kwok.x-k8s.io/jitter-delay: "{delay}"}}}}, spec: {{restartPolicy: Never, containers: [{{name: t, image: "{image}"}}]}}}}}}"#
    )
}

/// Adopts Deployment `web` (image web:1, `replicas`) under a strategy with `hooks` (YAML lines
/// of the spec) and returns the stable revision.
pub async fn adopt(env: &Env, replicas: i32, hooks: &str) -> String {
    env.apply(&deployment_yaml("web", "web:1", replicas, false, ROLLING));
    wait_available(env, "web", replicas).await;
    env.apply(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {{name: web}}\nspec:\n  targetRef: {{name: web}}\n{hooks}"
    ));
    env.wait_phase("web", RolloutPhase::Idle, None, 30)
        .await
        .stable_revision
        .unwrap()
}

pub async fn pod_uids(env: &Env) -> Vec<String> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client(), &env.ns.name);
    let mut uids: Vec<String> = pods
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|p| p.uid())
        .collect();
    uids.sort();
    uids
}

pub fn image_of(d: &Deployment) -> String {
    d.spec
        .as_ref()
        .unwrap()
        .template
        .spec
        .as_ref()
        .unwrap()
        .containers[0]
        .image
        .clone()
        .unwrap()
}

pub fn running(s: &RolloutStrategyStatus, hook: &str) -> bool {
    s.hooks
        .iter()
        .any(|h| h.name == hook && h.phase == HookPhase::Running)
}

impl Env {
    /// SIGKILLs the operator and starts a new one (on a fresh Lease, so it need not wait for
    /// the dead one's to expire).
    pub fn restart(&mut self, n: usize) {
        self.op.kill();
        self.op = Operator::start_with(
            &self.c,
            &self.ns.name,
            &format!("ballast-{}-{n}", self.ns.name),
            &[],
        );
    }

    pub fn kill(&mut self) {
        self.op.kill();
    }

    pub async fn wait_job_complete(&self, hook: &str) {
        let api = self.jobs();
        wait_until("the hook Job complete", Duration::from_secs(30), || async {
            let jobs = api.list(&ListParams::default()).await.ok()?.items;
            job_of(&jobs, hook)
                .iter()
                .any(|j| j.status.as_ref().and_then(|s| s.succeeded) == Some(1))
                .then_some(())
        })
        .await;
    }
}

/// One look at the cluster, taken by a [`Sampler`].
#[derive(Clone, Debug)]
pub struct Snap {
    pub at: std::time::Instant,
    /// `spec.paused` of Deployment `web` (`None` while it does not exist).
    pub paused: Option<bool>,
    /// Hook pods that are not in a terminal phase: (hook, revision, pod name).
    pub live_hook_pods: Vec<(String, String, String)>,
    /// `spec.replicas` of each ReplicaSet of `web`, by image.
    pub rs_replicas: Vec<(String, i32)>,
    /// Images of the pods of `web` (app=web) that exist.
    pub app_images: Vec<String>,
    /// Names of the hook Jobs that have succeeded.
    pub succeeded_jobs: Vec<String>,
}

/// Polls the namespace every 200 ms while a scenario runs, so that what only lasts a moment
/// (a pod, a short-lived unpause, a Job deleted later) is seen too, not only the end state.
pub struct Sampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<Vec<Snap>>,
}

impl Sampler {
    pub fn start(env: &Env) -> Self {
        use k8s_openapi::api::core::v1::Pod;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let (deps, jobs) = (env.deployments(), env.jobs());
        let pods: Api<Pod> = Api::namespaced(env.client(), &env.ns.name);
        let rss: Api<ReplicaSet> = Api::namespaced(env.client(), &env.ns.name);
        let task = tokio::spawn(async move {
            let mut out = vec![];
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let lp = ListParams::default();
                let (d, ps, rs, js) = tokio::join!(
                    deps.get_opt("web"),
                    pods.list(&lp),
                    rss.list(&lp),
                    jobs.list(&lp)
                );
                let (Ok(d), Ok(ps), Ok(rs), Ok(js)) = (d, ps, rs, js) else {
                    continue;
                };
                let image = |spec: Option<&k8s_openapi::api::core::v1::PodSpec>| {
                    spec.and_then(|s| s.containers.first())
                        .and_then(|c| c.image.clone())
                        .unwrap_or_default()
                };
                out.push(Snap {
                    at: std::time::Instant::now(),
                    paused: d.map(|d| d.spec.and_then(|s| s.paused).unwrap_or(false)),
                    live_hook_pods: ps
                        .items
                        .iter()
                        .filter(|p| {
                            !matches!(
                                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                                Some("Succeeded" | "Failed")
                            )
                        })
                        .filter_map(|p| {
                            let l = p.labels();
                            Some((
                                l.get("ballast.dev/hook")?.clone(),
                                l.get("ballast.dev/revision").cloned().unwrap_or_default(),
                                p.name_any(),
                            ))
                        })
                        .collect(),
                    rs_replicas: rs
                        .items
                        .iter()
                        .map(|r| {
                            let spec = r.spec.as_ref();
                            (
                                image(
                                    spec.and_then(|s| s.template.as_ref())
                                        .and_then(|t| t.spec.as_ref()),
                                ),
                                spec.and_then(|s| s.replicas).unwrap_or(0),
                            )
                        })
                        .collect(),
                    app_images: ps
                        .items
                        .iter()
                        .filter(|p| p.labels().get("app").map(String::as_str) == Some("web"))
                        .map(|p| image(p.spec.as_ref()))
                        .collect(),
                    succeeded_jobs: js
                        .items
                        .iter()
                        .filter(|j| j.status.as_ref().and_then(|s| s.succeeded) == Some(1))
                        .map(|j| j.name_any())
                        .collect(),
                });
            }
            out
        });
        Self { stop, task }
    }

    /// Stops polling; returns every look taken.
    pub async fn stop(self) -> Vec<Snap> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.expect("the sampler")
    }
}

/// The most pods live at once, over `snaps`, among hooks named in `hooks` (one hook, or a
/// hook and the name it was renamed to) of `revision`.
pub fn most_live_hook_pods(snaps: &[Snap], hooks: &[&str], revision: &str) -> usize {
    snaps
        .iter()
        .map(|s| {
            s.live_hook_pods
                .iter()
                .filter(|(h, r, _)| hooks.contains(&h.as_str()) && r == revision)
                .count()
        })
        .max()
        .unwrap_or(0)
}

/// The most `spec.replicas` any ReplicaSet of `image` had, over `snaps`.
pub fn most_rs_replicas(snaps: &[Snap], image: &str) -> i32 {
    snaps
        .iter()
        .flat_map(|s| s.rs_replicas.iter())
        .filter(|(i, _)| i == image)
        .map(|(_, n)| *n)
        .max()
        .unwrap_or(0)
}

/// The completion time of a hook's succeeded Job for `revision`, when there is one.
pub fn job_completed(jobs: &[Job], hook: &str, revision: &str) -> Option<Timestamp> {
    job_of(jobs, hook)
        .into_iter()
        .filter(|j| j.labels().get("ballast.dev/revision").map(String::as_str) == Some(revision))
        .filter_map(|j| j.status.as_ref()?.completion_time.as_ref().map(|t| t.0))
        .max()
}

/// Hook Jobs of `hook` for `revision`.
pub fn jobs_of_revision<'a>(jobs: &'a [Job], hook: &str, revision: &str) -> Vec<&'a Job> {
    job_of(jobs, hook)
        .into_iter()
        .filter(|j| j.labels().get("ballast.dev/revision").map(String::as_str) == Some(revision))
        .collect()
}

/// When the container of the newest pod of Job `job` finished, if it did (the pod's own
/// finish time, not the Job's completionTime, which the Job controller may stamp late).
pub async fn pod_finished(env: &Env, job: &str) -> Option<Timestamp> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client(), &env.ns.name);
    pods.list(&ListParams::default().labels(&format!("job-name={job}")))
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|p| {
            let cs = p.status.as_ref()?.container_statuses.as_ref()?.first()?;
            cs.state
                .as_ref()?
                .terminated
                .as_ref()?
                .finished_at
                .as_ref()
                .map(|t| t.0)
        })
        .max()
}
