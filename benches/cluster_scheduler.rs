//! `make bench-cluster`: what each spread method costs the real kube-scheduler (issue 9, P7).
//! No operator: the terms are the ones ballast writes (`desired_terms` of a SpreadPolicy with
//! that spread), put into the Deployments' templates by the bench at creation.
//!
//! Against the local control plane of `KUBECONFIG` (127.0.0.1 only): the bench registers 300
//! simulated kwok nodes in 3 zones (`BALLAST_BENCH_SCHED_NODES`), labelled as
//! `hack/cluster-up.sh` labels its nodes plus `ballast.dev/bench: cluster-scheduler`, and for
//! each method, in a namespace of its own, creates 100 Deployments of 10 replicas (8 creates in
//! flight) whose pods select those nodes (`nodeSelector`, the same for every method):
//!
//! - (a) no terms: the floor;
//! - (b) `Preferred` pod anti-affinity on `kubernetes.io/hostname` (method `AntiAffinity`);
//! - (c) `Required` pod anti-affinity on `kubernetes.io/hostname` (method `AntiAffinity`);
//! - (d) topology spread constraints, `maxSkew: 1`, `DoNotSchedule`, on
//!   `topology.kubernetes.io/zone` and on `kubernetes.io/hostname` (method `TopologySpread`,
//!   `Required`).
//!
//! Two measures per method:
//! - **placed pods/s**: 1000 / the time from the first Deployment create until the bench's watch
//!   of the namespace has seen all 1000 pods with `spec.nodeName`. It includes the controller
//!   manager making the pods (its client is limited to 100 requests/s by `hack/cluster-up.sh`;
//!   the runs place about 55 pods/s with or without terms): when that is the slower part, every
//!   method shows about the same rate, and the second measure is the one that tells the methods
//!   apart.
//! - **scheduler capacity, pods/s**: 1 / the scheduler's own time per pod in its scheduling
//!   algorithm (filters and scores: `scheduler_scheduling_algorithm_duration_seconds`, sum over
//!   count, read from the scheduler's `/metrics` on 127.0.0.1 before and after the method), the
//!   rate its serial scheduling cycle could place pods at if they came at once.
//!
//! The default method of docs/spread-policy.md is `AntiAffinity` (the mode has no default), so
//! the goal, ≥ 0.6× the floor, applies to (b) and (c); (d) is reported, with no goal. The namespaces
//! are deleted (each before the next method, its pods with no grace period first) and the nodes
//! removed whatever happens (error, panic, Ctrl-C, SIGTERM, SIGHUP). Results: a printed table
//! and `bench/results/cluster_scheduler-<UTC>.json`. Settings (environment):
//! BALLAST_BENCH_SCHED_NODES (300), BALLAST_BENCH_SCHED_DEPLOYMENTS (100),
//! BALLAST_BENCH_SCHED_REPLICAS (10), BALLAST_BENCH_SCHED_ROUNDS (1: a b c d; 2: then d c b a),
//! BALLAST_BENCH_CONCURRENCY (8). Results and how to read them: docs/benchmarks.md.

#[path = "support/mod.rs"]
mod support;
use support::operator::{delta, load_average, machine};
use support::{Deletion, Kubectl, Row, client, env_usize, print_table, write_results};

use anyhow::{Context, Result, anyhow, bail, ensure};
use ballast::api::spread_policy::{SpreadPolicySpec, WorkloadKind};
use ballast::controller::spread_policy::terms::{Terms, desired_terms};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::{Namespace, Node, Pod},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams},
    runtime::watcher,
};
use serde_json::{Value, json};
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

const NODE_LABEL: (&str, &str) = ("ballast.dev/bench", "cluster-scheduler");
const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
const HOSTNAME: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";
/// Longest wait for one method's pods to be placed.
const PLACE_LIMIT: Duration = Duration::from_secs(900);

struct Settings {
    nodes: usize,
    deployments: usize,
    replicas: usize,
    rounds: usize,
    concurrency: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
enum Method {
    NoTerms,
    PreferredAntiAffinity,
    RequiredAntiAffinity,
    TopologySpread,
}

impl Method {
    const ALL: [Method; 4] = [
        Method::NoTerms,
        Method::PreferredAntiAffinity,
        Method::RequiredAntiAffinity,
        Method::TopologySpread,
    ];

    fn label(self) -> &'static str {
        match self {
            Method::NoTerms => "(a) no terms",
            Method::PreferredAntiAffinity => "(b) Preferred anti-affinity, hostname",
            Method::RequiredAntiAffinity => "(c) Required anti-affinity, hostname",
            Method::TopologySpread => "(d) topology spread maxSkew 1, zone + hostname",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Method::NoTerms => "none",
            Method::PreferredAntiAffinity => "pref",
            Method::RequiredAntiAffinity => "req",
            Method::TopologySpread => "tsc",
        }
    }

    /// The SpreadPolicy `spread` that makes ballast write this method's terms.
    fn spread(self) -> Value {
        match self {
            Method::NoTerms => json!([]),
            Method::PreferredAntiAffinity => {
                json!([{"topologyKey": HOSTNAME, "mode": "Preferred"}])
            }
            Method::RequiredAntiAffinity => json!([{"topologyKey": HOSTNAME, "mode": "Required"}]),
            Method::TopologySpread => json!([
                {"topologyKey": ZONE, "mode": "Required", "method": "TopologySpread", "maxSkew": 1},
                {"topologyKey": HOSTNAME, "mode": "Required", "method": "TopologySpread", "maxSkew": 1},
            ]),
        }
    }

    /// Whether the goal applies: the default method of docs/spread-policy.md, `AntiAffinity`.
    fn has_goal(self) -> bool {
        matches!(
            self,
            Method::PreferredAntiAffinity | Method::RequiredAntiAffinity
        )
    }
}

fn node(name: &str, zone: &str) -> Result<Node> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                HOSTNAME: name,
                "topology.kubernetes.io/region": "region-1",
                ZONE: zone,
                NODE_LABEL.0: NODE_LABEL.1,
            },
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "capacity": {"cpu": "32", "memory": "256Gi", "pods": "110"},
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "fake", "kubeProxyVersion": "fake"},
        },
    }))?)
}

/// Deployment `name` with the terms ballast writes for `method` in its pod template.
fn deployment(name: &str, replicas: usize, method: Method) -> Result<Deployment> {
    let mut d: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {NODE_LABEL.0: NODE_LABEL.1},
                    "containers": [{"name": "app", "image": "registry.invalid/bench:1"}],
                },
            },
        },
    }))?;
    let policy: SpreadPolicySpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"app": name}},
        "spread": method.spread(),
    }))?;
    let spec = d.spec.as_mut().expect("spec");
    let terms: Terms = desired_terms(&policy, WorkloadKind::Deployment, &spec.selector);
    let pod = spec.template.spec.as_mut().expect("pod spec");
    let mut affinity = json!({});
    if !terms.anti_affinity_required.is_empty() {
        affinity["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] =
            serde_json::to_value(&terms.anti_affinity_required)?;
    }
    if !terms.anti_affinity_preferred.is_empty() {
        affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] =
            serde_json::to_value(&terms.anti_affinity_preferred)?;
    }
    if affinity != json!({}) {
        pod.affinity = Some(serde_json::from_value(affinity)?);
    }
    if !terms.topology_spread_constraints.is_empty() {
        pod.topology_spread_constraints = Some(terms.topology_spread_constraints.clone());
    }
    Ok(d)
}

/// The scheduler's /metrics, read with the admin client certificate of the cluster directory
/// (next to the kubeconfig) on the scheduler's own port on 127.0.0.1.
struct SchedulerMetrics {
    url: String,
    cert: PathBuf,
    key: PathBuf,
}

impl SchedulerMetrics {
    fn of_cluster(kubeconfig: &Path) -> Result<Self> {
        let dir = kubeconfig.parent().unwrap_or(Path::new("."));
        let args = std::fs::read(dir.join("cmds/kube-scheduler.args")).with_context(|| {
            format!(
                "reading the scheduler's command line in {} (a cluster of hack/cluster-up.sh)",
                dir.display()
            )
        })?;
        let port = args
            .split(|b| *b == 0)
            .filter_map(|a| std::str::from_utf8(a).ok())
            .find_map(|a| a.strip_prefix("--secure-port="))
            .ok_or_else(|| anyhow!("no --secure-port in the scheduler's command line"))?
            .to_string();
        Ok(SchedulerMetrics {
            url: format!("https://127.0.0.1:{port}/metrics"),
            cert: dir.join("pki/admin.crt"),
            key: dir.join("pki/admin.key"),
        })
    }

    /// The counters and sums this bench reads, by series as printed.
    fn read(&self) -> Result<BTreeMap<String, f64>> {
        let out = Command::new("curl")
            .args(["-sS", "-k", "--max-time", "10", "--cert"])
            .arg(&self.cert)
            .arg("--key")
            .arg(&self.key)
            .arg(&self.url)
            .output()
            .context("running curl")?;
        ensure!(
            out.status.success(),
            "curl {}: {}",
            self.url,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let series: BTreeMap<String, f64> = text
            .lines()
            .filter(|l| {
                l.starts_with("scheduler_scheduling_algorithm_duration_seconds_sum")
                    || l.starts_with("scheduler_scheduling_algorithm_duration_seconds_count")
                    || l.starts_with("scheduler_schedule_attempts_total{")
            })
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                Some((k.to_string(), v.parse().ok()?))
            })
            .collect();
        ensure!(
            series.contains_key("scheduler_scheduling_algorithm_duration_seconds_count"),
            "the scheduler's /metrics has no scheduler_scheduling_algorithm_duration_seconds"
        );
        Ok(series)
    }
}

/// Empties namespace `ns` before its deletion between two methods: its Deployments and
/// ReplicaSets, then its pods with no grace period (kwok's pods have no process to stop), each
/// kind in one request. The namespace's deletion then has next to nothing left to do: deleting
/// 1000 pods gracefully (kwok confirming each) took 33 to 39 s a method, 1.6 of the bench's 3.6
/// minutes. The next method still starts once the namespace is gone.
async fn empty_namespace(client: &Client, ns: &str) -> Result<()> {
    let all = ListParams::default();
    let background = DeleteParams::background();
    Api::<Deployment>::namespaced(client.clone(), ns)
        .delete_collection(&background, &all)
        .await
        .with_context(|| format!("deleting the Deployments of {ns}"))?;
    Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .delete_collection(&background, &all)
        .await
        .with_context(|| format!("deleting the ReplicaSets of {ns}"))?;
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::background()
    };
    Api::<Pod>::namespaced(client.clone(), ns)
        .delete_collection(&now, &all)
        .await
        .with_context(|| format!("deleting the pods of {ns}"))?;
    Ok(())
}

/// Removes the namespaces (the current one, if any) and then the nodes, whatever happens.
struct Cleanup {
    kubectl: Kubectl,
    namespace: Option<String>,
    nodes: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(ns) = self.namespace.take() {
            support::delete_namespaces(&self.kubectl, &[ns], "600s", Deletion::Last);
        }
        if self.nodes {
            let start = Instant::now();
            let selector = format!("{}={}", NODE_LABEL.0, NODE_LABEL.1);
            let flags = Deletion::Last.flags("300s");
            match self.kubectl.run(
                &[
                    "delete",
                    "nodes",
                    "-l",
                    &selector,
                    "--ignore-not-found",
                    &flags,
                ],
                None,
            ) {
                Ok(_) => eprintln!("[bench] nodes {selector} {}", Deletion::Last.done(start)),
                Err(e) => eprintln!("[bench] ERROR: deleting nodes {selector}: {e:#}"),
            }
        }
    }
}

async fn create_nodes(client: &Client, s: &Settings) -> Result<()> {
    let api: Api<Node> = Api::all(client.clone());
    let nodes = (0..s.nodes)
        .map(|i| {
            let zone = ZONES[i % ZONES.len()];
            node(&format!("bench-sched-{zone}-{:03}", i / ZONES.len()), zone)
        })
        .collect::<Result<Vec<_>>>()?;
    stream::iter(nodes)
        .map(|n| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &n).await.map(drop) }
        })
        .buffer_unordered(s.concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    // kwok makes them Ready; the node lifecycle controller then takes its taints off.
    let lp = ListParams::default().labels(&format!("{}={}", NODE_LABEL.0, NODE_LABEL.1));
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let ready = api
            .list(&lp)
            .await?
            .items
            .iter()
            .filter(|n| {
                let st = n.status.as_ref();
                let is_ready = st
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
                let untainted = n
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_none_or(|t| t.is_empty());
                is_ready && untainted
            })
            .count();
        if ready == s.nodes {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "{ready} of {} nodes Ready and untainted after 300 s",
            s.nodes
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// What one method measured.
#[derive(Debug, serde::Serialize)]
struct MethodResult {
    method: Method,
    round: usize,
    pods: usize,
    /// First Deployment create → all pods placed, as the watch saw it.
    placed_secs: f64,
    /// First Deployment create → the last pod seen created (the controller manager's pace).
    created_secs: f64,
    /// The first and last pod seen placed, from the first create.
    first_placed_secs: f64,
    placed_pods_per_sec: f64,
    /// The scheduler's algorithm time per pod, ms, and the rate that allows.
    algorithm_ms_per_pod: f64,
    capacity_pods_per_sec: f64,
    /// The scheduler's counters over the method (attempts by result, algorithm sum and count).
    scheduler: BTreeMap<String, f64>,
    /// Placed pods per node: the most on one node, and the nodes used.
    most_pods_on_a_node: usize,
    nodes_used: usize,
    load_average_after: String,
}

async fn measure(
    s: &Settings,
    client: &Client,
    cleanup: &mut Cleanup,
    metrics: &SchedulerMetrics,
    method: Method,
    round: usize,
    suffix: u64,
) -> Result<MethodResult> {
    let ns = format!("bench-sched-{suffix:06}-{}-{round}", method.short());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.clone()),
                    labels: Some(
                        [(
                            "ballast.dev/bench".to_string(),
                            "cluster-scheduler".to_string(),
                        )]
                        .into(),
                    ),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?;
    cleanup.namespace = Some(ns.clone());
    let deployments = (0..s.deployments)
        .map(|i| deployment(&format!("d-{i:03}"), s.replicas, method))
        .collect::<Result<Vec<_>>>()?;
    let want = s.deployments * s.replicas;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut events = watcher(pods, watcher::Config::default()).boxed();
    loop {
        match events.next().await {
            Some(Ok(watcher::Event::InitDone)) => break,
            Some(Err(e)) => return Err(e.into()),
            None => bail!("the watch ended"),
            Some(Ok(_)) => {}
        }
    }
    // A quiet start: the namespace before is gone, nothing else of ours runs.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = metrics.read()?;
    let api: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let t0 = Instant::now();
    let creates = async {
        stream::iter(deployments)
            .map(|d| {
                let api = api.clone();
                async move { api.create(&PostParams::default(), &d).await.map(drop) }
            })
            .buffer_unordered(s.concurrency)
            .try_collect::<Vec<()>>()
            .await
    };
    let watch = async {
        let mut created: HashSet<String> = HashSet::new();
        let mut placed: HashMap<String, String> = HashMap::new();
        let (mut last_created, mut first_placed) = (t0, None);
        let limit = tokio::time::sleep(PLACE_LIMIT);
        tokio::pin!(limit);
        while placed.len() < want {
            let ev = tokio::select! {
                ev = events.next() => ev.ok_or_else(|| anyhow!("the watch ended"))??,
                _ = &mut limit => bail!("{}: {} of {want} pods placed within {PLACE_LIMIT:?}", method.label(), placed.len()),
            };
            let at = Instant::now();
            if let watcher::Event::Apply(p) | watcher::Event::InitApply(p) = ev {
                if created.insert(p.name_any()) {
                    last_created = at;
                }
                if let Some(n) = p.spec.as_ref().and_then(|s| s.node_name.clone())
                    && placed.insert(p.name_any(), n).is_none()
                    && first_placed.is_none()
                {
                    first_placed = Some(at);
                }
            }
        }
        Ok::<_, anyhow::Error>((Instant::now(), last_created, first_placed, placed))
    };
    let (created, watched) = tokio::join!(creates, watch);
    created?;
    let (t1, last_created, first_placed, placed) = watched?;
    drop(events);
    // The scheduler's counters of the last pods may be a moment behind their binding.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let scheduler = delta(&metrics.read()?, &before);
    let sum = scheduler
        .get("scheduler_scheduling_algorithm_duration_seconds_sum")
        .copied()
        .unwrap_or(0.0);
    let count = scheduler
        .get("scheduler_scheduling_algorithm_duration_seconds_count")
        .copied()
        .unwrap_or(0.0);
    ensure!(
        count >= want as f64,
        "the scheduler counted {count} algorithm runs for {want} pods"
    );
    let mut per_node: HashMap<&str, usize> = HashMap::new();
    for n in placed.values() {
        *per_node.entry(n).or_default() += 1;
    }
    let placed_secs = (t1 - t0).as_secs_f64();
    let algorithm_ms_per_pod = sum / count * 1000.0;
    let r = MethodResult {
        method,
        round,
        pods: placed.len(),
        placed_secs,
        created_secs: (last_created - t0).as_secs_f64(),
        first_placed_secs: first_placed.map_or(f64::NAN, |f| (f - t0).as_secs_f64()),
        placed_pods_per_sec: want as f64 / placed_secs,
        algorithm_ms_per_pod,
        capacity_pods_per_sec: 1000.0 / algorithm_ms_per_pod,
        scheduler,
        most_pods_on_a_node: per_node.values().copied().max().unwrap_or(0),
        nodes_used: per_node.len(),
        load_average_after: load_average(),
    };
    eprintln!(
        "[bench] {}: {want} pods placed in {placed_secs:.1} s ({:.1} pods/s; last pod created at {:.1} s), scheduler algorithm {:.2} ms per pod ({:.0} pods/s), {} nodes used, at most {} pods on one",
        method.label(),
        r.placed_pods_per_sec,
        r.created_secs,
        r.algorithm_ms_per_pod,
        r.capacity_pods_per_sec,
        r.nodes_used,
        r.most_pods_on_a_node,
    );
    Ok(r)
}

/// The mean of a measure over the rounds of `m`.
fn mean_of(results: &[MethodResult], m: Method, f: impl Fn(&MethodResult) -> f64) -> f64 {
    let v: Vec<f64> = results.iter().filter(|r| r.method == m).map(f).collect();
    v.iter().sum::<f64>() / v.len() as f64
}

fn rows(results: &[MethodResult]) -> Vec<Row> {
    let mut rows = Vec::new();
    let floor_placed = mean_of(results, Method::NoTerms, |r| r.placed_pods_per_sec);
    let floor_capacity = mean_of(results, Method::NoTerms, |r| r.capacity_pods_per_sec);
    for m in Method::ALL.into_iter().skip(1) {
        for (what, floor, f) in [
            (
                "Deployments created → all pods placed, pods/s",
                floor_placed,
                (|r: &MethodResult| r.placed_pods_per_sec) as fn(&MethodResult) -> f64,
            ),
            (
                "scheduler capacity (1 / its algorithm time per pod), pods/s",
                floor_capacity,
                |r: &MethodResult| r.capacity_pods_per_sec,
            ),
        ] {
            let v = mean_of(results, m, f);
            let ratio = v / floor;
            rows.push(Row {
                id: "P7",
                measure: format!("{}: {what}", m.label()),
                floor: format!("{floor:.1}"),
                ballast: format!("{v:.1}"),
                ratio: format!("{ratio:.2}"),
                goal: if m.has_goal() {
                    "≥ 0.6× floor".into()
                } else {
                    "none (not the default method)".into()
                },
                pass: m.has_goal().then_some(ratio >= 0.6),
            });
        }
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
    let metrics = SchedulerMetrics::of_cluster(&kubeconfig)?;
    metrics.read()?;
    let kubectl = Kubectl { kubeconfig };
    let mut cleanup = Cleanup {
        kubectl,
        namespace: None,
        nodes: true,
    };
    let started = jiff::Timestamp::now();
    let t = Instant::now();
    create_nodes(&client, s).await?;
    eprintln!(
        "[bench] {} nodes Ready and untainted ({:.1} s)",
        s.nodes,
        t.elapsed().as_secs_f64()
    );
    let suffix = support::run_suffix()?;
    let mut results = Vec::new();
    for round in 0..s.rounds {
        let mut order = Method::ALL.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        let last = order.len() - 1;
        for (i, m) in order.into_iter().enumerate() {
            // Only the very last method's namespace is the bench's last cleanup.
            let deletion = Deletion::last_if(round + 1 == s.rounds && i == last);
            results.push(measure(s, &client, &mut cleanup, &metrics, m, round, suffix).await?);
            if let Some(ns) = cleanup.namespace.take() {
                if deletion == Deletion::Between {
                    empty_namespace(&client, &ns).await?;
                }
                support::delete_namespaces(&cleanup.kubectl, &[ns], "600s", deletion);
            }
        }
    }
    drop(cleanup);
    let rows = rows(&results);
    print_table(&rows);
    println!(
        "| round | method | placed s | last pod created s | placed pods/s | algorithm ms per pod | nodes used | most pods on one node |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    for r in &results {
        println!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.3} | {} | {} |",
            r.round + 1,
            r.method.label(),
            r.placed_secs,
            r.created_secs,
            r.placed_pods_per_sec,
            r.algorithm_ms_per_pod,
            r.nodes_used,
            r.most_pods_on_a_node
        );
    }
    let version = client.apiserver_version().await?.git_version;
    let doc = json!({
        "bench": "cluster_scheduler",
        "started": started.to_string(),
        "machine": machine(),
        "kubernetes": version,
        "settings": {
            "nodes": s.nodes, "deployments": s.deployments, "replicas": s.replicas,
            "rounds": s.rounds, "concurrency": s.concurrency,
        },
        "rows": rows,
        "methods": results,
    });
    let path = write_results("cluster_scheduler", started, &doc)?;
    println!("Results: {}", path.display());
    support::ensure_rows_pass(&rows)
}

#[tokio::main]
async fn main() -> Result<()> {
    let start = Instant::now();
    let s = Settings {
        nodes: env_usize("BALLAST_BENCH_SCHED_NODES", 300)?,
        deployments: env_usize("BALLAST_BENCH_SCHED_DEPLOYMENTS", 100)?,
        replicas: env_usize("BALLAST_BENCH_SCHED_REPLICAS", 10)?,
        rounds: env_usize("BALLAST_BENCH_SCHED_ROUNDS", 1)?,
        concurrency: env_usize("BALLAST_BENCH_CONCURRENCY", 8)?,
    };
    eprintln!(
        "[bench] cluster_scheduler: {} nodes, {} Deployments × {} replicas per method, {} round(s)",
        s.nodes, s.deployments, s.replicas, s.rounds
    );
    let result = support::until_signal(run(&s)).await;
    eprintln!(
        "[bench] total, with setup and cleanup: {:.0} s",
        start.elapsed().as_secs_f64()
    );
    if let Err(e) = result {
        bail!("cluster_scheduler: {e:#}");
    }
    Ok(())
}
