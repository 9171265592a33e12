//! Which workloads a policy selects, and which policy wins a workload that
//! several select: a SpreadPolicy of the workload's namespace before any
//! ClusterSpreadPolicy, then the highest `priority`, then the oldest, then the
//! name.
//!
//! Both kinds are seen through a [`Governor`]: a SpreadPolicy as it is, a
//! ClusterSpreadPolicy as a stand-in SpreadPolicy named
//! `ClusterSpreadPolicy/<name>` (the value its workloads' owner annotation
//! carries, which no SpreadPolicy name can be) with the namespaces it selects.

use crate::api::cluster_spread_policy::ClusterSpreadPolicy;
use crate::api::spread_policy::SpreadPolicy;
use crate::k8s::compact::Lookup;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use kube::ResourceExt;
use kube::api::ObjectMeta;
use std::{
    cmp::Ordering,
    collections::{BTreeMap, HashMap},
    ops::Deref,
    sync::Arc,
};

/// The labels of the namespaces in scope, by name.
pub type NamespaceLabels = HashMap<String, BTreeMap<String, String>>;

/// Where a policy applies.
#[derive(Clone, Debug, PartialEq)]
pub enum Scope {
    /// Its own namespace (a SpreadPolicy).
    Namespace,
    /// The namespaces whose labels `namespace_selector` matches (a ClusterSpreadPolicy).
    Cluster {
        namespace_selector: LabelSelector,
        namespaces: Arc<NamespaceLabels>,
    },
}

/// A policy as decisions see it (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct Governor {
    pub policy: SpreadPolicy,
    pub scope: Scope,
}

/// What a ClusterSpreadPolicy's workloads' owner annotation says.
pub fn cluster_owner(name: &str) -> String {
    format!("ClusterSpreadPolicy/{name}")
}

impl Governor {
    /// The stand-in of `cp`, seeing the namespaces in `namespaces`.
    pub fn cluster(cp: &ClusterSpreadPolicy, namespaces: Arc<NamespaceLabels>) -> Self {
        let m = &cp.metadata;
        Governor {
            policy: SpreadPolicy {
                metadata: ObjectMeta {
                    name: Some(cluster_owner(&cp.name_any())),
                    uid: m.uid.clone(),
                    generation: m.generation,
                    creation_timestamp: m.creation_timestamp.clone(),
                    deletion_timestamp: m.deletion_timestamp.clone(),
                    ..Default::default()
                },
                spec: cp.spec.policy.clone(),
                status: None,
            },
            scope: Scope::Cluster {
                namespace_selector: cp.spec.namespace_selector.clone(),
                namespaces,
            },
        }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.scope, Scope::Cluster { .. })
    }

    /// `SpreadPolicy web-ha` or `ClusterSpreadPolicy zones`, as messages name it.
    pub fn display(&self) -> String {
        let name = self.policy.name_any();
        if self.is_cluster() {
            name.replacen('/', " ", 1)
        } else {
            format!("SpreadPolicy {name}")
        }
    }

    /// Whether the policy applies in namespace `ns`.
    pub fn covers(&self, ns: &str) -> bool {
        match &self.scope {
            Scope::Namespace => self.policy.namespace().as_deref() == Some(ns),
            Scope::Cluster {
                namespace_selector,
                namespaces,
            } => namespaces
                .get(ns)
                .is_some_and(|labels| matches(namespace_selector, labels)),
        }
    }
}

impl From<SpreadPolicy> for Governor {
    fn from(policy: SpreadPolicy) -> Self {
        Governor {
            policy,
            scope: Scope::Namespace,
        }
    }
}

impl Deref for Governor {
    type Target = SpreadPolicy;
    fn deref(&self) -> &SpreadPolicy {
        &self.policy
    }
}

impl AsRef<Governor> for Governor {
    fn as_ref(&self) -> &Governor {
        self
    }
}

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
pub fn matches(sel: &LabelSelector, labels: &(impl Lookup + ?Sized)) -> bool {
    if validate_selector(sel).is_err() {
        return false;
    }
    let labels_ok = sel
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.lookup(k) == Some(v.as_str()));
    labels_ok
        && sel
            .match_expressions
            .iter()
            .flatten()
            .all(|e| requirement(e, labels))
}

fn requirement(e: &LabelSelectorRequirement, labels: &(impl Lookup + ?Sized)) -> bool {
    let values = e.values.as_deref().unwrap_or_default();
    let has = |v: &str| values.iter().any(|x| x == v);
    match e.operator.as_str() {
        "In" => labels.lookup(&e.key).is_some_and(has),
        "NotIn" => labels.lookup(&e.key).is_none_or(|v| !has(v)),
        "Exists" => labels.lookup(&e.key).is_some(),
        "DoesNotExist" => labels.lookup(&e.key).is_none(),
        _ => false,
    }
}

/// Whether `policy` selects `workload`: a namespace it covers, a kind it lists,
/// and labels its selector matches. Policies being deleted select nothing.
pub fn selects(policy: &Governor, workload: &Workload) -> bool {
    policy.metadata.deletion_timestamp.is_none()
        && policy.covers(&workload.namespace)
        && policy.spec.kinds.contains(&workload.kind)
        && matches(&policy.spec.selector, &workload.labels)
}

/// Orders policies so that the winner comes first: a SpreadPolicy before a
/// ClusterSpreadPolicy, then higher priority, then older, then the smaller name.
pub fn precedence(a: &Governor, b: &Governor) -> Ordering {
    a.is_cluster()
        .cmp(&b.is_cluster())
        .then_with(|| b.spec.priority.cmp(&a.spec.priority))
        .then_with(|| {
            a.metadata
                .creation_timestamp
                .cmp(&b.metadata.creation_timestamp)
        })
        .then_with(|| a.name_any().cmp(&b.name_any()))
}

/// The policy that governs `workload` among `policies`, if any selects it.
pub fn winner<'a, P: AsRef<Governor>>(
    policies: &'a [P],
    workload: &Workload,
) -> Option<&'a Governor> {
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

    fn arcs(ps: Vec<SpreadPolicy>) -> Vec<std::sync::Arc<Governor>> {
        ps.into_iter()
            .map(|p| std::sync::Arc::new(Governor::from(p)))
            .collect()
    }

    fn cluster(name: &str, priority: i32, team: &str) -> Governor {
        let cp: ClusterSpreadPolicy = serde_json::from_value(json!({
            "apiVersion": "ballast.dev/v1alpha1", "kind": "ClusterSpreadPolicy",
            "metadata": {"name": name, "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"namespaceSelector": {"matchLabels": {"team": team}},
                     "selector": {"matchLabels": {"tier": "web"}}, "priority": priority,
                     "spread": [{"topologyKey": "topology.kubernetes.io/zone", "mode": "Required"}]},
        }))
        .unwrap();
        let namespaces = NamespaceLabels::from([
            ("shop".to_string(), labels(&[("team", "a")])),
            ("other".to_string(), labels(&[("team", "b")])),
        ]);
        Governor::cluster(&cp, Arc::new(namespaces))
    }

    #[test]
    fn a_namespaced_policy_wins_over_any_cluster_policy_and_cluster_policies_go_by_priority() {
        let w = web();
        let mut ps = vec![
            Arc::new(cluster("zones", 1000, "a")),
            Arc::new(Governor::from(policy("local", -1000, 999))),
        ];
        assert_eq!(winner(&ps, &w).unwrap().name_any(), "local");
        ps.remove(1);
        ps.push(Arc::new(cluster("hosts", 1001, "a")));
        let g = winner(&ps, &w).unwrap();
        assert_eq!(
            (g.name_any(), g.display()),
            (
                "ClusterSpreadPolicy/hosts".to_string(),
                "ClusterSpreadPolicy hosts".to_string()
            )
        );
        // Only the namespaces its selector picks.
        let elsewhere = vec![Arc::new(cluster("b-only", 0, "b"))];
        assert!(winner(&elsewhere, &w).is_none());
    }

    fn web() -> Workload {
        Workload {
            kind: WorkloadKind::Deployment,
            name: "web".into(),
            namespace: "shop".into(),
            labels: [("tier", "web")].into(),
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
        assert!(!selects(&Governor::from(p), &web()));
    }
}
