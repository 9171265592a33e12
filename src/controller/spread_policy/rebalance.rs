//! Decide: which pods to evict so that a governed workload's running pods come back into the
//! spread its policy asks for (`rebalance`). Pure; the clock and the last evictions are inputs.
//!
//! Only `Required` `TopologySpread` terms are rebalanced: there the scheduler must place an
//! evicted pod's replacement where the count plus one stays within `maxSkew` of the emptiest
//! domain, which the crowded domain it left is not. (Anti-affinity and `Preferred` terms only
//! prefer the emptier domain; an eviction could land in the same place again.)
//!
//! A workload is rebalanced one batch at a time, and only while it is settled:
//! - its rollout is complete and none of its pods is Pending (a replacement must be placeable);
//! - fewer than `maxUnavailable` replicas are unavailable, and a batch is at most the rest, so
//!   availability never goes below the replicas minus `maxUnavailable`;
//! - `minInterval` has passed since its last batch;
//! - the nodes can place the batch's replacements under every `Required` term (the same
//!   following of the scheduler as the feasibility check), outside the domains they leave.
//!
//! A batch takes, one pod at a time, from the most crowded domain while the skew exceeds
//! `maxSkew`, as many pods as that takes (or the budget allows): the pods on the most crowded
//! node first, then the newest. PodDisruptionBudgets are the Eviction API's to enforce.

use super::distribution::{Nodes, count};
use super::feasibility::{NodeInfo, feasible};
use super::placement::{Rule, placeable, rules};
use super::pods::PodView;
use super::workload::{Rollout, Workload};
use crate::api::spread_policy::{Method, Mode, Rebalance, SpreadPolicySpec};
use jiff::Timestamp;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// One pod to evict, and why (the Event's note).
#[derive(Clone, Debug, PartialEq)]
pub struct Eviction {
    pub pod: String,
    pub uid: String,
    pub why: String,
}

/// What rebalancing decides for one workload.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Pods to evict now.
    pub evict: Vec<Eviction>,
    /// The workload is off its spread where rebalancing can act (now or later).
    pub wanted: bool,
    /// How long until `minInterval` lets the next batch go, when that is what it waits for.
    pub wait: Option<Duration>,
}

/// When a workload's last batch went, and the time now.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    pub last: Option<Timestamp>,
    pub now: Timestamp,
}

/// `zone-a 0, zone-b 3, zone-c 3`
fn counts_text(counts: &BTreeMap<String, i32>) -> String {
    let parts: Vec<String> = counts.iter().map(|(d, c)| format!("{d} {c}")).collect();
    parts.join(", ")
}

/// Decides the next batch of `w` under `spec`, given its pods, the nodes, when its last batch
/// went and the time.
pub fn decide(
    spec: &SpreadPolicySpec,
    r: &Rebalance,
    w: &Workload,
    pods: &[PodView],
    all_nodes: &[NodeInfo],
    nodes: &Nodes,
    clock: Clock,
) -> Decision {
    let Clock { last, now } = clock;
    let mut d = Decision::default();
    let usable: Vec<&NodeInfo> = all_nodes.iter().filter(|n| feasible(w, n)).collect();
    // The first Required TopologySpread level off its skew.
    let hard = spec
        .spread
        .iter()
        .filter(|s| s.mode == Mode::Required && s.method == Method::TopologySpread);
    let Some((key, max_skew, mut counts)) = hard
        .filter_map(|s| {
            let max_skew = s.effective_max_skew();
            let c = count(&s.topology_key, pods, nodes, &usable);
            (c.skew() > max_skew).then(|| (s.topology_key.clone(), max_skew, c))
        })
        .next()
    else {
        return d;
    };
    d.wanted = true;
    let pending = pods.iter().any(|p| p.active() && p.node.is_none());
    if w.rollout != Rollout::Complete || pending || counts.usable.is_empty() {
        return d;
    }
    if let Some(last) = last {
        let since = now.duration_since(last);
        let interval = jiff::SignedDuration::try_from(r.min_interval()).unwrap_or_default();
        if since < interval {
            d.wait = Duration::try_from(interval - since).ok();
            return d;
        }
    }
    let ready = pods.iter().filter(|p| p.running() && p.ready).count();
    let unavailable =
        i32::try_from((w.replicas.max(0) as usize).saturating_sub(ready)).unwrap_or(0);
    let budget = r.max_unavailable_of(w.replicas) - unavailable;
    if budget <= 0 {
        return d;
    }

    // Which domains to take from: follow the moves that bring the skew within maxSkew.
    let before = counts_text(&counts.pods);
    let skew = counts.skew();
    let mut take: Vec<String> = Vec::new();
    while counts.skew() > max_skew && take.len() < budget as usize {
        let Some((from, _)) = counts
            .pods
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(k, v)| (k.clone(), *v))
        else {
            break;
        };
        let Some(to) = counts
            .usable
            .iter()
            .min_by_key(|u| (counts.pods.get(*u).copied().unwrap_or(0), (*u).clone()))
            .cloned()
        else {
            break;
        };
        if from == to {
            break;
        }
        *counts.pods.get_mut(&from).expect("a domain") -= 1;
        *counts.pods.entry(to).or_insert(0) += 1;
        take.push(from);
    }

    // The victims: ready pods of those domains, the most crowded node first, then the newest.
    let domain_of = |p: &PodView| {
        p.node
            .as_deref()
            .and_then(|n| nodes.get(n))
            .and_then(|n| n.labels.get(&key))
            .cloned()
    };
    let mut on_node: BTreeMap<&str, usize> = BTreeMap::new();
    for p in pods.iter().filter(|p| p.running()) {
        *on_node.entry(p.node.as_deref().unwrap_or("")).or_insert(0) += 1;
    }
    let mut candidates: Vec<&PodView> = pods.iter().filter(|p| p.running() && p.ready).collect();
    candidates.sort_by(|a, b| {
        let crowd = |p: &PodView| on_node[p.node.as_deref().unwrap_or("")];
        crowd(b)
            .cmp(&crowd(a))
            .then(b.created.cmp(&a.created))
            .then_with(|| a.name.cmp(&b.name))
    });
    let mut chosen: BTreeSet<&str> = BTreeSet::new();
    let mut victims: Vec<(&PodView, String)> = Vec::new();
    for from in &take {
        if let Some(p) = candidates
            .iter()
            .find(|p| !chosen.contains(&*p.name) && domain_of(p).as_ref() == Some(from))
        {
            chosen.insert(&p.name);
            victims.push((p, from.clone()));
        }
    }
    if victims.is_empty() {
        return d;
    }

    // The replacements must find room, away from where they came from.
    let left: Vec<&NodeInfo> = pods
        .iter()
        .filter(|p| p.active() && !chosen.contains(&*p.name))
        .filter_map(|p| p.node.as_deref().and_then(|n| nodes.get(n).copied()))
        .collect();
    let want = i64::try_from(victims.len()).unwrap_or(i64::MAX);
    let hard_rules: Vec<Rule> = rules(spec);
    if placeable(&hard_rules, w, all_nodes, &left, want) < want {
        return d;
    }
    d.evict = victims
        .into_iter()
        .map(|(p, from)| Eviction {
            pod: p.name.to_string(),
            uid: p.uid.to_string(),
            why: format!(
                "{}: {key} skew {skew} > maxSkew {max_skew} ({before}); evicted pod {} from {from} so the scheduler places it in a less crowded domain",
                w.display(),
                p.name
            ),
        })
        .collect();
    d
}

#[cfg(test)]
#[path = "rebalance_tests.rs"]
mod tests;
