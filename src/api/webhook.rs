//! The `webhook:` action of a RolloutStrategy hook: an HTTP call to an external engine (a CI
//! pipeline, a workflow engine, a change-approval system) that passes, fails or, with
//! `202 Accepted`, decides later through the same approve/abort annotations the kubectl plugin
//! uses.
//!
//! What it may reach is bounded here and in the manager: a Service of the strategy's own
//! namespace, or a URL whose host the manager's `--webhook-allowed-hosts` lists. Headers are for
//! routing, never secrets: the ones that carry credentials are refused by the schema.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{DNS_LABEL_PATTERN, unwrap_descriptions};

/// Longest URL or path.
pub const URL_MAX_LENGTH: u32 = 2048;
/// Most headers of one webhook.
pub const MAX_HEADERS: u32 = 16;
/// Longest per-request timeout, in seconds.
pub const MAX_REQUEST_TIMEOUT_SECONDS: i32 = 300;
/// The header of every call that names the call (strategy UID, hook, revision, attempt): the
/// same on a call sent again after a restart, so the engine can de-duplicate.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// Header names a webhook may not set (case-insensitive): credentials do not belong in a spec
/// that every reader of the namespace can see, and ballast sets the others itself.
pub const RESERVED_HEADERS: [&str; 8] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "host",
    "content-type",
    "content-length",
    "transfer-encoding",
    "idempotency-key",
];

/// A hook that calls an HTTP endpoint: `POST` with a JSON body describing the revision. A 2xx
/// answer passes the hook; `202 Accepted` makes it wait (phase `WaitingExternal`, at most the
/// hook's `timeoutSeconds`) until the engine annotates this RolloutStrategy
/// `ballast.dev/approve=<revision>` or `ballast.dev/abort=<revision>`; any other status, a
/// timeout or a refused connection fails it (then `failurePolicy` applies). Exactly one of
/// `service` and `url`.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new("has(self.service) != has(self.url)")
        .message("exactly one of service or url must be set"),
    validation = Rule::new("!has(self.headers) || self.headers.all(h, !(h.name.lowerAscii() in ['authorization', 'proxy-authorization', 'cookie', 'host', 'content-type', 'content-length', 'transfer-encoding', 'idempotency-key']))")
        .message("headers may not set Authorization, Proxy-Authorization, Cookie, Host, Content-Type, Content-Length, Transfer-Encoding or Idempotency-Key")
        .field_path(".headers")
        .reason(Reason::FieldValueForbidden),
    validation = Rule::new("!has(self.headers) || self.headers.all(a, self.headers.exists_one(b, b.name.lowerAscii() == a.name.lowerAscii()))")
        .message("header names must be unique")
        .field_path(".headers"),
)]
#[schemars(transform = unwrap_descriptions)]
pub struct WebhookHook {
    /// A Service in this RolloutStrategy's namespace, called by its cluster DNS name
    /// (`<name>.<namespace>.svc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<WebhookService>,

    /// Any other endpoint: an `http` or `https` URL without credentials in it. Called only when
    /// the manager's `--webhook-allowed-hosts` lists its host (by default none is); otherwise the
    /// hook fails with reason `WebhookHostNotAllowed` and no request is made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = URL_MAX_LENGTH))]
    #[x_kube(
        validation = Rule::new("isURL(self) && url(self).getScheme() in ['http', 'https'] && url(self).getHostname() != ''")
            .message("url must be an absolute http or https URL"),
        validation = Rule::new("!self.matches('^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*@')")
            .message("url may not carry credentials (user:password@)")
    )]
    pub url: Option<String>,

    /// Headers sent with the call, for routing (not secrets: `Authorization`, `Cookie` and the
    /// headers ballast sets itself are refused). At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_HEADERS))]
    pub headers: Vec<WebhookHeader>,

    /// PEM certificates (base64-encoded, like a webhook configuration's `caBundle`) that an
    /// `https` endpoint's certificate must chain to. Unset: the system's root certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 65536))]
    #[x_kube(
        validation = Rule::new("self.matches('^[A-Za-z0-9+/]+=*$')")
            .message("caBundle must be base64 (of PEM certificates)")
    )]
    pub ca_bundle: Option<String>,

    /// Seconds one request may take (connecting, sending, and the answer), 1..300. A call that
    /// takes longer fails the hook (reason `WebhookTimeout`). Default 10.
    #[serde(default = "default_request_timeout_seconds")]
    #[schemars(range(min = 1, max = MAX_REQUEST_TIMEOUT_SECONDS))]
    pub request_timeout_seconds: i32,
}

fn default_request_timeout_seconds() -> i32 {
    10
}

/// A Service of the strategy's namespace.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = unwrap_descriptions)]
pub struct WebhookService {
    /// Name of the Service.
    #[schemars(length(min = 1, max = 63), pattern(DNS_LABEL_PATTERN))]
    pub name: String,

    /// Port of the Service, 1..65535. Default 443.
    #[serde(default = "default_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,

    /// Path of the request, starting with `/`. Default `/`.
    #[serde(default = "default_path")]
    #[schemars(length(min = 1, max = URL_MAX_LENGTH))]
    #[x_kube(
        validation = Rule::new("self.startsWith('/') && !self.contains('#')")
            .message("path must start with / and hold no fragment")
    )]
    pub path: String,

    /// `HTTPS` (default) or `HTTP`.
    #[serde(default)]
    pub scheme: WebhookScheme,
}

fn default_port() -> i32 {
    443
}

fn default_path() -> String {
    "/".into()
}

/// The scheme of a Service webhook: `HTTPS` or `HTTP`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum WebhookScheme {
    #[default]
    #[serde(rename = "HTTPS")]
    Https,
    #[serde(rename = "HTTP")]
    Http,
}

/// One header of a webhook call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookHeader {
    /// Header name (an HTTP token).
    #[schemars(length(min = 1, max = 128), pattern(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"))]
    pub name: String,
    /// Header value (printable ASCII).
    #[schemars(length(max = 1024), pattern(r"^[\x20-\x7e]*$"))]
    pub value: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RolloutStrategy;
    use kube::CustomResourceExt;

    #[test]
    fn the_schema_refuses_exactly_the_reserved_headers() {
        let crd = serde_json::to_string(&RolloutStrategy::crd()).unwrap();
        let list = RESERVED_HEADERS
            .iter()
            .map(|h| format!("'{h}'"))
            .collect::<Vec<_>>()
            .join(", ");
        assert!(
            crd.contains(&format!("h.name.lowerAscii() in [{list}]")),
            "the CEL rule and RESERVED_HEADERS disagree"
        );
    }

    #[test]
    fn a_service_webhook_defaults_to_https_on_443_at_the_root() {
        let w: WebhookHook = serde_yaml::from_str("service: {name: deployer}").unwrap();
        let s = w.service.unwrap();
        assert_eq!(
            (s.port, s.path.as_str(), s.scheme),
            (443, "/", WebhookScheme::Https)
        );
        assert_eq!(w.request_timeout_seconds, 10);
    }
}
