//! The SpreadPolicy controller: reconciles pod affinity, anti-affinity and
//! topology spread constraints into the pod templates of the Deployments and
//! StatefulSets a policy selects, without touching what users wrote.
//!
//! Steps, one module each:
//! - read: reflector caches of workloads and nodes (`run`), stripped to what
//!   decisions need, woken only by changes a decision reads ([`read`]); the
//!   pods of workloads, filed by workload ([`pods`]);
//! - decide: [`plan`] (with [`terms`], [`merge`], [`select`],
//!   [`feasibility`], [`placement`], [`distribution`]) — pure;
//! - write: [`write`] (the bodies) and `perform` (sending them) — the only
//!   place workloads change;
//! - status: [`status`] — conditions, counts, Events on transitions.
//!
//! `sync` is one reconcile, those steps in order.

mod cluster;
pub mod distribution;
pub mod error;
pub mod feasibility;
pub mod merge;
mod perform;
pub mod placement;
pub mod plan;
pub mod pods;
pub mod read;
pub mod rebalance;
pub mod scale_down;
pub mod select;
pub mod status;
mod sync;
pub mod terms;
pub mod top;
pub mod tracker;
mod triggers;
pub mod workload;
pub mod write;

use super::{
    Context, ShutdownSignal,
    reconcile::{Outcomes, key},
};
use crate::api::cluster_spread_policy::ClusterSpreadPolicy;
use crate::api::spread_policy::{SpreadPolicy, WorkloadKind};
use crate::k8s::SPREAD_POLICY_MANAGER;
use crate::k8s::lenient::Lenient;
use error::Error;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{
    apps::v1::{Deployment, StatefulSet},
    core::v1::{Namespace, Node},
};
use kube::{
    Api, ResourceExt,
    core::PartialObjectMeta,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::Reporter,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use pods::{PodIndex, WatchedPod};
use read::{Cached, Relevant, Workloads, coalesce, node_fingerprint, strip_meta};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};
use tracker::Tracker;
use triggers::{Policies, Triggers};

pub const CONTROLLER: &str = "spread-policy";
/// The ClusterSpreadPolicy controller's name in metrics.
pub const CLUSTER_CONTROLLER: &str = "cluster-spread-policy";
/// Keeps a policy until its terms are out of every workload (deletionPolicy Remove).
pub const FINALIZER: &str = "ballast.dev/spread-policy";

/// Workload writes of one reconcile in flight at once. A policy that selects thousands of
/// workloads fans out at the pace of the API server rather than of one round trip at a time,
/// while the API server's priority and fairness sees a bounded number of our requests.
pub const WRITE_CONCURRENCY: usize = 8;
/// How soon a reconcile that met a 429 (after kube's own retries) tries again when the API
/// server named no time.
const THROTTLE_RETRY: Duration = Duration::from_secs(1);
/// How long pod changes are gathered before they wake the policies of their workloads: a
/// rollout or a scale moves many pods within a second, and each policy is planned once for
/// all of them.
pub const POD_COALESCE: Duration = Duration::from_secs(1);
/// How long the changes that wake ClusterSpreadPolicies (their workloads, pods, nodes,
/// SpreadPolicies) are gathered: one cluster policy spans many namespaces.
pub const CLUSTER_COALESCE: Duration = Duration::from_millis(200);

/// What every reconcile of this controller shares.
pub struct State {
    ctx: Context,
    /// Ends waits that the shutdown would otherwise sit out.
    shutdown: ShutdownSignal,
    policies: Policies,
    /// The Deployments and StatefulSets, as views.
    workloads: Arc<Workloads>,
    cluster_policies: triggers::ClusterPolicies,
    /// Namespaces, for their labels (a ClusterSpreadPolicy's namespaceSelector).
    namespaces: triggers::Namespaces,
    nodes: Store<Node>,
    /// The pods of the workloads, by workload.
    pods: Arc<PodIndex>,
    /// Whether all of the caches above are filled.
    ready: super::CachesReady,
    /// Each policy's last status write: pacing pod-count-only writes to one every few seconds,
    /// and no second write of a status the cache does not show yet ([`status::Pacer`]).
    pacer: status::Pacer,
    /// When each workload's last rebalancing batch went (in memory: after a restart the next
    /// batch may come sooner than `minInterval`, but never while replicas are unavailable).
    evicted: Mutex<HashMap<pods::WorkloadRef, jiff::Timestamp>>,
    recorder: super::events::Publisher,
    /// Our template writes and the rollouts under way (see [`tracker`]);
    /// shared with the workload watches' mappers.
    tracker: Arc<Mutex<Tracker>>,
    outcomes: Outcomes,
    cluster_outcomes: Outcomes,
}

impl State {
    /// The labels of the namespaces in scope.
    pub(crate) fn namespace_labels(&self) -> Arc<select::NamespaceLabels> {
        triggers::namespace_labels(&self.namespaces)
    }

    async fn caches_ready(&self) -> Result<(), Error> {
        if super::caches_ready(self.ready.wait(), &self.shutdown, Duration::from_secs(30)).await {
            Ok(())
        } else {
            Err(Error::CacheNotReady(self.ready.unfilled().join(", ")))
        }
    }
}

/// Runs the SpreadPolicy and ClusterSpreadPolicy controllers on shared caches of workloads,
/// their pods, nodes and namespaces.
pub async fn run(ctx: Context, shutdown: ShutdownSignal) {
    let cfg = super::watch_config();
    let mut ready = super::CachesReady::new();
    let workloads = Arc::new(Workloads::default());
    let index = workloads.clone();
    let deploy_stream = super::watch(
        ctx.scoped_api::<Cached<Deployment>>(),
        cfg.clone(),
        &ctx,
        "spread-policy/deployments",
    )
    .inspect_ok(move |ev| index.apply(WorkloadKind::Deployment, ev))
    .inspect(ready.filled("deployments").on_init_done())
    .filter(Relevant::filter())
    .touched_objects();
    let index = workloads.clone();
    let sts_stream = super::watch(
        ctx.scoped_api::<Cached<StatefulSet>>(),
        cfg.clone(),
        &ctx,
        "spread-policy/statefulsets",
    )
    .inspect_ok(move |ev| index.apply(WorkloadKind::StatefulSet, ev))
    .inspect(ready.filled("statefulsets").on_init_done())
    .filter(Relevant::filter())
    .touched_objects();
    let (nodes, node_writer) = reflector::store();
    let mut fingerprints: HashMap<String, u64> = HashMap::new();
    let node_stream = super::watch(
        Api::<Node>::all(ctx.client.clone()),
        cfg.clone(),
        &ctx,
        "spread-policy/nodes",
    )
    .modify(|n| {
        strip_meta(&mut n.metadata);
        if let Some(s) = n.status.as_mut() {
            s.images = None;
            s.volumes_attached = None;
            s.volumes_in_use = None;
        }
    })
    .reflect(node_writer)
    .inspect(ready.filled("nodes").on_init_done())
    .touched_objects()
    // Heartbeats change nothing that matters: only pass real changes.
    .filter(move |n| {
        let changed = match n {
            Ok(n) => {
                let fp = node_fingerprint(n);
                fingerprints.insert(n.name_any(), fp) != Some(fp)
            }
            Err(_) => true,
        };
        futures::future::ready(changed)
    });
    // Namespaces (their labels, for namespaceSelector): only label changes pass.
    let (namespaces, ns_writer) = reflector::store();
    let ns_cfg = match &ctx.namespace {
        Some(ns) => cfg.clone().fields(&format!("metadata.name={ns}")),
        None => cfg.clone(),
    };
    let mut ns_labels: HashMap<String, std::collections::BTreeMap<String, String>> = HashMap::new();
    let ns_events = ctx.metrics.watch_events("spread-policy/namespaces");
    let ns_stream = watcher(
        Api::<PartialObjectMeta<Namespace>>::all(ctx.client.clone()),
        ns_cfg,
    )
    .default_backoff()
    .inspect_ok(move |ev| ns_events.count(ev))
    .reflect(ns_writer)
    .inspect(ready.filled("namespaces").on_init_done())
    .touched_objects()
    .filter(move |n| {
        let changed = match n {
            Ok(n) => {
                ns_labels.insert(n.name_any(), n.labels().clone()).as_ref() != Some(n.labels())
            }
            Err(_) => true,
        };
        futures::future::ready(changed)
    });

    // Policies are read leniently: one this version cannot decode is reported
    // on itself, and every other policy goes on being reconciled.
    let (policies, policy_writer) = reflector::store();
    let policy_stream = super::watch(
        ctx.scoped_api::<Lenient<SpreadPolicy>>(),
        cfg.clone(),
        &ctx,
        "spread-policy/spreadpolicies",
    )
    .reflect(policy_writer)
    .inspect(ready.filled("spreadpolicies").on_init_done())
    .touched_objects();
    // A change to one policy can hand workloads to its siblings.
    let sibling_stream = super::watch(
        ctx.scoped_api::<Lenient<SpreadPolicy>>(),
        cfg.clone(),
        &ctx,
        "spread-policy/spreadpolicies-siblings",
    )
    .touched_objects();
    let (cluster_policies, cluster_writer) = reflector::store();
    let cluster_stream = super::watch(
        Api::<Lenient<ClusterSpreadPolicy>>::all(ctx.client.clone()),
        cfg.clone(),
        &ctx,
        "spread-policy/clusterspreadpolicies",
    )
    .reflect(cluster_writer)
    .inspect(ready.filled("clusterspreadpolicies").on_init_done())
    .touched_objects();
    let cluster_sibling_stream = super::watch(
        Api::<Lenient<ClusterSpreadPolicy>>::all(ctx.client.clone()),
        cfg.clone(),
        &ctx,
        "spread-policy/clusterspreadpolicies-siblings",
    )
    .touched_objects();
    let tracker = Arc::new(Mutex::new(Tracker::default()));
    let (cluster_tx, cluster_rx) = futures::channel::mpsc::unbounded();
    let triggers = Triggers {
        policies: policies.clone(),
        cluster_policies: cluster_policies.clone(),
        namespaces: namespaces.clone(),
        workloads: workloads.clone(),
        tracker: tracker.clone(),
        cluster_tx,
    };

    // Pods, filed by workload as they come; a change wakes the policies of its workload,
    // gathered over POD_COALESCE.
    let pods = Arc::new(PodIndex::default());
    let index = pods.clone();
    let pods_filled = ready.filled("pods");
    let t = triggers.clone();
    let pod_stream = super::watch(
        ctx.scoped_api::<WatchedPod>(),
        cfg.clone(),
        &ctx,
        "spread-policy/pods",
    )
    .filter_map(move |ev| {
        futures::future::ready(ev.ok().map(|ev| {
            let filled = matches!(ev, kube::runtime::watcher::Event::InitDone);
            let changed = index.apply(ev);
            if filled {
                pods_filled.mark();
            }
            changed
        }))
    })
    .flat_map(move |changed| futures::stream::iter(t.for_pods(changed)));
    let pod_triggers = coalesce(pod_stream, POD_COALESCE);
    let reporter = Reporter {
        controller: SPREAD_POLICY_MANAGER.into(),
        instance: None,
    };
    let state = Arc::new(State {
        ready,
        recorder: super::events::Publisher::new(ctx.client.clone(), reporter),
        shutdown: shutdown.clone(),
        outcomes: Outcomes::new(CONTROLLER, ctx.metrics.clone()),
        cluster_outcomes: Outcomes::new(CLUSTER_CONTROLLER, ctx.metrics.clone()),
        ctx,
        policies: policies.clone(),
        cluster_policies: cluster_policies.clone(),
        namespaces,
        workloads,
        nodes,
        pods,
        pacer: status::Pacer::default(),
        evicted: Mutex::default(),
        tracker,
    });
    let (t1, t2, t3, t4) = (
        triggers.clone(),
        triggers.clone(),
        triggers.clone(),
        triggers.clone(),
    );
    let namespaced = Controller::for_stream(policy_stream, policies.clone())
        .watches_stream(deploy_stream, move |d| t1.for_workload(&d.workload))
        .watches_stream(sts_stream, move |s| t2.for_workload(&s.workload))
        .watches_stream(node_stream, move |_| {
            t3.wake_all_cluster();
            t3.policies
                .state()
                .iter()
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        })
        .watches_stream(sibling_stream, move |changed: Lenient<SpreadPolicy>| {
            // A SpreadPolicy going away can hand its workloads to a cluster policy.
            t4.wake_all_cluster();
            t4.policies
                .state()
                .iter()
                .filter(|p| {
                    p.namespace() == changed.namespace() && p.name_any() != changed.name_any()
                })
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        })
        .reconcile_on(pod_triggers)
        .with_config(kube::runtime::controller::Config::default().concurrency(4))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, state.clone())
        .for_each(|_| futures::future::ready(()));
    let (c1, c2) = (cluster_policies.clone(), cluster_policies.clone());
    let cluster = Controller::for_stream(cluster_stream, cluster_policies)
        .watches_stream(ns_stream, move |_| {
            c1.state()
                .iter()
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        })
        .watches_stream(
            cluster_sibling_stream,
            move |changed: Lenient<ClusterSpreadPolicy>| {
                c2.state()
                    .iter()
                    .filter(|p| p.name_any() != changed.name_any())
                    .map(|p| ObjectRef::from_obj(p.as_ref()))
                    .collect::<Vec<_>>()
            },
        )
        .reconcile_on(coalesce(cluster_rx, CLUSTER_COALESCE))
        .with_config(kube::runtime::controller::Config::default().concurrency(2))
        .graceful_shutdown_on(shutdown)
        .run(reconcile_cluster, error_policy_cluster, state)
        .for_each(|_| futures::future::ready(()));
    futures::join!(namespaced, cluster);
}

async fn reconcile(obj: Arc<Lenient<SpreadPolicy>>, st: Arc<State>) -> Result<Action, Error> {
    st.outcomes
        .run(&key(obj.as_ref()), async {
            st.caches_ready().await?;
            match obj.as_ref() {
                Lenient::Ok(policy) => sync::sync(&obj, policy, true, &st).await,
                Lenient::Invalid(inv) => sync::sync_invalid(&obj, inv, &st).await,
            }
        })
        .await
}

fn error_policy(obj: Arc<Lenient<SpreadPolicy>>, err: &Error, st: Arc<State>) -> Action {
    st.outcomes.on_error(&key(obj.as_ref()), err)
}

async fn reconcile_cluster(
    obj: Arc<Lenient<ClusterSpreadPolicy>>,
    st: Arc<State>,
) -> Result<Action, Error> {
    st.cluster_outcomes
        .run(&key(obj.as_ref()), async {
            st.caches_ready().await?;
            match obj.as_ref() {
                Lenient::Ok(cp) => cluster::sync_cluster(&obj, cp, true, &st).await,
                Lenient::Invalid(inv) => cluster::sync_invalid(&obj, inv, &st).await,
            }
        })
        .await
}

fn error_policy_cluster(
    obj: Arc<Lenient<ClusterSpreadPolicy>>,
    err: &Error,
    st: Arc<State>,
) -> Action {
    st.cluster_outcomes.on_error(&key(obj.as_ref()), err)
}
