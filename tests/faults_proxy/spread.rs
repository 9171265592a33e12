//! SpreadPolicy workloads for F3 and F4: Deployments `web-0..n` labelled `tier: web` whose
//! rollouts take a few seconds (so overlapping rollouts are visible), a policy over them in two
//! versions (each version differs in its number of preferred anti-affinity terms, which tells
//! which one a workload carries), and a [`Pacing`] monitor that polls them.

use crate::support::wait_until;
use ballast::api::SpreadPolicy;
use k8s_openapi::api::apps::v1::Deployment;
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

pub const POLICY: &str = "spread";

pub fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("web-{i}")).collect()
}

fn deployment(name: &str) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": {"tier": "web"}},
        "spec": {
            "replicas": 2,
            "minReadySeconds": 2,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}},
        },
    }))
    .unwrap()
}

/// Creates `n` workloads and waits until they are rolled out.
pub async fn create_workloads(client: &Client, ns: &str, n: usize) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    for name in names(n) {
        api.create(&PostParams::default(), &deployment(&name))
            .await
            .unwrap();
    }
    wait_converged(client, ns, n, 0, Duration::from_secs(60)).await;
}

/// Applies version `version` of the policy (maxConcurrent 1). Version 1 spreads over hosts,
/// version 2 also over zones: 1 and 2 preferred anti-affinity terms.
pub async fn apply_policy(client: &Client, ns: &str, version: u8) {
    let spread = match version {
        1 => json!([{"topologyKey": "kubernetes.io/hostname", "mode": "Preferred"}]),
        _ => json!([
            {"topologyKey": "kubernetes.io/hostname", "mode": "Preferred"},
            {"topologyKey": "topology.kubernetes.io/zone", "mode": "Preferred", "weight": 50},
        ]),
    };
    let p: SpreadPolicy = serde_json::from_value(json!({
        "apiVersion": "ballast.dev/v1alpha1", "kind": "SpreadPolicy",
        "metadata": {"name": POLICY},
        "spec": {"selector": {"matchLabels": {"tier": "web"}}, "rollout": {"maxConcurrent": 1}, "spread": spread},
    }))
    .unwrap();
    Api::<SpreadPolicy>::namespaced(client.clone(), ns)
        .patch(
            POLICY,
            &PatchParams::apply("fault-suite").force(),
            &Patch::Apply(&p),
        )
        .await
        .unwrap();
}

/// Preferred anti-affinity terms in the workload's pod template.
pub fn preferred_terms(d: &Deployment) -> usize {
    d.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref()?.affinity.as_ref())
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.preferred_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map_or(0, Vec::len)
}

pub fn rolled_out(d: &Deployment) -> bool {
    let want = d.spec.as_ref().unwrap().replicas.unwrap_or(1);
    let Some(s) = &d.status else { return false };
    s.observed_generation >= d.metadata.generation
        && s.updated_replicas == Some(want)
        && s.replicas == Some(want)
        && s.available_replicas == Some(want)
}

pub async fn list(client: &Client, ns: &str) -> Vec<Deployment> {
    Api::<Deployment>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels("tier=web"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// Waits until all `n` workloads carry `terms` preferred terms and are rolled out.
pub async fn wait_converged(client: &Client, ns: &str, n: usize, terms: usize, timeout: Duration) {
    wait_until("the workloads converged", timeout, || async {
        let l = list(client, ns).await;
        (l.len() == n
            && l.iter()
                .all(|d| preferred_terms(d) == terms && rolled_out(d)))
        .then_some(())
    })
    .await;
}

/// The generation of each workload.
pub async fn generations(client: &Client, ns: &str) -> BTreeMap<String, i64> {
    list(client, ns)
        .await
        .iter()
        .map(|d| (d.name_any(), d.metadata.generation.unwrap_or(0)))
        .collect()
}

/// What the pacing monitor saw.
#[derive(Debug, Default)]
pub struct Paced {
    /// Most workloads rolling out at once (changed since the start, not rolled out yet).
    pub max_in_flight: usize,
    /// When that was seen: the workloads.
    pub widest: Vec<String>,
    /// Every generation seen per workload.
    pub generations: BTreeMap<String, BTreeSet<i64>>,
}

/// Polls the workloads every 200 ms: a workload whose generation moved past `since` and is not
/// rolled out is in flight.
pub struct Pacing {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<Paced>>,
}

impl Pacing {
    pub fn spawn(client: Client, ns: &str, since: BTreeMap<String, i64>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Paced::default()));
        let ns = ns.to_string();
        let task = tokio::spawn({
            let (stop, seen) = (stop.clone(), seen.clone());
            async move {
                while !stop.load(Ordering::SeqCst) {
                    let l = list(&client, &ns).await;
                    note(&mut seen.lock().unwrap(), &l, &since);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
        Self { stop, task, seen }
    }

    pub async fn stop(self) -> Paced {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

fn note(s: &mut Paced, l: &[Deployment], since: &BTreeMap<String, i64>) {
    let flying: Vec<String> = l
        .iter()
        .filter(|d| {
            let g = d.metadata.generation.unwrap_or(0);
            g > since.get(&d.name_any()).copied().unwrap_or(g) && !rolled_out(d)
        })
        .map(|d| d.name_any())
        .collect();
    if flying.len() > s.max_in_flight {
        s.max_in_flight = flying.len();
        s.widest = flying;
    }
    for d in l {
        s.generations
            .entry(d.name_any())
            .or_default()
            .insert(d.metadata.generation.unwrap_or(0));
    }
}
