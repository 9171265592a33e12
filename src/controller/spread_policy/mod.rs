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
pub mod tracker;
pub mod workload;
pub mod write;

use super::{
    Context, ShutdownSignal,
    reconcile::{Outcomes, key},
};
use crate::api::spread_policy::{SpreadPolicy, WorkloadKind};
use crate::k8s::SPREAD_POLICY_MANAGER;
use crate::k8s::lenient::Lenient;
use error::Error;
use futures::StreamExt;
use k8s_openapi::api::{
    apps::v1::{Deployment, StatefulSet},
    core::v1::Node,
};
use kube::{
    Api, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::Reporter,
        reflector::{self, ObjectRef, Store},
    },
};
use plan::ANNOTATION_POLICY;
use pods::{Changed, PodIndex, WatchedPod};
use read::{Cached, Relevant, coalesce, node_fingerprint, strip_meta};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};
use tracker::Tracker;
use workload::Workload;

pub const CONTROLLER: &str = "spread-policy";
/// Keeps a policy until its terms are out of every workload (deletionPolicy Remove).
pub const FINALIZER: &str = "ballast.dev/spread-policy";

type Policies = Store<Lenient<SpreadPolicy>>;

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

/// What every reconcile of this controller shares.
pub struct State {
    ctx: Context,
    /// Ends waits that the shutdown would otherwise sit out.
    shutdown: ShutdownSignal,
    policies: Policies,
    deployments: Store<Cached<Deployment>>,
    stateful_sets: Store<Cached<StatefulSet>>,
    nodes: Store<Node>,
    /// The pods of the workloads, by workload.
    pods: Arc<PodIndex>,
    /// Holds status writes that only move pod counts to one every few seconds.
    pacer: status::Pacer,
    /// When each workload's last rebalancing batch went (in memory: after a restart the next
    /// batch may come sooner than `minInterval`, but never while replicas are unavailable).
    evicted: Mutex<HashMap<pods::WorkloadRef, jiff::Timestamp>>,
    recorder: super::events::Publisher,
    /// Our template writes and the rollouts under way (see [`tracker`]);
    /// shared with the workload watches' mappers.
    tracker: Arc<Mutex<Tracker>>,
    outcomes: Outcomes,
}

/// The policies in `w`'s namespace that select it, whose terms it carries,
/// or whose write it is still rolling out.
fn policies_for(
    store: &Policies,
    tracker: &Mutex<Tracker>,
    w: &Workload,
) -> Vec<ObjectRef<Lenient<SpreadPolicy>>> {
    let owner = w.annotations.get(ANNOTATION_POLICY);
    let rolling_for = tracker
        .lock()
        .expect("not poisoned")
        .rolling_for(&(w.namespace.clone(), w.kind, w.name.clone()))
        .map(str::to_string);
    store
        .state()
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(w.namespace.as_str()))
        .filter(|p| {
            let name = p.name_any();
            owner == Some(&name)
                || rolling_for.as_ref() == Some(&name)
                || p.ok().is_some_and(|p| select::selects(p, w))
        })
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// The workload `(ns, kind, name)` as cached.
fn cached_workload(
    deployments: &Store<Cached<Deployment>>,
    stateful_sets: &Store<Cached<StatefulSet>>,
    (ns, kind, name): &pods::WorkloadRef,
) -> Option<Workload> {
    match kind {
        WorkloadKind::Deployment => deployments
            .get(&ObjectRef::new(name).within(ns))
            .map(|d| d.workload.clone()),
        WorkloadKind::StatefulSet => stateful_sets
            .get(&ObjectRef::new(name).within(ns))
            .map(|s| s.workload.clone()),
    }
}

/// The workloads, and their policies, that the store of each kind holds.
struct Stores {
    policies: Policies,
    deployments: Store<Cached<Deployment>>,
    stateful_sets: Store<Cached<StatefulSet>>,
    tracker: Arc<Mutex<Tracker>>,
}

impl Stores {
    /// The policies to wake when the pods of `changed` workloads changed.
    fn policies_for_pods(&self, changed: Changed) -> Vec<ObjectRef<Lenient<SpreadPolicy>>> {
        let refs = match changed {
            Changed::All => {
                return self
                    .policies
                    .state()
                    .iter()
                    .map(|p| ObjectRef::from_obj(p.as_ref()))
                    .collect();
            }
            Changed::Some(refs) => refs,
        };
        let mut out = Vec::new();
        for r in &refs {
            if let Some(w) = cached_workload(&self.deployments, &self.stateful_sets, r) {
                for p in policies_for(&self.policies, &self.tracker, &w) {
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
        out
    }
}

pub async fn run(ctx: Context, shutdown: ShutdownSignal) {
    let cfg = super::watch_config();
    let health = &ctx.health;
    let (deployments, deploy_writer) = reflector::store();
    let deploy_stream = super::watch(
        ctx.scoped_api::<Cached<Deployment>>(),
        cfg.clone(),
        health.clone(),
        "spread-policy/deployments",
    )
    .reflect(deploy_writer)
    .filter(Relevant::filter())
    .touched_objects();
    let (stateful_sets, sts_writer) = reflector::store();
    let sts_stream = super::watch(
        ctx.scoped_api::<Cached<StatefulSet>>(),
        cfg.clone(),
        health.clone(),
        "spread-policy/statefulsets",
    )
    .reflect(sts_writer)
    .filter(Relevant::filter())
    .touched_objects();
    let (nodes, node_writer) = reflector::store();
    let mut fingerprints: HashMap<String, u64> = HashMap::new();
    let node_stream = super::watch(
        Api::<Node>::all(ctx.client.clone()),
        cfg.clone(),
        health.clone(),
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

    // Policies are read leniently: one this version cannot decode is reported
    // on itself, and every other policy goes on being reconciled.
    let (policies, policy_writer) = reflector::store();
    let policy_stream = super::watch(
        ctx.scoped_api::<Lenient<SpreadPolicy>>(),
        cfg.clone(),
        health.clone(),
        "spread-policy/spreadpolicies",
    )
    .reflect(policy_writer)
    .touched_objects();
    // A change to one policy can hand workloads to its siblings.
    let sibling_stream = super::watch(
        ctx.scoped_api::<Lenient<SpreadPolicy>>(),
        cfg.clone(),
        health.clone(),
        "spread-policy/spreadpolicies-siblings",
    )
    .touched_objects();
    let controller = Controller::for_stream(policy_stream, policies.clone());
    let tracker = Arc::new(Mutex::new(Tracker::default()));

    // Pods, filed by workload as they come; a change wakes the policies of its workload,
    // gathered over POD_COALESCE.
    let pods = Arc::new(PodIndex::default());
    let stores = Stores {
        policies: policies.clone(),
        deployments: deployments.clone(),
        stateful_sets: stateful_sets.clone(),
        tracker: tracker.clone(),
    };
    let index = pods.clone();
    let pod_stream = super::watch(
        ctx.scoped_api::<WatchedPod>(),
        cfg.clone(),
        health.clone(),
        "spread-policy/pods",
    )
    .filter_map(move |ev| futures::future::ready(ev.ok().map(|ev| index.apply(ev))))
    .flat_map(move |changed| futures::stream::iter(stores.policies_for_pods(changed)));
    let pod_triggers = coalesce(pod_stream, POD_COALESCE);
    let (t1, t2) = (tracker.clone(), tracker.clone());
    let reporter = Reporter {
        controller: SPREAD_POLICY_MANAGER.into(),
        instance: None,
    };
    let state = Arc::new(State {
        recorder: super::events::Publisher::new(ctx.client.clone(), reporter),
        shutdown: shutdown.clone(),
        outcomes: Outcomes::new(CONTROLLER, ctx.metrics.clone()),
        ctx,
        policies: policies.clone(),
        deployments,
        stateful_sets,
        nodes,
        pods,
        pacer: status::Pacer::default(),
        evicted: Mutex::default(),
        tracker: tracker.clone(),
    });
    let (p1, p2, p3, p4) = (
        policies.clone(),
        policies.clone(),
        policies.clone(),
        policies,
    );
    controller
        .watches_stream(deploy_stream, move |d| policies_for(&p1, &t1, &d.workload))
        .watches_stream(sts_stream, move |s| policies_for(&p2, &t2, &s.workload))
        .watches_stream(node_stream, move |_| {
            p3.state()
                .iter()
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        })
        .watches_stream(sibling_stream, move |changed: Lenient<SpreadPolicy>| {
            p4.state()
                .iter()
                .filter(|p| {
                    p.namespace() == changed.namespace() && p.name_any() != changed.name_any()
                })
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        })
        .reconcile_on(pod_triggers)
        .with_config(kube::runtime::controller::Config::default().concurrency(4))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, state)
        .for_each(|_| futures::future::ready(()))
        .await;
}

async fn reconcile(obj: Arc<Lenient<SpreadPolicy>>, st: Arc<State>) -> Result<Action, Error> {
    st.outcomes
        .run(&key(obj.as_ref()), async {
            let ready = async {
                let _ = st.policies.wait_until_ready().await;
                let _ = st.deployments.wait_until_ready().await;
                let _ = st.stateful_sets.wait_until_ready().await;
                let _ = st.nodes.wait_until_ready().await;
                st.pods.wait_until_ready().await;
            };
            if !super::caches_ready(ready, &st.shutdown, Duration::from_secs(30)).await {
                return Err(Error::CacheNotReady);
            }
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
