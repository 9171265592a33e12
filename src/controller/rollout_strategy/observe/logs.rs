//! The tail of a failed hook's log: one request each, only for a hook whose end is about to be
//! recorded.

use super::{JobState, Observed};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, api::LogParams};
use std::time::Duration;

/// Lines of a failed hook's log kept in status.
pub const LOG_TAIL_LINES: i64 = 20;
/// Longest log tail kept in status, in bytes.
pub const LOG_TAIL_BYTES: usize = 2048;

/// Fetches the log tail of the failed Jobs named in `want_logs` (the hooks whose end is about
/// to be recorded): one request each.
pub async fn read_log_tails(
    client: &Client,
    ns: &str,
    observed: &mut Observed,
    want_logs: &[String],
) {
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), ns);
    for v in observed.jobs.iter_mut() {
        if !want_logs.contains(&v.name) || !matches!(v.state, JobState::Failed { .. }) {
            continue;
        }
        let Some(pod) = &v.pod else { continue };
        let container = pod.terminated.as_ref().map(|t| t.container.clone());
        v.log_tail = log_tail(&pods_api, &pod.name, container).await;
    }
}

/// The last lines of a pod's log, or `None` when there is none to read (kwok pods, pods whose
/// node is gone) — callers fall back to the terminated state.
async fn log_tail(pods: &Api<Pod>, name: &str, container: Option<String>) -> Option<String> {
    let params = LogParams {
        container,
        tail_lines: Some(LOG_TAIL_LINES),
        limit_bytes: Some(LOG_TAIL_BYTES as i64 * 4),
        ..Default::default()
    };
    let text = tokio::time::timeout(Duration::from_secs(3), pods.logs(name, &params))
        .await
        .ok()?
        .ok()?;
    let text = text.trim_end();
    if text.is_empty() {
        return None;
    }
    let start = text.len().saturating_sub(LOG_TAIL_BYTES);
    let start = (start..text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    Some(text[start..].to_string())
}
