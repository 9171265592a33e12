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

/// Runs both controllers until `shutdown` resolves, then returns once their
/// in-flight reconciles have finished.
pub async fn run(ctx: Context, shutdown: ShutdownSignal) {
    futures::join!(
        spread_policy::run(ctx.clone(), shutdown.clone()),
        rollout_strategy::run(ctx, shutdown),
    );
}

/// Turns any future into a [`ShutdownSignal`].
pub fn shutdown_signal(
    f: impl std::future::Future<Output = ()> + Send + 'static,
) -> ShutdownSignal {
    f.boxed().shared()
}
