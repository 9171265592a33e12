//! Which workloads a policy selects, and which policy wins a workload that
//! several select: the highest `priority`, then the oldest, then the name.

use crate::api::spread_policy::SpreadPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::ResourceExt;
use std::{cmp::Ordering, collections::BTreeMap};

use super::workload::Workload;

/// A label selector that cannot be evaluated (the API server would reject
/// it too): an unknown operator, or values where none are allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector: {0}")]
pub struct InvalidSelector(pub String);

/// Checks a selector the way the API server validates one.
pub fn validate_selector(sel: &LabelSelector) -> Result<(), InvalidSelector> {
    for e in sel.match_expressions.iter().flatten() {
        let n = e.values.as_ref().map_or(0, Vec::len);
        match e.operator.as_str() {
            "In" | "NotIn" if n == 0 => {
                return Err(InvalidSelector(format!(
                    "key {:?}: operator {} needs at least one value",
                    e.key, e.operator
                )));
            }
            "Exists" | "DoesNotExist" if n > 0 => {
                return Err(InvalidSelector(format!(
                    "key {:?}: operator {} takes no values",
                    e.key, e.operator
                )));
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => {
                return Err(InvalidSelector(format!(
                    "key {:?}: unknown operator {other:?} (In, NotIn, Exists, DoesNotExist)",
                    e.key
                )));
            }
        }
    }
    Ok(())
}

/// Whether `labels` satisfy `sel`. An invalid selector matches nothing.
pub fn matches(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    if validate_selector(sel).is_err() {
        return false;
    }
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    labels_ok
        && sel
            .match_expressions
            .iter()
            .flatten()
            .all(|e| requirement(e, labels))
}

fn requirement(e: &LabelSelectorRequirement, labels: &BTreeMap<String, String>) -> bool {
    let values = e.values.as_deref().unwrap_or_default();
    match e.operator.as_str() {
        "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
        "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
        "Exists" => labels.contains_key(&e.key),
        "DoesNotExist" => !labels.contains_key(&e.key),
        _ => false,
    }
}

/// Whether `policy` selects `workload`: same namespace, a kind it lists, and
/// labels its selector matches. Policies being deleted select nothing.
pub fn selects(policy: &SpreadPolicy, workload: &Workload) -> bool {
    policy.metadata.deletion_timestamp.is_none()
        && policy.namespace().as_deref() == Some(workload.namespace.as_str())
        && policy.spec.kinds.contains(&workload.kind)
        && matches(&policy.spec.selector, &workload.labels)
}

/// Orders policies so that the winner comes first: higher priority, then
/// older, then the smaller name.
pub fn precedence(a: &SpreadPolicy, b: &SpreadPolicy) -> Ordering {
    b.spec
        .priority
        .cmp(&a.spec.priority)
        .then_with(|| {
            a.metadata
                .creation_timestamp
                .cmp(&b.metadata.creation_timestamp)
        })
        .then_with(|| a.name_any().cmp(&b.name_any()))
}

/// The policy that governs `workload` among `policies`, if any selects it.
pub fn winner<'a, P: AsRef<SpreadPolicy>>(
    policies: &'a [P],
    workload: &Workload,
) -> Option<&'a SpreadPolicy> {
    policies
        .iter()
        .map(AsRef::as_ref)
        .filter(|p| selects(p, workload))
        .min_by(|a, b| precedence(a, b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::spread_policy::WorkloadKind;
    use jiff::Timestamp;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn selector(v: serde_json::Value) -> LabelSelector {
        serde_json::from_value(v).unwrap()
    }

    pub(crate) fn policy(name: &str, priority: i32, created: i64) -> SpreadPolicy {
        let mut p: SpreadPolicy = serde_json::from_value(json!({
            "apiVersion": "ballast.dev/v1alpha1", "kind": "SpreadPolicy",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {"selector": {"matchLabels": {"tier": "web"}}, "priority": priority,
                     "spread": [{"topologyKey": "topology.kubernetes.io/zone", "mode": "Required"}]},
        }))
        .unwrap();
        p.metadata.creation_timestamp = Some(Time(Timestamp::from_second(created).unwrap()));
        p
    }

    fn arcs(ps: Vec<SpreadPolicy>) -> Vec<std::sync::Arc<SpreadPolicy>> {
        ps.into_iter().map(std::sync::Arc::new).collect()
    }

    fn web() -> Workload {
        Workload {
            kind: WorkloadKind::Deployment,
            name: "web".into(),
            namespace: "shop".into(),
            labels: labels(&[("tier", "web")]),
            ..Default::default()
        }
    }

    #[test]
    fn match_labels_and_expressions_must_all_hold() {
        let sel = selector(json!({"matchLabels": {"tier": "web"},
            "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "stage"]},
                                 {"key": "legacy", "operator": "DoesNotExist"}]}));
        assert!(matches(&sel, &labels(&[("tier", "web"), ("env", "prod")])));
        assert!(!matches(&sel, &labels(&[("tier", "web"), ("env", "dev")])));
        assert!(!matches(
            &sel,
            &labels(&[("tier", "web"), ("env", "prod"), ("legacy", "1")])
        ));
        assert!(!matches(&sel, &labels(&[("env", "prod")])));
    }

    #[test]
    fn not_in_matches_a_missing_key_and_exists_does_not() {
        let not_in = selector(
            json!({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]}]}),
        );
        assert!(matches(&not_in, &labels(&[])));
        let exists = selector(json!({"matchExpressions": [{"key": "env", "operator": "Exists"}]}));
        assert!(!matches(&exists, &labels(&[])));
    }

    #[test]
    fn an_invalid_selector_matches_nothing_and_says_why() {
        let sel = selector(
            json!({"matchExpressions": [{"key": "env", "operator": "Near", "values": ["x"]}]}),
        );
        assert!(!matches(&sel, &labels(&[("env", "x")])));
        let err = validate_selector(&sel).unwrap_err();
        assert!(
            err.to_string().contains("unknown operator \"Near\""),
            "{err}"
        );
        let empty_in = selector(json!({"matchExpressions": [{"key": "env", "operator": "In"}]}));
        assert!(validate_selector(&empty_in).is_err());
    }

    #[test]
    fn the_higher_priority_wins_then_the_older_then_the_name() {
        let w = web();
        let ps = arcs(vec![
            policy("b", 0, 100),
            policy("a", 0, 200),
            policy("c", 5, 300),
        ]);
        assert_eq!(winner(&ps, &w).unwrap().name_any(), "c");
        let ps = arcs(vec![policy("b", 0, 100), policy("a", 0, 200)]);
        assert_eq!(winner(&ps, &w).unwrap().name_any(), "b", "older wins a tie");
        let ps = arcs(vec![policy("b", 0, 100), policy("a", 0, 100)]);
        assert_eq!(winner(&ps, &w).unwrap().name_any(), "a", "then the name");
    }

    #[test]
    fn a_policy_being_deleted_or_in_another_namespace_selects_nothing() {
        let w = web();
        let mut deleting = policy("a", 10, 100);
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        let mut elsewhere = policy("b", 10, 100);
        elsewhere.metadata.namespace = Some("other".into());
        let ps = arcs(vec![deleting, elsewhere, policy("c", 0, 100)]);
        assert_eq!(winner(&ps, &w).unwrap().name_any(), "c");
    }

    #[test]
    fn kinds_restrict_the_selection() {
        let mut p = policy("a", 0, 100);
        p.spec.kinds = vec![WorkloadKind::StatefulSet];
        assert!(!selects(&p, &web()));
    }
}
