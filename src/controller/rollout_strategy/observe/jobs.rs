//! The hook Jobs of a strategy ([`JobView`], [`JobState`]), the newest pod of each
//! ([`PodView`]), the hook pods still alive ([`HookPod`]), and the Jobs that status names but the
//! cache does not show ([`unseen_jobs`], [`any_job_exists`]).

use super::super::hooks::{ANNOTATION_TARGET_UID, LABEL_ATTEMPT, LABEL_HOOK, LABEL_REVISION};
use super::Observed;
use crate::api::{HookPhase, RolloutStrategyStatus};
use jiff::Timestamp;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client, ResourceExt, api::ListParams};

/// How a hook container ended.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Terminated {
    /// The container that ended (the first that failed, if any did).
    pub container: String,
    pub exit_code: i32,
    pub reason: Option<String>,
    pub message: Option<String>,
}

/// The newest pod of a hook Job.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodView {
    pub name: String,
    /// When its container started running, if it did.
    pub running_since: Option<Timestamp>,
    /// Why it is not running yet (`Unschedulable`, `ImagePullBackOff`, ...).
    pub waiting_reason: Option<String>,
    pub waiting_message: Option<String>,
    pub terminated: Option<Terminated>,
}

/// Where a hook Job is.
#[derive(Clone, Debug, PartialEq)]
pub enum JobState {
    Active,
    Succeeded {
        finished: Option<Timestamp>,
    },
    Failed {
        reason: String,
        message: String,
        finished: Option<Timestamp>,
    },
}

/// A hook Job of the strategy.
#[derive(Clone, Debug, PartialEq)]
pub struct JobView {
    pub name: String,
    /// UID of the Deployment the Job was made for (`None` for Jobs of older versions).
    pub target_uid: Option<String>,
    pub hook: String,
    pub revision: String,
    pub attempt: i32,
    pub created: Option<Timestamp>,
    pub state: JobState,
    pub pod: Option<PodView>,
    pub log_tail: Option<String>,
}

impl JobView {
    pub fn finished(&self) -> bool {
        !matches!(self.state, JobState::Active)
    }

    /// Whether the Job was made for the Deployment with `uid` (Jobs that do not say are taken
    /// to be).
    pub fn targets(&self, uid: &str) -> bool {
        self.target_uid.as_deref().is_none_or(|u| u == uid)
    }

    pub fn from_parts(job: &Job, pods: &[Pod]) -> Self {
        let labels = job.labels();
        let status = job.status.clone().unwrap_or_default();
        let cond = |t: &str| {
            status
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == t && c.status == "True")
                .cloned()
        };
        let state = if let Some(c) = cond("Complete") {
            JobState::Succeeded {
                finished: status
                    .completion_time
                    .map(|t| t.0)
                    .or(c.last_transition_time.map(|t| t.0)),
            }
        } else if let Some(c) = cond("Failed") {
            JobState::Failed {
                reason: c.reason.unwrap_or_else(|| "Failed".into()),
                message: c.message.unwrap_or_default(),
                finished: c.last_transition_time.map(|t| t.0),
            }
        } else {
            JobState::Active
        };
        let uid = job.uid();
        let pod = pods
            .iter()
            .filter(|p| {
                p.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == uid.as_ref())
            })
            .max_by_key(|p| p.creation_timestamp().map(|t| t.0))
            .map(pod_view);
        Self {
            name: job.name_any(),
            target_uid: job.annotations().get(ANNOTATION_TARGET_UID).cloned(),
            hook: labels.get(LABEL_HOOK).cloned().unwrap_or_default(),
            revision: labels.get(LABEL_REVISION).cloned().unwrap_or_default(),
            attempt: labels
                .get(LABEL_ATTEMPT)
                .and_then(|a| a.parse().ok())
                .unwrap_or(0),
            created: job.creation_timestamp().map(|t| t.0),
            state,
            pod,
            log_tail: None,
        }
    }
}

fn pod_view(p: &Pod) -> PodView {
    let status = p.status.clone().unwrap_or_default();
    let cs = status.container_statuses.unwrap_or_default();
    let mut view = PodView {
        name: p.name_any(),
        ..Default::default()
    };
    for c in &cs {
        let Some(state) = &c.state else { continue };
        if let Some(r) = &state.running {
            view.running_since = r
                .started_at
                .as_ref()
                .map(|t| t.0)
                .or(Some(Timestamp::now()));
        }
        if let Some(w) = &state.waiting {
            view.waiting_reason = w.reason.clone();
            view.waiting_message = w.message.clone();
        }
        if let Some(t) = &state.terminated {
            // The first failure explains the pod best; a success never hides one.
            if view.terminated.as_ref().is_some_and(|x| x.exit_code != 0) {
                continue;
            }
            view.terminated = Some(Terminated {
                container: c.name.clone(),
                exit_code: t.exit_code,
                reason: t.reason.clone(),
                message: t.message.clone(),
            });
            view.running_since = view.running_since.or(t.started_at.as_ref().map(|s| s.0));
        }
    }
    if view.running_since.is_none()
        && view.waiting_reason.is_none()
        && let Some(c) = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
    {
        view.waiting_reason = c.reason.clone();
        view.waiting_message = c.message.clone();
    }
    view
}

/// A pod of a hook Job that has not terminated (a deleting one included).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HookPod {
    pub name: String,
    /// Its Job (which may already be deleted).
    pub job: String,
}

impl HookPod {
    /// `Some` for a pod of a hook Job that is not in a terminal phase.
    pub fn live(p: &Pod) -> Option<Self> {
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return None;
        }
        let job = p
            .owner_references()
            .iter()
            .find(|o| o.kind == "Job")
            .map(|o| o.name.clone())
            .or_else(|| p.labels().get("batch.kubernetes.io/job-name").cloned())
            .unwrap_or_default();
        Some(Self {
            name: p.name_any(),
            job,
        })
    }
}

/// The Jobs that `status` records as created for a hook still running (an open entry with a
/// Job name) but that `observed` lacks: either deleted, or created so recently that the Job
/// cache has not seen them yet. Deciding on the latter would record the hook as failed
/// ("deleted before it finished"), so they are looked up before any decision is acted on.
pub fn unseen_jobs(status: &RolloutStrategyStatus, observed: &Observed) -> Vec<String> {
    status
        .hooks
        .iter()
        .filter(|h| matches!(h.phase, HookPhase::Pending | HookPhase::Running))
        .filter_map(|h| h.job_name.clone())
        .filter(|name| !observed.jobs.iter().any(|j| &j.name == name))
        .collect()
}

/// Whether any of the Jobs `names` exists in `ns`, read from the API server (a LIST by name,
/// which the Jobs permission already allows).
pub async fn any_job_exists(client: &Client, ns: &str, names: &[String]) -> kube::Result<bool> {
    let api: Api<Job> = Api::namespaced(client.clone(), ns);
    for name in names {
        let lp = ListParams::default().fields(&format!("metadata.name={name}"));
        if !api.list_metadata(&lp).await?.items.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
#[path = "jobs_tests.rs"]
pub(crate) mod tests;
