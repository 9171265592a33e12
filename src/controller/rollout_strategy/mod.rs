//! The RolloutStrategy controller: sequences the rollout of one plain Deployment with pre, mid
//! and post hooks, all progress in status. How the Deployment is held while hooks run is the
//! [`gate`]: paused by the revision gate (admission) for a new revision only, or, where that
//! is not available, kept paused at rest.
//!
//! Steps, one module each:
//! - read: [`observe`] — the Deployment, its ReplicaSets, the hook Jobs and pods, log tails;
//! - decide: [`machine`] (with [`revision`] and [`hooks`]) — pure;
//! - write: [`write`] — pause/unpause, scale, rollback, Jobs; the only place that writes;
//! - status: [`status`] — the status, Events and metrics of each transition.
//!
//! A reconcile repeats observe → decide → write until a decision changes nothing, then sleeps
//! until a watched object changes (the strategy, its Deployment, its Jobs, its hook pods) or a
//! timer of the machine (a timeout, a backoff, a deadline) ends.

pub mod error;
pub mod gate;
pub mod hooks;
pub mod machine;
pub mod observe;
pub mod revision;
pub mod status;
pub mod write;

use super::{Context, ShutdownSignal, backoff::Backoff};
use crate::api::rollout_strategy::{APPROVE_ANNOTATION, RETRY_ANNOTATION};
use crate::api::{HookPhase, RolloutStrategy};
use crate::k8s::lenient::{Invalid, Lenient};
use crate::k8s::{ROLLOUT_STRATEGY_MANAGER, finalizer};
use error::Error;
use futures::StreamExt;
use k8s_openapi::api::{apps::v1::Deployment, batch::v1::Job, core::v1::Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{
    Api, Resource, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::Reporter,
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use machine::{Effect, Input, Rejection};
use std::{sync::Arc, time::Duration};

pub const CONTROLLER: &str = "rollout-strategy";
/// Keeps a strategy until its Deployment is unpaused (the operator never leaves a Deployment
/// paused behind it).
pub const FINALIZER: &str = "ballast.dev/rollout-strategy";
/// Most observe → decide → write rounds in one reconcile.
const MAX_STEPS: usize = 24;
/// Even with nothing to wait for, look again this often.
const RESYNC: Duration = Duration::from_secs(300);

/// What every reconcile of this controller shares.
pub struct State {
    ctx: Context,
    /// Ends waits that the shutdown would otherwise sit out.
    shutdown: ShutdownSignal,
    recorder: super::events::Publisher,
    strategies: Store<Lenient<RolloutStrategy>>,
    backoff: Backoff,
    /// How governed Deployments are held ([`gate`]).
    gates: gate::Gates,
}

type Strategies = Store<Lenient<RolloutStrategy>>;

/// What decides which of several strategies governs a Deployment: the oldest (by creation,
/// then name).
type Seniority = (Option<jiff::Timestamp>, String);

fn seniority(meta: &kube::api::ObjectMeta) -> Seniority {
    (
        meta.creation_timestamp.as_ref().map(|t: &Time| t.0),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The oldest other readable strategy in `ns` targeting Deployment `target`, if it is older
/// than the one with `mine`: that one governs the Deployment.
fn governed_by(store: &Strategies, ns: &str, target: &str, mine: &Seniority) -> Option<String> {
    store
        .state()
        .iter()
        .filter_map(|s| s.ok())
        .filter(|s| {
            s.namespace().as_deref() == Some(ns)
                && s.name_any() != mine.1
                && s.spec.target_ref.name == target
        })
        .map(|s| seniority(s.meta()))
        .filter(|k| k < mine)
        .min()
        .map(|k| k.1)
}

/// The strategies in `ns` whose target is Deployment `name`.
fn strategies_for(
    store: &Strategies,
    ns: Option<String>,
    name: &str,
) -> Vec<ObjectRef<Lenient<RolloutStrategy>>> {
    store
        .state()
        .iter()
        .filter(|s| s.namespace() == ns && s.ok().is_some_and(|s| s.spec.target_ref.name == name))
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

pub async fn run(ctx: Context, gates: gate::Gates, shutdown: ShutdownSignal) {
    let cfg = watcher::Config::default().any_semantic();
    let health = &ctx.health;
    let (store, writer) = reflector::store();
    let strategies = super::watch(
        ctx.scoped_api::<Lenient<RolloutStrategy>>(),
        cfg.clone(),
        health.clone(),
        "rollout-strategy/rolloutstrategies",
    )
    .reflect(writer)
    .touched_objects();
    let controller = Controller::for_stream(strategies, store.clone());
    let (s1, s2, s3) = (store.clone(), store.clone(), store);
    let deployments = super::watch(
        ctx.scoped_api::<Deployment>(),
        cfg.clone(),
        health.clone(),
        "rollout-strategy/deployments",
    )
    .touched_objects();
    let hook_pods = super::watch(
        ctx.scoped_api::<Pod>(),
        cfg.clone().labels(hooks::LABEL_STRATEGY),
        health.clone(),
        "rollout-strategy/pods",
    )
    .touched_objects();
    let jobs = super::watch(
        ctx.scoped_api::<Job>(),
        cfg.clone().labels(hooks::LABEL_STRATEGY),
        health.clone(),
        "rollout-strategy/jobs",
    )
    .touched_objects();
    let reporter = Reporter {
        controller: ROLLOUT_STRATEGY_MANAGER.into(),
        instance: None,
    };
    let state = Arc::new(State {
        recorder: super::events::Publisher::new(ctx.client.clone(), reporter),
        shutdown: shutdown.clone(),
        ctx: ctx.clone(),
        strategies: s3,
        backoff: Backoff::default(),
        gates: gates.clone(),
    });
    // The gate in force, as a metric; a change of it is every strategy's business.
    ctx.metrics
        .set_gate(gates.current().gate == crate::api::Gate::Admission);
    let changes = {
        let (gates, metrics) = (gates.clone(), ctx.metrics.clone());
        gates.changes().map(move |()| {
            metrics.set_gate(gates.current().gate == crate::api::Gate::Admission);
        })
    };
    controller
        .reconcile_all_on(changes)
        .owns_stream(jobs)
        .watches_stream(deployments, move |d: Deployment| {
            strategies_for(&s1, d.namespace(), &d.name_any())
        })
        .watches_stream(hook_pods, move |p: Pod| {
            let value = p
                .labels()
                .get(hooks::LABEL_STRATEGY)
                .cloned()
                .unwrap_or_default();
            s2.state()
                .iter()
                .filter(|s| s.namespace() == p.namespace())
                .filter(|s| hooks::label_value(&s.name_any()) == value)
                .map(|s| ObjectRef::from_obj(s.as_ref()))
                .collect::<Vec<_>>()
        })
        .with_config(kube::runtime::controller::Config::default().concurrency(4))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, state)
        .for_each(|_| futures::future::ready(()))
        .await;
}

fn key(obj: &Lenient<RolloutStrategy>) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

async fn reconcile(obj: Arc<Lenient<RolloutStrategy>>, st: Arc<State>) -> Result<Action, Error> {
    let start = std::time::Instant::now();
    let result = sync(&obj, &st).await;
    st.ctx
        .metrics
        .count_reconcile(CONTROLLER, start.elapsed().as_secs_f64());
    if result.is_ok() {
        st.backoff.succeeded(&key(&obj));
    }
    result
}

fn error_policy(obj: Arc<Lenient<RolloutStrategy>>, err: &Error, st: Arc<State>) -> Action {
    st.ctx.metrics.count_error(CONTROLLER, err.reason());
    tracing::warn!(strategy = %obj.name_any(), namespace = ?obj.namespace(), error = %err, reason = err.reason(), "reconcile failed");
    match err {
        // Stale reads are ordinary: the newer object is already on its way.
        Error::Conflict => Action::requeue(Duration::from_millis(500)),
        _ => Action::requeue(st.backoff.failed(&key(&obj))),
    }
}

async fn set_finalizers<K>(api: &Api<K>, obj: &K, finalizers: Vec<String>) -> Result<(), Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    finalizer::set(api, obj, finalizers)
        .await
        .map_err(|e| match e {
            finalizer::Error::Stale => Error::Conflict,
            finalizer::Error::Api(e) => Error::Finalizer(e),
        })
}

/// A stored strategy this version cannot read: reported on itself, and on deletion the
/// Deployment it names is still released, so deletion finishes and nothing stays paused.
async fn sync_invalid(
    obj: &Lenient<RolloutStrategy>,
    inv: &Invalid,
    st: &State,
) -> Result<Action, Error> {
    let ns = obj.namespace().unwrap_or_default();
    let client = &st.ctx.client;
    if obj.meta().deletion_timestamp.is_some() {
        if !obj.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(Action::await_change());
        }
        if let Some(target) = inv
            .raw
            .pointer("/spec/targetRef/name")
            .and_then(|v| v.as_str())
        {
            let original = inv
                .raw
                .pointer("/status/originalReplicas")
                .and_then(|v| v.as_i64())
                .and_then(|v| i32::try_from(v).ok());
            release(st, &ns, target, &seniority(obj.meta()), original).await?;
        }
        let api: Api<Lenient<RolloutStrategy>> = Api::namespaced(client.clone(), &ns);
        let rest = obj
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .cloned()
            .collect();
        return set_finalizers(&api, obj, rest)
            .await
            .map(|_| Action::await_change());
    }
    super::report_invalid::<Lenient<RolloutStrategy>>(
        client,
        &st.recorder,
        ROLLOUT_STRATEGY_MANAGER,
        inv,
    )
    .await
    .map_err(Error::ReportInvalid)?;
    Ok(Action::await_change())
}

async fn sync(obj: &Lenient<RolloutStrategy>, st: &State) -> Result<Action, Error> {
    // Which strategy governs a Deployment is read from the cache of all strategies.
    let ready = async {
        let _ = st.strategies.wait_until_ready().await;
    };
    if !super::caches_ready(ready, &st.shutdown, Duration::from_secs(30)).await {
        return Err(Error::CacheNotReady);
    }
    let ns = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let client = &st.ctx.client;
    let api: Api<RolloutStrategy> = Api::namespaced(client.clone(), &ns);
    let lenient: Api<Lenient<RolloutStrategy>> = Api::namespaced(client.clone(), &ns);
    // Until a round changes nothing, look again soon.
    let mut requeue = Some(Duration::from_secs(1));
    // A write the API server refused in this reconcile: the machine decides once more knowing
    // it, and a refused Deployment write ends the reconcile in backoff.
    let mut rejected: Option<Rejection> = None;
    for _ in 0..MAX_STEPS {
        // Fresh every round: the cache may not have caught up with our own status writes.
        let strategy = match lenient.get_opt(&name).await.map_err(Error::Read)? {
            None => return Ok(Action::await_change()),
            Some(Lenient::Ok(s)) => s,
            Some(l @ Lenient::Invalid(_)) => {
                let Lenient::Invalid(inv) = &l else {
                    unreachable!()
                };
                return sync_invalid(&l, inv, st).await;
            }
        };
        let has_finalizer = strategy.finalizers().iter().any(|f| f == FINALIZER);
        if strategy.metadata.deletion_timestamp.is_some() {
            if has_finalizer {
                let original = strategy.status.as_ref().and_then(|s| s.original_replicas);
                release(
                    st,
                    &ns,
                    &strategy.spec.target_ref.name,
                    &seniority(&strategy.metadata),
                    original,
                )
                .await?;
                let rest = strategy
                    .finalizers()
                    .iter()
                    .filter(|f| *f != FINALIZER)
                    .cloned()
                    .collect();
                set_finalizers(&api, &strategy, rest).await?;
                tracing::info!(strategy = %name, namespace = %ns, "released the Deployment; finalizer removed");
            }
            return Ok(Action::await_change());
        }
        if !has_finalizer {
            let mut f = strategy.finalizers().to_vec();
            f.push(FINALIZER.into());
            set_finalizers(&api, &strategy, f).await?;
            continue;
        }

        let old = strategy.status.clone().unwrap_or_default();
        // Logs are only read for a hook whose end is about to be recorded.
        let want_logs: Vec<String> = old
            .hooks
            .iter()
            .filter(|h| matches!(h.phase, HookPhase::Pending | HookPhase::Running))
            .filter_map(|h| h.job_name.clone())
            .collect();
        let observed = observe::observe(
            client,
            &ns,
            &name,
            &strategy.spec.target_ref.name,
            &want_logs,
        )
        .await
        .map_err(Error::Observe)?;
        let annotations = strategy.annotations();
        let governed = governed_by(
            &st.strategies,
            &ns,
            &strategy.spec.target_ref.name,
            &seniority(&strategy.metadata),
        );
        let decision = machine::decide(&Input {
            name: &name,
            generation: strategy.metadata.generation,
            spec: &strategy.spec,
            status: &old,
            approve: annotations.get(APPROVE_ANNOTATION).map(String::as_str),
            retry: annotations.get(RETRY_ANNOTATION).map(String::as_str),
            deployment: observed.deployment.as_ref(),
            jobs: &observed.jobs,
            now: jiff::Timestamp::now(),
            governed_by: governed.as_deref(),
            live_pods: &observed.live_pods,
            rejected: rejected.as_ref(),
            gate: st.gates.current().gate,
        });
        if !decision.changes(&old) {
            requeue = decision.requeue;
            for job in &decision.prune {
                write::delete_job(client, &ns, job).await?;
                tracing::info!(strategy = %name, namespace = %ns, job, "pruned a finished hook Job");
            }
            break;
        }
        let mut refused = None;
        for effect in &decision.effects {
            match perform(effect, &strategy, &observed, &decision, st).await {
                Ok(()) => {}
                // The first refusal is the machine's to record; the same one again is an error.
                Err(Error::Refused { code, message }) if rejected.is_none() => {
                    tracing::warn!(strategy = %name, namespace = %ns, ?effect, code, %message, "the API server refused a write");
                    refused = Some(Rejection {
                        effect: effect.clone(),
                        code,
                        message,
                    });
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if refused.is_some() {
            rejected = refused;
            continue;
        }
        status::write(&api, &name, &old, &decision.status).await?;
        if old.phase != decision.status.phase {
            tracing::info!(strategy = %name, namespace = %ns, phase = ?decision.status.phase, revision = ?decision.status.current_revision, message = ?decision.status.message, "phase");
        }
        status::count(&st.ctx.metrics, &old, &decision);
        status::publish(
            &st.recorder,
            &strategy,
            observed.deployment.as_ref(),
            &decision.events,
        )
        .await;
        if rejected.is_some() {
            break;
        }
    }
    match rejected {
        // Recorded in status and an Event; the Deployment is written again after a backoff.
        Some(r) if r.effect.writes_deployment() => Err(Error::Refused {
            code: r.code,
            message: r.message,
        }),
        _ => Ok(Action::requeue(requeue.unwrap_or(RESYNC).min(RESYNC))),
    }
}

async fn perform(
    effect: &Effect,
    strategy: &RolloutStrategy,
    observed: &observe::Observed,
    decision: &machine::Decision,
    st: &State,
) -> Result<(), Error> {
    let ns = strategy.namespace().unwrap_or_default();
    let client = &st.ctx.client;
    let target = &strategy.spec.target_ref.name;
    let metrics = &st.ctx.metrics;
    tracing::info!(strategy = %strategy.name_any(), namespace = %ns, ?effect, "write");
    let result = match effect {
        Effect::Pause => write::set_paused(client, &ns, target, true).await,
        // Only the Deployment as observed is unpaused: a template changed since (and paused by
        // the revision gate) must not be let go with it.
        Effect::Unpause => {
            let rv = observed
                .deployment
                .as_ref()
                .map(|d| d.resource_version.as_str());
            write::unpause(client, &ns, target, rv).await
        }
        Effect::Annotate(phase) => {
            write::annotate(client, &ns, target, &strategy.name_any(), *phase).await
        }
        Effect::Scale(n) => write::scale(client, &ns, target, *n).await,
        Effect::RestoreTemplate => {
            let (Some(dep), Some(template)) = (
                observed.deployment.as_ref(),
                decision.status.stable_template.as_ref(),
            ) else {
                return Ok(());
            };
            write::restore_template(client, &ns, target, &dep.resource_version, template).await
        }
        Effect::CreateJob {
            point,
            hook,
            revision,
            attempt,
        } => {
            let Some(dep) = observed
                .deployment
                .as_ref()
                .filter(|d| &d.revision == revision)
            else {
                return Err(Error::Conflict);
            };
            let Some(h) = strategy
                .spec
                .hooks()
                .find(|(_, h)| &h.name == hook)
                .map(|(_, h)| h)
            else {
                return Err(Error::BuildJob(format!("hook {hook} is not in the spec")));
            };
            let job = hooks::build_job(&hooks::JobInput {
                strategy,
                deployment: target,
                deployment_uid: &dep.uid,
                hook: h,
                point: *point,
                from_revision: decision.status.stable_revision.as_deref(),
                to_revision: revision,
                attempt: *attempt,
                template: &dep.template,
            })
            .map_err(|e| Error::BuildJob(e.to_string()))?;
            let created = write::create_job(client, &ns, &job).await?;
            metrics.count_write(
                CONTROLLER,
                "Job",
                if created { "created" } else { "adopted" },
            );
            tracing::info!(strategy = %strategy.name_any(), namespace = %ns, job = %job.name_any(), created, "hook Job");
            return Ok(());
        }
        Effect::DeleteJob(job) => {
            write::delete_job(client, &ns, job).await?;
            metrics.count_write(CONTROLLER, "Job", "deleted");
            return Ok(());
        }
        Effect::RemoveAnnotation(key) => {
            let api: Api<RolloutStrategy> = Api::namespaced(client.clone(), &ns);
            let value = strategy
                .annotations()
                .get(*key)
                .cloned()
                .unwrap_or_default();
            return write::remove_annotation(&api, &strategy.name_any(), key, &value).await;
        }
    };
    metrics.count_write(
        CONTROLLER,
        "Deployment",
        if result.is_ok() { "patched" } else { "error" },
    );
    result
}

/// On deletion: the Deployment gets back the replicas a Recreate mid hook set aside and is
/// unpaused, so the operator never leaves it paused behind it.
async fn release(
    st: &State,
    ns: &str,
    target: &str,
    mine: &Seniority,
    original_replicas: Option<i32>,
) -> Result<(), Error> {
    if governed_by(&st.strategies, ns, target, mine).is_some() {
        // Another strategy governs the Deployment: it is not ours to release.
        return Ok(());
    }
    let client = &st.ctx.client;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    if deployments
        .get_opt(target)
        .await
        .map_err(Error::Deployment)?
        .is_none()
    {
        return Ok(());
    }
    if let Some(orig) = original_replicas {
        write::scale(client, ns, target, orig).await?;
    }
    write::unpause(client, ns, target, None).await?;
    write::remove_deployment_annotations(client, ns, target).await?;
    st.ctx
        .metrics
        .count_write(CONTROLLER, "Deployment", "released");
    Ok(())
}
