//! The body of a SpreadPolicy reconcile, step by step: the finalizer, read (the caches), decide
//! ([`plan`]), write ([`perform`]), record ([`status`]: written when it changed, pod counts at
//! most every few seconds), and what wakes the policy next.

use super::feasibility::NodeInfo;
use super::plan::Inputs;
use super::select::Governor;
use super::workload::Workload;
use super::{FINALIZER, State, error::Error, perform, plan, status};
use crate::api::spread_policy::{
    DeletionPolicy, RolloutPacing, SpreadPolicy, SpreadPolicySpec, WorkloadKind,
};
use crate::controller::reconcile::key;
use crate::k8s::lenient::{Invalid, Lenient};
use crate::k8s::{SPREAD_POLICY_MANAGER, apply, finalizer};
use kube::{Api, Resource, ResourceExt, runtime::controller::Action};
use serde::Deserialize;
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

/// Sets `obj`'s finalizers through `api` (a stale object is the stale outcome).
pub(super) async fn set_finalizers<K>(
    api: &Api<Lenient<K>>,
    obj: &Lenient<K>,
    finalizers: Vec<String>,
) -> Result<(), Error>
where
    Lenient<K>: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    finalizer::set(api, obj, finalizers)
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
pub(super) async fn sync_invalid(
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
    crate::controller::report_invalid::<Lenient<SpreadPolicy>>(
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
pub(super) fn workloads_in(st: &State, ns: &str) -> Vec<Arc<Workload>> {
    st.workloads.in_namespace(ns)
}

/// The policies that apply in `ns`: its SpreadPolicies and every ClusterSpreadPolicy, with
/// `me` (as just read) in place of its cached self.
pub(super) fn governors_in(st: &State, ns: &str, me: &Governor) -> Vec<Arc<Governor>> {
    let namespaces = st.namespace_labels();
    let me_name = me.name_any();
    let mut out: Vec<Arc<Governor>> = st
        .policies
        .state()
        .iter()
        .filter_map(|p| p.ok())
        .filter(|p| p.namespace().as_deref() == Some(ns))
        .map(|p| Arc::new(Governor::from(p.clone())))
        .chain(
            st.cluster_policies
                .state()
                .iter()
                .filter_map(|p| p.ok())
                .map(|p| Arc::new(Governor::cluster(p, namespaces.clone()))),
        )
        .filter(|g| !(g.name_any() == me_name && g.is_cluster() == me.is_cluster()))
        .collect();
    out.push(Arc::new(me.clone()));
    out
}

pub(super) fn node_infos(st: &State) -> Vec<NodeInfo> {
    st.nodes
        .state()
        .iter()
        .map(|n| NodeInfo::from_node(n))
        .collect()
}

/// One namespace's share of a reconcile.
pub(super) struct Run {
    pub plan: plan::Plan,
    pub outcome: perform::Performed,
    /// The soonest a rollout under way here stops holding up pacing.
    pub next_bound: Option<Duration>,
}

/// Reads, plans and acts for `g` in `target.ns`: the workload writes, the pods' deletion costs
/// and the evictions.
pub(super) async fn run_namespace(
    st: &State,
    g: &Governor,
    target: &perform::Target,
    nodes: &[NodeInfo],
    budget_used_elsewhere: usize,
) -> Run {
    let ns = &target.ns;
    let mut workloads = workloads_in(st, ns);
    let seen = st.tracker.lock().expect("not poisoned").observe(
        ns,
        &mut workloads,
        jiff::Timestamp::now(),
    );
    let policies = governors_in(st, ns, g);
    let pods = st
        .pods
        .snapshot(ns, workloads.iter().map(|w| (w.kind, w.name.as_str())));
    let evicted: HashMap<(WorkloadKind, String), jiff::Timestamp> = st
        .evicted
        .lock()
        .expect("not poisoned")
        .iter()
        .filter(|((n, ..), _)| n == ns)
        .map(|((_, kind, w), t)| ((*kind, w.clone()), *t))
        .collect();
    let plan = plan::plan(&Inputs {
        policy: g,
        policies: &policies,
        workloads: &workloads,
        budget_used_elsewhere,
        nodes,
        pods: &pods,
        tracked: &seen,
        evicted: &evicted,
        now: jiff::Timestamp::now(),
    });
    let mut outcome = perform::perform(st, target, &plan, &workloads).await;
    for more in [
        perform::perform_pods(st, ns, &target.name, &plan.pod_writes).await,
        perform::evict(st, target, &plan.evictions).await,
    ] {
        outcome.retry_soon |= more.retry_soon;
        outcome.throttled = outcome.throttled.max(more.throttled);
        outcome.transient = outcome.transient.or(more.transient);
    }
    Run {
        next_bound: seen.next_bound.filter(|_| plan.waiting > 0),
        plan,
        outcome,
    }
}

/// When to look again after a reconcile that wrote what it could: the soonest of a throttled
/// write, a retry, a rollout's bound, the next rebalancing batch and a status write held back;
/// `None`: when a watch says something changed.
pub(super) fn next_look(
    outcome: &perform::Performed,
    next_bound: Option<Duration>,
    rebalance_wait: Option<Duration>,
    status_due: Option<Duration>,
) -> Option<Duration> {
    [
        outcome.throttled,
        outcome.retry_soon.then_some(Duration::from_secs(1)),
        // A rollout that stops progressing holds up pacing only until its bound.
        next_bound.map(|b| b + Duration::from_secs(1)),
        rebalance_wait.map(|w| w + Duration::from_millis(100)),
        status_due,
    ]
    .into_iter()
    .flatten()
    .min()
}

fn api_of(st: &State, obj: &Lenient<SpreadPolicy>) -> Api<Lenient<SpreadPolicy>> {
    Api::namespaced(st.ctx.client.clone(), &obj.namespace().unwrap_or_default())
}

/// Reconciles `policy` (the object `obj` as read, or a stand-in for one that
/// cannot be read, whose status is then not written).
pub(super) async fn sync(
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
        set_finalizers(&api_of(st, obj), obj, f).await?;
        // The update wakes us again with the finalizer in place.
        return Ok(Action::await_change());
    }

    let g = Governor::from(policy.clone());
    let target = perform::Target {
        ns: ns.clone(),
        name: name.clone(),
        reference: policy.object_ref(&()),
    };
    let Run {
        plan,
        outcome,
        next_bound,
    } = run_namespace(st, &g, &target, &node_infos(st), 0).await;
    if !deleting {
        st.ctx
            .metrics
            .set_spread_infeasible(&ns, &name, Some(plan.pending));
    }

    // A status that only moves pod counts waits for the pacer; this is when to look again.
    let mut status_due: Option<Duration> = None;
    if readable {
        let new_status = status::build(policy, &plan, &outcome.rejected, jiff::Timestamp::now());
        let old_conditions = policy
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let policy_key = key(policy);
        if policy.status.as_ref() != Some(&new_status) {
            status_due = policy
                .status
                .as_ref()
                .filter(|old| status::only_distribution_changed(old, &new_status))
                .and_then(|_| st.pacer.wait(&policy_key, Instant::now()));
        }
        let cached_rv = policy.metadata.resource_version.as_deref();
        if policy.status.as_ref() != Some(&new_status)
            && status_due.is_none()
            && !st.pacer.already(&policy_key, cached_rv, &new_status)
        {
            let api: Api<SpreadPolicy> = Api::namespaced(st.ctx.client.clone(), &ns);
            let written = apply::apply_status(&api, SPREAD_POLICY_MANAGER, &name, &new_status)
                .await
                .map_err(Error::Status)?;
            st.pacer.wrote(
                &policy_key,
                Instant::now(),
                written.metadata.resource_version.as_deref(),
                &new_status,
            );
            for (warning, reason, note) in
                status::events_for(&old_conditions, &new_status.conditions)
            {
                perform::publish(st, &target.reference, warning, reason, note).await;
            }
        }
    }
    if deleting && plan.released {
        set_finalizers(&api_of(st, obj), obj, finalizer::without(policy, FINALIZER)).await?;
        st.ctx.metrics.set_spread_infeasible(&ns, &name, None);
        tracing::info!(policy = %name, namespace = %ns, "released every workload; finalizer removed");
        return Ok(Action::await_change());
    }
    if let Some(d) = next_look(&outcome, next_bound, plan.rebalance_wait, status_due) {
        return Ok(Action::requeue(d));
    }
    // Everything else wakes us through the watches: workload changes (also
    // rollouts finishing, which frees pacing budget), pods, node changes,
    // policy changes.
    Ok(Action::await_change())
}
