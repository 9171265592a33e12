//! Decide: for one policy, from the cached workloads, the other policies and
//! the nodes, which workloads to write (and with what), which to leave, and
//! everything status will say. Pure: no API calls, so this is where most of
//! the controller's tests live.

use super::feasibility::{NodeInfo, assess, count_domains, topology_keys};
use super::merge::{Merged, merge};
use super::select::{selects, validate_selector, winner};
use super::terms::{Terms, desired_terms, duplicate_constraints};
use super::workload::{Rollout, Workload};
use crate::api::spread_policy::{
    DeletionPolicy, MAX_WORKLOAD_STATUSES, SpreadPolicy, TopologyDomains, WorkloadKind,
    WorkloadStatus,
};
use kube::ResourceExt;
use std::collections::BTreeSet;

/// Names the policy whose terms a workload carries.
pub const ANNOTATION_POLICY: &str = "ballast.dev/spread-policy";
/// The record of exactly which terms ballast injected (JSON of [`Terms`]).
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

/// The record of what ballast injected into `w`, if any.
pub fn recorded_terms(w: &Workload) -> Terms {
    w.annotations
        .get(ANNOTATION_TERMS)
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default()
}

/// One write to one workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Write {
    pub kind: WorkloadKind,
    pub name: String,
    pub merged: Merged,
    /// The policy that the record will name; `None` removes the record.
    pub owner: Option<String>,
    /// The resourceVersion the merge was computed from (a precondition).
    pub resource_version: Option<String>,
}

impl Write {
    pub fn is_removal(&self) -> bool {
        self.owner.is_none()
    }
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
}

/// What the plan needs to know.
pub struct Inputs<'a> {
    pub policy: &'a SpreadPolicy,
    /// Every policy in the policy's namespace (including itself).
    pub policies: &'a [std::sync::Arc<SpreadPolicy>],
    /// Deployments and StatefulSets in the policy's namespace.
    pub workloads: &'a [Workload],
    pub nodes: &'a [NodeInfo],
    /// Workloads whose last write by us the cache has not caught up with.
    pub unobserved_writes: &'a BTreeSet<(WorkloadKind, String)>,
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

    let ours = |w: &Workload| w.annotations.get(ANNOTATION_POLICY) == Some(&name);
    let in_flight = |w: &Workload| {
        ours(w)
            && (w.rollout == Rollout::InProgress
                || inp.unobserved_writes.contains(&(w.kind, w.name.clone())))
    };
    out.in_flight = inp.workloads.iter().filter(|w| in_flight(w)).count();
    let max = policy.spec.rollout.max_concurrent.max(0) as usize;
    let mut budget = if max == 0 {
        usize::MAX
    } else {
        max.saturating_sub(out.in_flight)
    };

    let mut workloads: Vec<&Workload> = inp.workloads.iter().collect();
    workloads.sort_by(|a, b| (a.kind, &a.name).cmp(&(b.kind, &b.name)));
    let mut statuses = Vec::new();
    let mut warned = BTreeSet::new();

    for w in workloads {
        let selected = !deleting && selects(policy, w);
        let governing = winner(inp.policies, w);
        let is_winner = selected && governing.is_some_and(|g| g.name_any() == name);
        let status = |state: &str, message: Option<String>| WorkloadStatus {
            kind: w.kind,
            name: w.name.clone(),
            state: state.to_string(),
            message,
        };
        if selected {
            out.matched += 1;
        }

        if selected && !is_winner {
            let g = governing.expect("a selected workload has a winner");
            let msg = format!(
                "{} is governed by SpreadPolicy {} (priority {})",
                w.display(),
                g.name_any(),
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
                desired_terms(&policy.spec, w.kind, &w.selector),
                Some(name.clone()),
            )
        } else if ours(w) {
            // No longer ours to spread: someone else's, or nobody's.
            match governing {
                Some(g) => {
                    if deleting {
                        statuses.push(status(
                            state::HANDING_OVER,
                            Some(format!(
                                "waiting for SpreadPolicy {} to take over",
                                g.name_any()
                            )),
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
            let f = assess(&policy.spec, w, inp.nodes);
            out.shortfalls
                .extend(f.shortfalls.iter().map(|s| s.message(&w.name)));
            for warning in f.warnings {
                if warned.insert(warning.clone()) {
                    out.warnings.push(warning);
                }
            }
        }

        let recorded = recorded_terms(w);
        let merged = merge(w, &recorded, &desired);
        let record_ok = match &owner {
            Some(o) => {
                w.annotations.get(ANNOTATION_POLICY) == Some(o)
                    && w.annotations.get(ANNOTATION_TERMS)
                        == Some(&serde_json::to_string(&merged.ours).unwrap_or_default())
            }
            None => {
                !w.annotations.contains_key(ANNOTATION_POLICY)
                    && !w.annotations.contains_key(ANNOTATION_TERMS)
            }
        };
        let skipped = (!merged.skipped.is_empty()).then(|| merged.skipped.join("; "));
        if !merged.template_changed && record_ok {
            if is_winner {
                out.applied += 1;
                statuses.push(status(state::APPLIED, skipped));
            }
            continue;
        }
        if policy.spec.suspend {
            if is_winner {
                if merged.template_changed {
                    statuses.push(status(
                        state::SUSPENDED,
                        Some("suspended: terms not written".into()),
                    ));
                } else {
                    out.applied += 1;
                    statuses.push(status(state::APPLIED, skipped));
                }
            }
            continue;
        }
        if inp.unobserved_writes.contains(&(w.kind, w.name.clone())) {
            // Our last write is not in the cache yet: never write twice.
            statuses.push(status(
                state::PENDING,
                Some("waiting for the last write to be observed".into()),
            ));
            continue;
        }
        if merged.template_changed {
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
        } else if is_winner {
            // Only the record changes: the template already has our terms.
            out.applied += 1;
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
            merged,
            owner,
            resource_version: w.resource_version.clone(),
        });
    }

    out.released = !inp.workloads.iter().any(ours)
        || (policy.spec.deletion_policy == DeletionPolicy::Orphan && deleting);
    // Problems first, then by kind and name; bounded.
    statuses.sort_by_key(|s| (s.state == state::APPLIED, s.kind, s.name.clone()));
    statuses.truncate(MAX_WORKLOAD_STATUSES);
    out.workloads = statuses;
    out
}
