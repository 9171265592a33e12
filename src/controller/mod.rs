//! The two controllers and what they share. Each controller is a folder of
//! steps — read → decide → write → status — where the middle step is pure.

pub mod backoff;
pub mod events;
pub mod reconcile;
pub mod rollout_strategy;
pub mod spread_policy;

use crate::health::Health;
use crate::k8s::conditions::{Status, set_condition};
use crate::k8s::lenient::Invalid;
use crate::metrics::Metrics;
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Api, Client, Resource,
    api::{Patch, PatchParams},
    runtime::{
        WatchStreamExt,
        events::{Event, EventType},
        watcher,
    },
};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

/// Resolves once the manager should stop (SIGTERM, SIGINT or lost leadership).
pub type ShutdownSignal = Shared<BoxFuture<'static, ()>>;

/// What every reconcile gets.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    /// The same client without kube's retries of 429/503/504, for the requests whose 429 is an
    /// answer rather than throttling: an eviction a PodDisruptionBudget refuses.
    pub once: Client,
    pub metrics: Metrics,
    /// Restricts the controllers to one namespace (`--watch-namespace`);
    /// `None` watches all namespaces.
    pub namespace: Option<String>,
    /// Where every watch reports whether it keeps failing (for `/healthz`).
    pub health: Health,
    /// Hosts a RolloutStrategy webhook hook's `url:` may call (`--webhook-allowed-hosts`).
    pub webhook_allowed_hosts: rollout_strategy::webhook::AllowedHosts,
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

/// Whether the caches a controller decides on have been filled.
///
/// Not kube-runtime's `Store::wait_until_ready`: it keeps one waker per store (a oneshot
/// receiver behind a lock), so of several tasks waiting on one store at once only the last to
/// poll is woken, and kube's own controller already waits on its main store that way. With two
/// controllers sharing stores, a reconcile's wait lost that wake-up: a manager restarted with a
/// policy in place made its first write after a 30 s limit instead of at once. Here each watch
/// marks its cache filled as its first list passes by ([`CachesReady::filled`]), and any number
/// of reconciles can wait for all of them.
#[derive(Clone)]
pub struct CachesReady {
    caches: Vec<(&'static str, tokio::sync::watch::Receiver<bool>)>,
}

/// Marks one cache filled (see [`CachesReady::filled`]).
#[derive(Clone)]
pub struct Filled(std::sync::Arc<tokio::sync::watch::Sender<bool>>);

impl Filled {
    pub fn mark(&self) {
        self.0.send_replace(true);
    }

    /// For `.inspect` on a watch's events, after `.reflect` has stored them: marks the cache
    /// filled once the first list is complete.
    pub fn on_init_done<K, E>(self) -> impl FnMut(&Result<kube::runtime::watcher::Event<K>, E>) {
        move |ev| {
            if let Ok(kube::runtime::watcher::Event::InitDone) = ev {
                self.mark();
            }
        }
    }
}

impl CachesReady {
    pub fn new() -> Self {
        CachesReady { caches: Vec::new() }
    }

    /// A cache named `name` to wait for, and what marks it filled.
    pub fn filled(&mut self, name: &'static str) -> Filled {
        let (tx, rx) = tokio::sync::watch::channel(false);
        self.caches.push((name, rx));
        Filled(std::sync::Arc::new(tx))
    }

    /// Resolves once every cache is filled.
    pub async fn wait(&self) {
        for (_, rx) in &self.caches {
            let mut rx = rx.clone();
            if rx.wait_for(|filled| *filled).await.is_err() {
                // Its watch is gone: the controller is stopping.
                std::future::pending::<()>().await;
            }
        }
    }

    /// The caches not filled yet.
    pub fn unfilled(&self) -> Vec<&'static str> {
        self.caches
            .iter()
            .filter(|(_, rx)| !*rx.borrow())
            .map(|(name, _)| *name)
            .collect()
    }
}

impl Default for CachesReady {
    fn default() -> Self {
        Self::new()
    }
}

/// Turns any future into a [`ShutdownSignal`].
pub fn shutdown_signal(
    f: impl std::future::Future<Output = ()> + Send + 'static,
) -> ShutdownSignal {
    f.boxed().shared()
}

/// Objects per request of a watch's initial list (and relists). kube-runtime asks for 500: a
/// page of 500 Deployments, deserialized whole before the caches trim them, is 10 MiB that
/// the allocator keeps once the caches are filled. 100 halves the manager's resident memory
/// at 5000 Deployments for 4 more requests per 500 objects, once at startup. (Streaming lists
/// would do without pages, but they need the API server's WatchList feature, which is not on
/// everywhere ballast runs.)
pub const LIST_PAGE_SIZE: u32 = 100;

/// The watcher settings of both controllers: any resourceVersion for the initial list (the API
/// server's watch cache serves it), in pages of [`LIST_PAGE_SIZE`].
pub fn watch_config() -> watcher::Config {
    watcher::Config::default()
        .any_semantic()
        .page_size(LIST_PAGE_SIZE)
}

/// A watch of `api` with kube-runtime's default backoff, reporting to [`Health`] under `name`
/// (`controller/resource`) whether it keeps failing, and counting the objects it receives
/// (`ballast_watch_events_total`).
pub fn watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    ctx: &Context,
    name: &'static str,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let health = ctx.health.clone();
    let events = ctx.metrics.watch_events(name);
    watcher(api, cfg)
        .default_backoff()
        .inspect(move |r| match r {
            Ok(ev) => {
                events.count(ev);
                health.watch_ok(name);
            }
            Err(e) => {
                tracing::warn!(watch = name, error = %e, "watch failed; retrying with backoff");
                health.watch_failed(name);
            }
        })
}

/// Condition reason and Event reason for a stored object that cannot be read.
pub const REASON_INVALID_SPEC: &str = "InvalidSpec";

/// Reports on `obj` itself that this version of ballast cannot read it: `Ready=False` and
/// `Stalled=True` with reason `InvalidSpec` (merged into its status conditions, so nothing else
/// of its status is lost), and a Warning Event when that is news. Everything else goes on.
pub async fn report_invalid<K>(
    client: &Client,
    recorder: &events::Publisher,
    manager: &str,
    obj: &Invalid,
) -> kube::Result<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + Debug,
{
    let Some(ns) = obj.metadata.namespace.as_deref() else {
        return Ok(());
    };
    report_invalid_in::<K>(Api::namespaced(client.clone(), ns), recorder, manager, obj).await
}

/// [`report_invalid`] through `api`: also for cluster-scoped kinds.
pub async fn report_invalid_in<K>(
    api: Api<K>,
    recorder: &events::Publisher,
    manager: &str,
    obj: &Invalid,
) -> kube::Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let meta = &obj.metadata;
    let Some(name) = meta.name.as_deref() else {
        return Ok(());
    };
    let ns = meta.namespace.as_deref();
    let message = format!(
        "ballast cannot read this object, so it does nothing for it: {}. Fix the spec (kubectl edit) or delete it.",
        obj.error
    );
    let now = jiff::Timestamp::now();
    let mut conditions = obj.conditions.clone();
    let generation = meta.generation;
    let changed = set_condition(
        &mut conditions,
        "Ready",
        Status::False,
        REASON_INVALID_SPEC,
        &message,
        generation,
        now,
    ) | set_condition(
        &mut conditions,
        "Stalled",
        Status::True,
        REASON_INVALID_SPEC,
        &message,
        generation,
        now,
    );
    if !changed {
        return Ok(());
    }
    tracing::warn!(kind = %K::kind(&()), namespace = ?ns, name, error = %obj.error, "cannot read a stored object; reported on it");
    // A merge patch of the conditions alone: an apply of a partial status would drop the
    // progress the readable object had recorded.
    let patch = serde_json::json!({"status": {"conditions": conditions}});
    let pp = PatchParams {
        field_manager: Some(manager.to_string()),
        ..Default::default()
    };
    api.patch_status(name, &pp, &Patch::Merge(&patch)).await?;
    let reference = ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: Some(name.to_string()),
        namespace: ns.map(str::to_string),
        uid: meta.uid.clone(),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Warning,
        reason: REASON_INVALID_SPEC.into(),
        note: Some(message.chars().take(1000).collect()),
        action: "Read".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &reference).await {
        tracing::warn!(error = %e, "could not publish event");
    }
    Ok(())
}
