//! Server-side apply helpers. Every write ballast makes goes through here,
//! with a constant field manager, so that ownership of fields is visible in
//! `managedFields` and nothing the user wrote is taken over by accident.

use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};
use std::fmt::Debug;

/// Apply parameters for `manager`. `force` takes over conflicting fields,
/// which is only right for fields that are ours by contract (for example a
/// status we alone write).
pub fn params(manager: &str, force: bool) -> PatchParams {
    let p = PatchParams::apply(manager);
    if force { p.force() } else { p }
}

/// Server-side applies `status` (a partial status object) to the status
/// subresource of `name`. The patch carries `apiVersion` and `kind`, as apply
/// requires.
pub async fn apply_status<K>(
    api: &Api<K>,
    manager: &str,
    name: &str,
    status: impl Serialize,
) -> kube::Result<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    api.patch_status(name, &params(manager, true), &Patch::Apply(&patch))
        .await
}

/// [`apply_status`], only on `name` at `resource_version` (when given): a precondition, so a
/// status computed from an older copy never replaces a newer one (409 Conflict).
pub async fn apply_status_at<K>(
    api: &Api<K>,
    manager: &str,
    name: &str,
    resource_version: Option<&str>,
    status: impl Serialize,
) -> kube::Result<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let mut patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    if let Some(rv) = resource_version {
        patch["metadata"] = serde_json::json!({"resourceVersion": rv});
    }
    api.patch_status(name, &params(manager, true), &Patch::Apply(&patch))
        .await
}
