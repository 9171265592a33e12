//! The controller's index of ReplicaSets, filed under the Deployment that controls them.
//!
//! A Deployment keeps up to ten old ReplicaSets, so ReplicaSets are the most numerous objects
//! the manager watches, and most belong to Deployments no strategy governs. A kube-runtime
//! store kept each as an `ObjectMeta`-based object under an `ObjectRef` key: 986 bytes each,
//! trimmed. This index keeps of each only what a [`ReplicaSetView`] reads (`make bench`'s
//! `cache_cost` measures both), and files it under its controller, so that a strategy reads its
//! Deployment's ReplicaSets without going through every other one of the cluster.
//!
//! A ReplicaSet no Deployment controls is not kept: nothing reads it.

use super::cache::CachedReplicaSet;
use super::observe::ReplicaSetView;
use super::revision;
use jiff::Timestamp;
use k8s_openapi::api::core::v1::PodTemplateSpec;
use kube::{ResourceExt, runtime::watcher};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

/// ReplicaSets by their controlling Deployment (module docs). Filled by [`ReplicaSets::apply`]
/// from the watch's events.
#[derive(Default)]
pub struct ReplicaSets {
    files: RwLock<Files>,
    /// The files being rebuilt by a (re)list, swapped in when it is done.
    relist: Mutex<Option<Files>>,
}

#[derive(Default)]
struct Files {
    /// Each ReplicaSet filed (`namespace/name`), and the group it is filed in.
    filed: HashMap<Box<str>, Arc<str>>,
    /// The ReplicaSets of one Deployment, under `namespace/name/uid`: a Deployment deleted and
    /// made again under the same name has other ReplicaSets.
    groups: HashMap<Arc<str>, Vec<Entry>>,
}

/// What is kept of one ReplicaSet.
struct Entry {
    name: Box<str>,
    revision: Box<str>,
    replicas: i32,
    desired: i32,
    available: i32,
    created: Option<Timestamp>,
}

fn group_key(ns: &str, deployment: &str, uid: &str) -> String {
    format!("{ns}/{deployment}/{uid}")
}

/// The group and entry of `rs`, if a Deployment controls it.
fn filing(rs: &CachedReplicaSet) -> Option<(String, Entry)> {
    let owner = rs.controlling_deployment()?;
    let group = group_key(
        rs.metadata.namespace.as_deref().unwrap_or_default(),
        &owner.name,
        &owner.uid,
    );
    let entry = Entry {
        name: rs.name_any().into(),
        revision: rs
            .spec
            .revision
            .clone()
            .unwrap_or_else(|| revision::of_template(&PodTemplateSpec::default()))
            .into(),
        replicas: rs.status.replicas,
        desired: rs.spec.replicas.unwrap_or(1),
        available: rs.status.available_replicas.unwrap_or(0),
        created: rs.creation_timestamp().map(|t| t.0),
    };
    Some((group, entry))
}

impl Files {
    /// Files ReplicaSet `key` (`namespace/name`) as `filing` says, or takes it out (`None`).
    fn put(&mut self, key: &str, filing: Option<(String, Entry)>) {
        let name = key.split_once('/').map_or(key, |(_, n)| n);
        if let Some((group, entry)) = &filing
            && let Some(was) = self.filed.get(key)
            && **was == **group
        {
            // Filed in the same group already (the common case): replace it in place.
            if let Some(slot) = self
                .groups
                .get_mut(was)
                .and_then(|g| g.iter_mut().find(|e| *e.name == *entry.name))
            {
                *slot = filing.expect("matched above").1;
                return;
            }
        }
        if let Some(was) = self.filed.remove(key)
            && let Some(group) = self.groups.get_mut(&was)
        {
            group.retain(|e| *e.name != *name);
            if group.is_empty() {
                self.groups.remove(&was);
            }
        }
        if let Some((group, entry)) = filing {
            let group: Arc<str> = match self.groups.get_key_value(group.as_str()) {
                Some((k, _)) => k.clone(),
                None => group.into(),
            };
            // Exact: a Vec's first push reserves four, and most Deployments have one or two.
            let entries = self.groups.entry(group.clone()).or_default();
            entries.reserve_exact(1);
            entries.push(entry);
            self.filed.insert(key.into(), group);
        }
    }
}

fn key_of(rs: &CachedReplicaSet) -> String {
    format!(
        "{}/{}",
        rs.metadata.namespace.as_deref().unwrap_or_default(),
        rs.name_any()
    )
}

impl ReplicaSets {
    /// Takes in one event of the ReplicaSet watch.
    pub fn apply(&self, ev: &watcher::Event<CachedReplicaSet>) {
        match ev {
            watcher::Event::Apply(rs) => self
                .files
                .write()
                .expect("not poisoned")
                .put(&key_of(rs), filing(rs)),
            watcher::Event::Delete(rs) => self
                .files
                .write()
                .expect("not poisoned")
                .put(&key_of(rs), None),
            watcher::Event::Init => {
                *self.relist.lock().expect("not poisoned") = Some(Files::default());
            }
            watcher::Event::InitApply(rs) => {
                if let Some(files) = self.relist.lock().expect("not poisoned").as_mut() {
                    files.put(&key_of(rs), filing(rs));
                }
            }
            watcher::Event::InitDone => {
                if let Some(mut files) = self.relist.lock().expect("not poisoned").take() {
                    files.filed.shrink_to_fit();
                    files.groups.shrink_to_fit();
                    *self.files.write().expect("not poisoned") = files;
                }
            }
        }
    }

    /// The ReplicaSets that Deployment `deployment` (uid `uid`) of `ns` controls.
    pub fn of(&self, ns: &str, deployment: &str, uid: &str) -> Vec<ReplicaSetView> {
        let files = self.files.read().expect("not poisoned");
        let Some(group) = files.groups.get(group_key(ns, deployment, uid).as_str()) else {
            return Vec::new();
        };
        group
            .iter()
            .map(|e| ReplicaSetView {
                name: e.name.to_string(),
                revision: e.revision.to_string(),
                replicas: e.replicas,
                desired: e.desired,
                available: e.available,
                created: e.created,
                template_json: None,
            })
            .collect()
    }

    /// ReplicaSets filed, over all Deployments (for the memory measure).
    pub fn len(&self) -> usize {
        self.files.read().expect("not poisoned").filed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rs(
        name: &str,
        owner: Option<(&str, &str)>,
        image: &str,
        available: i32,
    ) -> CachedReplicaSet {
        let owners = owner.map_or(json!([]), |(d, uid)| {
            json!([{"apiVersion": "apps/v1", "kind": "Deployment", "name": d, "uid": uid,
                    "controller": true}])
        });
        serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": "shop", "ownerReferences": owners,
                         "creationTimestamp": "2026-12-06T01:00:00Z"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web", "pod-template-hash": "h"}},
                                  "spec": {"containers": [{"name": "app", "image": image}]}}},
            "status": {"replicas": 3, "availableReplicas": available}
        }))
        .unwrap()
    }

    fn names(views: &[ReplicaSetView]) -> Vec<&str> {
        let mut n: Vec<&str> = views.iter().map(|v| v.name.as_str()).collect();
        n.sort();
        n
    }

    /// `rs` as the watch sends it changed (or new).
    fn apply(index: &ReplicaSets, rs: CachedReplicaSet) {
        index.apply(&watcher::Event::Apply(rs));
    }

    /// ReplicaSet `name` of Deployment `web` (uid `d1`).
    fn of_web(name: &str, image: &str, available: i32) -> CachedReplicaSet {
        rs(name, Some(("web", "d1")), image, available)
    }

    #[test]
    fn a_replica_set_is_filed_under_the_deployment_that_controls_it() {
        let index = ReplicaSets::default();
        apply(&index, of_web("web-1", "web:1", 3));
        apply(&index, of_web("web-2", "web:2", 0));
        apply(&index, rs("api-1", Some(("api", "d2")), "api:1", 1));
        apply(&index, rs("orphan", None, "web:1", 1));
        let web = index.of("shop", "web", "d1");
        assert_eq!(names(&web), ["web-1", "web-2"]);
        let first = web.iter().find(|v| v.name == "web-1").unwrap();
        assert_eq!((first.replicas, first.desired, first.available), (3, 3, 3));
        assert_eq!(
            first.revision,
            rs("x", None, "web:1", 0).spec.revision.unwrap()
        );
        assert_eq!(first.created, Some("2026-12-06T01:00:00Z".parse().unwrap()));
        assert!(
            index.of("shop", "web", "another-uid").is_empty(),
            "a Deployment of the same name made again"
        );
        assert!(index.of("other", "web", "d1").is_empty());
        assert_eq!(index.len(), 3, "the orphan is not kept");
    }

    #[test]
    fn a_change_replaces_a_deletion_removes_and_a_new_controller_moves() {
        let index = ReplicaSets::default();
        apply(&index, of_web("web-1", "web:1", 0));
        apply(&index, of_web("web-1", "web:1", 2));
        let web = index.of("shop", "web", "d1");
        assert_eq!((web.len(), web[0].available), (1, 2));
        // Orphaned, then adopted by another Deployment.
        apply(&index, rs("web-1", None, "web:1", 2));
        assert!(index.of("shop", "web", "d1").is_empty());
        apply(&index, rs("web-1", Some(("web2", "d3")), "web:1", 2));
        assert_eq!(names(&index.of("shop", "web2", "d3")), ["web-1"]);
        index.apply(&watcher::Event::Delete(rs(
            "web-1",
            Some(("web2", "d3")),
            "web:1",
            2,
        )));
        assert!(index.of("shop", "web2", "d3").is_empty());
        assert!(index.is_empty());
        assert!(
            index.files.read().unwrap().groups.is_empty(),
            "no empty group left"
        );
    }

    #[test]
    fn a_relist_replaces_the_index_when_it_is_done() {
        let index = ReplicaSets::default();
        apply(&index, of_web("gone", "web:1", 1));
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(of_web("web-2", "web:2", 1)));
        // Until the list is done, reads see the index as it was.
        assert_eq!(names(&index.of("shop", "web", "d1")), ["gone"]);
        index.apply(&watcher::Event::InitDone);
        assert_eq!(names(&index.of("shop", "web", "d1")), ["web-2"]);
        assert_eq!(index.len(), 1);
    }
}
