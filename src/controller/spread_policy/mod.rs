//! The SpreadPolicy controller: reconciles pod affinity, anti-affinity and
//! topology spread constraints into the pod templates of the Deployments and
//! StatefulSets a policy selects, without touching what users wrote.
//!
//! Steps, one module each:
//! - read: reflector caches of workloads and nodes (`run`), stripped to what
//!   decisions need;
//! - decide: [`plan`] (with [`terms`], [`merge`], [`select`],
//!   [`feasibility`]) — pure;
//! - write: [`write`] — server-side apply, the only place workloads change;
//! - status: [`status`] — conditions, counts, Events on transitions.

pub mod error;
pub mod feasibility;
pub mod merge;
pub mod plan;
pub mod select;
pub mod status;
pub mod terms;
pub mod workload;
pub mod write;

use super::{Context, ShutdownSignal};
use crate::api::spread_policy::{SpreadPolicy, WorkloadKind};
use crate::k8s::{SPREAD_POLICY_MANAGER, apply, finalizer};
use error::Error;
use feasibility::NodeInfo;
use futures::StreamExt;
use k8s_openapi::api::{
    apps::v1::{Deployment, StatefulSet},
    core::v1::{Node, PodSpec},
};
use kube::{
    Api, Resource, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use plan::{ANNOTATION_POLICY, Inputs};
use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};
use workload::Workload;

pub const CONTROLLER: &str = "spread-policy";
/// Keeps a policy until its terms are out of every workload (deletionPolicy Remove).
pub const FINALIZER: &str = "ballast.dev/spread-policy";

/// What every reconcile of this controller shares.
pub struct State {
    ctx: Context,
    /// Ends waits that the shutdown would otherwise sit out.
    shutdown: ShutdownSignal,
    policies: Store<SpreadPolicy>,
    deployments: Store<Deployment>,
    stateful_sets: Store<StatefulSet>,
    nodes: Store<Node>,
    recorder: Recorder,
    /// Generation each of our recent writes produced, until the cache shows
    /// it: keeps a lagging cache from causing a second write or from
    /// undercounting rollouts in flight.
    written: Mutex<HashMap<(String, WorkloadKind, String), i64>>,
    /// Consecutive failures per policy (`namespace/name`), for backoff.
    failures: Mutex<HashMap<String, u32>>,
}

/// Exponential backoff per object: 1s, 2s, 4s … capped at 5 minutes.
pub fn backoff(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.min(9)).min(Duration::from_secs(300))
}

fn key(p: &SpreadPolicy) -> String {
    format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())
}

/// Drops what no decision reads, so the caches stay small: managedFields,
/// the last-applied annotation, and the containers and volumes of the pod
/// template (ballast never writes whole objects, only apply patches).
fn strip_pod_spec(spec: &mut PodSpec) {
    spec.containers = Vec::new();
    spec.init_containers = None;
    spec.ephemeral_containers = None;
    spec.volumes = None;
}

fn strip_meta(meta: &mut kube::api::ObjectMeta) {
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// Fields of a node that change which domains are schedulable.
fn node_fingerprint(n: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let info = NodeInfo::from_node(n);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    info.labels.hash(&mut h);
    info.ready.hash(&mut h);
    info.unschedulable.hash(&mut h);
    for t in &info.taints {
        (&t.key, &t.value, &t.effect).hash(&mut h);
    }
    h.finish()
}

/// The policies in `w`'s namespace that select it or whose terms it carries.
fn policies_for(store: &Store<SpreadPolicy>, w: &Workload) -> Vec<ObjectRef<SpreadPolicy>> {
    let owner = w.annotations.get(ANNOTATION_POLICY);
    store
        .state()
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(w.namespace.as_str()))
        .filter(|p| select::selects(p, w) || owner == Some(&p.name_any()))
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

pub async fn run(ctx: Context, shutdown: ShutdownSignal) {
    let cfg = watcher::Config::default().any_semantic();
    let (deployments, deploy_writer) = reflector::store();
    let deploy_stream = watcher(ctx.scoped_api::<Deployment>(), cfg.clone())
        .default_backoff()
        .modify(|d| {
            strip_meta(&mut d.metadata);
            if let Some(s) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
                strip_pod_spec(s);
            }
        })
        .reflect(deploy_writer)
        .touched_objects();
    let (stateful_sets, sts_writer) = reflector::store();
    let sts_stream = watcher(ctx.scoped_api::<StatefulSet>(), cfg.clone())
        .default_backoff()
        .modify(|s| {
            strip_meta(&mut s.metadata);
            if let Some(spec) = s.spec.as_mut() {
                spec.volume_claim_templates = None;
                if let Some(p) = spec.template.spec.as_mut() {
                    strip_pod_spec(p);
                }
            }
        })
        .reflect(sts_writer)
        .touched_objects();
    let (nodes, node_writer) = reflector::store();
    let mut fingerprints: HashMap<String, u64> = HashMap::new();
    let node_stream = watcher(Api::<Node>::all(ctx.client.clone()), cfg.clone())
        .default_backoff()
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

    let policies_api = ctx.scoped_api::<SpreadPolicy>();
    let controller = Controller::new(policies_api.clone(), cfg.clone());
    let policies = controller.store();
    let reporter = Reporter {
        controller: SPREAD_POLICY_MANAGER.into(),
        instance: None,
    };
    let state = Arc::new(State {
        recorder: Recorder::new(ctx.client.clone(), reporter),
        shutdown: shutdown.clone(),
        ctx,
        policies: policies.clone(),
        deployments,
        stateful_sets,
        nodes,
        written: Mutex::new(HashMap::new()),
        failures: Mutex::new(HashMap::new()),
    });
    let (p1, p2, p3, p4) = (
        policies.clone(),
        policies.clone(),
        policies.clone(),
        policies,
    );
    controller
        .watches_stream(deploy_stream, move |d| {
            policies_for(&p1, &Workload::from_deployment(&d))
        })
        .watches_stream(sts_stream, move |s| {
            policies_for(&p2, &Workload::from_stateful_set(&s))
        })
        .watches_stream(node_stream, move |_| {
            p3.state()
                .iter()
                .map(|p| ObjectRef::from_obj(p.as_ref()))
                .collect::<Vec<_>>()
        })
        // A change to one policy can hand workloads to its siblings.
        .watches(policies_api, cfg, move |changed: SpreadPolicy| {
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

async fn reconcile(policy: Arc<SpreadPolicy>, st: Arc<State>) -> Result<Action, Error> {
    let start = std::time::Instant::now();
    let ready = async {
        let _ = st.deployments.wait_until_ready().await;
        let _ = st.stateful_sets.wait_until_ready().await;
        let _ = st.nodes.wait_until_ready().await;
    };
    if !super::caches_ready(ready, &st.shutdown, Duration::from_secs(30)).await {
        return Err(Error::CacheNotReady);
    }
    let result = sync(&policy, &st).await;
    st.ctx
        .metrics
        .count_reconcile(CONTROLLER, start.elapsed().as_secs_f64());
    result
}

fn error_policy(policy: Arc<SpreadPolicy>, err: &Error, st: Arc<State>) -> Action {
    st.ctx.metrics.count_error(CONTROLLER, err.reason());
    if matches!(err, Error::Stale) {
        tracing::debug!(policy = %policy.name_any(), "stale copy; retrying");
        return Action::requeue(Duration::from_millis(500));
    }
    let failures = {
        let mut f = st.failures.lock().expect("not poisoned");
        let n = f.entry(key(&policy)).or_insert(0);
        *n += 1;
        *n
    };
    let delay = backoff(failures);
    tracing::warn!(policy = %policy.name_any(), namespace = ?policy.namespace(), error = %err, reason = err.reason(), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

async fn set_finalizers(
    api: &Api<SpreadPolicy>,
    policy: &SpreadPolicy,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    finalizer::set(api, policy, finalizers)
        .await
        .map_err(|e| match e {
            finalizer::Error::Stale => Error::Stale,
            finalizer::Error::Api(e) => Error::Finalizer(e),
        })
}

async fn sync(policy: &SpreadPolicy, st: &State) -> Result<Action, Error> {
    let ns = policy.namespace().unwrap_or_default();
    let name = policy.name_any();
    let api: Api<SpreadPolicy> = Api::namespaced(st.ctx.client.clone(), &ns);
    let deleting = policy.metadata.deletion_timestamp.is_some();
    let has_finalizer = policy.finalizers().iter().any(|f| f == FINALIZER);
    if deleting && !has_finalizer {
        return Ok(Action::await_change());
    }
    if !deleting && !has_finalizer {
        let mut f = policy.finalizers().to_vec();
        f.push(FINALIZER.into());
        set_finalizers(&api, policy, f).await?;
        // The update wakes us again with the finalizer in place.
        return Ok(Action::await_change());
    }

    let workloads: Vec<Workload> = st
        .deployments
        .state()
        .iter()
        .filter(|d| d.namespace().as_deref() == Some(ns.as_str()))
        .map(|d| Workload::from_deployment(d))
        .chain(
            st.stateful_sets
                .state()
                .iter()
                .filter(|s| s.namespace().as_deref() == Some(ns.as_str()))
                .map(|s| Workload::from_stateful_set(s)),
        )
        .collect();
    let mut policies: Vec<Arc<SpreadPolicy>> = st
        .policies
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns.as_str()) && p.name_any() != name)
        .collect();
    policies.push(Arc::new(policy.clone()));
    let nodes: Vec<NodeInfo> = st
        .nodes
        .state()
        .iter()
        .map(|n| NodeInfo::from_node(n))
        .collect();

    // Forget writes the cache has caught up with.
    let unobserved: BTreeSet<(WorkloadKind, String)> = {
        let mut written = st.written.lock().expect("not poisoned");
        written.retain(|(wns, kind, wname), generation| {
            let cached = match kind {
                WorkloadKind::Deployment => st
                    .deployments
                    .get(&ObjectRef::new(wname).within(wns))
                    .and_then(|d| d.metadata.generation),
                WorkloadKind::StatefulSet => st
                    .stateful_sets
                    .get(&ObjectRef::new(wname).within(wns))
                    .and_then(|s| s.metadata.generation),
            };
            cached.is_some_and(|c| c < *generation)
        });
        written
            .keys()
            .filter(|(wns, _, _)| *wns == ns)
            .map(|(_, k, n)| (*k, n.clone()))
            .collect()
    };

    let plan = plan::plan(&Inputs {
        policy,
        policies: &policies,
        workloads: &workloads,
        nodes: &nodes,
        unobserved_writes: &unobserved,
    });

    let mut write_errors = Vec::new();
    let mut retry_soon = false;
    let mut transient: Option<Error> = None;
    for w in &plan.writes {
        let live = workloads
            .iter()
            .find(|x| x.kind == w.kind && x.name == w.name);
        let live_has_list = |group: &str, which: &str| {
            let Some(l) = live else { return false };
            let aff = &l.affinity;
            match (group, which) {
                ("podAntiAffinity", "required") => aff
                    .pod_anti_affinity
                    .as_ref()
                    .and_then(|a| {
                        a.required_during_scheduling_ignored_during_execution
                            .as_ref()
                    })
                    .is_some_and(|v| !v.is_empty()),
                ("podAntiAffinity", _) => aff
                    .pod_anti_affinity
                    .as_ref()
                    .and_then(|a| {
                        a.preferred_during_scheduling_ignored_during_execution
                            .as_ref()
                    })
                    .is_some_and(|v| !v.is_empty()),
                ("podAffinity", "required") => aff
                    .pod_affinity
                    .as_ref()
                    .and_then(|a| {
                        a.required_during_scheduling_ignored_during_execution
                            .as_ref()
                    })
                    .is_some_and(|v| !v.is_empty()),
                _ => aff
                    .pod_affinity
                    .as_ref()
                    .and_then(|a| {
                        a.preferred_during_scheduling_ignored_during_execution
                            .as_ref()
                    })
                    .is_some_and(|v| !v.is_empty()),
            }
        };
        let body = write::apply_body(w, &ns, live_has_list);
        let target = format!("{:?}/{}", w.kind, w.name);
        let kind = format!("{:?}", w.kind);
        match write::apply_workload(&st.ctx.client, &ns, w.kind, &w.name, &body).await {
            Ok(generation) => {
                let outcome = if w.is_removal() { "removed" } else { "applied" };
                st.ctx.metrics.count_write(CONTROLLER, &kind, outcome);
                tracing::info!(policy = %name, namespace = %ns, workload = %target, outcome, template_changed = w.merged.template_changed, "wrote workload");
                if let (Some(g), true) = (generation, w.merged.template_changed) {
                    st.written
                        .lock()
                        .expect("not poisoned")
                        .insert((ns.clone(), w.kind, w.name.clone()), g);
                }
                let (reason, note) = if w.is_removal() {
                    (
                        "TermsRemoved",
                        format!("{target}: removed this policy's terms"),
                    )
                } else {
                    (
                        "TermsApplied",
                        format!(
                            "{target}: {} term(s) of this policy in the pod template",
                            w.merged.ours.len()
                        ),
                    )
                };
                publish(st, policy, false, reason, note).await;
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                // The workload changed since the cache read: merge again.
                st.ctx.metrics.count_write(CONTROLLER, &kind, "conflict");
                retry_soon = true;
            }
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 || s.code == 403 => {
                st.ctx.metrics.count_write(CONTROLLER, &kind, "rejected");
                tracing::warn!(policy = %name, namespace = %ns, workload = %target, error = %s.message, "workload write rejected");
                write_errors.push((target, s.message.clone()));
            }
            Err(e) => {
                st.ctx.metrics.count_write(CONTROLLER, &kind, "error");
                transient = Some(Error::Write {
                    workload: target,
                    source: e,
                });
            }
        }
    }

    let new_status = status::build(policy, &plan, &write_errors, jiff::Timestamp::now());
    let old_conditions = policy
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    if policy.status.as_ref() != Some(&new_status) {
        apply::apply_status(&api, SPREAD_POLICY_MANAGER, &name, &new_status)
            .await
            .map_err(Error::Status)?;
        for (warning, reason, note) in status::events_for(&old_conditions, &new_status.conditions) {
            publish(st, policy, warning, reason, note).await;
        }
    }
    if let Some(e) = transient {
        return Err(e);
    }

    if deleting && plan.released {
        let f: Vec<String> = policy
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        set_finalizers(&api, policy, f).await?;
        tracing::info!(policy = %name, namespace = %ns, "released every workload; finalizer removed");
    }
    if retry_soon {
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    // Everything else wakes us through the watches: workload changes (also
    // rollouts finishing, which frees pacing budget), node changes, policy
    // changes.
    Ok(Action::await_change())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_failure_and_is_capped() {
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(2), Duration::from_secs(4));
        assert_eq!(backoff(50), Duration::from_secs(300));
    }
}
