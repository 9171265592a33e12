//! `make bench`: how long the SpreadPolicy decision takes for a policy that
//! selects 500 Deployments in a namespace of 1000, on a 300-node cluster,
//! each with 3 running pods (their distribution is part of the decision) —
//! the pure step that runs on every reconcile. Prints one line per case.

use ballast::api::spread_policy::{SpreadPolicy, WorkloadKind};
use ballast::controller::spread_policy::{
    feasibility::NodeInfo,
    plan::{Inputs, PodSnapshot, plan},
    pods::{Phase, PodView},
    select::Governor,
    tracker::Seen,
    workload::Workload,
};
use std::{hint::black_box, sync::Arc, time::Instant};

fn policy() -> SpreadPolicy {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ballast.dev/v1alpha1", "kind": "SpreadPolicy",
        "metadata": {"name": "web-ha", "namespace": "shop", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"selector": {"matchLabels": {"tier": "web"}}, "rollout": {"maxConcurrent": 5},
                 "spread": [{"topologyKey": "topology.kubernetes.io/zone", "mode": "Required"},
                            {"topologyKey": "kubernetes.io/hostname", "mode": "Preferred", "method": "TopologySpread"}]},
    }))
    .unwrap()
}

fn workloads(n: usize) -> Vec<Workload> {
    (0..n)
        .map(|i| {
            let tier = if i % 2 == 0 { "web" } else { "batch" };
            let mut w = Workload {
                kind: WorkloadKind::Deployment,
                name: format!("app-{i:04}"),
                namespace: "shop".into(),
                labels: [("tier".to_string(), tier.to_string())].into(),
                replicas: 3,
                ..Default::default()
            };
            w.selector.match_labels = [("app", w.name.as_str())].into();
            w
        })
        .collect()
}

fn nodes(n: usize) -> Vec<NodeInfo> {
    (0..n)
        .map(|i| NodeInfo {
            name: format!("node-{i}"),
            labels: [
                (
                    "topology.kubernetes.io/zone".to_string(),
                    format!("zone-{}", i % 3),
                ),
                ("kubernetes.io/hostname".to_string(), format!("node-{i}")),
            ]
            .into(),
            ready: true,
            ..Default::default()
        })
        .collect()
}

/// Three running pods per workload, on nodes next to each other.
fn pods(ws: &[Workload], nodes: usize) -> PodSnapshot {
    ws.iter()
        .enumerate()
        .map(|(i, w)| {
            let pods: Vec<PodView> = (0..3)
                .map(|j| PodView {
                    name: format!("{}-{j}", w.name).into(),
                    node: Some(format!("node-{}", (i + j) % nodes).into()),
                    phase: Phase::Running,
                    ready: true,
                    revision: Some("h".into()),
                    ..Default::default()
                })
                .collect();
            ((w.kind, w.name.clone()), pods.into())
        })
        .collect()
}

fn bench(name: &str, iterations: u32, mut f: impl FnMut()) {
    f(); // warm up
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    let per = start.elapsed() / iterations;
    println!("{name:<60} {per:>12.2?} per iteration ({iterations} iterations)");
}

fn main() {
    let p = Governor::from(policy());
    let policies = vec![Arc::new(p.clone())];
    let ws = workloads(1000);
    let ns = nodes(300);
    let tracked = Seen::default();
    let pods = pods(&ws, ns.len());
    let ws: Vec<Arc<Workload>> = ws.into_iter().map(Arc::new).collect();
    bench(
        "plan: 1000 workloads (500 selected, 3 pods each), 300 nodes",
        20,
        || {
            let out = plan(&Inputs {
                policy: &p,
                policies: &policies,
                budget_used_elsewhere: 0,
                workloads: &ws,
                nodes: &ns,
                pods: &pods,
                tracked: &tracked,
                evicted: &Default::default(),
                now: jiff::Timestamp::now(),
            });
            black_box(out);
        },
    );
    let out = plan(&Inputs {
        policy: &p,
        policies: &policies,
        budget_used_elsewhere: 0,
        workloads: &ws,
        nodes: &ns,
        pods: &pods,
        tracked: &tracked,
        evicted: &Default::default(),
        now: jiff::Timestamp::now(),
    });
    println!(
        "  -> {} writes allowed now by maxConcurrent 5, {} waiting",
        out.writes.len(),
        out.waiting
    );
}
