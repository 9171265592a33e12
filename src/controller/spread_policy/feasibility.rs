//! Telling the truth about feasibility: how many failure domains of each
//! topology key exist among the nodes a workload can schedule on, and how
//! many of its pods a `Required` spread leaves Pending. Pure.
//!
//! Mirrors the scheduler's filters that matter here: a node counts when it
//! is Ready, not cordoned, every NoSchedule/NoExecute taint on it is
//! tolerated, and it satisfies the workload's nodeSelector and required node
//! affinity. For required pod anti-affinity a node *without* the topology
//! label is unconstrained (the scheduler lets any number of pods land
//! there), so it makes the spread meaningless rather than infeasible: that
//! is reported as a warning. Topology spread constraints with DoNotSchedule
//! only ever use nodes that carry the label.

use super::workload::Workload;
use crate::api::spread_policy::{Method, Mode, SpreadPolicySpec};
use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, Taint, Toleration};
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};

/// What scheduling needs to know of a node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub ready: bool,
    pub unschedulable: bool,
    pub taints: Vec<Taint>,
}

impl NodeInfo {
    pub fn from_node(n: &Node) -> Self {
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let spec = n.spec.clone().unwrap_or_default();
        NodeInfo {
            name: n.name_any(),
            labels: n.labels().clone(),
            ready,
            unschedulable: spec.unschedulable.unwrap_or(false),
            taints: spec.taints.unwrap_or_default(),
        }
    }

    /// Ready, not cordoned, and no taint that keeps `tolerations` out.
    pub fn schedulable_with(&self, tolerations: &[Toleration]) -> bool {
        self.ready
            && !self.unschedulable
            && self
                .taints
                .iter()
                .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)))
    }
}

/// The scheduler's toleration rule.
pub fn tolerates(tol: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = tol.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    match tol.operator.as_deref().unwrap_or("Equal") {
        "Exists" => tol
            .key
            .as_deref()
            .is_none_or(|k| k.is_empty() || k == taint.key),
        _ => {
            tol.key.as_deref() == Some(taint.key.as_str())
                && tol.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    }
}

fn node_requirement(r: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// Whether the workload's nodeSelector and required node affinity admit `node`.
pub fn node_selected(w: &Workload, node: &NodeInfo) -> bool {
    if !w
        .node_selector
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v))
    {
        return false;
    }
    let required = w.affinity.node_affinity.as_ref().and_then(|a| {
        a.required_during_scheduling_ignored_during_execution
            .as_ref()
    });
    let Some(required) = required else {
        return true;
    };
    // Terms are ORed; the requirements inside one term are ANDed.
    required.node_selector_terms.iter().any(|term| {
        let exprs = term
            .match_expressions
            .iter()
            .flatten()
            .all(|r| node_requirement(r, node.labels.get(&r.key)));
        let name = Some(node.name.clone());
        let fields = term
            .match_fields
            .iter()
            .flatten()
            .all(|r| r.key == "metadata.name" && node_requirement(r, name.as_ref()));
        exprs && fields
    })
}

/// The domains of one topology key among a set of nodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DomainCount {
    pub topology_key: String,
    pub domains: i32,
    pub nodes: i32,
    pub nodes_missing_label: i32,
}

/// Counts the distinct values of `key` among `nodes`.
pub fn count_domains<'a>(key: &str, nodes: impl IntoIterator<Item = &'a NodeInfo>) -> DomainCount {
    let mut values = BTreeSet::new();
    let (mut n, mut missing): (i32, i32) = (0, 0);
    for node in nodes {
        n = n.saturating_add(1);
        match node.labels.get(key) {
            Some(v) => {
                values.insert(v.as_str());
            }
            None => missing = missing.saturating_add(1),
        }
    }
    DomainCount {
        topology_key: key.to_string(),
        domains: i32::try_from(values.len()).unwrap_or(i32::MAX),
        nodes: n,
        nodes_missing_label: missing,
    }
}

/// Every topology key a spec names, in order, once.
pub fn topology_keys(spec: &SpreadPolicySpec) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let all = spec
        .spread
        .iter()
        .map(|s| &s.topology_key)
        .chain(spec.colocate.iter().map(|c| &c.topology_key))
        .chain(spec.separate.iter().map(|s| &s.topology_key));
    for k in all {
        if !keys.contains(k) {
            keys.push(k.clone());
        }
    }
    keys
}

/// A `Required` spread that cannot place every replica.
#[derive(Clone, Debug, PartialEq)]
pub struct Shortfall {
    pub replicas: i32,
    pub domains: i32,
    pub topology_key: String,
    pub pending: i32,
}

/// What the nodes say about one workload under one policy.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Feasibility {
    pub shortfalls: Vec<Shortfall>,
    /// Human-readable warnings (nodes without the topology label).
    pub warnings: Vec<String>,
}

/// Checks each `spread` entry of `spec` against the nodes `w` can use.
pub fn assess(spec: &SpreadPolicySpec, w: &Workload, nodes: &[NodeInfo]) -> Feasibility {
    let eligible: Vec<&NodeInfo> = nodes
        .iter()
        .filter(|n| n.schedulable_with(&w.tolerations) && node_selected(w, n))
        .collect();
    let mut f = Feasibility::default();
    let mut warned = BTreeSet::new();
    for s in &spec.spread {
        let count = count_domains(&s.topology_key, eligible.iter().copied());
        if count.nodes_missing_label > 0 && warned.insert(s.topology_key.clone()) {
            f.warnings.push(format!(
                "{}: {} of {} schedulable nodes lack the label {}",
                w.name, count.nodes_missing_label, count.nodes, s.topology_key
            ));
        }
        if s.mode != Mode::Required {
            continue;
        }
        let capacity = match s.method {
            // Unlabelled nodes take any number of pods.
            Method::AntiAffinity if count.nodes_missing_label > 0 => None,
            Method::AntiAffinity => Some(count.domains),
            Method::TopologySpread => {
                let min = s.min_domains.unwrap_or(1);
                // Below minDomains the global minimum counts as 0, so each
                // domain holds at most maxSkew pods. Saturating: maxSkew and the
                // domain count are each bounded, their product need not fit.
                if count.domains == 0 {
                    Some(0)
                } else if count.domains < min {
                    Some(count.domains.saturating_mul(s.effective_max_skew()))
                } else {
                    None
                }
            }
        };
        if let Some(cap) = capacity
            && w.replicas > cap
        {
            f.shortfalls.push(Shortfall {
                replicas: w.replicas,
                domains: count.domains,
                topology_key: s.topology_key.clone(),
                pending: w.replicas.saturating_sub(cap),
            });
        }
    }
    f
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::spread_policy::WorkloadKind;
    use serde_json::json;

    fn node(name: &str, zone: Option<&str>) -> NodeInfo {
        let mut labels = BTreeMap::from([("kubernetes.io/hostname".to_string(), name.to_string())]);
        if let Some(z) = zone {
            labels.insert("topology.kubernetes.io/zone".into(), z.into());
        }
        NodeInfo {
            name: name.into(),
            labels,
            ready: true,
            ..Default::default()
        }
    }

    fn three_zones() -> Vec<NodeInfo> {
        ["a", "b", "c"]
            .iter()
            .flat_map(|z| {
                [
                    node(&format!("{z}0"), Some(z)),
                    node(&format!("{z}1"), Some(z)),
                ]
            })
            .collect()
    }

    fn spec(v: serde_json::Value) -> SpreadPolicySpec {
        serde_json::from_value(json!({"selector": {"matchLabels": {"a": "b"}}, "spread": v}))
            .unwrap()
    }

    fn web(replicas: i32) -> Workload {
        Workload {
            kind: WorkloadKind::Deployment,
            name: "web".into(),
            replicas,
            ..Default::default()
        }
    }

    const ZONE: &str = "topology.kubernetes.io/zone";

    #[test]
    fn more_replicas_than_zones_leaves_the_difference_pending() {
        let s = spec(json!([{"topologyKey": ZONE, "mode": "Required"}]));
        let f = assess(&s, &web(5), &three_zones());
        assert_eq!(f.shortfalls.len(), 1);
        assert_eq!(
            f.shortfalls[0].message("web"),
            "web: 5 replicas, 3 domains of topology.kubernetes.io/zone: 2 pods will stay Pending"
        );
    }

    #[test]
    fn as_many_replicas_as_zones_is_feasible() {
        let s = spec(json!([{"topologyKey": ZONE, "mode": "Required"}]));
        assert!(assess(&s, &web(3), &three_zones()).shortfalls.is_empty());
    }

    #[test]
    fn preferred_spread_is_never_infeasible() {
        let s = spec(json!([{"topologyKey": ZONE, "mode": "Preferred"}]));
        assert!(assess(&s, &web(50), &three_zones()).shortfalls.is_empty());
    }

    #[test]
    fn cordoned_not_ready_and_tainted_nodes_do_not_count() {
        let mut nodes = three_zones();
        for n in nodes.iter_mut().filter(|n| n.name.starts_with('c')) {
            n.unschedulable = true;
        }
        nodes[2].ready = false; // b0
        nodes[3].taints = vec![Taint {
            key: "dedicated".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]; // b1
        let s = spec(json!([{"topologyKey": ZONE, "mode": "Required"}]));
        let f = assess(&s, &web(3), &nodes);
        assert_eq!(f.shortfalls[0].domains, 1);
        assert_eq!(f.shortfalls[0].pending, 2);
        // Tolerating the taint brings zone b back.
        let mut w = web(3);
        w.tolerations = vec![Toleration {
            key: Some("dedicated".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }];
        assert_eq!(assess(&s, &w, &nodes).shortfalls[0].domains, 2);
    }

    #[test]
    fn node_affinity_narrows_the_domains() {
        let s = spec(json!([{"topologyKey": ZONE, "mode": "Required"}]));
        let mut w = web(2);
        w.affinity = serde_json::from_value(json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["a", "b"]}]}]}}}))
        .unwrap();
        let f = assess(&s, &w, &three_zones());
        assert_eq!((f.shortfalls[0].domains, f.shortfalls[0].pending), (1, 1));
        let mut pinned = web(2);
        pinned.node_selector = BTreeMap::from([(ZONE.to_string(), "a".to_string())]);
        assert_eq!(
            assess(&s, &pinned, &three_zones()).shortfalls[0].message("web"),
            "web: 2 replicas, 1 domains of topology.kubernetes.io/zone: 1 pod will stay Pending"
        );
    }

    #[test]
    fn unlabelled_nodes_make_anti_affinity_unbounded_and_are_warned_about() {
        let mut nodes = three_zones();
        nodes.push(node("bare", None));
        let s = spec(json!([{"topologyKey": ZONE, "mode": "Required"}]));
        let f = assess(&s, &web(10), &nodes);
        assert!(f.shortfalls.is_empty());
        assert_eq!(
            f.warnings,
            vec!["web: 1 of 7 schedulable nodes lack the label topology.kubernetes.io/zone"]
        );
    }

    #[test]
    fn topology_spread_below_min_domains_caps_each_domain_at_max_skew() {
        let s = spec(
            json!([{"topologyKey": ZONE, "mode": "Required", "method": "TopologySpread", "maxSkew": 1, "minDomains": 4}]),
        );
        let f = assess(&s, &web(5), &three_zones());
        assert_eq!((f.shortfalls[0].domains, f.shortfalls[0].pending), (3, 2));
        let enough =
            spec(json!([{"topologyKey": ZONE, "mode": "Required", "method": "TopologySpread"}]));
        assert!(
            assess(&enough, &web(50), &three_zones())
                .shortfalls
                .is_empty()
        );
    }

    #[test]
    fn the_largest_skew_and_min_domains_do_not_overflow() {
        let s = spec(
            json!([{"topologyKey": ZONE, "mode": "Required", "method": "TopologySpread",
            "maxSkew": i32::MAX, "minDomains": i32::MAX}]),
        );
        assert!(assess(&s, &web(5), &three_zones()).shortfalls.is_empty());
        let f = assess(&s, &web(i32::MAX), &three_zones());
        assert_eq!(f.shortfalls.len(), 0, "capacity saturates at i32::MAX");
        let mut negative = web(-5);
        negative.replicas = i32::MIN;
        assert!(assess(&s, &negative, &three_zones()).shortfalls.is_empty());
    }

    #[test]
    fn domains_are_counted_per_key() {
        let c = count_domains(ZONE, &three_zones());
        assert_eq!((c.domains, c.nodes, c.nodes_missing_label), (3, 6, 0));
        let h = count_domains("kubernetes.io/hostname", &three_zones());
        assert_eq!(h.domains, 6);
    }

    #[test]
    fn tolerations_follow_the_scheduler_rules() {
        let taint = Taint {
            key: "k".into(),
            value: Some("v".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let eq = Toleration {
            key: Some("k".into()),
            value: Some("v".into()),
            ..Default::default()
        };
        let wrong = Toleration {
            key: Some("k".into()),
            value: Some("x".into()),
            ..Default::default()
        };
        let all = Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        };
        let other_effect = Toleration {
            operator: Some("Exists".into()),
            effect: Some("NoExecute".into()),
            ..Default::default()
        };
        assert!(tolerates(&eq, &taint));
        assert!(!tolerates(&wrong, &taint));
        assert!(tolerates(&all, &taint));
        assert!(!tolerates(&other_effect, &taint));
    }
}
