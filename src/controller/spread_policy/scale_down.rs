//! Decide: the deletion costs that make a governed Deployment's scale-down balanced
//! (`scaleDown: Balanced`). Pure.
//!
//! When a ReplicaSet scales down it deletes, among its ready pods, those with the lowest
//! `controller.kubernetes.io/pod-deletion-cost` first (before its own tie-breaks: pods doubled
//! up on a node, then the most recently ready). So ballast gives the pods of each domain of the
//! policy's first spread level the costs -1 … -n (n: the pods of that ReplicaSet there): the
//! pods at -n, one per domain of the most crowded count, go first, then those at -(n-1), and so
//! on — each deletion takes the most crowded domain down by one. 3/3/3 scaled to 6 ends 2/2/2,
//! 4/2/2 scaled to 6 ends 2/2/2.
//!
//! Write volume: a pod keeps its cost while it is one of the values its domain needs (in
//! -n..-1, and no other pod of the domain has it); only pods without such a value are written,
//! each getting a free value — the most negative to the pods on the most crowded node, as the
//! ReplicaSet controller would prefer them too. A new pod costs one write; a deleted one costs
//! at most one (the pod whose value fell out of range).
//!
//! Without `Balanced` (or once the policy no longer governs the workload), the costs ballast
//! set are taken away again; costs set by others are left alone. StatefulSets delete their
//! highest ordinal whatever the cost, so they get none.

use super::distribution::Nodes;
use super::pods::PodView;
use super::workload::Workload;
use crate::api::spread_policy::WorkloadKind;
use std::collections::{BTreeMap, BTreeSet};

/// One pod's deletion cost to write: `Some` sets it, `None` takes ballast's away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CostWrite {
    pub pod: String,
    pub uid: String,
    pub cost: Option<i32>,
}

/// The cost writes `w`'s pods need. `key`: the topology key of the policy's first spread term;
/// `balanced`: whether the policy governs `w` with `scaleDown: Balanced`.
pub fn cost_writes(
    key: Option<&str>,
    balanced: bool,
    w: &Workload,
    pods: &[PodView],
    nodes: &Nodes,
) -> Vec<CostWrite> {
    let write = |p: &PodView, cost| CostWrite {
        pod: p.name.to_string(),
        uid: p.uid.to_string(),
        cost,
    };
    let key = match key {
        Some(k) if balanced && w.kind == WorkloadKind::Deployment => k,
        _ => {
            return pods
                .iter()
                .filter(|p| p.cost_ours && p.active())
                .map(|p| write(p, None))
                .collect();
        }
    };
    // By ReplicaSet (revision), then by domain: each ReplicaSet scales down on its own.
    let mut groups: BTreeMap<(Option<&str>, &str), Vec<&PodView>> = BTreeMap::new();
    let mut on_node: BTreeMap<(Option<&str>, &str), usize> = BTreeMap::new();
    for p in pods.iter().filter(|p| p.active()) {
        let Some(node) = p.node.as_deref() else {
            continue;
        };
        let domain = nodes
            .get(node)
            .and_then(|n| n.labels.get(key))
            .map_or("", String::as_str);
        let revision = p.revision.as_deref();
        groups.entry((revision, domain)).or_default().push(p);
        *on_node.entry((revision, node)).or_insert(0) += 1;
    }
    let mut out = Vec::new();
    for ((revision, _), mut members) in groups {
        members.sort_by(|a, b| a.name.cmp(&b.name));
        let n = i32::try_from(members.len()).unwrap_or(i32::MAX);
        let mut taken = BTreeSet::new();
        let mut rest = Vec::new();
        for p in members {
            match p.deletion_cost {
                Some(c) if (-n..=-1).contains(&c) && taken.insert(c) => {}
                _ => rest.push(p),
            }
        }
        // The pods on the most crowded node first, then the newest, take the lowest values.
        let crowd = |p: &PodView| on_node[&(revision, p.node.as_deref().unwrap_or(""))];
        rest.sort_by(|a, b| {
            crowd(b)
                .cmp(&crowd(a))
                .then(b.created.cmp(&a.created))
                .then_with(|| a.name.cmp(&b.name))
        });
        let free = (-n..=-1).filter(|c| !taken.contains(c));
        out.extend(rest.into_iter().zip(free).map(|(p, c)| write(p, Some(c))));
    }
    out
}

#[cfg(test)]
#[path = "scale_down_tests.rs"]
mod tests;
