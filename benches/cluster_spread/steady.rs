//! P2 of issue 9: the steady state. With N workloads converged under the policy and the operator
//! settled, 10% of them are scaled up and down for `BALLAST_BENCH_STEADY_SECS` (10 minutes), the
//! way replicas come and go on a real cluster. Scaling never changes what ballast decides on
//! (the pod template), so the goal is no template write, a status write only when the policy's
//! status really changes, and, once the churn has stopped and the cluster is quiet again, no API
//! request at all (watches and the Lease renewals aside) for `BALLAST_BENCH_STEADY_QUIET_SECS`.
//!
//! The churn is even, not in bursts: one Deployment of the churned tenth is toggled between 0 and
//! 1 replica at a time, each of them once per `BALLAST_BENCH_CHURN_PERIOD_SECS` (150 s), so that
//! the deployment controller (100 requests/s, `hack/cluster-up.sh`) keeps up; the pods are real
//! (kwok runs them, the scheduler places them under the policy's Required zone anti-affinity). A
//! status write is "real" when the bench's own watch of the policy saw its status change: the
//! operator's status PATCHes must be no more than the changes seen.
//!
//! Other work may run during the churn (`hack/bench-cluster.sh` builds the other benches and runs
//! cluster_admission then, on the same cluster: P2's measures are counts of the operator's own
//! requests, which the load of others does not change): `BALLAST_BENCH_STEADY_STARTED` names a
//! file this creates once the churn has begun, and `BALLAST_BENCH_STEADY_HOLD` one it waits for
//! (up to 30 minutes) once the churn is over, before the operator must settle and the quiet
//! window starts, so that nothing of the others (their namespaces being deleted) falls into it.
//! `BALLAST_BENCH_BESIDE` says what, for the results.

use anyhow::{Context, Result, bail, ensure};
use ballast::api::spread_policy::SpreadPolicy;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api,
    api::{Patch, PatchParams},
    runtime::watcher,
};
use serde_json::json;
use std::{
    collections::{BTreeMap, HashSet},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::support::{env_usize, operator::Operator};

/// How long, and at what pace, the churn runs.
pub struct SteadySettings {
    pub secs: u64,
    pub churn_period: Duration,
    pub quiet: Duration,
    /// Created once the churn has begun (`BALLAST_BENCH_STEADY_STARTED`).
    pub started_file: Option<PathBuf>,
    /// Waited for once the churn is over (`BALLAST_BENCH_STEADY_HOLD`).
    pub hold_file: Option<PathBuf>,
}

/// How long P2 waits for `BALLAST_BENCH_STEADY_HOLD` at most.
const HOLD_LIMIT: Duration = Duration::from_secs(30 * 60);

impl SteadySettings {
    pub fn from_env(smoke: bool) -> Result<Self> {
        let (secs, period, quiet) = if smoke { (20, 10, 10) } else { (600, 150, 60) };
        Ok(SteadySettings {
            secs: env_usize("BALLAST_BENCH_STEADY_SECS", secs)? as u64,
            churn_period: Duration::from_secs(
                env_usize("BALLAST_BENCH_CHURN_PERIOD_SECS", period)? as u64,
            ),
            quiet: Duration::from_secs(env_usize("BALLAST_BENCH_STEADY_QUIET_SECS", quiet)? as u64),
            started_file: std::env::var_os("BALLAST_BENCH_STEADY_STARTED").map(PathBuf::from),
            hold_file: std::env::var_os("BALLAST_BENCH_STEADY_HOLD").map(PathBuf::from),
        })
    }
}

/// What the steady state measured.
#[derive(Debug, serde::Serialize)]
pub struct SteadyResult {
    pub n: usize,
    pub churned: usize,
    pub secs: f64,
    /// The bench's scale PATCHes (each a change of `spec.replicas`).
    pub scale_changes: u64,
    /// How long the churn's end waited for the benches beside it (`BALLAST_BENCH_STEADY_HOLD`).
    pub held_secs: f64,
    /// The operator's PATCHes of Deployments during the churn and until quiet after it.
    pub template_writes: u64,
    /// The operator's PATCHes of the policy's status meanwhile.
    pub status_writes: u64,
    /// Changes of the policy's status that the bench's watch saw meanwhile.
    pub status_changes_seen: u64,
    /// Every request of the operator meanwhile, watches excluded, by `verb group/resource code`.
    pub requests_by_kind: BTreeMap<String, u64>,
    /// The quiet window after it: its length, and the operator's requests in it (watches and
    /// the Lease excluded).
    pub quiet_secs: f64,
    pub quiet_requests: u64,
    pub quiet_requests_by_kind: BTreeMap<String, u64>,
}

fn is_status_patch(verb: &str, group: &str, resource: &str) -> bool {
    verb == "patch" && group == "ballast.dev" && resource == "spreadpolicies/status"
}

fn is_template_write(verb: &str, group: &str, resource: &str) -> bool {
    verb == "patch" && group == "apps" && resource == "deployments"
}

/// Counts the changes of `name`'s status that a watch of `api` delivers, until dropped. The
/// receiver resolves once the watch's initial list is in: a status write before that would be
/// counted by the operator's metrics but never seen as a change by the watch.
fn count_status_changes(
    api: Api<SpreadPolicy>,
    name: &str,
) -> (
    Arc<AtomicU64>,
    tokio::sync::oneshot::Receiver<()>,
    tokio::task::JoinHandle<()>,
) {
    let seen = Arc::new(AtomicU64::new(0));
    let counter = seen.clone();
    let (listed, listed_rx) = tokio::sync::oneshot::channel();
    let mut listed = Some(listed);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let task = tokio::spawn(async move {
        let mut last: Option<serde_json::Value> = None;
        let mut events = watcher(api, config).boxed();
        while let Some(ev) = events.next().await {
            if let Ok(watcher::Event::InitDone) = ev
                && let Some(tx) = listed.take()
            {
                let _ = tx.send(());
            }
            let Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) = ev else {
                continue;
            };
            let status = serde_json::to_value(&p.status).unwrap_or_default();
            if last.as_ref().is_some_and(|l| *l != status) {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            last = Some(status);
        }
    });
    (seen, listed_rx, task)
}

/// Waits until the deployment controller has observed every Deployment of `names` at 0
/// replicas (its backlog of the churn drained). A watch, not polling: the harness must not load
/// the API server it measures.
async fn drained(api: &Api<Deployment>, names: &[String]) -> Result<()> {
    let mut behind: HashSet<&str> = names.iter().map(String::as_str).collect();
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    let limit = tokio::time::sleep(Duration::from_secs(600));
    tokio::pin!(limit);
    loop {
        let ev = tokio::select! {
            ev = events.next() => ev.context("the watch ended")??,
            _ = &mut limit => bail!("{} churned Deployments not back at 0 replicas after 10 minutes", behind.len()),
        };
        let (watcher::Event::Apply(d) | watcher::Event::InitApply(d)) = ev else {
            continue;
        };
        let Some(name) = names.iter().find(|n| Some(*n) == d.metadata.name.as_ref()) else {
            continue;
        };
        let status = d.status.unwrap_or_default();
        if status.observed_generation == d.metadata.generation && status.replicas.unwrap_or(0) == 0
        {
            behind.remove(name.as_str());
            if behind.is_empty() {
                return Ok(());
            }
        } else {
            behind.insert(name.as_str());
        }
    }
}

/// Waits until `file` exists: the benches run beside the churn are over (their cleanup too).
async fn wait_for_hold(file: &std::path::Path, operator: &mut Operator) -> Result<f64> {
    if file.exists() {
        return Ok(0.0);
    }
    eprintln!("[bench] churn over; waiting for the benches beside it to finish");
    let t = Instant::now();
    while !file.exists() {
        operator.alive()?;
        ensure!(
            t.elapsed() < HOLD_LIMIT,
            "BALLAST_BENCH_STEADY_HOLD: {} not there after {} minutes",
            file.display(),
            HOLD_LIMIT.as_secs() / 60
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let held = t.elapsed().as_secs_f64();
    eprintln!("[bench] the benches beside P2 finished {held:.0} s after its churn");
    Ok(held)
}

/// Runs the churn against `api`'s Deployments named `names` (all converged under `policy`) with
/// `operator` settled, then the quiet window.
pub async fn measure(
    s: &SteadySettings,
    api: &Api<Deployment>,
    policies: &Api<SpreadPolicy>,
    policy: &str,
    names: &[String],
    operator: &mut Operator,
    settle: Duration,
) -> Result<SteadyResult> {
    let n = names.len();
    let churned: Vec<String> = names.iter().take(n.div_ceil(10)).cloned().collect();
    let (seen, listed, watch) = count_status_changes(policies.clone(), policy);
    // The watch's initial list is not a change: start counting once it is in (on a busy
    // machine that can take longer than any fixed pause).
    tokio::time::timeout(Duration::from_secs(60), listed)
        .await
        .context("the status watch's initial list")?
        .context("the status watch ended")?;
    let before = operator.metrics().await?;
    let step = s.churn_period / churned.len() as u32;
    let t = Instant::now();
    let mut scale_changes = 0u64;
    let mut up = vec![false; churned.len()];
    let mut next = Instant::now();
    if let Some(f) = &s.started_file {
        std::fs::write(f, "")
            .with_context(|| format!("BALLAST_BENCH_STEADY_STARTED: {}", f.display()))?;
    }
    'churn: loop {
        for (i, name) in churned.iter().enumerate() {
            if t.elapsed() >= Duration::from_secs(s.secs) {
                break 'churn;
            }
            operator.alive()?;
            up[i] = !up[i];
            let replicas = i32::from(up[i]);
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
            .with_context(|| format!("scaling {name} to {replicas}"))?;
            scale_changes += 1;
            next += step;
            tokio::time::sleep_until(next.into()).await;
        }
    }
    // Back to 0, then wait for the cluster (and the operator) to be quiet again.
    for (i, name) in churned.iter().enumerate() {
        if up[i] {
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": 0}})),
            )
            .await?;
            scale_changes += 1;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let held_secs = match &s.hold_file {
        Some(f) => wait_for_hold(f, operator).await?,
        None => 0.0,
    };
    drained(api, &churned).await?;
    let after = operator.settle(settle).await?;
    let delta = after.since(&before);
    let count = |pick: fn(&str, &str, &str) -> bool| -> u64 {
        delta
            .iter()
            .filter(|((verb, group, resource, _), _)| pick(verb, group, resource))
            .map(|(_, v)| v)
            .sum()
    };
    let template_writes = count(is_template_write);
    let status_writes = count(is_status_patch);
    let (_, requests_by_kind) = crate::support::operator::requests_but_watches(&delta);
    // The watch delivers the last write's event a moment after its response: give it up to 3 s
    // to catch up (a write that changed nothing makes no event, and still fails the row).
    let caught_up = Instant::now();
    while seen.load(Ordering::Relaxed) < status_writes
        && caught_up.elapsed() < Duration::from_secs(3)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status_changes_seen = seen.load(Ordering::Relaxed);
    eprintln!(
        "[bench] N={n}: steady state {secs:.0} s, {scale_changes} scale changes of {} Deployments: \
         {template_writes} template writes, {status_writes} status writes ({status_changes_seen} status changes seen)",
        churned.len()
    );

    // Nothing changes now: no request at all.
    let quiet_start = operator.metrics().await?;
    let t = Instant::now();
    tokio::time::sleep(s.quiet).await;
    let quiet_delta = operator.metrics().await?.since(&quiet_start);
    let (quiet_requests, quiet_requests_by_kind) =
        crate::support::operator::requests_but_watches(&quiet_delta);
    let quiet_secs = t.elapsed().as_secs_f64();
    watch.abort();
    ensure!(
        policies.get(policy).await?.status.is_some(),
        "the policy has no status"
    );
    eprintln!("[bench] N={n}: quiet {quiet_secs:.0} s: {quiet_requests} requests");
    Ok(SteadyResult {
        n,
        churned: churned.len(),
        secs,
        scale_changes,
        held_secs,
        template_writes,
        status_writes,
        status_changes_seen,
        requests_by_kind,
        quiet_secs,
        quiet_requests,
        quiet_requests_by_kind,
    })
}
