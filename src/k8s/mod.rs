//! The thin layer between the controllers and the API server: field-manager
//! names, server-side apply helpers, condition bookkeeping and the labels and
//! annotations ballast writes. Nothing here decides anything.

pub mod apply;
pub mod compact;
pub mod conditions;
pub mod decode;
pub mod finalizer;
pub mod lenient;
pub mod written;

/// Field manager of every write the SpreadPolicy controller makes.
pub const SPREAD_POLICY_MANAGER: &str = "ballast.dev/spread-policy";
/// Field manager of every write the RolloutStrategy controller makes.
pub const ROLLOUT_STRATEGY_MANAGER: &str = "ballast.dev/rollout-strategy";

/// The annotation `kubectl apply` (client-side) keeps a copy of the whole object in: no decision
/// reads it, and no cache keeps it.
pub const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// A resourceVersion as a number, to tell which of two versions of one object is newer: etcd's
/// are numbers, but the API makes no promise, so one that is not compares nothing (`None`).
/// Both controllers remember the version their own writes were answered with this way.
pub fn version_number(rv: &str) -> Option<u64> {
    rv.parse().ok()
}
