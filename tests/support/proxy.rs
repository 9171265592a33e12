//! The fault proxy: an HTTP reverse proxy of ours on 127.0.0.1 between the operator binary and
//! the local kube-apiserver, so that a test can inject the faults a real cluster has (a crash
//! right after a write, a lost response, throttling, slow watches, a partition) at an exact
//! point of the operator's own traffic.
//!
//! The operator speaks plain HTTP to the proxy with its ServiceAccount token (see
//! [`FaultProxy::operator_kubeconfig`]); the proxy forwards every request over TLS to the API
//! server, trusting the cluster CA, and passes the token through untouched, so the operator
//! keeps exactly its RBAC. Every request is recorded in order (method, path, status, fate).
//!
//! **Counted writes.** POST/PUT/PATCH/DELETE are writes. The write-numbered faults
//! ([`FaultProxy::kill_after_write`], [`FaultProxy::drop_response_of_write`],
//! [`FaultProxy::fail_next_writes`]) count only writes that reach the API server and are not
//! leader-election Lease renewals (which happen every few seconds whatever the operator is
//! doing, so they would make "the Nth write" a matter of timing); [`FaultProxy::count_writes_to`]
//! changes that. Write numbers are relative to the call that arms the fault.
//!
//! **A partition** ([`FaultProxy::blackhole`]) loses what it catches: a request that arrives
//! while it is on is never forwarded, a response that comes back while it is on is never
//! delivered, open watches stall; when it ends, all of those connections are closed (as a
//! client sees a connection reset), and new requests go through again.
//!
//! The proxy runs on a thread and a runtime of its own, so a test that blocks its own runtime
//! (kubectl, sleeps) does not stall the operator's traffic.

use bytes::Bytes;
use http_body_util::{Full, combinators::BoxBody};
use hyper::service::service_fn;
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client as HttpClient, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
};
use kube::{
    Config,
    client::ConfigExt,
    config::{KubeConfigOptions, Kubeconfig},
};
use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tokio::sync::watch;

use super::Cluster;

mod forward;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type ProxyBody = BoxBody<Bytes, BoxError>;
type WriteFilter = Arc<dyn Fn(&str, &str) -> bool + Send + Sync>;
type Upstream = HttpClient<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// What became of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Forwarded, and its response delivered (or, for a watch, being streamed).
    Forwarded,
    /// Forwarded and applied by the API server; the response was thrown away and the client's
    /// connection closed.
    ResponseDropped,
    /// Answered by the proxy with an injected status; never forwarded.
    Injected,
    /// Caught by a partition: never forwarded, or its response never delivered.
    Blackholed,
    /// Arrived after the write that a pending kill follows; never forwarded.
    Frozen,
    /// The API server could not be reached or its response could not be read.
    Failed(String),
}

/// One request as the proxy saw it.
#[derive(Clone, Debug)]
pub struct Exchange {
    /// Order of arrival, from 0.
    pub seq: usize,
    pub method: String,
    /// The path, without the query.
    pub path: String,
    pub query: String,
    /// The API server's status (or the injected one); `None` when none was seen.
    pub status: Option<u16>,
    /// The number of this write among the counted writes (see the module docs).
    pub write: Option<u64>,
    /// `metadata.name` of a POST's body (the path of a create does not name the object).
    pub name: Option<String>,
    pub watch: bool,
    pub fate: Fate,
    pub received: Instant,
    /// When it was sent to the API server.
    pub sent: Option<Instant>,
    /// When the API server's response headers came back.
    pub answered: Option<Instant>,
}

impl Exchange {
    pub fn is_write(&self) -> bool {
        forward::is_write_method(&self.method)
    }

    /// Whether the API server applied it (a 2xx from the server itself).
    pub fn applied(&self) -> bool {
        matches!(self.fate, Fate::Forwarded | Fate::ResponseDropped)
            && self.status.is_some_and(|s| (200..300).contains(&s))
    }

    /// The object a write addressed: the last path segment, or the name in a POST's body.
    pub fn object(&self) -> Option<&str> {
        if self.method == "POST" {
            self.name.as_deref()
        } else {
            self.path.rsplit('/').next()
        }
    }
}

/// Counts of what the proxy has seen.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts {
    pub total: usize,
    /// POST/PUT/PATCH/DELETE, whatever their fate.
    pub writes: usize,
    /// Writes that carry a write number.
    pub counted_writes: usize,
    /// GETs that are not watches (gets and lists).
    pub reads: usize,
    pub watches: usize,
    pub injected: usize,
    pub blackholed: usize,
    pub frozen: usize,
    pub responses_dropped: usize,
}

/// A kill the proxy carried out.
#[derive(Clone, Debug)]
pub struct Kill {
    pub pid: u32,
    pub after_write: u64,
    pub at: Instant,
}

struct State {
    log: Vec<Exchange>,
    /// Counted writes so far.
    writes: u64,
    /// Path substrings whose writes are not counted.
    uncounted: Vec<String>,
    /// `None` to count every write except `uncounted`; else only writes to these substrings.
    counted_only: Option<WriteFilter>,
    kill: Option<(u64, u32)>,
    kills: Vec<Kill>,
    drop_responses: BTreeSet<u64>,
    fail_requests: (u32, u16),
    fail_writes: (u32, u16),
    /// Delay of watch chunks, and until when it applies.
    watch_delay: Option<(Duration, Instant)>,
}

struct Shared {
    state: Mutex<State>,
    blackhole: watch::Sender<bool>,
    frozen: watch::Sender<bool>,
    upstream: Upstream,
    /// `https://host:port` of the API server.
    base: String,
    runtime: tokio::runtime::Handle,
}

/// A fault proxy in front of the local API server. Stops when dropped.
pub struct FaultProxy {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port in front of the cluster's API server.
    pub fn start(cluster: &Cluster) -> Self {
        let operator_kc = cluster.operator_kubeconfig();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("the fault proxy's runtime");
                rt.block_on(async move {
                    let (addr, shared) = serve(&operator_kc).await;
                    ready_tx.send((addr, shared)).unwrap();
                    let _ = stop_rx.await;
                });
                rt.shutdown_background();
            })
            .expect("starting the fault proxy thread");
        let (addr, shared) = ready_rx.recv().expect("the fault proxy started");
        Self {
            addr,
            shared,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// A kubeconfig for the operator that dials this proxy (plain HTTP on loopback) with the
    /// manager ServiceAccount's token from [`Cluster::operator_kubeconfig`].
    pub fn operator_kubeconfig(&self, cluster: &Cluster) -> PathBuf {
        let source = cluster.operator_kubeconfig();
        let path = source.with_file_name(format!(
            "operator-{}-proxy-{}.kubeconfig",
            std::process::id(),
            self.addr.port()
        ));
        write_proxied_kubeconfig(&source, &path, self.addr);
        path
    }

    /// The URL the operator dials.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// SIGKILLs `pid` right after the response of the `n`th counted write from now has been
    /// handed to the client. Requests that arrive after that write are never forwarded, so
    /// exactly `n` counted writes reach the API server before the process dies.
    pub fn kill_after_write(&self, n: u64, pid: u32) {
        assert!(n >= 1);
        let mut s = self.lock();
        s.kill = Some((s.writes + n, pid));
    }

    /// Whether a kill is armed and has not happened yet.
    pub fn kill_pending(&self) -> bool {
        self.lock().kill.is_some()
    }

    /// The kills carried out so far.
    pub fn kills(&self) -> Vec<Kill> {
        self.lock().kills.clone()
    }

    /// Forwards the `n`th counted write from now (the API server applies it) and closes the
    /// client's connection instead of answering.
    pub fn drop_response_of_write(&self, n: u64) {
        assert!(n >= 1);
        let mut s = self.lock();
        let at = s.writes + n;
        s.drop_responses.insert(at);
    }

    /// Answers the next `n` requests of any kind with `status` (429 carries `Retry-After: 1`)
    /// without forwarding them.
    pub fn fail_next(&self, n: u32, status: u16) {
        self.lock().fail_requests = (n, status);
    }

    /// Answers the next `n` countable writes with `status` without forwarding them.
    pub fn fail_next_writes(&self, n: u32, status: u16) {
        self.lock().fail_writes = (n, status);
    }

    /// Holds back every chunk of every watch stream that arrives in the next `period` until
    /// `delay` after it arrived (order is kept).
    pub fn delay_watch_events(&self, delay: Duration, period: Duration) {
        self.lock().watch_delay = Some((delay, Instant::now() + period));
    }

    /// Cancels every fault not carried out yet (a pending kill, dropped responses, injected
    /// answers, the watch delay); a partition stays as it is.
    pub fn disarm(&self) {
        let mut s = self.lock();
        s.kill = None;
        s.drop_responses.clear();
        s.fail_requests = (0, 0);
        s.fail_writes = (0, 0);
        s.watch_delay = None;
    }

    /// Turns a partition on or off (see the module docs).
    pub fn blackhole(&self, on: bool) {
        self.shared.blackhole.send_replace(on);
    }

    /// Counts only writes whose path contains one of `substrings` (instead of every write but
    /// Lease renewals).
    pub fn count_writes_to(&self, substrings: &[&str]) {
        let subs: Vec<String> = substrings.iter().map(|s| s.to_string()).collect();
        self.count_writes_where(move |_, path| subs.iter().any(|s| path.contains(s.as_str())));
    }

    /// Counts only the writes for which `f(method, path)` holds: a fault can then aim at one
    /// kind of write ("the first PATCH of the strategy object") whatever else is written.
    pub fn count_writes_where(&self, f: impl Fn(&str, &str) -> bool + Send + Sync + 'static) {
        self.lock().counted_only = Some(Arc::new(f));
    }

    /// Every request so far, in order of arrival.
    pub fn log(&self) -> Vec<Exchange> {
        self.lock().log.clone()
    }

    /// Every write so far (POST/PUT/PATCH/DELETE, counted or not), in order of arrival.
    pub fn writes(&self) -> Vec<Exchange> {
        self.lock()
            .log
            .iter()
            .filter(|e| e.is_write())
            .cloned()
            .collect()
    }

    /// The writes whose path contains `substring`.
    pub fn writes_to(&self, substring: &str) -> Vec<Exchange> {
        self.writes()
            .into_iter()
            .filter(|e| e.path.contains(substring))
            .collect()
    }

    /// The number of counted writes so far.
    pub fn counted_writes(&self) -> u64 {
        self.lock().writes
    }

    pub fn request_counts(&self) -> RequestCounts {
        let s = self.lock();
        let mut c = RequestCounts {
            total: s.log.len(),
            ..Default::default()
        };
        for e in &s.log {
            if e.is_write() {
                c.writes += 1;
            } else if e.watch {
                c.watches += 1;
            } else if e.method == "GET" {
                c.reads += 1;
            }
            if e.write.is_some() {
                c.counted_writes += 1;
            }
            match e.fate {
                Fate::Injected => c.injected += 1,
                Fate::Blackholed => c.blackholed += 1,
                Fate::Frozen => c.frozen += 1,
                Fate::ResponseDropped => c.responses_dropped += 1,
                _ => {}
            }
        }
        c
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Writes `source` (a kubeconfig with one cluster) to `dest` with its server replaced by the
/// proxy's plain-HTTP address; the credentials stay as they are.
fn write_proxied_kubeconfig(source: &Path, dest: &Path, addr: SocketAddr) {
    let text = std::fs::read_to_string(source).expect("reading the operator kubeconfig");
    let mut kc: serde_yaml::Value = serde_yaml::from_str(&text).expect("a kubeconfig");
    let clusters = kc["clusters"]
        .as_sequence_mut()
        .expect("kubeconfig clusters");
    for c in clusters {
        let cluster = c["cluster"].as_mapping_mut().expect("a cluster entry");
        cluster.insert("server".into(), format!("http://{addr}").into());
        cluster.remove("certificate-authority-data");
        cluster.remove("certificate-authority");
    }
    std::fs::write(dest, serde_yaml::to_string(&kc).unwrap()).expect("writing a kubeconfig");
}

async fn serve(operator_kc: &Path) -> (SocketAddr, Arc<Shared>) {
    let kc = Kubeconfig::read_from(operator_kc).expect("reading the operator kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("loading the operator kubeconfig");
    assert_eq!(
        config.cluster_url.host(),
        Some("127.0.0.1"),
        "the proxy only ever dials loopback"
    );
    let base = config
        .cluster_url
        .to_string()
        .trim_end_matches('/')
        .to_string();
    let connector = config
        .rustls_https_connector()
        .expect("a TLS connector trusting the cluster CA");
    let upstream = HttpClient::builder(TokioExecutor::new()).build(connector);
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            log: vec![],
            writes: 0,
            // Leader election (coordination.k8s.io holds only Leases).
            uncounted: vec!["/apis/coordination.k8s.io/".into()],
            counted_only: None,
            kill: None,
            kills: vec![],
            drop_responses: BTreeSet::new(),
            fail_requests: (0, 0),
            fail_writes: (0, 0),
            watch_delay: None,
        }),
        blackhole: watch::channel(false).0,
        frozen: watch::channel(false).0,
        upstream,
        base,
        runtime: tokio::runtime::Handle::current(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding the fault proxy");
    let addr = listener.local_addr().unwrap();
    let accept = shared.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let shared = accept.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| forward::handle(shared.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, shared)
}
