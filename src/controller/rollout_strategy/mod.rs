//! The RolloutStrategy controller: sequences the rollout of one plain Deployment with pre, mid
//! and post hooks, all progress in status. How the Deployment is held while hooks run is the
//! [`gate`]: paused by the revision gate (admission) for a new revision only, or, where that
//! is not available, kept paused at rest.
//!
//! Steps, one module each:
//! - read: [`observe`] — watch caches of the strategies, Deployments, ReplicaSets (an index of
//!   their own, [`replica_sets`]), hook Jobs and hook pods (`run`), reduced to views; log tails;
//! - decide: [`machine`] (with [`revision`] and [`hooks`]) — pure;
//! - write: [`write`] — pause/unpause, scale, rollback, Jobs; the only place that writes;
//! - status: [`status`] — the status, Events and metrics of each transition.
//!
//! `step` takes one step through them all; `invalid` answers for a stored strategy this version
//! cannot read (reported on itself; on deletion its Deployment is still released).
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
pub mod expect;
pub mod gate;
pub mod hooks;
mod invalid;
pub mod machine;
pub mod observe;
pub mod replica_sets;
pub mod revision;
pub mod status;
mod step;
pub mod webhook;
pub mod write;

use super::{
    Context, ShutdownSignal,
    reconcile::{Outcomes, Turns, key},
};
use crate::api::RolloutStrategy;
use crate::api::rollout_strategy::{ABORT_ANNOTATION, APPROVE_ANNOTATION, RETRY_ANNOTATION};
use crate::k8s::lenient::Lenient;
use crate::k8s::{ROLLOUT_STRATEGY_MANAGER, finalizer};
use error::Error;
use futures::{StreamExt, TryStreamExt};
use invalid::sync_invalid;
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
use machine::{Input, Rejection};
use std::{sync::Arc, time::Duration};
use step::step;

pub const CONTROLLER: &str = "rollout-strategy";
/// Keeps a strategy until its Deployment is unpaused (the operator never leaves a Deployment
/// paused behind it).
pub const FINALIZER: &str = "ballast.dev/rollout-strategy";
/// Even with nothing to wait for, look again this often.
const RESYNC: Duration = Duration::from_secs(300);
/// After a step, look again this soon at the latest: the watch event of our own write normally
/// wakes the strategy long before, and when it comes late, this keeps the rollout going.
const AFTER_STEP: Duration = Duration::from_secs(1);
/// How soon a strategy is looked at again when a cache does not show our own last write yet
/// ([`expect`]): that write's watch event normally wakes it before.
const NOT_YET: Duration = Duration::from_millis(250);
/// Reconciles that write, at most at once ([`Turns`]): each is a few requests one after the
/// other, so this many keep the API server busy without queueing behind one another; the
/// reconciles that find nothing to do (most of them) need no turn.
const WRITING_AT_ONCE: usize = 16;
/// Rounds of a plan in one reconcile: a plan that stops before a write needing its status
/// recorded first goes on once that status is written (machine::plan).
const ROUNDS: usize = 3;

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
    /// What our own writes lead us to expect of the caches ([`expect`]).
    expect: expect::Expectations,
    /// When each status was last written, to follow the Deployment at a bounded pace.
    pace: status::Pace,
    /// When each strategy whose Deployment the cache does not show last looked for it.
    looks: observe::Looks,
    /// Reconciles that write take turns, first come first served.
    turns: Turns,
    /// Whether the strategies' cache and [`observe::Caches`] are filled.
    ready: super::CachesReady,
    /// Webhook hooks' calls ([`webhook`]).
    calls: write::Calls,
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
    let cfg = super::watch_config();
    let mut ready = super::CachesReady::new();
    let (store, writer) = reflector::store();
    let strategies = super::watch(
        ctx.scoped_api::<Lenient<RolloutStrategy>>(),
        cfg.clone(),
        &ctx,
        "rollout-strategy/rolloutstrategies",
    )
    .reflect(writer)
    .inspect(ready.filled("rolloutstrategies").on_init_done())
    .touched_objects();
    let controller = Controller::for_stream(strategies, store.clone());
    let (s1, s2, s3, s4) = (store.clone(), store.clone(), store.clone(), store);
    let (deployment_store, writer) = reflector::store();
    // Only the Deployments labelled governed: the writes to all the others (a SpreadPolicy's
    // fan-out over thousands of them, say) never reach this controller. One not labelled yet
    // is read afresh when a step needs it (`observe::needs_fresh_target`, `observe::Looks`).
    let deployments = super::watch(
        ctx.scoped_api::<cache::CachedDeployment>(),
        cfg.clone().labels(gate::GOVERNED_LABEL),
        &ctx,
        "rollout-strategy/deployments",
    )
    .modify(cache::CachedDeployment::trim)
    .reflect(writer)
    .inspect(ready.filled("deployments").on_init_done())
    .touched_objects();
    let replica_set_index = Arc::new(replica_sets::ReplicaSets::default());
    let index = replica_set_index.clone();
    let replica_sets = super::watch(
        ctx.scoped_api::<cache::CachedReplicaSet>(),
        cfg.clone(),
        &ctx,
        "rollout-strategy/replicasets",
    )
    .inspect_ok(move |ev| index.apply(ev))
    .inspect(ready.filled("replicasets").on_init_done())
    .touched_objects();
    let (pod_store, writer) = reflector::store();
    let hook_pods = super::watch(
        ctx.scoped_api::<Pod>(),
        cfg.clone().labels(hooks::LABEL_STRATEGY),
        &ctx,
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
        &ctx,
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
    let (wake, woken) = tokio::sync::mpsc::unbounded_channel();
    let state = Arc::new(State {
        recorder: super::events::Publisher::new(ctx.client.clone(), reporter),
        shutdown: shutdown.clone(),
        ctx: ctx.clone(),
        strategies: s3,
        caches: observe::Caches {
            deployments: deployment_store,
            replica_sets: replica_set_index,
            jobs: job_store,
            pods: pod_store,
        },
        outcomes: Outcomes::new(CONTROLLER, ctx.metrics.clone()),
        gates: gates.clone(),
        expect: expect::Expectations::default(),
        pace: status::Pace::default(),
        looks: observe::Looks::default(),
        turns: Turns::new(WRITING_AT_ONCE),
        ready,
        calls: write::Calls {
            caller: webhook::Caller::default(),
            allowed: ctx.webhook_allowed_hosts.clone(),
            wake,
        },
    });
    // An answered webhook call wakes its strategy.
    let answered = futures::stream::unfold(woken, |mut rx| async move {
        rx.recv().await.map(|obj| (obj, rx))
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
        .reconcile_on(answered)
        .owns_stream(jobs)
        .watches_stream(deployments, move |d: cache::CachedDeployment| {
            strategies_for(&s1, d.namespace(), &d.name_any())
        })
        // Where a rollout stands (mid points, completion) is in the ReplicaSets.
        .watches_stream(replica_sets, move |r: cache::CachedReplicaSet| {
            match r.controlling_deployment() {
                Some(d) => strategies_for(&s4, r.namespace(), &d.name),
                None => vec![],
            }
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
        // No limit here: kube-runtime's is not fair (see `Turns`), ours is, in `sync`.
        .with_config(kube::runtime::controller::Config::default().concurrency(0))
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

/// One reconcile: one plan of the machine, decided on the caches, performed.
///
/// The plan is made on the caches first. When it changes nothing (the steady state, and most
/// of the wake-ups while a Deployment rolls out), that is the answer, and it cost no request.
/// When it would change something, the reconcile waits for its turn ([`Turns`]) and plans again
/// on the caches as they are then, provided they show our own last writes ([`expect`]): the
/// status we wrote a moment ago, the Deployment we paused or unpaused, the Job we created.
/// Deciding on a copy without our own last status could repeat a step (create a Job twice,
/// count an attempt twice). When they do not show them yet, the reconcile ends and the watch
/// event of that write wakes the strategy again. The first step after the manager started reads
/// the strategy afresh instead (one request), and so does one whose cache has not caught up in
/// time. The status is written with the resourceVersion of the copy decided on as a
/// precondition, so a status decided on an older copy never replaces a newer one.
///
/// Acting on the cached views of others' changes is safe, effect by effect
/// ([`Effect`](machine::Effect)):
/// - `Pause`: server-side apply of `spec.paused` (with the Deployment's phase label, governed
///   label and strategy annotation); repeated, it writes the same values again.
/// - `Unpause`: the same, with the cached `resourceVersion` as a precondition; on a stale one
///   the API server refuses it (a conflict) and it is decided again.
/// - `Annotate`: a merge patch of the Deployment's annotation and labels to fixed values;
///   repeated, the same.
/// - `MarkTarget`: a merge patch of the strategy's label; when it says "covered" because the
///   cache shows no Deployment, the absence is read afresh first.
/// - `Scale(n)`: sets `spec.replicas` to `n`, an absolute value; repeated, the same. The count
///   to restore after Recreate mid hooks is in status (which shows our last write); a lagging
///   Deployment cache shows an older count, which is that one or our own 0, so it is never
///   taken for a user's scale.
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
/// before it finished"). Our own Jobs are expected in the cache before a decision; one status
/// names that the cache still lacks after that (say, after a restart) is looked up (one LIST by
/// name); when it exists, the cache is behind and the reconcile waits for it. A lagging pod
/// cache can only show a pod that is gone as still there, which holds the next attempt back a
/// moment longer; a lagging ReplicaSet cache only delays a mid point or the completion, as a
/// late watch event would.
async fn sync(obj: &Lenient<RolloutStrategy>, st: &State) -> Result<Action, Error> {
    // Decisions are made on the caches: never on one not filled yet (an empty cache would say
    // "Deployment not found"). Not `Store::wait_until_ready`, which wakes one waiter of many
    // (see `CachesReady`).
    if !super::caches_ready(st.ready.wait(), &st.shutdown, Duration::from_secs(30)).await {
        return Err(Error::CacheNotReady(st.ready.unfilled().join(", ")));
    }
    // The newest cached copy: the one this reconcile was scheduled with may be older.
    let ns = obj.namespace().unwrap_or_default();
    let name = obj.name_any();
    let Some(cached) = st.strategies.get(&ObjectRef::from_obj(obj)) else {
        // Deleted (a relist swaps the store whole, so absent means gone).
        st.ctx.metrics.set_rollout_phase(&ns, &name, None);
        st.expect
            .forget(&expect::Key::Strategy(ns.clone(), name.clone()));
        st.pace.forget(&key(obj));
        st.looks.forget(&key(obj));
        return Ok(Action::await_change());
    };
    // The phase gauge follows the cache, so a new leader reports every strategy at once.
    let phase = match cached.as_ref() {
        Lenient::Ok(s) if cached.meta().deletion_timestamp.is_none() => Some(machine::phase_name(
            s.status.as_ref().and_then(|s| s.phase).unwrap_or_default(),
        )),
        _ => None,
    };
    st.ctx.metrics.set_rollout_phase(&ns, &name, phase);
    match cached.as_ref() {
        Lenient::Ok(strategy) => match settled(strategy, st) {
            Some(action) => Ok(action),
            None => {
                let _turn = st.turns.take().await;
                step(st, &ns, &name).await
            }
        },
        // It writes only when its conditions are not there yet.
        Lenient::Invalid(inv) if cached.meta().deletion_timestamp.is_none() => {
            sync_invalid(&cached, inv, st).await
        }
        // Released with what it recorded last: read afresh.
        Lenient::Invalid(_) => {
            let _turn = st.turns.take().await;
            step(st, &ns, &name).await
        }
    }
}

/// The machine's plan for `strategy` on the cached views.
fn plan(
    strategy: &RolloutStrategy,
    observed: &observe::Observed,
    rejected: Option<&Rejection>,
    st: &State,
) -> machine::Plan {
    let ns = strategy.namespace().unwrap_or_default();
    let status = strategy.status.clone().unwrap_or_default();
    let annotations = strategy.annotations();
    let governed = governed_by(
        &st.strategies,
        &ns,
        &strategy.spec.target_ref.name,
        &seniority(&strategy.metadata),
    );
    let webhooks = machine::Webhooks {
        namespace: ns.clone(),
        uid: strategy.uid().unwrap_or_default(),
        allowed: st.calls.allowed.clone(),
        calls: status
            .hooks
            .iter()
            .filter_map(|h| h.idempotency_key.as_ref())
            .map(|k| (k.clone(), st.calls.caller.state(k)))
            .collect(),
    };
    machine::plan(&Input {
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
        target_shard_labelled: strategy.labels().get(gate::SHARD_LABEL)
            == Some(&gate::shard_of(&strategy.spec.target_ref.name)),
        webhooks: &webhooks,
    })
}

/// `Some` when the cached strategy needs nothing done (no write, no prune), or only its
/// status to follow the Deployment before that is due ([`status::Pace`]): answered without a
/// request. `None` when there is something to do.
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
    let decision = plan(strategy, &observed, None, st).decision;
    let old = strategy.status.clone().unwrap_or_default();
    if decision.steps(&old) || !decision.prune.is_empty() {
        return None;
    }
    let mut again = decision.requeue.unwrap_or(RESYNC).min(RESYNC);
    if decision.changes(&old) {
        // Only the fields that follow the Deployment moved: written at the pace's next slot.
        let wait = st.pace.wait(&key(strategy));
        if wait.is_zero() {
            return None;
        }
        again = again.min(wait);
    }
    if observed.deployment.is_none() {
        // Not in the cache, which shows only Deployments labelled governed: looked for afresh
        // now and then (`observe::Looks`).
        let wait = st.looks.wait(&key(strategy), st.gates.current().gate);
        if wait.is_zero() {
            return None;
        }
        again = again.min(wait);
    }
    Some(Action::requeue(again))
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
    write::unpause(client, ns, target, None, None).await?;
    write::remove_deployment_metadata(client, ns, target).await?;
    st.ctx
        .metrics
        .count_write(CONTROLLER, "Deployment", "released");
    Ok(())
}
