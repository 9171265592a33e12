//! The RolloutStrategy controller: sequences the rollout of one plain Deployment with pre, mid
//! and post hooks, keeping the Deployment paused at rest and all progress in status.
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
pub mod hooks;
pub mod machine;
pub mod observe;
pub mod revision;
pub mod status;
pub mod write;

use super::{Context, ShutdownSignal};
use crate::api::rollout_strategy::{APPROVE_ANNOTATION, RETRY_ANNOTATION};
use crate::api::{HookPhase, RolloutStrategy};
use crate::k8s::{ROLLOUT_STRATEGY_MANAGER, finalizer};
use error::Error;
use futures::StreamExt;
use k8s_openapi::api::{apps::v1::Deployment, batch::v1::Job, core::v1::Pod};
use kube::{
    Api, ResourceExt,
    runtime::{
        Controller, WatchStreamExt,
        controller::Action,
        events::{Recorder, Reporter},
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use machine::{Effect, Input};
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
    recorder: Recorder,
    strategies: Store<RolloutStrategy>,
}

/// The oldest other strategy (by creation, then name) in the same namespace with the same
/// target as `strategy`, if it is older: that one governs the Deployment.
fn governed_by(store: &Store<RolloutStrategy>, strategy: &RolloutStrategy) -> Option<String> {
    let key = |s: &RolloutStrategy| (s.creation_timestamp().map(|t| t.0), s.name_any());
    store
        .state()
        .iter()
        .filter(|s| {
            s.namespace() == strategy.namespace()
                && s.name_any() != strategy.name_any()
                && s.spec.target_ref.name == strategy.spec.target_ref.name
        })
        .filter(|s| key(s) < key(strategy))
        .min_by_key(|s| key(s))
        .map(|s| s.name_any())
}

/// The strategies in `ns` whose target is Deployment `name`.
fn strategies_for(
    store: &Store<RolloutStrategy>,
    ns: Option<String>,
    name: &str,
) -> Vec<ObjectRef<RolloutStrategy>> {
    store
        .state()
        .iter()
        .filter(|s| s.namespace() == ns && s.spec.target_ref.name == name)
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

pub async fn run(ctx: Context, shutdown: ShutdownSignal) {
    let cfg = watcher::Config::default().any_semantic();
    let strategies = ctx.scoped_api::<RolloutStrategy>();
    let controller = Controller::new(strategies, cfg.clone());
    let store = controller.store();
    let (s1, s2, s3) = (store.clone(), store.clone(), store);
    let deployments = watcher(ctx.scoped_api::<Deployment>(), cfg.clone())
        .default_backoff()
        .touched_objects();
    let hook_pods = watcher(
        ctx.scoped_api::<Pod>(),
        cfg.clone().labels(hooks::LABEL_STRATEGY),
    )
    .default_backoff()
    .touched_objects();
    let reporter = Reporter {
        controller: ROLLOUT_STRATEGY_MANAGER.into(),
        instance: None,
    };
    let state = Arc::new(State {
        recorder: Recorder::new(ctx.client.clone(), reporter),
        shutdown: shutdown.clone(),
        ctx: ctx.clone(),
        strategies: s3,
    });
    controller
        .owns(
            ctx.scoped_api::<Job>(),
            cfg.clone().labels(hooks::LABEL_STRATEGY),
        )
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

async fn reconcile(obj: Arc<RolloutStrategy>, st: Arc<State>) -> Result<Action, Error> {
    let start = std::time::Instant::now();
    let result = sync(&obj, &st).await;
    st.ctx
        .metrics
        .count_reconcile(CONTROLLER, start.elapsed().as_secs_f64());
    result
}

fn error_policy(obj: Arc<RolloutStrategy>, err: &Error, st: Arc<State>) -> Action {
    st.ctx.metrics.count_error(CONTROLLER, err.reason());
    tracing::warn!(strategy = %obj.name_any(), namespace = ?obj.namespace(), error = %err, reason = err.reason(), "reconcile failed");
    match err {
        Error::Conflict => Action::requeue(Duration::from_millis(500)),
        _ => Action::requeue(Duration::from_secs(5)),
    }
}

async fn set_finalizers(
    api: &Api<RolloutStrategy>,
    obj: &RolloutStrategy,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    finalizer::set(api, obj, finalizers)
        .await
        .map_err(|e| match e {
            finalizer::Error::Stale => Error::Conflict,
            finalizer::Error::Api(e) => Error::Finalizer(e),
        })
}

async fn sync(obj: &RolloutStrategy, st: &State) -> Result<Action, Error> {
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
    // Until a round changes nothing, look again soon.
    let mut requeue = Some(Duration::from_secs(1));
    for _ in 0..MAX_STEPS {
        // Fresh every round: the cache may not have caught up with our own status writes.
        let Some(strategy) = api.get_opt(&name).await.map_err(Error::Read)? else {
            return Ok(Action::await_change());
        };
        let has_finalizer = strategy.finalizers().iter().any(|f| f == FINALIZER);
        if strategy.metadata.deletion_timestamp.is_some() {
            if has_finalizer {
                release(&strategy, st).await?;
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
        let governed = governed_by(&st.strategies, &strategy);
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
        });
        if !decision.changes(&old) {
            requeue = decision.requeue;
            for job in &decision.prune {
                write::delete_job(client, &ns, job).await?;
                tracing::info!(strategy = %name, namespace = %ns, job, "pruned a finished hook Job");
            }
            break;
        }
        for effect in &decision.effects {
            perform(effect, &strategy, &observed, &decision, st).await?;
        }
        status::write(&api, &name, &old, &decision.status).await?;
        if old.phase != decision.status.phase {
            tracing::info!(strategy = %name, namespace = %ns, phase = ?decision.status.phase, revision = ?decision.status.current_revision, message = ?decision.status.message, "phase");
        }
        status::count(&st.ctx.metrics, &old, &decision);
        status::publish(&st.recorder, &strategy, &decision.events).await;
    }
    Ok(Action::requeue(requeue.unwrap_or(RESYNC).min(RESYNC)))
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
        Effect::Unpause => write::set_paused(client, &ns, target, false).await,
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
async fn release(strategy: &RolloutStrategy, st: &State) -> Result<(), Error> {
    if governed_by(&st.strategies, strategy).is_some() {
        // Another strategy governs the Deployment: it is not ours to release.
        return Ok(());
    }
    let ns = strategy.namespace().unwrap_or_default();
    let client = &st.ctx.client;
    let target = &strategy.spec.target_ref.name;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    if deployments
        .get_opt(target)
        .await
        .map_err(Error::Deployment)?
        .is_none()
    {
        return Ok(());
    }
    if let Some(orig) = strategy.status.as_ref().and_then(|s| s.original_replicas) {
        write::scale(client, &ns, target, orig).await?;
    }
    write::set_paused(client, &ns, target, false).await?;
    st.ctx
        .metrics
        .count_write(CONTROLLER, "Deployment", "released");
    Ok(())
}
