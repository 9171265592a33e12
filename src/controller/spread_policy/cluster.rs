//! A ClusterSpreadPolicy reconcile: the SpreadPolicy steps (read → plan → write) run for each
//! namespace the policy covers or still has workloads in, as its stand-in [`Governor`], with
//! one `rollout.maxConcurrent` budget across them; then one status sums them up, per namespace.
//!
//! A manager of every namespace holds the finalizer `ballast.dev/spread-policy` and writes the
//! whole status. A manager of one namespace (`--watch-namespace`) takes part only when that
//! namespace is selected or still carries the policy's terms: it holds a finalizer of its own
//! (`<namespace>.ns.ballast.dev/spread-policy`, released once its namespace is), and replaces
//! only its namespace's entry of `status.namespaces`, keeping the others'; the conditions then
//! tell its namespace's story.

use super::distribution;
use super::perform::{self, Target};
use super::plan::{ANNOTATION_POLICY, Plan, rolling_out_for};
use super::select::{Governor, cluster_owner};
use super::sync::{Run, next_look, node_infos, run_namespace, set_finalizers, workloads_in};
use super::top::Top;
use super::{FINALIZER, State, error::Error, status};
use crate::api::cluster_spread_policy::{
    ClusterSpreadPolicy, ClusterSpreadPolicySpec, ClusterSpreadPolicyStatus,
    MAX_NAMESPACE_STATUSES, NamespaceStatus,
};
use crate::api::spread_policy::{
    DeletionPolicy, MAX_WORKLOAD_STATUSES, RolloutPacing, SpreadPolicy, SpreadPolicySpec,
    SpreadPolicyStatus,
};
use crate::k8s::lenient::{Invalid, Lenient};
use crate::k8s::{SPREAD_POLICY_MANAGER, apply};
use kube::{Api, Resource, ResourceExt, runtime::controller::Action};
use serde::Deserialize;
use std::time::Instant;

/// Namespace states in `status.namespaces`.
pub mod state {
    pub const APPLIED: &str = "Applied";
    pub const PENDING: &str = "Pending";
    pub const CONFLICTED: &str = "Conflicted";
    pub const REMOVING: &str = "Removing";
    pub const ERROR: &str = "Error";
}

/// This manager's finalizer on a ClusterSpreadPolicy (see the module docs).
pub fn finalizer_for(scope: Option<&str>) -> String {
    match scope {
        None => FINALIZER.to_string(),
        Some(ns) => format!("{ns}.ns.{FINALIZER}"),
    }
}

/// The plans of several namespaces as one, for the conditions and counts. Pure.
pub fn combine(plans: &[(String, &Plan)]) -> Plan {
    let mut out = Plan {
        released: true,
        ..Default::default()
    };
    let mut spread = distribution::Summary::default();
    let mut workloads = Top::new(MAX_WORKLOAD_STATUSES, super::plan::problems_first);
    for (ns, p) in plans {
        out.matched = out.matched.saturating_add(p.matched);
        out.applied = out.applied.saturating_add(p.applied);
        for w in &p.workloads {
            workloads.push(w.clone());
        }
        out.conflicts.extend(p.conflicts.iter().cloned());
        out.shortfalls
            .extend(p.shortfalls.iter().map(|m| format!("{ns}/{m}")));
        out.warnings
            .extend(p.warnings.iter().map(|m| format!("{ns}/{m}")));
        out.pending = out.pending.saturating_add(p.pending);
        if out.domains.is_empty() {
            out.domains = p.domains.clone();
        }
        out.waiting += p.waiting;
        out.in_flight += p.in_flight;
        out.writes.extend(p.writes.iter().cloned());
        out.invalid = out.invalid.clone().or_else(|| p.invalid.clone());
        out.released &= p.released;
        spread.merge(p.spread.clone());
        out.skewed.extend(p.skewed.iter().cloned());
        out.rebalancing |= p.rebalancing;
        out.rebalance_wait = match (out.rebalance_wait, p.rebalance_wait) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    out.workloads = workloads.into_vec();
    out.distribution = spread.distribution();
    out
}

/// One namespace's entry of `status.namespaces` (`None`: nothing to say there).
pub fn namespace_status(ns: &str, p: &Plan) -> Option<NamespaceStatus> {
    let conflicted = i32::try_from(p.conflicts.len()).unwrap_or(i32::MAX);
    let state = if p.invalid.is_some() {
        state::ERROR
    } else if p.matched == 0 && p.writes.is_empty() {
        return None;
    } else if p.matched == 0 {
        state::REMOVING
    } else if p.matched == conflicted {
        state::CONFLICTED
    } else if !p.writes.is_empty() || p.waiting > 0 || p.applied < p.matched - conflicted {
        state::PENDING
    } else {
        state::APPLIED
    };
    Some(NamespaceStatus {
        namespace: ns.to_string(),
        matched: p.matched,
        applied: p.applied,
        conflicted,
        infeasible_pods: p.pending,
        skewed: p.distribution.skewed,
        state: state.to_string(),
    })
}

/// The ClusterSpreadPolicy status: `base` (what a SpreadPolicy over all the namespaces would
/// say) with the namespaces of `mine`, and, for a manager of one namespace (`scope`), the other
/// managers' entries of `old`. Pure.
pub fn cluster_status(
    old: Option<&ClusterSpreadPolicyStatus>,
    base: SpreadPolicyStatus,
    mine: Vec<NamespaceStatus>,
    scope: Option<&str>,
) -> ClusterSpreadPolicyStatus {
    let mut namespaces = match scope {
        None => mine,
        Some(my_ns) => old
            .into_iter()
            .flat_map(|o| o.namespaces.iter())
            .filter(|n| n.namespace != my_ns)
            .cloned()
            .chain(mine)
            .collect(),
    };
    let sum = |f: &dyn Fn(&NamespaceStatus) -> i32| {
        namespaces.iter().map(f).fold(0i32, i32::saturating_add)
    };
    let (matched, applied) = match scope {
        None => (base.matched, base.applied),
        Some(_) => (Some(sum(&|n| n.matched)), Some(sum(&|n| n.applied))),
    };
    let selected =
        i32::try_from(namespaces.iter().filter(|n| n.matched > 0).count()).unwrap_or(i32::MAX);
    namespaces.sort_by(|a, b| {
        (a.state == state::APPLIED, &a.namespace).cmp(&(b.state == state::APPLIED, &b.namespace))
    });
    namespaces.truncate(MAX_NAMESPACE_STATUSES);
    ClusterSpreadPolicyStatus {
        observed_generation: base.observed_generation,
        conditions: base.conditions,
        selected_namespaces: Some(selected),
        matched,
        applied,
        domains: base.domains,
        namespaces,
        workloads: base.workloads,
        distribution: base.distribution,
    }
}

/// A stored ClusterSpreadPolicy this version cannot read: reported on itself; its deletion
/// still takes its terms out (with its `deletionPolicy` and `rollout` when they decode).
pub(super) async fn sync_invalid(
    obj: &Lenient<ClusterSpreadPolicy>,
    inv: &Invalid,
    st: &State,
) -> Result<Action, Error> {
    if obj.meta().deletion_timestamp.is_some() {
        let spec = inv.raw.get("spec");
        let field = |name: &str| spec.and_then(|s| s.get(name));
        let stand_in = ClusterSpreadPolicy {
            metadata: inv.metadata.clone(),
            spec: ClusterSpreadPolicySpec {
                namespace_selector: Default::default(),
                policy: SpreadPolicySpec {
                    deletion_policy: field("deletionPolicy")
                        .and_then(|v| DeletionPolicy::deserialize(v).ok())
                        .unwrap_or_default(),
                    rollout: field("rollout")
                        .and_then(|v| RolloutPacing::deserialize(v).ok())
                        .unwrap_or_default(),
                    ..Default::default()
                },
            },
            status: None,
        };
        return sync_cluster(obj, &stand_in, false, st).await;
    }
    crate::controller::report_invalid_in::<Lenient<ClusterSpreadPolicy>>(
        Api::all(st.ctx.client.clone()),
        &st.recorder,
        SPREAD_POLICY_MANAGER,
        inv,
    )
    .await
    .map_err(Error::ReportInvalid)?;
    Ok(Action::await_change())
}

/// Reconciles ClusterSpreadPolicy `cp` (the object `obj` as read, or a stand-in for one that
/// cannot be read, whose status is then not written).
pub(super) async fn sync_cluster(
    obj: &Lenient<ClusterSpreadPolicy>,
    cp: &ClusterSpreadPolicy,
    readable: bool,
    st: &State,
) -> Result<Action, Error> {
    let name = cp.name_any();
    let owner = cluster_owner(&name);
    let scope = st.ctx.namespace.as_deref();
    let fin = finalizer_for(scope);
    let api: Api<Lenient<ClusterSpreadPolicy>> = Api::all(st.ctx.client.clone());
    let g = Governor::cluster(cp, st.namespace_labels());
    let deleting = cp.metadata.deletion_timestamp.is_some();

    // The namespaces in play: those it covers, and those whose workloads carry its terms or
    // still roll out a write of it.
    let namespaces = st.workloads.namespaces();
    let now = jiff::Timestamp::now();
    let mut in_play: Vec<(String, usize)> = Vec::new();
    for ns in namespaces {
        let mut ws = workloads_in(st, &ns);
        let seen = st
            .tracker
            .lock()
            .expect("not poisoned")
            .observe(&ns, &mut ws, now);
        let carries = ws.iter().any(|w| {
            w.annotations.get(ANNOTATION_POLICY) == Some(owner.as_str())
                || seen.rolling_for(w) == Some(owner.as_str())
        });
        if g.covers(&ns) || carries {
            let rolling = ws
                .iter()
                .filter(|w| rolling_out_for(&owner, w, &seen))
                .count();
            in_play.push((ns, rolling));
        }
    }

    let has_fin = cp.finalizers().contains(&fin);
    if deleting && !has_fin {
        return Ok(Action::await_change());
    }
    if !deleting && !has_fin {
        // A manager of one namespace takes part only where it has something to do.
        if scope.is_some() && in_play.is_empty() {
            return Ok(Action::await_change());
        }
        let mut f = cp.finalizers().to_vec();
        f.push(fin);
        set_finalizers(&api, obj, f).await?;
        return Ok(Action::await_change());
    }

    // One maxConcurrent budget over all namespaces: what rolls out elsewhere, and what the
    // namespaces planned before this one wrote, count.
    let nodes = node_infos(st);
    let rolling: usize = in_play.iter().map(|(_, r)| r).sum();
    let mut used = 0;
    let mut runs: Vec<(String, Run)> = Vec::new();
    for (ns, rolling_here) in &in_play {
        let target = Target {
            ns: ns.clone(),
            name: owner.clone(),
            reference: cp.object_ref(&()),
        };
        let run = run_namespace(st, &g, &target, &nodes, rolling - rolling_here + used).await;
        used += run.plan.budget_used;
        runs.push((ns.clone(), run));
    }
    let plans: Vec<(String, &Plan)> = runs.iter().map(|(ns, r)| (ns.clone(), &r.plan)).collect();
    let combined = combine(&plans);
    if !deleting {
        st.ctx
            .metrics
            .set_spread_infeasible("", &owner, Some(combined.pending));
    }

    let mut status_due = None;
    if readable {
        let old = cp.status.as_ref();
        let stand_in = SpreadPolicy {
            metadata: cp.metadata.clone(),
            spec: cp.spec.policy.clone(),
            status: Some(SpreadPolicyStatus {
                conditions: old.map(|o| o.conditions.clone()).unwrap_or_default(),
                ..Default::default()
            }),
        };
        let rejected: Vec<(String, String)> = runs
            .iter()
            .flat_map(|(ns, r)| {
                r.outcome
                    .rejected
                    .iter()
                    .map(move |(w, m)| (format!("{ns}/{w}"), m.clone()))
            })
            .collect();
        let base = status::build(&stand_in, &combined, &rejected, now);
        let mine = plans
            .iter()
            .filter_map(|(ns, p)| namespace_status(ns, p))
            .collect();
        let new_status = cluster_status(old, base, mine, scope);
        let key = format!("cluster/{name}");
        if old != Some(&new_status) {
            let counts_only = old.is_some_and(|o| {
                ClusterSpreadPolicyStatus {
                    distribution: None,
                    ..o.clone()
                } == ClusterSpreadPolicyStatus {
                    distribution: None,
                    ..new_status.clone()
                }
            });
            status_due = counts_only
                .then(|| st.pacer.wait(&key, Instant::now()))
                .flatten();
            let cached_rv = cp.metadata.resource_version.as_deref();
            if status_due.is_none() && !st.pacer.already(&key, cached_rv, &new_status) {
                let api: Api<ClusterSpreadPolicy> = Api::all(st.ctx.client.clone());
                let written = apply::apply_status(&api, SPREAD_POLICY_MANAGER, &name, &new_status)
                    .await
                    .map_err(Error::Status)?;
                st.pacer.wrote(
                    &key,
                    Instant::now(),
                    written.metadata.resource_version.as_deref(),
                    &new_status,
                );
                let old_conditions = old.map(|o| o.conditions.clone()).unwrap_or_default();
                for (warning, reason, note) in
                    status::events_for(&old_conditions, &new_status.conditions)
                {
                    perform::publish(st, &cp.object_ref(&()), warning, reason, note).await;
                }
            }
        }
    }
    drop(plans);
    let mut next_bound = None;
    for (_, r) in runs.iter_mut() {
        if let Some(e) = r.outcome.transient.take() {
            return Err(e);
        }
        next_bound = match (next_bound, r.next_bound) {
            (Some(a), Some(b)) => Some(std::cmp::min(a, b)),
            (a, b) => a.or(b),
        };
    }
    if deleting && combined.released {
        // A manager of every namespace also lets go of the finalizers of namespaces that are
        // gone (their managers with them), so that the deletion finishes.
        let existing = st.namespace_labels();
        let suffix = format!(".ns.{FINALIZER}");
        let stale = |f: &str| {
            scope.is_none()
                && f.strip_suffix(suffix.as_str())
                    .is_some_and(|ns| !existing.contains_key(ns))
        };
        let f: Vec<String> = cp
            .finalizers()
            .iter()
            .filter(|f| **f != fin && !stale(f))
            .cloned()
            .collect();
        set_finalizers(&api, obj, f).await?;
        st.ctx.metrics.set_spread_infeasible("", &owner, None);
        tracing::info!(policy = %owner, "released every workload; finalizer removed");
        return Ok(Action::await_change());
    }
    let outcome = perform::Performed {
        retry_soon: runs.iter().any(|(_, r)| r.outcome.retry_soon),
        throttled: runs.iter().filter_map(|(_, r)| r.outcome.throttled).max(),
        ..Default::default()
    };
    Ok(
        match next_look(&outcome, next_bound, combined.rebalance_wait, status_due) {
            Some(d) => Action::requeue(d),
            None => Action::await_change(),
        },
    )
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
