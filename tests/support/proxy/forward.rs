//! How the fault proxy handles one request: decide its fate when it arrives (forward, inject,
//! hold back), forward it over TLS, and deliver (or drop, or delay) what comes back.

use super::{BoxError, Exchange, Fate, Kill, ProxyBody, Shared};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::{
    Request, Response, StatusCode,
    body::{Frame, Incoming},
    header::{self, HeaderMap, HeaderValue},
};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::sync::{mpsc, watch};

pub(super) fn is_write_method(m: &str) -> bool {
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

pub(super) async fn handle(
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
