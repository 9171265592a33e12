//! Webhook hooks (issue 12) against the real local control plane, with an engine of the test's
//! own: a small HTTP server on 127.0.0.1 that records every request it receives (when, its
//! headers, its body) and answers as each test says. The operator runs with
//! `--webhook-allowed-hosts=127.0.0.1`; each test has its own namespace and operator, so they
//! run in parallel.

mod support;

use ballast::api::{HookPhase, HookStatus, RolloutPhase};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use jiff::{SignedDuration, Timestamp};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::rollout::*;
use support::{Operator, wait_until};
use tokio::net::TcpListener;

const ALLOW: &str = "--webhook-allowed-hosts=127.0.0.1";

/// One request the engine received.
#[derive(Clone, Debug)]
struct Hit {
    at: Timestamp,
    headers: BTreeMap<String, String>,
    body: serde_json::Value,
}

impl Hit {
    fn key(&self) -> Option<&str> {
        self.headers.get("idempotency-key").map(String::as_str)
    }
}

/// How the engine answers its `n`th request (from 0).
#[derive(Clone, Copy)]
enum Reply {
    /// This status and body, after this delay.
    Answer(u16, &'static str, Duration),
    /// Never: the request stays open until the caller goes away.
    Hold,
}

struct Engine {
    port: u16,
    hits: Arc<Mutex<Vec<Hit>>>,
}

impl Engine {
    async fn start(reply: impl Fn(usize) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits: Arc<Mutex<Vec<Hit>>> = Arc::default();
        let reply = Arc::new(reply);
        let recorded = hits.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (hits, reply) = (recorded.clone(), reply.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (hits, reply) = (hits.clone(), reply.clone());
                        async move {
                            let at = Timestamp::now();
                            let headers = req
                                .headers()
                                .iter()
                                .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
                                .collect();
                            let bytes = req.into_body().collect().await.unwrap().to_bytes();
                            let n = {
                                let mut hits = hits.lock().unwrap();
                                hits.push(Hit {
                                    at,
                                    headers,
                                    body: serde_json::from_slice(&bytes).unwrap_or_default(),
                                });
                                hits.len() - 1
                            };
                            let (status, body) = match reply(n) {
                                Reply::Answer(status, body, delay) => {
                                    tokio::time::sleep(delay).await;
                                    (status, body)
                                }
                                Reply::Hold => std::future::pending().await,
                            };
                            Ok::<_, std::convert::Infallible>(
                                http::Response::builder()
                                    .status(status)
                                    .body(Full::new(Bytes::from(body)))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Engine { port, hits }
    }

    fn always(status: u16, body: &'static str) -> impl Fn(usize) -> Reply {
        move |_| Reply::Answer(status, body, Duration::ZERO)
    }

    fn hits(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hooks/ballast", self.port)
    }
}

async fn env(prefix: &str) -> Env {
    Env::with_args(prefix, &[ALLOW]).await
}

/// The strategy's lines for one webhook hook `notify` at `point` (`extra`: more of its fields).
fn webhook(point: &str, url: &str, extra: &str) -> String {
    let at = if point == "mid" { "at: 50%, " } else { "" };
    format!(
        "  onFailure: Rollback\n  {point}: [{{name: notify, {at}{extra}webhook: {{url: \"{url}\", headers: [{{name: X-Team, value: shop}}]}}}}]\n"
    )
}

fn notify(s: &ballast::api::RolloutStrategyStatus) -> HookStatus {
    s.hooks
        .iter()
        .find(|h| h.name == "notify")
        .cloned()
        .expect("the hook's entry")
}

async fn wait_hits(engine: &Engine, n: usize, secs: u64) -> Vec<Hit> {
    wait_until(
        &format!("{n} request(s) at the engine"),
        Duration::from_secs(secs),
        || async { (engine.hits().len() >= n).then(|| engine.hits()) },
    )
    .await
}

#[tokio::test]
async fn a_pre_webhook_gets_the_revision_and_passes_before_the_new_replica_set_exists() {
    // The engine takes 2s to say yes: the new ReplicaSet must not exist before.
    let engine = Engine::start(|_| Reply::Answer(200, "ok", Duration::from_secs(2))).await;
    let env = env("rwh-pre").await;
    let stable = adopt(&env, 2, &webhook("pre", &engine.url(), "")).await;
    env.set_image("web", "web:2").await;
    let s = env.wait_succeeded_after("web", &stable, 90).await;
    let rev = s.stable_revision.clone().unwrap();

    let hits = engine.hits();
    assert_eq!(hits.len(), 1, "one call: {hits:#?}");
    let hit = &hits[0];
    let b = &hit.body;
    let strategy = env.strategies().get("web").await.unwrap();
    assert_eq!(b["strategy"], "web");
    assert_eq!(b["namespace"], env.ns.name.as_str());
    assert_eq!(b["deployment"], "web");
    assert_eq!(b["hook"], "notify");
    assert_eq!(b["point"], "pre");
    assert_eq!(b["fromRevision"], stable.as_str());
    assert_eq!(b["toRevision"], rev.as_str());
    assert_eq!(b["attempt"], 1);
    assert_eq!(b["images"]["from"]["app"], "web:1");
    assert_eq!(b["images"]["to"]["app"], "web:2");
    let cb = &b["callback"];
    assert_eq!(
        (
            cb["kind"].as_str(),
            cb["name"].as_str(),
            cb["namespace"].as_str()
        ),
        (
            Some("RolloutStrategy"),
            Some("web"),
            Some(env.ns.name.as_str())
        )
    );
    assert_eq!(cb["uid"].as_str(), strategy.metadata.uid.as_deref());
    assert_eq!(cb["approve"]["key"], "ballast.dev/approve");
    assert_eq!(cb["approve"]["value"], rev.as_str());
    assert_eq!(cb["abort"]["key"], "ballast.dev/abort");
    let h = notify(&s);
    assert_eq!(
        (h.phase, h.attempt, h.http_status, h.job_name.clone()),
        (HookPhase::Succeeded, 1, Some(200), None)
    );
    assert_eq!(
        hit.key(),
        h.idempotency_key.as_deref(),
        "the header is the recorded key"
    );
    assert_eq!(b["idempotencyKey"].as_str(), hit.key());
    assert_eq!(hit.headers.get("x-team").map(String::as_str), Some("shop"));
    assert_eq!(
        hit.headers.get("content-type").map(String::as_str),
        Some("application/json")
    );

    // Cluster truth: the new ReplicaSet was created after the engine answered.
    let rss = env.replica_sets().await;
    let new_rs = rs_of_image(&rss, "web:2").expect("the new ReplicaSet");
    let created = ts(&new_rs.metadata.creation_timestamp);
    let answered = hit.at + SignedDuration::from_secs(2);
    assert!(
        created >= answered - SignedDuration::from_secs(1),
        "the ReplicaSet of web:2 was created at {created}, the engine got the call at {} and answered at {answered}",
        hit.at
    );
    assert!(
        env.jobs()
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "a webhook runs no Job"
    );
    env.wait_event("HookSucceeded", |_| true).await;
}

#[tokio::test]
async fn a_failing_webhook_rolls_back_with_its_status_and_body_in_status_and_a_warning() {
    let engine = Engine::start(Engine::always(
        500,
        "migration refused: schema locked\nsecond line\n",
    ))
    .await;
    let env = env("rwh-fail").await;
    let stable = adopt(&env, 2, &webhook("pre", &engine.url(), "")).await;
    let before = pod_uids(&env).await;
    env.set_image("web", "web:2").await;
    let s = env
        .wait_phase("web", RolloutPhase::RolledBack, None, 60)
        .await;
    let h = notify(&s);
    assert_eq!(
        (h.phase, h.http_status, h.reason.as_deref()),
        (HookPhase::Failed, Some(500), Some("WebhookRejected"))
    );
    assert!(h.message.as_deref().unwrap().contains("500"), "{h:?}");
    assert!(
        h.log_tail
            .as_deref()
            .unwrap()
            .starts_with("migration refused: schema locked"),
        "{h:?}"
    );
    assert_eq!(engine.hits().len(), 1, "failurePolicy Abort: one call");
    assert_eq!(image_of(&env.deployment("web").await), "web:1");
    assert_eq!(s.stable_revision.as_deref(), Some(stable.as_str()));
    assert!(rs_of_image(&env.replica_sets().await, "web:2").is_none());
    assert_eq!(pod_uids(&env).await, before, "old pods untouched");
    env.wait_event("HookFailed", |e| {
        e.type_.as_deref() == Some("Warning")
            && e.message.as_deref().is_some_and(|m| {
                m.contains("500") && m.contains("migration refused: schema locked")
            })
    })
    .await;
}

/// Rolls web:2 out under a webhook at `point` whose engine answers 202; returns the stable and
/// the new revision once the strategy waits for the engine.
async fn accepted(env: &Env, engine: &Engine, point: &str, extra: &str) -> (String, String) {
    let stable = adopt(env, 2, &webhook(point, &engine.url(), extra)).await;
    env.set_image("web", "web:2").await;
    let s = env
        .wait_phase("web", RolloutPhase::WaitingExternal, None, 60)
        .await;
    let h = notify(&s);
    assert_eq!((h.phase, h.http_status), (HookPhase::Waiting, Some(202)));
    assert!(h.deadline.is_some());
    let rev = s.current_revision.clone().unwrap();
    assert!(
        s.message
            .as_deref()
            .unwrap()
            .contains(&format!("ballast.dev/approve={rev}")),
        "{s:?}"
    );
    (stable, rev)
}

#[tokio::test]
async fn a_202_at_mid_waits_for_the_engine_then_an_approval_goes_on() {
    let engine = Engine::start(Engine::always(202, "queued")).await;
    let env = env("rwh-approve").await;
    let (stable, rev) = accepted(&env, &engine, "mid", "").await;
    assert!(
        env.paused("web").await,
        "held at the mid point while the engine decides"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        env.status("web").await.phase,
        Some(RolloutPhase::WaitingExternal),
        "it keeps waiting"
    );
    env.annotate("web", "ballast.dev/approve", &rev).await;
    let s = env.wait_succeeded_after("web", &stable, 60).await;
    let h = notify(&s);
    assert_eq!(
        (h.phase, h.reason.as_deref()),
        (HookPhase::Succeeded, Some("Approved"))
    );
    assert_eq!(engine.hits().len(), 1, "no second call");
    assert_eq!(engine.hits()[0].body["point"], "mid");
}

#[tokio::test]
async fn a_202_then_an_abort_fails_the_revision() {
    let engine = Engine::start(Engine::always(202, "")).await;
    let env = env("rwh-abort").await;
    let (stable, rev) = accepted(&env, &engine, "pre", "").await;
    env.annotate("web", "ballast.dev/abort", &rev).await;
    let s = env
        .wait_phase("web", RolloutPhase::RolledBack, None, 60)
        .await;
    assert_eq!(notify(&s).reason.as_deref(), Some("Aborted"));
    assert_eq!(s.stable_revision.as_deref(), Some(stable.as_str()));
    assert_eq!(image_of(&env.deployment("web").await), "web:1");
    assert_eq!(engine.hits().len(), 1);
}

#[tokio::test]
async fn a_202_without_a_decision_fails_at_the_hooks_timeout() {
    let engine = Engine::start(Engine::always(202, "")).await;
    let env = env("rwh-timeout").await;
    accepted(&env, &engine, "pre", "timeoutSeconds: 6, ").await;
    let s = env
        .wait_phase("web", RolloutPhase::RolledBack, None, 40)
        .await;
    let h = notify(&s);
    assert_eq!(
        (h.phase, h.reason.as_deref()),
        (HookPhase::Failed, Some("WebhookDecisionTimeout"))
    );
    let took = ts(&h.finish_time).duration_since(ts(&h.start_time));
    assert!(
        took >= SignedDuration::from_secs(6) && took < SignedDuration::from_secs(20),
        "failed {took:?} after its start"
    );
    assert_eq!(engine.hits().len(), 1);
    env.wait_event("HookFailed", |e| {
        e.message
            .as_deref()
            .is_some_and(|m| m.contains("WebhookDecisionTimeout"))
    })
    .await;
}

#[tokio::test]
async fn a_restart_during_a_call_never_calls_again_with_another_key() {
    // The first request is held open until its caller is gone; later ones pass.
    let engine = Engine::start(|n| {
        if n == 0 {
            Reply::Hold
        } else {
            Reply::Answer(200, "ok", Duration::ZERO)
        }
    })
    .await;
    let mut env = env("rwh-restart").await;
    let stable = adopt(
        &env,
        2,
        &webhook("pre", &engine.url(), "")
            .replace("headers:", "requestTimeoutSeconds: 120, headers:"),
    )
    .await;
    env.set_image("web", "web:2").await;
    let first = wait_hits(&engine, 1, 60).await;
    let s = env.status("web").await;
    let h = notify(&s);
    assert_eq!(h.phase, HookPhase::Running);
    let key = h.idempotency_key.clone().expect("recorded before the call");
    assert_eq!(first[0].key(), Some(key.as_str()));

    env.op.kill();
    env.op = Operator::start_with(
        &env.c,
        &env.ns.name,
        &format!("ballast-{}-1", env.ns.name),
        &[ALLOW],
    );
    let s = env.wait_succeeded_after("web", &stable, 90).await;
    let h = notify(&s);
    assert_eq!((h.attempt, h.http_status), (1, Some(200)));
    let hits = engine.hits();
    eprintln!("calls of attempt 1 across the restart: {}", hits.len());
    // At most once per attempt: a second call only with the same Idempotency-Key.
    assert!(hits.len() <= 2, "{hits:#?}");
    assert!(
        hits.iter()
            .all(|h| h.key() == Some(key.as_str()) && h.body["attempt"] == 1),
        "{hits:#?}"
    );
}

#[tokio::test]
async fn a_url_whose_host_is_not_allowed_fails_without_a_request() {
    let engine = Engine::start(Engine::always(200, "ok")).await;
    let env = env("rwh-host").await;
    // localhost reaches the engine, but only 127.0.0.1 is allowed.
    let url = format!("http://localhost:{}/hooks/ballast", engine.port);
    adopt(&env, 2, &webhook("pre", &url, "")).await;
    env.set_image("web", "web:2").await;
    let s = env
        .wait_phase("web", RolloutPhase::RolledBack, None, 60)
        .await;
    let h = notify(&s);
    assert_eq!(
        (h.phase, h.reason.as_deref(), h.http_status),
        (HookPhase::Failed, Some("WebhookHostNotAllowed"), None)
    );
    let msg = h.message.unwrap();
    assert!(
        msg.contains("localhost") && msg.contains("--webhook-allowed-hosts"),
        "{msg}"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(engine.hits().is_empty(), "no request reached the engine");
}
