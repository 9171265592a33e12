//! Reading our own custom resources so that one object the controller cannot deserialize never
//! stops it for the others.
//!
//! A watch decodes every object of a list into the typed struct; one that fails (an integer past
//! `i32` stored before the CRD bounded it, a field of a newer version) fails the whole list, and
//! kube-runtime's watcher retries that list forever: every object of the kind stops being
//! reconciled. [`Lenient<K>`] decodes into `K` when it can and otherwise keeps the object's
//! metadata and the decoding error, so the controller can report the bad object on itself (a
//! condition and a Warning Event) and go on with the rest.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use kube::Resource;
use serde::{Deserialize, Deserializer, de::DeserializeOwned};
use std::borrow::Cow;

/// An object of kind `K` as stored: either readable, or not (with why).
#[derive(Clone, Debug)]
pub enum Lenient<K> {
    Ok(K),
    /// Boxed: rare, and much larger than a typical `K`.
    Invalid(Box<Invalid>),
}

/// What is kept of an object that does not decode into its type.
#[derive(Clone, Debug, Default)]
pub struct Invalid {
    pub metadata: ObjectMeta,
    /// The decoder's message, naming the field that failed.
    pub error: String,
    /// `status.conditions` as stored, when they decode (to keep their transition times).
    pub conditions: Vec<Condition>,
    /// The object as stored, for what a controller can still do without the typed spec (a
    /// finalizer that must release what the object governs).
    pub raw: serde_json::Value,
}

impl<K> Lenient<K> {
    /// The typed object, if it decoded.
    pub fn ok(&self) -> Option<&K> {
        match self {
            Lenient::Ok(k) => Some(k),
            Lenient::Invalid(_) => None,
        }
    }
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        match K::deserialize(&value) {
            Ok(k) => Ok(Lenient::Ok(k)),
            Err(e) => Ok(Lenient::Invalid(Box::new(Invalid {
                metadata: value
                    .get("metadata")
                    .and_then(|m| ObjectMeta::deserialize(m).ok())
                    .unwrap_or_default(),
                error: e.to_string(),
                conditions: value
                    .pointer("/status/conditions")
                    .and_then(|c| Vec::<Condition>::deserialize(c).ok())
                    .unwrap_or_default(),
                raw: value,
            }))),
        }
    }
}

impl<K: Resource> Resource for Lenient<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Ok(k) => k.meta(),
            Lenient::Invalid(i) => &i.metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Ok(k) => k.meta_mut(),
            Lenient::Invalid(i) => &mut i.metadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RolloutStrategy;
    use kube::ResourceExt;
    use serde_json::json;

    fn strategy(at: serde_json::Value) -> serde_json::Value {
        json!({
            "apiVersion": "ballast.dev/v1alpha1", "kind": "RolloutStrategy",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1"},
            "spec": {"targetRef": {"name": "web"}, "mid": [{"name": "smoke", "at": at, "approval": {}}]},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Idle", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
        })
    }

    #[test]
    fn a_readable_object_decodes_into_its_type() {
        let l: Lenient<RolloutStrategy> = serde_json::from_value(strategy(json!("50%"))).unwrap();
        assert_eq!(l.ok().unwrap().spec.target_ref.name, "web");
    }

    #[test]
    fn an_unreadable_object_keeps_its_identity_and_the_reason() {
        let l: Lenient<RolloutStrategy> =
            serde_json::from_value(strategy(json!(2147483648u64))).unwrap();
        let Lenient::Invalid(i) = &l else {
            panic!("expected an invalid object")
        };
        assert_eq!(
            (l.name_any(), l.namespace()),
            ("web".into(), Some("shop".into()))
        );
        assert!(i.error.contains("2147483648"), "{}", i.error);
        assert_eq!(i.conditions.len(), 1);
    }

    #[test]
    fn one_bad_object_does_not_fail_the_list() {
        let list = json!([strategy(json!(1)), strategy(json!(2147483648u64))]);
        let items: Vec<Lenient<RolloutStrategy>> = serde_json::from_value(list).unwrap();
        assert_eq!(items.iter().filter(|i| i.ok().is_some()).count(), 1);
    }
}
