//! The two controllers and what they share. Each controller is a folder of
//! steps — read → decide → write → status — where the middle step is pure.

pub mod rollout_strategy;
pub mod spread_policy;

use crate::metrics::Metrics;
use futures::future::{BoxFuture, FutureExt, Shared};
use kube::Client;

/// Resolves once the manager should stop (SIGTERM, SIGINT or lost leadership).
pub type ShutdownSignal = Shared<BoxFuture<'static, ()>>;

/// What every reconcile gets.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub metrics: Metrics,
    /// Restricts the controllers to one namespace (`--watch-namespace`);
    /// `None` watches all namespaces.
    pub namespace: Option<String>,
}

impl Context {
    /// An `Api` for namespaced `K` within the watched scope.
    pub fn scoped_api<K>(&self) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        match &self.namespace {
            Some(ns) => kube::Api::namespaced(self.client.clone(), ns),
            None => kube::Api::all(self.client.clone()),
        }
    }
}

/// How long in-flight reconciles may take to finish once shutdown begins.
/// Bounded because kube-runtime holds a controller that is shut down before
/// its first cache is ready waiting for that cache forever.
pub const DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs both controllers until `shutdown` resolves, then returns once their
/// in-flight reconciles have finished, or after [`DRAIN`].
pub async fn run(ctx: Context, shutdown: ShutdownSignal) {
    let both = async {
        futures::join!(
            spread_policy::run(ctx.clone(), shutdown.clone()),
            rollout_strategy::run(ctx, shutdown.clone()),
        )
    };
    tokio::pin!(both);
    tokio::select! {
        _ = &mut both => {}
        _ = shutdown.clone() => {
            if tokio::time::timeout(DRAIN, &mut both).await.is_err() {
                tracing::warn!(drain = ?DRAIN, "controllers did not stop in time; exiting anyway");
            }
        }
    }
}

/// Waits up to `timeout` for `ready` (the controller's caches to fill), but
/// no longer than until `shutdown`: a reconcile that started just before a
/// SIGTERM must not hold up the graceful shutdown, whose watches no longer
/// fill the caches. Returns whether the caches are ready.
pub async fn caches_ready(
    ready: impl std::future::Future<Output = ()>,
    shutdown: &ShutdownSignal,
    timeout: std::time::Duration,
) -> bool {
    tokio::select! {
        r = tokio::time::timeout(timeout, ready) => r.is_ok(),
        _ = shutdown.clone() => false,
    }
}

/// Turns any future into a [`ShutdownSignal`].
pub fn shutdown_signal(
    f: impl std::future::Future<Output = ()> + Send + 'static,
) -> ShutdownSignal {
    f.boxed().shared()
}
