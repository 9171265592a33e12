//! `ballast_api_requests_total{verb,group,resource,code}`: every request the manager makes to
//! the API server, counted by a tower layer on its one client, with the verb and resource named
//! as RBAC names them (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
//! `deletecollection`; `pods/log`). It shows steady-state traffic, and it is how a test proves
//! that the ClusterRole grants nothing the manager does not use.
//!
//! `ballast_api_request_duration_seconds{verb,group,resource}`: how long each request other than
//! a watch took, from sending it until its response headers came (client-go's
//! `rest_client_request_duration_seconds`): where a slow reconcile spends its time, say a
//! Deployment write that the API server's admission makes slow.

use http::{Method, Request, Response, Uri};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
};
use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Instant,
};
use tower_layer::Layer;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRequestLabels {
    pub verb: &'static str,
    /// API group; empty for the core group and for non-resource paths.
    pub group: String,
    /// Resource, with its subresource (`pods/log`); the path for a non-resource request.
    pub resource: String,
    /// HTTP status, or `timeout` / `error` when no response came.
    pub code: String,
}

/// The labels of a request's duration: no response code, so that a series is one kind of
/// request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiDurationLabels {
    pub verb: &'static str,
    pub group: String,
    pub resource: String,
}

/// Buckets of [`ApiDurationLabels`], in seconds: a request to an API server nearby takes
/// milliseconds; one at the client's limit (`--api-timeout-seconds`, 30) lands in +Inf.
pub const DURATION_BUCKETS: [f64; 12] = [
    0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// A family of request durations with [`DURATION_BUCKETS`].
pub fn duration_family() -> Family<ApiDurationLabels, Histogram> {
    Family::new_with_constructor(|| Histogram::new(DURATION_BUCKETS))
}

/// What a request does, in RBAC's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub verb: &'static str,
    pub group: String,
    pub resource: String,
}

/// Names the verb, group and resource of a request to the API server.
pub fn classify(method: &Method, uri: &Uri) -> Target {
    let segments: Vec<&str> = uri.path().split('/').filter(|s| !s.is_empty()).collect();
    let query = uri.query().unwrap_or_default();
    let flag = |k: &str| {
        query
            .split('&')
            .any(|kv| kv == format!("{k}=true") || kv == format!("{k}=1"))
    };
    let (group, rest) = match segments.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => ("", &[][..]),
    };
    let rest = match rest {
        ["namespaces", _ns, inner @ ..] if !inner.is_empty() => inner,
        other => other,
    };
    let (resource, named) = match rest {
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub, ..] => (format!("{resource}/{sub}"), true),
        _ => {
            return Target {
                verb: non_resource_verb(method),
                group: String::new(),
                resource: uri.path().to_string(),
            };
        }
    };
    let verb = match *method {
        Method::GET | Method::HEAD if flag("watch") => "watch",
        Method::GET | Method::HEAD if named => "get",
        Method::GET | Method::HEAD => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    };
    Target {
        verb,
        group: group.to_string(),
        resource,
    }
}

fn non_resource_verb(method: &Method) -> &'static str {
    match *method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "post",
        Method::PUT => "put",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "other",
    }
}

/// Counts each request into a family of [`ApiRequestLabels`], and times each but the watches
/// into one of [`ApiDurationLabels`].
#[derive(Clone)]
pub struct ApiMetricsLayer {
    family: Family<ApiRequestLabels, Counter>,
    durations: Family<ApiDurationLabels, Histogram>,
}

impl ApiMetricsLayer {
    pub fn new(
        family: Family<ApiRequestLabels, Counter>,
        durations: Family<ApiDurationLabels, Histogram>,
    ) -> Self {
        Self { family, durations }
    }
}

impl<S> Layer<S> for ApiMetricsLayer {
    type Service = ApiMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ApiMetrics {
            inner,
            family: self.family.clone(),
            durations: self.durations.clone(),
        }
    }
}

pub struct ApiMetrics<S> {
    inner: S,
    family: Family<ApiRequestLabels, Counter>,
    durations: Family<ApiDurationLabels, Histogram>,
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for ApiMetrics<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = Response<ResB>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let target = classify(req.method(), req.uri());
        let family = self.family.clone();
        let durations = self.durations.clone();
        let started = Instant::now();
        let response = self.inner.call(req);
        Box::pin(async move {
            let result = response.await.map_err(Into::into);
            // A watch's response comes at once and its body streams for minutes: not timed.
            if target.verb != "watch" {
                durations
                    .get_or_create(&ApiDurationLabels {
                        verb: target.verb,
                        group: target.group.clone(),
                        resource: target.resource.clone(),
                    })
                    .observe(started.elapsed().as_secs_f64());
            }
            let code = match &result {
                Ok(r) => r.status().as_u16().to_string(),
                Err(e) if e.is::<crate::client::TimedOut>() => "timeout".into(),
                Err(_) => "error".into(),
            };
            family
                .get_or_create(&ApiRequestLabels {
                    verb: target.verb,
                    group: target.group,
                    resource: target.resource,
                    code,
                })
                .inc();
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(method: Method, uri: &str) -> (&'static str, String, String) {
        let t = classify(&method, &uri.parse().unwrap());
        (t.verb, t.group, t.resource)
    }

    fn t(verb: &'static str, group: &str, resource: &str) -> (&'static str, String, String) {
        (verb, group.into(), resource.into())
    }

    #[test]
    fn requests_are_named_as_rbac_names_them() {
        let cases = [
            (
                Method::GET,
                "/apis/apps/v1/namespaces/shop/deployments/web",
                t("get", "apps", "deployments"),
            ),
            (
                Method::GET,
                "/apis/apps/v1/namespaces/shop/deployments?labelSelector=a%3Db",
                t("list", "apps", "deployments"),
            ),
            (
                Method::GET,
                "/apis/apps/v1/deployments?watch=true&resourceVersion=5&timeoutSeconds=290",
                t("watch", "apps", "deployments"),
            ),
            (Method::GET, "/api/v1/nodes", t("list", "", "nodes")),
            (
                Method::GET,
                "/api/v1/namespaces/shop/pods/web-1/log?tailLines=20",
                t("get", "", "pods/log"),
            ),
            (
                Method::PATCH,
                "/apis/ballast.dev/v1alpha1/namespaces/shop/rolloutstrategies/web/status?fieldManager=x",
                t("patch", "ballast.dev", "rolloutstrategies/status"),
            ),
            (
                Method::POST,
                "/apis/batch/v1/namespaces/shop/jobs",
                t("create", "batch", "jobs"),
            ),
            (
                Method::DELETE,
                "/apis/batch/v1/namespaces/shop/jobs/web-migrate-1",
                t("delete", "batch", "jobs"),
            ),
            (
                Method::DELETE,
                "/apis/batch/v1/namespaces/shop/jobs",
                t("deletecollection", "batch", "jobs"),
            ),
            (
                Method::PUT,
                "/apis/coordination.k8s.io/v1/namespaces/ballast-system/leases/ballast-leader",
                t("update", "coordination.k8s.io", "leases"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces",
                t("list", "", "namespaces"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/shop",
                t("get", "", "namespaces"),
            ),
            (Method::GET, "/version", t("get", "", "/version")),
            (Method::GET, "/apis/apps/v1", t("get", "", "/apis/apps/v1")),
        ];
        for (method, uri, want) in cases {
            assert_eq!(target(method, uri), want, "{uri}");
        }
    }
}
