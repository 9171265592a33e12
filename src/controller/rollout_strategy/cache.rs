//! What the controller's watch caches keep of the Deployments and ReplicaSets of the watched
//! namespaces. A k8s-openapi `Deployment` or `ReplicaSet` takes about 2.4 KiB before any of its
//! strings (its pod template is inline, even when empty), so the watches deserialize straight
//! into these smaller types (`make bench`'s `cache_cost` measures them):
//! - [`CachedReplicaSet`]: as the watch reads it, with ballast's revision of the template and
//!   never the template (only adoption reads one, afresh); what is kept of it is filed in
//!   [`ReplicaSets`](super::replica_sets::ReplicaSets);
//! - [`CachedDeployment`]: the [`DeploymentView`] a decision reads, made once as the watch
//!   delivers it. The watch selects the Deployments labelled
//!   [`GOVERNED_LABEL`](super::gate::GOVERNED_LABEL); the others, most of a cluster's, are not
//!   in this cache at all (a decision about one not labelled yet reads it afresh: see
//!   [`needs_fresh_target`](super::observe::needs_fresh_target)).
//!
//! Both are read-only views: ballast never writes them back.

use super::observe::DeploymentView;
use super::revision;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStatus, ReplicaSet};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    FieldsV1, ManagedFieldsEntry, OwnerReference, Time,
};
use kube::api::ObjectMeta;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A Deployment as the cache keeps it. Decoded in part ([`Deserialize`] below): of its metadata
/// all but the managedFields entries that do not own `spec.paused` and the last-applied
/// annotation.
#[derive(Clone, Debug)]
pub struct CachedDeployment {
    pub metadata: ObjectMeta,
    /// As read; [`CachedDeployment::trim`] moves it into `view`.
    pub spec: Option<Box<DeploymentSpec>>,
    /// As read; moved into `view` with `spec`.
    pub status: Option<Box<DeploymentStatus>>,
    /// The view decisions read, made once per version the watch delivers: each reconcile of
    /// its strategy (one per event of the Deployment, its ReplicaSets, its hooks) would else
    /// copy the template twice, turn it into JSON and hash it.
    pub view: Option<Arc<DeploymentView>>,
}

/// What [`CachedDeployment::trim`] drops is not decoded at all: the managedFields entries but
/// those owning `spec.paused` (reduced to that field as they are read) and the last-applied
/// annotation.
impl<'de> Deserialize<'de> for CachedDeployment {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Parts;
        impl<'de> Visitor<'de> for Parts {
            type Value = CachedDeployment;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a Deployment")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let (mut metadata, mut spec, mut status) = (None::<ObjectMeta>, None, None);
                while let Some(field) = map.next_key::<Field>()? {
                    match field {
                        Field::Metadata => {
                            metadata = Some(map.next_value::<ReceivedMeta>()?.into());
                        }
                        Field::Spec => spec = map.next_value()?,
                        Field::Status => status = map.next_value()?,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(CachedDeployment {
                    metadata: metadata.unwrap_or_default(),
                    spec,
                    status,
                    view: None,
                })
            }
        }
        d.deserialize_map(Parts)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum Field {
    Metadata,
    Spec,
    Status,
    #[serde(other)]
    Other,
}

/// A Deployment's metadata as [`CachedDeployment`] decodes it: every field of `ObjectMeta`, but
/// managedFields and the annotations as [`keep_paused_owners`](super::observe::keep_paused_owners)
/// leaves them.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReceivedMeta {
    #[serde(default, deserialize_with = "without_last_applied")]
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    managed_fields: Vec<ManagedEntry>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

fn received_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    ReceivedMeta::deserialize(d).map(Into::into)
}

fn without_last_applied<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    crate::k8s::decode::map_keeping(d, |k| k != crate::k8s::LAST_APPLIED)
}

/// A managedFields entry, its fields read only as far as whether they hold `spec.paused`.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ManagedEntry {
    api_version: Option<String>,
    fields_type: Option<String>,
    #[serde(rename = "fieldsV1", default)]
    fields_v1: Option<OwnsPaused>,
    manager: Option<String>,
    operation: Option<String>,
    subresource: Option<String>,
    time: Option<Time>,
}

#[derive(Deserialize)]
struct OwnsPaused {
    #[serde(rename = "f:spec")]
    spec: Option<OwnsPausedSpec>,
}

#[derive(Deserialize)]
struct OwnsPausedSpec {
    #[serde(rename = "f:paused")]
    paused: Option<IgnoredAny>,
}

impl From<ReceivedMeta> for ObjectMeta {
    fn from(m: ReceivedMeta) -> Self {
        let owners: Vec<ManagedFieldsEntry> = m
            .managed_fields
            .into_iter()
            .filter(|e| {
                e.fields_v1
                    .as_ref()
                    .and_then(|f| f.spec.as_ref())
                    .is_some_and(|s| s.paused.is_some())
            })
            .map(|e| ManagedFieldsEntry {
                api_version: e.api_version,
                fields_type: e.fields_type,
                fields_v1: Some(FieldsV1(serde_json::json!({"f:spec": {"f:paused": {}}}))),
                manager: e.manager,
                operation: e.operation,
                subresource: e.subresource,
                time: e.time,
            })
            .collect();
        ObjectMeta {
            annotations: m.annotations,
            creation_timestamp: m.creation_timestamp,
            deletion_grace_period_seconds: m.deletion_grace_period_seconds,
            deletion_timestamp: m.deletion_timestamp,
            finalizers: m.finalizers,
            generate_name: m.generate_name,
            generation: m.generation,
            labels: m.labels,
            managed_fields: (!owners.is_empty()).then_some(owners),
            name: m.name,
            namespace: m.namespace,
            owner_references: m.owner_references,
            resource_version: m.resource_version,
            self_link: m.self_link,
            uid: m.uid,
        }
    }
}

impl CachedDeployment {
    /// Applied by the watch before the cache: managedFields cut to who set `spec.paused`
    /// ([`keep_paused_owners`](super::observe::keep_paused_owners)); the spec and status made
    /// into the view.
    pub fn trim(&mut self) {
        super::observe::keep_paused_owners(&mut self.metadata);
        let d = Deployment {
            metadata: self.metadata.clone(),
            spec: self.spec.take().map(|s| *s),
            status: self.status.take().map(|s| *s),
        };
        self.view = Some(Arc::new(DeploymentView::of(d, Vec::new())));
    }

    /// The Deployment, with as much as the cache keeps: once trimmed, its metadata (its spec and
    /// status are in its view).
    pub fn to_deployment(&self) -> Deployment {
        Deployment {
            metadata: self.metadata.clone(),
            spec: self.spec.as_deref().cloned(),
            status: self.status.as_deref().cloned(),
        }
    }
}

/// A ReplicaSet as the cache keeps it.
#[derive(Clone, Debug, Deserialize)]
pub struct CachedReplicaSet {
    /// Decoded as a Deployment's ([`ReceivedMeta`]): a ReplicaSet owns no `spec.paused`, so
    /// none of its managedFields is kept, and none is read.
    #[serde(deserialize_with = "received_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: CachedReplicaSetSpec,
    #[serde(default)]
    pub status: CachedReplicaSetStatus,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct CachedReplicaSetSpec {
    pub replicas: Option<i32>,
    /// ballast's revision of `spec.template`, computed as it is read; the template is not kept.
    #[serde(default, rename = "template", deserialize_with = "template_revision")]
    pub revision: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedReplicaSetStatus {
    #[serde(default)]
    pub replicas: i32,
    pub available_replicas: Option<i32>,
}

fn template_revision<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let template = Option::<PodTemplateSpec>::deserialize(d)?;
    Ok(template.map(|t| revision::of_template(&revision::deployment_template_of(t))))
}

impl CachedReplicaSet {
    /// The owner reference of the Deployment that controls it, if one does: what the watch's
    /// trigger and the index file it under.
    pub fn controlling_deployment(
        &self,
    ) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
        self.metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.kind == "Deployment" && o.controller == Some(true))
    }
}

// A cached view of a Deployment or ReplicaSet is a `kube::Resource` of the same kind, so the
// watches and caches take it as they would the whole object.
crate::k8s::resource_as!(CachedDeployment as Deployment);
crate::k8s::resource_as!(CachedReplicaSet as ReplicaSet);

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;
    use serde_json::json;

    fn deployment(labels: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "shop", "uid": "d1", "labels": labels,
                         "annotations": {"ballast.dev/rollout-strategy": "s", "team": "a",
                                         "ballast.dev/spread-policy": "p"},
                         "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                                            "fieldsV1": {"f:spec": {"f:paused": {}, "f:replicas": {}}}}]},
            "spec": {"replicas": 3, "paused": true, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "app", "image": "web:2"}]}}},
            "status": {"observedGeneration": 3, "replicas": 3}
        })
    }

    #[test]
    fn a_cached_replica_set_keeps_the_revision_of_its_template_and_not_the_template() {
        let v = json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "web-abc", "namespace": "shop", "labels": {"app": "web", "pod-template-hash": "abc"},
                         "uid": "rs1",
                         "ownerReferences": [{"apiVersion": "example.com/v1", "kind": "Widget", "name": "w", "uid": "w1"},
                                             {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "d1", "controller": true}]},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web", "pod-template-hash": "abc"}}, "spec": {"containers": [{"name": "app", "image": "web:2"}]}}},
            "status": {"replicas": 2, "availableReplicas": 1}
        });
        let full: ReplicaSet = serde_json::from_value(v.clone()).unwrap();
        let cached: CachedReplicaSet = serde_json::from_value(v).unwrap();
        let d: Deployment = serde_json::from_value(deployment(json!({}))).unwrap();
        // The revision is the Deployment's own (same template, less the pod-template-hash).
        assert_eq!(
            cached.spec.revision.as_deref(),
            Some(revision::of_template(&d.spec.unwrap().template).as_str())
        );
        assert_eq!(
            cached.spec.revision.as_deref(),
            Some(
                revision::of_template(&revision::deployment_template_of(
                    full.spec.as_ref().unwrap().template.clone().unwrap()
                ))
                .as_str()
            )
        );
        assert_eq!((cached.spec.replicas, cached.status.replicas), (Some(2), 2));
        assert_eq!(cached.status.available_replicas, Some(1));
        assert_eq!(CachedReplicaSet::plural(&()), "replicasets");
        assert_eq!(CachedReplicaSet::api_version(&()), "apps/v1");
    }

    #[test]
    fn the_cache_keeps_a_deployments_view_and_who_paused_it() {
        let mut governed: CachedDeployment = serde_json::from_value(deployment(
            json!({super::super::gate::GOVERNED_LABEL: "true"}),
        ))
        .unwrap();
        governed.trim();
        let full: Deployment = serde_json::from_value(deployment(json!({}))).unwrap();
        // The spec and status as its view (made once, as it is cached: the view a fresh read
        // makes), and not again beside it.
        let mut trimmed = full.clone();
        trimmed.metadata = governed.metadata.clone();
        assert_eq!(
            governed.view.as_deref(),
            Some(&DeploymentView::new(&trimmed, Vec::new()))
        );
        assert!(governed.spec.is_none() && governed.status.is_none());
        // Who paused it stays known: the managedFields entry, cut to spec.paused.
        let owners = governed.metadata.managed_fields.as_ref().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(
            owners[0].fields_v1.as_ref().unwrap().0,
            json!({"f:spec": {"f:paused": {}}})
        );
        assert_eq!(CachedDeployment::kind(&()), "Deployment");
    }

    /// What the cache kept when a Deployment was decoded whole, then trimmed.
    fn decoded_whole_then_trimmed(v: &serde_json::Value) -> CachedDeployment {
        let d: Deployment = serde_json::from_value(v.clone()).unwrap();
        let mut c = CachedDeployment {
            metadata: d.metadata,
            spec: d.spec.map(Box::new),
            status: d.status.map(Box::new),
            view: None,
        };
        c.trim();
        c
    }

    #[test]
    fn a_deployment_decoded_in_part_is_cached_as_the_whole_one_was() {
        let mut fixture: serde_json::Value =
            serde_json::from_str(include_str!("../../../benches/fixtures/deployment.json"))
                .unwrap();
        fixture["metadata"]["annotations"][crate::k8s::LAST_APPLIED] = "{}".into();
        fixture["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:paused"] = json!({});
        let mut governed_fixture = fixture.clone();
        governed_fixture["metadata"]["labels"][super::super::gate::GOVERNED_LABEL] = "true".into();
        for v in [
            deployment(json!({super::super::gate::GOVERNED_LABEL: "true"})),
            deployment(json!({"app": "web"})),
            deployment(serde_json::Value::Null),
            fixture,
            governed_fixture,
        ] {
            let whole = decoded_whole_then_trimmed(&v);
            let mut part: CachedDeployment = serde_json::from_str(&v.to_string()).unwrap();
            part.trim();
            assert_eq!(part.metadata, whole.metadata, "{v}");
            assert_eq!(part.view, whole.view, "{v}");
            assert!(part.spec.is_none() && part.status.is_none());
        }

        // Sent with its spec before its metadata (the API server does not), it is decoded whole
        // and trimmed the same.
        let v = deployment(json!({super::super::gate::GOVERNED_LABEL: "true"}));
        let spec_first = format!(
            r#"{{"spec": {}, "status": {}, "metadata": {}}}"#,
            v["spec"], v["status"], v["metadata"]
        );
        let mut part: CachedDeployment = serde_json::from_str(&spec_first).unwrap();
        assert!(part.spec.is_some() && part.status.is_some());
        part.trim();
        assert_eq!(part.view, decoded_whole_then_trimmed(&v).view);
        assert!(part.view.is_some());
    }

    #[test]
    fn a_replica_set_is_decoded_without_its_managed_fields() {
        let json = include_str!("../../../benches/fixtures/replicaset.json");
        let mut whole: ReplicaSet = serde_json::from_str(json).unwrap();
        assert!(whole.metadata.managed_fields.is_some());
        let cached: CachedReplicaSet = serde_json::from_str(json).unwrap();
        whole.metadata.managed_fields = None;
        assert_eq!(cached.metadata, whole.metadata);
        assert!(cached.controlling_deployment().is_some());
    }
}
