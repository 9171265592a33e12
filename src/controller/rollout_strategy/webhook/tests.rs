use super::*;
use crate::api::webhook::WebhookService;
use base64::engine::general_purpose::STANDARD;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::net::TcpListener;

fn allowed(hosts: &[&str]) -> AllowedHosts {
    AllowedHosts::new(&hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>())
}

fn url_hook(url: &str) -> WebhookHook {
    WebhookHook {
        url: Some(url.into()),
        request_timeout_seconds: 10,
        ..Default::default()
    }
}

#[test]
fn a_service_is_called_by_its_cluster_dns_name_without_an_allowlist() {
    let hook = WebhookHook {
        service: Some(WebhookService {
            name: "deployer".into(),
            port: 8443,
            path: "/hooks/ballast?team=shop".into(),
            scheme: WebhookScheme::Https,
        }),
        ..Default::default()
    };
    let uri = target(&hook, "shop", &AllowedHosts::default()).unwrap();
    assert_eq!(
        uri.to_string(),
        "https://deployer.shop.svc:8443/hooks/ballast?team=shop"
    );
}

#[test]
fn a_url_is_called_only_when_its_host_is_allowed() {
    let hook = url_hook("https://CI.example.com:8443/ballast");
    let refused = target(&hook, "shop", &allowed(&["example.com"])).unwrap_err();
    assert_eq!(refused.reason, reason::HOST_NOT_ALLOWED);
    assert!(
        refused.message.contains("ci.example.com") || refused.message.contains("CI.example.com")
    );
    assert!(
        refused.message.contains("no request was made"),
        "{}",
        refused.message
    );
    assert!(target(&hook, "shop", &allowed(&["ci.example.com"])).is_ok());
    assert!(target(&url_hook("http://[::1]:80/x"), "shop", &allowed(&["[::1]"])).is_ok());
    let none = target(
        &url_hook("http://127.0.0.1:1/"),
        "shop",
        &AllowedHosts::default(),
    );
    assert_eq!(none.unwrap_err().reason, reason::HOST_NOT_ALLOWED);
}

#[test]
fn answers_mean_pass_wait_or_fail_with_the_first_lines_of_the_body() {
    assert_eq!(classify(200, b""), Answer::Passed { status: 200 });
    assert_eq!(classify(204, b""), Answer::Passed { status: 204 });
    assert_eq!(classify(202, b"queued"), Answer::Accepted);
    let body: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    let Answer::Failed(f) = classify(503, body.as_bytes()) else {
        panic!("503 passed")
    };
    assert_eq!((f.reason, f.status), (reason::REJECTED, Some(503)));
    let kept = f.body.unwrap();
    assert!(
        kept.starts_with("line 1\n") && kept.ends_with("line 10"),
        "{kept}"
    );
    let Answer::Failed(f) = classify(302, b"  \n") else {
        panic!("a redirect passed")
    };
    assert_eq!(f.body, None);
}

/// What the test server saw of one request.
#[derive(Clone, Debug, Default)]
struct Seen {
    headers: Vec<(String, String)>,
    body: serde_json::Value,
}

/// A server on 127.0.0.1 that answers every request with `status` and `body` after `delay`,
/// over TLS when `tls` is given; returns its port, what it saw and how many requests came.
async fn serve(
    status: u16,
    body: &'static str,
    delay: Duration,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> (u16, Arc<Mutex<Vec<Seen>>>, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let (seen2, count2) = (seen.clone(), count.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let (seen, count, tls) = (seen2.clone(), count2.clone(), tls.clone());
            tokio::spawn(async move {
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (seen, count) = (seen.clone(), count.clone());
                    async move {
                        count.fetch_add(1, Ordering::SeqCst);
                        let headers = req
                            .headers()
                            .iter()
                            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                            .collect();
                        let bytes = req.into_body().collect().await.unwrap().to_bytes();
                        seen.lock().unwrap().push(Seen {
                            headers,
                            body: serde_json::from_slice(&bytes).unwrap_or_default(),
                        });
                        tokio::time::sleep(delay).await;
                        Ok::<_, std::convert::Infallible>(
                            http::Response::builder()
                                .status(status)
                                .body(Full::new(Bytes::from(body)))
                                .unwrap(),
                        )
                    }
                });
                let conn = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(cfg) => {
                        let Ok(s) = tokio_rustls::TlsAcceptor::from(cfg).accept(stream).await
                        else {
                            return;
                        };
                        let _ = conn.serve_connection(TokioIo::new(s), svc).await;
                    }
                    None => {
                        let _ = conn.serve_connection(TokioIo::new(stream), svc).await;
                    }
                }
            });
        }
    });
    (port, seen, count)
}

fn payload() -> Payload {
    Payload {
        strategy: "web".into(),
        namespace: "shop".into(),
        deployment: "web".into(),
        hook: "notify".into(),
        point: "pre",
        from_revision: Some("aaaaaaaaaa".into()),
        to_revision: "bbbbbbbbbb".into(),
        attempt: 1,
        images: Images {
            from: [("app".to_string(), "web:1".to_string())].into(),
            to: [("app".to_string(), "web:2".to_string())].into(),
        },
        idempotency_key: idempotency_key("uid-1", "notify", "bbbbbbbbbb", 1),
        callback: Callback {
            api_version: "ballast.dev/v1alpha1".into(),
            kind: "RolloutStrategy".into(),
            namespace: "shop".into(),
            name: "web".into(),
            uid: "uid-1".into(),
            approve: Annotation {
                key: "ballast.dev/approve".into(),
                value: "bbbbbbbbbb".into(),
            },
            abort: Annotation {
                key: "ballast.dev/abort".into(),
                value: "bbbbbbbbbb".into(),
            },
        },
    }
}

fn to(port: u16, scheme: &str, timeout: Duration, ca: Option<String>) -> Call {
    Call {
        uri: format!("{scheme}://127.0.0.1:{port}/hook").parse().unwrap(),
        headers: vec![("X-Team".into(), "shop".into())],
        ca_bundle: ca,
        timeout,
        payload: payload(),
    }
}

#[tokio::test]
async fn a_call_posts_the_revision_as_json_with_its_idempotency_key() {
    let (port, seen, _) = serve(200, "ok", Duration::ZERO, None).await;
    let answer = call(&to(port, "http", Duration::from_secs(5), None)).await;
    assert_eq!(answer, Answer::Passed { status: 200 });
    let seen = seen.lock().unwrap()[0].clone();
    let header = |n: &str| {
        seen.headers
            .iter()
            .find(|(k, _)| k == n)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(
        header("idempotency-key").as_deref(),
        Some("uid-1/notify/bbbbbbbbbb/1")
    );
    assert_eq!(header("x-team").as_deref(), Some("shop"));
    assert_eq!(header("content-type").as_deref(), Some("application/json"));
    assert_eq!(seen.body["toRevision"], "bbbbbbbbbb");
    assert_eq!(seen.body["images"]["to"]["app"], "web:2");
    assert_eq!(seen.body["callback"]["abort"]["key"], "ballast.dev/abort");
}

#[tokio::test]
async fn a_failing_answer_a_timeout_and_a_refused_connection_fail_the_call() {
    let (port, _, _) = serve(
        500,
        "migration lock held\nretry later",
        Duration::ZERO,
        None,
    )
    .await;
    let Answer::Failed(f) = call(&to(port, "http", Duration::from_secs(5), None)).await else {
        panic!("500 passed")
    };
    assert_eq!(f.status, Some(500));
    assert_eq!(f.body.as_deref(), Some("migration lock held\nretry later"));

    let (port, _, _) = serve(200, "", Duration::from_secs(5), None).await;
    let Answer::Failed(f) = call(&to(port, "http", Duration::from_millis(300), None)).await else {
        panic!("a slow answer passed")
    };
    assert_eq!(f.reason, reason::TIMEOUT);

    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let Answer::Failed(f) = call(&to(port, "http", Duration::from_secs(5), None)).await else {
        panic!("nobody answered, yet it passed")
    };
    assert_eq!(f.reason, reason::UNREACHABLE, "{}", f.message);
}

#[tokio::test]
async fn https_is_verified_against_the_ca_bundle() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let der = cert.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::try_from(cert.signing_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![der], key)
        .unwrap();
    let (port, _, count) = serve(202, "", Duration::ZERO, Some(Arc::new(config))).await;
    let bundle = STANDARD.encode(cert.cert.pem());
    let answer = call(&to(port, "https", Duration::from_secs(5), Some(bundle))).await;
    assert_eq!(answer, Answer::Accepted);
    // Not trusted by the system's roots: no answer is taken from it.
    let Answer::Failed(f) = call(&to(port, "https", Duration::from_secs(5), None)).await else {
        panic!("an untrusted certificate was accepted")
    };
    assert_eq!(f.reason, reason::UNREACHABLE, "{}", f.message);
    let Answer::Failed(f) = call(&to(
        port,
        "https",
        Duration::from_secs(5),
        Some(STANDARD.encode("not pem")),
    ))
    .await
    else {
        panic!("an empty bundle was accepted")
    };
    assert_eq!(f.reason, reason::INVALID_CA_BUNDLE);
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "only the verified call got through"
    );
}

#[tokio::test]
async fn the_caller_makes_one_call_per_key_and_wakes_the_strategy_with_its_answer() {
    let (port, _, count) = serve(200, "", Duration::from_millis(200), None).await;
    let caller = Caller::default();
    let (wake, mut woken) = mpsc::unbounded_channel();
    let req = to(port, "http", Duration::from_secs(5), None);
    let key = req.payload.idempotency_key.clone();
    assert_eq!(caller.state(&key), CallState::Unknown);
    assert!(caller.start(req.clone(), wake.clone(), key.clone()));
    assert!(
        !caller.start(req.clone(), wake.clone(), key.clone()),
        "a second start of one key"
    );
    assert_eq!(caller.state(&key), CallState::InFlight);
    assert_eq!(woken.recv().await.as_deref(), Some(key.as_str()));
    assert_eq!(
        caller.state(&key),
        CallState::Answered(Answer::Passed { status: 200 })
    );
    assert!(
        !caller.start(req, wake, key.clone()),
        "an answered key is not called again"
    );
    assert_eq!(count.load(Ordering::SeqCst), 1);
    caller.forget(&key);
    assert_eq!(caller.state(&key), CallState::Unknown);
}
