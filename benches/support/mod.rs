//! What the cluster benches share: settings from the environment, kubectl and a kube client
//! against the local control plane (127.0.0.1 only). Each bench includes it with
//! `#[path = "support/mod.rs"] mod support;`.

#![allow(dead_code)]

pub mod operator;

use anyhow::{Context, Result, ensure};
use kube::{
    Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};
use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

/// A RolloutStrategy `name` for the Deployment of the same name, with one pre hook: the revision
/// gate pauses every revision of that Deployment in its write, which is how the benches see that
/// the gate is in force. No operator watches where they use it, so the hook never runs.
pub fn gated_strategy(name: &str) -> Result<ballast::api::RolloutStrategy> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "ballast.dev/v1alpha1", "kind": "RolloutStrategy",
        "metadata": {"name": name},
        "spec": {
            "targetRef": {"name": name},
            "pre": [{"name": "probe", "container": {"from": "app", "command": ["true"]}}],
        },
    }))?)
}

/// A count from the environment variable `name`, else `default`; 0 is allowed (0: "not at
/// all").
pub fn env_count(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v.parse().with_context(|| format!("{name}={v}")),
        Err(_) => Ok(default),
    }
}

/// A positive count from the environment variable `name`, else `default`.
pub fn env_usize(name: &str, default: usize) -> Result<usize> {
    let n = env_count(name, default)?;
    ensure!(n > 0, "{name} must be at least 1");
    Ok(n)
}

pub fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// kubectl against the same kubeconfig as the client.
#[derive(Clone)]
pub struct Kubectl {
    pub kubeconfig: PathBuf,
}

impl Kubectl {
    /// Runs kubectl in the repository's root with `args` (and `stdin`); its stdout, or an error
    /// with its stderr.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let mut child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .current_dir(repo_root())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context(
                "running kubectl (is the cluster's bin/ on PATH? `make bench-cluster` does it)",
            )?;
        if let Some(input) = stdin {
            child
                .stdin
                .take()
                .expect("piped stdin")
                .write_all(input.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        ensure!(
            out.status.success(),
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

/// A client of the cluster of `kubeconfig`, refused unless it dials 127.0.0.1.
pub async fn client(kubeconfig: &Path) -> Result<Client> {
    Ok(Client::try_from(loopback_config(kubeconfig).await?)?)
}

/// [`client`], built as the manager builds its own (`ballast::client::build`), so that its
/// requests are timed into `metrics` as the manager times its own
/// (`ballast_api_request_duration_seconds`, sent to response headers): a floor and ballast then
/// compare on one measure.
pub async fn client_timed(
    kubeconfig: &Path,
    metrics: &ballast::metrics::Metrics,
) -> Result<Client> {
    let config = loopback_config(kubeconfig).await?;
    Ok(ballast::client::build(
        config,
        metrics,
        ballast::client::REQUEST_TIMEOUT,
    )?)
}

async fn loopback_config(kubeconfig: &Path) -> Result<Config> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    ensure!(
        config.cluster_url.host() == Some("127.0.0.1"),
        "this bench only ever dials the local control plane on 127.0.0.1, not {}",
        config.cluster_url
    );
    Ok(config)
}

/// The sum of the API server's `/metrics` series (lines) that `pick` selects.
pub async fn apiserver_sum(client: &Client, pick: impl Fn(&str) -> bool) -> Result<f64> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await?;
    Ok(text
        .lines()
        .filter(|l| pick(l))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum())
}

/// Creates namespace `name`, labelled `ballast.dev/bench: <bench>` so that a leftover is
/// easy to find (`kubectl get ns -l ballast.dev/bench`).
pub async fn create_namespace(client: &Client, name: &str, bench: &str) -> Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let ns = Namespace {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            labels: Some([("ballast.dev/bench".to_string(), bench.to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    kube::Api::<Namespace>::all(client.clone())
        .create(&Default::default(), &ns)
        .await?;
    Ok(())
}

/// What a bench's deletion is for. One between measurements always waits until its objects are
/// gone, so that the next measurement starts on a quiet cluster. A bench's last one waits too,
/// unless `BALLAST_BENCH_CLEANUP=background`: `make bench-cluster` sets that when it starts
/// every bench on a cluster started afresh, which wipes the leftovers anyway; waiting for them
/// took about 2.5 of the suite's minutes (the 15000 Deployments of cluster_spread alone 52 s).
/// The objects are deleted all the same; the API server and the controllers finish the job.
///
/// `Early` is for objects a bench is done with while what follows measures no time (P2's
/// counts of requests): deleted without waiting, whatever `BALLAST_BENCH_CLEANUP` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deletion {
    Between,
    Last,
    Early,
}

impl Deletion {
    /// `Last` for the bench's last cleanup, else `Between`.
    pub fn last_if(last: bool) -> Self {
        if last {
            Deletion::Last
        } else {
            Deletion::Between
        }
    }

    /// Whether this deletion waits for its objects to be gone.
    pub fn waits(self) -> bool {
        match self {
            Deletion::Between => true,
            Deletion::Last => std::env::var("BALLAST_BENCH_CLEANUP").as_deref() != Ok("background"),
            Deletion::Early => false,
        }
    }

    /// kubectl's flags for it: `--timeout` when it waits, `--wait=false` when not.
    pub fn flags(self, timeout: &str) -> String {
        if self.waits() {
            format!("--timeout={timeout}")
        } else {
            "--wait=false".into()
        }
    }

    /// How it went, for the bench's log.
    pub fn done(self, start: Instant) -> String {
        if self.waits() {
            format!("deleted in {:.1} s", start.elapsed().as_secs_f64())
        } else if self == Deletion::Early {
            "being deleted (not waiting: what follows counts requests, not time)".into()
        } else {
            "being deleted (BALLAST_BENCH_CLEANUP=background: not waiting)".into()
        }
    }
}

/// Deletes `names` (namespaces), waiting up to `timeout` (e.g. `"300s"`) as `deletion` says,
/// and says how it went: for the benches' cleanup guards, which must not fail. The operators
/// are stopped by then, so ballast's finalizers on the RolloutStrategies and SpreadPolicies in
/// them are dropped first: nobody else would, and the namespaces would stay Terminating.
pub fn delete_namespaces(kubectl: &Kubectl, names: &[String], timeout: &str, deletion: Deletion) {
    let start = Instant::now();
    for ns in names {
        let kinds = "rolloutstrategies,spreadpolicies";
        let Ok(objects) = kubectl.run(&["get", kinds, "-n", ns, "-o", "name"], None) else {
            continue;
        };
        for name in objects.lines().filter(|l| !l.is_empty()) {
            let _ = kubectl.run(
                &[
                    "patch",
                    "-n",
                    ns,
                    name,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ],
                None,
            );
        }
    }
    let flags = deletion.flags(timeout);
    let mut args = vec!["delete", "namespace", "--ignore-not-found", &flags];
    args.extend(names.iter().map(String::as_str));
    match kubectl.run(&args, None) {
        Ok(_) => eprintln!(
            "[bench] namespaces {} {}",
            names.join(", "),
            deletion.done(start)
        ),
        Err(e) => eprintln!(
            "[bench] ERROR: deleting namespaces {}: {e:#}",
            names.join(", ")
        ),
    }
}

/// Runs `work` until it ends or the process is interrupted (Ctrl-C, SIGTERM, SIGHUP). On a
/// signal, `work` is dropped, and with it its guards (operators stopped, namespaces deleted,
/// whatever the bench set up), whether make is interrupted or the process is killed politely.
pub async fn until_signal<T>(work: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    tokio::select! {
        r = work => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated (SIGTERM)")),
        _ = hangup.recv() => Err(anyhow::anyhow!("hung up (SIGHUP)")),
    }
}

/// A number for this run's names (seconds since the epoch, modulo 10^6), so that a run never
/// meets the leftovers of an earlier one.
pub fn run_suffix() -> Result<u64> {
    Ok(std::time::SystemTime::now()
        .duration_since(std::time::SystemTime::UNIX_EPOCH)?
        .as_secs()
        % 1_000_000)
}

/// Fails unless every row with a goal passed.
pub fn ensure_rows_pass(rows: &[Row]) -> Result<()> {
    let failed = rows.iter().filter(|r| r.pass == Some(false)).count();
    ensure!(
        failed == 0,
        "{failed} of {} rows failed their goal",
        rows.len()
    );
    Ok(())
}

/// One row of a bench's table: `measure | floor | ballast | ratio | goal | result`. `pass` is
/// `None` for a row the issue sets no goal for (printed as `info`).
#[derive(Debug, serde::Serialize)]
pub struct Row {
    pub id: &'static str,
    pub measure: String,
    pub floor: String,
    pub ballast: String,
    pub ratio: String,
    pub goal: String,
    pub pass: Option<bool>,
}

pub fn print_table(rows: &[Row]) {
    println!();
    println!("| id | measure | floor | ballast | ratio | goal | result |");
    println!("|---|---|---:|---:|---:|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            r.id,
            r.measure,
            r.floor,
            r.ballast,
            r.ratio,
            r.goal,
            match r.pass {
                Some(true) => "pass",
                Some(false) => "**FAIL**",
                None => "info",
            }
        );
    }
    println!();
}

/// What ran on the same cluster at the same time (`BALLAST_BENCH_BESIDE`, set by
/// `hack/bench-cluster.sh`), for the results and the log: `None` when nothing did.
pub fn beside() -> Option<String> {
    let b = std::env::var("BALLAST_BENCH_BESIDE").ok()?;
    let b = b.trim();
    if b.is_empty() {
        return None;
    }
    Some(b.to_string())
}

/// Writes `doc` to `bench/results/<bench>-<UTC time of started>.json`; returns the path.
pub fn write_results(
    bench: &str,
    started: jiff::Timestamp,
    doc: &serde_json::Value,
) -> Result<PathBuf> {
    let out_dir = repo_root().join("bench/results");
    std::fs::create_dir_all(&out_dir)?;
    let path = out_dir.join(format!(
        "{bench}-{}.json",
        started.strftime("%Y%m%dT%H%M%SZ")
    ));
    std::fs::write(&path, serde_json::to_string_pretty(doc)? + "\n")?;
    Ok(path)
}
