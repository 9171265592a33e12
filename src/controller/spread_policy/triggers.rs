//! Which policies a change wakes. A workload (or its pods) wakes the SpreadPolicies of its
//! namespace that select it, whose terms it carries or whose write it is still rolling out, and
//! the ClusterSpreadPolicies for which the same holds. SpreadPolicies are returned to their
//! controller's mapper; ClusterSpreadPolicies go to theirs through a channel, since one watch
//! of workloads feeds both controllers.

use super::plan::ANNOTATION_POLICY;
use super::pods::{Changed, WorkloadRef};
use super::read::Workloads;
use super::select::{NamespaceLabels, cluster_owner, matches};
use super::tracker::Tracker;
use super::workload::Workload;
use crate::api::cluster_spread_policy::ClusterSpreadPolicy;
use crate::api::spread_policy::SpreadPolicy;
use crate::k8s::lenient::Lenient;
use futures::channel::mpsc::UnboundedSender;
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    ResourceExt,
    core::PartialObjectMeta,
    runtime::reflector::{ObjectRef, Store},
};
use std::sync::{Arc, Mutex};

pub type Policies = Store<Lenient<SpreadPolicy>>;
pub type ClusterPolicies = Store<Lenient<ClusterSpreadPolicy>>;
pub type Namespaces = Store<PartialObjectMeta<Namespace>>;
pub type ClusterRef = ObjectRef<Lenient<ClusterSpreadPolicy>>;

/// The labels of the cached namespaces.
pub fn namespace_labels(namespaces: &Namespaces) -> Arc<NamespaceLabels> {
    Arc::new(
        namespaces
            .state()
            .iter()
            .map(|n| (n.name_any(), n.labels().clone()))
            .collect(),
    )
}

/// What the mappers read.
#[derive(Clone)]
pub struct Triggers {
    pub policies: Policies,
    pub cluster_policies: ClusterPolicies,
    pub namespaces: Namespaces,
    pub workloads: Arc<Workloads>,
    pub tracker: Arc<Mutex<Tracker>>,
    /// Wakes ClusterSpreadPolicies (their controller's `reconcile_on`).
    pub cluster_tx: UnboundedSender<ClusterRef>,
}

impl Triggers {
    /// Wakes every ClusterSpreadPolicy.
    pub fn wake_all_cluster(&self) {
        for p in self.cluster_policies.state() {
            let _ = self
                .cluster_tx
                .unbounded_send(ObjectRef::from_obj(p.as_ref()));
        }
    }

    /// The SpreadPolicies `w` wakes; the ClusterSpreadPolicies it wakes are sent on.
    pub fn for_workload(&self, w: &Workload) -> Vec<ObjectRef<Lenient<SpreadPolicy>>> {
        let owner = w.annotations.get(ANNOTATION_POLICY);
        let rolling_for = self
            .tracker
            .lock()
            .expect("not poisoned")
            .rolling_for(&(w.namespace.clone(), w.kind, w.name.clone()))
            .map(str::to_string);
        let concerns =
            |name: &str| owner.is_some_and(|o| o == name) || rolling_for.as_deref() == Some(name);
        let ns_labels = self
            .namespaces
            .get(&ObjectRef::new(&w.namespace))
            .map(|n| n.labels().clone());
        for cp in self.cluster_policies.state() {
            let selects = cp.ok().is_some_and(|cp| {
                ns_labels
                    .as_ref()
                    .is_some_and(|l| matches(&cp.spec.namespace_selector, l))
                    && cp.spec.policy.kinds.contains(&w.kind)
                    && matches(&cp.spec.policy.selector, &w.labels)
            });
            if selects || concerns(&cluster_owner(&cp.name_any())) {
                let _ = self
                    .cluster_tx
                    .unbounded_send(ObjectRef::from_obj(cp.as_ref()));
            }
        }
        self.policies
            .state()
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(w.namespace.as_str()))
            .filter(|p| {
                concerns(&p.name_any())
                    || p.ok().is_some_and(|p| {
                        p.metadata.deletion_timestamp.is_none()
                            && p.spec.kinds.contains(&w.kind)
                            && matches(&p.spec.selector, &w.labels)
                    })
            })
            .map(|p| ObjectRef::from_obj(p.as_ref()))
            .collect()
    }

    /// The workload `(ns, kind, name)` as cached.
    fn workload(&self, (ns, kind, name): &WorkloadRef) -> Option<Arc<Workload>> {
        self.workloads.get(ns, *kind, name)
    }

    /// The SpreadPolicies to wake when the pods of `changed` workloads changed (the
    /// ClusterSpreadPolicies are sent on).
    pub fn for_pods(&self, changed: Changed) -> Vec<ObjectRef<Lenient<SpreadPolicy>>> {
        let refs = match changed {
            Changed::All => {
                self.wake_all_cluster();
                return self
                    .policies
                    .state()
                    .iter()
                    .map(|p| ObjectRef::from_obj(p.as_ref()))
                    .collect();
            }
            Changed::Some(refs) => refs,
        };
        let mut out = Vec::new();
        for r in &refs {
            if let Some(w) = self.workload(r) {
                for p in self.for_workload(&w) {
                    if !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
        out
    }
}
