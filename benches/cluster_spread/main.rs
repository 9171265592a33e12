//! `make bench-cluster`: how fast a SpreadPolicy fans out to N Deployments, side by side with a
//! single client applying the same change (issue 9, P1; with P4 and P8 from the same runs).
//!
//! Against the local control plane of `KUBECONFIG` (127.0.0.1 only), for each N of
//! `BALLAST_BENCH_SPREAD_N` (1000 and 5000), in one run:
//! - four namespaces, each with the same N Deployments (`replicas: 0`, so only the writes and the
//!   deployment controller's own work count), labelled `tier: bench`;
//! - the floor: `kubectl apply --server-side` of exactly the apply configurations ballast writes
//!   (the same term, owner annotation and record) to the N Deployments of the first namespace, in
//!   one invocation: one client, one write per Deployment, from start to exit (the floor of
//!   issue 9); and a stricter one: the same apply configurations sent to the N Deployments of a
//!   second namespace, and once ballast's phase is over of a fourth (A-B-A: a drift of the API
//!   server's time per write over the run, as the ReplicaSets it stores grow, weighs on both
//!   sides alike; the floor is the mean of the two), by one kube client with as many in flight
//!   as ballast writes at once
//!   (`WRITE_CONCURRENCY`), with the manager's credentials (its ServiceAccount's token, as
//!   ballast: the API server's authentication, authorization and priority and fairness treat
//!   both alike, where the cluster admin's client certificate is cheaper per request; until
//!   2026-12-07 this floor wrote as the admin, see docs/benchmarks.md, "Whose writes"); each
//!   floor's time, like ballast's, runs until the bench's watch of its namespace (the admin's,
//!   on every side) has seen all N carry the term (or until its writes returned, if later);
//! - ballast: the real operator binary (release build, under the manager's ServiceAccount from
//!   `config/`, watching only its own namespace) is started and left to settle; then a
//!   SpreadPolicy that selects `tier: bench` (`rollout.maxConcurrent: 0`) is created, and the time
//!   runs until the bench's own watch of the namespace has seen all N carry the term. The watch
//!   is the only thing the bench asks of the API server meanwhile: no polling.
//! - the operator's template writes and all of its API requests, from its own
//!   `ballast_api_requests_total` (scraped on loopback before the policy and once it has been
//!   quiet after convergence), and its resident memory (`/proc`: now and peak).
//!
//! - P3, a restart with N converged, and P2, the steady state with scale churn (at one N: see
//!   `steady.rs`), with the same operator.
//!
//! All namespaces are filled before any phase, so the deployment controller's backlog is the
//! same background for all phases: its client is limited to 100 requests/s (`hack/cluster-up.sh`)
//! and the 4N creations keep it at that ceiling through every phase, at each N (an audit log of a
//! run shows it: docs/benchmarks.md, "What the API server does during P1"; the bench prints its
//! writes a second in each phase). The operator is stopped, the policy's finalizer dropped and
//! the namespaces deleted whatever happens (error, panic, Ctrl-C, SIGTERM, SIGHUP).
//!
//! It prints one table (measure, floor, ballast, ratio, goal, pass/fail) and writes it as JSON
//! to `bench/results/cluster_spread-<UTC time>.json`. Settings (environment):
//! BALLAST_BENCH_SPREAD_N (`1000,5000`), BALLAST_BENCH_CONCURRENCY (8: creations in flight
//! during setup), BALLAST_BENCH_QUIET_SECS (5: how long the operator's request counter must
//! stand still before and after the measured phase), BALLAST_BENCH_STEADY_N (the largest size up
//! to 5000; 0 skips P2), BALLAST_BENCH_STEADY_SECS (600), BALLAST_BENCH_CHURN_PERIOD_SECS (150),
//! BALLAST_BENCH_STEADY_QUIET_SECS (60). Results: docs/benchmarks.md and docs/performance.md.

mod steady;
#[path = "../support/mod.rs"]
mod support;
use support::operator::{
    Operator, RequestSeconds, admission_synced, controller_counters, delta, machine,
    operator_kubeconfig, watch_event_counters,
};
use support::{Deletion, Kubectl, Row, client, env_count, env_usize, repo_root};

use anyhow::{Context, Result, anyhow, bail, ensure};
use ballast::api::spread_policy::{SpreadPolicy, WorkloadKind};
use ballast::controller::spread_policy::{
    WRITE_CONCURRENCY,
    merge::merge,
    plan::{ANNOTATION_TERMS, Write, record_text},
    terms::{Terms, desired_terms},
    workload::Workload,
    write::apply_body,
};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams, PostParams},
    runtime::watcher,
};
use serde_json::{Value, json};
use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

const POLICY: &str = "bench-spread";
const FLOOR_MANAGER: &str = "bench-floor";
const LABEL: (&str, &str) = ("tier", "bench");
/// Longest wait for the operator to converge (it fails the bench, not hangs it).
const CONVERGE_LIMIT: Duration = Duration::from_secs(1800);

struct Settings {
    sizes: Vec<usize>,
    concurrency: usize,
    quiet: Duration,
    /// `BALLAST_BENCH_SMOKE=1`: CI's run of the harness (`hack/test.sh`: N = 200, a debug
    /// build, on the test cluster). Only the rows that count (writes, requests) must pass; times
    /// and memory are printed, not judged, and the results go to target/, not bench/results/.
    smoke: bool,
    /// P2 runs at this N (`BALLAST_BENCH_STEADY_N`; by default the largest of the sizes up to
    /// 5000, the size of the memory goal; 0: not at all).
    steady_n: usize,
    steady: steady::SteadySettings,
}

impl Settings {
    fn from_env() -> Result<Self> {
        let smoke = std::env::var("BALLAST_BENCH_SMOKE").is_ok_and(|v| v == "1");
        let sizes = std::env::var("BALLAST_BENCH_SPREAD_N")
            .unwrap_or_else(|_| if smoke { "200" } else { "1000,5000" }.into());
        let sizes = sizes
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<usize>()
                    .with_context(|| format!("BALLAST_BENCH_SPREAD_N: {s}"))
            })
            .collect::<Result<Vec<_>>>()?;
        ensure!(
            !sizes.is_empty() && sizes.iter().all(|n| *n > 0),
            "BALLAST_BENCH_SPREAD_N must list sizes of at least 1"
        );
        let default_steady = sizes
            .iter()
            .copied()
            .filter(|n| *n <= 5000)
            .max()
            .unwrap_or(0);
        Ok(Settings {
            steady_n: env_count("BALLAST_BENCH_STEADY_N", default_steady)?,
            steady: steady::SteadySettings::from_env(smoke)?,
            sizes,
            concurrency: env_usize("BALLAST_BENCH_CONCURRENCY", 8)?,
            quiet: Duration::from_secs(env_usize("BALLAST_BENCH_QUIET_SECS", 5)? as u64),
            smoke,
        })
    }
}

fn deployment(name: &str) -> Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {LABEL.0: LABEL.1, "app": name}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "registry.invalid/bench:1"}]},
            },
        },
    }))?)
}

fn policy() -> Result<SpreadPolicy> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "ballast.dev/v1alpha1", "kind": "SpreadPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "selector": {"matchLabels": {LABEL.0: LABEL.1}},
            "kinds": ["Deployment"],
            "spread": [{"topologyKey": "topology.kubernetes.io/zone", "mode": "Required"}],
            "rollout": {"maxConcurrent": 0},
        },
    }))?)
}

/// The terms the policy puts into `d`, and the apply configuration that writes them (what
/// ballast sends, without the resourceVersion precondition, as `kubectl apply` sends it).
fn terms_and_body(p: &SpreadPolicy, d: &Deployment, ns: &str) -> (String, Value) {
    let w = Workload::from_deployment(d);
    let desired = desired_terms(
        &p.spec,
        WorkloadKind::Deployment,
        &w.selector.to_label_selector(),
    );
    let merged = merge(&w, &Terms::default(), &desired);
    let record = record_text(&merged.ours);
    let write = Write {
        kind: WorkloadKind::Deployment,
        name: d.name_any(),
        record: record.clone(),
        template_changed: merged.template_changed,
        owner: Some(POLICY.into()),
        resource_version: None,
    };
    (record, apply_body(&write, ns, &w))
}

/// The record of our terms in `d`'s pod template, if any.
fn record_of(d: &Deployment) -> Option<&str> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(ANNOTATION_TERMS)
        .map(String::as_str)
}

async fn create_deployments(api: &Api<Deployment>, n: usize, c: usize) -> Result<Vec<Deployment>> {
    let objects = (0..n)
        .map(|i| deployment(&format!("d-{i:05}")))
        .collect::<Result<Vec<_>>>()?;
    Ok(stream::iter(objects)
        .map(|o| async move {
            // `admission_synced` waits for the gate to be in force; should an API server still
            // refuse a create with "paramKind … not yet synced" (the revision gate's param
            // informer) after that, retry that, and only that.
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match api.create(&PostParams::default(), &o).await {
                    Err(kube::Error::Api(e))
                        if e.code == 403
                            && e.message.contains("not yet synced")
                            && Instant::now() < deadline =>
                    {
                        tokio::time::sleep(Duration::from_millis(500)).await
                    }
                    r => return r,
                }
            }
        })
        .buffer_unordered(c)
        .try_collect::<Vec<_>>()
        .await?)
}

/// Stops the operator and deletes the namespaces (the policy's finalizer dropped) when dropped.
struct Cleanup {
    kubectl: Kubectl,
    namespaces: Vec<String>,
    operator: Option<Operator>,
    /// Between sizes, or after the last.
    deletion: Deletion,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        // First the operator: with it gone, nothing takes the terms out again.
        drop(self.operator.take());
        support::delete_namespaces(&self.kubectl, &self.namespaces, "600s", self.deletion);
    }
}

const USER_HZ: f64 = 100.0;

/// utime + stime of a process (with those of its waited-for children when `children`), in
/// seconds; 0 for one that is gone.
fn process_cpu(pid: u32, children: bool) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses and may hold spaces; utime,
    // stime, cutime and cstime are fields 14 to 17 of proc(5), 11 to 14 after the name.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let field = |i: usize| f.get(i).copied().unwrap_or(0.0);
    let own = field(11) + field(12);
    (if children {
        own + field(13) + field(14)
    } else {
        own
    }) / USER_HZ
}

/// Busy time of all CPUs (user, nice, system, irq, softirq, steal), in seconds.
fn machine_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<f64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let field = |i: usize| f.get(i).copied().unwrap_or(0.0);
    (field(0) + field(1) + field(2) + field(5) + field(6) + field(7)) / USER_HZ
}

/// The machine's CPU time used by everyone but this cluster's control plane (its pid files
/// next to the kubeconfig), the operator and this bench (kubectl included): another session's
/// build or tests on a shared machine, which the numbers of a phase then include.
struct Background {
    pids: Vec<u32>,
}

impl Background {
    fn of_cluster(kubeconfig: &Path) -> Self {
        let dir = kubeconfig.parent().unwrap_or(Path::new(".")).join("pids");
        let pids = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|p| p.trim().parse().ok())
            .collect();
        Background { pids }
    }

    /// Others' CPU seconds so far.
    fn others(&self, operator: Option<u32>) -> f64 {
        let ours: f64 = self
            .pids
            .iter()
            .chain(operator.as_ref())
            .map(|p| process_cpu(*p, false))
            .sum::<f64>()
            + process_cpu(std::process::id(), true);
        machine_cpu() - ours
    }
}

/// What one size measured.
#[derive(Debug, serde::Serialize)]
struct SizeResult {
    n: usize,
    floor_secs: f64,
    floor_writes: usize,
    /// The same writes from one kube client with the manager's credentials and as many in
    /// flight as ballast's writes: the mean of [`SizeResult::parallel_floor_each_secs`].
    parallel_floor_secs: f64,
    /// That floor before ballast's phase and after it.
    parallel_floor_each_secs: [f64; 2],
    ballast_secs: f64,
    /// From the start (the first write sent; the policy created) until the bench's watch saw the
    /// first Deployment carry the term: the stricter floor's and ballast's. What ballast adds
    /// here (the policy's watch event, its finalizer, the first plan) is paid once, not per
    /// workload.
    parallel_first_secs: f64,
    ballast_first_secs: f64,
    /// The mean time of one Deployment write, ms, 8 in flight, from sent to the response
    /// headers, as ballast's client layer times it (`ballast_api_request_duration_seconds`): the
    /// stricter floor's (its client is built the same way) and ballast's (from the policy's
    /// creation until it was quiet). Slower answers on ballast's side mean the API server took
    /// longer for the same write; the same answers at a slower pace mean ballast left slots
    /// empty. `None`: no such request was timed.
    parallel_write_ms: Option<f64>,
    ballast_write_ms: Option<f64>,
    /// The stricter floor's, before ballast's phase and after it.
    parallel_write_each_ms: [Option<f64>; 2],
    /// The operator's PATCHes of Deployments (its only way of writing them) from the policy's
    /// creation until it was quiet after convergence.
    ballast_template_writes: u64,
    /// Every request the operator made meanwhile, watches excluded.
    ballast_requests: u64,
    /// Those requests by `verb group/resource code`.
    ballast_requests_by_kind: BTreeMap<String, u64>,
    /// Cores used by other processes of the machine during the floor, the stricter floor,
    /// ballast's phase and the stricter floor again (see [`Background`]).
    others_cores: [f64; 4],
    /// The controller manager's writes for Deployments per second during the same four
    /// phases ([`controller_manager_rate`]): the load on the API server besides each side's
    /// own writes. After the bench creates 4 × N Deployments it works through their
    /// ReplicaSets for minutes, into every phase.
    controller_manager_writes_per_sec: [f64; 4],
    rss_mib: f64,
    peak_rss_mib: f64,
    /// RSS once settled with the N Deployments cached, before the policy was created.
    idle_rss_mib: f64,
    /// The operator's CPU time from the policy's creation until convergence, and until quiet.
    ballast_cpu_secs_to_converge: f64,
    ballast_cpu_secs_to_quiet: f64,
    /// Reconciles and write outcomes of the SpreadPolicy controller meanwhile.
    spread_counters: BTreeMap<String, f64>,
    /// The objects each of the operator's watches received meanwhile, by event (both
    /// controllers': each decodes what it receives).
    watch_events: BTreeMap<String, f64>,
    /// P3: from the restarted operator's start until a Deployment created at that instant
    /// carries the term.
    restart_secs: f64,
    /// Deployment writes of the restarted operator until quiet (the late one's only).
    restart_writes: u64,
    /// P2, at one of the sizes.
    steady: Option<steady::SteadyResult>,
}

/// A watch of `api`'s Deployments, past its initial list (in which none carries the term yet).
async fn watch_from_now(
    api: &Api<Deployment>,
) -> Result<futures::stream::BoxStream<'static, Result<watcher::Event<Deployment>, watcher::Error>>>
{
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    loop {
        match events.next().await {
            Some(Ok(watcher::Event::InitDone)) => return Ok(events),
            Some(Err(e)) => return Err(e.into()),
            None => bail!("the watch ended"),
            Some(Ok(_)) => {}
        }
    }
}

/// When the bench's watch saw the first of the Deployments carry the term, and when all of them.
#[derive(Clone, Copy)]
struct Seen {
    first: Instant,
    all: Instant,
}

/// The writes the controller manager has made for Deployments so far, as the API server counts
/// them (`apiserver_request_total`: ReplicaSets created, updated and their status, Deployment
/// status, refused ones included; nothing else in the bench writes those), and when they were
/// read: one GET of the API server's `/metrics` with the bench's admin client.
async fn controller_manager_writes(client: &Client) -> Result<(f64, Instant)> {
    let count = support::apiserver_sum(client, |l| {
        l.starts_with("apiserver_request_total{")
            && ((l.contains("resource=\"replicasets\"")
                && (l.contains("verb=\"POST\"") || l.contains("verb=\"PUT\"")))
                || (l.contains("resource=\"deployments\"")
                    && l.contains("subresource=\"status\"")
                    && l.contains("verb=\"PUT\"")))
    })
    .await?;
    Ok((count, Instant::now()))
}

/// The controller manager's writes a second since `before` ([`controller_manager_writes`]),
/// over the time between the two reads: a phase's own clock may start later (the stricter
/// floor's starts after its watch has listed the N Deployments).
async fn controller_manager_rate(client: &Client, before: (f64, Instant)) -> Result<f64> {
    let (count, at) = controller_manager_writes(client).await?;
    Ok((count - before.0) / at.duration_since(before.1).as_secs_f64())
}

/// The mean ms of the Deployment PATCHes timed in `metrics` (a /metrics page of a client built
/// as the manager's) since `before`; `None` when there were none.
fn deployment_write_ms(before: &RequestSeconds, metrics: &str) -> Option<f64> {
    RequestSeconds::parse(metrics)
        .mean_ms_since(before)
        .get("patch apps/deployments")
        .copied()
}

/// What a phase of the stricter floor needs besides its Deployments.
struct Strict<'a> {
    client: &'a Client,
    /// A client with the manager's credentials, timed as the manager's is.
    manager: &'a Client,
    manager_metrics: &'a ballast::metrics::Metrics,
    background: &'a Background,
    policy: &'a SpreadPolicy,
    quiet: Duration,
}

/// What one phase of the stricter floor measured.
struct StrictPhase {
    secs: f64,
    first_secs: f64,
    write_ms: Option<f64>,
    others_cores: f64,
    controller_manager_rate: f64,
}

impl Strict<'_> {
    /// The stricter floor ([`parallel_floor`]) on `ds` of `ns`, after the quiet pause, with the
    /// machine's other CPU (not counting the operator's process `operator`, when it runs) and
    /// the controller manager's writes meanwhile.
    async fn phase(
        &self,
        ds: &[Deployment],
        ns: &str,
        operator: Option<u32>,
    ) -> Result<StrictPhase> {
        let n = ds.len();
        let (records, bodies): (BTreeMap<String, String>, Vec<(String, Value)>) = ds
            .iter()
            .map(|d| {
                let (record, body) = terms_and_body(self.policy, d, ns);
                ((d.name_any(), record), (d.name_any(), body))
            })
            .unzip();
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), ns);
        let writes: Api<Deployment> = Api::namespaced(self.manager.clone(), ns);
        tokio::time::sleep(self.quiet).await;
        let others0 = self.background.others(operator);
        let kcm0 = controller_manager_writes(self.client).await?;
        let seconds0 = RequestSeconds::parse(&self.manager_metrics.render());
        let (secs, first_secs) = parallel_floor(&api, &writes, bodies, &records).await?;
        let write_ms = deployment_write_ms(&seconds0, &self.manager_metrics.render());
        let others_cores = (self.background.others(operator) - others0) / secs;
        let controller_manager_rate = controller_manager_rate(self.client, kcm0).await?;
        eprintln!(
            "[bench] N={n}: floor with {WRITE_CONCURRENCY} in flight ({ns}) {secs:.2} s (kube client, {n} server-side applies)"
        );
        Ok(StrictPhase {
            secs,
            first_secs,
            write_ms,
            others_cores,
            controller_manager_rate,
        })
    }
}

/// The stricter floor: `bodies` applied through `writes` (a client with the manager's
/// credentials), as many in flight as ballast writes at once, timed until the bench's watch
/// (through `api`) has seen all of them carry `records` (or the writes returned, if later).
/// Returns that time and the time until the first carried it, s.
async fn parallel_floor(
    api: &Api<Deployment>,
    writes: &Api<Deployment>,
    bodies: Vec<(String, Value)>,
    records: &BTreeMap<String, String>,
) -> Result<(f64, f64)> {
    let pp = PatchParams::apply(FLOOR_MANAGER).force();
    let mut events = watch_from_now(api).await?;
    let t = Instant::now();
    let writes = async {
        stream::iter(bodies)
            .map(|(name, body)| {
                let pp = &pp;
                async move { writes.patch(&name, pp, &Patch::Apply(body)).await.map(drop) }
            })
            .buffer_unordered(WRITE_CONCURRENCY)
            .try_collect::<Vec<()>>()
            .await
            .map(|_| Instant::now())
    };
    let (written, seen) = tokio::join!(writes, converged(&mut events, records, records.len()));
    let seen = seen?;
    Ok((
        seen.all.max(written?).duration_since(t).as_secs_f64(),
        seen.first.duration_since(t).as_secs_f64(),
    ))
}

/// Waits for the watch `events` to show all `want` Deployments carrying `record`; returns when
/// the first and the last were seen.
async fn converged(
    events: &mut (
             impl futures::Stream<Item = Result<watcher::Event<Deployment>, watcher::Error>> + Unpin
         ),
    record: &BTreeMap<String, String>,
    want: usize,
) -> Result<Seen> {
    let mut carrying = HashSet::new();
    let mut first = None;
    let limit = tokio::time::sleep(CONVERGE_LIMIT);
    tokio::pin!(limit);
    loop {
        let ev = tokio::select! {
            ev = events.next() => ev.ok_or_else(|| anyhow!("the watch ended"))??,
            _ = &mut limit => bail!("not converged within {CONVERGE_LIMIT:?}: {} of {want}", carrying.len()),
        };
        let mut see = |d: &Deployment| {
            let name = d.name_any();
            if record_of(d) == record.get(&name).map(String::as_str) {
                first.get_or_insert_with(Instant::now);
                carrying.insert(name);
            } else {
                carrying.remove(&name);
            }
        };
        match &ev {
            watcher::Event::Apply(d) | watcher::Event::InitApply(d) => see(d),
            watcher::Event::Delete(d) => {
                carrying.remove(&d.name_any());
            }
            watcher::Event::Init | watcher::Event::InitDone => {}
        }
        if carrying.len() == want {
            let all = Instant::now();
            return Ok(Seen {
                first: first.unwrap_or(all),
                all,
            });
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    s: &Settings,
    background: &Background,
    n: usize,
    client: &Client,
    manager: &Client,
    manager_metrics: &ballast::metrics::Metrics,
    kubectl: &Kubectl,
    operator_kubeconfig: &Path,
    dir: &Path,
    deletion: Deletion,
) -> Result<SizeResult> {
    let suffix = support::run_suffix()?;
    let [ns_floor, ns_parallel, ns_ballast, ns_parallel_after] =
        ["floor", "floor8", "ballast", "floor8b"]
            .map(|k| format!("bench-spread-{suffix:06}-{n}-{k}"));
    let mut cleanup = Cleanup {
        kubectl: kubectl.clone(),
        namespaces: vec![
            ns_floor.clone(),
            ns_parallel.clone(),
            ns_ballast.clone(),
            ns_parallel_after.clone(),
        ],
        operator: None,
        deletion,
    };
    let t = Instant::now();
    for ns in [&ns_floor, &ns_parallel, &ns_ballast, &ns_parallel_after] {
        support::create_namespace(client, ns, "cluster-spread").await?;
    }
    let floor_api: Api<Deployment> = Api::namespaced(client.clone(), &ns_floor);
    let ballast_api: Api<Deployment> = Api::namespaced(client.clone(), &ns_ballast);
    let floor_ds = create_deployments(&floor_api, n, s.concurrency).await?;
    let parallel_ds = create_deployments(
        &Api::namespaced(client.clone(), &ns_parallel),
        n,
        s.concurrency,
    )
    .await?;
    let ballast_ds = create_deployments(&ballast_api, n, s.concurrency).await?;
    let parallel_after_ds = create_deployments(
        &Api::namespaced(client.clone(), &ns_parallel_after),
        n,
        s.concurrency,
    )
    .await?;
    eprintln!(
        "[bench] N={n}: {n} Deployments in each of {ns_floor}, {ns_parallel}, {ns_ballast} and {ns_parallel_after} ({:.1} s)",
        t.elapsed().as_secs_f64()
    );

    let p = policy()?;
    // The floor: one client, the same apply configurations, one invocation. Like ballast's, its
    // time runs until the bench's watch has seen all N carry the term (or until kubectl exits,
    // if that is later), so both pay for the same watch.
    let bodies: Vec<Value> = floor_ds
        .iter()
        .map(|d| terms_and_body(&p, d, &ns_floor).1)
        .collect();
    let records = |ds: &[Deployment], ns: &str| -> BTreeMap<String, String> {
        ds.iter()
            .map(|d| (d.name_any(), terms_and_body(&p, d, ns).0))
            .collect()
    };
    let manifest = json!({"apiVersion": "v1", "kind": "List", "items": bodies}).to_string();
    tokio::time::sleep(s.quiet).await;
    let mut events = watch_from_now(&floor_api).await?;
    let others0 = background.others(None);
    let kcm0 = controller_manager_writes(client).await?;
    let t = Instant::now();
    let apply = {
        let kubectl = kubectl.clone();
        tokio::task::spawn_blocking(move || {
            let out = kubectl.run(
                &[
                    "apply",
                    "--server-side",
                    "--force-conflicts",
                    &format!("--field-manager={FLOOR_MANAGER}"),
                    // Apply configurations are partial objects: only the API server can
                    // validate them.
                    "--validate=false",
                    "-f",
                    "-",
                ],
                Some(&manifest),
            );
            (out, Instant::now())
        })
    };
    let floor_records = records(&floor_ds, &ns_floor);
    let (applied, seen) = tokio::join!(apply, converged(&mut events, &floor_records, n));
    let (out, exited) = applied?;
    let (out, seen) = (out?, seen?);
    drop(events);
    let floor_secs = seen.all.max(exited).duration_since(t).as_secs_f64();
    let floor_others = (background.others(None) - others0) / floor_secs;
    let floor_kcm = controller_manager_rate(client, kcm0).await?;
    let floor_writes = out
        .lines()
        .filter(|l| l.contains("serverside-applied"))
        .count();
    ensure!(
        floor_writes == n,
        "kubectl applied {floor_writes} of {n} Deployments"
    );
    eprintln!("[bench] N={n}: floor {floor_secs:.2} s (kubectl apply --server-side, {n} objects)");

    // A stricter floor: the same apply configurations from one kube client with the manager's
    // credentials, as many in flight as ballast writes at once; timed the same way. Once here
    // and once after ballast's phase.
    let strict = Strict {
        client,
        manager,
        manager_metrics,
        background,
        policy: &p,
        quiet: s.quiet,
    };
    let before_ballast = strict.phase(&parallel_ds, &ns_parallel, None).await?;

    // Ballast.
    let records = records(&ballast_ds, &ns_ballast);
    let t = Instant::now();
    let mut operator = Operator::start(operator_kubeconfig, dir, &ns_ballast)?;
    let before = operator.settle(s.quiet).await?;
    // Its caches hold the N Deployments (and their ReplicaSets) before any policy exists.
    let (idle_rss_mib, _) = operator.rss_mib()?;
    eprintln!(
        "[bench] N={n}: operator settled ({:.1} s, log {})",
        t.elapsed().as_secs_f64(),
        operator.log.display()
    );
    let mut events = watch_from_now(&ballast_api).await?;
    let policies: Api<SpreadPolicy> = Api::namespaced(client.clone(), &ns_ballast);
    let text = operator.metrics_text().await?;
    let counters_before = controller_counters(&text, "spread-policy");
    let watch_events_before = watch_event_counters(&text);
    let seconds_before = RequestSeconds::parse(&text);
    let cpu0 = operator.cpu_secs()?;
    let operator_pid = Some(operator.child.id());
    let others0 = background.others(operator_pid);
    let kcm0 = controller_manager_writes(client).await?;
    let t0 = Instant::now();
    policies.create(&PostParams::default(), &p).await?;
    let seen = converged(&mut events, &records, n).await?;
    let ballast_secs = seen.all.duration_since(t0).as_secs_f64();
    let ballast_first_secs = seen.first.duration_since(t0).as_secs_f64();
    let ballast_cpu_secs_to_converge = operator.cpu_secs()? - cpu0;
    let ballast_others = (background.others(operator_pid) - others0) / ballast_secs;
    let ballast_kcm = controller_manager_rate(client, kcm0).await?;
    drop(events);
    eprintln!(
        "[bench] N={n}: ballast {ballast_secs:.2} s (policy created → all {n} carry the term)"
    );
    let after = operator.settle(s.quiet).await?;
    let (rss_mib, peak_rss_mib) = operator.rss_mib()?;
    let ballast_cpu_secs_to_quiet = operator.cpu_secs()? - cpu0;
    let text = operator.metrics_text().await?;
    let watch_events = delta(&watch_event_counters(&text), &watch_events_before);
    let ballast_write_ms = deployment_write_ms(&seconds_before, &text);
    let spread_counters = delta(
        &controller_counters(&text, "spread-policy"),
        &counters_before,
    );
    // The stricter floor again, ballast's phase over (A-B-A): with as many ReplicaSets stored
    // as ballast met, and the operator running on, idle (it watches its own namespace only).
    let after_ballast = strict
        .phase(&parallel_after_ds, &ns_parallel_after, operator_pid)
        .await?;
    // P3: a restart with N converged. The operator stops (SIGTERM: it gives up its Lease) and a
    // new one is started; in the same instant a Deployment the policy selects is created. The
    // time until that one carries the term is how long a restarted manager takes to act
    // (process start, Lease, caches synced, reconcile, one write); the N converged ones must
    // get no write.
    drop(operator);
    let late = ballast_api
        .create(&PostParams::default(), &deployment("late")?)
        .await?;
    let late_record: BTreeMap<String, String> =
        [("late".to_string(), terms_and_body(&p, &late, &ns_ballast).0)].into();
    let mut events = watch_from_now(&ballast_api).await?;
    let t0 = Instant::now();
    let mut operator = Operator::start(operator_kubeconfig, dir, &ns_ballast)?;
    let acted = converged(&mut events, &late_record, 1).await?;
    drop(events);
    let restart_secs = acted.all.duration_since(t0).as_secs_f64();
    eprintln!("[bench] N={n}: restarted, acting after {restart_secs:.2} s");
    let restarted = operator.settle(s.quiet).await?;
    let restart_writes: u64 = restarted
        .0
        .iter()
        .filter(|((verb, group, resource, _), _)| {
            verb == "patch" && group == "apps" && resource == "deployments"
        })
        .map(|(_, v)| v)
        .sum();
    // P2: the steady state, with the restarted operator.
    let steady = if n == s.steady_n {
        // The floors' namespaces are done with. Their 3N Deployments each got a template change
        // that the deployment controller (100 requests/s) is still working through (a new
        // ReplicaSet each), and would be through the whole churn and past it: at N = 5000 P2's
        // end waited about 2.5 minutes for that controller (`steady::drained`). Deleted now,
        // not waited for (their Deployments gone, its queue skips them): P2 counts the
        // operator's requests, not time, and the operator watches only its own namespace.
        let floors = [&ns_floor, &ns_parallel, &ns_parallel_after].map(String::clone);
        support::delete_namespaces(kubectl, &floors, "600s", Deletion::Early);
        cleanup.namespaces.retain(|ns| !floors.contains(ns));
        let mut names: Vec<String> = ballast_ds.iter().map(|d| d.name_any()).collect();
        names.push("late".into());
        Some(
            steady::measure(
                &s.steady,
                &ballast_api,
                &policies,
                POLICY,
                &names,
                &mut operator,
                s.quiet,
            )
            .await?,
        )
    } else {
        None
    };
    cleanup.operator = Some(operator);
    let delta = after.since(&before);
    let ballast_template_writes = delta
        .iter()
        .filter(|((verb, group, resource, _), _)| {
            verb == "patch" && group == "apps" && resource == "deployments"
        })
        .map(|(_, v)| v)
        .sum();
    let (ballast_requests, ballast_requests_by_kind) =
        support::operator::requests_but_watches(&delta);
    // The policy's status must agree with the watch.
    let status = policies.get(POLICY).await?.status.unwrap_or_default();
    ensure!(
        status.applied == Some(n as i32 + 1) && status.matched == Some(n as i32 + 1),
        "the policy's status says matched {:?} applied {:?}, expected {} (N and the late one)",
        status.matched,
        status.applied,
        n + 1
    );
    drop(cleanup);
    Ok(SizeResult {
        n,
        floor_secs,
        floor_writes,
        parallel_floor_secs: (before_ballast.secs + after_ballast.secs) / 2.0,
        parallel_floor_each_secs: [before_ballast.secs, after_ballast.secs],
        parallel_first_secs: (before_ballast.first_secs + after_ballast.first_secs) / 2.0,
        ballast_first_secs,
        parallel_write_ms: match (before_ballast.write_ms, after_ballast.write_ms) {
            (Some(a), Some(b)) => Some((a + b) / 2.0),
            (a, b) => a.or(b),
        },
        parallel_write_each_ms: [before_ballast.write_ms, after_ballast.write_ms],
        ballast_write_ms,
        others_cores: [
            floor_others,
            before_ballast.others_cores,
            ballast_others,
            after_ballast.others_cores,
        ],
        controller_manager_writes_per_sec: [
            floor_kcm,
            before_ballast.controller_manager_rate,
            ballast_kcm,
            after_ballast.controller_manager_rate,
        ],
        ballast_secs,
        ballast_template_writes,
        ballast_requests,
        ballast_requests_by_kind,
        rss_mib,
        peak_rss_mib,
        idle_rss_mib,
        ballast_cpu_secs_to_converge,
        ballast_cpu_secs_to_quiet,
        spread_counters,
        watch_events,
        restart_secs,
        restart_writes,
        steady,
    })
}

/// A row that counts (writes, requests) rather than times or weighs: it must pass on any
/// machine and build, the smoke run's too.
fn counts(r: &Row) -> bool {
    r.id == "P8" || r.id == "P2" || r.goal.starts_with("= ")
}

fn rows(results: &[SizeResult]) -> Vec<Row> {
    let mut rows = Vec::new();
    // A mean time per write, or "-" when none was timed.
    let ms = |m: Option<f64>| m.map_or("-".into(), |ms| format!("{ms:.1}"));
    for r in results {
        let ratio = r.ballast_secs / r.floor_secs;
        rows.push(Row {
            id: "P1",
            measure: format!("N={}: policy created → all carry the term, s", r.n),
            floor: format!("{:.2}", r.floor_secs),
            ballast: format!("{:.2}", r.ballast_secs),
            ratio: format!("{ratio:.2}"),
            goal: "≤ 1.2× floor".into(),
            pass: Some(ratio <= 1.2),
        });
        let strict = r.ballast_secs / r.parallel_floor_secs;
        rows.push(Row {
            id: "P1",
            measure: format!(
                "N={}: the same, floor = one kube client as the manager, {WRITE_CONCURRENCY} in flight",
                r.n
            ),
            floor: format!("{:.2}", r.parallel_floor_secs),
            ballast: format!("{:.2}", r.ballast_secs),
            ratio: format!("{strict:.2}"),
            goal: "≤ 1.2× floor".into(),
            pass: Some(strict <= 1.2),
        });
        // The floor above is the mean of a phase before ballast's and one after it.
        let [before, after] = r.parallel_floor_each_secs;
        let [ms_before, ms_after] = r.parallel_write_each_ms.map(ms);
        rows.push(Row {
            id: "P1",
            measure: format!(
                "N={}: that floor before / after ballast's phase, s (mean ms of one write)",
                r.n
            ),
            floor: format!("{before:.2} / {after:.2} ({ms_before} / {ms_after})"),
            ballast: String::new(),
            ratio: String::new(),
            goal: String::new(),
            pass: None,
        });
        // Where the stricter floor's time and ballast's differ: before the first workload carries
        // the term (paid once), or in the pace after it (paid per workload).
        let pace = |all: f64, first: f64| (r.n - 1) as f64 / (all - first).max(1e-3);
        rows.push(Row {
            id: "P1",
            measure: format!(
                "N={}: the same, until the first carries the term, s; then workloads/s",
                r.n
            ),
            floor: format!(
                "{:.2}; {:.0}",
                r.parallel_first_secs,
                pace(r.parallel_floor_secs, r.parallel_first_secs)
            ),
            ballast: format!(
                "{:.2}; {:.0}",
                r.ballast_first_secs,
                pace(r.ballast_secs, r.ballast_first_secs)
            ),
            ratio: String::new(),
            goal: String::new(),
            pass: None,
        });
        rows.push(Row {
            id: "P1",
            measure: format!(
                "N={}: the same, mean ms of one Deployment write (sent → response headers)",
                r.n
            ),
            floor: ms(r.parallel_write_ms),
            ballast: ms(r.ballast_write_ms),
            ratio: match (r.parallel_write_ms, r.ballast_write_ms) {
                (Some(f), Some(b)) if f > 0.0 => format!("{:.2}", b / f),
                _ => String::new(),
            },
            goal: String::new(),
            pass: None,
        });
        rows.push(Row {
            id: "P1",
            measure: format!("N={}: template writes", r.n),
            floor: r.floor_writes.to_string(),
            ballast: r.ballast_template_writes.to_string(),
            ratio: format!("{:.2}", r.ballast_template_writes as f64 / r.n as f64),
            goal: "= N".into(),
            pass: Some(r.ballast_template_writes == r.n as u64),
        });
        let per_change = r.ballast_requests as f64 / r.n as f64;
        rows.push(Row {
            id: "P8",
            measure: format!("N={}: API requests per workload change", r.n),
            floor: "1.00".into(),
            ballast: format!("{per_change:.2}"),
            ratio: String::new(),
            goal: "≤ 2".into(),
            pass: Some(per_change <= 2.0),
        });
        let received: f64 = r.watch_events.values().sum();
        rows.push(Row {
            id: "P8",
            measure: format!(
                "N={}: objects the manager's watches received per workload change",
                r.n
            ),
            floor: String::new(),
            ballast: format!("{:.2}", received / r.n as f64),
            ratio: String::new(),
            goal: String::new(),
            pass: None,
        });
        rows.push(Row {
            id: "P3",
            measure: format!(
                "N={}: restart with N converged → acting (a new workload carries the term), s",
                r.n
            ),
            floor: String::new(),
            ballast: format!("{:.2}", r.restart_secs),
            ratio: String::new(),
            goal: "≤ 3 s".into(),
            pass: Some(r.restart_secs <= 3.0),
        });
        rows.push(Row {
            id: "P3",
            measure: format!("N={}: writes after the restart", r.n),
            floor: "1".into(),
            ballast: r.restart_writes.to_string(),
            ratio: String::new(),
            goal: "= 1 (the new one)".into(),
            pass: Some(r.restart_writes == 1),
        });
        if let Some(st) = &r.steady {
            let what = format!(
                "N={}: {:.0} s of scale churn on {} workloads ({} scale changes)",
                r.n, st.secs, st.churned, st.scale_changes
            );
            rows.push(Row {
                id: "P2",
                measure: format!("{what}: template writes"),
                floor: "0".into(),
                ballast: st.template_writes.to_string(),
                ratio: String::new(),
                goal: "= 0".into(),
                pass: Some(st.template_writes == 0),
            });
            rows.push(Row {
                id: "P2",
                measure: format!("{what}: status writes / status changes seen"),
                floor: String::new(),
                ballast: format!("{} / {}", st.status_writes, st.status_changes_seen),
                ratio: String::new(),
                goal: "≤ changes seen".into(),
                pass: Some(st.status_writes <= st.status_changes_seen),
            });
            rows.push(Row {
                id: "P2",
                measure: format!(
                    "N={}: API requests in {:.0} s with nothing changing (watches, Lease aside)",
                    r.n, st.quiet_secs
                ),
                floor: "0".into(),
                ballast: st.quiet_requests.to_string(),
                ratio: String::new(),
                goal: "= 0".into(),
                pass: Some(st.quiet_requests == 0),
            });
        }
        // The goals: 48 MiB at 5000, 128 MiB at 20000; smaller N must fit the former.
        let goal = if r.n > 5000 { 128.0 } else { 48.0 };
        rows.push(Row {
            id: "P4",
            measure: format!(
                "N={}: manager RSS, peak / after / before the policy, MiB",
                r.n
            ),
            floor: String::new(),
            ballast: format!(
                "{:.1} / {:.1} / {:.1}",
                r.peak_rss_mib, r.rss_mib, r.idle_rss_mib
            ),
            ratio: String::new(),
            goal: format!("peak ≤ {goal:.0} MiB"),
            pass: Some(r.peak_rss_mib <= goal),
        });
    }
    let small = results.iter().find(|r| r.n == 1000);
    let large = results.iter().find(|r| r.n == 5000);
    if let (Some(a), Some(b)) = (small, large) {
        let floor = b.floor_secs / a.floor_secs;
        let ballast = b.ballast_secs / a.ballast_secs;
        rows.push(Row {
            id: "P1",
            measure: "time(5000) / time(1000)".into(),
            floor: format!("{floor:.2}"),
            ballast: format!("{ballast:.2}"),
            ratio: String::new(),
            goal: "≤ 5.5".into(),
            pass: Some(ballast <= 5.5),
        });
        // How time grows with N is mostly the API server's: the stricter floor's own ratio, and
        // the manager's CPU from the policy to convergence (its own work, which is linear if
        // the controller is), say which part is ballast's.
        rows.push(Row {
            id: "P1",
            measure: format!(
                "time(5000) / time(1000), floor = one kube client as the manager, {WRITE_CONCURRENCY} in flight"
            ),
            floor: format!("{:.2}", b.parallel_floor_secs / a.parallel_floor_secs),
            ballast: format!("{ballast:.2}"),
            ratio: String::new(),
            goal: String::new(),
            pass: None,
        });
        rows.push(Row {
            id: "P1",
            measure: "the manager's CPU from the policy to convergence, s: N=1000 / N=5000 (×)"
                .into(),
            floor: String::new(),
            ballast: format!(
                "{:.2} / {:.2} ({:.2}×)",
                a.ballast_cpu_secs_to_converge,
                b.ballast_cpu_secs_to_converge,
                b.ballast_cpu_secs_to_converge / a.ballast_cpu_secs_to_converge
            ),
            ratio: String::new(),
            goal: String::new(),
            pass: None,
        });
    }
    rows
}

async fn run(s: &Settings) -> Result<()> {
    let kubeconfig = PathBuf::from(std::env::var_os("KUBECONFIG").ok_or_else(|| {
        anyhow!(
            "KUBECONFIG is not set: run `make bench-cluster`, or point it at .cluster/kubeconfig"
        )
    })?);
    let client = client(&kubeconfig).await?;
    let kubectl = Kubectl { kubeconfig };
    let dir = repo_root().join("target/bench-spread");
    let background = Background::of_cluster(&kubectl.kubeconfig);
    let operator_kubeconfig = operator_kubeconfig(&kubectl, &dir)?;
    // The stricter floor writes as the manager does (`parallel_floor`), through a client built
    // and timed as the manager's.
    let manager_metrics = ballast::metrics::Metrics::default();
    let manager = support::client_timed(&operator_kubeconfig, &manager_metrics).await?;
    admission_synced(&client).await?;
    let started = jiff::Timestamp::now();
    let mut results = Vec::new();
    for (i, &n) in s.sizes.iter().enumerate() {
        let deletion = Deletion::last_if(i + 1 == s.sizes.len());
        results.push(
            measure(
                s,
                &background,
                n,
                &client,
                &manager,
                &manager_metrics,
                &kubectl,
                &operator_kubeconfig,
                &dir,
                deletion,
            )
            .await?,
        );
    }
    let rows = rows(&results);
    support::print_table(&rows);
    for r in &results {
        let [a, b, c, d] = r.others_cores;
        println!(
            "N={}: CPU of other processes on the machine during the floor / the floor with \
             {WRITE_CONCURRENCY} in flight / ballast / that floor again: {a:.2} / {b:.2} / {c:.2} \
             / {d:.2} cores",
            r.n
        );
        let [a, b, c, d] = r.controller_manager_writes_per_sec;
        println!(
            "N={}: the controller manager's writes for Deployments (ReplicaSets, Deployment \
             status) per second during the floor / the floor with {WRITE_CONCURRENCY} in flight / \
             ballast / that floor again: {a:.0} / {b:.0} / {c:.0} / {d:.0}",
            r.n
        );
    }
    let version = client.apiserver_version().await?.git_version;
    let out_dir = if s.smoke {
        dir.clone()
    } else {
        repo_root().join("bench/results")
    };
    std::fs::create_dir_all(&out_dir)?;
    let path = out_dir.join(format!(
        "cluster_spread-{}.json",
        started.strftime("%Y%m%dT%H%M%SZ")
    ));
    let doc = json!({
        "bench": "cluster_spread",
        "started": started.to_string(),
        "machine": machine(),
        "kubernetes": version,
        "settings": {
            "beside": support::beside(),
            "sizes": s.sizes, "concurrency": s.concurrency, "quiet_secs": s.quiet.as_secs(),
            "steady_n": s.steady_n, "steady_secs": s.steady.secs,
            "churn_period_secs": s.steady.churn_period.as_secs(),
            "steady_quiet_secs": s.steady.quiet.as_secs(),
        },
        "rows": rows,
        "sizes": results,
    });
    std::fs::write(&path, serde_json::to_string_pretty(&doc)? + "\n")?;
    println!("Results: {}", path.display());
    if s.smoke {
        println!("Smoke run: only the rows that count writes and requests are judged.");
    }
    let judged: Vec<&Row> = rows
        .iter()
        .filter(|r| r.pass.is_some() && (!s.smoke || counts(r)))
        .collect();
    let failed = judged.iter().filter(|r| r.pass == Some(false)).count();
    ensure!(
        failed == 0,
        "{failed} of {} rows failed their goal",
        judged.len()
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let start = Instant::now();
    let s = Settings::from_env()?;
    eprintln!(
        "[bench] cluster_spread: N = {:?}, {} creations in flight",
        s.sizes, s.concurrency
    );
    if let Some(b) = support::beside() {
        eprintln!("[bench] on the same cluster meanwhile: {b}");
    }
    let result = support::until_signal(run(&s)).await;
    eprintln!(
        "[bench] total, with setup and cleanup: {:.0} s",
        start.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        bail!("cluster_spread: {e:#}");
    }
    Ok(())
}
