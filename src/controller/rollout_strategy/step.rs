//! One step of a strategy ([`step`]): the strategy read (from the cache when it shows our own
//! last writes, else afresh), the views of its world, the machine's plan, its writes and its
//! status.

use super::invalid::sync_invalid;
use super::machine::{self, Effect, Rejection};
use super::{
    AFTER_STEP, FINALIZER, NOT_YET, RESYNC, ROUNDS, State, error::Error, expect, gate, observe,
    plan, release, seniority, set_finalizers, status, webhook, write,
};
use crate::api::{HookPhase, RolloutStrategy};
use crate::k8s::finalizer;
use crate::k8s::lenient::Lenient;
use kube::{
    Api, ResourceExt,
    runtime::{controller::Action, reflector::ObjectRef},
};

/// Reads strategy `name`, from the cache when it shows our own last writes (else afresh), and
/// takes its next step.
pub(super) async fn step(st: &State, ns: &str, name: &str) -> Result<Action, Error> {
    let client = &st.ctx.client;
    let api: Api<RolloutStrategy> = Api::namespaced(client.clone(), ns);
    let lenient: Api<Lenient<RolloutStrategy>> = Api::namespaced(client.clone(), ns);
    let own = expect::Key::Strategy(ns.to_string(), name.to_string());
    let cached = st
        .strategies
        .get(&ObjectRef::new(name).within(ns))
        .and_then(|c| match c.as_ref() {
            Lenient::Ok(s) => Some(s.clone()),
            Lenient::Invalid(_) => None,
        });
    let seen = cached.as_ref().map(|s| {
        st.expect
            .seen(&own, s.metadata.resource_version.as_deref(), false)
    });
    let mut strategy = match (cached, seen) {
        (Some(s), Some(expect::Seen::Yes)) => s,
        (Some(_), Some(expect::Seen::NotYet)) => return Ok(Action::requeue(NOT_YET)),
        _ => match lenient.get_opt(name).await.map_err(Error::Read)? {
            None => return Ok(Action::await_change()),
            Some(Lenient::Ok(s)) => {
                st.expect
                    .wrote(own.clone(), s.metadata.resource_version.as_deref());
                s
            }
            Some(l @ Lenient::Invalid(_)) => {
                let Lenient::Invalid(inv) = &l else {
                    unreachable!()
                };
                return sync_invalid(&l, inv, st).await;
            }
        },
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
            set_finalizers(&api, &strategy, finalizer::without(&strategy, FINALIZER)).await?;
            tracing::info!(strategy = %name, namespace = %ns, "released the Deployment; finalizer removed");
        }
        return Ok(Action::await_change());
    }
    // The strategy's resourceVersion our status write is conditional on.
    let mut rv = strategy.metadata.resource_version.clone();
    if !has_finalizer {
        let mut f = strategy.finalizers().to_vec();
        f.push(FINALIZER.into());
        set_finalizers(&api, &strategy, f.clone()).await?;
        // Not a step of the rollout: the first one follows on what was just read, which the
        // patch changed only here. Its new version is not known: the next step reads afresh.
        strategy.metadata.finalizers = Some(f);
        rv = None;
        st.expect.wrote(own.clone(), None);
    }

    let mut old = strategy.status.clone().unwrap_or_default();
    let target = strategy.spec.target_ref.name.clone();
    let mut observed = st.caches.observe(ns, name, &target);
    if !st.caches_show_our_writes(ns, &target, &old, &observed) {
        tracing::debug!(strategy = %name, namespace = %ns, "the caches have not caught up with our own writes yet");
        return Ok(Action::requeue(NOT_YET));
    }
    // `namespace/name`, as `Pace` and `Looks` key it.
    let strategy_key = format!("{ns}/{name}");
    // Whether the target is still missing after a look afresh: then it is looked for again.
    let mut missing = false;
    if observe::needs_fresh_target(&old, &observed) {
        let uncached = observed.deployment.is_none();
        observed.deployment = observe::read_target(client, ns, &target)
            .await
            .map_err(Error::Observe)?;
        if uncached {
            missing = observed.deployment.is_none();
            st.looks
                .looked(&strategy_key, !missing, st.gates.current().gate);
        }
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
    // not a step), and a refused Deployment write ends the reconcile in backoff. A plan that
    // stops before a write needing its status recorded goes on once that status is written.
    let mut rejected: Option<Rejection> = None;
    let mut rounds = 0;
    // The Events of every round whose status is written, published once the reconcile's writes
    // are done (or one failed): not between a status write and the write it allows, where each
    // Event would hold up, say, the unpause after a hook by a request.
    let mut told: Vec<machine::Note> = Vec::new();
    let result: Result<Action, Error> = async {
        loop {
            rounds += 1;
            let machine::Plan { decision, more } =
                plan(&strategy, &observed, rejected.as_ref(), st);
            if !decision.changes(&old) {
                let ours = |job: &&String| {
                    st.expect.seen(
                        &expect::Key::Job(ns.to_string(), (*job).clone()),
                        st.caches.job_version(ns, job).as_deref(),
                        true,
                    ) == expect::Seen::Yes
                };
                for job in decision.prune.iter().filter(ours) {
                    write::delete_job(client, ns, job).await?;
                    st.expect
                        .deleted(expect::Key::Job(ns.to_string(), job.clone()));
                    tracing::info!(strategy = %name, namespace = %ns, job, "pruned a finished hook Job");
                }
                let again = decision.requeue.unwrap_or(RESYNC).min(RESYNC);
                return Ok(Action::requeue(if missing {
                    again.min(st.looks.wait(&strategy_key, st.gates.current().gate))
                } else {
                    again
                }));
            }
            let mut refused = None;
            let act = write::Act {
                client,
                metrics: &st.ctx.metrics,
                expect: &st.expect,
                strategy: &strategy,
                observed: &observed,
                decision: &decision,
                calls: &st.calls,
            };
            let mut wrote_strategy_rv = None;
            for effect in &decision.effects {
                match write::perform(effect, &act).await {
                    Ok(written) => wrote_strategy_rv = written.or(wrote_strategy_rv),
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
            let wrote_strategy = wrote_strategy_rv.is_some();
            if let Some(written) = wrote_strategy_rv {
                rv = Some(written);
            }
            if refused.is_some() {
                rejected = refused;
                continue;
            }
            let written = if decision.status == old {
                // Only the effects were this round's (an unpause after the status that allows it,
                // say): a status write would change nothing and cost a request.
                if wrote_strategy {
                    st.expect.wrote(own.clone(), rv.as_deref());
                }
                rv.clone()
            } else {
                let written = status::write(&api, name, rv.as_deref(), &decision.status).await?;
                st.expect.wrote(own.clone(), written.as_deref());
                st.pace.wrote(&strategy_key);
                forget_recorded_calls(&st.calls.caller, &old, &decision.status);
                written
            };
            if old.phase != decision.status.phase {
                tracing::info!(strategy = %name, namespace = %ns, phase = ?decision.status.phase, revision = ?decision.status.current_revision, message = ?decision.status.message, "phase");
            }
            status::count(&st.ctx.metrics, &old, &decision);
            told.extend(decision.events.iter().cloned());
            if let Some(r) = rejected.filter(|r| r.effect.writes_deployment()) {
                // Recorded in status and an Event; the Deployment is written again after a backoff.
                return Err(Error::Refused {
                    code: r.code,
                    message: r.message,
                });
            }
            if more && rounds < ROUNDS && written.is_some() {
                // What this round wrote is what the next one decides on.
                took_effect(&decision.effects, &mut strategy, &mut observed);
                strategy.status = Some(decision.status.clone());
                strategy.metadata.resource_version = written.clone();
                rv = written;
                old = decision.status;
                rejected = None;
                continue;
            }
            return Ok(Action::requeue(
                decision.requeue.map_or(AFTER_STEP, |r| r.min(AFTER_STEP)),
            ));
        }
    }
    .await;
    if !told.is_empty() {
        status::publish(&st.recorder, &strategy, observed.deployment.as_ref(), &told).await;
    }
    result
}

/// Drops the answers of webhook calls that `new` (written) no longer waits for: their outcome
/// is in status now, and a later decision reads it there.
fn forget_recorded_calls(
    caller: &webhook::Caller,
    old: &crate::api::RolloutStrategyStatus,
    new: &crate::api::RolloutStrategyStatus,
) {
    for key in old
        .hooks
        .iter()
        .filter(|h| h.phase == HookPhase::Running)
        .filter_map(|h| h.idempotency_key.as_ref())
    {
        let still_running = new
            .hooks
            .iter()
            .any(|h| h.idempotency_key.as_ref() == Some(key) && h.phase == HookPhase::Running);
        if !still_running {
            caller.forget(key);
        }
    }
}

/// What the bookkeeping effects of a round changed, for the next round's views (the caches show
/// it only later).
fn took_effect(
    effects: &[Effect],
    strategy: &mut RolloutStrategy,
    observed: &mut observe::Observed,
) {
    for e in effects {
        match e {
            Effect::Annotate(phase) => {
                if let Some(d) = observed.deployment.as_mut() {
                    d.phase_label = Some(machine::phase_name(*phase).to_string());
                    d.governed_label = true;
                    d.gate_shard = Some(gate::shard_of(&d.name));
                    d.annotations.remove(machine::PHASE_LABEL);
                    d.annotations.insert(
                        machine::STRATEGY_ANNOTATION.to_string(),
                        strategy.name_any(),
                    );
                }
            }
            Effect::MarkTarget(covered) => {
                let shard = gate::shard_of(&strategy.spec.target_ref.name);
                let labels = strategy.metadata.labels.get_or_insert_default();
                labels.insert(gate::SHARD_LABEL.to_string(), shard);
                if *covered {
                    labels.insert(gate::TARGET_GOVERNED_LABEL.to_string(), "true".to_string());
                } else {
                    labels.remove(gate::TARGET_GOVERNED_LABEL);
                }
            }
            _ => {}
        }
    }
}

impl State {
    /// Whether the caches show our own last writes of the Deployment and of the Jobs that
    /// `status` names ([`expect`]). What we expect nothing of, or no longer know, counts as
    /// shown: the decision then rests on the other safeguards (see [`sync`](super::sync)).
    fn caches_show_our_writes(
        &self,
        ns: &str,
        target: &str,
        status: &crate::api::RolloutStrategyStatus,
        observed: &observe::Observed,
    ) -> bool {
        let dep = expect::Key::Deployment(ns.to_string(), target.to_string());
        let cached = observed
            .deployment
            .as_ref()
            .map(|d| d.resource_version.as_str());
        if self.expect.seen(&dep, cached, true) == expect::Seen::NotYet {
            return false;
        }
        status
            .hooks
            .iter()
            .filter_map(|h| h.job_name.as_ref())
            .all(|job| {
                let key = expect::Key::Job(ns.to_string(), job.clone());
                self.expect
                    .seen(&key, self.caches.job_version(ns, job).as_deref(), true)
                    != expect::Seen::NotYet
            })
    }
}
