//! Setting a resource's finalizers as a compare-and-swap, shared by both
//! controllers: the JSON patch tests the `resourceVersion` it was computed
//! from, so a stale copy never overwrites a newer list.

use kube::{
    Api, Resource, ResourceExt,
    api::{Patch, PatchParams},
};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object changed since it was read (a failed `test`, 422, or a
    /// conflict, 409), or is gone (404: a second reconcile of an object whose
    /// deletion the first one finished): the newer version, or the deletion, is
    /// already on its way through the watch.
    #[error("the object changed since it was read")]
    Stale,
    #[error("updating finalizers: {0}")]
    Api(#[source] kube::Error),
}

/// `obj`'s finalizers without `name`: what [`set`] writes once `name`'s work is done.
pub fn without(obj: &impl Resource, name: &str) -> Vec<String> {
    obj.finalizers()
        .iter()
        .filter(|f| *f != name)
        .cloned()
        .collect()
}

/// Replaces `obj`'s finalizers with `finalizers`, unless `obj` is stale.
pub async fn set<K>(api: &Api<K>, obj: &K, finalizers: Vec<String>) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let patch = serde_json::json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": obj.resource_version()},
        {"op": "add", "path": "/metadata/finalizers", "value": finalizers},
    ]);
    let patch: json_patch::Patch = serde_json::from_value(patch).expect("a valid JSON patch");
    match api
        .patch(
            &obj.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if [404, 409, 422].contains(&s.code) => Err(Error::Stale),
        Err(e) => Err(Error::Api(e)),
    }
}
