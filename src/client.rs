//! The manager's one Kubernetes client: kube's default stack (auth, retries of 429/503/504),
//! inside a deadline for every request that is not a stream, inside the request counter of
//! [`crate::metrics::api`].
//!
//! The deadline is why a blackholed API server never hangs a reconcile: it bounds the whole
//! request (kube's retries included) from sending to the last byte of the body. It is a layer
//! rather than kube's `Config::read_timeout` because that one is an idle timeout on the
//! connection, shared by watches: a watch quieter than it (the API server sends a bookmark
//! about once a minute) would be cut and re-established over and over, which is traffic in
//! steady state, while a trickling answer would never hit it. Watches (`watch=true`) and
//! followed logs (`follow=true`) are left alone here; kube-runtime's watcher gives each watch
//! its own idle limit (its `timeoutSeconds`, 290 s by default, plus 5 s) and then reconnects.

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use kube::{Client, Config, client::ClientBuilder};
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};
use tokio::time::{Instant, Sleep};
use tower_layer::Layer;
use tower_service::Service;

use crate::metrics::Metrics;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The default limit of one request that is not a watch.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// A client for `config` with the request deadline and the request metrics.
pub fn build(config: Config, metrics: &Metrics, timeout: Duration) -> kube::Result<Client> {
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&DeadlineLayer { timeout })
        .with_layer(&metrics.api_layer())
        .build())
}

/// [`build`] without kube's retries: each request is sent once. For the Eviction API, whose 429
/// means "a PodDisruptionBudget does not allow it now" (kube would retry it for minutes).
pub fn build_once(
    mut config: Config,
    metrics: &Metrics,
    timeout: Duration,
) -> kube::Result<Client> {
    config.default_retry = false;
    build(config, metrics, timeout)
}

/// A request that got no complete answer within its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the API server did not answer within {0:?}")]
pub struct TimedOut(pub Duration);

/// Puts a deadline on every request that is not a stream.
#[derive(Clone, Debug)]
pub struct DeadlineLayer {
    pub timeout: Duration,
}

impl<S> Layer<S> for DeadlineLayer {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Deadline {
            inner,
            timeout: self.timeout,
        }
    }
}

pub struct Deadline<S> {
    inner: S,
    timeout: Duration,
}

/// Watches and followed logs stream for as long as they last.
fn is_stream<B>(req: &Request<B>) -> bool {
    req.uri().query().is_some_and(|q| {
        q.split('&')
            .any(|kv| matches!(kv, "watch=true" | "watch=1" | "follow=true" | "follow=1"))
    })
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for Deadline<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<DeadlineBody<ResB>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let timeout = self.timeout;
        let bounded = !is_stream(&req);
        let response = self.inner.call(req);
        Box::pin(async move {
            if !bounded {
                let r = response.await.map_err(Into::into)?;
                return Ok(r.map(|inner| DeadlineBody {
                    inner,
                    deadline: None,
                    timeout,
                }));
            }
            let deadline = Instant::now() + timeout;
            match tokio::time::timeout_at(deadline, response).await {
                Err(_) => Err(TimedOut(timeout).into()),
                Ok(Err(e)) => Err(e.into()),
                Ok(Ok(r)) => Ok(r.map(|inner| DeadlineBody {
                    inner,
                    deadline: Some(Box::pin(tokio::time::sleep_until(deadline))),
                    timeout,
                })),
            }
        })
    }
}

/// A response body that fails once the request's deadline has passed.
pub struct DeadlineBody<B> {
    inner: B,
    deadline: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
}

impl<B> Body for DeadlineBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(d) = this.deadline.as_mut()
            && d.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Some(Err(TimedOut(this.timeout).into())));
        }
        Pin::new(&mut this.inner)
            .poll_frame(cx)
            .map(|f| f.map(|r| r.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::Api;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A server that answers `/version` and lists at once, and never answers anything else.
    async fn half_dead_server() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let line = head.lines().next().unwrap_or_default().to_string();
                let body = if line.contains("watch=true") {
                    // Headers, then one event, then silence: a quiet watch.
                    let ev = r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"2"}}}"#;
                    let _ = s
                        .write_all(
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{ev}\n\r\n",
                                ev.len() + 1
                            )
                            .as_bytes(),
                        )
                        .await;
                    held.push(s);
                    continue;
                } else if line.starts_with("GET /version") {
                    r#"{"major":"1","minor":"36","gitVersion":"v1.36.0"}"#.to_string()
                } else {
                    held.push(s);
                    continue;
                };
                let _ = s
                    .write_all(
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        )
                        .as_bytes(),
                    )
                    .await;
                held.push(s);
            }
        });
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn a_request_the_api_server_never_answers_fails_at_its_deadline_and_is_counted() {
        let url = half_dead_server().await;
        let metrics = Metrics::default();
        let client = build(
            Config::new(url.parse().unwrap()),
            &metrics,
            Duration::from_millis(300),
        )
        .unwrap();
        client.apiserver_version().await.expect("answered at once");
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
        let started = std::time::Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(5), api.get("cm"))
            .await
            .expect("bounded by the client, not by this test")
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2), "{err}");
        let text = metrics.render();
        assert!(
            text.contains(
                r#"ballast_api_requests_total{verb="get",group="",resource="configmaps",code="timeout"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"verb="get",group="",resource="/version",code="200"} 1"#),
            "{text}"
        );
        // Timed too, to the deadline: in the 0.5 s bucket, not in the 0.25 s one.
        let bucket = |le: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with("ballast_api_request_duration_seconds_bucket{")
                        && l.contains(r#"verb="get",group="",resource="configmaps""#)
                        && l.contains(&format!("le=\"{le}\""))
                })
                .and_then(|l| l.rsplit(' ').next())
                .map(str::to_string)
        };
        assert_eq!(bucket("0.25").as_deref(), Some("0"), "{text}");
        assert_eq!(bucket("0.5").as_deref(), Some("1"), "{text}");
    }

    #[tokio::test]
    async fn a_quiet_watch_outlives_the_deadline() {
        use futures::StreamExt;
        let url = half_dead_server().await;
        let metrics = Metrics::default();
        let client = build(
            Config::new(url.parse().unwrap()),
            &metrics,
            Duration::from_millis(200),
        )
        .unwrap();
        let api: Api<ConfigMap> = Api::namespaced(client, "default");
        let wp = kube::api::WatchParams::default().timeout(290);
        let mut events = Box::pin(api.watch(&wp, "1").await.expect("the watch starts"));
        let first = events.next().await.expect("one event").expect("a bookmark");
        assert!(matches!(first, kube::api::WatchEvent::Bookmark(_)));
        // Well past the deadline: the stream is still open, waiting.
        let more = tokio::time::timeout(Duration::from_millis(800), events.next()).await;
        assert!(more.is_err(), "the watch was cut: {:?}", more.ok());
        let text = metrics.render();
        assert!(
            text.contains(r#"verb="watch",group="",resource="configmaps",code="200"} 1"#),
            "{text}"
        );
        // Counted, never timed: its response is the stream.
        assert!(
            !text.contains(r#"verb="watch",group="",resource="configmaps"}"#),
            "{text}"
        );
    }
}
