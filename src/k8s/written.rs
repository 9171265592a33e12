//! What is decoded of the API server's answer to a write: the object's identity and version,
//! never the rest. A PATCH is answered with the whole object, managedFields included; decoding
//! it into its k8s-openapi type allocates every string and every field of every manager's
//! entry, only for the caller to read the uid, the generation or the resourceVersion. Through
//! an `Api<Written<K>>` the rest of the answer is skipped as it is read (`make bench`'s
//! `decode_cost` measures both).

use kube::api::ObjectMeta;
use serde::{Deserialize, Deserializer};
use std::marker::PhantomData;

/// An object of kind `K` as a write's answer left it: name, namespace, uid, resourceVersion and
/// generation. Read-only: nothing is ever sent as a `Written`.
pub struct Written<K> {
    metadata: ObjectMeta,
    kind: PhantomData<fn() -> K>,
}

impl<K> Written<K> {
    /// The identity and version the answer carried.
    pub fn into_meta(self) -> ObjectMeta {
        self.metadata
    }
}

impl<K> std::fmt::Debug for Written<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Written")
            .field("metadata", &self.metadata)
            .finish()
    }
}

impl<K> Clone for Written<K> {
    fn clone(&self) -> Self {
        Self {
            metadata: self.metadata.clone(),
            kind: PhantomData,
        }
    }
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Identity {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    metadata: Identity,
}

impl<'de, K> Deserialize<'de> for Written<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = Answer::deserialize(d)?.metadata;
        Ok(Self {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                generation: m.generation,
                ..Default::default()
            },
            kind: PhantomData,
        })
    }
}

super::resource_as!(<K> Written<K>);

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;
    use kube::Resource;

    #[test]
    fn an_answer_keeps_the_identity_and_version_of_the_object_written() {
        let answer = include_str!("../../benches/fixtures/deployment.json");
        let whole: Deployment = serde_json::from_str(answer).unwrap();
        let written: Written<Deployment> = serde_json::from_str(answer).unwrap();
        let (w, m) = (written.meta(), &whole.metadata);
        assert_eq!(
            (
                &w.name,
                &w.namespace,
                &w.uid,
                &w.resource_version,
                w.generation
            ),
            (
                &m.name,
                &m.namespace,
                &m.uid,
                &m.resource_version,
                m.generation
            )
        );
        assert!(m.managed_fields.is_some() && w.managed_fields.is_none());
        assert_eq!(Written::<Deployment>::plural(&()), "deployments");
        assert_eq!(Written::<Deployment>::group(&()), "apps");
    }
}
