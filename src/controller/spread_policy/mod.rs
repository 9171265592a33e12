//! The SpreadPolicy controller: reconciles pod affinity, anti-affinity and
//! topology spread constraints into the pod templates of the Deployments and
//! StatefulSets a policy selects, without touching what users wrote.
//!
//! Steps, one module each:
//! - read: reflector caches of workloads and nodes (`run`), stripped to what
//!   decisions need, woken only by changes a decision reads ([`read`]);
//! - decide: [`plan`] (with [`terms`], [`merge`], [`select`],
//!   [`feasibility`], [`placement`]) — pure;
//! - write: [`write`] — server-side apply, the only place workloads change;
//! - status: [`status`] — conditions, counts, Events on transitions.

pub mod error;
pub mod feasibility;
pub mod merge;
pub mod placement;
pub mod plan;
pub mod read;
pub mod select;
pub mod status;
pub mod terms;
pub mod tracker;
pub mod workload;
pub mod write;

use super::{
    Context, ShutdownSignal,
    reconcile::{Outcomes, key},
};
use crate::api::spread_policy::{
    DeletionPolicy, RolloutPacing, SpreadPolicy, SpreadPolicySpec, WorkloadKind,
};
use crate::k8s::lenient::{Invalid, Lenient};
use crate::k8s::{SPREAD_POLICY_MANAGER, apply, finalizer};
use error::Error;
use feasibility::NodeInfo;
use futures::{StreamExt, stream::FuturesUnordered};
use k8s_openapi::api::{
    apps::v1::{Deployment, StatefulSet},
    core::v1::Node,
};
use kube::{
    Api, Resource, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::{Event, EventType, Reporter},
        reflector::{self, ObjectRef, Store},
    },
};
use plan::{ANNOTATION_POLICY, Inputs};
use read::{Cached, Relevant, node_fingerprint, strip_meta};
use serde::Deserialize;
use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
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

/// What every reconcile of this controller shares.
pub struct State {
    ctx: Context,
    /// Ends waits that the shutdown would otherwise sit out.
    shutdown: ShutdownSignal,
    policies: Policies,
    deployments: Store<Cached<Deployment>>,
    stateful_sets: Store<Cached<StatefulSet>>,
    nodes: Store<Node>,
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
            };
            if !super::caches_ready(ready, &st.shutdown, Duration::from_secs(30)).await {
                return Err(Error::CacheNotReady);
            }
            match obj.as_ref() {
                Lenient::Ok(policy) => sync(&obj, policy, true, &st).await,
                Lenient::Invalid(inv) => sync_invalid(&obj, inv, &st).await,
            }
        })
        .await
}

fn error_policy(obj: Arc<Lenient<SpreadPolicy>>, err: &Error, st: Arc<State>) -> Action {
    st.outcomes.on_error(&key(obj.as_ref()), err)
}

async fn set_finalizers(
    st: &State,
    obj: &Lenient<SpreadPolicy>,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let api: Api<Lenient<SpreadPolicy>> =
        Api::namespaced(st.ctx.client.clone(), &obj.namespace().unwrap_or_default());
    finalizer::set(&api, obj, finalizers)
        .await
        .map_err(|e| match e {
            finalizer::Error::Stale => Error::Stale,
            finalizer::Error::Api(e) => Error::Finalizer(e),
        })
}

/// A stored policy this version cannot read. It is reported on itself and
/// otherwise left alone (what it wrote stays, as with `suspend`), except that
/// its deletion still takes its terms out of the workloads that carry them,
/// so the deletion finishes. Only `deletionPolicy` and `rollout` are read from
/// it for that, each when it decodes (else the defaults: Remove, 1 at a time).
async fn sync_invalid(
    obj: &Lenient<SpreadPolicy>,
    inv: &Invalid,
    st: &State,
) -> Result<Action, Error> {
    if obj.meta().deletion_timestamp.is_some() {
        let spec = inv.raw.get("spec");
        let field = |name: &str| spec.and_then(|s| s.get(name));
        let stand_in = SpreadPolicy {
            metadata: inv.metadata.clone(),
            spec: SpreadPolicySpec {
                deletion_policy: field("deletionPolicy")
                    .and_then(|v| DeletionPolicy::deserialize(v).ok())
                    .unwrap_or_default(),
                rollout: field("rollout")
                    .and_then(|v| RolloutPacing::deserialize(v).ok())
                    .unwrap_or_default(),
                ..Default::default()
            },
            status: None,
        };
        return sync(obj, &stand_in, false, st).await;
    }
    super::report_invalid::<Lenient<SpreadPolicy>>(
        &st.ctx.client,
        &st.recorder,
        SPREAD_POLICY_MANAGER,
        inv,
    )
    .await
    .map_err(Error::ReportInvalid)?;
    Ok(Action::await_change())
}

/// The cached Deployments and StatefulSets of `ns`.
fn workloads_in(st: &State, ns: &str) -> Vec<Workload> {
    st.deployments
        .state()
        .iter()
        .filter(|d| d.namespace().as_deref() == Some(ns))
        .map(|d| d.workload.clone())
        .chain(
            st.stateful_sets
                .state()
                .iter()
                .filter(|s| s.namespace().as_deref() == Some(ns))
                .map(|s| s.workload.clone()),
        )
        .collect()
}

/// Reconciles `policy` (the object `obj` as read, or a stand-in for one that
/// cannot be read, whose status is then not written).
async fn sync(
    obj: &Lenient<SpreadPolicy>,
    policy: &SpreadPolicy,
    readable: bool,
    st: &State,
) -> Result<Action, Error> {
    let ns = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let deleting = policy.metadata.deletion_timestamp.is_some();
    let has_finalizer = policy.finalizers().iter().any(|f| f == FINALIZER);
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    if !deleting && !has_finalizer {
        let mut f = policy.finalizers().to_vec();
        f.push(FINALIZER.into());
        set_finalizers(st, obj, f).await?;
        // The update wakes us again with the finalizer in place.
        return Ok(Action::await_change());
    }

    let mut workloads = workloads_in(st, &ns);
    let seen = st.tracker.lock().expect("not poisoned").observe(
        &ns,
        &mut workloads,
        jiff::Timestamp::now(),
    );
    let mut policies: Vec<Arc<SpreadPolicy>> = st
        .policies
        .state()
        .iter()
        .filter_map(|p| p.ok())
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()) && p.name_any() != name)
        .map(|p| Arc::new(p.clone()))
        .collect();
    policies.push(Arc::new(policy.clone()));
    let nodes: Vec<NodeInfo> = st
        .nodes
        .state()
        .iter()
        .map(|n| NodeInfo::from_node(n))
        .collect();

    let plan = plan::plan(&Inputs {
        policy,
        policies: &policies,
        workloads: &workloads,
        nodes: &nodes,
        unobserved_writes: &seen.unobserved,
    });
    let outcome = perform(st, policy, &plan, &workloads).await;
    if !deleting {
        st.ctx
            .metrics
            .set_spread_infeasible(&ns, &name, Some(plan.pending));
    }

    if readable {
        let new_status = status::build(policy, &plan, &outcome.rejected, jiff::Timestamp::now());
        let old_conditions = policy
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        if policy.status.as_ref() != Some(&new_status) {
            let api: Api<SpreadPolicy> = Api::namespaced(st.ctx.client.clone(), &ns);
            apply::apply_status(&api, SPREAD_POLICY_MANAGER, &name, &new_status)
                .await
                .map_err(Error::Status)?;
            for (warning, reason, note) in
                status::events_for(&old_conditions, &new_status.conditions)
            {
                publish(st, policy, warning, reason, note).await;
            }
        }
    }
    if let Some(e) = outcome.transient {
        return Err(e);
    }

    if deleting && plan.released {
        let f: Vec<String> = policy
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        set_finalizers(st, obj, f).await?;
        st.ctx.metrics.set_spread_infeasible(&ns, &name, None);
        tracing::info!(policy = %name, namespace = %ns, "released every workload; finalizer removed");
        return Ok(Action::await_change());
    }
    if let Some(delay) = outcome.throttled {
        return Ok(Action::requeue(delay));
    }
    if outcome.retry_soon {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    // A rollout that stops progressing holds up pacing only until its bound:
    // nothing else would wake us then.
    if let Some(bound) = seen.next_bound.filter(|_| plan.waiting > 0) {
        return Ok(Action::requeue(bound + Duration::from_secs(1)));
    }
    // Everything else wakes us through the watches: workload changes (also
    // rollouts finishing, which frees pacing budget), node changes, policy
    // changes.
    Ok(Action::await_change())
}

/// What the writes of one reconcile came to.
#[derive(Default)]
struct Performed {
    /// `(workload, message)` of writes the API server refused.
    rejected: Vec<(String, String)>,
    /// A write met a newer workload than the cache had: merge again soon.
    retry_soon: bool,
    /// The API server throttled us (429 after kube's own retries): the writes not made yet
    /// wait this long, and nothing has failed.
    throttled: Option<Duration>,
    transient: Option<Error>,
}

/// Sends one write, unless a 429 has been met meanwhile (then `None`: not sent).
async fn write_one<'a>(
    st: &State,
    ns: &str,
    policy: &str,
    throttled: &AtomicBool,
    w: &'a plan::Write,
    live: &Workload,
) -> (&'a plan::Write, Option<kube::Result<write::Outcome>>) {
    if throttled.load(Ordering::Relaxed) {
        return (w, None);
    }
    let body = write::body(w, ns, live);
    tracing::debug!(policy, workload = %w_display(w.kind, &w.name), generation = ?live.generation, resource_version = ?live.resource_version, ?body, "writing workload");
    let result = write::write_workload(&st.ctx.client, ns, w.kind, &w.name, &body).await;
    if matches!(&result, Err(kube::Error::Api(s)) if s.code == 429) {
        throttled.store(true, Ordering::Relaxed);
    }
    (w, Some(result))
}

/// Makes the plan's writes, at most [`WRITE_CONCURRENCY`] at once, remembering the template
/// changes for pacing. Each write costs O(1) here whatever the number of workloads: the live
/// workloads are looked up by key, and one Event per outcome sums up the whole batch.
async fn perform(
    st: &State,
    policy: &SpreadPolicy,
    plan: &plan::Plan,
    workloads: &[Workload],
) -> Performed {
    let ns = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let live: HashMap<(WorkloadKind, &str), &Workload> = workloads
        .iter()
        .map(|w| ((w.kind, w.name.as_str()), w))
        .collect();
    // Set by a 429: the writes not started yet wait for the next reconcile.
    let throttled = AtomicBool::new(false);
    let mut jobs = plan
        .writes
        .iter()
        .filter_map(|w| live.get(&(w.kind, w.name.as_str())).map(|l| (w, *l)));
    // A bounded window of writes in flight (a loop rather than a stream combinator, whose
    // closures over borrowed writes the compiler cannot prove Send for every lifetime).
    let mut running = FuturesUnordered::new();
    for (w, l) in jobs.by_ref().take(WRITE_CONCURRENCY) {
        running.push(write_one(st, &ns, &name, &throttled, w, l));
    }

    let mut out = Performed::default();
    let (mut applied, mut removed) = (Vec::new(), Vec::new());
    while let Some((w, result)) = running.next().await {
        if let Some((w, l)) = jobs.next() {
            running.push(write_one(st, &ns, &name, &throttled, w, l));
        }
        let Some(result) = result else { continue };
        let target = w_display(w.kind, &w.name);
        let kind = format!("{:?}", w.kind);
        match result {
            Ok(done) => {
                let outcome = if w.is_removal() { "removed" } else { "applied" };
                st.ctx.metrics.count_write(CONTROLLER, &kind, outcome);
                tracing::info!(policy = %name, namespace = %ns, workload = %target, outcome, template_changed = w.merged.template_changed, "wrote workload");
                if let (Some(g), true) = (done.generation, w.merged.template_changed) {
                    st.tracker.lock().expect("not poisoned").wrote(
                        (ns.clone(), w.kind, w.name.clone()),
                        &name,
                        done.uid,
                        g,
                    );
                }
                if w.is_removal() {
                    removed.push(target);
                } else {
                    applied.push((target, w.merged.ours.len()));
                }
            }
            // Deleted since the cache read: nothing to take out or put in.
            Err(kube::Error::Api(s)) if s.code == 404 => {
                st.ctx.metrics.count_write(CONTROLLER, &kind, "gone");
                out.retry_soon = true;
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // The workload changed since the cache read: merge again.
                st.ctx.metrics.count_write(CONTROLLER, &kind, "conflict");
                out.retry_soon = true;
            }
            // Throttled beyond kube's own retries: back off, and fail nothing.
            Err(kube::Error::Api(s)) if s.code == 429 => {
                st.ctx.metrics.count_write(CONTROLLER, &kind, "throttled");
                let delay = write::throttle_delay(&s, THROTTLE_RETRY);
                out.throttled = Some(out.throttled.map_or(delay, |d| d.max(delay)));
                tracing::debug!(policy = %name, namespace = %ns, workload = %target, ?delay, "workload write throttled");
            }
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 || s.code == 403 => {
                st.ctx.metrics.count_write(CONTROLLER, &kind, "rejected");
                tracing::warn!(policy = %name, namespace = %ns, workload = %target, error = %s.message, "workload write rejected");
                out.rejected.push((target, s.message.clone()));
            }
            Err(e) => {
                st.ctx.metrics.count_write(CONTROLLER, &kind, "error");
                out.transient = Some(Error::Write {
                    workload: target,
                    source: e,
                });
            }
        }
    }
    if let [(_, terms)] = applied.as_slice() {
        let single = format!("{terms} term(s) of this policy in the pod template");
        let targets = [applied[0].0.clone()];
        let note = status::written_note(&targets, &single, "");
        publish(st, policy, false, status::reason::TERMS_APPLIED, note).await;
    } else if !applied.is_empty() {
        let targets: Vec<String> = applied.into_iter().map(|(t, _)| t).collect();
        let note = status::written_note(&targets, "", "now carry this policy's terms");
        publish(st, policy, false, status::reason::TERMS_APPLIED, note).await;
    }
    if !removed.is_empty() {
        let note = status::written_note(
            &removed,
            "removed this policy's terms",
            "had this policy's terms removed",
        );
        publish(st, policy, false, status::reason::TERMS_REMOVED, note).await;
    }
    out
}

fn w_display(kind: WorkloadKind, name: &str) -> String {
    format!("{kind:?}/{name}")
}

async fn publish(st: &State, policy: &SpreadPolicy, warning: bool, reason: &str, note: String) {
    let ev = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = st.recorder.publish(&ev, &policy.object_ref(&())).await {
        tracing::warn!(error = %e, reason, "could not publish event");
    }
}
