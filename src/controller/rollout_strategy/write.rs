//! The only place the RolloutStrategy controller writes ([`perform`] maps each effect of a
//! decision to its write): `spec.paused` of the target Deployment by server-side apply with
//! the field manager `ballast.dev/rollout-strategy` (the operator owns that field), together
//! with the Deployment's phase label, [`GOVERNED_LABEL`] and strategy annotation; its replicas
//! and (on rollback) its template by JSON patches guarded by a test, hook Jobs (create — an
//! existing one is adopted —, delete), the Deployment's annotations and labels on their own
//! when no pause or unpause carries them, and the strategy's own annotations once acted on and
//! its [`TARGET_GOVERNED_LABEL`].

use super::CONTROLLER;
use super::error::Error;
use super::expect::{Expectations, Key};
use super::gate::{GOVERNED_LABEL, SHARD_LABEL, TARGET_GOVERNED_LABEL, shard_of};
use super::hooks;
use super::machine::{Decision, Effect, PHASE_LABEL, STRATEGY_ANNOTATION};
use super::observe::Observed;
use super::webhook;
use crate::api::RolloutStrategy;
use crate::k8s::lenient::Lenient;
use crate::k8s::{ROLLOUT_STRATEGY_MANAGER, apply, written::Written};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use kube::runtime::reflector::ObjectRef;
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

/// What a pause or an unpause says on the Deployment besides `spec.paused`: which strategy
/// governs it and the phase it is in ([`annotate`]'s fields), so the phase changes in the same
/// write as the pause.
#[derive(Clone, Copy, Debug)]
pub struct Marks<'a> {
    pub strategy: &'a str,
    pub phase: crate::api::RolloutPhase,
}

/// The server-side apply body of `spec.paused` (with `marks`, and with `resource_version` as a
/// precondition). Every apply of ours states the same fields: an apply that left one out would
/// take it away.
pub fn paused_body(
    name: &str,
    paused: bool,
    resource_version: Option<&str>,
    marks: Option<Marks>,
) -> serde_json::Value {
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
    if let Some(m) = marks {
        body["metadata"]["annotations"] = serde_json::json!({STRATEGY_ANNOTATION: m.strategy});
        body["metadata"]["labels"] = serde_json::json!({
            GOVERNED_LABEL: "true",
            PHASE_LABEL: super::machine::phase_name(m.phase),
            SHARD_LABEL: shard_of(name),
        });
    }
    body
}

/// Sets `spec.paused` of Deployment `name` (with `marks`). Returns the resourceVersion written.
pub async fn set_paused(
    client: &Client,
    ns: &str,
    name: &str,
    paused: bool,
    marks: Option<Marks<'_>>,
) -> Result<Option<String>, Error> {
    apply_paused(client, ns, name, paused, None, marks).await
}

/// `spec.paused: false`, only if the Deployment is still at `resource_version` (when given):
/// a template changed in between — paused by the revision gate for its own hooks — is not
/// unpaused with it (409: the machine decides again on what is there now).
pub async fn unpause(
    client: &Client,
    ns: &str,
    name: &str,
    resource_version: Option<&str>,
    marks: Option<Marks<'_>>,
) -> Result<Option<String>, Error> {
    apply_paused(client, ns, name, false, resource_version, marks).await
}

async fn apply_paused(
    client: &Client,
    ns: &str,
    name: &str,
    paused: bool,
    resource_version: Option<&str>,
    marks: Option<Marks<'_>>,
) -> Result<Option<String>, Error> {
    let api: Api<Written<Deployment>> = Api::namespaced(client.clone(), ns);
    let body = paused_body(name, paused, resource_version, marks);
    let written = api
        .patch(
            name,
            &apply::params(ROLLOUT_STRATEGY_MANAGER, true),
            &Patch::Apply(&body),
        )
        .await
        .map_err(deployment_error)?;
    Ok(written.resource_version())
}

/// Names the governing strategy (an annotation) and its phase (a label) on the Deployment, so
/// `kubectl describe deploy` tells who holds it and why, and labels it [`GOVERNED_LABEL`] for the
/// revision gate. One merge patch. Returns the resourceVersion written.
pub async fn annotate(
    client: &Client,
    ns: &str,
    name: &str,
    strategy: &str,
    phase: crate::api::RolloutPhase,
) -> Result<Option<String>, Error> {
    let patch = serde_json::json!({"metadata": {
        // The phase was an annotation before: gone from there.
        "annotations": {STRATEGY_ANNOTATION: strategy, PHASE_LABEL: null},
        "labels": {
            GOVERNED_LABEL: "true",
            PHASE_LABEL: super::machine::phase_name(phase),
            SHARD_LABEL: shard_of(name),
        },
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
        "labels": {GOVERNED_LABEL: null, PHASE_LABEL: null, SHARD_LABEL: null},
    }});
    match merge_metadata(client, ns, name, &patch).await {
        Err(Error::Deployment(kube::Error::Api(s))) if s.code == 404 => Ok(()),
        r => r.map(|_| ()),
    }
}

async fn merge_metadata(
    client: &Client,
    ns: &str,
    name: &str,
    patch: &serde_json::Value,
) -> Result<Option<String>, Error> {
    let api: Api<Written<Deployment>> = Api::namespaced(client.clone(), ns);
    let written = api
        .patch(name, &update_params(), &Patch::Merge(patch))
        .await
        .map_err(deployment_error)?;
    Ok(written.resource_version())
}

/// Parameters of our non-apply writes (scale, rollback): they carry the
/// field manager too, so `managedFields` shows who changed what.
fn update_params() -> PatchParams {
    PatchParams {
        field_manager: Some(ROLLOUT_STRATEGY_MANAGER.into()),
        ..Default::default()
    }
}

/// Sets `spec.replicas` of Deployment `name`. Returns the resourceVersion written.
pub async fn scale(
    client: &Client,
    ns: &str,
    name: &str,
    replicas: i32,
) -> Result<Option<String>, Error> {
    let api: Api<Written<Deployment>> = Api::namespaced(client.clone(), ns);
    let patch = json_patch(serde_json::json!([
        {"op": "add", "path": "/spec/replicas", "value": replicas},
    ]));
    let written = api
        .patch(name, &update_params(), &Patch::<()>::Json(patch))
        .await
        .map_err(deployment_error)?;
    Ok(written.resource_version())
}

/// Puts `template` back as the pod template of Deployment `name`, like `kubectl rollout undo`,
/// unless the Deployment changed since `resource_version`.
pub async fn restore_template(
    client: &Client,
    ns: &str,
    name: &str,
    resource_version: &str,
    template: &serde_json::Value,
) -> Result<Option<String>, Error> {
    let api: Api<Written<Deployment>> = Api::namespaced(client.clone(), ns);
    let patch = json_patch(serde_json::json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": resource_version},
        {"op": "replace", "path": "/spec/template", "value": template},
    ]));
    let written = api
        .patch(name, &update_params(), &Patch::<()>::Json(patch))
        .await
        .map_err(guarded_patch_error)?;
    Ok(written.resource_version())
}

/// Creates `job`; one that already exists (made before a restart) is adopted, never duplicated.
/// Returns the resourceVersion of the Job created now, `None` for one adopted.
pub async fn create_job(client: &Client, ns: &str, job: &Job) -> Result<Option<String>, Error> {
    let api: Api<Job> = Api::namespaced(client.clone(), ns);
    let pp = PostParams {
        field_manager: Some(ROLLOUT_STRATEGY_MANAGER.into()),
        ..Default::default()
    };
    match api.create(&pp, job).await {
        Ok(created) => Ok(Some(created.resource_version().unwrap_or_default())),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(None),
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

/// Sets or removes the strategy's [`TARGET_GOVERNED_LABEL`], and labels it with the gate shard
/// of its Deployment `target` ([`SHARD_LABEL`]) (a merge patch; repeated, the same). Returns the
/// strategy's resourceVersion written.
pub async fn mark_target(
    client: &Client,
    ns: &str,
    name: &str,
    target: &str,
    covered: bool,
) -> Result<Option<String>, Error> {
    let api: Api<Written<RolloutStrategy>> = Api::namespaced(client.clone(), ns);
    let value = covered.then_some("true");
    let patch = serde_json::json!({"metadata": {"labels": {
        TARGET_GOVERNED_LABEL: value,
        SHARD_LABEL: shard_of(target),
    }}});
    match api
        .patch(name, &update_params(), &Patch::Merge(&patch))
        .await
    {
        Ok(written) => Ok(written.resource_version()),
        // Deleted meanwhile: nothing to mark.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(Error::Annotation(e)),
    }
}

/// Removes annotation `key` from the strategy if it still has `value`. Returns the strategy's
/// resourceVersion written (`None` when there was nothing to remove).
pub async fn remove_annotation<K>(
    api: &Api<K>,
    name: &str,
    key: &str,
    value: &str,
) -> Result<Option<String>, Error>
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
        Ok(written) => Ok(written.resource_version()),
        // Changed or gone meanwhile: nothing of ours to remove.
        Err(kube::Error::Api(s)) if s.code == 422 || s.code == 409 => Ok(None),
        Err(e) => Err(Error::Annotation(e)),
    }
}

/// What [`perform`] acts with.
pub struct Act<'a> {
    pub client: &'a Client,
    pub metrics: &'a crate::metrics::Metrics,
    /// Where every write records what it leads us to expect of the caches.
    pub expect: &'a Expectations,
    pub strategy: &'a RolloutStrategy,
    pub observed: &'a Observed,
    pub decision: &'a Decision,
    /// Where webhook calls are made.
    pub calls: &'a Calls,
}

impl Act<'_> {
    /// The observed Deployment, if it is still at `revision`; else the decision is stale.
    fn deployment_at(&self, revision: &str) -> Result<&super::observe::DeploymentView, Error> {
        self.observed
            .deployment
            .as_ref()
            .filter(|d| d.revision == revision)
            .ok_or(Error::Conflict)
    }

    /// The hook of this name in the strategy's spec, at any point.
    fn hook(&self, name: &str) -> Option<&crate::api::Hook> {
        self.strategy
            .spec
            .hooks()
            .find(|(_, h)| h.name == name)
            .map(|(_, h)| h)
    }
}

/// Webhook calls: the caller (one call per key in this process), the hosts `url:` may name,
/// and the channel whose message wakes a strategy when its call is answered.
pub struct Calls {
    pub caller: webhook::Caller,
    pub allowed: webhook::AllowedHosts,
    pub wake: tokio::sync::mpsc::UnboundedSender<ObjectRef<Lenient<RolloutStrategy>>>,
}

/// Performs one effect of a decision: the one place that maps an [`Effect`] to a write. Each
/// write records its resourceVersion in [`Act::expect`]. Returns the strategy's
/// resourceVersion when the effect wrote the strategy itself.
pub async fn perform(effect: &Effect, a: &Act<'_>) -> Result<Option<String>, Error> {
    let strategy = a.strategy;
    let name = strategy.name_any();
    let ns = strategy.namespace().unwrap_or_default();
    let client = a.client;
    let target = &strategy.spec.target_ref.name;
    let marks = Marks {
        strategy: &name,
        phase: a.decision.status.phase.unwrap_or_default(),
    };
    let deployment = Key::Deployment(ns.clone(), target.clone());
    tracing::info!(strategy = %name, namespace = %ns, ?effect, "write");
    let result = match effect {
        Effect::Pause => set_paused(client, &ns, target, true, Some(marks)).await,
        // Only the Deployment as observed is unpaused: a template changed since (and paused by
        // the revision gate) must not be let go with it.
        Effect::Unpause => {
            let rv = a
                .observed
                .deployment
                .as_ref()
                .map(|d| d.resource_version.as_str());
            unpause(client, &ns, target, rv, Some(marks)).await
        }
        Effect::Annotate(phase) => annotate(client, &ns, target, &name, *phase).await,
        Effect::Scale(n) => scale(client, &ns, target, *n).await,
        Effect::RestoreTemplate => {
            let (Some(dep), Some(template)) = (
                a.observed.deployment.as_ref(),
                a.decision.status.stable_template.as_ref(),
            ) else {
                return Ok(None);
            };
            restore_template(client, &ns, target, &dep.resource_version, template).await
        }
        Effect::CreateJob {
            point,
            hook,
            revision,
            attempt,
        } => {
            let dep = a.deployment_at(revision)?;
            let Some(h) = a.hook(hook) else {
                return Err(Error::BuildJob(format!("hook {hook} is not in the spec")));
            };
            let job = hooks::build_job(&hooks::JobInput {
                strategy,
                deployment: target,
                deployment_uid: &dep.uid,
                hook: h,
                point: *point,
                from_revision: a.decision.status.stable_revision.as_deref(),
                to_revision: revision,
                attempt: *attempt,
                template: &dep.template,
            })
            .map_err(|e| Error::BuildJob(e.to_string()))?;
            let created = create_job(client, &ns, &job).await?;
            let job_name = job.name_any();
            if let Some(rv) = &created {
                a.expect
                    .wrote(Key::Job(ns.clone(), job_name.clone()), Some(rv));
            }
            a.metrics.count_write(
                CONTROLLER,
                "Job",
                if created.is_some() {
                    "created"
                } else {
                    "adopted"
                },
            );
            tracing::info!(strategy = %name, namespace = %ns, job = %job_name, created = created.is_some(), "hook Job");
            return Ok(None);
        }
        Effect::StartCall {
            point,
            hook,
            revision,
            attempt,
            key,
        } => {
            let dep = a.deployment_at(revision)?;
            let Some(w) = a.hook(hook).and_then(|h| h.webhook.as_ref()) else {
                return Err(Error::BuildCall(format!(
                    "hook {hook} is not a webhook of the spec"
                )));
            };
            let uid = strategy.uid().unwrap_or_default();
            // The machine checked the target before asking; a refusal here is a race with a
            // spec change, decided again on the next round.
            let call = webhook::build_call(&webhook::CallInput {
                hook: w,
                allowed: &a.calls.allowed,
                strategy: &name,
                namespace: &ns,
                strategy_uid: &uid,
                deployment: target,
                hook_name: hook,
                point: point.as_str(),
                from_revision: a.decision.status.stable_revision.as_deref(),
                to_revision: revision,
                attempt: *attempt,
                key,
                from_template: a.decision.status.stable_template.as_ref(),
                to_template: &dep.template_json,
            })
            .map_err(|f| Error::BuildCall(f.message))?;
            let me = ObjectRef::new(&name).within(&ns);
            let started = a.calls.caller.start(call, a.calls.wake.clone(), me);
            a.metrics.count_write(
                CONTROLLER,
                "Webhook",
                if started { "called" } else { "in-flight" },
            );
            tracing::info!(strategy = %name, namespace = %ns, hook, key, started, "webhook call");
            return Ok(None);
        }
        Effect::DeleteJob(job) => {
            delete_job(client, &ns, job).await?;
            a.expect.deleted(Key::Job(ns.clone(), job.clone()));
            a.metrics.count_write(CONTROLLER, "Job", "deleted");
            return Ok(None);
        }
        Effect::MarkTarget(covered) => {
            // "Covered" because the cache shows no Deployment: only a fresh read may say so
            // (one created a moment before the strategy, which the cache has not seen yet,
            // would be left without the gate). One created after this read is a create,
            // which the gate covers whatever the mark says.
            if *covered && a.observed.deployment.is_none() {
                let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
                if deployments
                    .get_metadata_opt(target)
                    .await
                    .map_err(Error::Deployment)?
                    .is_some()
                {
                    return Err(Error::Conflict);
                }
            }
            return mark_target(client, &ns, &name, target, *covered).await;
        }
        Effect::RemoveAnnotation(key) => {
            let api: Api<RolloutStrategy> = Api::namespaced(client.clone(), &ns);
            let value = strategy
                .annotations()
                .get(*key)
                .cloned()
                .unwrap_or_default();
            return remove_annotation(&api, &name, key, &value).await;
        }
    };
    a.metrics.count_write(
        CONTROLLER,
        "Deployment",
        if result.is_ok() { "patched" } else { "error" },
    );
    a.expect.wrote(deployment, result?.as_deref());
    Ok(None)
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
    fn a_pause_states_the_phase_and_who_governs_and_an_unpause_its_precondition() {
        let marks = Marks {
            strategy: "web",
            phase: crate::api::RolloutPhase::MidHook,
        };
        let b = paused_body("web", true, None, Some(marks));
        assert_eq!(b["spec"]["paused"], true);
        assert_eq!(b["metadata"]["labels"][PHASE_LABEL], "MidHook");
        assert_eq!(b["metadata"]["labels"][GOVERNED_LABEL], "true");
        assert_eq!(b["metadata"]["labels"][SHARD_LABEL], shard_of("web"));
        assert_eq!(b["metadata"]["annotations"][STRATEGY_ANNOTATION], "web");
        assert!(b["metadata"].get("resourceVersion").is_none());
        let b = paused_body("web", false, Some("42"), None);
        assert_eq!(b["metadata"]["resourceVersion"], "42");
        assert!(
            b["metadata"].get("labels").is_none(),
            "a release states no marks"
        );
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
