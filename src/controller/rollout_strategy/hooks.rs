//! Pure construction of hook Jobs: their deterministic names, labels, owner reference and
//! `BALLAST_*` env, and the pod built from a container of the NEW revision's template
//! (`container:` hooks) or from the user's JobSpec (`job:` hooks). No API calls.

use super::revision::short_hash;
use crate::api::{ContainerHook, Hook, HookAction, HookPoint, RolloutStrategy};
use k8s_openapi::api::batch::v1::{Job, JobSpec};
use k8s_openapi::api::core::v1::{Container, EnvVar, PodSpec, PodTemplateSpec, Volume};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;

/// Label on hook Jobs and their pods: the strategy (its name, shortened when longer than a
/// label value may be).
pub const LABEL_STRATEGY: &str = "ballast.dev/strategy";
/// Label on hook Jobs and their pods: the hook's name.
pub const LABEL_HOOK: &str = "ballast.dev/hook";
/// Label on hook Jobs and their pods: the revision the hook runs for.
pub const LABEL_REVISION: &str = "ballast.dev/revision";
/// Label on hook Jobs and their pods: `pre`, `mid` or `post`.
pub const LABEL_POINT: &str = "ballast.dev/point";
/// Label on hook Jobs and their pods: the attempt, from 1.
pub const LABEL_ATTEMPT: &str = "ballast.dev/attempt";

/// Annotation on hook Jobs: the UID of the Deployment they were made for, so that a Deployment
/// deleted and created again under the same name never inherits the old one's hook runs.
pub const ANNOTATION_TARGET_UID: &str = "ballast.dev/target-uid";

/// Longest Job name: Job names become the `job-name` label of their pods.
pub const MAX_NAME: usize = 63;

/// Why a hook Job cannot be built from the spec and the template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error("container {0:?} is not in the Deployment's pod template")]
    NoSuchContainer(String),
    #[error("job is not a valid JobSpec: {0}")]
    InvalidJobSpec(String),
    #[error("an approval gate or a webhook runs no Job")]
    NotAJob,
}

/// `value` if it fits in a label value (63 characters), else a prefix and a hash of it.
pub fn label_value(value: &str) -> String {
    if value.len() <= MAX_NAME {
        return value.to_string();
    }
    let hash = short_hash(value, 8);
    let head: String = value.chars().take(MAX_NAME - 9).collect();
    let head = head.trim_end_matches(['-', '.', '_']);
    format!("{head}-{hash}")
}

/// `{strategy}-{hook}-{revision}-{attempt}`, or, when that is longer than 63 characters, the
/// strategy and hook part shortened and followed by a hash of the full name, so that names stay
/// unique and deterministic.
pub fn job_name(strategy: &str, hook: &str, revision: &str, attempt: i32) -> String {
    let full = format!("{strategy}-{hook}-{revision}-{attempt}");
    if full.len() <= MAX_NAME {
        return full;
    }
    let suffix = format!("-{revision}-{attempt}");
    let hash = short_hash(&full, 8);
    let room = MAX_NAME.saturating_sub(suffix.len() + hash.len() + 1);
    let head: String = format!("{strategy}-{hook}").chars().take(room).collect();
    let head = head.trim_end_matches(['-', '.']);
    format!("{head}-{hash}{suffix}")
}

/// Everything a hook Job is built from.
pub struct JobInput<'a> {
    pub strategy: &'a RolloutStrategy,
    pub deployment: &'a str,
    /// UID of that Deployment.
    pub deployment_uid: &'a str,
    pub hook: &'a Hook,
    pub point: HookPoint,
    pub from_revision: Option<&'a str>,
    pub to_revision: &'a str,
    pub attempt: i32,
    /// The pod template of the NEW revision.
    pub template: &'a PodTemplateSpec,
}

/// The labels every hook Job and its pods carry.
pub fn labels(input: &JobInput) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            LABEL_STRATEGY.to_string(),
            label_value(&input.strategy.name_any()),
        ),
        (LABEL_HOOK.to_string(), input.hook.name.clone()),
        (LABEL_REVISION.to_string(), input.to_revision.to_string()),
        (LABEL_POINT.to_string(), input.point.as_str().to_string()),
        (LABEL_ATTEMPT.to_string(), input.attempt.to_string()),
    ])
}

/// The `BALLAST_*` env of a hook.
pub fn ballast_env(input: &JobInput) -> Vec<EnvVar> {
    let var = |name: &str, value: String| EnvVar {
        name: name.to_string(),
        value: Some(value),
        value_from: None,
    };
    vec![
        var("BALLAST_STRATEGY", input.strategy.name_any()),
        var("BALLAST_DEPLOYMENT", input.deployment.to_string()),
        var("BALLAST_HOOK", input.hook.name.clone()),
        var("BALLAST_HOOK_POINT", input.point.as_str().to_string()),
        var(
            "BALLAST_FROM_REVISION",
            input.from_revision.unwrap_or_default().to_string(),
        ),
        var("BALLAST_TO_REVISION", input.to_revision.to_string()),
        var("BALLAST_ATTEMPT", input.attempt.to_string()),
    ]
}

/// `base` with every variable of `overrides` replacing one of the same name (or appended).
fn merge_env(base: Vec<EnvVar>, overrides: &[EnvVar]) -> Vec<EnvVar> {
    let mut out: Vec<EnvVar> = base
        .into_iter()
        .filter(|e| !overrides.iter().any(|o| o.name == e.name))
        .collect();
    out.extend(overrides.iter().cloned());
    out
}

/// The hook container and the volumes its mounts use, copied from container `c.from`.
fn container_pod(
    c: &ContainerHook,
    template: &PodTemplateSpec,
    env: &[EnvVar],
) -> Result<PodSpec, BuildError> {
    let pod = template.spec.clone().unwrap_or_default();
    let from = pod
        .containers
        .iter()
        .find(|x| x.name == c.from)
        .ok_or_else(|| BuildError::NoSuchContainer(c.from.clone()))?;
    let mounts = from.volume_mounts.clone();
    let volumes: Vec<Volume> = pod
        .volumes
        .iter()
        .flatten()
        .filter(|v| mounts.iter().flatten().any(|m| m.name == v.name))
        .cloned()
        .collect();
    let inherited = from.env.clone().unwrap_or_default();
    let env = merge_env(merge_env(inherited, &c.env), env);
    let container = Container {
        name: from.name.clone(),
        image: from.image.clone(),
        image_pull_policy: from.image_pull_policy.clone(),
        command: (!c.command.is_empty()).then(|| c.command.clone()),
        args: (!c.args.is_empty()).then(|| c.args.clone()),
        env: Some(env),
        env_from: from.env_from.clone(),
        volume_mounts: mounts,
        working_dir: from.working_dir.clone(),
        resources: from.resources.clone(),
        security_context: from.security_context.clone(),
        ..Default::default()
    };
    Ok(PodSpec {
        containers: vec![container],
        volumes: (!volumes.is_empty()).then_some(volumes),
        image_pull_secrets: pod.image_pull_secrets.clone(),
        // Without the pod-level context (runAsNonRoot, runAsUser, fsGroup, seccomp) the hook
        // is forbidden in a PSA `restricted` namespace, and runs as root where the app doesn't.
        security_context: pod.security_context.clone(),
        restart_policy: Some("Never".into()),
        ..Default::default()
    })
}

/// The Job of one attempt of a hook. `Err` for an approval gate or a spec that cannot work
/// (a missing `from` container, a `job` that is not a JobSpec).
pub fn build_job(input: &JobInput) -> Result<Job, BuildError> {
    let labels = labels(input);
    let env = ballast_env(input);
    let hook = input.hook;
    let mut spec: JobSpec = match hook.action() {
        Some(HookAction::Container(c)) => JobSpec {
            template: PodTemplateSpec {
                metadata: None,
                spec: Some(container_pod(c, input.template, &env)?),
            },
            ..Default::default()
        },
        Some(HookAction::Job(v)) => {
            let mut spec: JobSpec = serde_json::from_value(v.clone())
                .map_err(|e| BuildError::InvalidJobSpec(e.to_string()))?;
            if let Some(pod) = spec.template.spec.as_mut() {
                for c in pod.containers.iter_mut() {
                    c.env = Some(merge_env(c.env.take().unwrap_or_default(), &env));
                }
                if pod.restart_policy.is_none() {
                    pod.restart_policy = Some("Never".into());
                }
            } else {
                return Err(BuildError::InvalidJobSpec(
                    "template.spec is missing".into(),
                ));
            }
            spec
        }
        Some(HookAction::Approval | HookAction::Webhook(_)) | None => {
            return Err(BuildError::NotAJob);
        }
    };
    // Retries are new attempts with new Jobs, so one Job is one try (unless a `job:` hook says
    // otherwise).
    if spec.backoff_limit.is_none() {
        spec.backoff_limit = Some(0);
    }
    if spec.active_deadline_seconds.is_none() {
        spec.active_deadline_seconds = Some(i64::from(hook.timeout_seconds));
    }
    // A Job deleted by its TTL before its result is read would read as JobDeleted and fail a
    // good revision; finished hook Jobs are pruned by `hookHistoryLimit` instead.
    spec.ttl_seconds_after_finished = None;
    let pod_meta = spec.template.metadata.get_or_insert_with(Default::default);
    pod_meta
        .labels
        .get_or_insert_with(Default::default)
        .extend(labels.clone());
    if let (Some(sa), Some(pod)) = (&hook.service_account_name, spec.template.spec.as_mut()) {
        pod.service_account_name = Some(sa.clone());
    }

    let strategy = input.strategy;
    let owner = OwnerReference {
        api_version: RolloutStrategy::api_version(&()).into_owned(),
        kind: RolloutStrategy::kind(&()).into_owned(),
        name: strategy.name_any(),
        uid: strategy.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    Ok(Job {
        metadata: ObjectMeta {
            name: Some(job_name(
                &strategy.name_any(),
                &hook.name,
                input.to_revision,
                input.attempt,
            )),
            namespace: strategy.namespace(),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(
                ANNOTATION_TARGET_UID.to_string(),
                input.deployment_uid.to_string(),
            )])),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// Whether a Job can be built for `hook` from `template` (checked before anything is created,
/// so a hook that can never run fails at once with a reason).
pub fn validate(hook: &Hook, template: &PodTemplateSpec) -> Result<(), BuildError> {
    match hook.action() {
        Some(HookAction::Container(c)) => template
            .spec
            .iter()
            .flat_map(|s| s.containers.iter())
            .any(|x| x.name == c.from)
            .then_some(())
            .ok_or_else(|| BuildError::NoSuchContainer(c.from.clone())),
        Some(HookAction::Job(v)) => {
            let spec: JobSpec = serde_json::from_value(v.clone())
                .map_err(|e| BuildError::InvalidJobSpec(e.to_string()))?;
            spec.template
                .spec
                .map(|_| ())
                .ok_or_else(|| BuildError::InvalidJobSpec("template.spec is missing".into()))
        }
        Some(HookAction::Approval | HookAction::Webhook(_)) | None => Err(BuildError::NotAJob),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RolloutStrategySpec;
    use serde_json::json;

    fn strategy(name: &str) -> RolloutStrategy {
        let mut s = RolloutStrategy::new(name, RolloutStrategySpec::default());
        s.metadata.namespace = Some("shop".into());
        s.metadata.uid = Some("uid-1".into());
        s
    }

    fn template() -> PodTemplateSpec {
        serde_json::from_value(json!({
            "metadata": {"labels": {"app": "web"}},
            "spec": {
                "imagePullSecrets": [{"name": "regcred"}],
                "volumes": [
                    {"name": "config", "configMap": {"name": "web-config"}},
                    {"name": "unused", "emptyDir": {}}
                ],
                "containers": [
                    {"name": "sidecar", "image": "proxy:1"},
                    {
                        "name": "app", "image": "web:2", "workingDir": "/srv",
                        "command": ["web"], "args": ["--serve"],
                        "env": [{"name": "DB", "value": "pg"}, {"name": "LOG_LEVEL", "value": "debug"}],
                        "envFrom": [{"secretRef": {"name": "web-secrets"}}],
                        "volumeMounts": [{"name": "config", "mountPath": "/etc/web"}],
                        "resources": {"limits": {"cpu": "1"}},
                        "securityContext": {"runAsNonRoot": true},
                        "ports": [{"containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/", "port": 8080}}
                    }
                ]
            }
        }))
        .unwrap()
    }

    fn hook(yaml: &str) -> Hook {
        serde_yaml::from_str(yaml).unwrap()
    }

    fn build(h: &Hook, s: &RolloutStrategy, t: &PodTemplateSpec) -> Job {
        build_job(&JobInput {
            strategy: s,
            deployment: "web",
            deployment_uid: "dep-uid",
            hook: h,
            point: HookPoint::Pre,
            from_revision: Some("aaaaaaaaaa"),
            to_revision: "bbbbbbbbbb",
            attempt: 2,
            template: t,
        })
        .unwrap()
    }

    fn env_of(c: &Container) -> BTreeMap<String, String> {
        c.env
            .iter()
            .flatten()
            .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
            .collect()
    }

    #[test]
    fn job_name_is_strategy_hook_revision_attempt() {
        assert_eq!(
            job_name("web", "migrate", "0123456789", 1),
            "web-migrate-0123456789-1"
        );
    }

    #[test]
    fn long_job_names_are_shortened_deterministically_and_uniquely() {
        let s = "a".repeat(60);
        let a = job_name(&s, "migrate", "0123456789", 1);
        let b = job_name(&s, "migrate-db", "0123456789", 1);
        assert!(a.len() <= MAX_NAME, "{a}");
        assert!(a.ends_with("-0123456789-1"), "{a}");
        assert_eq!(a, job_name(&s, "migrate", "0123456789", 1));
        assert_ne!(a, b);
        let c = job_name(&s, "migrate", "0123456789", 10);
        assert!(c.len() <= MAX_NAME && c.ends_with("-10"));
    }

    #[test]
    fn longest_allowed_names_fit() {
        let n = job_name(&"s".repeat(253), &"h".repeat(40), "0123456789", 11);
        assert!(n.len() <= MAX_NAME);
        assert!(!n.starts_with('-'));
    }

    #[test]
    fn long_strategy_names_make_short_label_values() {
        let v = label_value(&"x".repeat(100));
        assert!(v.len() <= MAX_NAME);
        assert_eq!(label_value("web"), "web");
    }

    #[test]
    fn container_hook_inherits_from_the_new_template_and_its_own_fields_win() {
        let h = hook(
            "{name: migrate, container: {from: app, command: [bin/migrate], args: [up], env: [{name: LOG_LEVEL, value: info}]}}",
        );
        let job = build(&h, &strategy("web"), &template());
        let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert_eq!(pod.containers.len(), 1);
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("web:2"));
        assert_eq!(c.command, Some(vec!["bin/migrate".to_string()]));
        assert_eq!(c.args, Some(vec!["up".to_string()]));
        assert_eq!(c.working_dir.as_deref(), Some("/srv"));
        assert!(c.env_from.is_some());
        assert!(c.resources.is_some());
        assert_eq!(
            c.security_context.as_ref().unwrap().run_as_non_root,
            Some(true)
        );
        assert!(c.ports.is_none() && c.readiness_probe.is_none());
        let env = env_of(c);
        assert_eq!(env["DB"], "pg");
        assert_eq!(env["LOG_LEVEL"], "info", "the hook's env wins");
        assert_eq!(env["BALLAST_TO_REVISION"], "bbbbbbbbbb");
        let vols: Vec<_> = pod
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        assert_eq!(vols, ["config"], "only the volumes the mounts use");
        assert_eq!(pod.image_pull_secrets.as_ref().unwrap()[0].name, "regcred");
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
    }

    #[test]
    fn container_hook_without_command_keeps_the_image_entrypoint() {
        let h = hook("{name: migrate, container: {from: app}}");
        let job = build(&h, &strategy("web"), &template());
        let c = &job.spec.unwrap().template.spec.unwrap().containers[0];
        assert_eq!(c.command, None);
        assert_eq!(c.args, None);
    }

    #[test]
    fn every_ballast_variable_is_set() {
        let h = hook("{name: migrate, container: {from: app}}");
        let job = build(&h, &strategy("web"), &template());
        let env = env_of(&job.spec.unwrap().template.spec.unwrap().containers[0]);
        for (k, v) in [
            ("BALLAST_STRATEGY", "web"),
            ("BALLAST_DEPLOYMENT", "web"),
            ("BALLAST_HOOK", "migrate"),
            ("BALLAST_HOOK_POINT", "pre"),
            ("BALLAST_FROM_REVISION", "aaaaaaaaaa"),
            ("BALLAST_TO_REVISION", "bbbbbbbbbb"),
            ("BALLAST_ATTEMPT", "2"),
        ] {
            assert_eq!(env[k], v, "{k}");
        }
    }

    #[test]
    fn job_is_owned_labelled_named_and_one_try() {
        let h = hook("{name: migrate, container: {from: app}, timeoutSeconds: 42}");
        let job = build(&h, &strategy("web"), &template());
        assert_eq!(
            job.metadata.name.as_deref(),
            Some("web-migrate-bbbbbbbbbb-2")
        );
        assert_eq!(job.metadata.namespace.as_deref(), Some("shop"));
        let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.controller),
            ("RolloutStrategy", "web", Some(true))
        );
        let labels = job.metadata.labels.clone().unwrap();
        assert_eq!(labels[LABEL_STRATEGY], "web");
        assert_eq!(labels[LABEL_HOOK], "migrate");
        assert_eq!(labels[LABEL_REVISION], "bbbbbbbbbb");
        let spec = job.spec.unwrap();
        let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
        assert_eq!(pod_labels[LABEL_STRATEGY], "web");
        assert!(
            !pod_labels.contains_key("app"),
            "never the Deployment's labels"
        );
        assert_eq!(spec.backoff_limit, Some(0));
        assert_eq!(spec.active_deadline_seconds, Some(42));
    }

    #[test]
    fn missing_from_container_is_an_error() {
        let h = hook("{name: migrate, container: {from: nope}}");
        let err = build_job(&JobInput {
            strategy: &strategy("web"),
            deployment: "web",
            deployment_uid: "dep-uid",
            hook: &h,
            point: HookPoint::Pre,
            from_revision: None,
            to_revision: "bbbbbbbbbb",
            attempt: 1,
            template: &template(),
        })
        .unwrap_err();
        assert_eq!(err, BuildError::NoSuchContainer("nope".into()));
    }

    #[test]
    fn job_hook_runs_as_written_plus_labels_and_env() {
        let h = hook(
            "{name: smoke, at: 1, serviceAccountName: tester, job: {backoffLimit: 2, template: {metadata: {labels: {team: qa}}, spec: {containers: [{name: t, image: 'acme/smoke:1', args: [http://web], env: [{name: BALLAST_HOOK, value: mine}]}]}}}}",
        );
        let job = build(&h, &strategy("web"), &template());
        let spec = job.spec.unwrap();
        assert_eq!(spec.backoff_limit, Some(2), "as written");
        let meta = spec.template.metadata.unwrap();
        let labels = meta.labels.unwrap();
        assert_eq!(labels["team"], "qa");
        assert_eq!(labels[LABEL_HOOK], "smoke");
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.service_account_name.as_deref(), Some("tester"));
        assert_eq!(pod.restart_policy.as_deref(), Some("Never"));
        let c = &pod.containers[0];
        assert_eq!(c.image.as_deref(), Some("acme/smoke:1"));
        assert_eq!(env_of(c)["BALLAST_HOOK"], "smoke", "ours win");
    }

    #[test]
    fn approval_builds_no_job() {
        let h = hook("{name: go, at: 1, approval: {}}");
        let err = build_job(&JobInput {
            strategy: &strategy("web"),
            deployment: "web",
            deployment_uid: "dep-uid",
            hook: &h,
            point: HookPoint::Mid,
            from_revision: None,
            to_revision: "b",
            attempt: 1,
            template: &template(),
        })
        .unwrap_err();
        assert_eq!(err, BuildError::NotAJob);
    }

    #[test]
    fn a_container_hook_keeps_the_pods_security_context() {
        let mut t = template();
        t.spec.as_mut().unwrap().security_context = serde_json::from_value(json!({
            "runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}
        }))
        .unwrap();
        let h = hook("{name: migrate, container: {from: app}}");
        let job = build(&h, &strategy("web"), &t);
        let pod = job.spec.unwrap().template.spec.unwrap();
        assert_eq!(
            pod.security_context,
            t.spec.unwrap().security_context,
            "needed to run in a PSA restricted namespace"
        );
    }

    #[test]
    fn a_job_hooks_ttl_is_dropped_so_its_result_is_never_lost() {
        let h = hook(
            "{name: smoke, job: {ttlSecondsAfterFinished: 0, template: {spec: {containers: [{name: t, image: smoke:1}]}}}}",
        );
        let job = build(&h, &strategy("web"), &template());
        assert_eq!(job.spec.unwrap().ttl_seconds_after_finished, None);
        assert_eq!(
            job.metadata.annotations.unwrap()[ANNOTATION_TARGET_UID],
            "dep-uid"
        );
    }
}
