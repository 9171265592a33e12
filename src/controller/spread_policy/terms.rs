//! What one policy wants in one workload's pod template: the desired terms,
//! computed from the policy's spec and the workload's own selector. Pure.

use crate::api::spread_policy::{Method, Mode, PodTerm, SpreadPolicySpec, WorkloadKind};
use k8s_openapi::api::core::v1::{
    PodAffinityTerm, TopologySpreadConstraint, WeightedPodAffinityTerm,
};
use serde::{Deserialize, Serialize};

/// The node inclusion policy ballast sets on its topology spread constraints, for both
/// `nodeAffinityPolicy` and `nodeTaintsPolicy`: only nodes the pod may run on (its nodeSelector
/// and required node affinity match, every NoSchedule/NoExecute taint tolerated, which takes out
/// cordoned and NotReady nodes through the taints their controller sets) count as domains.
/// The scheduler's default for taints is `Ignore`: a cordoned zone would count as a domain with
/// no pods, and `DoNotSchedule` would then keep pods Pending that the remaining zones could run.
pub const NODE_INCLUSION_POLICY: &str = "Honor";

/// The label the Deployment controller puts on every pod of one revision.
/// Matching on it keeps a rolling update with `maxSurge > 0` from
/// deadlocking when replicas equal the number of domains: new pods only
/// repel new pods.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// Affinity terms and topology spread constraints, by the list they live in.
/// Also the shape of the record ballast keeps on each workload of what it
/// injected (`ballast.dev/spread-terms`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Terms {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anti_affinity_required: Vec<PodAffinityTerm>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub anti_affinity_preferred: Vec<WeightedPodAffinityTerm>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub affinity_required: Vec<PodAffinityTerm>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub affinity_preferred: Vec<WeightedPodAffinityTerm>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
}

impl Terms {
    pub fn is_empty(&self) -> bool {
        self.anti_affinity_required.is_empty()
            && self.anti_affinity_preferred.is_empty()
            && self.affinity_required.is_empty()
            && self.affinity_preferred.is_empty()
            && self.topology_spread_constraints.is_empty()
    }

    /// How many terms in all.
    pub fn len(&self) -> usize {
        self.anti_affinity_required.len()
            + self.anti_affinity_preferred.len()
            + self.affinity_required.len()
            + self.affinity_preferred.len()
            + self.topology_spread_constraints.len()
    }
}

/// The key of a topology spread constraint in its list-map.
pub fn constraint_key(c: &TopologySpreadConstraint) -> (&str, &str) {
    (c.topology_key.as_str(), c.when_unsatisfiable.as_str())
}

fn push_unique<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if !list.contains(&item) {
        list.push(item);
    }
}

fn pod_term(t: &PodTerm) -> PodAffinityTerm {
    PodAffinityTerm {
        label_selector: Some(t.label_selector.clone()),
        topology_key: t.topology_key.clone(),
        ..Default::default()
    }
}

fn add_pod_term(
    required: &mut Vec<PodAffinityTerm>,
    preferred: &mut Vec<WeightedPodAffinityTerm>,
    t: &PodTerm,
) {
    match t.mode {
        Mode::Required => push_unique(required, pod_term(t)),
        Mode::Preferred => push_unique(
            preferred,
            WeightedPodAffinityTerm {
                pod_affinity_term: pod_term(t),
                weight: t.effective_weight(),
            },
        ),
    }
}

/// The terms `spec` asks for in a workload of `kind` whose own selector is
/// `selector`, in the order the spec lists them, without duplicates.
pub fn desired_terms(
    spec: &SpreadPolicySpec,
    kind: WorkloadKind,
    selector: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
) -> Terms {
    let mut t = Terms::default();
    let match_label_keys =
        (kind == WorkloadKind::Deployment).then(|| vec![POD_TEMPLATE_HASH.to_string()]);
    for s in &spec.spread {
        match s.method {
            Method::AntiAffinity => {
                let term = PodAffinityTerm {
                    label_selector: Some(selector.clone()),
                    topology_key: s.topology_key.clone(),
                    match_label_keys: match_label_keys.clone(),
                    ..Default::default()
                };
                match s.mode {
                    Mode::Required => push_unique(&mut t.anti_affinity_required, term),
                    Mode::Preferred => push_unique(
                        &mut t.anti_affinity_preferred,
                        WeightedPodAffinityTerm {
                            pod_affinity_term: term,
                            weight: s.effective_weight(),
                        },
                    ),
                }
            }
            Method::TopologySpread => {
                let c = TopologySpreadConstraint {
                    label_selector: Some(selector.clone()),
                    match_label_keys: match_label_keys.clone(),
                    max_skew: s.effective_max_skew(),
                    min_domains: if s.mode == Mode::Required {
                        s.min_domains
                    } else {
                        None
                    },
                    topology_key: s.topology_key.clone(),
                    node_affinity_policy: Some(NODE_INCLUSION_POLICY.into()),
                    node_taints_policy: Some(NODE_INCLUSION_POLICY.into()),
                    when_unsatisfiable: match s.mode {
                        Mode::Required => "DoNotSchedule".into(),
                        Mode::Preferred => "ScheduleAnyway".into(),
                    },
                };
                // A list-map: one constraint per (topologyKey, whenUnsatisfiable).
                if !t
                    .topology_spread_constraints
                    .iter()
                    .any(|o| constraint_key(o) == constraint_key(&c))
                {
                    t.topology_spread_constraints.push(c);
                }
            }
        }
    }
    for c in &spec.colocate {
        add_pod_term(&mut t.affinity_required, &mut t.affinity_preferred, c);
    }
    for s in &spec.separate {
        add_pod_term(
            &mut t.anti_affinity_required,
            &mut t.anti_affinity_preferred,
            s,
        );
    }
    t
}

/// Two TopologySpread entries with the same key and mode would be one
/// list-map entry: the spec is ambiguous. Returns a message naming them.
pub fn duplicate_constraints(spec: &SpreadPolicySpec) -> Option<String> {
    let mut seen = Vec::new();
    for s in spec
        .spread
        .iter()
        .filter(|s| s.method == Method::TopologySpread)
    {
        let key = (s.topology_key.as_str(), s.mode);
        if seen.contains(&key) {
            return Some(format!(
                "spec.spread has two TopologySpread entries for topologyKey {:?} with mode {:?}; a pod can carry only one",
                s.topology_key, s.mode
            ));
        }
        seen.push(key);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(v: serde_json::Value) -> SpreadPolicySpec {
        serde_json::from_value(v).unwrap()
    }

    fn web_selector() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
        serde_json::from_value(json!({"matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "track", "operator": "In", "values": ["stable"]}]}))
        .unwrap()
    }

    #[test]
    fn required_anti_affinity_uses_the_workloads_own_selector_and_the_template_hash() {
        let s = spec(json!({"selector": {"matchLabels": {"tier": "web"}},
            "spread": [{"topologyKey": "topology.kubernetes.io/zone", "mode": "Required"}]}));
        let t = desired_terms(&s, WorkloadKind::Deployment, &web_selector());
        assert_eq!(t.anti_affinity_required.len(), 1);
        let term = &t.anti_affinity_required[0];
        assert_eq!(term.label_selector.as_ref(), Some(&web_selector()));
        assert_eq!(term.topology_key, "topology.kubernetes.io/zone");
        assert_eq!(
            term.match_label_keys.as_deref(),
            Some(&["pod-template-hash".to_string()][..])
        );
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn stateful_sets_get_no_template_hash_key() {
        let s = spec(json!({"selector": {"matchLabels": {"tier": "web"}},
            "spread": [{"topologyKey": "kubernetes.io/hostname", "mode": "Preferred", "weight": 40}]}));
        let t = desired_terms(&s, WorkloadKind::StatefulSet, &web_selector());
        let w = &t.anti_affinity_preferred[0];
        assert_eq!(w.weight, 40);
        assert_eq!(w.pod_affinity_term.match_label_keys, None);
    }

    #[test]
    fn preferred_without_weight_weighs_100() {
        let s = spec(json!({"selector": {"matchLabels": {"tier": "web"}},
            "spread": [{"topologyKey": "kubernetes.io/hostname", "mode": "Preferred"}]}));
        let t = desired_terms(&s, WorkloadKind::Deployment, &web_selector());
        assert_eq!(t.anti_affinity_preferred[0].weight, 100);
    }

    #[test]
    fn topology_spread_becomes_a_constraint_with_skew_domains_and_when_unsatisfiable() {
        let s = spec(json!({"selector": {"matchLabels": {"tier": "web"}},
            "spread": [
                {"topologyKey": "topology.kubernetes.io/zone", "mode": "Required", "method": "TopologySpread", "maxSkew": 2, "minDomains": 3},
                {"topologyKey": "kubernetes.io/hostname", "mode": "Preferred", "method": "TopologySpread"}]}));
        let t = desired_terms(&s, WorkloadKind::Deployment, &web_selector());
        let [zone, host] = &t.topology_spread_constraints[..] else {
            panic!("{t:?}")
        };
        assert_eq!(
            (
                zone.max_skew,
                zone.min_domains,
                zone.when_unsatisfiable.as_str()
            ),
            (2, Some(3), "DoNotSchedule")
        );
        assert_eq!(
            (
                host.max_skew,
                host.min_domains,
                host.when_unsatisfiable.as_str()
            ),
            (1, None, "ScheduleAnyway")
        );
        assert_eq!(
            zone.match_label_keys.as_deref(),
            Some(&["pod-template-hash".to_string()][..])
        );
        assert_eq!(zone.label_selector.as_ref(), Some(&web_selector()));
        for c in [zone, host] {
            assert_eq!(
                (
                    c.node_affinity_policy.as_deref(),
                    c.node_taints_policy.as_deref()
                ),
                (Some("Honor"), Some("Honor")),
                "only nodes the pods may run on count as domains"
            );
        }
    }

    #[test]
    fn colocate_becomes_pod_affinity_and_separate_pod_anti_affinity() {
        let s = spec(json!({"selector": {"matchLabels": {"tier": "web"}},
            "colocate": [{"labelSelector": {"matchLabels": {"app": "cache"}}, "topologyKey": "topology.kubernetes.io/zone", "mode": "Preferred", "weight": 50}],
            "separate": [{"labelSelector": {"matchLabels": {"app": "batch"}}, "topologyKey": "kubernetes.io/hostname", "mode": "Required"}]}));
        let t = desired_terms(&s, WorkloadKind::Deployment, &web_selector());
        assert_eq!(t.affinity_preferred[0].weight, 50);
        let cache: k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector =
            serde_json::from_value(json!({"matchLabels": {"app": "cache"}})).unwrap();
        assert_eq!(
            t.affinity_preferred[0].pod_affinity_term.label_selector,
            Some(cache)
        );
        assert_eq!(
            t.anti_affinity_required[0].topology_key,
            "kubernetes.io/hostname"
        );
        assert_eq!(
            t.anti_affinity_required[0].match_label_keys, None,
            "only own siblings use the hash"
        );
    }

    #[test]
    fn repeated_entries_yield_one_term() {
        let s = spec(json!({"selector": {"matchLabels": {"tier": "web"}},
            "spread": [{"topologyKey": "z", "mode": "Required"}, {"topologyKey": "z", "mode": "Required"}]}));
        assert_eq!(
            desired_terms(&s, WorkloadKind::Deployment, &web_selector()).len(),
            1
        );
    }

    #[test]
    fn two_topology_spreads_with_one_key_and_mode_are_reported() {
        let s = spec(json!({"selector": {"matchLabels": {"tier": "web"}},
            "spread": [{"topologyKey": "z", "mode": "Required", "method": "TopologySpread"},
                       {"topologyKey": "z", "mode": "Required", "method": "TopologySpread", "maxSkew": 2}]}));
        assert!(duplicate_constraints(&s).unwrap().contains("\"z\""));
    }

    #[test]
    fn the_record_round_trips_through_json() {
        let s = spec(json!({"selector": {"matchLabels": {"tier": "web"}},
            "spread": [{"topologyKey": "z", "mode": "Required"}, {"topologyKey": "h", "mode": "Preferred", "method": "TopologySpread"}]}));
        let t = desired_terms(&s, WorkloadKind::Deployment, &web_selector());
        let text = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<Terms>(&text).unwrap(), t);
        assert_eq!(
            serde_json::to_string(&serde_json::from_str::<Terms>(&text).unwrap()).unwrap(),
            text
        );
    }
}
