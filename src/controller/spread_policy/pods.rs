//! Read: the pods of Deployments and StatefulSets, as the SpreadPolicy controller keeps them to
//! report where workloads really run, balance their scale-down and rebalance them.
//!
//! A pod is deserialized straight into a [`PodView`]: its workload (from its controller owner: a
//! ReplicaSet named `<deployment>-<pod-template-hash>`, or a StatefulSet), its revision label,
//! node, phase, readiness, the scheduler's reason while Pending, its deletion cost and whether
//! ballast set that. Nothing else of the pod is read into memory, and pods that belong to no
//! Deployment or StatefulSet are not kept at all. The views are filed by workload in a
//! [`PodIndex`], so a reconcile finds a workload's pods without looking at the others; a watch
//! event that changes nothing in a view changes nothing and wakes nobody.

use crate::api::spread_policy::WorkloadKind;
use crate::k8s::SPREAD_POLICY_MANAGER;
use kube::api::ObjectMeta;
use kube::runtime::watcher;
use serde::{Deserialize, Deserializer, de::IgnoredAny};
use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap},
    hash::{Hash, Hasher},
    sync::{Arc, RwLock},
};

/// The label of a Deployment's pods that names their revision (the ReplicaSet's suffix).
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
/// The label of a StatefulSet's pods that names their revision.
pub const CONTROLLER_REVISION_HASH: &str = "controller-revision-hash";
/// The annotation the ReplicaSet controller reads when it scales down: lower goes first.
pub const DELETION_COST: &str = "controller.kubernetes.io/pod-deletion-cost";

/// A pod's phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Phase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
    Unknown,
}

/// What the controller keeps of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodView {
    pub name: Box<str>,
    pub uid: Box<str>,
    /// `pod-template-hash` (Deployments) or `controller-revision-hash` (StatefulSets).
    pub revision: Option<Box<str>>,
    pub node: Option<Box<str>>,
    pub phase: Phase,
    pub ready: bool,
    pub deleting: bool,
    /// Creation time, in seconds since the epoch.
    pub created: i64,
    /// While the scheduler finds no node: its message (`PodScheduled=False`, `Unschedulable`).
    pub unschedulable: Option<Box<str>>,
    pub deletion_cost: Option<i32>,
    /// Whether ballast's field manager owns the deletion cost annotation.
    pub cost_ours: bool,
}

impl PodView {
    /// Running on a node and not going away: what the distribution counts.
    pub fn running(&self) -> bool {
        self.phase == Phase::Running && !self.deleting && self.node.is_some()
    }

    /// Not finished and not going away.
    pub fn active(&self) -> bool {
        !self.deleting && matches!(self.phase, Phase::Pending | Phase::Running | Phase::Unknown)
    }
}

/// The pods of a namespace's workloads, by workload (none: no pods).
pub type PodSnapshot = HashMap<(WorkloadKind, String), Arc<[PodView]>>;

/// A workload in a namespace.
pub type WorkloadRef = (String, WorkloadKind, String);

/// A pod as a watch delivers it: its key, its workload, and its view. The watch needs a
/// [`kube::Resource`]; only the name, namespace and resourceVersion of its metadata are kept,
/// and only until the [`PodIndex`] has filed the view.
#[derive(Clone, Debug)]
pub struct WatchedPod {
    metadata: ObjectMeta,
    pub workload: Option<(WorkloadKind, Box<str>)>,
    pub view: PodView,
}

impl kube::Resource for WatchedPod {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "Pod".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "pods".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawPod {
    #[serde(default)]
    metadata: RawMeta,
    #[serde(default)]
    spec: RawSpec,
    #[serde(default)]
    status: RawStatus,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawMeta {
    #[serde(default)]
    name: String,
    namespace: Option<String>,
    #[serde(default)]
    uid: String,
    resource_version: Option<String>,
    creation_timestamp: Option<String>,
    deletion_timestamp: Option<IgnoredAny>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    owner_references: Vec<RawOwner>,
    #[serde(default)]
    managed_fields: Vec<RawManaged>,
}

#[derive(Deserialize)]
struct RawOwner {
    kind: String,
    name: String,
    controller: Option<bool>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManaged {
    manager: Option<String>,
    #[serde(rename = "fieldsV1")]
    fields_v1: Option<serde_json::Value>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawSpec {
    node_name: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct RawStatus {
    phase: Option<String>,
    #[serde(default)]
    conditions: Vec<RawCondition>,
}

#[derive(Deserialize)]
struct RawCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    reason: Option<String>,
    message: Option<String>,
}

/// The workload that owns a pod: the Deployment of its ReplicaSet (the ReplicaSet's name is
/// `<deployment>-<pod-template-hash>`), or its StatefulSet.
fn workload_of(
    owner: &RawOwner,
    labels: &BTreeMap<String, String>,
) -> Option<(WorkloadKind, Box<str>)> {
    match owner.kind.as_str() {
        "ReplicaSet" => {
            let hash = labels.get(POD_TEMPLATE_HASH)?;
            let deployment = owner.name.strip_suffix(hash.as_str())?.strip_suffix('-')?;
            (!deployment.is_empty()).then(|| (WorkloadKind::Deployment, deployment.into()))
        }
        "StatefulSet" => Some((WorkloadKind::StatefulSet, owner.name.as_str().into())),
        _ => None,
    }
}

/// Whether ballast's field manager owns the deletion cost annotation.
fn cost_owned_by_us(managed: &[RawManaged]) -> bool {
    managed
        .iter()
        .filter(|m| m.manager.as_deref() == Some(SPREAD_POLICY_MANAGER))
        .filter_map(|m| m.fields_v1.as_ref())
        .any(|f| {
            f.pointer(&format!(
                "/f:metadata/f:annotations/f:{}",
                DELETION_COST.replace('/', "~1")
            ))
            .is_some()
        })
}

impl From<RawPod> for WatchedPod {
    fn from(p: RawPod) -> Self {
        let m = p.metadata;
        let workload = m
            .owner_references
            .iter()
            .find(|o| o.controller == Some(true))
            .and_then(|o| workload_of(o, &m.labels));
        let revision = m
            .labels
            .get(POD_TEMPLATE_HASH)
            .or_else(|| m.labels.get(CONTROLLER_REVISION_HASH))
            .map(|r| r.as_str().into());
        let condition = |t: &str| p.status.conditions.iter().find(|c| c.type_ == t);
        let unschedulable = condition("PodScheduled")
            .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
            .map(|c| c.message.as_deref().unwrap_or("").into());
        let phase = match p.status.phase.as_deref() {
            Some("Running") => Phase::Running,
            Some("Succeeded") => Phase::Succeeded,
            Some("Failed") => Phase::Failed,
            Some("Unknown") => Phase::Unknown,
            _ => Phase::Pending,
        };
        let view = PodView {
            name: m.name.as_str().into(),
            uid: m.uid.as_str().into(),
            revision,
            node: p.spec.node_name.map(String::into_boxed_str),
            phase,
            ready: condition("Ready").is_some_and(|c| c.status == "True"),
            deleting: m.deletion_timestamp.is_some(),
            created: m
                .creation_timestamp
                .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                .map_or(0, |t| t.as_second()),
            unschedulable,
            deletion_cost: m
                .annotations
                .get(DELETION_COST)
                .and_then(|c| c.parse().ok()),
            cost_ours: cost_owned_by_us(&m.managed_fields),
        };
        WatchedPod {
            metadata: ObjectMeta {
                name: Some(m.name),
                namespace: m.namespace,
                resource_version: m.resource_version,
                ..Default::default()
            },
            workload,
            view,
        }
    }
}

impl<'de> Deserialize<'de> for WatchedPod {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(RawPod::deserialize(d)?.into())
    }
}

/// Which workloads a watch event changed.
#[derive(Debug, PartialEq)]
pub enum Changed {
    Some(Vec<WorkloadRef>),
    /// A (re-)list replaced everything.
    All,
}

fn hash_of(v: impl Hash) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    v.hash(&mut h);
    h.finish()
}

fn workload_key(ns: &str, kind: WorkloadKind, name: &str) -> u64 {
    hash_of((ns, kind, name))
}

/// One workload's pods.
#[derive(Clone, Debug)]
struct Filed {
    workload: (Box<str>, WorkloadKind, Box<str>),
    pods: Arc<[PodView]>,
}

#[derive(Default)]
struct Files {
    /// Pods by workload (a hash of namespace, kind and name).
    workloads: HashMap<u64, Filed>,
    /// The workload each pod is filed under, by a hash of its namespace and name: a pod whose
    /// owner changes (orphaned, adopted) moves.
    filed: HashMap<u64, u64>,
}

impl Files {
    /// Files `pod` (or takes it out, `None`); returns the workloads whose pods changed.
    fn put(
        &mut self,
        ns: &str,
        name: &str,
        pod: Option<(WorkloadKind, &str, PodView)>,
    ) -> Vec<WorkloadRef> {
        let pod_key = hash_of((ns, name));
        let new_key = pod.as_ref().map(|(k, w, _)| workload_key(ns, *k, w));
        let mut changed = Vec::new();
        if let Some(old) = self.filed.get(&pod_key).copied()
            && Some(old) != new_key
            && let Some(f) = self.workloads.get_mut(&old)
        {
            let rest: Vec<PodView> = f
                .pods
                .iter()
                .filter(|p| &*p.name != name)
                .cloned()
                .collect();
            changed.push(owned(&f.workload));
            if rest.is_empty() {
                self.workloads.remove(&old);
            } else {
                f.pods = rest.into();
            }
        }
        match (pod, new_key) {
            (Some((kind, workload, view)), Some(key)) => {
                self.filed.insert(pod_key, key);
                let f = self.workloads.entry(key).or_insert_with(|| Filed {
                    workload: (ns.into(), kind, workload.into()),
                    pods: Arc::new([]),
                });
                if f.pods.contains(&view) {
                    return changed;
                }
                let mut pods: Vec<PodView> = f
                    .pods
                    .iter()
                    .filter(|p| p.name != view.name)
                    .cloned()
                    .collect();
                pods.push(view);
                pods.sort_by(|a, b| a.name.cmp(&b.name));
                f.pods = pods.into();
                changed.push(owned(&f.workload));
            }
            _ => {
                self.filed.remove(&pod_key);
            }
        }
        changed
    }
}

fn owned(w: &(Box<str>, WorkloadKind, Box<str>)) -> WorkloadRef {
    (w.0.to_string(), w.1, w.2.to_string())
}

/// The pods of every Deployment and StatefulSet in the watched scope, by workload.
#[derive(Default)]
pub struct PodIndex {
    files: RwLock<Files>,
    /// Filled by a (re-)list until its end replaces `files`.
    relist: RwLock<Option<Files>>,
}

impl PodIndex {
    /// Takes in one watch event; returns which workloads' pods changed.
    pub fn apply(&self, ev: watcher::Event<WatchedPod>) -> Changed {
        let put = |files: &mut Files, p: WatchedPod| {
            let ns = p.metadata.namespace.unwrap_or_default();
            let name = p.metadata.name.unwrap_or_default();
            let pod = p.workload.as_ref().map(|(k, w)| (*k, &**w, p.view));
            files.put(&ns, &name, pod)
        };
        match ev {
            watcher::Event::Apply(p) => {
                Changed::Some(put(&mut self.files.write().expect("not poisoned"), p))
            }
            watcher::Event::Delete(p) => {
                let ns = p.metadata.namespace.unwrap_or_default();
                let name = p.metadata.name.unwrap_or_default();
                Changed::Some(
                    self.files
                        .write()
                        .expect("not poisoned")
                        .put(&ns, &name, None),
                )
            }
            watcher::Event::Init => {
                *self.relist.write().expect("not poisoned") = Some(Files::default());
                Changed::Some(vec![])
            }
            watcher::Event::InitApply(p) => {
                if let Some(files) = self.relist.write().expect("not poisoned").as_mut() {
                    put(files, p);
                }
                Changed::Some(vec![])
            }
            watcher::Event::InitDone => {
                if let Some(files) = self.relist.write().expect("not poisoned").take() {
                    *self.files.write().expect("not poisoned") = files;
                }
                Changed::All
            }
        }
    }

    /// The pods of one workload (none while the index has not been filled).
    pub fn pods(&self, ns: &str, kind: WorkloadKind, name: &str) -> Arc<[PodView]> {
        self.files
            .read()
            .expect("not poisoned")
            .workloads
            .get(&workload_key(ns, kind, name))
            .map_or_else(|| Arc::new([]) as Arc<[PodView]>, |f| f.pods.clone())
    }

    /// The pods of each of `workloads` in `ns`, under one look at the index.
    pub fn snapshot<'a>(
        &self,
        ns: &str,
        workloads: impl IntoIterator<Item = (WorkloadKind, &'a str)>,
    ) -> PodSnapshot {
        let files = self.files.read().expect("not poisoned");
        workloads
            .into_iter()
            .filter_map(|(kind, name)| {
                let f = files.workloads.get(&workload_key(ns, kind, name))?;
                Some(((kind, name.to_string()), f.pods.clone()))
            })
            .collect()
    }

    /// Pods filed, over all workloads (for the memory measure).
    pub fn len(&self) -> usize {
        self.files.read().expect("not poisoned").filed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
#[path = "pods_tests.rs"]
mod tests;
