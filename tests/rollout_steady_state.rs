//! Issue 14's performance claim, measured against the real local control plane: once 500
//! governed Deployments are adopted and at rest, the RolloutStrategy controller decides on its
//! watch caches and makes no API request at all, neither as time passes nor when a watch event
//! wakes every strategy. Measured with the manager's own `ballast_api_requests_total`.

mod support;

use ballast::api::{RolloutPhase, RolloutStrategy};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::json;
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};
use support::{Operator, TestNamespace, cluster};

/// Governed Deployments (`BALLAST_STEADY_STATE_N` for a quicker look).
fn count() -> usize {
    std::env::var("BALLAST_STEADY_STATE_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

/// Writes the test makes at once.
const CONCURRENCY: usize = 16;
/// How long the requests are watched once every strategy is adopted.
const WINDOW: Duration = Duration::from_secs(60);
/// Longest wait for the Deployment controller to see every new Deployment.
const OBSERVED: Duration = Duration::from_secs(300);
/// Longest wait for every strategy to be adopted. Adopting one takes a few writes (the
/// finalizer, the status, the Deployment's phase annotations and label, the strategy's
/// `ballast.dev/target-governed`, then the status again for the generation that bumped). With
/// 500 strategies in one namespace each write of a governed Deployment costs the API server
/// about a second of CPU (the revision gate evaluates every strategy of the namespace), and on 2
/// cores 500 adoptions took from under 3 to over 7 minutes. A bound, not a measure.
const ADOPTION: Duration = Duration::from_secs(900);

/// `(verb, group, resource, code)` of `ballast_api_requests_total`.
type Key = (String, String, String, String);

fn name(i: usize) -> String {
    format!("app-{i:03}")
}

/// Patches each of `objects` (`name`, body) with a bounded concurrency: server-side apply as
/// this test, or a merge patch.
async fn patch_all<K>(api: &Api<K>, objects: Vec<(String, serde_json::Value)>, apply: bool)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let pp = if apply {
        PatchParams::apply("ballast-steady-state-test").force()
    } else {
        PatchParams::default()
    };
    futures::stream::iter(objects)
        .map(|(name, body)| {
            let pp = pp.clone();
            async move {
                let patch = if apply {
                    Patch::Apply(&body)
                } else {
                    Patch::Merge(&body)
                };
                api.patch(&name, &pp, &patch).await.map(|_| ())
            }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await
        .expect("patching the objects");
}

/// Polls `count` every few seconds (a list of 500 objects is no small request) until it says
/// `n`, printing progress; panics after `limit` with what `count` added.
async fn poll<F, Fut>(what: &str, limit: Duration, count: F, n: usize)
where
    F: Fn() -> Fut,
    Fut: Future<Output = (usize, String)>,
{
    let start = Instant::now();
    let mut shown = 0;
    loop {
        let (now, detail) = count().await;
        if now == n {
            eprintln!("{what} in {:?}", start.elapsed());
            return;
        }
        if now / 100 > shown / 100 {
            eprintln!("{what}: {now} after {:?}", start.elapsed());
            shown = now;
        }
        assert!(
            start.elapsed() < limit,
            "{what}: only {now} after {limit:?}\n{detail}"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
}

/// The value of the first sample of `metrics` whose line starts with `prefix`.
fn sample(metrics: &str, prefix: &str) -> u64 {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0) as u64
}

/// `ballast_api_requests_total` by `(verb, group, resource, code)`.
fn requests(metrics: &str) -> BTreeMap<Key, u64> {
    support::api_requests(metrics).into_iter().collect()
}

/// Requests that are not the controllers' own: watches (one long request each, which kube's
/// watcher renews now and then) and the leader election's Lease renewals (every few seconds,
/// whatever the controllers do).
fn machinery(k: &Key) -> bool {
    k.0 == "watch" || k.2 == "leases"
}

fn show(r: &BTreeMap<Key, u64>) -> String {
    r.iter()
        .map(|((verb, group, resource, code), n)| {
            format!("  {verb} {group}/{resource} {code}: {n}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The controllers' requests between two snapshots, as `"<request>: <before> -> <after>"`. A
/// watch that ends in an error (e.g. "too old resource version" after someone re-applies the
/// CRD on the shared cluster) is followed by one list of the same resource: that many lists
/// are the watcher's, reported in the second list, not counted.
fn made_between(
    before: &BTreeMap<Key, u64>,
    after: &BTreeMap<Key, u64>,
) -> (Vec<String>, Vec<String>) {
    let delta = |k: &Key| after.get(k).copied().unwrap_or(0) - before.get(k).copied().unwrap_or(0);
    let rewatches = |group: &str, resource: &str| -> u64 {
        after
            .keys()
            .filter(|k| k.0 == "watch" && k.1 == group && k.2 == resource)
            .map(delta)
            .sum()
    };
    let mut relists: BTreeMap<(String, String), u64> = BTreeMap::new();
    let (mut made, mut excused) = (vec![], vec![]);
    for k in after.keys().filter(|k| !machinery(k) && delta(k) > 0) {
        let line = format!(
            "{} {}/{} {}: {} -> {}",
            k.0,
            k.1,
            k.2,
            k.3,
            before.get(k).copied().unwrap_or(0),
            after[k]
        );
        if k.0 == "list" {
            let used = relists.entry((k.1.clone(), k.2.clone())).or_default();
            if *used + delta(k) <= rewatches(&k.1, &k.2) {
                *used += delta(k);
                excused.push(line);
                continue;
            }
        }
        made.push(line);
    }
    (made, excused)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn converged_strategies_make_no_api_requests() {
    let n = count();
    let started = Instant::now();
    let c = cluster().await;
    // The CRDs and the revision gate, also when this test runs alone on a new cluster.
    c.install();
    let ns = TestNamespace::new(&c, "rost-steady").await;
    let deployments: Api<Deployment> = Api::namespaced(c.client.clone(), &ns.name);
    let strategies: Api<RolloutStrategy> = Api::namespaced(c.client.clone(), &ns.name);

    let objects = (0..n)
        .map(|i| {
            let name = name(i);
            let body = json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name},
                "spec": {
                    "replicas": 0,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {
                        "metadata": {"labels": {"app": name}},
                        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]},
                    },
                },
            });
            (name, body)
        })
        .collect();
    patch_all(&deployments, objects, true).await;
    eprintln!("{n} Deployments applied in {:?}", started.elapsed());
    // Governed only once the Deployment controller has seen them: adopted at rest, with no
    // hook to run. (That controller takes its time over 500 new Deployments: it makes 20
    // requests a second on the local control plane.)
    let observed = |list: &[Deployment]| {
        list.iter()
            .filter(|d| {
                let generation = d.metadata.generation.unwrap_or(0);
                d.status.as_ref().and_then(|s| s.observed_generation) >= Some(generation)
            })
            .count()
    };
    poll(
        &format!("{n} Deployments observed"),
        OBSERVED,
        || async {
            let list = deployments.list(&ListParams::default()).await.unwrap();
            (observed(&list.items), String::new())
        },
        n,
    )
    .await;
    let objects = (0..n)
        .map(|i| {
            let name = name(i);
            let body = json!({
                "apiVersion": "ballast.dev/v1alpha1", "kind": "RolloutStrategy",
                "metadata": {"name": name},
                "spec": {
                    "targetRef": {"name": name},
                    "pre": [{"name": "migrate", "container": {"from": "app", "command": ["migrate"]}}],
                },
            });
            (name, body)
        })
        .collect();
    patch_all(&strategies, objects, true).await;
    let op = Operator::start(&c, &ns.name);
    let adopted = |list: &[RolloutStrategy]| {
        list.iter()
            .filter(|s| {
                s.status.as_ref().is_some_and(|s| {
                    s.phase == Some(RolloutPhase::Idle) && s.stable_revision.is_some()
                }) && s
                    .labels()
                    .get("ballast.dev/target-governed")
                    .map(String::as_str)
                    == Some("true")
            })
            .count()
    };
    poll(
        &format!("{n} strategies adopted"),
        ADOPTION,
        || async {
            let list = strategies.list(&ListParams::default()).await.unwrap();
            (adopted(&list.items), support::rollout::tail(&op.logs(), 40))
        },
        n,
    )
    .await;
    // The watch events of the last writes (status, pause) come back and are decided on. A
    // strategy's status that only follows its Deployment (the generation its adoption wrote) is
    // written up to FOLLOW_EVERY (5 s) after its Idle write: twice that, so the last of them is
    // in before the first snapshot.
    tokio::time::sleep(Duration::from_secs(10)).await;

    let metrics = || async {
        let (code, body) = op.http_get("/metrics").await.expect("/metrics answers");
        assert_eq!(code, 200);
        body
    };
    let rss = std::fs::read_to_string(format!("/proc/{}/status", op.pid()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(String::from)
        });
    eprintln!("manager memory with {n} governed Deployments: {rss:?}");
    let first_text = metrics().await;
    let first = requests(&first_text);
    let total = |r: &BTreeMap<Key, u64>| -> u64 {
        r.iter()
            .filter(|(k, _)| !machinery(k))
            .map(|(_, v)| v)
            .sum()
    };
    eprintln!(
        "requests after adoption ({} by the controllers):\n{}",
        total(&first),
        show(&first)
    );

    // Time passes, and a watch event wakes every strategy: an annotation on the ReplicaSet of
    // each Deployment (nothing a strategy acts on; written by the test, not the manager).
    let window = Instant::now();
    tokio::time::sleep(Duration::from_secs(20)).await;
    let replica_sets: Api<ReplicaSet> = Api::namespaced(c.client.clone(), &ns.name);
    let poke = replica_sets
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|r| {
            let body =
                json!({"metadata": {"annotations": {"ballast.dev/steady-state-test": "poke"}}});
            (r.name_any(), body)
        })
        .collect::<Vec<_>>();
    assert_eq!(poke.len(), n, "one ReplicaSet per Deployment");
    patch_all(&replica_sets, poke, false).await;
    eprintln!("{n} ReplicaSets annotated after {:?}", window.elapsed());
    tokio::time::sleep(WINDOW.saturating_sub(window.elapsed())).await;
    let second_text = metrics().await;
    let second = requests(&second_text);
    eprintln!(
        "requests {:?} later ({} by the controllers):\n{}",
        window.elapsed(),
        total(&second),
        show(&second)
    );
    let reconciles = "ballast_reconciles_total{controller=\"rollout-strategy\"}";
    let woken = sample(&second_text, reconciles) - sample(&first_text, reconciles);
    eprintln!("rollout-strategy reconciles in between: {woken}");
    let (made, relists) = made_between(&first, &second);
    if !relists.is_empty() {
        eprintln!("relists after a failed watch (not counted): {relists:?}");
    }
    assert!(
        made.is_empty(),
        "converged strategies made API requests in {WINDOW:?}: {made:?}"
    );
    assert!(
        woken >= n as u64,
        "the ReplicaSet annotations woke every strategy ({woken} reconciles)"
    );
    let list = strategies.list(&ListParams::default()).await.unwrap();
    assert_eq!(adopted(&list.items), n, "every strategy still Idle");
    eprintln!("done in {:?}", started.elapsed());
    // The namespace goes when the test ends; its strategies' finalizers are taken off here, at
    // the test's pace (with the operator stopped, so that it adds none back).
    drop(op);
    let strip = (0..n)
        .map(|i| (name(i), json!({"metadata": {"finalizers": null}})))
        .collect();
    patch_all(&strategies, strip, false).await;
}
