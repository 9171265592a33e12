//! Read: what the SpreadPolicy controller keeps of the objects it watches and which of their
//! changes wake it. A Deployment or StatefulSet is kept as the view decisions read
//! ([`Cached`], a [`Workload`] made as the watch deserializes it, its string maps compact, filed
//! by namespace in [`Workloads`]: about 0.9 KiB, 2.0 KiB with a policy's term, instead of the
//! 6 KiB of even a stripped k8s-openapi Deployment, whose pod template is inline; see `make
//! bench`'s `cache_cost`; only the parts of the object the view reads are decoded, so a watch
//! event costs 0.5 to 0.65 times the decode of the whole object), nodes are
//! stripped, and watch events that change nothing a decision reads (heartbeats of nodes, status
//! updates of workloads whose rollout state is unchanged) are dropped before they trigger a
//! reconcile: with thousands of workloads, their own controllers' status updates would otherwise
//! re-plan the whole policy once each.

use super::feasibility::NodeInfo;
use super::workload::Workload;
use crate::api::spread_policy::WorkloadKind;
use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStatus, StatefulSet, StatefulSetSpec, StatefulSetStatus,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ObjectMeta;
use kube::runtime::watcher;
use serde::{Deserialize, Deserializer};
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    hash::Hash,
    marker::PhantomData,
    sync::{Arc, Mutex, RwLock},
    time::Duration,
};

/// What the cache keeps of a workload of kind `K` (Deployment, StatefulSet): its view
/// ([`Workload`], with only ballast's annotations), made as the watch deserializes the object,
/// and the name, namespace and resourceVersion the cache and the watch key it by. Nothing else of
/// the object is kept; ballast never writes whole objects, only apply patches.
#[derive(Debug)]
pub struct Cached<K> {
    metadata: ObjectMeta,
    /// Shared, not copied: a reconcile reads the views of a whole namespace, and holding a copy
    /// of each through a fan-out of thousands of writes was most of the manager's peak memory.
    pub workload: Arc<Workload>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Cached<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            workload: self.workload.clone(),
            kind: PhantomData,
        }
    }
}

/// A workload kind the SpreadPolicy controller caches as a [`Cached`] view.
pub trait Viewed: k8s_openapi::Resource + for<'de> Deserialize<'de> {
    type Spec: for<'de> Deserialize<'de>;
    type Status: for<'de> Deserialize<'de>;
    fn view(&self) -> Workload;
    /// The object from the parts of it a watch event decodes ([`Received`]).
    fn of_parts(
        metadata: ObjectMeta,
        spec: Option<Self::Spec>,
        status: Option<Self::Status>,
    ) -> Self;
}

impl Viewed for Deployment {
    type Spec = DeploymentSpec;
    type Status = DeploymentStatus;
    fn view(&self) -> Workload {
        Workload::from_deployment(self)
    }
    fn of_parts(
        metadata: ObjectMeta,
        spec: Option<DeploymentSpec>,
        status: Option<DeploymentStatus>,
    ) -> Self {
        Self {
            metadata,
            spec,
            status,
        }
    }
}

impl Viewed for StatefulSet {
    type Spec = StatefulSetSpec;
    type Status = StatefulSetStatus;
    fn view(&self) -> Workload {
        Workload::from_stateful_set(self)
    }
    fn of_parts(
        metadata: ObjectMeta,
        spec: Option<StatefulSetSpec>,
        status: Option<StatefulSetStatus>,
    ) -> Self {
        Self {
            metadata,
            spec,
            status,
        }
    }
}

/// What is decoded of a workload a watch delivers: its spec and status whole (the view hashes
/// the whole pod template), and of its metadata only what the view reads. The rest is skipped
/// as the JSON is read, never allocated: managedFields (about 40 % of a Deployment's bytes, more
/// once several managers have written it) and every annotation but ballast's (a
/// `kubectl.kubernetes.io/last-applied-configuration` is a copy of the whole object).
#[derive(Deserialize)]
#[serde(bound = "S: Deserialize<'de>, T: Deserialize<'de>")]
struct Received<S, T> {
    #[serde(default)]
    metadata: ReceivedMeta,
    spec: Option<S>,
    status: Option<T>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReceivedMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    deletion_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    #[serde(default, deserialize_with = "ballast_annotations")]
    annotations: Option<BTreeMap<String, String>>,
}

impl From<ReceivedMeta> for ObjectMeta {
    fn from(m: ReceivedMeta) -> Self {
        ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            generation: m.generation,
            deletion_timestamp: m.deletion_timestamp,
            labels: m.labels,
            annotations: m.annotations,
            ..Default::default()
        }
    }
}

/// The annotations under `ballast.dev/` ([`is_ours`](super::workload::is_ours)); the others'
/// values are skipped unread.
fn ballast_annotations<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    crate::k8s::decode::map_keeping(d, super::workload::is_ours)
}

impl<K: Viewed> Cached<K> {
    pub fn of(obj: &K) -> Self
    where
        K: kube::Resource,
    {
        let workload = obj.view();
        let m = obj.meta();
        Self {
            // The name and namespace key the cache; the resourceVersion is where the watch
            // resumes. The uid is in the view.
            metadata: ObjectMeta {
                name: m.name.clone(),
                namespace: m.namespace.clone(),
                resource_version: m.resource_version.clone(),
                ..Default::default()
            },
            workload: Arc::new(workload),
            kind: PhantomData,
        }
    }
}

impl<'de, K: Viewed + kube::Resource> Deserialize<'de> for Cached<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let r = Received::<K::Spec, K::Status>::deserialize(d)?;
        Ok(Self::of(&K::of_parts(r.metadata.into(), r.spec, r.status)))
    }
}

crate::k8s::resource_as!(<K> Cached<K>);

/// The views of the watched Deployments and StatefulSets, filed by namespace, kind and name,
/// as their watches' events come ([`Workloads::apply`]). A kube-runtime store kept each
/// [`Cached`] under an `ObjectRef` key, with an `ObjectMeta` (360 bytes before its strings) only
/// the store read: the views carry their own name, namespace and resourceVersion. A reconcile
/// reads the workloads of its namespace without going through every other one.
#[derive(Default)]
pub struct Workloads {
    files: RwLock<Files>,
    /// Per kind, the views a (re)list has brought so far, filed when it is done.
    relist: Mutex<HashMap<WorkloadKind, Vec<Arc<Workload>>>>,
}

impl Workloads {
    /// Takes in one event of the watch of the workloads of `kind`.
    pub fn apply<K>(&self, kind: WorkloadKind, ev: &watcher::Event<Cached<K>>) {
        let files = || self.files.write().expect("not poisoned");
        match ev {
            watcher::Event::Apply(c) => put(&mut files(), c.workload.clone()),
            watcher::Event::Delete(c) => {
                let w = &c.workload;
                let mut files = files();
                if let Some(ns) = files.get_mut(w.namespace.as_str()) {
                    if let Some(of_kind) = ns.get_mut(&w.kind) {
                        of_kind.remove(w.name.as_str());
                        if of_kind.is_empty() {
                            ns.remove(&w.kind);
                        }
                    }
                    if ns.is_empty() {
                        files.remove(w.namespace.as_str());
                    }
                }
            }
            watcher::Event::Init => {
                self.relist
                    .lock()
                    .expect("not poisoned")
                    .insert(kind, Vec::new());
            }
            watcher::Event::InitApply(c) => {
                if let Some(list) = self.relist.lock().expect("not poisoned").get_mut(&kind) {
                    list.push(c.workload.clone());
                }
            }
            watcher::Event::InitDone => {
                let Some(list) = self.relist.lock().expect("not poisoned").remove(&kind) else {
                    return;
                };
                let mut files = files();
                for ns in files.values_mut() {
                    ns.remove(&kind);
                }
                files.retain(|_, ns| !ns.is_empty());
                for w in list {
                    put(&mut files, w);
                }
            }
        }
    }

    /// The workloads of `ns`, by kind and name.
    pub fn in_namespace(&self, ns: &str) -> Vec<Arc<Workload>> {
        self.files
            .read()
            .expect("not poisoned")
            .get(ns)
            .map(|ns| ns.values().flat_map(|ws| ws.values().cloned()).collect())
            .unwrap_or_default()
    }

    /// Workload `name` of `kind` in `ns`.
    pub fn get(&self, ns: &str, kind: WorkloadKind, name: &str) -> Option<Arc<Workload>> {
        self.files
            .read()
            .expect("not poisoned")
            .get(ns)?
            .get(&kind)?
            .get(name)
            .cloned()
    }

    /// The namespaces with at least one workload.
    pub fn namespaces(&self) -> Vec<String> {
        let files = self.files.read().expect("not poisoned");
        let mut out: Vec<String> = files.keys().map(|ns| ns.to_string()).collect();
        out.sort();
        out
    }

    /// Workloads filed, over all namespaces (for the memory measure).
    pub fn len(&self) -> usize {
        let files = self.files.read().expect("not poisoned");
        files
            .values()
            .flat_map(|ns| ns.values())
            .map(BTreeMap::len)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The views by namespace, kind and name.
type Files = HashMap<Box<str>, BTreeMap<WorkloadKind, BTreeMap<Box<str>, Arc<Workload>>>>;

fn put(files: &mut Files, w: Arc<Workload>) {
    files
        .entry(w.namespace.as_str().into())
        .or_default()
        .entry(w.kind)
        .or_default()
        .insert(w.name.as_str().into(), w);
}

/// Drops what no decision reads of a node's metadata: managedFields and the last-applied
/// annotation.
pub fn strip_meta(meta: &mut kube::api::ObjectMeta) {
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove(crate::k8s::LAST_APPLIED);
    }
}

/// Fields of a node that change which domains are schedulable.
pub fn node_fingerprint(n: &Node) -> u64 {
    use std::hash::{Hash, Hasher};
    let info = NodeInfo::from_node(n);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    info.labels.hash(&mut h);
    info.ready.hash(&mut h);
    info.unschedulable.hash(&mut h);
    for t in &info.taints {
        (&t.key, &t.value, &t.effect).hash(&mut h);
    }
    h.finish()
}

/// Fields of a workload that decisions read: everything in its [`Workload`] view but the
/// resourceVersion (a write's precondition, read from the cache at write time). Status updates
/// of its own controller that change nothing ballast looks at (replica counts, timestamps of
/// an unchanged rollout) have the same fingerprint.
fn workload_fingerprint(w: &Workload) -> u64 {
    // Every field but one, by name: a field added to the view is a compile error here until
    // it is hashed or left out on purpose.
    let Workload {
        kind,
        name,
        namespace,
        uid,
        generation,
        deleting,
        labels,
        annotations,
        record,
        resource_version: _,
        selector,
        replicas,
        affinity,
        topology_spread_constraints,
        tolerations,
        node_selector,
        rollout,
        progress_at,
        progress_deadline,
        unobserved,
        template_hash,
    } = w;
    // The view holds Kubernetes types that do not implement Hash; their Debug form names
    // every field, in a fixed order (maps are BTreeMaps), and is hashed as it is written.
    // Tuples of tuples: `Debug` is implemented for tuples of at most 12 elements.
    crate::k8s::digest::debug(&(
        (kind, name, namespace, uid, generation, deleting, labels),
        (annotations, record, selector, replicas, affinity),
        (
            topology_spread_constraints,
            tolerations,
            node_selector,
            rollout,
        ),
        (progress_at, progress_deadline, unobserved, template_hash),
    ))
}

/// Passes on the watch events of workloads that can change a decision, so that a burst of
/// status updates (a controller catching up with thousands of Deployments) does not re-plan
/// every policy of the namespace once per update. Deletions, and the objects of a (re-)list,
/// always pass: a workload gone during a watch gap leaves no event of its own.
#[derive(Default)]
pub struct Relevant {
    /// Fingerprint by workload (a hash of namespace and name, to keep 16 bytes a workload).
    seen: HashMap<u64, u64>,
}

impl Relevant {
    fn key(w: &Workload) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&w.namespace, &w.name).hash(&mut h);
        h.finish()
    }

    /// A filter for a watch stream of cached workloads: passes errors, and the events
    /// [`Relevant::pass`] passes.
    pub fn filter<K, E>()
    -> impl FnMut(&Result<watcher::Event<Cached<K>>, E>) -> std::future::Ready<bool> {
        let mut relevant = Relevant::default();
        move |ev| {
            std::future::ready(match ev {
                Ok(ev) => relevant.pass(ev, |c| c.workload.clone()),
                Err(_) => true,
            })
        }
    }

    pub fn pass<K, W: std::borrow::Borrow<Workload>>(
        &mut self,
        ev: &watcher::Event<K>,
        view: impl Fn(&K) -> W,
    ) -> bool {
        match ev {
            watcher::Event::Apply(o) => {
                let w = view(o);
                let w = w.borrow();
                let fp = workload_fingerprint(w);
                self.seen.insert(Self::key(w), fp) != Some(fp)
            }
            watcher::Event::InitApply(o) => {
                let w = view(o);
                let w = w.borrow();
                self.seen.insert(Self::key(w), workload_fingerprint(w));
                true
            }
            watcher::Event::Delete(o) => {
                self.seen.remove(&Self::key(view(o).borrow()));
                true
            }
            watcher::Event::Init | watcher::Event::InitDone => true,
        }
    }
}

/// Gathers the items of `input` for `window` from the first of a burst, then hands each on
/// once: a burst of pod changes (a rollout, a scale) wakes each policy once, at most `window`
/// after the first change. Order is kept.
pub fn coalesce<T>(
    input: impl Stream<Item = T> + Send + 'static,
    window: Duration,
) -> impl Stream<Item = T> + Send + 'static
where
    T: Hash + Eq + Clone + Send + 'static,
{
    futures::stream::unfold(
        (input.boxed().fuse(), false),
        move |(mut input, ended)| async move {
            if ended {
                return None;
            }
            let first = input.next().await?;
            let mut seen = HashSet::from([first.clone()]);
            let mut batch = vec![first];
            let deadline = tokio::time::sleep(window);
            tokio::pin!(deadline);
            let mut ended = false;
            loop {
                tokio::select! {
                    _ = &mut deadline => break,
                    item = input.next() => match item {
                        Some(t) => {
                            if seen.insert(t.clone()) {
                                batch.push(t);
                            }
                        }
                        None => {
                            ended = true;
                            break;
                        }
                    },
                }
            }
            Some((batch, (input, ended)))
        },
    )
    .flat_map(futures::stream::iter)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use serde_json::json;

    fn web(generation: i64, ready: i32, resource_version: &str) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "generation": generation,
                         "resourceVersion": resource_version, "labels": {"tier": "web"}},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": []}}},
            "status": {"observedGeneration": generation, "replicas": 3, "updatedReplicas": 3,
                       "readyReplicas": ready, "availableReplicas": ready,
                       "conditions": [{"type": "Progressing", "status": "True",
                                       "reason": "NewReplicaSetAvailable",
                                       "lastUpdateTime": "2026-01-01T00:00:00Z"}]},
        }))
        .unwrap()
    }

    /// The fixture of `make bench` (a Deployment as the API server returns it, managedFields
    /// included), with a user's last-applied annotation and ballast's own annotations.
    fn received_deployment() -> serde_json::Value {
        let mut v: serde_json::Value =
            serde_json::from_str(include_str!("../../../benches/fixtures/deployment.json"))
                .unwrap();
        let annotations = &mut v["metadata"]["annotations"];
        annotations["kubectl.kubernetes.io/last-applied-configuration"] =
            json!({"kind": "Deployment", "spec": {"replicas": 0}})
                .to_string()
                .into();
        annotations["ballast.dev/spread-policy"] = "spread".into();
        v["metadata"]["deletionTimestamp"] = "2026-12-03T19:12:20Z".into();
        v["spec"]["template"]["metadata"]["annotations"] =
            json!({"ballast.dev/spread-terms": "{}"});
        v
    }

    #[test]
    fn a_workload_decoded_in_part_has_the_view_of_the_whole_object() {
        let v = received_deployment();
        let whole: Deployment = serde_json::from_value(v.clone()).unwrap();
        let cached: Cached<Deployment> = serde_json::from_str(&v.to_string()).unwrap();
        assert_eq!(*cached.workload, Workload::from_deployment(&whole));
        assert_eq!(
            cached.workload.annotations.keys().collect::<Vec<_>>(),
            ["ballast.dev/spread-policy"]
        );
        assert!(cached.workload.deleting);
        assert!(cached.workload.record.is_some());
        assert_eq!(
            kube::Resource::meta(&cached).resource_version,
            whole.metadata.resource_version
        );

        // No annotations at all, or null, are none of ours.
        for annotations in [serde_json::Value::Null, json!({})] {
            let mut v = v.clone();
            v["metadata"]["annotations"] = annotations;
            let cached: Cached<Deployment> = serde_json::from_value(v).unwrap();
            assert!(cached.workload.annotations.is_empty());
        }
        let mut v = v.clone();
        v["metadata"].as_object_mut().unwrap().remove("annotations");
        let cached: Cached<Deployment> = serde_json::from_value(v).unwrap();
        assert!(cached.workload.annotations.is_empty());
    }

    #[test]
    fn a_stateful_set_decoded_in_part_has_the_view_of_the_whole_object() {
        use k8s_openapi::api::apps::v1::StatefulSet;
        let v = json!({
            "metadata": {"name": "db", "namespace": "shop", "uid": "u1", "generation": 2,
                         "resourceVersion": "7", "labels": {"app": "db"},
                         "annotations": {"ballast.dev/spread-policy": "spread", "other": "x"},
                         "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"replicas": 3, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                     "template": {"metadata": {"labels": {"app": "db"}},
                                  "spec": {"containers": [{"name": "db", "image": "db"}]}}},
            "status": {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3,
                       "currentRevision": "db-1", "updateRevision": "db-1"},
        });
        let whole: StatefulSet = serde_json::from_value(v.clone()).unwrap();
        let cached: Cached<StatefulSet> = serde_json::from_value(v).unwrap();
        assert_eq!(*cached.workload, Workload::from_stateful_set(&whole));
    }

    #[test]
    fn status_updates_that_change_no_decision_do_not_wake_the_controller() {
        let mut r = Relevant::default();
        let apply = |d: Deployment| watcher::Event::Apply(d);
        assert!(r.pass(&apply(web(1, 3, "1")), Workload::from_deployment));
        // A pod of a completed rollout became unavailable, and the resourceVersion moved:
        // nothing ballast decides on changed.
        assert!(!r.pass(&apply(web(1, 2, "2")), Workload::from_deployment));
        // A new generation (a template change) is a change.
        assert!(r.pass(&apply(web(2, 2, "3")), Workload::from_deployment));
        // A label change can change which policy selects it.
        let mut relabelled = web(2, 2, "4");
        relabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("tier".into(), "db".into());
        assert!(r.pass(&apply(relabelled), Workload::from_deployment));
    }

    #[tokio::test]
    async fn a_burst_is_handed_on_once_per_item_after_the_window() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let window = Duration::from_millis(200);
        let mut out = Box::pin(coalesce(rx, window));
        for i in [1, 2, 1, 3, 2] {
            tx.unbounded_send(i).unwrap();
        }
        let start = std::time::Instant::now();
        let got: Vec<i32> = vec![
            out.next().await.unwrap(),
            out.next().await.unwrap(),
            out.next().await.unwrap(),
        ];
        assert_eq!(got, [1, 2, 3]);
        assert!(start.elapsed() >= window, "{:?}", start.elapsed());
        // A later change is a new burst; the end of the input ends the stream.
        tx.unbounded_send(1).unwrap();
        drop(tx);
        assert_eq!(out.next().await, Some(1));
        assert_eq!(out.next().await, None);
    }

    #[test]
    fn deletions_and_relists_always_wake_the_controller() {
        let mut r = Relevant::default();
        assert!(r.pass(
            &watcher::Event::Apply(web(1, 3, "1")),
            Workload::from_deployment
        ));
        assert!(r.pass(
            &watcher::Event::InitApply(web(1, 3, "1")),
            Workload::from_deployment
        ));
        assert!(r.pass(
            &watcher::Event::Delete(web(1, 3, "1")),
            Workload::from_deployment
        ));
        // Created again under the same name: seen as new.
        assert!(r.pass(
            &watcher::Event::Apply(web(1, 3, "5")),
            Workload::from_deployment
        ));
    }

    fn cached<K: Viewed + kube::Resource>(kind: &str, ns: &str, name: &str) -> Cached<K> {
        let workload: serde_json::Value = json!({
            "apiVersion": "apps/v1", "kind": kind,
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "1"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": []}}},
        });
        serde_json::from_value(workload).unwrap()
    }

    fn names(ws: &[Arc<Workload>]) -> Vec<String> {
        ws.iter()
            .map(|w| format!("{:?}/{}", w.kind, w.name))
            .collect()
    }

    #[test]
    fn workloads_are_filed_by_namespace_and_each_kind_relists_on_its_own() {
        use k8s_openapi::api::apps::v1::StatefulSet;
        let index = Workloads::default();
        let deploy = |ns, name| cached::<Deployment>("Deployment", ns, name);
        let sts = |ns, name| cached::<StatefulSet>("StatefulSet", ns, name);
        index.apply(
            WorkloadKind::Deployment,
            &watcher::Event::Apply(deploy("shop", "web")),
        );
        index.apply(
            WorkloadKind::Deployment,
            &watcher::Event::Apply(deploy("shop", "api")),
        );
        index.apply(
            WorkloadKind::Deployment,
            &watcher::Event::Apply(deploy("blog", "web")),
        );
        index.apply(
            WorkloadKind::StatefulSet,
            &watcher::Event::Apply(sts("shop", "db")),
        );
        assert_eq!(
            names(&index.in_namespace("shop")),
            ["Deployment/api", "Deployment/web", "StatefulSet/db"]
        );
        assert_eq!(index.namespaces(), ["blog", "shop"]);
        assert!(
            index
                .get("shop", WorkloadKind::StatefulSet, "web")
                .is_none()
        );
        assert!(index.get("shop", WorkloadKind::Deployment, "web").is_some());

        // The Deployments' watch lists again: until it is done the index is as it was; then
        // its Deployments are those listed, and the StatefulSets are left alone.
        index.apply::<Deployment>(WorkloadKind::Deployment, &watcher::Event::Init);
        index.apply(
            WorkloadKind::Deployment,
            &watcher::Event::InitApply(deploy("shop", "web")),
        );
        assert_eq!(index.len(), 4);
        index.apply::<Deployment>(WorkloadKind::Deployment, &watcher::Event::InitDone);
        assert_eq!(
            names(&index.in_namespace("shop")),
            ["Deployment/web", "StatefulSet/db"]
        );
        assert_eq!(index.namespaces(), ["shop"], "blog has nothing left");

        index.apply(
            WorkloadKind::StatefulSet,
            &watcher::Event::Delete(sts("shop", "db")),
        );
        index.apply(
            WorkloadKind::Deployment,
            &watcher::Event::Delete(deploy("shop", "web")),
        );
        assert!(index.is_empty());
        assert!(index.namespaces().is_empty());
    }
}
