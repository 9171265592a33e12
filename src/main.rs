//! The ballast manager: wires telemetry, the Kubernetes client, leader
//! election, both controllers and the HTTP endpoints together, and shuts
//! down gracefully on SIGTERM (finishing in-flight reconciles and releasing
//! the leader Lease).
#![forbid(unsafe_code)]

use anyhow::Context as _;
use ballast::{controller, http, leader, metrics::Metrics, telemetry};
use clap::Parser;
use futures::FutureExt;
use std::{
    net::SocketAddr,
    sync::{
        Arc,
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
    /// Seconds a leader Lease lasts without renewal.
    #[arg(long, default_value_t = 15)]
    lease_duration_seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    telemetry::init(args.log_format);

    let metrics = Metrics::default();
    let health = ballast::health::Health::default();
    let ready = Arc::new(AtomicBool::new(false));
    let stop = controller::shutdown_signal(termination());

    let listener = tokio::net::TcpListener::bind(args.http_addr)
        .await
        .with_context(|| format!("binding {}", args.http_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics, /healthz, /readyz");
    let http_state = http::HttpState {
        metrics: metrics.clone(),
        ready: ready.clone(),
    };
    let server = tokio::spawn(http::serve(listener, http_state, stop.clone()));

    let client = kube::Client::try_default()
        .await
        .context("building the Kubernetes client")?;
    let version = client
        .apiserver_version()
        .await
        .context("reaching the API server")?;
    tracing::info!(server = %version.git_version, "connected to the API server");
    ready.store(true, Ordering::Relaxed);

    let lost = Arc::new(AtomicBool::new(false));
    let elector = if args.leader_elect {
        let ns = args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let identity = args.identity.clone().unwrap_or_else(default_identity);
        let timings = leader::LeaseTimings {
            lease_duration: Duration::from_secs(args.lease_duration_seconds),
            renew_deadline: Duration::from_secs(args.lease_duration_seconds * 2 / 3),
            ..Default::default()
        };
        let elector = Arc::new(leader::LeaderElector::new(
            client.clone(),
            &ns,
            &args.lease_name,
            &identity,
            timings,
        ));
        tokio::select! {
            _ = elector.acquire() => {}
            _ = stop.clone() => {
                tracing::info!("stopped before becoming leader");
                let _ = server.await;
                return Ok(());
            }
        }
        Some(elector)
    } else {
        None
    };
    metrics.leader.set(1);

    // Stop acting on SIGTERM, or the moment leadership is lost.
    let shutdown = match &elector {
        Some(e) => {
            let (e, lost) = (e.clone(), lost.clone());
            let hold = async move {
                e.hold().await;
                lost.store(true, Ordering::SeqCst);
            };
            controller::shutdown_signal(
                futures::future::select(stop.clone(), hold.boxed()).map(|_| ()),
            )
        }
        None => stop.clone(),
    };

    let ctx = controller::Context {
        client,
        metrics: metrics.clone(),
        namespace: args.watch_namespace,
        health: health.clone(),
    };
    tracing::info!(namespace = ?ctx.namespace, "starting controllers");
    controller::run(ctx, shutdown).await;
    metrics.leader.set(0);

    if lost.load(Ordering::SeqCst) {
        // Another replica may already act: exit at once and let the
        // Deployment restart us as a standby.
        anyhow::bail!("lost the leader lease");
    }
    if let Some(e) = &elector {
        e.release().await;
    }
    let _ = server.await;
    tracing::info!("shut down cleanly");
    Ok(())
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
