//! `make bench-cluster`: what a RolloutStrategy adds to a Deployment's rollout (issue 9, P5 and
//! P6; with P8 for the RolloutStrategy controller from the same runs).
//!
//! Against the local control plane of `KUBECONFIG` (127.0.0.1 only), in one run, two namespaces
//! with the same Deployments: one that the real operator (release build, under the manager's
//! ServiceAccount from `config/`) governs, with config/default's revision gate installed, and
//! one where the bench itself plays the floor. The operator watches every namespace, as
//! config/default installs it, so the floor's Deployments are ones it watches and does not
//! govern: what a ratio shows is what a strategy adds, not what running ballast at all costs
//! (`BALLAST_BENCH_OPERATOR_SCOPE=namespace` confines it to the governed namespace, as before
//! 2026-12-06).
//!
//! - **P5, hook completion → next step**: D Deployments (`replicas: 1`) each under a
//!   RolloutStrategy with one container pre hook. A revision is a template change (the env var
//!   `BENCH_REVISION` of container `app`); the gate pauses it in that write, the operator runs
//!   the hook Job (kwok completes its pod after 1 to 5 s), and unpauses. The latency is the
//!   time between two receive events of the bench's own watches: the hook Job's `Complete`
//!   condition (t0) and the Deployment's `spec.paused` false for that revision (t1). The floor
//!   does the same on the other namespace's Deployments with the bench as the controller: it
//!   pauses in the template change, creates the same Job itself, and a watch of its own (not the
//!   measuring one) PATCHes `spec.paused: false` as soon as it sees the Job complete: one watch
//!   delivery and one PATCH. Each Deployment goes through its revisions one after the other,
//!   the next once the previous has rolled out (and, governed, its strategy says `Succeeded`);
//!   the D Deployments at once. Phases in the order floor, ballast, ballast, floor (each half of
//!   the revisions: a linear drift cancels).
//! - **P6, a hook-less strategy against a plain rollout**: one Deployment of 10 replicas in each
//!   namespace, the governed one under a RolloutStrategy without hooks. Time from the template
//!   change (the PATCH sent) until the bench's watch sees the rollout complete: observedGeneration
//!   current, not paused, updated = available = replicas = 10, every older ReplicaSet at 0 (spec
//!   and status). Alternating plain/governed (ABBA), the median of each; each rollout starts once
//!   the previous ones' old pods are gone and a second has passed. Twice: first with P5's
//!   strategies still in the governed namespace (reported: the revision gate's policies
//!   evaluate each governed Deployment write once per strategy of its namespace, and the row
//!   shows what that costs, with the API server's count of those evaluations for strategies
//!   not the Deployment's own), then, once they are deleted, with the P6 strategy alone
//!   (judged, as the issue states P6). 40 rollouts of each kind alone: with 12, runs of the same
//!   code gave ratios from 0.99 to 1.40, too coarse to judge a goal of 1.05.
//! - **P8**: the operator's own `ballast_api_requests_total` (watches and its Lease left out)
//!   from before the first governed phase until it has been quiet after the last, divided by the
//!   governed revisions, for P5 and P6 separately.
//!
//! Every row must pass or the bench exits non-zero. The operator is stopped, the strategies'
//! finalizers dropped and the namespaces deleted whatever happens (error, panic, Ctrl-C,
//! SIGTERM, SIGHUP). Results: a printed table and `bench/results/cluster_rollout-<UTC>.json`.
//! Settings (environment): BALLAST_BENCH_HOOK_DEPLOYMENTS (20), BALLAST_BENCH_HOOK_REVISIONS
//! (10 per Deployment and side, even), BALLAST_BENCH_ROLLOUTS (40 of each kind, alone, even),
//! BALLAST_BENCH_CROWDED_ROLLOUTS (12 of each kind with P5's strategies, even),
//! BALLAST_BENCH_QUIET_SECS (5), BALLAST_BENCH_OPERATOR_SCOPE (`cluster`, or `namespace`),
//! BALLAST_BENCH_LOG (the operator's RUST_LOG, `info`). Results
//! and how to read them: docs/benchmarks.md.

#[path = "support/mod.rs"]
mod support;
use support::operator::{
    Operator, RequestSeconds, admission_synced, controller_counters, delta, load_average, machine,
    operator_kubeconfig, quantile, requests_but_watches,
};
use support::{
    Deletion, Kubectl, Row, apiserver_sum, client, env_usize, print_table, repo_root, write_results,
};

use anyhow::{Context, Result, anyhow, bail, ensure};
use ballast::api::{RolloutPhase, RolloutStrategy, RolloutStrategyStatus};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    batch::v1::Job,
    core::v1::{Namespace, Pod, PodTemplateSpec},
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

const LABEL_FLOOR_HOOK: &str = "bench.ballast.dev/floor-hook";
const ENV_REVISION: &str = "BENCH_REVISION";
/// The env ballast gives every hook container; the floor's Jobs carry it too.
const ENV_DEPLOYMENT: &str = "BALLAST_DEPLOYMENT";
const ROLLOUT: &str = "r-0";
const ROLLOUT_REPLICAS: i32 = 10;
/// Longest wait for one revision (it fails the bench, not hangs it).
const REVISION_LIMIT: Duration = Duration::from_secs(180);

struct Settings {
    deployments: usize,
    revisions: usize,
    /// P6 rollouts of each kind with the strategy alone (judged).
    rollouts: usize,
    /// P6 rollouts of each kind with P5's strategies in the namespace (reported).
    crowded_rollouts: usize,
    quiet: Duration,
    /// The operator watches only the governed namespace (else every namespace).
    scoped: bool,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let s = Settings {
            deployments: env_usize("BALLAST_BENCH_HOOK_DEPLOYMENTS", 20)?,
            revisions: env_usize("BALLAST_BENCH_HOOK_REVISIONS", 10)?,
            rollouts: env_usize("BALLAST_BENCH_ROLLOUTS", 40)?,
            crowded_rollouts: env_usize("BALLAST_BENCH_CROWDED_ROLLOUTS", 12)?,
            quiet: Duration::from_secs(env_usize("BALLAST_BENCH_QUIET_SECS", 5)? as u64),
            scoped: match std::env::var("BALLAST_BENCH_OPERATOR_SCOPE").as_deref() {
                Err(_) | Ok("cluster") => false,
                Ok("namespace") => true,
                Ok(other) => {
                    bail!("BALLAST_BENCH_OPERATOR_SCOPE is `cluster` or `namespace`, not `{other}`")
                }
            },
        };
        ensure!(
            s.revisions.is_multiple_of(2)
                && s.rollouts.is_multiple_of(2)
                && s.crowded_rollouts.is_multiple_of(2),
            "BALLAST_BENCH_HOOK_REVISIONS, BALLAST_BENCH_ROLLOUTS and BALLAST_BENCH_CROWDED_ROLLOUTS must be even (ABBA halves)"
        );
        Ok(s)
    }
}

fn hook_name(i: usize) -> String {
    format!("h-{i:02}")
}

fn deployment(name: &str, replicas: i32) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "app",
                    "image": "registry.invalid/bench:1",
                    "env": [{"name": ENV_REVISION, "value": "0"}],
                }]},
            },
        },
    }))?)
}

fn strategy(name: &str, hooks: bool) -> Result<RolloutStrategy> {
    let mut spec = json!({"targetRef": {"name": name}});
    if hooks {
        spec["pre"] =
            json!([{"name": "migrate", "container": {"from": "app", "command": ["migrate"]}}]);
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "ballast.dev/v1alpha1", "kind": "RolloutStrategy",
        "metadata": {"name": name},
        "spec": spec,
    }))?)
}

/// The template change of revision `k`: the env var of container `app` (strategic merge by
/// name), and for the floor the pause the gate would add in the same write.
fn revision_patch(k: u32, pause: bool) -> Value {
    let mut p = json!({"spec": {"template": {"spec": {"containers": [
        {"name": "app", "env": [{"name": ENV_REVISION, "value": k.to_string()}]}
    ]}}}});
    if pause {
        p["spec"]["paused"] = json!(true);
    }
    p
}

/// The floor's hook Job for revision `k` of `name`: what ballast builds from container `app`
/// (image, env, command), without its labels and owner.
fn floor_job(name: &str, k: u32) -> Result<Job> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": format!("{name}-migrate-{k}"), "labels": {LABEL_FLOOR_HOOK: name}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {LABEL_FLOOR_HOOK: name}},
                "spec": {"restartPolicy": "Never", "containers": [{
                    "name": "migrate",
                    "image": "registry.invalid/bench:1",
                    "command": ["migrate"],
                    "env": [
                        {"name": ENV_REVISION, "value": k.to_string()},
                        {"name": ENV_DEPLOYMENT, "value": name},
                    ],
                }]},
            },
        },
    }))?)
}

/// The value of env var `key` of the first container of `t`.
fn env_of(t: Option<&PodTemplateSpec>, key: &str) -> Option<String> {
    t?.spec
        .as_ref()?
        .containers
        .first()?
        .env
        .as_ref()?
        .iter()
        .find(|e| e.name == key)?
        .value
        .clone()
}

fn revision_of(t: Option<&PodTemplateSpec>) -> Option<u32> {
    env_of(t, ENV_REVISION)?.parse().ok()
}

fn job_complete(j: &Job) -> bool {
    j.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Complete" && c.status == "True")
        })
}

type Key = (String, String);
type RevKey = (String, String, u32);

/// What the bench's watches have received, and when (the receive times are the measurement).
#[derive(Default)]
struct Seen {
    deployments: HashMap<Key, Deployment>,
    replica_sets: HashMap<Key, ReplicaSet>,
    strategies: HashMap<String, RolloutStrategyStatus>,
    /// The hook Jobs seen complete.
    completed_jobs: HashSet<Key>,
    /// First receive of each Job with `Complete`, by (namespace, Deployment, revision), with
    /// the resourceVersion it was received at.
    job_complete: HashMap<RevKey, Vec<(String, Instant, u64)>>,
    /// First receive of each Deployment unpaused with revision k, and its resourceVersion.
    unpaused: HashMap<RevKey, (Instant, u64)>,
    /// First receive at which the rollout of revision k was complete.
    complete: HashMap<RevKey, Instant>,
    /// First receive of a ReplicaSet of revision k (P6's segments).
    rs_seen: HashMap<RevKey, Instant>,
    /// First receive of that ReplicaSet with all of its Deployment's replicas available.
    rs_full: HashMap<RevKey, Instant>,
}

impl Seen {
    /// Whether Deployment (ns, name) is completely rolled out at its template's revision.
    fn rollout_complete(&self, ns: &str, name: &str) -> Option<u32> {
        let d = self.deployments.get(&(ns.to_string(), name.to_string()))?;
        let spec = d.spec.as_ref()?;
        let k = revision_of(Some(&spec.template))?;
        let want = spec.replicas.unwrap_or(1);
        let st = d.status.as_ref()?;
        let ok = !spec.paused.unwrap_or(false)
            && st.observed_generation >= d.metadata.generation
            && st.updated_replicas.unwrap_or(0) == want
            && st.available_replicas.unwrap_or(0) == want
            && st.replicas.unwrap_or(0) == want;
        if !ok {
            return None;
        }
        let uid = d.metadata.uid.as_deref()?;
        let mut new_ready = false;
        for rs in self.replica_sets.values() {
            let owned = rs.namespace().as_deref() == Some(ns)
                && rs
                    .owner_references()
                    .iter()
                    .any(|o| o.uid == uid && o.controller == Some(true));
            if !owned {
                continue;
            }
            let rs_spec = rs.spec.as_ref()?;
            let (spec_n, status_n) = (
                rs_spec.replicas.unwrap_or(0),
                rs.status.as_ref().map_or(0, |s| s.replicas),
            );
            if revision_of(rs_spec.template.as_ref()) == Some(k) {
                new_ready = spec_n == want && status_n == want;
            } else if spec_n != 0 || status_n != 0 {
                return None;
            }
        }
        new_ready.then_some(k)
    }
}

enum Ev {
    Deployment(watcher::Event<Deployment>),
    ReplicaSet(watcher::Event<ReplicaSet>),
    Job(watcher::Event<Job>),
    Strategy(watcher::Event<RolloutStrategy>),
}

/// The bench's watches of both namespaces, folded into [`Seen`] by one task; `changed` ticks
/// after every event.
struct Observer {
    seen: Arc<Mutex<Seen>>,
    changed: tokio::sync::watch::Receiver<u64>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Observer {
    async fn start(client: &Client, namespaces: &[&str], governed: &str) -> Result<Self> {
        let cfg = watcher::Config::default();
        let mut streams = Vec::new();
        for ns in namespaces {
            let d: Api<Deployment> = Api::namespaced(client.clone(), ns);
            let r: Api<ReplicaSet> = Api::namespaced(client.clone(), ns);
            let j: Api<Job> = Api::namespaced(client.clone(), ns);
            streams.push(
                watcher(d, cfg.clone())
                    .default_backoff()
                    .map_ok(Ev::Deployment)
                    .boxed(),
            );
            streams.push(
                watcher(r, cfg.clone())
                    .default_backoff()
                    .map_ok(Ev::ReplicaSet)
                    .boxed(),
            );
            streams.push(
                watcher(j, cfg.clone())
                    .default_backoff()
                    .map_ok(Ev::Job)
                    .boxed(),
            );
        }
        let s: Api<RolloutStrategy> = Api::namespaced(client.clone(), governed);
        streams.push(
            watcher(s, cfg.clone())
                .default_backoff()
                .map_ok(Ev::Strategy)
                .boxed(),
        );
        let want_init = streams.len();
        let mut events = stream::select_all(streams);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (tx, changed) = tokio::sync::watch::channel(0u64);
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let task = {
            let seen = seen.clone();
            tokio::spawn(async move {
                let mut inits = 0;
                let mut ready_tx = Some(ready_tx);
                while let Some(ev) = events.next().await {
                    let at = Instant::now();
                    let ev = ev?;
                    let init_done = matches!(
                        &ev,
                        Ev::Deployment(watcher::Event::InitDone)
                            | Ev::ReplicaSet(watcher::Event::InitDone)
                            | Ev::Job(watcher::Event::InitDone)
                            | Ev::Strategy(watcher::Event::InitDone)
                    );
                    fold(&mut seen.lock().expect("seen"), ev, at);
                    if init_done {
                        inits += 1;
                        if inits == want_init
                            && let Some(r) = ready_tx.take()
                        {
                            let _ = r.send(());
                        }
                    }
                    tx.send_modify(|v| *v += 1);
                }
                bail!("a watch of the bench ended")
            })
        };
        tokio::time::timeout(Duration::from_secs(60), ready_rx)
            .await
            .context("the bench's watches did not list within 60 s")??;
        Ok(Observer {
            seen,
            changed,
            task,
        })
    }

    /// Waits until `f` answers, at most `limit`.
    async fn wait<T>(
        &self,
        what: &str,
        limit: Duration,
        mut f: impl FnMut(&Seen) -> Option<T>,
    ) -> Result<T> {
        let mut rx = self.changed.clone();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some(v) = f(&self.seen.lock().expect("seen")) {
                return Ok(v);
            }
            ensure!(!self.task.is_finished(), "the bench's watches ended");
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(r) => r?,
                Err(_) => bail!("{what}: not within {limit:?}"),
            }
        }
    }
}

fn fold(seen: &mut Seen, ev: Ev, at: Instant) {
    match ev {
        Ev::Deployment(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) => {
            let (ns, name) = (d.namespace().unwrap_or_default(), d.name_any());
            if let Some(spec) = &d.spec
                && !spec.paused.unwrap_or(false)
                && let Some(k) = revision_of(Some(&spec.template))
            {
                seen.unpaused
                    .entry((ns.clone(), name.clone(), k))
                    .or_insert((at, version(&d.metadata)));
            }
            seen.deployments.insert((ns.clone(), name.clone()), d);
            if let Some(k) = seen.rollout_complete(&ns, &name) {
                seen.complete.entry((ns, name, k)).or_insert(at);
            }
        }
        Ev::ReplicaSet(watcher::Event::Apply(r) | watcher::Event::InitApply(r)) => {
            let ns = r.namespace().unwrap_or_default();
            let owner = r
                .owner_references()
                .iter()
                .find(|o| o.kind == "Deployment")
                .map(|o| o.name.clone());
            if let Some(name) = &owner
                && let Some(k) = revision_of(r.spec.as_ref().and_then(|s| s.template.as_ref()))
            {
                let key = (ns.clone(), name.clone(), k);
                seen.rs_seen.entry(key.clone()).or_insert(at);
                let want = seen
                    .deployments
                    .get(&(ns.clone(), name.clone()))
                    .and_then(|d| d.spec.as_ref()?.replicas)
                    .unwrap_or(1);
                let full = r.spec.as_ref().and_then(|s| s.replicas) == Some(want)
                    && r.status.as_ref().and_then(|s| s.available_replicas) == Some(want);
                if full {
                    seen.rs_full.entry(key).or_insert(at);
                }
            }
            seen.replica_sets.insert((ns.clone(), r.name_any()), r);
            if let Some(name) = owner
                && let Some(k) = seen.rollout_complete(&ns, &name)
            {
                seen.complete.entry((ns, name, k)).or_insert(at);
            }
        }
        Ev::ReplicaSet(watcher::Event::Delete(r)) => {
            seen.replica_sets
                .remove(&(r.namespace().unwrap_or_default(), r.name_any()));
        }
        Ev::Job(watcher::Event::Apply(j) | watcher::Event::InitApply(j)) => {
            let key = (j.namespace().unwrap_or_default(), j.name_any());
            let template = j.spec.as_ref().map(|s| &s.template);
            let (Some(dep), Some(k)) = (env_of(template, ENV_DEPLOYMENT), revision_of(template))
            else {
                return;
            };
            if job_complete(&j) && seen.completed_jobs.insert(key.clone()) {
                let rv = version(&j.metadata);
                seen.job_complete
                    .entry((key.0, dep, k))
                    .or_default()
                    .push((key.1, at, rv));
            }
        }
        Ev::Strategy(watcher::Event::Apply(s) | watcher::Event::InitApply(s)) => {
            seen.strategies
                .insert(s.name_any(), s.status.clone().unwrap_or_default());
        }
        Ev::Strategy(watcher::Event::Delete(s)) => {
            seen.strategies.remove(&s.name_any());
        }
        Ev::Deployment(watcher::Event::Delete(d)) => {
            seen.deployments
                .remove(&(d.namespace().unwrap_or_default(), d.name_any()));
        }
        _ => {}
    }
}

/// The floor's controller: its own watch of the floor's hook Jobs; the moment one is seen
/// complete, its Deployment is unpaused (one PATCH). Stopped when dropped.
struct FloorController {
    task: tokio::task::JoinHandle<Result<()>>,
}

impl Drop for FloorController {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FloorController {
    fn start(client: &Client, ns: &str) -> Self {
        let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
        let task = tokio::spawn(async move {
            let mut done = HashSet::new();
            let mut events = watcher(jobs, watcher::Config::default().labels(LABEL_FLOOR_HOOK))
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(j) = events.next().await {
                let j = j?;
                if !job_complete(&j) || !done.insert(j.name_any()) {
                    continue;
                }
                let Some(dep) = env_of(j.spec.as_ref().map(|s| &s.template), ENV_DEPLOYMENT) else {
                    continue;
                };
                let api = deployments.clone();
                tokio::spawn(async move {
                    let p = json!({"spec": {"paused": false}});
                    if let Err(e) = api
                        .patch(&dep, &PatchParams::default(), &Patch::Merge(&p))
                        .await
                    {
                        eprintln!("[bench] floor: unpausing {dep} failed: {e}");
                    }
                });
            }
            bail!("the floor's watch of Jobs ended")
        });
        FloorController { task }
    }
}

/// Stops the operator and deletes the namespaces (the strategies' finalizers dropped) when
/// dropped.
struct Cleanup {
    kubectl: Kubectl,
    namespaces: Vec<String>,
    operator: Option<Operator>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        drop(self.operator.take());
        support::delete_namespaces(&self.kubectl, &self.namespaces, "600s", Deletion::Last);
    }
}

async fn create_namespace(api: &Api<Namespace>, name: &str) -> Result<()> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [(
                    "ballast.dev/bench".to_string(),
                    "cluster-rollout".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &ns).await?;
    Ok(())
}

/// One revision of a governed Deployment with a pre hook: (t0, t1) of the bench's watches.
async fn governed_revision(
    obs: &Observer,
    api: &Api<Deployment>,
    ns: &str,
    name: &str,
    k: u32,
) -> Result<(Instant, Instant)> {
    let stable = obs
        .seen
        .lock()
        .expect("seen")
        .strategies
        .get(name)
        .and_then(|s| s.stable_revision.clone());
    let d = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Strategic(revision_patch(k, false)),
        )
        .await?;
    ensure!(
        d.spec.as_ref().and_then(|s| s.paused) == Some(true),
        "{ns}/{name}: the revision gate did not pause revision {k} in its write"
    );
    let key = (ns.to_string(), name.to_string(), k);
    obs.wait(
        &format!("{ns}/{name}: revision {k} rolled out and Succeeded"),
        REVISION_LIMIT,
        |s| {
            let st = s.strategies.get(name)?;
            (s.complete.contains_key(&key)
                && st.phase == Some(RolloutPhase::Succeeded)
                && st.stable_revision.is_some()
                && st.stable_revision != stable)
                .then_some(())
        },
    )
    .await?;
    hook_times(obs, &key)
}

/// One revision of a floor Deployment: the bench pauses it with the change, creates the hook
/// Job, and its [`FloorController`] unpauses it.
async fn floor_revision(
    obs: &Observer,
    api: &Api<Deployment>,
    jobs: &Api<Job>,
    ns: &str,
    name: &str,
    k: u32,
) -> Result<(Instant, Instant)> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Strategic(revision_patch(k, true)),
    )
    .await?;
    jobs.create(&PostParams::default(), &floor_job(name, k)?)
        .await?;
    let key = (ns.to_string(), name.to_string(), k);
    obs.wait(
        &format!("{ns}/{name}: revision {k} rolled out"),
        REVISION_LIMIT,
        |s| s.complete.contains_key(&key).then_some(()),
    )
    .await?;
    hook_times(obs, &key)
}

/// The resourceVersion of an object as received. On this one-etcd local cluster it is etcd's
/// revision of the write, so two writes of different kinds can be ordered by it (the API's
/// contract calls it opaque; a bench of its own cluster may read it).
fn version(m: &ObjectMeta) -> u64 {
    m.resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The receive time of the revision's one hook Job's completion, and of the unpause.
///
/// Whether the unpause came after the completion is judged by the writes' resourceVersions:
/// the Job and the Deployment come through two watches, which the API server delivers
/// independently, so the bench can receive the unpause a few ms before the completion that
/// preceded it (seen once in the suite of 2026-12-06 15:29, 2.1 ms). Such a hook counts 0 ms.
fn hook_times(obs: &Observer, key: &RevKey) -> Result<(Instant, Instant)> {
    let s = obs.seen.lock().expect("seen");
    let (ns, name, k) = key;
    let jobs = s.job_complete.get(key).cloned().unwrap_or_default();
    ensure!(
        jobs.len() == 1,
        "{ns}/{name}: revision {k} had {} completed hook Jobs ({jobs:?}), expected 1",
        jobs.len()
    );
    let (t0, job_rv) = (jobs[0].1, jobs[0].2);
    let (t1, unpaused_rv) = *s
        .unpaused
        .get(key)
        .ok_or_else(|| anyhow!("{ns}/{name}: revision {k} never seen unpaused"))?;
    ensure!(
        unpaused_rv > job_rv,
        "{ns}/{name}: revision {k} was unpaused (resourceVersion {unpaused_rv}) before its hook Job completed ({job_rv})"
    );
    Ok((t0, t1.max(t0)))
}

/// The wall-clock time of `at`, for matching the operator's log.
fn utc(at: Instant) -> String {
    static BASE: std::sync::OnceLock<(Instant, jiff::Timestamp)> = std::sync::OnceLock::new();
    let (i, t) = BASE.get_or_init(|| (Instant::now(), jiff::Timestamp::now()));
    let d = if at >= *i {
        jiff::SignedDuration::try_from(at - *i).unwrap_or_default()
    } else {
        -jiff::SignedDuration::try_from(*i - at).unwrap_or_default()
    };
    t.checked_add(d)
        .map_or_else(|_| String::new(), |x| x.to_string())
}

/// One hook of P5, for finding it in the operator's log.
#[derive(Debug, serde::Serialize)]
struct Hook {
    ballast: bool,
    deployment: String,
    revision: u32,
    job_complete_seen: String,
    unpaused_seen: String,
    ms: f64,
}

/// One P5 phase: every hook Deployment of `ns` through revisions `ks`, all Deployments at once.
async fn hook_phase(
    obs: &Observer,
    client: &Client,
    ns: &str,
    governed: bool,
    deployments: usize,
    ks: std::ops::Range<u32>,
) -> Result<Vec<Hook>> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let jobs: Api<Job> = Api::namespaced(client.clone(), ns);
    let t = Instant::now();
    let per_deployment = (0..deployments).map(|i| {
        let (api, jobs, ks) = (&api, &jobs, ks.clone());
        async move {
            let name = hook_name(i);
            let mut out = Vec::new();
            for k in ks {
                let (t0, t1) = if governed {
                    governed_revision(obs, api, ns, &name, k).await?
                } else {
                    floor_revision(obs, api, jobs, ns, &name, k).await?
                };
                out.push(Hook {
                    ballast: governed,
                    deployment: name.clone(),
                    revision: k,
                    job_complete_seen: utc(t0),
                    unpaused_seen: utc(t1),
                    ms: (t1 - t0).as_secs_f64() * 1000.0,
                });
            }
            Ok::<_, anyhow::Error>(out)
        }
    });
    let all: Vec<Vec<Hook>> = futures::future::try_join_all(per_deployment).await?;
    let hooks: Vec<Hook> = all.into_iter().flatten().collect();
    let ms: Vec<f64> = hooks.iter().map(|h| h.ms).collect();
    eprintln!(
        "[bench] P5 {} phase, revisions {ks:?}: {} hooks in {:.1} s, p50 {:.1} ms, p99 {:.1} ms",
        if governed { "ballast" } else { "floor" },
        ms.len(),
        t.elapsed().as_secs_f64(),
        quantile(&ms, 0.5),
        quantile(&ms, 0.99),
    );
    Ok(hooks)
}

/// Where one P6 rollout's time went, in ms of the bench's receive times: the PATCH sent → the
/// new ReplicaSet seen → it has every replica available → the rollout complete (the old one at
/// 0, the Deployment's status current).
type Segments = [f64; 3];

/// One P6 rollout of `r-0` in `ns`: the PATCH sent → the watch sees it complete, in seconds,
/// and its [`Segments`].
async fn rollout(
    obs: &Observer,
    client: &Client,
    ns: &str,
    governed: bool,
    k: u32,
) -> Result<(f64, Segments)> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let stable = obs
        .seen
        .lock()
        .expect("seen")
        .strategies
        .get(ROLLOUT)
        .and_then(|s| s.stable_revision.clone());
    let t0 = Instant::now();
    let d = api
        .patch(
            ROLLOUT,
            &PatchParams::default(),
            &Patch::Strategic(revision_patch(k, false)),
        )
        .await?;
    // The strategy has no pre hooks, so the revision gate does not pause the revision either.
    let paused = d.spec.as_ref().and_then(|s| s.paused) == Some(true);
    ensure!(
        !paused,
        "{ns}/{ROLLOUT} (governed: {governed}): revision {k} paused in its write, though no pre hook needs it"
    );
    let key = (ns.to_string(), ROLLOUT.to_string(), k);
    let t1 = obs
        .wait(
            &format!("{ns}/{ROLLOUT}: revision {k} rolled out"),
            REVISION_LIMIT,
            |s| s.complete.get(&key).copied(),
        )
        .await?;
    if governed {
        obs.wait(
            &format!("{ns}/{ROLLOUT}: revision {k} Succeeded"),
            REVISION_LIMIT,
            |s| {
                let st = s.strategies.get(ROLLOUT)?;
                (st.phase == Some(RolloutPhase::Succeeded)
                    && st.stable_revision.is_some()
                    && st.stable_revision != stable)
                    .then_some(())
            },
        )
        .await?;
    }
    let secs = (t1 - t0).as_secs_f64();
    let (seen_at, full_at) = {
        let seen = obs.seen.lock().expect("seen");
        (
            seen.rs_seen.get(&key).copied().unwrap_or(t0),
            seen.rs_full.get(&key).copied().unwrap_or(t1),
        )
    };
    let ms = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64() * 1e3;
    let segments = [ms(t0, seen_at), ms(seen_at, full_at), ms(full_at, t1)];
    eprintln!(
        "[bench] P6 {} rollout {k}: {secs:.2} s (ms: new ReplicaSet {:.0}, its replicas available {:.0}, complete {:.0})",
        if governed { "governed" } else { "plain" },
        segments[0],
        segments[1],
        segments[2],
    );
    Ok((secs, segments))
}

/// One set of P6 rollouts, in ABBA pairs (plain, governed, governed, plain, ...), revisions
/// from `k0` on.
struct P6Set {
    plain: Vec<f64>,
    governed: Vec<f64>,
    /// Each rollout's [`Segments`], plain, then governed.
    segments: [Vec<Segments>; 2],
    admission_evaluations: f64,
    /// Writes of Deployments and ReplicaSets the API server refused with 409 (a conflict) during
    /// the plain rollouts, then the governed ones ([`conflicts`]).
    conflicts: [f64; 2],
}

async fn p6_set(
    obs: &Observer,
    client: &Client,
    ns_floor: &str,
    ns_ballast: &str,
    rollouts: usize,
    k0: u32,
) -> Result<P6Set> {
    let evaluations0 = admission_evaluations(client).await?;
    let (mut plain, mut governed) = (Vec::new(), Vec::new());
    let mut segments: [Vec<Segments>; 2] = Default::default();
    let mut conflicted = [0.0; 2];
    for i in 0..rollouts {
        let k = k0 + i as u32;
        let order = if i % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for g in order {
            let ns = if g { ns_ballast } else { ns_floor };
            settled(client, ns_floor).await?;
            settled(client, ns_ballast).await?;
            tokio::time::sleep(GAP).await;
            let c0 = conflicts(client).await?;
            let (secs, parts) = rollout(obs, client, ns, g, k).await?;
            conflicted[usize::from(g)] += conflicts(client).await? - c0;
            segments[usize::from(g)].push(parts);
            if g {
                governed.push(secs);
            } else {
                plain.push(secs);
            }
        }
    }
    Ok(P6Set {
        plain,
        governed,
        segments,
        admission_evaluations: admission_evaluations(client).await? - evaluations0,
        conflicts: conflicted,
    })
}

/// Before each P6 rollout, for each side: the previous rollouts' old pods are gone (about 0.1 s
/// after completion). Then the rollout waits [`GAP`] for the rest of their tail (the ReplicaSet's
/// last status, the operator's `Succeeded` status, label and Events), so that no rollout starts
/// while another still loads the API server. It was a fixed 2 s, mostly idle; the time went to
/// more rollouts.
async fn settled(client: &Client, ns: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("app={ROLLOUT}"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = pods.list_metadata(&lp).await?;
        let live = list
            .items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .count();
        if list.items.len() == live && live == ROLLOUT_REPLICAS as usize {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{ns}/{ROLLOUT}: {} pods ({live} not being deleted) a minute after its rollout, not {ROLLOUT_REPLICAS}",
            list.items.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The pause before each P6 rollout once both sides' old pods are gone ([`settled`]).
const GAP: Duration = Duration::from_secs(1);

/// How many writes of Deployments and ReplicaSets (the Deployment controller's status updates,
/// scales, ballast's label writes) the API server has refused with a conflict so far: a write
/// that bumps a Deployment's resourceVersion while the Deployment controller syncs it makes
/// that controller's next status update fail and sync again. From the API server's `/metrics`.
async fn conflicts(client: &Client) -> Result<f64> {
    apiserver_sum(client, |l| {
        l.starts_with("apiserver_request_total{")
            && l.contains("code=\"409\"")
            && (l.contains("resource=\"deployments\"") || l.contains("resource=\"replicasets\""))
    })
    .await
}

/// How many times the API server has evaluated the match conditions of ballast's admission
/// policies (the revision gate and the hold) so far with a strategy that does not govern the
/// Deployment written: it evaluates them once per strategy a binding selects, for each write,
/// and counts only the evaluations that do not match (`admission_match_condition_evaluation_
/// seconds`). From the API server's own `/metrics`.
async fn admission_evaluations(client: &Client) -> Result<f64> {
    apiserver_sum(client, |l| {
        l.starts_with("apiserver_admission_match_condition_evaluation_seconds_count{")
            && (l.contains("revision-gate\"") || l.contains("revision-hold\""))
    })
    .await
}

/// The RolloutStrategies, SpreadPolicies and ClusterSpreadPolicies of the cluster outside `ns`,
/// as `kind namespace/name`.
async fn others_objects(client: &Client, ns: &str) -> Result<Vec<String>> {
    use ballast::api::{ClusterSpreadPolicy, SpreadPolicy};
    let lp = ListParams::default();
    let mut others = Vec::new();
    let name = |m: &ObjectMeta| {
        format!(
            "{}/{}",
            m.namespace.as_deref().unwrap_or_default(),
            m.name.as_deref().unwrap_or_default()
        )
    };
    for m in Api::<RolloutStrategy>::all(client.clone())
        .list_metadata(&lp)
        .await?
    {
        if m.metadata.namespace.as_deref() != Some(ns) {
            others.push(format!("RolloutStrategy {}", name(&m.metadata)));
        }
    }
    for m in Api::<SpreadPolicy>::all(client.clone())
        .list_metadata(&lp)
        .await?
    {
        others.push(format!("SpreadPolicy {}", name(&m.metadata)));
    }
    for m in Api::<ClusterSpreadPolicy>::all(client.clone())
        .list_metadata(&lp)
        .await?
    {
        others.push(format!("ClusterSpreadPolicy {}", name(&m.metadata)));
    }
    Ok(others)
}

/// The results of one run.
#[derive(Debug, serde::Serialize)]
struct Measured {
    /// Which namespaces the operator watched: `cluster` (every one, as installed), or
    /// `namespace` (the governed one: asked for, or because the cluster had strategies or
    /// policies of its own).
    operator_scope: &'static str,
    hook_floor_ms: Vec<f64>,
    hook_ballast_ms: Vec<f64>,
    hooks: Vec<Hook>,
    /// The RolloutStrategy controller's reconciles and errors over the P5 phases.
    hook_counters: BTreeMap<String, f64>,
    /// P6 with its strategy alone in the governed namespace (judged).
    rollout_plain_secs: Vec<f64>,
    rollout_governed_secs: Vec<f64>,
    /// The API server's evaluations of the gate's and the hold's match conditions over that set,
    /// with strategies that do not govern the Deployment ([`admission_evaluations`]).
    rollout_admission_evaluations: f64,
    /// P6 with P5's strategies still there: this many strategies in the namespace (reported).
    crowded_strategies: usize,
    crowded_plain_secs: Vec<f64>,
    crowded_governed_secs: Vec<f64>,
    crowded_admission_evaluations: f64,
    /// Conflicts ([`conflicts`]) during P6's plain and governed rollouts, strategy alone.
    rollout_conflicts: [f64; 2],
    /// Each P6 rollout's [`Segments`] (ms), strategy alone: plain, then governed.
    rollout_segments_ms: [Vec<Segments>; 2],
    hook_revisions: usize,
    hook_requests: u64,
    hook_requests_by_kind: BTreeMap<String, u64>,
    /// The operator's mean time per request in P5's governed phases, by `verb group/resource`
    /// (`ballast_api_request_duration_seconds`).
    hook_request_ms: BTreeMap<String, f64>,
    hook_jobs_created: usize,
    rollout_requests: u64,
    rollout_requests_by_kind: BTreeMap<String, u64>,
    operator_cpu_secs_hooks: f64,
    operator_cpu_secs_rollouts: f64,
    load_average_before: String,
    load_average_after: String,
}

async fn measure(
    s: &Settings,
    client: &Client,
    kubectl: &Kubectl,
    operator_kubeconfig: &Path,
    dir: &Path,
) -> Result<Measured> {
    let suffix = support::run_suffix()?;
    let [ns_floor, ns_ballast] =
        ["floor", "ballast"].map(|k| format!("bench-rollout-{suffix:06}-{k}"));
    let mut cleanup = Cleanup {
        kubectl: kubectl.clone(),
        namespaces: vec![ns_floor.clone(), ns_ballast.clone()],
        operator: None,
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for ns in [&ns_floor, &ns_ballast] {
        create_namespace(&namespaces, ns).await?;
    }
    let load_average_before = load_average();
    let t = Instant::now();
    let mut objects: Vec<(String, i32)> = (0..s.deployments).map(|i| (hook_name(i), 1)).collect();
    objects.push((ROLLOUT.into(), ROLLOUT_REPLICAS));
    for ns in [&ns_floor, &ns_ballast] {
        let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
        for (name, replicas) in &objects {
            api.create(&PostParams::default(), &deployment(name, *replicas)?)
                .await?;
        }
    }
    let obs = Observer::start(client, &[&ns_floor, &ns_ballast], &ns_ballast).await?;
    let all_complete = |s: &Seen| {
        [&ns_floor, &ns_ballast]
            .iter()
            .all(|ns| {
                objects
                    .iter()
                    .all(|(n, _)| s.complete.contains_key(&(ns.to_string(), n.clone(), 0)))
            })
            .then_some(())
    };
    obs.wait(
        "every Deployment available",
        Duration::from_secs(180),
        all_complete,
    )
    .await?;
    // Strategies for the running Deployments: adopted, no hook runs.
    let strategies: Api<RolloutStrategy> = Api::namespaced(client.clone(), &ns_ballast);
    for (name, _) in &objects {
        strategies
            .create(&PostParams::default(), &strategy(name, name != ROLLOUT)?)
            .await?;
    }
    // Watching every namespace, the operator would act on any strategy or policy of the cluster
    // (one of `make run`'s examples, another bench's): then it watches the bench's alone.
    let others = others_objects(client, &ns_ballast).await?;
    if !s.scoped && !others.is_empty() {
        eprintln!(
            "[bench] note: the cluster has RolloutStrategies or spread policies of its own ({}): \
             the operator watches {ns_ballast} only, so P6's plain Deployment is one it does not \
             watch",
            others.join(", ")
        );
    }
    let scoped = s.scoped || !others.is_empty();
    let watch = scoped.then_some(ns_ballast.as_str());
    let mut operator = Operator::start_watching(operator_kubeconfig, dir, &ns_ballast, watch)?;
    obs.wait(
        "every strategy adopted its Deployment (Idle)",
        Duration::from_secs(120),
        |s| {
            objects
                .iter()
                .all(|(n, _)| {
                    s.strategies.get(n).is_some_and(|st| {
                        st.phase == Some(RolloutPhase::Idle) && st.stable_revision.is_some()
                    })
                })
                .then_some(())
        },
    )
    .await?;
    operator.settle(s.quiet).await?;
    eprintln!(
        "[bench] {} + 1 Deployments in {ns_floor} and {ns_ballast}, adopted and settled ({:.1} s; operator log {})",
        s.deployments,
        t.elapsed().as_secs_f64(),
        operator.log.display()
    );
    // Governed Deployments are unpaused at rest (the revision gate is in force).
    {
        let seen = obs.seen.lock().expect("seen");
        for (name, _) in &objects {
            let d = &seen.deployments[&(ns_ballast.clone(), name.clone())];
            ensure!(
                d.spec.as_ref().and_then(|s| s.paused) != Some(true),
                "{ns_ballast}/{name} is paused at rest: is the revision gate (config/default) in force?"
            );
        }
    }

    // P5, ABBA: floor, ballast, ballast, floor.
    let floor_controller = FloorController::start(client, &ns_floor);
    let half = (s.revisions / 2) as u32;
    let (first, second) = (1..1 + half, 1 + half..1 + 2 * half);
    let mut hooks = Vec::new();
    hooks.extend(hook_phase(&obs, client, &ns_floor, false, s.deployments, first.clone()).await?);
    let before = operator.metrics().await?;
    let text0 = operator.metrics_text().await?;
    let counters0 = controller_counters(&text0, "rollout-strategy");
    let seconds0 = RequestSeconds::parse(&text0);
    let cpu0 = operator.cpu_secs()?;
    hooks.extend(hook_phase(&obs, client, &ns_ballast, true, s.deployments, first).await?);
    hooks.extend(
        hook_phase(
            &obs,
            client,
            &ns_ballast,
            true,
            s.deployments,
            second.clone(),
        )
        .await?,
    );
    hooks.extend(hook_phase(&obs, client, &ns_floor, false, s.deployments, second).await?);
    drop(floor_controller);
    let after = operator.settle(s.quiet).await?;
    let text1 = operator.metrics_text().await?;
    let hook_counters = delta(&controller_counters(&text1, "rollout-strategy"), &counters0);
    let hook_request_ms = RequestSeconds::parse(&text1).mean_ms_since(&seconds0);
    let ms = |ballast: bool| -> Vec<f64> {
        hooks
            .iter()
            .filter(|h| h.ballast == ballast)
            .map(|h| h.ms)
            .collect()
    };
    let (hook_floor_ms, hook_ballast_ms) = (ms(false), ms(true));
    let operator_cpu_secs_hooks = operator.cpu_secs()? - cpu0;
    let (hook_requests, hook_requests_by_kind) = requests_but_watches(&after.since(&before));
    let hook_revisions = s.deployments * s.revisions;
    let hook_jobs_created = {
        let seen = obs.seen.lock().expect("seen");
        seen.job_complete
            .iter()
            .filter(|((ns, _, _), _)| *ns == ns_ballast)
            .map(|(_, v)| v.len())
            .sum()
    };

    // P6, twice. First with P5's strategies still in the governed namespace: the revision
    // gate's policies evaluate every write of a governed Deployment once per strategy of its
    // namespace (config/admission), so this shows what they cost; reported, not judged. Then
    // with the P6 strategy alone, as the issue states P6: judged.
    let crowded = p6_set(&obs, client, &ns_floor, &ns_ballast, s.crowded_rollouts, 1).await?;
    for (name, _) in objects.iter().filter(|(n, _)| n != ROLLOUT) {
        strategies.delete(name, &Default::default()).await?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = strategies
            .list_metadata(&Default::default())
            .await?
            .items
            .len();
        if left == 1 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "P5's strategies not gone after 2 minutes ({left} strategies left in {ns_ballast})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let before = operator.settle(s.quiet).await?;
    let cpu0 = operator.cpu_secs()?;
    let alone = p6_set(
        &obs,
        client,
        &ns_floor,
        &ns_ballast,
        s.rollouts,
        1 + s.crowded_rollouts as u32,
    )
    .await?;
    let after = operator.settle(s.quiet).await?;
    let operator_cpu_secs_rollouts = operator.cpu_secs()? - cpu0;
    let (rollout_requests, rollout_requests_by_kind) = requests_but_watches(&after.since(&before));
    operator.alive()?;
    cleanup.operator = Some(operator);
    drop(obs);
    drop(cleanup);
    Ok(Measured {
        operator_scope: if scoped { "namespace" } else { "cluster" },
        hook_floor_ms,
        hook_ballast_ms,
        hooks,
        hook_counters,
        hook_request_ms,
        rollout_plain_secs: alone.plain,
        rollout_governed_secs: alone.governed,
        rollout_admission_evaluations: alone.admission_evaluations,
        crowded_strategies: objects.len(),
        crowded_plain_secs: crowded.plain,
        crowded_governed_secs: crowded.governed,
        crowded_admission_evaluations: crowded.admission_evaluations,
        rollout_conflicts: alone.conflicts,
        rollout_segments_ms: alone.segments,
        hook_revisions,
        hook_requests,
        hook_requests_by_kind,
        hook_jobs_created,
        rollout_requests,
        rollout_requests_by_kind,
        operator_cpu_secs_hooks,
        operator_cpu_secs_rollouts,
        load_average_before,
        load_average_after: load_average(),
    })
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

fn rows(m: &Measured) -> Vec<Row> {
    let mut rows = Vec::new();
    let n = m.hook_ballast_ms.len();
    for (q, label) in [(0.5, "p50"), (0.9, "p90")] {
        let (f, b) = (
            quantile(&m.hook_floor_ms, q),
            quantile(&m.hook_ballast_ms, q),
        );
        rows.push(Row {
            id: "P5",
            measure: format!("hook Job complete → Deployment unpaused, {label} ms ({n} hooks)"),
            floor: format!("{f:.1}"),
            ballast: format!("{b:.1}"),
            ratio: format!("{:.2}", b / f),
            goal: String::new(),
            pass: None,
        });
    }
    let (f, b) = (
        quantile(&m.hook_floor_ms, 0.99),
        quantile(&m.hook_ballast_ms, 0.99),
    );
    rows.push(Row {
        id: "P5",
        measure: format!("hook Job complete → Deployment unpaused, p99 ms ({n} hooks)"),
        floor: format!("{f:.1}"),
        ballast: format!("{b:.1}"),
        ratio: format!("{:.2}", b / f),
        goal: "p99 ≤ 200 ms".into(),
        pass: Some(b <= 200.0),
    });
    rows.push(Row {
        id: "P5",
        measure: "hook Jobs run per revision".into(),
        floor: "1.00".into(),
        ballast: format!(
            "{:.2}",
            m.hook_jobs_created as f64 / m.hook_revisions as f64
        ),
        ratio: String::new(),
        goal: "= 1".into(),
        pass: Some(m.hook_jobs_created == m.hook_revisions),
    });
    // P6's row for one set: judged for the strategy alone, reported for the crowded one.
    let p6 = |measure: String, plain: &[f64], governed: &[f64], judged: bool| {
        let (p, g) = (median(plain), median(governed));
        Row {
            id: "P6",
            measure,
            floor: format!("{p:.2}"),
            ballast: format!("{g:.2}"),
            ratio: format!("{:.2}", g / p),
            goal: if judged {
                "≤ 1.05× floor".into()
            } else {
                String::new()
            },
            pass: judged.then_some(g / p <= 1.05),
        }
    };
    rows.push(p6(
        format!(
            "template change → rollout of {ROLLOUT_REPLICAS} replicas complete, median s ({} each)",
            m.rollout_plain_secs.len()
        ),
        &m.rollout_plain_secs,
        &m.rollout_governed_secs,
        true,
    ));
    rows.push(p6(
        format!(
            "the same with {} strategies in the namespace (P5's), median s ({} each)",
            m.crowded_strategies,
            m.crowded_plain_secs.len()
        ),
        &m.crowded_plain_secs,
        &m.crowded_governed_secs,
        false,
    ));
    let per = |evaluations: f64, revisions: usize| evaluations / revisions.max(1) as f64;
    rows.push(Row {
        id: "P6",
        measure: format!(
            "admission evaluations for strategies not its own, per governed revision, alone / with {}",
            m.crowded_strategies
        ),
        floor: String::new(),
        ballast: format!(
            "{:.0} / {:.0}",
            per(m.rollout_admission_evaluations, m.rollout_governed_secs.len()),
            per(m.crowded_admission_evaluations, m.crowded_governed_secs.len())
        ),
        ratio: String::new(),
        goal: String::new(),
        pass: None,
    });
    rows.push(Row {
        id: "P6",
        measure: "Deployment and ReplicaSet writes refused as conflicts, per rollout (alone)"
            .into(),
        floor: format!(
            "{:.1}",
            per(m.rollout_conflicts[0], m.rollout_plain_secs.len())
        ),
        ballast: format!(
            "{:.1}",
            per(m.rollout_conflicts[1], m.rollout_governed_secs.len())
        ),
        ratio: String::new(),
        goal: String::new(),
        pass: None,
    });
    // Where the rollouts' time went: the median of each segment, plain and governed.
    let part = |kind: usize, i: usize| {
        median(
            &m.rollout_segments_ms[kind]
                .iter()
                .map(|s| s[i])
                .collect::<Vec<_>>(),
        )
    };
    let parts = |kind: usize| {
        format!(
            "{:.0} / {:.0} / {:.0}",
            part(kind, 0),
            part(kind, 1),
            part(kind, 2)
        )
    };
    rows.push(Row {
        id: "P6",
        measure: "median ms (alone): to the new ReplicaSet / its replicas available / complete"
            .into(),
        floor: parts(0),
        ballast: parts(1),
        ratio: String::new(),
        goal: String::new(),
        pass: None,
    });
    let per = m.hook_requests as f64 / m.hook_revisions as f64;
    rows.push(Row {
        id: "P8",
        measure: "API requests per governed-workload change, pre hook (P5)".into(),
        floor: String::new(),
        ballast: format!("{per:.2}"),
        ratio: String::new(),
        goal: "≤ 2".into(),
        pass: Some(per <= 2.0),
    });
    let per = m.rollout_requests as f64 / m.rollout_governed_secs.len() as f64;
    rows.push(Row {
        id: "P8",
        measure: "API requests per governed-workload change, no hooks (P6)".into(),
        floor: String::new(),
        ballast: format!("{per:.2}"),
        ratio: String::new(),
        goal: "≤ 2".into(),
        pass: Some(per <= 2.0),
    });
    rows
}

async fn run(s: &Settings) -> Result<()> {
    let kubeconfig = std::path::PathBuf::from(std::env::var_os("KUBECONFIG").ok_or_else(|| {
        anyhow!(
            "KUBECONFIG is not set: run `make bench-cluster`, or point it at .cluster/kubeconfig"
        )
    })?);
    let client = client(&kubeconfig).await?;
    let kubectl = Kubectl { kubeconfig };
    let dir = repo_root().join("target/bench-rollout");
    let operator_kubeconfig = operator_kubeconfig(&kubectl, &dir)?;
    admission_synced(&client).await?;
    let started = jiff::Timestamp::now();
    let m = measure(s, &client, &kubectl, &operator_kubeconfig, &dir).await?;
    let rows = rows(&m);
    print_table(&rows);
    let cs = |v: &[f64]| {
        v.iter()
            .map(|v| (v * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    };
    println!(
        "P5 max ms: floor {:.1}, ballast {:.1}; P6 each, s: plain {:?}, governed {:?}; with {} strategies: plain {:?}, governed {:?}",
        m.hook_floor_ms.iter().copied().fold(0.0, f64::max),
        m.hook_ballast_ms.iter().copied().fold(0.0, f64::max),
        cs(&m.rollout_plain_secs),
        cs(&m.rollout_governed_secs),
        m.crowded_strategies,
        cs(&m.crowded_plain_secs),
        cs(&m.crowded_governed_secs),
    );
    let mut slow: Vec<&Hook> = m.hooks.iter().filter(|h| h.ballast).collect();
    slow.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    println!("Slowest governed hooks (the bench's receive times, UTC):");
    for h in slow.iter().take(5) {
        println!(
            "  {} revision {}: Job complete seen {}, unpaused seen {}: {:.1} ms",
            h.deployment, h.revision, h.job_complete_seen, h.unpaused_seen, h.ms
        );
    }
    println!(
        "RolloutStrategy controller over the P5 phases: {:?}",
        m.hook_counters
    );
    println!(
        "Operator requests over the P5 phases ({} revisions): {:?}",
        m.hook_revisions, m.hook_requests_by_kind
    );
    println!(
        "Operator's mean ms per request over the P5 phases: {}",
        m.hook_request_ms
            .iter()
            .map(|(k, v)| format!("{k} {v:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "Operator requests over the P6 phase ({} revisions): {:?}",
        m.rollout_governed_secs.len(),
        m.rollout_requests_by_kind
    );
    println!(
        "Load average before / after: {} / {}",
        m.load_average_before, m.load_average_after
    );
    println!("The operator watched: {}", m.operator_scope);
    let version = client.apiserver_version().await?.git_version;
    let doc = json!({
        "bench": "cluster_rollout",
        "started": started.to_string(),
        "machine": machine(),
        "kubernetes": version,
        "settings": {
            "hook_deployments": s.deployments,
            "hook_revisions": s.revisions,
            "rollouts": s.rollouts,
            "crowded_rollouts": s.crowded_rollouts,
            "quiet_secs": s.quiet.as_secs(),
            "operator_scope": if s.scoped { "namespace" } else { "cluster" },
        },
        "rows": rows,
        "measured": m,
    });
    let path = write_results("cluster_rollout", started, &doc)?;
    println!("Results: {}", path.display());
    support::ensure_rows_pass(&rows)
}

#[tokio::main]
async fn main() -> Result<()> {
    let start = Instant::now();
    let s = Settings::from_env()?;
    eprintln!(
        "[bench] cluster_rollout: {} Deployments × {} revisions with a pre hook per side, {} rollouts of each kind ({} with P5's strategies); the operator to watch {}",
        s.deployments,
        s.revisions,
        s.rollouts,
        s.crowded_rollouts,
        if s.scoped {
            "the governed namespace only"
        } else {
            "every namespace (unless the cluster has strategies or policies of its own)"
        }
    );
    let result = support::until_signal(run(&s)).await;
    eprintln!(
        "[bench] total, with setup and cleanup: {:.0} s",
        start.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        bail!("cluster_rollout: {e:#}");
    }
    Ok(())
}
