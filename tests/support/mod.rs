//! Test support for integration and end-to-end tests: the local control
//! plane (started once per test process, or reused when it is healthy), a
//! namespace per test that is deleted afterwards, the real operator binary
//! run under the ServiceAccount that `config/` creates, and polling helpers.
//!
//! A test that needs the cluster never passes without one: when the control
//! plane binaries are missing it fails with the command that builds them.
#![allow(dead_code)]

pub mod faults;
pub mod proxy;
pub mod rollout;
pub mod spread;

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client, Config,
    api::{DeleteParams, ObjectMeta, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    sync::{Mutex, Once},
    time::{Duration, Instant},
};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A Go tool the tests run (`helm`, `promtool`), built from its Go module and cached by version
/// by hack/build-tool.sh. Panics (the test fails, never skips) when it cannot be built.
pub fn go_tool(name: &str) -> PathBuf {
    let out = Command::new(repo_root().join("hack/build-tool.sh"))
        .arg(name)
        .stdin(Stdio::null())
        .output()
        .expect("running hack/build-tool.sh");
    assert!(
        out.status.success(),
        "{name} could not be built (hack/build-tool.sh {name}):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn state_dir() -> PathBuf {
    std::env::var_os("BALLAST_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cluster"))
}

/// The local cluster, as a test sees it.
#[derive(Clone)]
pub struct Cluster {
    pub client: Client,
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
    /// Its state directory (`BALLAST_CLUSTER_DIR` of the hack/ scripts): logs of the
    /// operators the tests start go under `logs/`.
    pub dir: PathBuf,
}

static CLUSTER_UP: Once = Once::new();
static INSTALLED: Once = Once::new();

/// Ensures the local control plane is up (starting it if needed) and returns
/// an admin client for it.
pub async fn cluster() -> Cluster {
    CLUSTER_UP.call_once(|| {
        let root = repo_root();
        let check = Command::new(root.join("hack/cluster-up.sh"))
            .arg("--check")
            .output();
        if check.is_ok_and(|o| o.status.success()) {
            return;
        }
        let out = Command::new(root.join("hack/cluster-up.sh"))
            .output()
            .expect("running hack/cluster-up.sh");
        if !out.status.success() {
            panic!(
                "the local control plane could not be started.\n\
                 If its binaries are missing, build them with `make cluster-build` \
                 (a cold build takes about half an hour on 2 cores; `make test` does it for you).\n\
                 hack/cluster-up.sh said:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    });
    Cluster::of_dir(state_dir()).await
}

/// A cluster of its own: started (or reused when healthy) by hack/cluster-up.sh in `dir` with
/// `env` (the `BALLAST_*_PORT` of the scripts), for tests that disturb the control plane and so
/// must not share the cluster of [`cluster`]. Panics, never skips, when it cannot be started.
/// [`Cluster::stop`] stops it again.
pub async fn own_cluster(dir: &Path, env: &[(String, String)]) -> Cluster {
    let out = Command::new(repo_root().join("hack/cluster-up.sh"))
        .env("BALLAST_CLUSTER_DIR", dir)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .output()
        .expect("running hack/cluster-up.sh");
    if !out.status.success() {
        // Whatever it did start goes again.
        let _ = Command::new(repo_root().join("hack/cluster-down.sh"))
            .env("BALLAST_CLUSTER_DIR", dir)
            .stdin(Stdio::null())
            .output();
    }
    assert!(
        out.status.success(),
        "the cluster in {} could not be started (ports {env:?}).\n\
         If the control plane binaries are missing, build them with `make cluster-build`.\n\
         hack/cluster-up.sh said:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Cluster::of_dir(dir.to_path_buf()).await
}

impl Cluster {
    async fn of_dir(dir: PathBuf) -> Self {
        let kubeconfig = dir.join("kubeconfig");
        let kubectl = dir.join("bin/kubectl");
        let client = client_for(&kubeconfig).await;
        Cluster {
            client,
            kubeconfig,
            kubectl,
            dir,
        }
    }

    /// Runs `hack/cluster-ctl.sh <action> <component>` on this cluster (stop, start or restart
    /// one control plane process; start returns once it is healthy) and panics unless it
    /// succeeds.
    #[track_caller]
    pub fn ctl(&self, action: &str, component: &str) {
        self.ctl_with(action, component, "");
    }

    /// [`Cluster::ctl`] with `extra` flags for this start only (`BALLAST_EXTRA_ARGS`).
    #[track_caller]
    pub fn ctl_with(&self, action: &str, component: &str, extra: &str) {
        let out = Command::new(repo_root().join("hack/cluster-ctl.sh"))
            .env("BALLAST_CLUSTER_DIR", &self.dir)
            .env("BALLAST_EXTRA_ARGS", extra)
            .args([action, component])
            .stdin(Stdio::null())
            .output()
            .expect("running hack/cluster-ctl.sh");
        assert!(
            out.status.success(),
            "hack/cluster-ctl.sh {action} {component} ({extra}) failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Forgets the operator kubeconfig of this process (its ServiceAccount was deleted, e.g. by
    /// an uninstall), so the next [`Cluster::operator_kubeconfig`] makes a new one.
    pub fn forget_operator_kubeconfig(&self) {
        let _ = std::fs::remove_file(
            self.dir
                .join(format!("operator-{}.kubeconfig", std::process::id())),
        );
    }

    /// Stops the cluster and removes its state (hack/cluster-down.sh).
    pub fn stop(&self) {
        let out = Command::new(repo_root().join("hack/cluster-down.sh"))
            .env("BALLAST_CLUSTER_DIR", &self.dir)
            .stdin(Stdio::null())
            .output()
            .expect("running hack/cluster-down.sh");
        if !out.status.success() {
            eprintln!(
                "hack/cluster-down.sh failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// A client for the cluster behind `kubeconfig`.
pub async fn client_for(kubeconfig: &Path) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("reading the kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("loading the kubeconfig");
    assert!(
        config.cluster_url.host() == Some("127.0.0.1"),
        "tests only ever dial loopback, not {}",
        config.cluster_url
    );
    Client::try_from(config).expect("building a client")
}

impl Cluster {
    /// Runs kubectl against the cluster; returns its output whatever the exit code.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_stdin(args, None)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut cmd = Command::new(&self.kubectl);
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .current_dir(repo_root());
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawning kubectl");
        if let Some(input) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        child.wait_with_output().expect("waiting for kubectl")
    }

    /// Runs kubectl and panics with its stderr unless it succeeds; returns stdout.
    #[track_caller]
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {} failed:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Applies YAML in `namespace` and panics unless it is accepted.
    #[track_caller]
    pub fn apply_yaml(&self, namespace: &str, yaml: &str) -> String {
        let out = self.kubectl_stdin(&["apply", "-n", namespace, "-f", "-"], Some(yaml));
        assert!(
            out.status.success(),
            "kubectl apply failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Installs `config/default` (CRDs, RBAC, the manager's namespace and
    /// ServiceAccount) once per test process and waits for the CRDs.
    pub fn install(&self) {
        INSTALLED.call_once(|| {
            self.kubectl_ok(&[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-k",
                "config/default",
            ]);
            self.kubectl_ok(&[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd/spreadpolicies.ballast.dev",
                "crd/rolloutstrategies.ballast.dev",
                "crd/clusterspreadpolicies.ballast.dev",
            ]);
            // The API server takes up admission policies within a second.
            std::thread::sleep(Duration::from_secs(2));
        });
    }

    /// A kubeconfig that authenticates as the manager's ServiceAccount from
    /// `config/` (a TokenRequest token), so the operator runs with exactly
    /// the RBAC users deploy, not as admin.
    pub fn operator_kubeconfig(&self) -> PathBuf {
        static LOCK: Mutex<()> = Mutex::new(());
        let _guard = LOCK.lock().unwrap();
        self.install();
        let path = self
            .dir
            .join(format!("operator-{}.kubeconfig", std::process::id()));
        if path.exists() {
            return path;
        }
        let token = self.kubectl_ok(&[
            "create",
            "token",
            "ballast-controller-manager",
            "-n",
            "ballast-system",
            "--duration=6h",
        ]);
        let server = self.kubectl_ok(&[
            "config",
            "view",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ]);
        let ca = self.kubectl_ok(&[
            "config",
            "view",
            "--raw",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.certificate-authority-data}",
        ]);
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\n\
             users:\n- name: ballast\n  user:\n    token: {}\ncontexts:\n- name: ballast\n  context: {{cluster: local, user: ballast, namespace: ballast-system}}\n\
             current-context: ballast\n",
            token.trim()
        );
        std::fs::write(&path, yaml).expect("writing the operator kubeconfig");
        path
    }
}

/// A namespace of one test, deleted when dropped.
pub struct TestNamespace {
    pub name: String,
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl TestNamespace {
    /// Creates `<prefix>-<random>`, labelled as a test namespace.
    pub async fn new(cluster: &Cluster, prefix: &str) -> Self {
        let name = format!("{prefix}-{}", random_suffix());
        let api: Api<Namespace> = Api::all(cluster.client.clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("ballast.dev/test".to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &ns)
            .await
            .expect("creating the test namespace");
        // The default ServiceAccount appears shortly after the namespace;
        // pods are rejected until it exists.
        let sa: Api<k8s_openapi::api::core::v1::ServiceAccount> =
            Api::namespaced(cluster.client.clone(), &name);
        wait_until(
            "the default ServiceAccount",
            Duration::from_secs(30),
            || async { sa.get_opt("default").await.ok().flatten() },
        )
        .await;
        Self {
            name,
            kubectl: cluster.kubectl.clone(),
            kubeconfig: cluster.kubeconfig.clone(),
        }
    }

    pub async fn delete(&self, client: &Client) {
        let api: Api<Namespace> = Api::all(client.clone());
        let _ = api.delete(&self.name, &DeleteParams::background()).await;
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        if std::env::var_os("BALLAST_KEEP_NAMESPACES").is_some() {
            eprintln!("keeping test namespace {}", self.name);
            return;
        }
        let kubectl = |args: &[&str]| {
            Command::new(&self.kubectl)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args)
                .stdin(Stdio::null())
                .output()
        };
        // The test's operator may be gone before it released its
        // finalizers: take them off, or the namespace would hang in
        // Terminating. Again after the delete, in case an operator that was
        // still running added one back (none does to an object being deleted).
        let strip = |timeout: Duration| {
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                let Ok(out) = kubectl(&[
                    "get",
                    "spreadpolicies,rolloutstrategies",
                    "-n",
                    &self.name,
                    "-o",
                    r#"jsonpath={range .items[?(@.metadata.finalizers)]}{.kind}/{.metadata.name}{"\n"}{end}"#,
                ]) else {
                    return;
                };
                let held: Vec<String> = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter(|l| !l.is_empty())
                    .map(String::from)
                    .collect();
                if held.is_empty() {
                    return;
                }
                for obj in &held {
                    let _ = kubectl(&[
                        "patch",
                        obj,
                        "-n",
                        &self.name,
                        "--type=merge",
                        "-p",
                        r#"{"metadata":{"finalizers":null}}"#,
                    ]);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        };
        strip(Duration::from_secs(5));
        let _ = kubectl(&[
            "delete",
            "namespace",
            &self.name,
            "--wait=false",
            "--ignore-not-found",
        ]);
        strip(Duration::from_secs(5));
    }
}

pub fn random_suffix() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    format!("{:08x}", h.finish() as u32)
}

/// Polls `f` every 250 ms until it returns `Some`, or panics after `timeout`
/// naming `what`. Only tests poll; the operator is woken by watches.
#[track_caller]
pub fn wait_until<'a, T, F, Fut>(
    what: &'a str,
    timeout: Duration,
    mut f: F,
) -> impl Future<Output = T> + 'a
where
    F: FnMut() -> Fut + 'a,
    Fut: Future<Output = Option<T>> + 'a,
{
    let caller = std::panic::Location::caller();
    async move {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = f().await {
                return v;
            }
            if Instant::now() > deadline {
                panic!("timed out after {timeout:?} waiting for {what} (at {caller})");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// The operator binary, running against the local cluster as the manager's
/// ServiceAccount and watching one namespace. Killed when dropped.
pub struct Operator {
    child: Option<Child>,
    pub log: PathBuf,
    pub http_port: u16,
}

impl Operator {
    /// Starts `ballast` for `namespace` with its own leader Lease
    /// (`ballast-<namespace>` in ballast-system).
    pub fn start(cluster: &Cluster, namespace: &str) -> Self {
        Self::start_with(cluster, namespace, &format!("ballast-{namespace}"), &[])
    }

    pub fn start_with(cluster: &Cluster, namespace: &str, lease: &str, extra: &[&str]) -> Self {
        Self::start_logged(
            &cluster.operator_kubeconfig(),
            &cluster.dir.join("logs"),
            namespace,
            lease,
            extra,
        )
    }

    /// Starts `ballast` with `kubeconfig` (e.g. one that dials a fault proxy).
    pub fn start_with_kubeconfig(
        kubeconfig: &Path,
        namespace: &str,
        lease: &str,
        extra: &[&str],
    ) -> Self {
        Self::start_logged(
            kubeconfig,
            &state_dir().join("logs"),
            namespace,
            lease,
            extra,
        )
    }

    fn start_logged(
        kubeconfig: &Path,
        logs: &Path,
        namespace: &str,
        lease: &str,
        extra: &[&str],
    ) -> Self {
        let http_port = free_port();
        let log = logs.join(format!("operator-{namespace}-{http_port}.log"));
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        let file = std::fs::File::create(&log).expect("creating the operator log");
        let child = Command::new(env!("CARGO_BIN_EXE_ballast"))
            .env("KUBECONFIG", kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("BALLAST_TEST_LOG").unwrap_or_else(|_| "info,ballast=debug".into()),
            )
            .args([
                "--http-addr",
                &format!("127.0.0.1:{http_port}"),
                "--watch-namespace",
                namespace,
                "--lease-namespace",
                "ballast-system",
                "--lease-name",
                lease,
            ])
            .args(gate_args(extra))
            .args(extra)
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .expect("starting the operator");
        Self {
            child: Some(child),
            log,
            http_port,
        }
    }

    /// What the operator has logged so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// SIGKILL: no graceful shutdown, no Lease release.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits for a graceful exit; returns the exit status.
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(Some(status)) = c.try_wait() {
                return Some(status);
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                return c.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// GETs a path of the operator's HTTP server on loopback.
    pub async fn http_get(&self, path: &str) -> Option<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.http_port))
            .await
            .ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.ok()?;
        let code = buf.split_whitespace().nth(1)?.parse().ok()?;
        let body = buf
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Some((code, body))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How the operators of this test run hold governed Deployments: `BALLAST_TEST_GATE`
/// (`admission`, the default, or `pause-at-rest`), passed as `--gate`. `make test` runs the
/// RolloutStrategy tests once in each mode.
pub fn test_gate() -> String {
    std::env::var("BALLAST_TEST_GATE").unwrap_or_else(|_| "admission".into())
}

/// Whether the operators of this test run use the admission gate (not paused at rest).
pub fn admission() -> bool {
    test_gate() != "pause-at-rest"
}

/// `--gate=<test_gate()>`, unless the test chose one itself.
fn gate_args(extra: &[&str]) -> Vec<String> {
    if extra.iter().any(|a| a.starts_with("--gate")) {
        return vec![];
    }
    vec![format!("--gate={}", test_gate())]
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `ballast_watch_events_total` of a /metrics page for `watch` (`controller/resource`): the
/// objects it received as `event` (`list`, `apply`, `delete`), or of every event when `None`.
pub fn watch_events(metrics: &str, watch: &str, event: Option<&str>) -> f64 {
    let prefix = match event {
        Some(event) => {
            format!("ballast_watch_events_total{{watch=\"{watch}\",event=\"{event}\"}} ")
        }
        None => format!("ballast_watch_events_total{{watch=\"{watch}\","),
    };
    metrics
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("a number at the end of {l}"))
        })
        .sum()
}

/// `ballast_api_requests_total` of a /metrics page, one `((verb, group, resource, code), count)`
/// per sample.
pub fn api_requests(metrics: &str) -> Vec<((String, String, String, String), u64)> {
    let label = |line: &str, key: &str| -> String {
        let start = line
            .find(&format!("{key}=\""))
            .unwrap_or_else(|| panic!("{key} in {line}"))
            + key.len()
            + 2;
        line[start..][..line[start..].find('"').unwrap()].to_string()
    };
    metrics
        .lines()
        .filter(|l| l.starts_with("ballast_api_requests_total{"))
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
        .collect()
}
