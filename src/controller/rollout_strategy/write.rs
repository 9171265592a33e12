//! The only place the RolloutStrategy controller writes: `spec.paused` of the target Deployment
//! by server-side apply with the field manager `ballast.dev/rollout-strategy` (the operator
//! owns that field), its replicas and (on rollback) its template by JSON patches guarded by a
//! test, hook Jobs (create — an existing one is adopted —, delete), the Deployment's
//! annotations and [`GOVERNED_LABEL`], and the strategy's own annotations once acted on and its
//! [`TARGET_GOVERNED_LABEL`].

use super::error::Error;
use super::gate::{GOVERNED_LABEL, TARGET_GOVERNED_LABEL};
use super::machine::{PHASE_LABEL, STRATEGY_ANNOTATION};
use crate::k8s::{ROLLOUT_STRATEGY_MANAGER, apply};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};

fn json_patch(ops: serde_json::Value) -> json_patch::Patch {
    serde_json::from_value(ops).expect("a valid JSON patch")
}

/// Whether the API server refused a write for good: a 4xx other than a conflict (409), a
/// throttle (429) or a missing object (404, which the next observation shows). Such a write is
/// not retried as is: the machine records the refusal.
pub fn refused(e: &kube::Error) -> Option<(u16, String)> {
    match e {
        kube::Error::Api(s)
            if (400..500).contains(&s.code) && ![404, 409, 429].contains(&s.code) =>
        {
            Some((s.code, s.message.clone()))
        }
        _ => None,
    }
}

fn deployment_error(e: kube::Error) -> Error {
    match e {
        kube::Error::Api(s) if s.code == 409 => Error::Conflict,
        // Our own unpause, refused by the revision hold: not a refusal for good (backoff).
        kube::Error::Api(s) if s.message.contains("is held by RolloutStrategy") => {
            Error::Held(s.message)
        }
        e => match refused(&e) {
            Some((code, message)) => Error::Refused { code, message },
            None => Error::Deployment(e),
        },
    }
}

/// What the API server answers (422) when it cannot apply a JSON patch, a failed `test` op
/// included: the cause is in neither the message nor the details, so this very message is how a
/// failed `test` of our resourceVersion guard shows.
const PATCH_NOT_APPLIED: &str = "the server rejected our request due to an error in our request";

/// The error of a JSON patch guarded by a `test` of the resourceVersion read. That read comes
/// from the cache, which may not show our own last write yet: a failed test is a stale read, to
/// decide again on (a conflict), never a refusal to record.
fn guarded_patch_error(e: kube::Error) -> Error {
    match e {
        kube::Error::Api(s) if s.code == 422 && s.message == PATCH_NOT_APPLIED => Error::Conflict,
        e => deployment_error(e),
    }
}

/// Sets `spec.paused` of Deployment `name`.
pub async fn set_paused(client: &Client, ns: &str, name: &str, paused: bool) -> Result<(), Error> {
    apply_paused(client, ns, name, paused, None).await
}

/// `spec.paused: false`, only if the Deployment is still at `resource_version` (when given):
/// a template changed in between — paused by the revision gate for its own hooks — is not
/// unpaused with it (409: the machine decides again on what is there now).
pub async fn unpause(
    client: &Client,
    ns: &str,
    name: &str,
    resource_version: Option<&str>,
) -> Result<(), Error> {
    apply_paused(client, ns, name, false, resource_version).await
}

async fn apply_paused(
    client: &Client,
    ns: &str,
    name: &str,
    paused: bool,
    resource_version: Option<&str>,
) -> Result<(), Error> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let mut body = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"paused": paused},
    });
    if let Some(rv) = resource_version.filter(|rv| !rv.is_empty()) {
        // In a server-side apply, a resourceVersion is a precondition.
        body["metadata"]["resourceVersion"] = rv.into();
    }
    api.patch(
        name,
        &apply::params(ROLLOUT_STRATEGY_MANAGER, true),
        &Patch::Apply(&body),
    )
    .await
    .map_err(deployment_error)?;
    Ok(())
}

/// Names the governing strategy (an annotation) and its phase (a label) on the Deployment, so
/// `kubectl describe deploy` tells who holds it and why, and labels it [`GOVERNED_LABEL`] for the
/// revision gate. One merge patch.
pub async fn annotate(
    client: &Client,
    ns: &str,
    name: &str,
    strategy: &str,
    phase: crate::api::RolloutPhase,
) -> Result<(), Error> {
    let patch = serde_json::json!({"metadata": {
        // The phase was an annotation before: gone from there.
        "annotations": {STRATEGY_ANNOTATION: strategy, PHASE_LABEL: null},
        "labels": {GOVERNED_LABEL: "true", PHASE_LABEL: super::machine::phase_name(phase)},
    }});
    merge_metadata(client, ns, name, &patch).await
}

/// Removes what [`annotate`] wrote, annotation and labels (the strategy is gone).
pub async fn remove_deployment_metadata(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<(), Error> {
    let patch = serde_json::json!({"metadata": {
        "annotations": {STRATEGY_ANNOTATION: null, PHASE_LABEL: null},
        "labels": {GOVERNED_LABEL: null, PHASE_LABEL: null},
    }});
    match merge_metadata(client, ns, name, &patch).await {
        Err(Error::Deployment(kube::Error::Api(s))) if s.code == 404 => Ok(()),
        r => r,
    }
}

async fn merge_metadata(
    client: &Client,
    ns: &str,
    name: &str,
    patch: &serde_json::Value,
) -> Result<(), Error> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    api.patch(name, &update_params(), &Patch::Merge(patch))
        .await
        .map_err(deployment_error)?;
    Ok(())
}

/// Parameters of our non-apply writes (scale, rollback): they carry the
/// field manager too, so `managedFields` shows who changed what.
fn update_params() -> PatchParams {
    PatchParams {
        field_manager: Some(ROLLOUT_STRATEGY_MANAGER.into()),
        ..Default::default()
    }
}

/// Sets `spec.replicas` of Deployment `name`.
pub async fn scale(client: &Client, ns: &str, name: &str, replicas: i32) -> Result<(), Error> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let patch = json_patch(serde_json::json!([
        {"op": "add", "path": "/spec/replicas", "value": replicas},
    ]));
    api.patch(name, &update_params(), &Patch::<()>::Json(patch))
        .await
        .map_err(deployment_error)?;
    Ok(())
}

/// Puts `template` back as the pod template of Deployment `name`, like `kubectl rollout undo`,
/// unless the Deployment changed since `resource_version`.
pub async fn restore_template(
    client: &Client,
    ns: &str,
    name: &str,
    resource_version: &str,
    template: &serde_json::Value,
) -> Result<(), Error> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let patch = json_patch(serde_json::json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "replace", "path": "/spec/template", "value": template},
    ]));
    api.patch(name, &update_params(), &Patch::<()>::Json(patch))
        .await
        .map_err(guarded_patch_error)?;
    Ok(())
}

/// Creates `job`; one that already exists (made before a restart) is adopted, never duplicated.
/// Returns whether it was created now.
pub async fn create_job(client: &Client, ns: &str, job: &Job) -> Result<bool, Error> {
    let api: Api<Job> = Api::namespaced(client.clone(), ns);
    let pp = PostParams {
        field_manager: Some(ROLLOUT_STRATEGY_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&pp, job).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(match refused(&e) {
            Some((code, message)) => Error::Refused { code, message },
            None => Error::CreateJob {
                job: job.name_any(),
                source: e,
            },
        }),
    }
}

/// Deletes hook Job `name` and its pods.
pub async fn delete_job(client: &Client, ns: &str, name: &str) -> Result<(), Error> {
    let api: Api<Job> = Api::namespaced(client.clone(), ns);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::DeleteJob {
            job: name.into(),
            source: e,
        }),
    }
}

/// Sets or removes the strategy's [`TARGET_GOVERNED_LABEL`] (a merge patch; repeated, the
/// same).
pub async fn mark_target(
    client: &Client,
    ns: &str,
    name: &str,
    covered: bool,
) -> Result<(), Error> {
    let api: Api<crate::api::RolloutStrategy> = Api::namespaced(client.clone(), ns);
    let value = covered.then_some("true");
    let patch = serde_json::json!({"metadata": {"labels": {TARGET_GOVERNED_LABEL: value}}});
    match api
        .patch(name, &update_params(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        // Deleted meanwhile: nothing to mark.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(Error::Annotation(e)),
    }
}

/// Removes annotation `key` from the strategy if it still has `value`.
pub async fn remove_annotation<K>(
    api: &Api<K>,
    name: &str,
    key: &str,
    value: &str,
) -> Result<(), Error>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let path = format!(
        "/metadata/annotations/{}",
        key.replace('~', "~0").replace('/', "~1")
    );
    let patch = json_patch(serde_json::json!([
        {"op": "test", "path": path, "value": value},
        {"op": "remove", "path": path},
    ]));
    match api
        .patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
    {
        Ok(_) => Ok(()),
        // Changed or gone meanwhile: nothing of ours to remove.
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 => Ok(()),
        Err(e) => Err(Error::Annotation(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status {
                code,
                ..kube::core::Status::failure(message, "Invalid")
            }
            .boxed(),
        )
    }

    #[test]
    fn a_failed_resource_version_test_is_a_conflict_not_a_refusal() {
        assert!(matches!(
            guarded_patch_error(api_error(422, PATCH_NOT_APPLIED)),
            Error::Conflict
        ));
        let invalid =
            "Deployment.apps \"web\" is invalid: spec.template.spec.containers: Required value";
        assert!(matches!(
            guarded_patch_error(api_error(422, invalid)),
            Error::Refused { code: 422, .. }
        ));
    }
}
