//! The `ClusterSpreadPolicy` kind: a platform default. The same spec as a SpreadPolicy, applied
//! to the workloads of every namespace its `namespaceSelector` picks. A SpreadPolicy that governs
//! the same workload wins whatever the priorities; among cluster policies the priority rule of
//! SpreadPolicy holds. Only cluster admins should write it (its RBAC is a role of its own).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{conditions_schema, label_selector_schema, unwrap_descriptions};
use super::spread_distribution::SpreadDistribution;
use super::spread_policy::{SpreadPolicySpec, TopologyDomains, WorkloadStatus};

/// Most namespaces listed in `status.namespaces`.
pub const MAX_NAMESPACE_STATUSES: usize = 50;

/// Which namespaces' workloads to spread, and how: a SpreadPolicy for every namespace that
/// `namespaceSelector` selects. A SpreadPolicy in a namespace that selects the same workload
/// wins, whatever the priorities.
// Each printcolumn(...) repeats `type_ = ...`; clippy mistakes that for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ballast.dev",
    version = "v1alpha1",
    kind = "ClusterSpreadPolicy",
    plural = "clusterspreadpolicies",
    singular = "clusterspreadpolicy",
    shortname = "cspol",
    category = "ballast",
    status = "ClusterSpreadPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "A platform default: spreads the Deployments and StatefulSets of every namespace its namespaceSelector selects, like a SpreadPolicy in each. A SpreadPolicy governing the same workload wins.",
    printcolumn(
        name = "Namespaces",
        type_ = "integer",
        description = "Namespaces with workloads this policy selects",
        json_path = ".status.selectedNamespaces"
    ),
    printcolumn(
        name = "Matched",
        type_ = "integer",
        description = "Workloads this policy selects",
        json_path = ".status.matched"
    ),
    printcolumn(
        name = "Applied",
        type_ = "integer",
        description = "Workloads whose pod template carries this policy's terms",
        json_path = ".status.applied"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        description = "Whether every governed workload is converged",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Infeasible",
        type_ = "string",
        description = "Whether a Required spread leaves pods Pending (the Infeasible condition)",
        json_path = ".status.conditions[?(@.type==\"Infeasible\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    printcolumn(
        name = "Message",
        type_ = "string",
        description = "The Ready condition's message",
        json_path = ".status.conditions[?(@.type==\"Ready\")].message",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = unwrap_descriptions)]
pub struct ClusterSpreadPolicySpec {
    /// Selects the namespaces (by their labels) whose workloads this policy spreads. Required
    /// and non-empty: to pick every namespace but some, say so, e.g.
    /// `{matchExpressions: [{key: kubernetes.io/metadata.name, operator: NotIn, values: [kube-system]}]}`.
    #[schemars(schema_with = "label_selector_schema")]
    pub namespace_selector: LabelSelector,

    /// Everything a SpreadPolicy's spec says, with the same defaults and rules. `selector`
    /// selects workloads in each selected namespace; `colocate` and `separate` look at pods in
    /// the workload's own namespace; `rollout.maxConcurrent` counts across all namespaces.
    #[serde(flatten)]
    pub policy: SpreadPolicySpec,
}

/// Observed state of a ClusterSpreadPolicy. Written by the operator only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = unwrap_descriptions)]
pub struct ClusterSpreadPolicyStatus {
    /// The `.metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`, `Progressing`, `Conflicted`, `Infeasible` and `Skewed`, over all selected
    /// namespaces. `lastTransitionTime` moves only when a condition's status changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,

    /// Selected namespaces that hold workloads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_namespaces: Option<i32>,

    /// Workloads the selectors and kinds match, over all namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<i32>,

    /// Matched workloads whose pod template carries this policy's current terms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<i32>,

    /// Failure domains visible among schedulable nodes, per topology key the policy uses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<TopologyDomains>,

    /// Per namespace, at most 50 (those needing attention first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["namespace"]))]
    pub namespaces: Vec<NamespaceStatus>,

    /// Per-workload state, at most 50 (workloads needing attention first), with namespaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub workloads: Vec<WorkloadStatus>,

    /// Where the governed workloads' pods run, over all namespaces (see SpreadPolicy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<SpreadDistribution>,
}

/// What the policy does in one namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceStatus {
    /// The namespace.
    pub namespace: String,
    /// Workloads the policy selects here.
    #[serde(default)]
    pub matched: i32,
    /// Of those, the ones governed by this policy that carry its terms.
    #[serde(default)]
    pub applied: i32,
    /// Of those, the ones a SpreadPolicy here (or a cluster policy of higher precedence) governs.
    #[serde(default)]
    pub conflicted: i32,
    /// Pods the Required spreads leave Pending here.
    #[serde(default)]
    pub infeasible_pods: i64,
    /// Governed workloads here whose running pods are off the spread.
    #[serde(default)]
    pub skewed: i32,
    /// `Applied`, `Pending` (writes to make or waiting), `Conflicted` (nothing governed here)
    /// or `Error`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn the_spec_is_a_spread_policy_spec_with_a_namespace_selector_and_its_rules() {
        let crd = ClusterSpreadPolicy::crd();
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&["cspol".to_string()][..])
        );
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let spec = &schema["openAPIV3Schema"]["properties"]["spec"];
        let mut required: Vec<&str> = spec["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        required.sort();
        assert_eq!(required, ["namespaceSelector", "selector"]);
        let text = serde_json::to_string(spec).unwrap();
        for rule in [
            "at least one of spread, colocate or separate must be set",
            "weight is only allowed when mode is Preferred",
            "minInterval must be from 1s to 24h",
            "selector must not be empty",
        ] {
            assert!(text.contains(rule), "missing rule: {rule}");
        }
        assert_eq!(
            spec["properties"]["kinds"]["default"],
            serde_json::json!(["Deployment", "StatefulSet"])
        );
        let p: ClusterSpreadPolicy = serde_yaml::from_str(
            "apiVersion: ballast.dev/v1alpha1\nkind: ClusterSpreadPolicy\nmetadata: {name: zones}\nspec:\n  namespaceSelector: {matchLabels: {team: a}}\n  selector: {matchLabels: {tier: web}}\n  spread: [{topologyKey: z, mode: Preferred}]\n",
        )
        .unwrap();
        assert_eq!(p.spec.policy.spread.len(), 1);
        assert_eq!(p.spec.policy.rollout.max_concurrent, 1);
    }
}
