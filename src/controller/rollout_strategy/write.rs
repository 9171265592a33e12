//! The only place the RolloutStrategy controller writes: `spec.paused` of the target Deployment
//! by server-side apply with the field manager `ballast.dev/rollout-strategy` (the operator
//! owns that field), its replicas and (on rollback) its template by JSON patches guarded by a
//! test, hook Jobs (create — an existing one is adopted —, delete), and the strategy's own
//! annotations once acted on.

use super::error::Error;
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
        // A failed `test` of our resourceVersion guard: the Deployment moved; decide again.
        kube::Error::Api(s) if s.code == 422 && s.message.contains("test") => Error::Conflict,
        e => match refused(&e) {
            Some((code, message)) => Error::Refused { code, message },
            None => Error::Deployment(e),
        },
    }
}

/// Sets `spec.paused` of Deployment `name`.
pub async fn set_paused(client: &Client, ns: &str, name: &str, paused: bool) -> Result<(), Error> {
    let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let body = serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"paused": paused},
    });
    api.patch(
        name,
        &apply::params(ROLLOUT_STRATEGY_MANAGER, true),
        &Patch::Apply(&body),
    )
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
        .map_err(deployment_error)?;
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
