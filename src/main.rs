//! The ballast manager: wires telemetry, the Kubernetes client, leader election, both
//! controllers and the HTTP endpoints together, and decides how the process ends:
//!
//! - SIGTERM: stop taking work, let in-flight reconciles finish (within
//!   [`controller::DRAIN`]), release the leader Lease, exit 0.
//! - Lost leadership: exit 1 at once. Another replica may already act, so nothing more is
//!   done, not even the drain; a step cut short is a crash, which both controllers resume from.
//! - A controller that stops, or a watch failing for longer than `--watch-stale-seconds`:
//!   `/healthz` fails (kubelet restarts the pod), and a quarter of that limit later the manager
//!   shuts down as on SIGTERM and exits 1, so that nothing runs wedged where no probe watches.
#![deny(unsafe_code)]

use anyhow::Context as _;
use ballast::{
    controller::{self, ShutdownSignal, rollout_strategy, spread_policy},
    health::{self, Health},
    http, leader,
    metrics::Metrics,
    telemetry,
};
use clap::Parser;
use std::{
    net::SocketAddr,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

#[derive(Parser, Debug)]
#[command(name = "ballast", version, about = "The ballast Kubernetes operator")]
struct Args {
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "BALLAST_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    http_addr: SocketAddr,
    /// Kubeconfig to use (default: $KUBECONFIG, ~/.kube/config, or the Pod's ServiceAccount).
    #[arg(long)]
    kubeconfig: Option<std::path::PathBuf>,
    /// Log format.
    #[arg(long, env = "BALLAST_LOG_FORMAT", value_enum, default_value = "text")]
    log_format: telemetry::LogFormat,
    /// Only watch and act in this namespace (default: all namespaces).
    #[arg(long, env = "BALLAST_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
    /// Elect a leader on a Lease so that only one replica acts.
    #[arg(long, env = "BALLAST_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Name of the leader election Lease.
    #[arg(long, env = "BALLAST_LEASE_NAME", default_value = "ballast-leader")]
    lease_name: String,
    /// Namespace of the leader election Lease (default: the namespace of the
    /// kubeconfig context, or the Pod's own namespace in a cluster).
    #[arg(long, env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// Identity in the leader election (default: hostname and PID).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Seconds a leader Lease lasts without renewal. The leader steps down after two thirds
    /// of it without a successful renewal.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(3..=3600))]
    lease_duration_seconds: u64,
    /// Limit, in seconds, of one request to the API server that is not a watch.
    #[arg(long, default_value_t = ballast::client::REQUEST_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    api_timeout_seconds: u64,
    /// Seconds a watch may keep failing before /healthz fails; the manager exits a quarter
    /// of that later.
    #[arg(long, default_value_t = health::STALE_AFTER.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    watch_stale_seconds: u64,
    /// How RolloutStrategy holds governed Deployments while hooks run: `admission` (the
    /// revision gate of config/admission pauses a new revision; unpaused at rest),
    /// `pause-at-rest`, or `auto`: admission when the API server serves it and the gate is
    /// installed as config/admission ships it, else pause-at-rest.
    #[arg(long, env = "BALLAST_GATE", value_enum, default_value = "auto")]
    gate: rollout_strategy::gate::GateFlag,
    /// Name of the revision gate's MutatingAdmissionPolicy and binding (`auto` checks them).
    #[arg(long, default_value = rollout_strategy::gate::DEFAULT_POLICY_NAME)]
    gate_policy_name: String,
    /// Hosts (names or IP addresses, comma-separated, exact, no wildcard) that RolloutStrategy
    /// webhook hooks with `url:` may call. Default: none (only Services of the strategy's
    /// namespace are called).
    #[arg(long, env = "BALLAST_WEBHOOK_ALLOWED_HOSTS", value_delimiter = ',')]
    webhook_allowed_hosts: Vec<String>,
}

fn main() -> anyhow::Result<()> {
    one_malloc_arena();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run())
}

/// glibc's malloc gives each thread that allocates an arena of its own (up to 8 per core), and
/// memory freed in one arena is not reused by another: at the peak of a fan-out the manager held
/// about 15 MiB beyond its live heap (docs/performance.md, "Where the memory goes"). One arena
/// for every thread cut the peak RSS of a fan-out at N = 5000 from 70–81 MiB to about 60 MiB,
/// at the same speed. Set here, before any thread exists, so that nobody has to set
/// `MALLOC_ARENA_MAX` for the process; one who does (`GLIBC_TUNABLES` too) keeps what they set.
/// The shipped image is a static glibc build (`make image`); musl (the Dockerfile's build) has
/// no per-thread arenas.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn one_malloc_arena() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some()
        || std::env::var_os("GLIBC_TUNABLES").is_some()
    {
        return;
    }
    // SAFETY: mallopt only sets a malloc parameter; it is called before the runtime's threads
    // are started, and its result (0 when refused) only means the default stays.
    let _ = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn one_malloc_arena() {}

async fn run() -> anyhow::Result<()> {
    let args = Args::parse();
    telemetry::init(args.log_format);

    let metrics = Metrics::default();
    let health = Health::default();
    let stale_after = Duration::from_secs(args.watch_stale_seconds);
    let ready = Arc::new(AtomicBool::new(false));
    let failure: Arc<OnceLock<String>> = Arc::default();
    let (fail_tx, fail_rx) = tokio::sync::watch::channel(());
    let fail = {
        let failure = failure.clone();
        move |reason: String| {
            tracing::error!(%reason, "the manager cannot go on; shutting down");
            let _ = failure.set(reason);
            fail_tx.send_replace(());
        }
    };
    let stop = controller::shutdown_signal(termination());
    // Everything stops on SIGTERM or on a failure.
    let shutdown = controller::shutdown_signal({
        let (stop, failure, mut fail_rx) = (stop.clone(), failure.clone(), fail_rx);
        async move {
            tokio::select! {
                _ = stop => {}
                _ = fail_rx.wait_for(|_| failure.get().is_some()) => {}
            }
        }
    });

    let listener = tokio::net::TcpListener::bind(args.http_addr)
        .await
        .with_context(|| format!("binding {}", args.http_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz, /readyz");
    let http_state = http::HttpState {
        metrics: metrics.clone(),
        ready: ready.clone(),
        health: health.clone(),
        stale_after,
        failure: failure.clone(),
    };
    let server = tokio::spawn(http::serve(listener, http_state, shutdown.clone()));

    let config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .map_err(anyhow::Error::from)
        }
        None => kube::Config::infer().await.map_err(anyhow::Error::from),
    }
    .context("loading the Kubernetes client configuration")?;
    let timeout = Duration::from_secs(args.api_timeout_seconds);
    let once = ballast::client::build_once(config.clone(), &metrics, timeout)
        .context("building the Kubernetes client")?;
    let client = ballast::client::build(config, &metrics, timeout)
        .context("building the Kubernetes client")?;
    let version = client
        .apiserver_version()
        .await
        .context("reaching the API server")?;
    tracing::info!(server = %version.git_version, "connected to the API server");
    ready.store(true, Ordering::Relaxed);

    let elector = if args.leader_elect {
        let ns = args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let identity = args.identity.clone().unwrap_or_else(default_identity);
        let timings =
            leader::LeaseTimings::for_duration(Duration::from_secs(args.lease_duration_seconds));
        let elector = Arc::new(leader::LeaderElector::new(
            client.clone(),
            &ns,
            &args.lease_name,
            &identity,
            timings,
        ));
        let renewed = tokio::select! {
            r = elector.acquire() => r,
            _ = stop.clone() => {
                tracing::info!("stopped before becoming leader");
                let _ = server.await;
                return Ok(());
            }
        };
        let keeper = {
            let (elector, metrics) = (elector.clone(), metrics.clone());
            tokio::spawn(async move {
                let lost = elector.hold(renewed).await;
                metrics.leader.set(0);
                // Another replica may already act: not one more step.
                tracing::error!(%lost, "lost the leader lease; exiting");
                std::process::exit(1);
            })
        };
        Some((elector, keeper))
    } else {
        None
    };
    metrics.leader.set(1);

    let gates = rollout_strategy::gate::Gates::start(
        &client,
        args.gate,
        &args.gate_policy_name,
        shutdown.clone(),
    )
    .await
    .context("checking the RolloutStrategy revision gate")?;

    let ctx = controller::Context {
        client,
        once,
        metrics: metrics.clone(),
        namespace: args.watch_namespace,
        health: health.clone(),
        webhook_allowed_hosts: rollout_strategy::webhook::AllowedHosts::new(
            &args.webhook_allowed_hosts,
        ),
    };
    tracing::info!(namespace = ?ctx.namespace, "starting controllers");
    let exit_after = stale_after + stale_after / 4;
    run_controllers(ctx, gates, shutdown, &stop, &health, exit_after, &fail).await;

    // In-flight reconciles are done: only now may another replica take over.
    if let Some((elector, keeper)) = &elector {
        keeper.abort();
        metrics.leader.set(0);
        elector.release().await;
    }
    let _ = server.await;
    if let Some(reason) = failure.get() {
        anyhow::bail!("{reason}");
    }
    tracing::info!("shut down cleanly");
    Ok(())
}

/// Runs both controllers until `shutdown`, then lets their in-flight reconciles finish for
/// at most [`controller::DRAIN`]. A controller that ends by itself, or a watch that fails for
/// longer than `exit_after`, is a failure (`fail`), which shuts the other down too.
async fn run_controllers(
    ctx: controller::Context,
    gates: rollout_strategy::gate::Gates,
    shutdown: ShutdownSignal,
    stop: &ShutdownSignal,
    health: &Health,
    exit_after: Duration,
    fail: &(impl Fn(String) + Sync),
) {
    let until_stopped = |name: &'static str, run: futures::future::BoxFuture<'static, ()>| {
        let shutdown = shutdown.clone();
        async move {
            run.await;
            if shutdown.peek().is_none() {
                fail(format!("the {name} controller stopped"));
            }
        }
    };
    let both = futures::future::join(
        until_stopped(
            "spread-policy",
            Box::pin(spread_policy::run(ctx.clone(), shutdown.clone())),
        ),
        until_stopped(
            "rollout-strategy",
            Box::pin(rollout_strategy::run(ctx, gates, shutdown.clone())),
        ),
    );
    tokio::pin!(both);
    let watchdog = async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if let Err(e) = health.check(exit_after) {
                return e;
            }
        }
    };
    tokio::select! {
        _ = &mut both => return,
        _ = shutdown.clone() => {}
        reason = watchdog => fail(reason),
    }
    if stop.peek().is_some() {
        tracing::info!(drain = ?controller::DRAIN, "finishing in-flight reconciles");
    }
    if tokio::time::timeout(controller::DRAIN, &mut both)
        .await
        .is_err()
    {
        tracing::warn!(drain = ?controller::DRAIN, "controllers did not stop in time; exiting anyway");
    }
}

/// Resolves on SIGTERM or SIGINT.
async fn termination() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
    }
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "ballast".into());
    format!("{host}-{}", std::process::id())
}
