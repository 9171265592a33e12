//! The real operator for the cluster benches that measure it: config/default installed and a
//! kubeconfig of the manager's ServiceAccount, the release binary of this build started for
//! one namespace, and what it tells on loopback (`/metrics`) and in `/proc`. Used by
//! `cluster_spread` and `cluster_rollout`.

use anyhow::{Context, Result, bail, ensure};
use ballast::api::RolloutStrategy;
use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, Client, api::PostParams};
use serde_json::json;
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command},
    time::{Duration, Instant},
};

use super::Kubectl;

/// Installs config/default (CRDs, RBAC, the admission policies, the manager's ServiceAccount)
/// as the tests do, and writes a kubeconfig that authenticates as that ServiceAccount: the
/// operator runs with exactly the RBAC users deploy.
pub fn operator_kubeconfig(kubectl: &Kubectl, dir: &Path) -> Result<PathBuf> {
    kubectl.run(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-k",
            "config/default",
        ],
        None,
    )?;
    kubectl.run(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/spreadpolicies.ballast.dev",
            "crd/rolloutstrategies.ballast.dev",
        ],
        None,
    )?;
    let token = kubectl.run(
        &[
            "create",
            "token",
            "ballast-controller-manager",
            "-n",
            "ballast-system",
            "--duration=6h",
        ],
        None,
    )?;
    let view = |path: &str, raw: bool| {
        let mut args = vec!["config", "view", "--minify", "-o", path];
        if raw {
            args.push("--raw");
        }
        kubectl.run(&args, None)
    };
    let server = view("jsonpath={.clusters[0].cluster.server}", false)?;
    let ca = view(
        "jsonpath={.clusters[0].cluster.certificate-authority-data}",
        true,
    )?;
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
         users:\n- name: ballast\n  user:\n    token: {}\ncontexts:\n- name: ballast\n  context: {{cluster: local, user: ballast, namespace: ballast-system}}\n\
         current-context: ballast\n",
        token.trim()
    );
    std::fs::create_dir_all(dir)?;
    let path = dir.join("operator.kubeconfig");
    std::fs::write(&path, yaml)?;
    Ok(path)
}

/// Waits until the revision gate of config/default is in force: its admission policies refuse
/// every Deployment write while their param kind is not synced ("paramKind … not yet synced"),
/// and a write made before the API server has loaded the policies at all passes untouched, so
/// a probe that merely passes proves nothing on a fresh cluster. The probe is a dry-run create
/// of a Deployment that a RolloutStrategy with a pre hook governs (in `default`, removed after):
/// it must come back paused.
pub async fn admission_synced(client: &Client) -> Result<()> {
    const PROBE: &str = "bench-admission-probe";
    let ns = "default";
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let strategies: Api<RolloutStrategy> = Api::namespaced(client.clone(), ns);
    match strategies
        .create(&PostParams::default(), &super::gated_strategy(PROBE)?)
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        r => {
            r.context("the admission probe's RolloutStrategy")?;
        }
    }
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let probe: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": PROBE},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {"containers": [{"name": "app", "image": "registry.invalid/bench:1"}]},
            },
        },
    }))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let result = loop {
        let why = match deployments.create(&dry, &probe).await {
            Ok(d) if d.spec.as_ref().and_then(|s| s.paused) == Some(true) => break Ok(()),
            Ok(_) => {
                "the probe was admitted but not paused: the gate is not loaded yet".to_string()
            }
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            break Err(anyhow::anyhow!(
                "the revision gate of config/default did not take effect in 60 s: {why}"
            ));
        }
        eprintln!("[bench] waiting for admission to take up config/default: {why}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let _ = strategies.delete(PROBE, &Default::default()).await;
    result
}

/// The operator binary of this build (release), watching one namespace or every one. Stopped
/// when dropped.
pub struct Operator {
    pub child: Child,
    port: u16,
    pub log: PathBuf,
}

impl Operator {
    /// Started as the ServiceAccount of `kubeconfig`, for `namespace`, on a Lease of its own;
    /// `RUST_LOG` is `BALLAST_BENCH_LOG` (default `info`), its log `dir/operator-<ns>.log`
    /// (appended to).
    pub fn start(kubeconfig: &Path, dir: &Path, namespace: &str) -> Result<Self> {
        Self::start_watching(kubeconfig, dir, namespace, Some(namespace))
    }

    /// [`Operator::start`] named after `namespace` (its log and Lease), watching `watch`, or
    /// every namespace as config/default installs it when `None`.
    pub fn start_watching(
        kubeconfig: &Path,
        dir: &Path,
        namespace: &str,
        watch: Option<&str>,
    ) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = dir.join(format!("operator-{namespace}.log"));
        // Appended to: a restarted operator (P3) keeps the log of the one before.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)?;
        // `BALLAST_BENCH_OPERATOR_WRAPPER` runs the operator under a profiler, e.g. a script
        // that runs `heaptrack -o /tmp/ht-$$ "$@"` (a file per process: P3 restarts the
        // operator, and a fixed name would keep only the restarted one's). Its RSS rows then
        // measure the wrapper's process, not the operator's.
        let wrapper = std::env::var("BALLAST_BENCH_OPERATOR_WRAPPER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut cmd = match words.next() {
            Some(w) => {
                let mut c = Command::new(w);
                c.args(words).arg(env!("CARGO_BIN_EXE_ballast"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_ballast")),
        };
        if watch.is_none() {
            // Every namespace, whatever the bench's own environment says.
            cmd.env_remove("BALLAST_WATCH_NAMESPACE");
        }
        // A process group of its own: a wrapper's children are stopped with it (below).
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd
            .env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("BALLAST_BENCH_LOG").unwrap_or_else(|_| "info".into()),
            )
            .args(
                watch
                    .map(|ns| ["--watch-namespace", ns])
                    .into_iter()
                    .flatten(),
            )
            .args([
                "--http-addr",
                &format!("127.0.0.1:{port}"),
                "--lease-namespace",
                "ballast-system",
                "--lease-name",
                &format!("ballast-{namespace}"),
            ])
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("starting the operator")?;
        Ok(Operator { child, port, log })
    }

    /// GETs a path of the operator's HTTP server on loopback (not the API server).
    async fn get(&self, path: &str) -> Option<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.ok()?;
        let code = buf.split_whitespace().nth(1)?.parse().ok()?;
        let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((code, body))
    }

    pub async fn metrics(&self) -> Result<Requests> {
        Ok(Requests::parse(&self.metrics_text().await?))
    }

    pub async fn metrics_text(&self) -> Result<String> {
        match self.get("/metrics").await {
            Some((200, body)) => Ok(body),
            other => bail!("the operator's /metrics answered {other:?}"),
        }
    }

    /// CPU time used so far (user + system), in seconds.
    pub fn cpu_secs(&self) -> Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // Fields after the command name, which is in parentheses and may hold spaces.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        // utime and stime are fields 14 and 15 of /proc/<pid>/stat, 11 and 12 after the name.
        Ok((ticks(11) + ticks(12)) / 100.0)
    }

    /// Waits until it leads and its request counter has stood still for `quiet` (its caches
    /// are synced and its reconciles done).
    pub async fn settle(&mut self, quiet: Duration) -> Result<Requests> {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut last: Option<(Requests, Instant)> = None;
        loop {
            ensure!(
                self.child.try_wait()?.is_none(),
                "the operator exited; its log: {}",
                self.log.display()
            );
            if Instant::now() > deadline {
                let moving = match &last {
                    Some((prev, _)) => format!("{:?}", self.metrics().await?.since(prev)),
                    None => "no metrics, or not the leader".into(),
                };
                bail!(
                    "the operator did not settle in 2 minutes (still counting: {moving}); its log: {}",
                    self.log.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            let Some((200, body)) = self.get("/metrics").await else {
                continue;
            };
            if !body.lines().any(|l| l == "ballast_leader 1") {
                continue;
            }
            let now = Requests::parse(&body);
            match &last {
                Some((prev, since)) if *prev == now => {
                    if since.elapsed() >= quiet {
                        return Ok(now);
                    }
                }
                _ => last = Some((now, Instant::now())),
            }
        }
    }

    /// Resident memory now and at its peak, in MiB.
    pub fn rss_mib(&self) -> Result<(f64, f64)> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        let kib = |key: &str| -> Result<f64> {
            let line = status
                .lines()
                .find(|l| l.starts_with(key))
                .ok_or_else(|| anyhow::anyhow!("{key} in /proc/<operator>/status"))?;
            Ok(line
                .split_whitespace()
                .nth(1)
                .ok_or_else(|| anyhow::anyhow!("{line}"))?
                .parse::<f64>()?)
        };
        Ok((kib("VmRSS:")? / 1024.0, kib("VmHWM:")? / 1024.0))
    }

    /// Whether it still runs.
    pub fn alive(&mut self) -> Result<()> {
        ensure!(
            self.child.try_wait()?.is_none(),
            "the operator exited; its log: {}",
            self.log.display()
        );
        Ok(())
    }
}

/// Stops the operator as a Deployment's rollout would: SIGTERM to the manager (to the `ballast`
/// process of its group, so that under a wrapper such as heaptrack the manager gets it, not the
/// wrapper, which would leave it running), then SIGKILL to the whole group after 15 s.
impl Drop for Operator {
    fn drop(&mut self) {
        let group = self.child.id().to_string();
        let _ = Command::new("pkill")
            .args(["-TERM", "-g", &group, "-x", "ballast"])
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{group}")])
            .status();
        let _ = self.child.wait();
    }
}

/// The value of label `key` in a series line of Prometheus text (empty when it has none).
fn label(line: &str, key: &str) -> String {
    let Some(start) = line.find(&format!("{key}=\"")) else {
        return String::new();
    };
    let rest = &line[start + key.len() + 2..];
    rest[..rest.find('"').unwrap_or(rest.len())].to_string()
}

/// `ballast_api_requests_total`, by `(verb, group, resource, code)`, but for the Lease.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Requests(pub BTreeMap<(String, String, String, String), u64>);

impl Requests {
    pub fn parse(metrics: &str) -> Self {
        Requests(
            metrics
                .lines()
                .filter(|l| l.starts_with("ballast_api_requests_total{"))
                // The leader renews its Lease every few seconds, whatever else it does.
                .filter(|l| !l.contains("resource=\"leases\""))
                .map(|l| {
                    let count = l
                        .rsplit(' ')
                        .next()
                        .and_then(|v| v.parse::<f64>().ok())
                        .unwrap_or(0.0) as u64;
                    let key = (
                        label(l, "verb"),
                        label(l, "group"),
                        label(l, "resource"),
                        label(l, "code"),
                    );
                    (key, count)
                })
                .collect(),
        )
    }

    /// What was counted since `before`, by `(verb, group, resource, code)`.
    pub fn since(&self, before: &Requests) -> BTreeMap<(String, String, String, String), u64> {
        self.0
            .iter()
            .map(|(k, v)| (k.clone(), v - before.0.get(k).copied().unwrap_or(0)))
            .filter(|(_, v)| *v > 0)
            .collect()
    }
}

/// `ballast_api_request_duration_seconds`: by `verb group/resource`, the seconds summed and the
/// requests timed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestSeconds(pub BTreeMap<String, (f64, f64)>);

impl RequestSeconds {
    pub fn parse(metrics: &str) -> Self {
        let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for l in metrics.lines() {
            let (series, which) = if let Some(r) =
                l.strip_prefix("ballast_api_request_duration_seconds_sum{")
            {
                (r, 0)
            } else if let Some(r) = l.strip_prefix("ballast_api_request_duration_seconds_count{") {
                (r, 1)
            } else {
                continue;
            };
            let label = |key: &str| label(series, key);
            let Some(value) = l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else {
                continue;
            };
            let group = label("group");
            let resource = label("resource");
            let gr = if group.is_empty() {
                resource
            } else {
                format!("{group}/{resource}")
            };
            let e = out.entry(format!("{} {gr}", label("verb"))).or_default();
            if which == 0 {
                e.0 += value;
            } else {
                e.1 += value;
            }
        }
        RequestSeconds(out)
    }

    /// The mean milliseconds of each kind of request made since `before`.
    pub fn mean_ms_since(&self, before: &RequestSeconds) -> BTreeMap<String, f64> {
        self.0
            .iter()
            .filter_map(|(k, (sum, count))| {
                let (s0, c0) = before.0.get(k).copied().unwrap_or_default();
                let n = count - c0;
                (n > 0.0).then(|| (k.clone(), (sum - s0) / n * 1000.0))
            })
            .collect()
    }
}

/// Requests of a delta but watches, and the same by `verb group/resource code`.
pub fn requests_but_watches(
    delta: &BTreeMap<(String, String, String, String), u64>,
) -> (u64, BTreeMap<String, u64>) {
    let total = delta
        .iter()
        .filter(|((verb, ..), _)| verb != "watch")
        .map(|(_, v)| v)
        .sum();
    let by_kind = delta
        .iter()
        .map(|((verb, group, resource, code), v)| {
            let gr = if group.is_empty() {
                resource.clone()
            } else {
                format!("{group}/{resource}")
            };
            (format!("{verb} {gr} {code}"), *v)
        })
        .collect();
    (total, by_kind)
}

/// "2 CPUs (model), 23 GiB".
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, usize::from);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_default();
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|k| k.parse::<f64>().ok())
        })
        .map_or(String::new(), |k| format!("{:.0} GiB", k / 1024.0 / 1024.0));
    format!("{cpus} CPUs ({model}), {mem}")
}

/// The load average of the machine (1, 5, 15 min), as /proc/loadavg says.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// The `q` quantile (0..=1) of `v` (sorted here), nearest rank.
pub fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let rank = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

/// The series of a /metrics page that `keep` (given each line) takes, by series as printed.
fn series(metrics: &str, keep: impl Fn(&str) -> bool) -> BTreeMap<String, f64> {
    metrics
        .lines()
        .filter(|l| keep(l))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// A controller's own counters of a /metrics page (reconciles, their errors by reason, workload
/// writes by outcome), by series as printed.
pub fn controller_counters(metrics: &str, controller: &str) -> BTreeMap<String, f64> {
    let label = format!("controller=\"{controller}\"");
    series(metrics, |l| {
        (l.starts_with("ballast_reconciles_total{")
            || l.starts_with("ballast_workload_writes_total{")
            || l.starts_with("ballast_reconcile_errors_total{"))
            && l.contains(&label)
    })
}

/// The operator's `ballast_watch_events_total` series (each watch's objects by event), from its
/// `/metrics` text.
pub fn watch_event_counters(metrics: &str) -> BTreeMap<String, f64> {
    series(metrics, |l| l.starts_with("ballast_watch_events_total{"))
}

/// `after - before`, series by series, without the unchanged ones.
pub fn delta(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v != 0.0)
        .collect()
}
