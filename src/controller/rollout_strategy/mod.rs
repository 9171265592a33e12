//! The RolloutStrategy controller: sequences the rollout of one plain Deployment with pre, mid
//! and post hooks, all progress in status. How the Deployment is held while hooks run is the
//! [`gate`]: paused by the revision gate (admission) for a new revision only, or, where that
//! is not available, kept paused at rest.
//!
//! Steps, one module each:
//! - read: [`observe`] — watch caches of the strategies, Deployments, ReplicaSets, hook Jobs
//!   and hook pods (`run`), reduced to views; log tails;
//! - decide: [`machine`] (with [`revision`] and [`hooks`]) — pure;
//! - write: [`write`] — pause/unpause, scale, rollback, Jobs; the only place that writes;
//! - status: [`status`] — the status, Events and metrics of each transition.
//!
//! A reconcile decides once, on the caches, and takes at most one step: when that decision
//! changes nothing (the steady state) it returns without a single request; otherwise it reads
//! the strategy afresh (the cache may not show our own last status write yet), decides again on
//! that, performs the decision, records it and returns. The watches wake it for the next step
//! (the strategy, its Deployment and ReplicaSets, its Jobs, its hook pods), as does a timer of
//! the machine (a timeout, a backoff, a deadline). See [`sync`] for why the other cached views
//! are safe to act on.

pub mod cache;
pub mod error;
pub mod gate;
pub mod hooks;
pub mod machine;
pub mod observe;
pub mod revision;
pub mod status;
pub mod write;

use super::{
    Context, ShutdownSignal,
    reconcile::{Outcomes, key},
};
use crate::api::rollout_strategy::{ABORT_ANNOTATION, APPROVE_ANNOTATION, RETRY_ANNOTATION};
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
    },
};
use machine::{Effect, Input, Rejection};
use std::{sync::Arc, time::Duration};

pub const CONTROLLER: &str = "rollout-strategy";
/// Keeps a strategy until its Deployment is unpaused (the operator never leaves a Deployment
/// paused behind it).
pub const FINALIZER: &str = "ballast.dev/rollout-strategy";
/// Even with nothing to wait for, look again this often.
const RESYNC: Duration = Duration::from_secs(300);
/// After a step, look again this soon at the latest: the watch event of our own write normally
/// wakes the strategy long before, and when it comes late, this keeps the rollout going.
const AFTER_STEP: Duration = Duration::from_secs(1);

/// What every reconcile of this controller shares.
pub struct State {
    ctx: Context,
    /// Ends waits that the shutdown would otherwise sit out.
    shutdown: ShutdownSignal,
    recorder: super::events::Publisher,
    strategies: Store<Lenient<RolloutStrategy>>,
    caches: observe::Caches,
    outcomes: Outcomes,
    /// How governed Deployments are held ([`gate`]).
    gates: gate::Gates,
    /// Whether the strategies' cache and [`observe::Caches`] are filled.
    ready: super::CachesReady,
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

/// The Deployment that controls ReplicaSet `rs`.
fn owner_deployment(rs: &cache::CachedReplicaSet) -> Option<String> {
    rs.owner_references()
        .iter()
        .find(|o| o.kind == "Deployment" && o.controller == Some(true))
        .map(|o| o.name.clone())
}

pub async fn run(ctx: Context, gates: gate::Gates, shutdown: ShutdownSignal) {
    let cfg = super::watch_config();
    let health = &ctx.health;
    let mut ready = super::CachesReady::new();
    let (store, writer) = reflector::store();
    let strategies = super::watch(
        ctx.scoped_api::<Lenient<RolloutStrategy>>(),
        cfg.clone(),
        health.clone(),
        "rollout-strategy/rolloutstrategies",
    )
    .reflect(writer)
    .inspect(ready.filled("rolloutstrategies").on_init_done())
    .touched_objects();
    let controller = Controller::for_stream(strategies, store.clone());
    let (s1, s2, s3, s4) = (store.clone(), store.clone(), store.clone(), store);
    let (deployment_store, writer) = reflector::store();
    let deployments = super::watch(
        ctx.scoped_api::<cache::CachedDeployment>(),
        cfg.clone(),
        health.clone(),
        "rollout-strategy/deployments",
    )
    .modify(cache::CachedDeployment::trim)
    .reflect(writer)
    .inspect(ready.filled("deployments").on_init_done())
    .touched_objects();
    let (replica_set_store, writer) = reflector::store();
    let replica_sets = super::watch(
        ctx.scoped_api::<cache::CachedReplicaSet>(),
        cfg.clone(),
        health.clone(),
        "rollout-strategy/replicasets",
    )
    .modify(cache::CachedReplicaSet::trim)
    .reflect(writer)
    .inspect(ready.filled("replicasets").on_init_done())
    .touched_objects();
    let (pod_store, writer) = reflector::store();
    let hook_pods = super::watch(
        ctx.scoped_api::<Pod>(),
        cfg.clone().labels(hooks::LABEL_STRATEGY),
        health.clone(),
        "rollout-strategy/pods",
    )
    .modify(|p| observe::trim(&mut p.metadata))
    .reflect(writer)
    .inspect(ready.filled("pods").on_init_done())
    .touched_objects();
    let (job_store, writer) = reflector::store();
    let jobs = super::watch(
        ctx.scoped_api::<Job>(),
        cfg.clone().labels(hooks::LABEL_STRATEGY),
        health.clone(),
        "rollout-strategy/jobs",
    )
    .modify(|j| observe::trim(&mut j.metadata))
    .reflect(writer)
    .inspect(ready.filled("jobs").on_init_done())
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
        caches: observe::Caches {
            deployments: deployment_store,
            replica_sets: replica_set_store,
            jobs: job_store,
            pods: pod_store,
        },
        outcomes: Outcomes::new(CONTROLLER, ctx.metrics.clone()),
        gates: gates.clone(),
        ready,
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
        .watches_stream(deployments, move |d: cache::CachedDeployment| {
            strategies_for(&s1, d.namespace(), &d.name_any())
        })
        // Where a rollout stands (mid points, completion) is in the ReplicaSets.
        .watches_stream(
            replica_sets,
            move |r: cache::CachedReplicaSet| match owner_deployment(&r) {
                Some(d) => strategies_for(&s4, r.namespace(), &d),
                None => vec![],
            },
        )
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

async fn reconcile(obj: Arc<Lenient<RolloutStrategy>>, st: Arc<State>) -> Result<Action, Error> {
    st.outcomes.run(&key(obj.as_ref()), sync(&obj, &st)).await
}

fn error_policy(obj: Arc<Lenient<RolloutStrategy>>, err: &Error, st: Arc<State>) -> Action {
    st.outcomes.on_error(&key(obj.as_ref()), err)
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

/// One reconcile: one decision, at most one step.
///
/// The decision is made on the caches first. When it changes nothing, that is the answer, and
/// it cost no request. When it would change something, the cached strategy may be what
/// misleads it: its status can lag our own last status write, and deciding on that could
/// repeat a step (create a Job twice, count an attempt twice). So the strategy is read afresh
/// (one request) and the decision made again on it, and that decision is the one performed.
///
/// The other views still come from the caches. They can lag our own writes too, but acting on
/// them is safe, effect by effect ([`Effect`]):
/// - `Pause`: server-side apply of the one field `spec.paused`; repeated, it writes the same
///   value again.
/// - `Unpause`: the same, with the cached `resourceVersion` as a precondition; on a stale one
///   the API server refuses it (a conflict) and it is decided again.
/// - `Annotate`: a merge patch of the Deployment's annotation and labels to fixed values;
///   repeated, the same.
/// - `MarkTarget`: a merge patch of the strategy's label; when it says "covered" because the
///   cache shows no Deployment, the absence is read afresh first.
/// - `Scale(n)`: sets `spec.replicas` to `n`, an absolute value; repeated, the same. The count
///   to restore after Recreate mid hooks is in status (read afresh); a lagging cache shows an
///   older count, which is that one or our own 0, so it is never taken for a user's scale.
/// - `RestoreTemplate`: a JSON patch that tests the `resourceVersion` of the cached Deployment;
///   on a stale one the API server refuses it (a conflict) and it is decided again.
/// - `CreateJob`: the Job's name is fixed by strategy, hook, revision and attempt, and one that
///   exists already is adopted, never duplicated; it is built from the cached template of the
///   same revision, which is the same template.
/// - `DeleteJob`: a Job already gone (404) is fine.
/// - `RemoveAnnotation`: on the strategy, tested against the fresh value.
///
/// One conclusion of the machine is drawn from an absence and would not be safe on a lagging
/// Job cache: a hook whose Job status names but no cache shows is recorded as failed ("deleted
/// before it finished"). Before deciding afresh, such a Job is looked up (one LIST by name);
/// when it exists, the cache is behind and the reconcile waits for it. A lagging pod cache can
/// only show a pod that is gone as still there, which holds the next attempt back a moment
/// longer; a lagging ReplicaSet cache only delays a mid point or the completion, as a late
/// watch event would.
async fn sync(obj: &Lenient<RolloutStrategy>, st: &State) -> Result<Action, Error> {
    // Decisions are made on the caches: never on one not filled yet (an empty cache would say
    // "Deployment not found"). Not `Store::wait_until_ready`, which wakes one waiter of many
    // (see `CachesReady`).
    if !super::caches_ready(st.ready.wait(), &st.shutdown, Duration::from_secs(30)).await {
        return Err(Error::CacheNotReady(st.ready.unfilled().join(", ")));
    }
    // The newest cached copy: the one this reconcile was scheduled with may be older.
    let ns = obj.namespace().unwrap_or_default();
    let Some(cached) = st.strategies.get(&ObjectRef::from_obj(obj)) else {
        // Deleted (a relist swaps the store whole, so absent means gone).
        st.ctx.metrics.set_rollout_phase(&ns, &obj.name_any(), None);
        return Ok(Action::await_change());
    };
    // The phase gauge follows the cache, so a new leader reports every strategy at once.
    let phase = match cached.as_ref() {
        Lenient::Ok(s) if cached.meta().deletion_timestamp.is_none() => Some(machine::phase_name(
            s.status.as_ref().and_then(|s| s.phase).unwrap_or_default(),
        )),
        _ => None,
    };
    st.ctx
        .metrics
        .set_rollout_phase(&ns, &obj.name_any(), phase);
    match cached.as_ref() {
        Lenient::Ok(strategy) => match settled(strategy, st) {
            Some(action) => Ok(action),
            None => {
                step(
                    st,
                    &strategy.namespace().unwrap_or_default(),
                    &obj.name_any(),
                )
                .await
            }
        },
        // It writes only when its conditions are not there yet.
        Lenient::Invalid(inv) if cached.meta().deletion_timestamp.is_none() => {
            sync_invalid(&cached, inv, st).await
        }
        // Released with what it recorded last: read afresh.
        Lenient::Invalid(_) => {
            step(st, &cached.namespace().unwrap_or_default(), &obj.name_any()).await
        }
    }
}

/// The machine's decision for `strategy` on the cached views.
fn decide(
    strategy: &RolloutStrategy,
    observed: &observe::Observed,
    rejected: Option<&Rejection>,
    st: &State,
) -> machine::Decision {
    let ns = strategy.namespace().unwrap_or_default();
    let status = strategy.status.clone().unwrap_or_default();
    let annotations = strategy.annotations();
    let governed = governed_by(
        &st.strategies,
        &ns,
        &strategy.spec.target_ref.name,
        &seniority(&strategy.metadata),
    );
    machine::decide(&Input {
        name: &strategy.name_any(),
        generation: strategy.metadata.generation,
        spec: &strategy.spec,
        status: &status,
        approve: annotations.get(APPROVE_ANNOTATION).map(String::as_str),
        retry: annotations.get(RETRY_ANNOTATION).map(String::as_str),
        abort: annotations.get(ABORT_ANNOTATION).map(String::as_str),
        deployment: observed.deployment.as_ref(),
        jobs: &observed.jobs,
        now: jiff::Timestamp::now(),
        governed_by: governed.as_deref(),
        live_pods: &observed.live_pods,
        rejected,
        gate: st.gates.current().gate,
        target_marked: strategy.labels().contains_key(gate::TARGET_GOVERNED_LABEL),
    })
}

/// `Some` when the cached strategy needs nothing done (no write, no prune): the steady state,
/// answered without a request. `None` when there is something to do.
fn settled(strategy: &RolloutStrategy, st: &State) -> Option<Action> {
    let has_finalizer = strategy.finalizers().iter().any(|f| f == FINALIZER);
    if strategy.metadata.deletion_timestamp.is_some() {
        return (!has_finalizer).then(Action::await_change);
    }
    if !has_finalizer {
        return None;
    }
    let ns = strategy.namespace().unwrap_or_default();
    let observed = st
        .caches
        .observe(&ns, &strategy.name_any(), &strategy.spec.target_ref.name);
    let decision = decide(strategy, &observed, None, st);
    let old = strategy.status.clone().unwrap_or_default();
    (!decision.changes(&old) && decision.prune.is_empty())
        .then(|| Action::requeue(decision.requeue.unwrap_or(RESYNC).min(RESYNC)))
}

/// Reads strategy `name` afresh and takes its next step.
async fn step(st: &State, ns: &str, name: &str) -> Result<Action, Error> {
    let client = &st.ctx.client;
    let api: Api<RolloutStrategy> = Api::namespaced(client.clone(), ns);
    let lenient: Api<Lenient<RolloutStrategy>> = Api::namespaced(client.clone(), ns);
    let mut strategy = match lenient.get_opt(name).await.map_err(Error::Read)? {
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
                ns,
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
        set_finalizers(&api, &strategy, f.clone()).await?;
        // Not a step of the rollout: the first one follows on what was just read, which the
        // patch changed only here.
        strategy.metadata.finalizers = Some(f);
    }

    let old = strategy.status.clone().unwrap_or_default();
    let mut observed = st.caches.observe(ns, name, &strategy.spec.target_ref.name);
    if observe::needs_fresh_target(&old, &observed) {
        observed.deployment = observe::read_target(client, ns, &strategy.spec.target_ref.name)
            .await
            .map_err(Error::Observe)?;
    }
    let unseen = observe::unseen_jobs(&old, &observed);
    if !unseen.is_empty()
        && observe::any_job_exists(client, ns, &unseen)
            .await
            .map_err(Error::Observe)?
    {
        tracing::debug!(strategy = %name, namespace = %ns, jobs = ?unseen, "the Job cache has not caught up with our own Jobs yet");
        return Ok(Action::requeue(AFTER_STEP));
    }
    // Logs are only read for a hook whose end is about to be recorded.
    let want_logs: Vec<String> = old
        .hooks
        .iter()
        .filter(|h| matches!(h.phase, HookPhase::Pending | HookPhase::Running))
        .filter_map(|h| h.job_name.clone())
        .collect();
    observe::read_log_tails(client, ns, &mut observed, &want_logs).await;
    // A write the API server refused: the machine decides once more knowing it (a refusal is
    // not a step), and a refused Deployment write ends the reconcile in backoff. At most two
    // rounds: the second either changes nothing, is recorded, or fails.
    let mut rejected: Option<Rejection> = None;
    loop {
        let decision = decide(&strategy, &observed, rejected.as_ref(), st);
        if !decision.changes(&old) {
            for job in &decision.prune {
                write::delete_job(client, ns, job).await?;
                tracing::info!(strategy = %name, namespace = %ns, job, "pruned a finished hook Job");
            }
            return Ok(Action::requeue(
                decision.requeue.unwrap_or(RESYNC).min(RESYNC),
            ));
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
        status::write(&api, name, &old, &decision.status).await?;
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
        return match rejected {
            // Recorded in status and an Event; the Deployment is written again after a backoff.
            Some(r) if r.effect.writes_deployment() => Err(Error::Refused {
                code: r.code,
                message: r.message,
            }),
            _ => Ok(Action::requeue(
                decision.requeue.map_or(AFTER_STEP, |r| r.min(AFTER_STEP)),
            )),
        };
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
        Effect::MarkTarget(covered) => {
            // "Covered" because the cache shows no Deployment: only a fresh read may say so
            // (one created a moment before the strategy, which the cache has not seen yet,
            // would be left without the gate). One created after this read is a create,
            // which the gate covers whatever the mark says.
            if *covered && observed.deployment.is_none() {
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
            return write::mark_target(client, &ns, &strategy.name_any(), *covered).await;
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
    // Read afresh, not from the cache: a Deployment created a moment ago (paused by the
    // revision gate) must not stay paused because the cache has not seen it yet. A deletion
    // is rare; this is its one read.
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
    write::remove_deployment_metadata(client, ns, target).await?;
    st.ctx
        .metrics
        .count_write(CONTROLLER, "Deployment", "released");
    Ok(())
}
