//! Where a policy's governed workloads actually run: `status.distribution` of SpreadPolicy and
//! ClusterSpreadPolicy. Written by the operator from a watch of the pods; bounded, so a policy
//! over thousands of workloads keeps a status of a few KiB.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::spread_policy::WorkloadKind;

/// Most workloads listed in `status.distribution.workloads`.
pub const MAX_DISTRIBUTION_WORKLOADS: usize = 20;
/// Most domains listed per level (the most crowded half and the emptiest half).
pub const MAX_LISTED_DOMAINS: usize = 32;
/// Most reasons listed for a workload's Pending pods.
pub const MAX_PENDING_REASONS: usize = 3;

/// The real distribution of the governed workloads' pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpreadDistribution {
    /// Governed workloads whose pods are counted.
    #[serde(default)]
    pub governed: i32,
    /// Of those, how many run their pods more unevenly than the policy asks (see the
    /// `Skewed` condition).
    #[serde(default)]
    pub skewed: i32,
    /// Running pods of the governed workloads.
    #[serde(default)]
    pub running_pods: i32,
    /// Pending pods of the governed workloads.
    #[serde(default)]
    pub pending_pods: i32,
    /// The workloads furthest from an even spread, at most 20: those with Pending pods first,
    /// then by skew over what the policy allows, then by kind, namespace and name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    pub workloads: Vec<WorkloadDistribution>,
}

/// Where one workload's pods run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadDistribution {
    /// `Deployment` or `StatefulSet`.
    pub kind: WorkloadKind,
    /// Namespace of the workload (ClusterSpreadPolicy only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the workload.
    pub name: String,
    /// Replicas the workload asks for.
    #[serde(default)]
    pub replicas: i32,
    /// Its Running pods (every revision), counted per domain below.
    #[serde(default)]
    pub running: i32,
    /// Its Pending pods.
    #[serde(default)]
    pub pending: i32,
    /// Whether its running pods are spread more unevenly than the policy asks.
    #[serde(default)]
    pub skewed: bool,
    /// Pods per domain at each level of the policy (each spread term's topology key).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub levels: Vec<LevelDistribution>,
    /// Why its pods are Pending, the most common first, at most 3.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub pending_reasons: Vec<PendingReason>,
}

/// Running pods per domain of one topology key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LevelDistribution {
    /// The node label whose values are the domains.
    pub topology_key: String,
    /// Running pods per domain. Every domain the pods may use is listed, empty ones too; with
    /// more than 32, the 16 most crowded and the 16 emptiest.
    #[serde(default)]
    #[schemars(extend("maxProperties" = 32))]
    pub pods: BTreeMap<String, i32>,
    /// How many domains there are (listed or not).
    #[serde(default)]
    pub domains: i32,
    /// Pods in the most crowded domain minus pods in the emptiest domain the pods may use.
    #[serde(default)]
    pub skew: i32,
    /// The skew the policy allows here: `maxSkew` for TopologySpread, 1 for AntiAffinity.
    #[serde(default)]
    pub max_skew: i32,
}

/// Pending pods that share a reason.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PendingReason {
    /// `Unschedulable` (the scheduler found no node; the message is its own), `NotScheduled`
    /// (not tried yet) or `Starting` (on a node, not running yet).
    pub reason: String,
    /// The scheduler's message, e.g. `0/6 nodes are available: 3 node(s) didn't match pod
    /// anti-affinity rules...`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// How many pods.
    #[serde(default)]
    pub pods: i32,
}
