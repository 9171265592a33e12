//! The `SpreadPolicy` kind: which workloads to spread, across which failure domains, and how hard.
//!
//! Everything the API server can check on its own (shapes, ranges, and the cross-field rules as
//! CEL) is declared here, so the controller only ever sees specs that make sense.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{
    LABEL_KEY_MAX_LENGTH, LABEL_KEY_PATTERN, conditions_schema, int_or_string_schema,
    label_selector_schema, unwrap_descriptions,
};
use super::spread_distribution::SpreadDistribution;

/// Most per-workload entries kept in `status.workloads`.
pub const MAX_WORKLOAD_STATUSES: usize = 50;

/// Weight of a `Preferred` term that does not set one.
pub const DEFAULT_PREFERRED_WEIGHT: i32 = 100;

/// The largest count the API accepts (`maxSkew`, `minDomains`, `rollout.maxConcurrent`): far
/// above any real cluster, and bounded at admission so that every stored policy decodes into
/// the controller's `i32`s (whose arithmetic on them saturates).
pub const MAX_COUNT: i32 = 1_000_000;

/// Which workloads to spread, and how. The operator writes pod affinity, pod anti-affinity and
/// topology spread constraints into the pod template of every matching workload in this
/// namespace, and removes exactly what it wrote when the policy goes away or the workload stops
/// matching. Terms written by users are never touched.
// Each printcolumn(...) repeats `type_ = ...`; clippy mistakes that for a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ballast.dev",
    version = "v1alpha1",
    kind = "SpreadPolicy",
    plural = "spreadpolicies",
    singular = "spreadpolicy",
    shortname = "spol",
    category = "ballast",
    namespaced,
    status = "SpreadPolicyStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "Spreads the replicas of existing Deployments and StatefulSets across failure domains (zones, hosts, racks, or any node label) by reconciling affinity terms into their pod templates.",
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
        description = "Whether every matched workload is converged",
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
#[x_kube(validation = Rule::new(
    "(has(self.spread) && size(self.spread) > 0) || (has(self.colocate) && size(self.colocate) > 0) || (has(self.separate) && size(self.separate) > 0)"
).message("at least one of spread, colocate or separate must be set"))]
#[schemars(transform = unwrap_descriptions)]
pub struct SpreadPolicySpec {
    /// Selects the workloads (Deployments and StatefulSets, by the labels on the workload
    /// objects themselves, not on their pods) in this namespace. Required and non-empty.
    #[schemars(schema_with = "label_selector_schema")]
    pub selector: LabelSelector,

    /// Kinds of workload the policy applies to. Defaults to both Deployment and StatefulSet.
    #[serde(default = "default_kinds")]
    #[schemars(length(min = 1, max = 2), extend("x-kubernetes-list-type" = "set"))]
    pub kinds: Vec<WorkloadKind>,

    /// When several policies match one workload, the one with the highest priority is applied;
    /// on a tie the oldest policy wins, then the one whose name sorts first. The others report
    /// the workload in their `Conflicted` condition. Range -1000..1000, default 0.
    #[serde(default)]
    #[schemars(range(min = -1000, max = 1000))]
    pub priority: i32,

    /// When true the operator writes nothing new, and leaves what it already wrote in place.
    /// Status is still reported. Default false.
    #[serde(default)]
    pub suspend: bool,

    /// Spread the replicas of each matched workload away from each other (their "siblings").
    /// The sibling selector is derived from the workload's own `spec.selector`; for Deployments
    /// the terms also carry `matchLabelKeys: [pod-template-hash]`, so a rolling update never
    /// deadlocks when replicas equal the number of domains. At most 16 terms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub spread: Vec<SpreadTerm>,

    /// Pod affinity: schedule the workload's pods near pods matching these selectors (in this
    /// namespace), within the same topology domain. At most 16 terms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub colocate: Vec<PodTerm>,

    /// Pod anti-affinity: keep the workload's pods out of topology domains that hold pods
    /// matching these selectors (in this namespace). At most 16 terms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub separate: Vec<PodTerm>,

    /// Paces the pod-template changes (and therefore rollouts) this policy causes.
    #[serde(default)]
    pub rollout: RolloutPacing,

    /// What happens to the written terms when the policy is deleted: `Remove` (default) takes
    /// exactly the operator's terms out of each workload; `Orphan` leaves them in place.
    #[serde(default)]
    pub deletion_policy: DeletionPolicy,

    /// How a governed Deployment loses pods when it is scaled down. `Default`: the ReplicaSet
    /// controller's own order, which ignores domains (it may empty the emptiest zone first).
    /// `Balanced`: the operator keeps `controller.kubernetes.io/pod-deletion-cost` on the pods
    /// so that the most crowded domain of the first spread term loses pods first. StatefulSets
    /// always remove their highest ordinal and are not affected.
    #[serde(default, skip_serializing_if = "is_default")]
    pub scale_down: ScaleDown,

    /// Moves running pods back into an even spread when a better placement becomes possible
    /// (a zone back after an outage): pods of the most crowded domains are evicted through the
    /// Eviction API, which honours PodDisruptionBudgets, one batch at a time, and the scheduler
    /// places their replacements. Only for `Required` `TopologySpread` terms, where the
    /// scheduler cannot put a replacement back where it was. Absent: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rebalance: Option<Rebalance>,
}

/// How rebalancing evicts.
#[derive(KubeSchema, Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rebalance {
    /// How many of a workload's replicas may be unavailable while it is rebalanced: a count
    /// (at least 1) or a percent of `spec.replicas` (rounded down, at least 1 pod). Pods are
    /// evicted only while fewer than this are unavailable, so availability never drops below
    /// the replicas minus this. Default 1.
    #[serde(default = "default_max_unavailable")]
    #[schemars(schema_with = "int_or_string_schema")]
    #[x_kube(
        validation = Rule::new("type(self) == int ? (self >= 1 && self <= 1000000) : self.matches('^([1-9][0-9]?|100)%$')")
            .message("maxUnavailable must be a count from 1 to 1000000 or a percent from 1% to 100%")
    )]
    pub max_unavailable: IntOrString,

    /// Least time between two batches of evictions of one workload, as a duration such as
    /// `30s`, `5m` or `1h30m`, from 1s to 24h. Default `30s`.
    #[serde(default = "default_min_interval")]
    #[schemars(length(min = 2, max = 16), pattern(r"^([0-9]{1,5}(h|m|s))+$"))]
    #[x_kube(
        validation = Rule::new("!self.matches('^([0-9]{1,5}(h|m|s))+$') || (duration(self) >= duration('1s') && duration(self) <= duration('24h'))")
            .message("minInterval must be from 1s to 24h")
    )]
    pub min_interval: String,
}

fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
}

fn default_min_interval() -> String {
    "30s".into()
}

impl Rebalance {
    /// `maxUnavailable` for a workload of `replicas`: at least 1.
    pub fn max_unavailable_of(&self, replicas: i32) -> i32 {
        match &self.max_unavailable {
            IntOrString::Int(n) => (*n).max(1),
            IntOrString::String(s) => {
                let percent: i64 = s
                    .strip_suffix('%')
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
                i32::try_from(percent.clamp(0, 100) * i64::from(replicas.max(0)) / 100)
                    .unwrap_or(i32::MAX)
                    .max(1)
            }
        }
    }

    /// `minInterval` as a duration (the schema's pattern; 30 s if it cannot be read).
    pub fn min_interval(&self) -> std::time::Duration {
        parse_duration(&self.min_interval).unwrap_or(std::time::Duration::from_secs(30))
    }
}

/// `1h30m`, `45s`: hours, minutes and seconds, as the schema's pattern allows.
pub fn parse_duration(s: &str) -> Option<std::time::Duration> {
    let mut total: u64 = 0;
    let mut digits = String::new();
    for ch in s.chars() {
        if ch.is_ascii_digit() {
            digits.push(ch);
            continue;
        }
        let n: u64 = digits.parse().ok()?;
        digits.clear();
        total = total.checked_add(n.checked_mul(match ch {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        })?)?;
    }
    (digits.is_empty() && !s.is_empty()).then(|| std::time::Duration::from_secs(total))
}

fn is_default<T: Default + PartialEq>(v: &T) -> bool {
    *v == T::default()
}

/// How a governed Deployment loses pods on scale-down: `Default` or `Balanced`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ScaleDown {
    #[default]
    Default,
    Balanced,
}

fn default_kinds() -> Vec<WorkloadKind> {
    vec![WorkloadKind::Deployment, WorkloadKind::StatefulSet]
}

/// A kind of workload: `Deployment` or `StatefulSet`.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum WorkloadKind {
    #[default]
    Deployment,
    StatefulSet,
}

/// How strongly a term binds the scheduler: `Required` (pods stay Pending rather than break the
/// rule) or `Preferred` (the scheduler tries, and places the pod anyway).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Mode {
    #[default]
    Required,
    Preferred,
}

/// How a spread term is expressed in the pod template: `AntiAffinity` (pod anti-affinity
/// against the workload's own pods) or `TopologySpread` (a topology spread constraint).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Method {
    #[default]
    AntiAffinity,
    TopologySpread,
}

/// What deleting the policy does to the terms it wrote: `Remove` or `Orphan`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum DeletionPolicy {
    #[default]
    Remove,
    Orphan,
}

/// Spread the replicas of a workload across the domains of one node label.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("!has(self.weight) || self.mode == 'Preferred'")
        .message("weight is only allowed when mode is Preferred")
        .field_path(".weight")
        .reason(Reason::FieldValueForbidden),
    validation = Rule::new("!has(self.weight) || !has(self.method) || self.method == 'AntiAffinity'")
        .message("weight is only allowed when method is AntiAffinity (topology spread constraints have no weight)")
        .field_path(".weight")
        .reason(Reason::FieldValueForbidden),
    validation = Rule::new("!has(self.maxSkew) || (has(self.method) && self.method == 'TopologySpread')")
        .message("maxSkew is only allowed when method is TopologySpread")
        .field_path(".maxSkew")
        .reason(Reason::FieldValueForbidden),
    validation = Rule::new("!has(self.minDomains) || (has(self.method) && self.method == 'TopologySpread')")
        .message("minDomains is only allowed when method is TopologySpread")
        .field_path(".minDomains")
        .reason(Reason::FieldValueForbidden),
    validation = Rule::new("!has(self.minDomains) || self.mode == 'Required'")
        .message("minDomains is only allowed when mode is Required")
        .field_path(".minDomains")
        .reason(Reason::FieldValueForbidden),
)]
pub struct SpreadTerm {
    /// Node label whose values name the failure domains, e.g. `topology.kubernetes.io/zone`,
    /// `kubernetes.io/hostname`, or a rack or member-cluster label. Nodes without the label are
    /// no domain at all (see `status.domains[].nodesMissingLabel`).
    #[schemars(length(min = 1, max = LABEL_KEY_MAX_LENGTH), pattern(LABEL_KEY_PATTERN))]
    pub topology_key: String,

    /// `Required`: never place two replicas in one domain (AntiAffinity), or never exceed
    /// `maxSkew` (TopologySpread); pods that cannot be placed stay Pending. `Preferred`: the
    /// scheduler tries, and places the pod anyway.
    pub mode: Mode,

    /// `AntiAffinity` (default) writes pod anti-affinity against the workload's own pods;
    /// `TopologySpread` writes a topology spread constraint instead, which allows more replicas
    /// than domains while keeping the counts even.
    #[serde(default)]
    pub method: Method,

    /// Weight of a `Preferred` anti-affinity term, 1..100, relative to the pod's other preferred
    /// terms. Only with mode `Preferred` and method `AntiAffinity`; absent means 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: Option<i32>,

    /// Largest allowed difference in replica count between two domains, 1..1000000. Only with
    /// method `TopologySpread`; absent means 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_COUNT))]
    pub max_skew: Option<i32>,

    /// Treat the key as having at least this many domains, so that replicas stay Pending rather
    /// than pile into the domains that exist (e.g. while a zone has no nodes). 1..1000000. Only
    /// with method `TopologySpread` and mode `Required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_COUNT))]
    pub min_domains: Option<i32>,
}

impl SpreadTerm {
    /// The weight the scheduler sees for a `Preferred` term: the given one, or 100.
    pub fn effective_weight(&self) -> i32 {
        self.weight.unwrap_or(DEFAULT_PREFERRED_WEIGHT)
    }

    /// The skew a `TopologySpread` term allows: the given one, or 1.
    pub fn effective_max_skew(&self) -> i32 {
        self.max_skew.unwrap_or(1)
    }
}

/// Affinity (colocate) or anti-affinity (separate) towards other pods of this namespace.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.weight) || self.mode == 'Preferred'")
    .message("weight is only allowed when mode is Preferred")
    .field_path(".weight")
    .reason(Reason::FieldValueForbidden))]
pub struct PodTerm {
    /// Selects the other pods (by pod labels) in this namespace. Required and non-empty.
    #[schemars(schema_with = "label_selector_schema")]
    pub label_selector: LabelSelector,

    /// Node label whose values name the domains, e.g. `topology.kubernetes.io/zone`.
    #[schemars(length(min = 1, max = LABEL_KEY_MAX_LENGTH), pattern(LABEL_KEY_PATTERN))]
    pub topology_key: String,

    /// `Required` or `Preferred`, as for spread terms.
    pub mode: Mode,

    /// Weight of a `Preferred` term, 1..100. Only with mode `Preferred`; absent means 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub weight: Option<i32>,
}

impl PodTerm {
    /// The weight the scheduler sees for a `Preferred` term: the given one, or 100.
    pub fn effective_weight(&self) -> i32 {
        self.weight.unwrap_or(DEFAULT_PREFERRED_WEIGHT)
    }
}

/// Pacing of the rollouts a policy causes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPacing {
    /// How many workloads may be rolling out because of this policy at once: the next workload
    /// is patched only when the previous ones have finished (or stopped progressing for their
    /// progress deadline). 0 means no limit. Default 1, at most 1000000.
    #[serde(default = "default_max_concurrent")]
    #[schemars(range(min = 0, max = MAX_COUNT))]
    pub max_concurrent: i32,
}

fn default_max_concurrent() -> i32 {
    1
}

impl Default for RolloutPacing {
    fn default() -> Self {
        Self {
            max_concurrent: default_max_concurrent(),
        }
    }
}

/// Observed state of a SpreadPolicy. Written by the operator only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = unwrap_descriptions)]
pub struct SpreadPolicyStatus {
    /// The `.metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Ready`, `Progressing`, `Conflicted`, `Infeasible` and `Skewed`. `lastTransitionTime`
    /// moves only when a condition's status changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,

    /// Number of workloads the selector and kinds match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub matched: Option<i32>,

    /// Number of matched workloads whose pod template carries this policy's current terms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<i32>,

    /// Failure domains visible among schedulable nodes, per topology key used by the policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<TopologyDomains>,

    /// Per-workload state, at most 50 entries (workloads needing attention first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub workloads: Vec<WorkloadStatus>,

    /// Where the governed workloads' pods run: pods per domain at each level of the policy,
    /// the skew, and Pending pods with the scheduler's reasons. Updated at most every few
    /// seconds while pods come and go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distribution: Option<SpreadDistribution>,
}

/// Domain counts for one topology key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyDomains {
    /// The node label counted.
    pub topology_key: String,
    /// Distinct values of the label among schedulable nodes.
    #[serde(default)]
    pub domains: i32,
    /// Nodes that accept pods (not cordoned).
    #[serde(default)]
    pub schedulable_nodes: i32,
    /// Schedulable nodes that lack the label and so belong to no domain.
    #[serde(default)]
    pub nodes_missing_label: i32,
}

/// State of one matched workload.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    /// `Deployment` or `StatefulSet`.
    pub kind: WorkloadKind,
    /// Namespace of the workload (ClusterSpreadPolicy only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the workload in this namespace.
    pub name: String,
    /// Short CamelCase state, e.g. `Applied`, `Pending`, `RollingOut`, `Conflicted`,
    /// `Infeasible`, `Suspended`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
    /// Human-readable details.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;
    use std::time::Duration;

    /// The SpreadPolicy example of DESIGN.md, verbatim.
    const DESIGN_EXAMPLE: &str = r#"
apiVersion: ballast.dev/v1alpha1
kind: SpreadPolicy
metadata: {name: web-ha, namespace: shop}
spec:
  selector: {matchLabels: {tier: web}}
  kinds: [Deployment, StatefulSet]
  priority: 0
  suspend: false
  spread:
    - topologyKey: topology.kubernetes.io/zone
      mode: Required
      method: AntiAffinity
      maxSkew: 1
      minDomains: 3
    - topologyKey: kubernetes.io/hostname
      mode: Preferred
      weight: 100
  colocate:
    - labelSelector: {matchLabels: {app: cache}}
      topologyKey: topology.kubernetes.io/zone
      mode: Preferred
      weight: 50
  separate:
    - labelSelector: {matchLabels: {app: batch}}
      topologyKey: kubernetes.io/hostname
      mode: Preferred
  rollout:
    maxConcurrent: 1
  deletionPolicy: Remove
"#;

    #[test]
    fn design_example_deserializes() {
        let p: SpreadPolicy = serde_yaml::from_str(DESIGN_EXAMPLE).unwrap();
        assert_eq!(p.spec.spread.len(), 2);
        assert_eq!(p.spec.spread[0].mode, Mode::Required);
        assert_eq!(p.spec.spread[0].min_domains, Some(3));
        assert_eq!(p.spec.spread[1].method, Method::AntiAffinity);
        assert_eq!(p.spec.colocate[0].weight, Some(50));
        assert_eq!(p.spec.separate[0].effective_weight(), 100);
        assert_eq!(p.spec.deletion_policy, DeletionPolicy::Remove);
    }

    #[test]
    fn minimal_spec_gets_documented_defaults() {
        let spec: SpreadPolicySpec = serde_yaml::from_str(
            "selector: {matchLabels: {tier: web}}\nspread: [{topologyKey: kubernetes.io/hostname, mode: Preferred}]",
        )
        .unwrap();
        assert_eq!(
            spec.kinds,
            [WorkloadKind::Deployment, WorkloadKind::StatefulSet]
        );
        assert_eq!(spec.priority, 0);
        assert!(!spec.suspend);
        assert_eq!(spec.spread[0].method, Method::AntiAffinity);
        assert_eq!(spec.spread[0].effective_weight(), 100);
        assert_eq!(spec.spread[0].effective_max_skew(), 1);
        assert_eq!(spec.rollout.max_concurrent, 1);
        assert_eq!(spec.deletion_policy, DeletionPolicy::Remove);
    }

    #[test]
    fn mode_is_required_on_spread_terms() {
        let err = serde_yaml::from_str::<SpreadTerm>("topologyKey: kubernetes.io/hostname")
            .unwrap_err()
            .to_string();
        assert!(err.contains("mode"), "{err}");
    }

    #[test]
    fn empty_status_serializes_to_empty_object() {
        let json = serde_json::to_value(SpreadPolicyStatus::default()).unwrap();
        assert_eq!(json, serde_json::json!({}));
    }

    fn schema() -> serde_json::Value {
        let crd = SpreadPolicy::crd();
        serde_json::to_value(&crd.spec.versions[0].schema).unwrap()["openAPIV3Schema"].clone()
    }

    #[test]
    fn schema_declares_defaults() {
        let spec = &schema()["properties"]["spec"]["properties"];
        assert_eq!(
            spec["kinds"]["default"],
            serde_json::json!(["Deployment", "StatefulSet"])
        );
        assert_eq!(spec["priority"]["default"], 0);
        assert_eq!(spec["suspend"]["default"], false);
        assert_eq!(spec["deletionPolicy"]["default"], "Remove");
        assert_eq!(spec["rollout"]["default"]["maxConcurrent"], 1);
        assert_eq!(
            spec["spread"]["items"]["properties"]["method"]["default"],
            "AntiAffinity"
        );
        assert!(spec["spread"].get("default").is_none(), "no noisy []");
    }

    #[test]
    fn schema_requires_selector_and_mode() {
        let spec = &schema()["properties"]["spec"];
        assert_eq!(spec["required"], serde_json::json!(["selector"]));
        let term = &spec["properties"]["spread"]["items"];
        assert_eq!(term["required"], serde_json::json!(["mode", "topologyKey"]));
        let pod_term = &spec["properties"]["colocate"]["items"];
        assert_eq!(
            pod_term["required"],
            serde_json::json!(["labelSelector", "mode", "topologyKey"])
        );
    }

    #[test]
    fn schema_carries_cross_field_rules() {
        let text = serde_json::to_string(&schema()).unwrap();
        for message in [
            "weight is only allowed when mode is Preferred",
            "maxSkew is only allowed when method is TopologySpread",
            "minDomains is only allowed when method is TopologySpread",
            "minDomains is only allowed when mode is Required",
            "selector must not be empty",
            "at least one of spread, colocate or separate must be set",
        ] {
            assert!(text.contains(message), "missing rule: {message}");
        }
    }

    /// Every integer a user can write is bounded on both sides at admission, so no stored
    /// policy can hold a number the controller cannot (issue: `maxSkew: 2147483647`).
    #[test]
    fn every_integer_of_the_spec_is_bounded() {
        fn walk(path: &str, v: &serde_json::Value, out: &mut Vec<String>) {
            let Some(o) = v.as_object() else { return };
            if o.get("type").and_then(|t| t.as_str()) == Some("integer")
                && (o.get("minimum").is_none() || o.get("maximum").is_none())
            {
                out.push(path.to_string());
            }
            for (k, child) in o {
                match child {
                    serde_json::Value::Object(_) => walk(&format!("{path}.{k}"), child, out),
                    serde_json::Value::Array(a) => {
                        for c in a {
                            walk(&format!("{path}.{k}[]"), c, out);
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut unbounded = Vec::new();
        walk("spec", &schema()["properties"]["spec"], &mut unbounded);
        assert!(unbounded.is_empty(), "unbounded integers: {unbounded:?}");
        let spread = &schema()["properties"]["spec"]["properties"]["spread"]["items"]["properties"];
        assert_eq!(
            spread["maxSkew"]["maximum"].as_f64(),
            Some(f64::from(MAX_COUNT))
        );
        assert_eq!(
            spread["minDomains"]["maximum"].as_f64(),
            Some(f64::from(MAX_COUNT))
        );
    }

    #[test]
    fn rebalance_defaults_to_one_pod_every_30_seconds_and_reads_percents_and_durations() {
        let r: Rebalance = serde_yaml::from_str("{}").unwrap();
        assert_eq!(
            (r.max_unavailable_of(9), r.min_interval()),
            (1, Duration::from_secs(30))
        );
        let r: Rebalance =
            serde_yaml::from_str("{maxUnavailable: 25%, minInterval: 1h2m3s}").unwrap();
        assert_eq!(r.max_unavailable_of(9), 2);
        assert_eq!(r.max_unavailable_of(2), 1, "at least one");
        assert_eq!(r.min_interval(), Duration::from_secs(3723));
        assert_eq!(parse_duration("5x"), None);
        assert_eq!(parse_duration("5"), None);
        let spec = &schema()["properties"]["spec"]["properties"]["rebalance"]["properties"];
        assert_eq!(spec["minInterval"]["default"], "30s");
        assert_eq!(spec["maxUnavailable"]["default"], 1);
    }

    #[test]
    fn conditions_are_a_list_map_keyed_by_type() {
        let conditions = &schema()["properties"]["status"]["properties"]["conditions"];
        assert_eq!(conditions["x-kubernetes-list-type"], "map");
        assert_eq!(
            conditions["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"])
        );
    }
}
