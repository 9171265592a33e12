//! Decide: for one policy, from the cached workloads, the other policies and
//! the nodes, which workloads to write (and with what), which to leave, and
//! everything status will say. Pure: no API calls, so this is where most of
//! the controller's tests live.

use super::distribution::{self, Nodes};
use super::feasibility::{NodeInfo, count_domains, topology_keys};
use super::merge::{Merged, merge};
use super::placement::assess;
use super::pods::PodView;
use super::rebalance::{self, Eviction};
use super::scale_down::{CostWrite, cost_writes};
use super::select::{Governor, precedence, selects, validate_selector, winner};
use super::terms::{Terms, desired_terms, duplicate_constraints};
use super::top::Top;
use super::tracker::Seen;
use super::workload::{Rollout, Workload};
use crate::api::spread_distribution::SpreadDistribution;
use crate::api::spread_policy::{
    DeletionPolicy, MAX_WORKLOAD_STATUSES, ScaleDown, SpreadPolicy, TopologyDomains, WorkloadKind,
    WorkloadStatus,
};
use kube::ResourceExt;
use std::collections::BTreeSet;
use std::sync::Arc;

pub use super::pods::PodSnapshot;

/// Names the policy whose terms a workload carries (on the workload's metadata).
pub const ANNOTATION_POLICY: &str = "ballast.dev/spread-policy";
/// The record of exactly which terms ballast injected (JSON of [`Terms`]), on
/// the pod template's metadata: a template put back by `kubectl rollout undo`
/// or a RolloutStrategy rollback brings back the record of its own terms, so
/// record and terms never drift apart.
pub const ANNOTATION_TERMS: &str = "ballast.dev/spread-terms";

/// Per-workload states shown in `status.workloads`.
pub mod state {
    pub const APPLIED: &str = "Applied";
    pub const PENDING: &str = "Pending";
    pub const WAITING: &str = "WaitingForRollout";
    pub const CONFLICTED: &str = "Conflicted";
    pub const REMOVING: &str = "Removing";
    pub const HANDING_OVER: &str = "HandingOver";
    pub const SUSPENDED: &str = "Suspended";
    pub const ERROR: &str = "Error";
}

/// The record of what ballast injected into `w`'s template, if any.
pub fn recorded_terms(w: &Workload) -> Terms {
    w.record
        .as_deref()
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

/// The record of `ours` as it is written into the template.
pub fn record_text(ours: &Terms) -> String {
    serde_json::to_string(ours).expect("terms serialize")
}

/// Whether the template's record says exactly `ours`, whose record is `text` (no record means
/// none).
fn record_matches(record: Option<&str>, text: &str, ours: &Terms) -> bool {
    match record {
        None => ours.is_empty(),
        Some(r) => r == text,
    }
}

/// One write to one workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    pub kind: WorkloadKind,
    pub name: String,
    /// The record the template will carry: the JSON of the terms that will be ours (none for
    /// a removal). Neither the merged lists nor the terms themselves are kept: with thousands
    /// of writes in one plan they were the largest part of the manager's peak memory (a term
    /// is about 1 KiB of k8s-openapi structures, its JSON a fifth of that), and
    /// [`Write::merged`] makes them again from the same view when written.
    pub record: String,
    /// Whether the write changes the pod template (which rolls the pods out).
    pub template_changed: bool,
    /// The policy that the record will name; `None` removes the record.
    pub owner: Option<String>,
    /// The resourceVersion the merge was computed from (a precondition).
    pub resource_version: Option<String>,
}

impl Write {
    pub fn is_removal(&self) -> bool {
        self.owner.is_none()
    }

    /// The lists to write into `live`, the view this write was planned from: its own lists
    /// without the recorded terms, then ours. The same as the plan's merge, since ours are the
    /// desired terms that merge kept.
    pub fn merged(&self, live: &Workload) -> Merged {
        merge(live, &recorded_terms(live), &self.ours())
    }

    /// The terms that will be ours, read back from [`Write::record`].
    pub fn ours(&self) -> Terms {
        serde_json::from_str(&self.record).expect("a record this controller wrote")
    }
}

/// One write to one pod of a workload.
#[derive(Clone, Debug, PartialEq)]
pub struct PodWrite {
    pub kind: WorkloadKind,
    pub workload: String,
    pub cost: CostWrite,
}

/// Everything the controller does and says for one policy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub writes: Vec<Write>,
    pub matched: i32,
    pub applied: i32,
    pub workloads: Vec<WorkloadStatus>,
    pub conflicts: Vec<String>,
    pub shortfalls: Vec<String>,
    /// Pods the nodes cannot place under a `Required` spread: per workload the largest of its
    /// shortfalls, summed over the workloads.
    pub pending: i64,
    pub warnings: Vec<String>,
    pub domains: Vec<TopologyDomains>,
    /// Workloads that need a template change but wait for the pacing budget.
    pub waiting: usize,
    /// Workloads of this policy rolling out right now.
    pub in_flight: usize,
    /// Why the spec cannot be acted on (it passed CRD validation).
    pub invalid: Option<String>,
    /// While deleting: no workload carries this policy's terms any more.
    pub released: bool,
    /// Where the governed workloads' pods run.
    pub distribution: SpreadDistribution,
    /// One message per skewed workload (see [`distribution::skew_message`]).
    pub skewed: Vec<String>,
    /// Deletion costs to write (`scaleDown`), or to take away.
    pub pod_writes: Vec<PodWrite>,
    /// Pods to evict now (`rebalance`), by workload.
    pub evictions: Vec<(WorkloadKind, String, Eviction)>,
    /// Some governed workload is off its spread where rebalancing acts (now or later).
    pub rebalancing: bool,
    /// How long until the next rebalancing batch may go, when one waits for `minInterval`.
    pub rebalance_wait: Option<std::time::Duration>,
    /// Template changes this plan makes that start a rollout (they take from the budget).
    pub budget_used: usize,
    /// The governed workloads' distributions summed up (what `distribution` says; a
    /// ClusterSpreadPolicy adds them up over its namespaces).
    pub spread: distribution::Summary,
}

/// How long after its last eviction a workload still counts as being rebalanced, beyond
/// `minInterval` (its replacements being placed and becoming ready).
pub const REBALANCE_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// What the plan needs to know.
pub struct Inputs<'a> {
    pub policy: &'a Governor,
    /// Every policy that applies in the workloads' namespace (including itself).
    pub policies: &'a [std::sync::Arc<Governor>],
    /// Deployments and StatefulSets of one namespace.
    pub workloads: &'a [Arc<Workload>],
    /// For a ClusterSpreadPolicy planned namespace by namespace: what other namespaces take
    /// of its `rollout.maxConcurrent` (rolling out there, or written earlier this reconcile).
    pub budget_used_elsewhere: usize,
    pub nodes: &'a [NodeInfo],
    /// The pods of those workloads.
    pub pods: &'a PodSnapshot,
    /// What the tracker knows of our writes: those the cache has not caught up with, and the
    /// policy each workload still rolling one out rolls it out for.
    pub tracked: &'a Seen,
    /// When each workload's last rebalancing batch went.
    pub evicted: &'a std::collections::HashMap<(WorkloadKind, String), jiff::Timestamp>,
    pub now: jiff::Timestamp,
}

fn invalid_reason(policy: &SpreadPolicy) -> Option<String> {
    if let Some(m) = duplicate_constraints(&policy.spec) {
        return Some(m);
    }
    if let Err(e) = validate_selector(&policy.spec.selector) {
        return Some(format!("spec.selector: {e}"));
    }
    for (field, terms) in [
        ("colocate", &policy.spec.colocate),
        ("separate", &policy.spec.separate),
    ] {
        for (i, t) in terms.iter().enumerate() {
            if let Err(e) = validate_selector(&t.label_selector) {
                return Some(format!("spec.{field}[{i}].labelSelector: {e}"));
            }
        }
    }
    None
}

/// Whether `w` is rolling out because of policy `name`: carrying its terms, or still rolling
/// out a write of ours that took them out.
pub fn rolling_out_for(name: &str, w: &Workload, tracked: &Seen) -> bool {
    let ours =
        w.annotations.get(ANNOTATION_POLICY) == Some(name) || tracked.rolling_for(w) == Some(name);
    !w.deleting
        && ours
        && (w.rollout == Rollout::InProgress
            || tracked.unobserved.contains(&(w.kind, w.name.clone())))
}

/// The deletion costs of the workloads this policy answers for: those it governs (set with
/// `scaleDown: Balanced`, taken away without), and those nobody governs any more whose pods
/// still carry ballast's costs — its own former workloads, and, for the first policy of the
/// namespace by precedence (or a policy being deleted when no other is left), any such
/// workload, so that costs never outlive every policy.
fn deletion_costs(inp: &Inputs, nodes: &Nodes, invalid: bool) -> Vec<PodWrite> {
    let policy = inp.policy;
    let name = policy.name_any();
    let deleting = policy.metadata.deletion_timestamp.is_some();
    let key = policy.spec.spread.first().map(|s| s.topology_key.as_str());
    let live = inp
        .policies
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .min_by(|a, b| precedence(a, b));
    let janitor = live.map_or(deleting, |first| first.name_any() == name);
    let no_pods: Arc<[PodView]> = Arc::new([]);
    let mut out = Vec::new();
    for w in inp.workloads.iter().filter(|w| !w.deleting) {
        let ours = w.annotations.get(ANNOTATION_POLICY) == Some(name.as_str());
        let balanced = match winner(inp.policies, w) {
            Some(g) if g.name_any() == name && !deleting && !invalid => {
                policy.spec.scale_down == ScaleDown::Balanced
            }
            Some(_) => continue,
            None if ours || janitor => false,
            None => continue,
        };
        let pods = inp.pods.get(&(w.kind, w.name.clone())).unwrap_or(&no_pods);
        out.extend(
            cost_writes(key, balanced, w, pods, nodes)
                .into_iter()
                .map(|cost| PodWrite {
                    kind: w.kind,
                    workload: w.name.clone(),
                    cost,
                }),
        );
    }
    out
}

pub fn plan(inp: &Inputs) -> Plan {
    let policy = inp.policy;
    let name = policy.name_any();
    let deleting = policy.metadata.deletion_timestamp.is_some();
    let mut out = Plan::default();

    for key in topology_keys(&policy.spec) {
        let c = count_domains(&key, inp.nodes.iter().filter(|n| n.schedulable_with(&[])));
        out.domains.push(TopologyDomains {
            topology_key: c.topology_key,
            domains: c.domains,
            schedulable_nodes: c.nodes,
            nodes_missing_label: c.nodes_missing_label,
        });
    }
    out.invalid = invalid_reason(policy);

    // A workload being deleted is written nothing and holds up nothing.
    let ours =
        |w: &Workload| !w.deleting && w.annotations.get(ANNOTATION_POLICY) == Some(name.as_str());
    let in_flight = |w: &Workload| rolling_out_for(&name, w, inp.tracked);
    out.in_flight = inp.workloads.iter().filter(|w| in_flight(w)).count();
    let max = policy.spec.rollout.max_concurrent.max(0) as usize;
    let mut budget = if max == 0 {
        usize::MAX
    } else {
        max.saturating_sub(out.in_flight)
            .saturating_sub(inp.budget_used_elsewhere)
    };

    let mut workloads: Vec<&Workload> = inp.workloads.iter().map(|w| &**w).collect();
    workloads.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    let mut statuses = Top::new(MAX_WORKLOAD_STATUSES, problems_first);
    let mut warned = BTreeSet::new();
    let nodes: Nodes = inp.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let mut spread = distribution::Summary::default();
    let no_pods: Arc<[PodView]> = Arc::new([]);

    for w in workloads.into_iter().filter(|w| !w.deleting) {
        let selected = !deleting && selects(policy, w);
        let governing = winner(inp.policies, w);
        let is_winner = selected && governing.is_some_and(|g| g.name_any() == name);
        let status = |state: &str, message: Option<String>| WorkloadStatus {
            kind: w.kind,
            namespace: policy.is_cluster().then(|| w.namespace.clone()),
            name: w.name.clone(),
            state: state.to_string(),
            message,
        };
        if selected {
            out.matched = out.matched.saturating_add(1);
        }

        if selected && !is_winner {
            let g = governing.expect("a selected workload has a winner");
            let msg = format!(
                "{}{} is governed by {} (priority {})",
                if policy.is_cluster() {
                    format!("{}/", w.namespace)
                } else {
                    String::new()
                },
                w.display(),
                g.display(),
                g.spec.priority
            );
            out.conflicts.push(msg.clone());
            statuses.push(status(state::CONFLICTED, Some(msg)));
            continue;
        }

        let (desired, owner) = if is_winner {
            if out.invalid.is_some() {
                statuses.push(status(state::ERROR, out.invalid.clone()));
                continue;
            }
            (
                desired_terms(&policy.spec, w.kind, &w.selector.to_label_selector()),
                Some(name.clone()),
            )
        } else if ours(w) {
            // No longer ours to spread: someone else's, or nobody's.
            match governing {
                Some(g) => {
                    if deleting {
                        statuses.push(status(
                            state::HANDING_OVER,
                            Some(format!("waiting for {} to take over", g.display())),
                        ));
                    }
                    continue;
                }
                None if deleting && policy.spec.deletion_policy == DeletionPolicy::Orphan => {
                    continue;
                }
                None => (Terms::default(), None),
            }
        } else {
            continue;
        };

        if is_winner {
            let pods = inp.pods.get(&(w.kind, w.name.clone())).unwrap_or(&no_pods);
            let placed = distribution::placed(w, pods, &nodes);
            let f = assess(&policy.spec, w, inp.nodes, &placed);
            let key = (w.kind, w.name.clone());
            let last = inp.evicted.get(&key).copied();
            let recent = policy
                .spec
                .rebalance
                .as_ref()
                .zip(last)
                .is_some_and(|(r, t)| {
                    let window = jiff::SignedDuration::try_from(r.min_interval() + REBALANCE_GRACE);
                    window.is_ok_and(|window| inp.now.duration_since(t) < window)
                });
            let (mut d, excess) =
                distribution::of(&policy.spec, w, pods, inp.nodes, &nodes, recent);
            if d.skewed {
                out.skewed.push(distribution::skew_message(&d));
            }
            if policy.is_cluster() {
                d.namespace = Some(w.namespace.clone());
            }
            spread.add(d, excess);
            if let Some(r) = policy
                .spec
                .rebalance
                .as_ref()
                .filter(|_| !policy.spec.suspend)
                && !inp.tracked.unobserved.contains(&key)
            {
                let d = rebalance::decide(
                    &policy.spec,
                    r,
                    w,
                    pods,
                    inp.nodes,
                    &nodes,
                    rebalance::Clock { last, now: inp.now },
                );
                out.rebalancing |= d.wanted;
                if let Some(wait) = d.wait {
                    out.rebalance_wait = Some(out.rebalance_wait.map_or(wait, |o| o.min(wait)));
                }
                out.evictions
                    .extend(d.evict.into_iter().map(|e| (w.kind, w.name.clone(), e)));
            }
            if let Some(short) = &f.shortfall {
                out.shortfalls.push(short.message(&w.name));
                out.pending += i64::from(short.pending);
            }
            for warning in f.warnings {
                if warned.insert(warning.clone()) {
                    out.warnings.push(warning);
                }
            }
        }

        let recorded = recorded_terms(w);
        let mut merged = merge(w, &recorded, &desired);
        // The record lives in the template: a different record is a template change too.
        let record = record_text(&merged.ours);
        merged.template_changed |= !record_matches(w.record.as_deref(), &record, &merged.ours);
        let record_ok = w.annotations.get(ANNOTATION_POLICY) == owner.as_deref();
        let skipped = (!merged.skipped.is_empty()).then(|| merged.skipped.join("; "));
        if !merged.template_changed && record_ok {
            if is_winner {
                out.applied = out.applied.saturating_add(1);
                statuses.push(status(state::APPLIED, skipped));
            }
            continue;
        }
        // Suspend keeps what is written; deleting the policy (with Remove)
        // still takes its terms out, or the deletion would never finish.
        if policy.spec.suspend && !deleting {
            if is_winner {
                if merged.template_changed {
                    statuses.push(status(
                        state::SUSPENDED,
                        Some("suspended: terms not written".into()),
                    ));
                } else {
                    out.applied = out.applied.saturating_add(1);
                    statuses.push(status(state::APPLIED, skipped));
                }
            }
            continue;
        }
        if inp.tracked.unobserved.contains(&(w.kind, w.name.clone())) {
            // Our last write is not in the cache yet: never write twice.
            statuses.push(status(
                state::PENDING,
                Some("waiting for the last write to be observed".into()),
            ));
            continue;
        }
        // A workload already rolling out because of this policy is counted
        // already: writing it again adds no rollout, and it must never wait
        // for itself (a removal from a workload stuck in its own rollout
        // would otherwise hold up the deletion for the whole bound).
        if merged.template_changed && !in_flight(w) {
            if budget == 0 {
                out.waiting += 1;
                statuses.push(status(
                    state::WAITING,
                    Some(format!(
                        "waiting for {} rollout(s) of this policy to finish (rollout.maxConcurrent {})",
                        out.in_flight, policy.spec.rollout.max_concurrent
                    )),
                ));
                continue;
            }
            budget -= 1;
            out.budget_used += 1;
        } else if is_winner {
            // Only the owner annotation changes: the template already has our terms.
            out.applied = out.applied.saturating_add(1);
        }
        let removal = owner.is_none();
        statuses.push(status(
            if removal {
                state::REMOVING
            } else {
                state::PENDING
            },
            skipped,
        ));
        out.writes.push(Write {
            kind: w.kind,
            name: w.name.clone(),
            record,
            template_changed: merged.template_changed,
            owner,
            resource_version: w.resource_version.clone(),
        });
    }

    if !policy.spec.suspend || deleting {
        out.pod_writes = deletion_costs(inp, &nodes, out.invalid.is_some());
    }
    out.distribution = spread.distribution();
    out.spread = spread;
    out.released = !inp.workloads.iter().any(|w| ours(w))
        || (policy.spec.deletion_policy == DeletionPolicy::Orphan && deleting);
    out.workloads = statuses.into_vec();
    out
}

/// The order of the workload statuses a policy's status lists ([`MAX_WORKLOAD_STATUSES`] of
/// them): problems first, then by kind, namespace and name.
pub(super) fn problems_first(a: &WorkloadStatus, b: &WorkloadStatus) -> std::cmp::Ordering {
    (a.state == state::APPLIED, a.kind, &a.namespace, &a.name).cmp(&(
        b.state == state::APPLIED,
        b.kind,
        &b.namespace,
        &b.name,
    ))
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
