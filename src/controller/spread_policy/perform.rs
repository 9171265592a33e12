//! Act: sends a plan's writes — to the workloads (at most [`WRITE_CONCURRENCY`] at once), the
//! deletion costs of their pods, and the evictions that rebalance them — maps each HTTP outcome
//! to what the reconcile does next, remembers template changes for pacing and evictions for
//! `minInterval`, and publishes Events: one per outcome for a batch of workloads, one per
//! eviction.

use super::workload::Workload;
use super::{
    CONTROLLER, State, THROTTLE_RETRY, WRITE_CONCURRENCY, error::Error, plan, rebalance, status,
    write,
};
use crate::api::spread_policy::WorkloadKind;
use futures::{StreamExt, stream::FuturesUnordered};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api,
    api::{DeleteParams, EvictParams, PostParams, Preconditions},
    runtime::events::{Event, EventType},
};
use std::{
    collections::HashMap,
    sync::Arc,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

/// Whose writes these are: the namespace they go to, the policy's name as workloads' owner
/// annotation and the tracker know it, and the object its Events are about.
pub(super) struct Target {
    pub ns: String,
    pub name: String,
    pub reference: ObjectReference,
}

/// What the writes of one reconcile came to.
#[derive(Default)]
pub(super) struct Performed {
    /// `(workload, message)` of writes the API server refused.
    pub rejected: Vec<(String, String)>,
    /// A write met a newer workload than the cache had: merge again soon.
    pub retry_soon: bool,
    /// The API server throttled us (429 after kube's own retries): the writes not made yet
    /// wait this long, and nothing has failed.
    pub throttled: Option<Duration>,
    pub transient: Option<Error>,
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
pub(super) async fn perform(
    st: &State,
    target: &Target,
    plan: &plan::Plan,
    workloads: &[Arc<Workload>],
) -> Performed {
    let (ns, name) = (target.ns.clone(), target.name.clone());
    let live: HashMap<(WorkloadKind, &str), &Workload> = workloads
        .iter()
        .map(|w| ((w.kind, w.name.as_str()), &**w))
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
                tracing::info!(policy = %name, namespace = %ns, workload = %target, outcome, template_changed = w.template_changed, "wrote workload");
                if let (Some(g), true) = (done.generation, w.template_changed) {
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
                    applied.push((target, w.ours().len()));
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
        publish(
            st,
            &target.reference,
            false,
            status::reason::TERMS_APPLIED,
            note,
        )
        .await;
    } else if !applied.is_empty() {
        let targets: Vec<String> = applied.into_iter().map(|(t, _)| t).collect();
        let note = status::written_note(&targets, "", "now carry this policy's terms");
        publish(
            st,
            &target.reference,
            false,
            status::reason::TERMS_APPLIED,
            note,
        )
        .await;
    }
    if !removed.is_empty() {
        let note = status::written_note(
            &removed,
            "removed this policy's terms",
            "had this policy's terms removed",
        );
        publish(
            st,
            &target.reference,
            false,
            status::reason::TERMS_REMOVED,
            note,
        )
        .await;
    }
    out
}

pub(super) fn w_display(kind: WorkloadKind, name: &str) -> String {
    format!("{kind:?}/{name}")
}

pub(super) async fn publish(
    st: &State,
    reference: &ObjectReference,
    warning: bool,
    reason: &str,
    note: String,
) {
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
    if let Err(e) = st.recorder.publish(&ev, reference).await {
        tracing::warn!(error = %e, reason, "could not publish event");
    }
}

async fn send_cost<'a>(
    st: &State,
    ns: &str,
    w: &'a plan::PodWrite,
) -> (&'a plan::PodWrite, kube::Result<()>) {
    let body = write::cost_body(ns, &w.cost);
    (
        w,
        write::write_pod(&st.ctx.client, ns, &w.cost.pod, &body).await,
    )
}

/// Sends the plan's pod writes (deletion costs), at most [`WRITE_CONCURRENCY`] at once. A pod
/// gone meanwhile needs nothing; a refused write is logged and counted (the next change of the
/// pod plans it again); a conflict or a 429 looks again soon.
pub(super) async fn perform_pods(
    st: &State,
    ns: &str,
    policy: &str,
    writes: &[plan::PodWrite],
) -> Performed {
    let mut out = Performed::default();
    let mut jobs = writes.iter();
    let mut running = FuturesUnordered::new();
    for w in jobs.by_ref().take(WRITE_CONCURRENCY) {
        running.push(send_cost(st, ns, w));
    }
    let (mut set, mut removed) = (0usize, 0usize);
    while let Some((w, result)) = running.next().await {
        if out.throttled.is_none()
            && let Some(next) = jobs.next()
        {
            running.push(send_cost(st, ns, next));
        }
        match result {
            Ok(()) => {
                let outcome = if w.cost.cost.is_some() {
                    "applied"
                } else {
                    "removed"
                };
                st.ctx.metrics.count_write(CONTROLLER, "Pod", outcome);
                if w.cost.cost.is_some() {
                    set += 1;
                } else {
                    removed += 1;
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                st.ctx.metrics.count_write(CONTROLLER, "Pod", "gone");
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                st.ctx.metrics.count_write(CONTROLLER, "Pod", "conflict");
                out.retry_soon = true;
            }
            Err(kube::Error::Api(s)) if s.code == 429 => {
                st.ctx.metrics.count_write(CONTROLLER, "Pod", "throttled");
                let delay = write::throttle_delay(&s, THROTTLE_RETRY);
                out.throttled = Some(out.throttled.map_or(delay, |d| d.max(delay)));
            }
            Err(kube::Error::Api(s)) if s.code == 422 || s.code == 400 || s.code == 403 => {
                st.ctx.metrics.count_write(CONTROLLER, "Pod", "rejected");
                tracing::warn!(policy, namespace = ns, pod = %w.cost.pod, error = %s.message, "deletion cost write rejected");
            }
            Err(e) => {
                st.ctx.metrics.count_write(CONTROLLER, "Pod", "error");
                out.transient = Some(Error::PodWrite {
                    pod: w.cost.pod.clone(),
                    source: e,
                });
            }
        }
    }
    if set + removed > 0 {
        tracing::info!(
            policy,
            namespace = ns,
            set,
            removed,
            "wrote pod deletion costs"
        );
    }
    out
}

/// How soon an eviction a PodDisruptionBudget refused is tried again (a pod becoming ready,
/// which is what frees the budget, wakes the policy sooner).
const EVICTION_RETRY: Duration = Duration::from_secs(10);

/// Evicts the plan's pods through the Eviction API (one by one: a batch is at most
/// `maxUnavailable`), each pinned by its uid. The Eviction API refuses (429) an eviction its
/// PodDisruptionBudget does not allow: the rest of the batch waits for the next try. An Event
/// names each eviction and why.
pub(super) async fn evict(
    st: &State,
    target: &Target,
    evictions: &[(WorkloadKind, String, rebalance::Eviction)],
) -> Performed {
    let ns = target.ns.clone();
    // Sent once: a 429 here is the budget's answer, not throttling to wait out.
    let api: Api<Pod> = Api::namespaced(st.ctx.once.clone(), &ns);
    let mut out = Performed::default();
    for (kind, workload, e) in evictions {
        let params = EvictParams {
            delete_options: Some(DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(e.uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            }),
            post_options: PostParams::default(),
        };
        match api.evict(&e.pod, &params).await {
            Ok(_) => {
                st.ctx.metrics.count_write(CONTROLLER, "Pod", "evicted");
                st.evicted.lock().expect("not poisoned").insert(
                    (ns.clone(), *kind, workload.clone()),
                    jiff::Timestamp::now(),
                );
                tracing::info!(policy = %target.name, namespace = %ns, pod = %e.pod, why = %e.why, "evicted to rebalance");
                publish(
                    st,
                    &target.reference,
                    false,
                    status::reason::POD_EVICTED,
                    e.why.clone(),
                )
                .await;
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {
                st.ctx.metrics.count_write(CONTROLLER, "Pod", "gone");
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                st.ctx.metrics.count_write(CONTROLLER, "Pod", "conflict");
                out.retry_soon = true;
            }
            Err(kube::Error::Api(s)) if s.code == 429 => {
                st.ctx.metrics.count_write(CONTROLLER, "Pod", "blocked");
                let note = format!(
                    "{kind:?}/{workload}: the eviction of pod {} was refused: {}",
                    e.pod, s.message
                );
                publish(
                    st,
                    &target.reference,
                    false,
                    status::reason::EVICTION_BLOCKED,
                    note,
                )
                .await;
                out.throttled = Some(EVICTION_RETRY);
                break;
            }
            Err(e2) => {
                st.ctx.metrics.count_write(CONTROLLER, "Pod", "error");
                out.transient = Some(Error::PodWrite {
                    pod: e.pod.clone(),
                    source: e2,
                });
                break;
            }
        }
    }
    out
}
