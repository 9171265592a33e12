//! Webhook hooks: where a call may go, what it carries, and what the answer means; and the
//! [`Caller`] that makes calls off the reconcile path and wakes the strategy when one is answered.
//!
//! Where: a Service of the strategy's namespace (`<name>.<namespace>.svc`), or a URL whose host
//! `--webhook-allowed-hosts` lists; anything else is refused before a connection is opened, so
//! a namespace editor cannot point the operator at arbitrary addresses.
//!
//! At most once: the machine records the hook as Running with its `Idempotency-Key` in status
//! before it asks for the call. A call under way when the operator stops is lost with it; the
//! next operator finds the hook Running with no answer and calls again with the same key (the
//! engine de-duplicates on it), never with a new one.
//!
//! Answers: 2xx passes, except `202 Accepted`, which hands the decision to the engine (the
//! revision then waits for `ballast.dev/approve` or `ballast.dev/abort`); any other status, a
//! timeout or a failed connection fails the hook, with the status and the first lines of the
//! body recorded as a container hook's log tail is.

use crate::api::webhook::{IDEMPOTENCY_KEY_HEADER, WebhookHook, WebhookScheme};
use base64::Engine as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Reasons a webhook hook fails with (status and Events), CamelCase.
pub mod reason {
    /// A `url:` whose host `--webhook-allowed-hosts` does not list: no request was made.
    pub const HOST_NOT_ALLOWED: &str = "WebhookHostNotAllowed";
    /// No answer within `requestTimeoutSeconds`.
    pub const TIMEOUT: &str = "WebhookTimeout";
    /// No connection (refused, unresolvable name, TLS failure).
    pub const UNREACHABLE: &str = "WebhookUnreachable";
    /// An answer other than 2xx.
    pub const REJECTED: &str = "WebhookRejected";
    /// A `caBundle` that holds no certificate.
    pub const INVALID_CA_BUNDLE: &str = "WebhookInvalidCABundle";
}

/// Most bytes of an answer's body that are read; the first lines of it are kept.
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Lines of an answer's body kept in status.
const BODY_LINES: usize = 10;
/// Characters of an answer's body kept in status.
const BODY_CHARS: usize = 2048;

/// The hosts `url:` webhooks may call (`--webhook-allowed-hosts`): exact host names or IP
/// addresses, compared without case; no wildcard.
#[derive(Clone, Debug, Default)]
pub struct AllowedHosts(Vec<String>);

impl AllowedHosts {
    pub fn new(hosts: &[String]) -> Self {
        AllowedHosts(
            hosts
                .iter()
                .map(|h| {
                    h.trim()
                        .trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_ascii_lowercase()
                })
                .filter(|h| !h.is_empty())
                .collect(),
        )
    }

    fn allows(&self, host: &str) -> bool {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_ascii_lowercase();
        self.0.contains(&host)
    }
}

/// Why a call is not made, or failed: a reason of [`reason`] and what to tell the user.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub reason: &'static str,
    pub message: String,
    /// The answer's HTTP status, when there was one.
    pub status: Option<u16>,
    /// The first lines of the answer's body, when it had one.
    pub body: Option<String>,
}

impl Failure {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Failure {
            reason,
            message: message.into(),
            status: None,
            body: None,
        }
    }
}

/// Where a webhook's call goes: the URL to call, for a hook of a strategy in `namespace`.
pub fn target(
    hook: &WebhookHook,
    namespace: &str,
    allowed: &AllowedHosts,
) -> Result<http::Uri, Failure> {
    let url = match (&hook.service, &hook.url) {
        (Some(s), None) => {
            let scheme = match s.scheme {
                WebhookScheme::Https => "https",
                WebhookScheme::Http => "http",
            };
            format!("{scheme}://{}.{namespace}.svc:{}{}", s.name, s.port, s.path)
        }
        (None, Some(u)) => u.clone(),
        _ => {
            return Err(Failure::new(
                reason::REJECTED,
                "exactly one of webhook.service and webhook.url must be set",
            ));
        }
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e| Failure::new(reason::REJECTED, format!("{url} is not a URL: {e}")))?;
    let host = uri.host().unwrap_or_default();
    if hook.url.is_some() && !allowed.allows(host) {
        return Err(Failure::new(
            reason::HOST_NOT_ALLOWED,
            format!(
                "{host} is not in the manager's --webhook-allowed-hosts: no request was made (ask the operator's administrator to allow it, or call a Service of this namespace)"
            ),
        ));
    }
    Ok(uri)
}

/// The key of one call (strategy, hook, revision, attempt): the same whenever that call is made.
pub fn idempotency_key(strategy_uid: &str, hook: &str, revision: &str, attempt: i32) -> String {
    format!("{strategy_uid}/{hook}/{revision}/{attempt}")
}

/// The JSON body of a call.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Payload {
    pub strategy: String,
    pub namespace: String,
    pub deployment: String,
    pub hook: String,
    pub point: &'static str,
    /// The revision rolled out before this one (none for a first revision).
    pub from_revision: Option<String>,
    pub to_revision: String,
    pub attempt: i32,
    /// Container images of the Deployment's pod template, by container name, before and now.
    pub images: Images,
    pub idempotency_key: String,
    /// How to answer later, after a `202 Accepted`.
    pub callback: Callback,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Images {
    pub from: BTreeMap<String, String>,
    pub to: BTreeMap<String, String>,
}

/// The object an engine annotates to decide, and the annotations that do it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Callback {
    pub api_version: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// `ballast.dev/approve=<revision>` lets the revision go on.
    pub approve: Annotation,
    /// `ballast.dev/abort=<revision>` fails it (`onFailure` applies).
    pub abort: Annotation,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Annotation {
    pub key: String,
    pub value: String,
}

/// What the engine said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 2xx but 202: the hook passed.
    Passed { status: u16 },
    /// 202 Accepted: the engine decides later.
    Accepted,
    /// Anything else, or no answer.
    Failed(Failure),
}

/// The first lines of a body, for status and Events.
fn body_lines(body: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(body);
    let text: String = text
        .lines()
        .take(BODY_LINES)
        .collect::<Vec<_>>()
        .join("\n")
        .chars()
        .take(BODY_CHARS)
        .collect();
    (!text.trim().is_empty()).then_some(text)
}

/// What an answer with `status` and `body` means.
pub fn classify(status: u16, body: &[u8]) -> Answer {
    match status {
        202 => Answer::Accepted,
        200..=299 => Answer::Passed { status },
        _ => Answer::Failed(Failure {
            reason: reason::REJECTED,
            message: format!("the webhook answered {status}"),
            status: Some(status),
            body: body_lines(body),
        }),
    }
}

/// Container images of a pod template (as JSON), by container name.
pub fn images(template: &serde_json::Value) -> BTreeMap<String, String> {
    template
        .pointer("/spec/containers")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((
                c.get("name")?.as_str()?.to_string(),
                c.get("image")?.as_str()?.to_string(),
            ))
        })
        .collect()
}

/// What one call of a hook is made from.
pub struct CallInput<'a> {
    pub hook: &'a WebhookHook,
    pub allowed: &'a AllowedHosts,
    pub strategy: &'a str,
    pub namespace: &'a str,
    pub strategy_uid: &'a str,
    pub deployment: &'a str,
    pub hook_name: &'a str,
    pub point: &'static str,
    pub from_revision: Option<&'a str>,
    pub to_revision: &'a str,
    pub attempt: i32,
    pub key: &'a str,
    /// The pod templates (as JSON) of the stable revision and of the new one.
    pub from_template: Option<&'a serde_json::Value>,
    pub to_template: &'a serde_json::Value,
}

/// The call of one attempt of a hook: where it goes, its headers and its body.
pub fn build_call(i: &CallInput) -> Result<Call, Failure> {
    let uri = target(i.hook, i.namespace, i.allowed)?;
    Ok(Call {
        uri,
        headers: i
            .hook
            .headers
            .iter()
            .map(|h| (h.name.clone(), h.value.clone()))
            .collect(),
        ca_bundle: i.hook.ca_bundle.clone(),
        timeout: Duration::from_secs(
            u64::try_from(i.hook.request_timeout_seconds.max(1)).unwrap_or(10),
        ),
        payload: Payload {
            strategy: i.strategy.to_string(),
            namespace: i.namespace.to_string(),
            deployment: i.deployment.to_string(),
            hook: i.hook_name.to_string(),
            point: i.point,
            from_revision: i.from_revision.map(str::to_string),
            to_revision: i.to_revision.to_string(),
            attempt: i.attempt,
            images: Images {
                from: i.from_template.map(images).unwrap_or_default(),
                to: images(i.to_template),
            },
            idempotency_key: i.key.to_string(),
            callback: Callback {
                api_version: "ballast.dev/v1alpha1".into(),
                kind: "RolloutStrategy".into(),
                namespace: i.namespace.to_string(),
                name: i.strategy.to_string(),
                uid: i.strategy_uid.to_string(),
                approve: Annotation {
                    key: crate::api::rollout_strategy::APPROVE_ANNOTATION.into(),
                    value: i.to_revision.to_string(),
                },
                abort: Annotation {
                    key: crate::api::rollout_strategy::ABORT_ANNOTATION.into(),
                    value: i.to_revision.to_string(),
                },
            },
        },
    })
}

/// One call to make.
#[derive(Clone, Debug)]
pub struct Call {
    pub uri: http::Uri,
    pub headers: Vec<(String, String)>,
    pub ca_bundle: Option<String>,
    pub timeout: Duration,
    pub payload: Payload,
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

fn https_client(ca_bundle: Option<&str>) -> Result<HttpsClient, Failure> {
    let builder = hyper_rustls::HttpsConnectorBuilder::new();
    let builder = match ca_bundle {
        None => builder.with_native_roots().map_err(|e| {
            Failure::new(
                reason::UNREACHABLE,
                format!("no system root certificates: {e}"),
            )
        })?,
        Some(b64) => {
            let pem = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| {
                    Failure::new(
                        reason::INVALID_CA_BUNDLE,
                        format!("caBundle is not base64: {e}"),
                    )
                })?;
            let mut roots = rustls::RootCertStore::empty();
            use rustls::pki_types::{CertificateDer, pem::PemObject};
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| {
                    Failure::new(reason::INVALID_CA_BUNDLE, format!("caBundle: {e}"))
                })?;
                roots.add(cert).map_err(|e| {
                    Failure::new(reason::INVALID_CA_BUNDLE, format!("caBundle: {e}"))
                })?;
            }
            if roots.is_empty() {
                return Err(Failure::new(
                    reason::INVALID_CA_BUNDLE,
                    "caBundle holds no PEM certificate",
                ));
            }
            let config = rustls::ClientConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .map_err(|e| Failure::new(reason::UNREACHABLE, e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
            builder.with_tls_config(config)
        }
    };
    let connector = builder.https_or_http().enable_http1().build();
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}

/// Makes one call and says what the answer means. Never panics, never waits longer than the
/// call's timeout.
pub async fn call(c: &Call) -> Answer {
    match tokio::time::timeout(c.timeout, send(c)).await {
        Ok(Ok((status, body))) => classify(status, &body),
        Ok(Err(f)) => Answer::Failed(f),
        Err(_) => Answer::Failed(Failure::new(
            reason::TIMEOUT,
            format!("no answer from {} within {}s", c.uri, c.timeout.as_secs()),
        )),
    }
}

async fn send(c: &Call) -> Result<(u16, Bytes), Failure> {
    let client = https_client(c.ca_bundle.as_deref())?;
    let body = serde_json::to_vec(&c.payload)
        .map_err(|e| Failure::new(reason::REJECTED, e.to_string()))?;
    let mut req = http::Request::post(c.uri.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(
            http::header::USER_AGENT,
            concat!("ballast/", env!("CARGO_PKG_VERSION")),
        )
        .header(IDEMPOTENCY_KEY_HEADER, &c.payload.idempotency_key);
    for (name, value) in &c.headers {
        req = req.header(name.as_str(), value.as_str());
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| Failure::new(reason::REJECTED, format!("cannot build the request: {e}")))?;
    let resp = client.request(req).await.map_err(|e| {
        let mut msg = format!("calling {}: {e}", c.uri);
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(&format!(": {s}"));
            src = s.source();
        }
        Failure::new(reason::UNREACHABLE, msg)
    })?;
    let status = resp.status().as_u16();
    // The body only matters as a hint in status: read what fits, ignore what does not.
    let body = Limited::new(resp.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Ok((status, body))
}

/// Calls under way or answered, by idempotency key: what the machine reads to decide. An
/// answer is kept until the machine has recorded it in status (then [`Caller::forget`]).
#[derive(Clone, Default)]
pub struct Caller {
    calls: Arc<Mutex<HashMap<String, Option<Answer>>>>,
}

/// What the caller knows of one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallState {
    /// Not made by this process (never asked for, or asked for before a restart).
    Unknown,
    InFlight,
    Answered(Answer),
}

impl Caller {
    pub fn state(&self, key: &str) -> CallState {
        match self.calls.lock().expect("webhook calls").get(key) {
            None => CallState::Unknown,
            Some(None) => CallState::InFlight,
            Some(Some(a)) => CallState::Answered(a.clone()),
        }
    }

    /// Starts `call` unless one with its key is under way or answered; `wake` gets `token`
    /// when the answer is in. Returns whether a call was started.
    pub fn start<T: Send + 'static>(
        &self,
        req: Call,
        wake: mpsc::UnboundedSender<T>,
        token: T,
    ) -> bool {
        let key = req.payload.idempotency_key.clone();
        {
            let mut calls = self.calls.lock().expect("webhook calls");
            if calls.contains_key(&key) {
                return false;
            }
            calls.insert(key.clone(), None);
        }
        let calls = self.calls.clone();
        tokio::spawn(async move {
            let answer = call(&req).await;
            {
                let mut calls = calls.lock().expect("webhook calls");
                // Forgotten meanwhile (its hook ended otherwise, say aborted): nobody asks.
                match calls.get_mut(&key) {
                    Some(slot) => *slot = Some(answer),
                    None => return,
                }
            }
            let _ = wake.send(token);
        });
        true
    }

    /// Drops what is known of a call once its answer is in status.
    pub fn forget(&self, key: &str) {
        self.calls.lock().expect("webhook calls").remove(key);
    }
}

#[cfg(test)]
mod tests;
