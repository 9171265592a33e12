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
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::{
    Request, Response, StatusCode,
    body::{Frame, Incoming},
    header::{self, HeaderMap, HeaderValue},
    service::service_fn,
};
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
use tokio::sync::{mpsc, watch};

use super::Cluster;

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
        is_write_method(&self.method)
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
                let service = service_fn(move |req| handle(shared.clone(), req));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, shared)
}

fn is_write_method(m: &str) -> bool {
    matches!(m, "POST" | "PUT" | "PATCH" | "DELETE")
}

fn is_watch(query: &str) -> bool {
    query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1")
}

/// What to do with a request, decided when it arrives.
enum Plan {
    Forward {
        drop_response: bool,
        kill: Option<u32>,
    },
    Inject(u16),
    Blackhole,
    Freeze,
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<ProxyBody>, BoxError> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let method = parts.method.to_string();
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or_default().to_string();
    let watch = is_watch(&query);
    let write = is_write_method(&method);
    let name = (method == "POST")
        .then(|| serde_json::from_slice::<serde_json::Value>(&body).ok())
        .flatten()
        .and_then(|v| v["metadata"]["name"].as_str().map(str::to_string));

    let (seq, plan) = {
        let mut s = shared.state.lock().unwrap();
        let seq = s.log.len();
        let countable = write
            && match &s.counted_only {
                Some(f) => f(&method, &path),
                None => !s.uncounted.iter().any(|p| path.contains(p.as_str())),
            };
        let mut number = None;
        let plan = if *shared.frozen.borrow() {
            Plan::Freeze
        } else if *shared.blackhole.borrow() {
            Plan::Blackhole
        } else if s.fail_requests.0 > 0 {
            s.fail_requests.0 -= 1;
            Plan::Inject(s.fail_requests.1)
        } else if countable && s.fail_writes.0 > 0 {
            s.fail_writes.0 -= 1;
            Plan::Inject(s.fail_writes.1)
        } else {
            let mut kill = None;
            let mut drop_response = false;
            if countable {
                s.writes += 1;
                let n = s.writes;
                number = Some(n);
                drop_response = s.drop_responses.remove(&n);
                if let Some((at, pid)) = s.kill
                    && at == n
                {
                    kill = Some(pid);
                    // Nothing after this write may reach the server before the kill.
                    shared.frozen.send_replace(true);
                }
            }
            Plan::Forward {
                drop_response,
                kill,
            }
        };
        let fate = match plan {
            Plan::Inject(_) => Fate::Injected,
            Plan::Blackhole => Fate::Blackholed,
            Plan::Freeze => Fate::Frozen,
            Plan::Forward { .. } => Fate::Forwarded,
        };
        s.log.push(Exchange {
            seq,
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            status: match plan {
                Plan::Inject(code) => Some(code),
                _ => None,
            },
            write: number,
            name,
            watch,
            fate,
            received: Instant::now(),
            sent: None,
            answered: None,
        });
        (seq, plan)
    };

    let (drop_response, kill) = match plan {
        Plan::Freeze => {
            let mut rx = shared.frozen.subscribe();
            let _ = rx.wait_for(|f| !*f).await;
            return Err("held back until the kill, then dropped".into());
        }
        Plan::Blackhole => {
            lift_of_blackhole(&shared).await;
            return Err("lost in a partition".into());
        }
        Plan::Inject(code) => return Ok(injected(code)),
        Plan::Forward {
            drop_response,
            kill,
        } => (drop_response, kill),
    };
    // Fires the kill when dropped: with the response body once it has been written, or on any
    // early return below.
    let kill_guard = kill.map(|pid| KillOnDrop {
        shared: shared.clone(),
        pid,
        after_write: shared.state.lock().unwrap().log[seq].write.unwrap_or(0),
    });

    let mut up = Request::builder().method(parts.method).uri(format!(
        "{}{}",
        shared.base,
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
    ));
    *up.headers_mut().unwrap() = forwarded_headers(&parts.headers);
    let up = up.body(Full::new(body))?;
    set(&shared, seq, |e| e.sent = Some(Instant::now()));
    let resp = match shared.upstream.request(up).await {
        Ok(r) => r,
        Err(e) => {
            let msg = format!("{e:?}");
            set(&shared, seq, |e| e.fate = Fate::Failed(msg.clone()));
            return Err(msg.into());
        }
    };
    let status = resp.status().as_u16();
    set(&shared, seq, |e| {
        e.status = Some(status);
        e.answered = Some(Instant::now());
    });
    let (parts, body) = resp.into_parts();
    let mut out = Response::builder().status(parts.status);
    *out.headers_mut().unwrap() = forwarded_headers(&parts.headers);

    if watch && parts.status.is_success() {
        return Ok(out.body(watch_body(shared.clone(), body))?);
    }
    let bytes = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let msg = format!("{e:?}");
            set(&shared, seq, |e| e.fate = Fate::Failed(msg.clone()));
            return Err(msg.into());
        }
    };
    if *shared.blackhole.borrow() {
        set(&shared, seq, |e| e.fate = Fate::Blackholed);
        lift_of_blackhole(&shared).await;
        return Err("response lost in a partition".into());
    }
    if drop_response {
        set(&shared, seq, |e| e.fate = Fate::ResponseDropped);
        return Err("response dropped".into());
    }
    let body = Full::new(bytes).map_err(|never| match never {});
    let body = match kill_guard {
        Some(guard) => body
            .map_frame(move |f| {
                let _ = &guard;
                f
            })
            .boxed(),
        None => body.boxed(),
    };
    Ok(out.body(body)?)
}

fn set(shared: &Shared, seq: usize, f: impl FnOnce(&mut Exchange)) {
    f(&mut shared.state.lock().unwrap().log[seq]);
}

/// Waits until a partition that is on now has ended.
async fn lift_of_blackhole(shared: &Shared) {
    let mut rx = shared.blackhole.subscribe();
    let _ = rx.wait_for(|on| !*on).await;
}

/// Headers to pass on, less the hop-by-hop ones (hyper frames each side itself).
fn forwarded_headers(h: &HeaderMap) -> HeaderMap {
    let mut out = h.clone();
    for name in [
        header::HOST,
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::CONTENT_LENGTH,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
    ] {
        out.remove(name);
    }
    out.remove("keep-alive");
    out
}

/// An API-server-shaped failure: a `Status` object with the code's reason.
fn injected(code: u16) -> Response<ProxyBody> {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let reason = match code {
        429 => "TooManyRequests",
        409 => "Conflict",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    };
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!("injected by the fault proxy: {code}"),
        "reason": reason, "details": {"retryAfterSeconds": 1}, "code": code,
    });
    let mut resp = Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json");
    if code == 429 || code == 503 {
        resp = resp.header(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp.body(
        Full::new(Bytes::from(body.to_string()))
            .map_err(|never| match never {})
            .boxed(),
    )
    .unwrap()
}

/// A watch response: chunks are read from the server as they come and delivered in order, each
/// no earlier than the watch delay in force when it arrived; a partition stalls the stream and,
/// when it ends, cuts it.
fn watch_body(shared: Arc<Shared>, mut upstream: Incoming) -> ProxyBody {
    let (tx, rx) =
        mpsc::unbounded_channel::<(tokio::time::Instant, Result<Frame<Bytes>, BoxError>)>();
    let reader = shared.clone();
    tokio::spawn(async move {
        loop {
            let item = upstream.frame().await;
            let due = {
                let now = Instant::now();
                let s = reader.state.lock().unwrap();
                match s.watch_delay {
                    Some((delay, until)) if now < until => now + delay,
                    _ => now,
                }
            };
            let due = tokio::time::Instant::from_std(due);
            let last = !matches!(item, Some(Ok(_)));
            let sent = match item {
                Some(Ok(f)) => tx.send((due, Ok(f))),
                Some(Err(e)) => tx.send((due, Err(e.into()))),
                None => break,
            };
            if sent.is_err() || last {
                break;
            }
        }
    });
    let stream = futures::stream::unfold(
        (rx, shared.blackhole.subscribe()),
        |(mut rx, mut bh)| async move {
            // A partition while waiting for the next chunk, or while holding it back: stall,
            // then cut the stream.
            let cut = |mut bh: watch::Receiver<bool>| async move {
                let _ = bh.wait_for(|on| *on).await;
                let _ = bh.wait_for(|on| !*on).await;
            };
            let item = tokio::select! {
                item = rx.recv() => item?,
                _ = cut(bh.clone()) => return Some((Err::<Frame<Bytes>, BoxError>("watch cut by a partition".into()), (rx, bh))),
            };
            let (due, frame) = item;
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = cut(bh.clone()) => return Some((Err("watch cut by a partition".into()), (rx, bh))),
            }
            if *bh.borrow_and_update() {
                cut(bh.clone()).await;
                return Some((Err("watch cut by a partition".into()), (rx, bh)));
            }
            Some((frame, (rx, bh)))
        },
    );
    BodyExt::boxed(StreamBody::new(stream))
}

/// Kills the process when dropped, then lets held-back requests go (to be dropped: their
/// client is dead).
struct KillOnDrop {
    shared: Arc<Shared>,
    pid: u32,
    after_write: u64,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let (shared, pid, after_write) = (self.shared.clone(), self.pid, self.after_write);
        shared.runtime.clone().spawn(async move {
            // The response bytes are with hyper now; let them reach the socket.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = tokio::process::Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status()
                .await;
            // Until the process is gone (or a zombie), nothing of it may pass.
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && alive(pid) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            {
                let mut s = shared.state.lock().unwrap();
                s.kill = None;
                s.kills.push(Kill {
                    pid,
                    after_write,
                    at: Instant::now(),
                });
            }
            shared.frozen.send_replace(false);
        });
    }
}

/// Whether `pid` still runs (a zombie does not).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}
