//! The RolloutStrategy controller. (Foundation: keeps `status.observedGeneration`.)

use super::{Context, ShutdownSignal};
use crate::api::RolloutStrategy;
use crate::k8s::{ROLLOUT_STRATEGY_MANAGER, apply};
use futures::StreamExt;
use kube::{
    Api, ResourceExt,
    runtime::{Controller, controller::Action, watcher},
};
use std::{sync::Arc, time::Duration};

pub const CONTROLLER: &str = "rollout-strategy";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("updating status: {0}")]
    Status(#[source] kube::Error),
}

impl Error {
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Status(_) => "StatusUpdateFailed",
        }
    }
}

pub async fn run(ctx: Context, shutdown: ShutdownSignal) {
    let api: Api<RolloutStrategy> = ctx.scoped_api();
    Controller::new(api, watcher::Config::default().any_semantic())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, Arc::new(ctx))
        .for_each(|_| futures::future::ready(()))
        .await;
}

async fn reconcile(obj: Arc<RolloutStrategy>, ctx: Arc<Context>) -> Result<Action, Error> {
    let start = std::time::Instant::now();
    let ns = obj.namespace().unwrap_or_default();
    let api: Api<RolloutStrategy> = Api::namespaced(ctx.client.clone(), &ns);
    let generation = obj.metadata.generation;
    if obj.status.as_ref().and_then(|s| s.observed_generation) != generation {
        apply::apply_status(
            &api,
            ROLLOUT_STRATEGY_MANAGER,
            &obj.name_any(),
            serde_json::json!({"observedGeneration": generation}),
        )
        .await
        .map_err(Error::Status)?;
    }
    ctx.metrics
        .count_reconcile(CONTROLLER, start.elapsed().as_secs_f64());
    Ok(Action::await_change())
}

fn error_policy(_obj: Arc<RolloutStrategy>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.count_error(CONTROLLER, err.reason());
    tracing::warn!(error = %err, reason = err.reason(), "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}
