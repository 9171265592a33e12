//! What the scheduler does with a workload's pods under a policy's `Required` spread terms: how
//! many it places and how many stay Pending. Pure.
//!
//! The scheduler places pods one at a time, each on a node that passes every filter. Of those,
//! the ones that matter here are (see [`super::feasibility`] for the rest):
//!
//! - InterPodAffinity, for required anti-affinity against the workload's own pods (of the same
//!   revision): a node whose domain already holds one is out; a node without the topology label
//!   takes any number (the term cannot be evaluated there, so it does not hold anything back).
//!   Pods on cordoned or tainted nodes still occupy their domain.
//! - PodTopologySpread, for a `DoNotSchedule` constraint with `nodeAffinityPolicy` and
//!   `nodeTaintsPolicy` `Honor` (what ballast writes): the domains are the values of the key
//!   among the nodes the pod may run on that carry the keys of all its constraints; a node is
//!   out when its domain's count plus the pod exceeds the smallest count by more than
//!   `maxSkew`, where the smallest count is 0 while there are fewer domains than `minDomains`.
//!   A node without the key takes nothing.
//!
//! [`placeable`] follows that pod by pod, greedily, preferring the least crowded domains as the
//! scheduler's scoring does; a single rule has a closed form, which the tests check against the
//! simulation.

use super::feasibility::{NodeInfo, count_domains, feasible, spread_eligible};
use super::workload::Workload;
use crate::api::spread_policy::{Method, Mode, SpreadPolicySpec};
use std::collections::{BTreeMap, BTreeSet};

/// A hard rule the scheduler applies to every pod of the workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Rule {
    /// Required pod anti-affinity against the workload's own pods: at most one per value of `key`.
    AntiAffinity { key: String },
    /// A `DoNotSchedule` topology spread constraint.
    Spread {
        key: String,
        max_skew: i32,
        min_domains: i32,
    },
}

impl Rule {
    pub fn key(&self) -> &str {
        match self {
            Rule::AntiAffinity { key } | Rule::Spread { key, .. } => key,
        }
    }
}

/// The hard rules of `spec`'s `Required` spread terms, in order, each once.
pub fn rules(spec: &SpreadPolicySpec) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    for s in spec.spread.iter().filter(|s| s.mode == Mode::Required) {
        let rule = match s.method {
            Method::AntiAffinity => Rule::AntiAffinity {
                key: s.topology_key.clone(),
            },
            Method::TopologySpread => Rule::Spread {
                key: s.topology_key.clone(),
                max_skew: s.effective_max_skew(),
                min_domains: s.min_domains.unwrap_or(1),
            },
        };
        if !out.contains(&rule) {
            out.push(rule);
        }
    }
    out
}

/// Most pods [`placeable`] follows one by one for a workload; past that many, the rest are
/// taken as placeable (the rules in force have placed that many already).
pub const MAX_SIMULATED: i64 = 10_000;

/// Where the rules stand: the domains taken (anti-affinity) and the counts per domain (spread).
struct State<'a> {
    rules: &'a [Rule],
    /// Per rule: for anti-affinity the domains that hold a pod; unused for spread.
    occupied: Vec<BTreeSet<&'a str>>,
    /// Per rule: for spread the pods per domain (every domain, 0 included); unused otherwise.
    counts: Vec<BTreeMap<&'a str, i64>>,
}

impl<'a> State<'a> {
    fn new(
        rules: &'a [Rule],
        w: &Workload,
        nodes: &'a [NodeInfo],
        placed: &[&'a NodeInfo],
    ) -> Self {
        let spread_keys: Vec<&str> = rules
            .iter()
            .filter(|r| matches!(r, Rule::Spread { .. }))
            .map(Rule::key)
            .collect();
        // A node counts for spread when it may take the pod and carries every spread key.
        let eligible = |n: &NodeInfo| {
            spread_eligible(w, n) && spread_keys.iter().all(|k| n.labels.contains_key(*k))
        };
        let mut occupied = vec![BTreeSet::new(); rules.len()];
        let mut counts = vec![BTreeMap::new(); rules.len()];
        for (i, rule) in rules.iter().enumerate() {
            if let Rule::Spread { key, .. } = rule {
                for n in nodes.iter().filter(|n| eligible(n)) {
                    counts[i].insert(n.labels[key].as_str(), 0);
                }
            }
        }
        for p in placed {
            for (i, rule) in rules.iter().enumerate() {
                let Some(v) = p.labels.get(rule.key()) else {
                    continue;
                };
                match rule {
                    Rule::AntiAffinity { .. } => {
                        occupied[i].insert(v.as_str());
                    }
                    Rule::Spread { .. } if eligible(p) => {
                        *counts[i].entry(v.as_str()).or_insert(0) += 1;
                    }
                    Rule::Spread { .. } => {}
                }
            }
        }
        State {
            rules,
            occupied,
            counts,
        }
    }

    /// The smallest count per spread rule, as the filter compares against.
    fn minimums(&self) -> Vec<i64> {
        self.rules
            .iter()
            .zip(&self.counts)
            .map(|(r, c)| match r {
                Rule::Spread { min_domains, .. }
                    if c.len() >= usize::try_from(*min_domains).unwrap_or(usize::MAX) =>
                {
                    c.values().min().copied().unwrap_or(0)
                }
                _ => 0,
            })
            .collect()
    }

    /// Whether one more pod may go to a node with `values` (per rule), and how crowded its
    /// domains are (the sum of its spread counts: lower is preferred).
    fn admits(&self, values: &[Option<&str>], minimums: &[i64]) -> Option<i64> {
        let mut crowd = 0i64;
        for (i, rule) in self.rules.iter().enumerate() {
            match (rule, values[i]) {
                (Rule::AntiAffinity { .. }, None) => {}
                (Rule::AntiAffinity { .. }, Some(v)) => {
                    if self.occupied[i].contains(v) {
                        return None;
                    }
                }
                (Rule::Spread { .. }, None) => return None,
                (Rule::Spread { max_skew, .. }, Some(v)) => {
                    let here = self.counts[i].get(v).copied().unwrap_or(0);
                    if here + 1 - minimums[i] > i64::from(*max_skew) {
                        return None;
                    }
                    crowd = crowd.saturating_add(here);
                }
            }
        }
        Some(crowd)
    }

    fn place(&mut self, values: &[Option<&'a str>]) {
        for (i, rule) in self.rules.iter().enumerate() {
            let Some(v) = values[i] else { continue };
            match rule {
                Rule::AntiAffinity { .. } => {
                    self.occupied[i].insert(v);
                }
                Rule::Spread { .. } => {
                    if let Some(c) = self.counts[i].get_mut(v) {
                        *c += 1;
                    }
                }
            }
        }
    }
}

/// How many of `want` further pods of `w` the scheduler places under `rules`, given the nodes
/// of the pods of the same revision already placed. Nodes with the same values of the rules'
/// keys are one class: the rules cannot tell them apart.
pub fn placeable(
    rules: &[Rule],
    w: &Workload,
    nodes: &[NodeInfo],
    placed: &[&NodeInfo],
    want: i64,
) -> i64 {
    let want = want.max(0);
    if rules.is_empty() || want == 0 {
        return want;
    }
    let mut state = State::new(rules, w, nodes, placed);
    // Per class: the pods placed on it so far (ties go to the emptier class, as the
    // scheduler's spreading of pods over nodes would).
    let mut classes: BTreeMap<Vec<Option<&str>>, i64> = BTreeMap::new();
    for n in nodes.iter().filter(|n| feasible(w, n)) {
        let values = rules
            .iter()
            .map(|r| n.labels.get(r.key()).map(String::as_str))
            .collect();
        classes.entry(values).or_insert(0);
    }
    if let [rule] = rules {
        return closed_form(rule, &state, &classes, want);
    }
    let limit = want.min(MAX_SIMULATED);
    for done in 0..limit {
        let minimums = state.minimums();
        let best = classes
            .iter()
            .filter_map(|(values, pods)| {
                state
                    .admits(values, &minimums)
                    .map(|crowd| (crowd, *pods, values))
            })
            .min();
        let Some((_, _, values)) = best else {
            return done;
        };
        let values = values.clone();
        state.place(&values);
        *classes.get_mut(&values).expect("a class") += 1;
    }
    want
}

/// [`placeable`] for one rule, without following the pods one by one.
fn closed_form(
    rule: &Rule,
    state: &State,
    classes: &BTreeMap<Vec<Option<&str>>, i64>,
    want: i64,
) -> i64 {
    let values = || classes.keys().map(|v| v[0]);
    match rule {
        Rule::AntiAffinity { .. } => {
            if values().any(|v| v.is_none()) {
                return want;
            }
            let free: BTreeSet<&str> = values()
                .flatten()
                .filter(|v| !state.occupied[0].contains(v))
                .collect();
            want.min(i64::try_from(free.len()).unwrap_or(i64::MAX))
        }
        Rule::Spread {
            max_skew,
            min_domains,
            ..
        } => {
            let usable: BTreeSet<&str> = values().flatten().collect();
            if usable.is_empty() {
                return 0;
            }
            let counts = &state.counts[0];
            let enough = counts.len() >= usize::try_from(*min_domains).unwrap_or(usize::MAX);
            // The smallest count the filter compares against stops rising at a domain no pod
            // can go to (or is 0 below minDomains); with none, the least crowded domain
            // always takes one more.
            let stuck = counts
                .iter()
                .filter(|(v, _)| !usable.contains(*v))
                .map(|(_, c)| *c)
                .min();
            let floor = match (enough, stuck) {
                (false, _) => 0,
                (true, Some(stuck)) => stuck,
                (true, None) => return want,
            };
            let room: i64 = usable
                .iter()
                .map(|v| {
                    (floor + i64::from(*max_skew) - counts.get(v).copied().unwrap_or(0)).max(0)
                })
                .fold(0i64, i64::saturating_add);
            want.min(room)
        }
    }
}

/// A workload whose `Required` spread leaves pods Pending.
#[derive(Clone, Debug, PartialEq)]
pub struct Shortfall {
    pub replicas: i32,
    /// Domains of the binding rule's key that the pods can use.
    pub domains: i32,
    /// The key of the rule that binds (alone, it places the fewest pods).
    pub topology_key: String,
    pub pending: i32,
}

impl Shortfall {
    /// `web: 5 replicas, 3 domains of topology.kubernetes.io/zone: 2 pods will stay Pending`
    pub fn message(&self, workload: &str) -> String {
        format!(
            "{workload}: {} replicas, {} domains of {}: {} {} will stay Pending",
            self.replicas,
            self.domains,
            self.topology_key,
            self.pending,
            if self.pending == 1 { "pod" } else { "pods" }
        )
    }
}

/// What the nodes say about one workload under one policy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Feasibility {
    pub shortfall: Option<Shortfall>,
    /// Human-readable warnings (nodes without the topology label).
    pub warnings: Vec<String>,
}

/// Checks `spec`'s spread against the nodes `w` can use, given the nodes its pods of the
/// current revision already run on (`placed`: they stay where they are).
pub fn assess(
    spec: &SpreadPolicySpec,
    w: &Workload,
    nodes: &[NodeInfo],
    placed: &[&NodeInfo],
) -> Feasibility {
    let usable: Vec<&NodeInfo> = nodes.iter().filter(|n| feasible(w, n)).collect();
    let mut f = Feasibility::default();
    let mut warned = BTreeSet::new();
    for s in &spec.spread {
        let count = count_domains(&s.topology_key, usable.iter().copied());
        if count.nodes_missing_label > 0 && warned.insert(s.topology_key.clone()) {
            f.warnings.push(format!(
                "{}: {} of {} schedulable nodes lack the label {}",
                w.name, count.nodes_missing_label, count.nodes, s.topology_key
            ));
        }
    }
    let rules = rules(spec);
    let placed_count = i64::try_from(placed.len()).unwrap_or(i64::MAX);
    let want = i64::from(w.replicas.max(0)).saturating_sub(placed_count);
    let pending = want - placeable(&rules, w, nodes, placed, want);
    if pending <= 0 {
        return f;
    }
    let binding = rules
        .iter()
        .min_by_key(|r| placeable(std::slice::from_ref(*r), w, nodes, placed, want))
        .expect("pods stay Pending only under some rule");
    let domains: BTreeSet<&str> = match binding {
        Rule::AntiAffinity { key } => usable
            .iter()
            .filter_map(|n| n.labels.get(key).map(String::as_str))
            .collect(),
        Rule::Spread { .. } => State::new(std::slice::from_ref(binding), w, nodes, placed).counts
            [0]
        .keys()
        .copied()
        .collect(),
    };
    f.shortfall = Some(Shortfall {
        replicas: w.replicas,
        domains: i32::try_from(domains.len()).unwrap_or(i32::MAX),
        topology_key: binding.key().to_string(),
        pending: i32::try_from(pending).unwrap_or(i32::MAX),
    });
    f
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;
