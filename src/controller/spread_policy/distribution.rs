//! Decide: where a governed workload's pods really run, per level of the policy (each spread
//! term's topology key), how uneven that is, and why pods are Pending. Pure.
//!
//! A level's domains are the values of its key among the nodes the workload's pods may run on
//! (see [`feasibility::feasible`]), plus any other domain that still runs some of its pods (a
//! zone cordoned since, say). The skew is the most crowded domain's Running pods minus the
//! emptiest usable domain's; the policy allows `maxSkew` for a topology spread and 1 for
//! anti-affinity (one pod per domain, or as even as the replicas allow). A workload is *skewed*
//! when a level's skew is more than that once it has settled: its rollout complete, every
//! replica Running and none Pending. While a rollout or a scale places pods, the counts pass
//! through uneven states that are no spread anyone asked for, and an infeasible workload says
//! so in `Infeasible` instead.

use super::feasibility::{self, NodeInfo};
use super::pods::{Phase, PodView};
use super::top::Top;
use super::workload::{Rollout, Workload};
use crate::api::spread_distribution::{
    LevelDistribution, MAX_DISTRIBUTION_WORKLOADS, MAX_LISTED_DOMAINS, MAX_PENDING_REASONS,
    PendingReason, SpreadDistribution, WorkloadDistribution,
};
use crate::api::spread_policy::{Method, SpreadPolicySpec, WorkloadKind};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Reasons of Pending pods (`status.distribution.workloads[].pendingReasons[].reason`).
pub mod pending {
    /// The scheduler tried and found no node; the message is its own.
    pub const UNSCHEDULABLE: &str = "Unschedulable";
    /// The scheduler has not tried yet.
    pub const NOT_SCHEDULED: &str = "NotScheduled";
    /// On a node, not running yet.
    pub const STARTING: &str = "Starting";
}

/// Longest scheduler message kept per reason.
const MAX_REASON_MESSAGE: usize = 512;

/// Nodes by name.
pub type Nodes<'a> = HashMap<&'a str, &'a NodeInfo>;

/// One level of a policy: a topology key and the skew allowed there.
#[derive(Clone, Debug, PartialEq)]
pub struct Level {
    pub key: String,
    pub max_skew: i32,
}

/// The levels of `spec`: each spread term's key once, in order, with the skew its first term
/// allows.
pub fn levels(spec: &SpreadPolicySpec) -> Vec<Level> {
    let mut out: Vec<Level> = Vec::new();
    for s in &spec.spread {
        if out.iter().any(|l| l.key == s.topology_key) {
            continue;
        }
        out.push(Level {
            key: s.topology_key.clone(),
            max_skew: match s.method {
                Method::TopologySpread => s.effective_max_skew(),
                Method::AntiAffinity => 1,
            },
        });
    }
    out
}

/// Running pods per domain of one level, and the domains the pods may use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counts {
    pub pods: BTreeMap<String, i32>,
    pub usable: BTreeSet<String>,
}

impl Counts {
    /// Most crowded minus emptiest usable domain (emptiest of all when none is usable).
    pub fn skew(&self) -> i32 {
        let max = self.pods.values().max().copied().unwrap_or(0);
        let min = if self.usable.is_empty() {
            self.pods.values().min().copied().unwrap_or(0)
        } else {
            self.usable
                .iter()
                .map(|d| self.pods.get(d).copied().unwrap_or(0))
                .min()
                .unwrap_or(0)
        };
        max - min
    }
}

/// Counts `pods` (those that run) per domain of `key`, over the domains of `usable_nodes`.
pub fn count<'a>(
    key: &str,
    pods: impl IntoIterator<Item = &'a PodView>,
    nodes: &Nodes,
    usable_nodes: &[&NodeInfo],
) -> Counts {
    let usable: BTreeSet<String> = usable_nodes
        .iter()
        .filter_map(|n| n.labels.get(key).cloned())
        .collect();
    let mut counts: BTreeMap<String, i32> = usable.iter().map(|d| (d.clone(), 0)).collect();
    for p in pods.into_iter().filter(|p| p.running()) {
        let domain = p
            .node
            .as_deref()
            .and_then(|n| nodes.get(n))
            .and_then(|n| n.labels.get(key));
        if let Some(d) = domain {
            *counts.entry(d.clone()).or_insert(0) += 1;
        }
    }
    Counts {
        pods: counts,
        usable,
    }
}

/// At most [`MAX_LISTED_DOMAINS`]: the most crowded half and the emptiest half.
fn listed(pods: &BTreeMap<String, i32>) -> BTreeMap<String, i32> {
    if pods.len() <= MAX_LISTED_DOMAINS {
        return pods.clone();
    }
    let mut by_count: Vec<(&String, &i32)> = pods.iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    let half = MAX_LISTED_DOMAINS / 2;
    by_count[..half]
        .iter()
        .chain(&by_count[by_count.len() - half..])
        .map(|(d, c)| ((*d).clone(), **c))
        .collect()
}

/// Why the Pending pods among `pods` are Pending, the most common reason first.
fn pending_reasons(pods: &[PodView]) -> Vec<PendingReason> {
    let mut groups: BTreeMap<(&str, String), i32> = BTreeMap::new();
    for p in pods
        .iter()
        .filter(|p| p.phase == Phase::Pending && !p.deleting)
    {
        let key = match (&p.unschedulable, &p.node) {
            (Some(m), _) => (
                pending::UNSCHEDULABLE,
                m.chars().take(MAX_REASON_MESSAGE).collect(),
            ),
            (None, None) => (pending::NOT_SCHEDULED, String::new()),
            (None, Some(_)) => (pending::STARTING, String::new()),
        };
        *groups.entry(key).or_insert(0) += 1;
    }
    let mut out: Vec<PendingReason> = groups
        .into_iter()
        .map(|((reason, message), pods)| PendingReason {
            reason: reason.to_string(),
            message,
            pods,
        })
        .collect();
    out.sort_by_key(|r| std::cmp::Reverse(r.pods));
    out.truncate(MAX_PENDING_REASONS);
    out
}

/// The pods of `w`'s current revision that hold a node: they stay where they are when more are
/// placed. A Deployment's current revision is that of its newest pod (a rollout creates pods of
/// the new revision only); a StatefulSet's pods all count (its terms name no revision).
pub fn placed<'a>(w: &Workload, pods: &'a [PodView], nodes: &Nodes<'a>) -> Vec<&'a NodeInfo> {
    let current = match w.kind {
        WorkloadKind::Deployment => pods
            .iter()
            .filter(|p| p.active())
            .max_by(|a, b| (a.created, &a.revision).cmp(&(b.created, &b.revision)))
            .map(|p| p.revision.clone()),
        WorkloadKind::StatefulSet => None,
    };
    pods.iter()
        .filter(|p| p.active())
        .filter(|p| current.as_ref().is_none_or(|r| &p.revision == r))
        .filter_map(|p| p.node.as_deref().and_then(|n| nodes.get(n).copied()))
        .collect()
}

/// Where `w`'s pods run under `spec`, and by how much more than allowed its most uneven level
/// is skewed (0 or less: within the spread). `rebalancing`: pods of `w` were evicted lately to
/// rebalance it, so it counts as skewed between batches too, while it is not settled.
pub fn of(
    spec: &SpreadPolicySpec,
    w: &Workload,
    pods: &[PodView],
    all_nodes: &[NodeInfo],
    nodes: &Nodes,
    rebalancing: bool,
) -> (WorkloadDistribution, i32) {
    let usable: Vec<&NodeInfo> = all_nodes
        .iter()
        .filter(|n| feasibility::feasible(w, n))
        .collect();
    let mut excess = i32::MIN;
    let mut level_out = Vec::new();
    for level in levels(spec) {
        let counts = count(&level.key, pods, nodes, &usable);
        let skew = counts.skew();
        excess = excess.max(skew - level.max_skew);
        level_out.push(LevelDistribution {
            topology_key: level.key,
            pods: listed(&counts.pods),
            domains: i32::try_from(counts.pods.len()).unwrap_or(i32::MAX),
            skew,
            max_skew: level.max_skew,
        });
    }
    let count_of = |f: &dyn Fn(&PodView) -> bool| {
        i32::try_from(pods.iter().filter(|p| f(p)).count()).unwrap_or(i32::MAX)
    };
    let running = count_of(&|p| p.running());
    let pending = count_of(&|p| p.phase == Phase::Pending && !p.deleting);
    let settled = w.rollout == Rollout::Complete && running == w.replicas && pending == 0;
    let entry = WorkloadDistribution {
        kind: w.kind,
        namespace: None,
        name: w.name.clone(),
        replicas: w.replicas,
        running,
        pending,
        skewed: (settled || rebalancing) && excess > 0,
        levels: level_out,
        pending_reasons: pending_reasons(pods),
    };
    (entry, excess)
}

/// `web: topology.kubernetes.io/zone skew 3 > 1 (zone-a 0, zone-b 6, zone-c 3)`
pub fn skew_message(d: &WorkloadDistribution) -> String {
    let name = match &d.namespace {
        Some(ns) => format!("{ns}/{}", d.name),
        None => d.name.clone(),
    };
    let levels: Vec<String> = d
        .levels
        .iter()
        .filter(|l| l.skew > l.max_skew)
        .map(|l| {
            let pods: Vec<String> = l.pods.iter().map(|(k, v)| format!("{k} {v}")).collect();
            format!(
                "{} skew {} > {} ({})",
                l.topology_key,
                l.skew,
                l.max_skew,
                pods.join(", ")
            )
        })
        .collect();
    format!("{name}: {}", levels.join("; "))
}

/// The governed workloads' distributions, summed up as a plan meets them, keeping only the
/// furthest off ([`MAX_DISTRIBUTION_WORKLOADS`] of them, as status lists): Pending pods first,
/// then the skew over what is allowed, then kind, namespace and name. A plan over thousands of
/// workloads holds no more than twice that many at once; a ClusterSpreadPolicy adds up its
/// namespaces' summaries ([`Summary::merge`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    governed: i32,
    skewed: i32,
    running_pods: i32,
    pending_pods: i32,
    /// The furthest off, with their excess skew.
    top: Top<(WorkloadDistribution, i32)>,
}

impl Default for Summary {
    fn default() -> Self {
        Self {
            governed: 0,
            skewed: 0,
            running_pods: 0,
            pending_pods: 0,
            top: Top::new(MAX_DISTRIBUTION_WORKLOADS, furthest_off_first),
        }
    }
}

/// Pending pods first, then the skew over what is allowed, then kind, namespace and name.
fn furthest_off_first(
    (a, ea): &(WorkloadDistribution, i32),
    (b, eb): &(WorkloadDistribution, i32),
) -> std::cmp::Ordering {
    (b.pending > 0)
        .cmp(&(a.pending > 0))
        .then(eb.cmp(ea))
        .then_with(|| (a.kind, &a.namespace, &a.name).cmp(&(b.kind, &b.namespace, &b.name)))
}

impl Summary {
    /// Counts `d` (its most uneven level `excess` over what is allowed) in.
    pub fn add(&mut self, d: WorkloadDistribution, excess: i32) {
        self.governed = self.governed.saturating_add(1);
        self.skewed = self.skewed.saturating_add(i32::from(d.skewed));
        self.running_pods = self.running_pods.saturating_add(d.running);
        self.pending_pods = self.pending_pods.saturating_add(d.pending);
        self.top.push((d, excess));
    }

    /// Adds up another summary (another namespace's).
    pub fn merge(&mut self, other: Summary) {
        self.governed = self.governed.saturating_add(other.governed);
        self.skewed = self.skewed.saturating_add(other.skewed);
        self.running_pods = self.running_pods.saturating_add(other.running_pods);
        self.pending_pods = self.pending_pods.saturating_add(other.pending_pods);
        self.top.merge(other.top);
    }

    /// What status says of it.
    pub fn distribution(&self) -> SpreadDistribution {
        SpreadDistribution {
            governed: self.governed,
            skewed: self.skewed,
            running_pods: self.running_pods,
            pending_pods: self.pending_pods,
            workloads: self
                .top
                .clone()
                .into_vec()
                .into_iter()
                .map(|(d, _)| d)
                .collect(),
        }
    }
}

#[cfg(test)]
#[path = "distribution_tests.rs"]
mod tests;
