//! The scheduler's view of the nodes, for telling the truth about feasibility: which nodes a
//! workload's pods may run on at all, and how many failure domains of a topology key those
//! nodes make. Pure. What the scheduler then does with the pods is [`super::placement`].
//!
//! A node takes a pod when the filters that do not depend on other pods pass, as the
//! scheduler's plugins have them: NodeUnschedulable (a cordoned node only takes pods that
//! tolerate `node.kubernetes.io/unschedulable:NoSchedule`), TaintToleration (every `NoSchedule`
//! and `NoExecute` taint tolerated) and NodeAffinity (the nodeSelector and the required node
//! affinity). A node that is not Ready counts as taking nothing: its controller taints it
//! `node.kubernetes.io/not-ready:NoSchedule`, which pods do not tolerate by default.
//! Node capacity (CPU, memory, the pod count) is not assessed.

use super::workload::Workload;
use crate::api::spread_policy::SpreadPolicySpec;
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

    /// Ready, and neither a cordon nor a taint keeps `tolerations` out: the scheduler's
    /// NodeUnschedulable and TaintToleration filters.
    pub fn schedulable_with(&self, tolerations: &[Toleration]) -> bool {
        self.ready && self.cordon_tolerated(tolerations) && self.taints_tolerated(tolerations)
    }

    /// Whether the node is not cordoned, or `tolerations` let a pod onto it anyway.
    pub fn cordon_tolerated(&self, tolerations: &[Toleration]) -> bool {
        !self.unschedulable
            || tolerations
                .iter()
                .any(|tol| tolerates(tol, &unschedulable_taint()))
    }

    /// Whether every `NoSchedule` and `NoExecute` taint of the node is tolerated: the rule of
    /// the TaintToleration filter, and of `nodeTaintsPolicy: Honor` in topology spread.
    pub fn taints_tolerated(&self, tolerations: &[Toleration]) -> bool {
        self.taints
            .iter()
            .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            .all(|t| tolerations.iter().any(|tol| tolerates(tol, t)))
    }
}

/// The taint the node lifecycle controller puts on a cordoned node; the NodeUnschedulable
/// filter lets through the pods that tolerate it.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

fn unschedulable_taint() -> Taint {
    Taint {
        key: UNSCHEDULABLE_TAINT.into(),
        effect: "NoSchedule".into(),
        ..Default::default()
    }
}

/// Whether `w`'s pods may run on `node` at all, whatever other pods do: Ready, the cordon
/// and every taint tolerated, the nodeSelector and required node affinity matched.
pub fn feasible(w: &Workload, node: &NodeInfo) -> bool {
    node.schedulable_with(&w.tolerations) && node_selected(w, node)
}

/// Whether `node` counts as a domain of a topology spread constraint ballast writes
/// (`nodeAffinityPolicy` and `nodeTaintsPolicy` both `Honor`): the nodeSelector and required
/// node affinity match, and every NoSchedule/NoExecute taint is tolerated. A cordoned node
/// carries the unschedulable taint (its controller sets it), so it is out unless tolerated;
/// a cordon whose taint is not set yet is treated the same.
pub fn spread_eligible(w: &Workload, node: &NodeInfo) -> bool {
    node_selected(w, node)
        && node.taints_tolerated(&w.tolerations)
        && node.cordon_tolerated(&w.tolerations)
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
        .all(|(k, v)| node.labels.get(k).map(String::as_str) == Some(v))
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::spread_policy::WorkloadKind;

    pub(crate) const ZONE: &str = "topology.kubernetes.io/zone";
    pub(crate) const HOST: &str = "kubernetes.io/hostname";

    pub(crate) fn node(name: &str, zone: Option<&str>) -> NodeInfo {
        let mut labels = BTreeMap::from([(HOST.to_string(), name.to_string())]);
        if let Some(z) = zone {
            labels.insert(ZONE.into(), z.into());
        }
        NodeInfo {
            name: name.into(),
            labels,
            ready: true,
            ..Default::default()
        }
    }

    /// Zones a, b and c with nodes a0, a1, b0, b1, c0, c1.
    pub(crate) fn three_zones() -> Vec<NodeInfo> {
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

    pub(crate) fn taint(key: &str) -> Taint {
        Taint {
            key: key.into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        }
    }

    pub(crate) fn tolerate(key: &str) -> Toleration {
        Toleration {
            key: Some(key.into()),
            operator: Some("Exists".into()),
            ..Default::default()
        }
    }

    fn web() -> Workload {
        Workload {
            kind: WorkloadKind::Deployment,
            name: "web".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_cordoned_node_takes_only_pods_that_tolerate_the_cordon() {
        let mut n = node("a0", Some("a"));
        n.unschedulable = true;
        let mut w = web();
        assert!(!feasible(&w, &n));
        assert!(!spread_eligible(&w, &n), "a cordon counts as its taint");
        w.tolerations = vec![tolerate(UNSCHEDULABLE_TAINT)];
        assert!(feasible(&w, &n));
        assert!(spread_eligible(&w, &n));
    }

    #[test]
    fn a_node_that_is_not_ready_takes_nothing_but_still_counts_as_a_domain_until_tainted() {
        let mut n = node("a0", Some("a"));
        n.ready = false;
        assert!(!feasible(&web(), &n));
        // Topology spread looks at taints only; the not-ready taint takes it out.
        assert!(spread_eligible(&web(), &n));
        n.taints = vec![taint("node.kubernetes.io/not-ready")];
        assert!(!spread_eligible(&web(), &n));
    }

    #[test]
    fn prefer_no_schedule_taints_keep_nothing_out() {
        let mut n = node("a0", Some("a"));
        n.taints = vec![Taint {
            effect: "PreferNoSchedule".into(),
            ..taint("soft")
        }];
        assert!(feasible(&web(), &n));
        assert!(spread_eligible(&web(), &n));
    }

    #[test]
    fn node_selector_and_required_node_affinity_both_narrow_the_nodes() {
        let nodes = three_zones();
        let mut w = web();
        w.node_selector = [(ZONE, "a")].into();
        let names: Vec<&str> = nodes
            .iter()
            .filter(|n| feasible(&w, n))
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(names, ["a0", "a1"]);
        let mut w = web();
        w.affinity = serde_json::from_value(serde_json::json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["a", "b"]}]},
                                  {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a1"]}]}]}}}))
        .unwrap();
        let names: Vec<&str> = nodes
            .iter()
            .filter(|n| spread_eligible(&w, n))
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(names, ["a1", "c0", "c1"], "terms are ORed");
    }

    #[test]
    fn domains_are_counted_per_key() {
        let c = count_domains(ZONE, &three_zones());
        assert_eq!((c.domains, c.nodes, c.nodes_missing_label), (3, 6, 0));
        let h = count_domains(HOST, &three_zones());
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
