//! The monitor of a "nothing lost" run: it polls the namespace every 200 ms for what must
//! never be seen even for a moment — two pods of one hook running, a pod of the new revision
//! before the pre hooks passed, a mid hook before its point or the rollout moving on while it
//! runs (or before an approval), a post hook before the rollout completed — and keeps every
//! hook Job and pod it saw for the checks at the end.

use crate::lost::{APPROVAL, Case, SURGE};
use ballast::api::{RolloutPhase, RolloutStrategy};
use jiff::Timestamp;
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    batch::v1::Job,
    core::v1::Pod,
};
use kube::{Api, Client, ResourceExt, api::ListParams};
use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

pub fn image_of_rs(rs: &ReplicaSet) -> String {
    rs.spec
        .as_ref()
        .and_then(|s| {
            s.template.as_ref()?.spec.as_ref()?.containers[0]
                .image
                .clone()
        })
        .unwrap_or_default()
}

fn image_of_pod(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.containers[0].image.clone())
        .unwrap_or_default()
}

#[derive(Debug)]
pub struct JobSeen {
    pub hook: String,
    pub succeeded: bool,
}

#[derive(Debug)]
pub struct PodSeen {
    pub hook: String,
    pub started: Option<Timestamp>,
    pub finished: Option<Timestamp>,
    pub succeeded: bool,
}

/// What the monitor saw: every hook Job and pod (by UID), and every violation.
#[derive(Debug, Default)]
pub struct Observed {
    pub jobs: BTreeMap<String, JobSeen>,
    pub pods: BTreeMap<String, PodSeen>,
    pub violations: Vec<String>,
    /// Per mid point (a hook, or the approval gate): its `at`, and how many new pods the
    /// ReplicaSet wanted when it was first seen holding there. More than `at` + surge means
    /// the Deployment controller got past the point before the pause landed.
    pub held: BTreeMap<String, (i32, i32)>,
    reported: BTreeSet<String>,
}

impl Observed {
    fn violate(&mut self, key: &str, what: String) {
        if self.reported.insert(key.to_string()) {
            self.violations.push(what);
        }
    }

    /// (start, finish) of each hook pod that started, per hook; a pod still running counts as
    /// running until now.
    pub fn runs_by_hook(&self) -> BTreeMap<String, Vec<(Timestamp, Timestamp)>> {
        let mut out: BTreeMap<String, Vec<(Timestamp, Timestamp)>> = BTreeMap::new();
        for p in self.pods.values() {
            if let Some(start) = p.started {
                out.entry(p.hook.clone())
                    .or_default()
                    .push((start, p.finished.unwrap_or_else(Timestamp::now)));
            }
        }
        out
    }
}

/// Polls the namespace every 200 ms for what must never be seen.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<Observed>>,
}

impl Monitor {
    pub fn spawn(client: Client, ns: &str, case: Case, approved: Arc<AtomicBool>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Observed::default()));
        let apis = Apis {
            jobs: Api::namespaced(client.clone(), ns),
            pods: Api::namespaced(client.clone(), ns),
            rss: Api::namespaced(client.clone(), ns),
            deployments: Api::namespaced(client.clone(), ns),
            strategies: Api::namespaced(client, ns),
        };
        let task = tokio::spawn({
            let (stop, seen) = (stop.clone(), seen.clone());
            async move {
                while !stop.load(Ordering::SeqCst) {
                    poll(&case, &apis, &approved, &seen).await;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        });
        Self { stop, task, seen }
    }

    pub async fn stop(self) -> Observed {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.task.await;
        std::mem::take(&mut *self.seen.lock().unwrap())
    }
}

struct Apis {
    jobs: Api<Job>,
    pods: Api<Pod>,
    rss: Api<ReplicaSet>,
    deployments: Api<Deployment>,
    strategies: Api<RolloutStrategy>,
}

fn hook_of<K: kube::Resource>(o: &K) -> Option<String> {
    o.meta().labels.as_ref()?.get("ballast.dev/hook").cloned()
}

/// Whether a hook Job (or one of its pods) has finished.
fn job_finished(j: &Job) -> bool {
    j.status
        .as_ref()
        .is_some_and(|s| s.succeeded.unwrap_or(0) > 0 || s.failed.unwrap_or(0) > 0)
}

/// One look at the namespace. The reads are ordered so that a check never blames the operator
/// for a change that happened between two reads: a Job listed *before* the ReplicaSets must
/// find the rollout where its hook belongs (progress only moves forward); a hook still running
/// *after* the ReplicaSets were read was running while they looked like that.
async fn poll(case: &Case, apis: &Apis, approved: &AtomicBool, seen: &Mutex<Observed>) {
    let Apis {
        jobs,
        pods,
        rss,
        deployments,
        strategies,
    } = apis;
    let lp = ListParams::default();
    let Ok(strategy) = strategies.get("web").await else {
        return;
    };
    let st = strategy.status.unwrap_or_default();
    let waiting_approval = st.phase == Some(RolloutPhase::WaitingApproval);
    let Ok(jobs_before) = jobs.list(&lp).await else {
        return;
    };
    let Ok(rs_list) = rss.list(&lp).await else {
        return;
    };
    let Ok(app_pods) = pods.list(&ListParams::default().labels("app=web")).await else {
        return;
    };
    let Ok(dep) = deployments.get("web").await else {
        return;
    };
    let paused = dep.spec.as_ref().and_then(|s| s.paused) == Some(true);
    let was_approved = approved.load(Ordering::SeqCst);
    let Ok(jobs_after) = jobs.list(&lp).await else {
        return;
    };
    let Ok(hook_pods) = pods
        .list(&ListParams::default().labels("ballast.dev/hook"))
        .await
    else {
        return;
    };

    let new_rs = rs_list.items.iter().find(|r| image_of_rs(r) == "web:2");
    let new_spec = new_rs.and_then(|r| r.spec.as_ref()?.replicas).unwrap_or(0);
    let new_available = new_rs
        .and_then(|r| r.status.as_ref()?.available_replicas)
        .unwrap_or(0);
    let new_pods = app_pods
        .items
        .iter()
        .filter(|p| image_of_pod(p) == "web:2")
        .count() as i32;
    let old_pods = app_pods
        .items
        .iter()
        .filter(|p| image_of_pod(p) == "web:1")
        .count() as i32;
    let old_replicas: i32 = rs_list
        .items
        .iter()
        .filter(|r| image_of_rs(r) == "web:1")
        .filter_map(|r| Some(r.status.as_ref()?.replicas))
        .sum();

    let mut o = seen.lock().unwrap();
    // Record Jobs and hook pods.
    for j in jobs_before.items.iter().chain(&jobs_after.items) {
        let (Some(uid), Some(hook)) = (j.uid(), hook_of(j)) else {
            continue;
        };
        let succeeded = j.status.as_ref().and_then(|s| s.succeeded).unwrap_or(0) > 0;
        let e = o.jobs.entry(uid).or_insert(JobSeen {
            hook,
            succeeded: false,
        });
        e.succeeded |= succeeded;
    }
    let mut running: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in &hook_pods.items {
        let (Some(uid), Some(hook)) = (p.uid(), hook_of(p)) else {
            continue;
        };
        let status = p.status.as_ref();
        let state = status
            .and_then(|s| s.container_statuses.as_ref()?.first()?.state.clone())
            .unwrap_or_default();
        let started = state
            .running
            .as_ref()
            .and_then(|r| r.started_at.as_ref().map(|t| t.0))
            .or_else(|| {
                state
                    .terminated
                    .as_ref()
                    .and_then(|t| t.started_at.as_ref().map(|t| t.0))
            });
        let finished = state
            .terminated
            .as_ref()
            .and_then(|t| t.finished_at.as_ref().map(|t| t.0));
        let phase = status.and_then(|s| s.phase.clone()).unwrap_or_default();
        if phase == "Running" {
            running.entry(hook.clone()).or_default().push(p.name_any());
        }
        let e = o.pods.entry(uid).or_insert(PodSeen {
            hook,
            started: None,
            finished: None,
            succeeded: false,
        });
        e.started = e.started.or(started);
        e.finished = e.finished.or(finished);
        e.succeeded |= phase == "Succeeded";
    }
    for (hook, names) in &running {
        if names.len() > 1 {
            o.violate(
                &format!("two-running-{hook}"),
                format!("two pods of hook {hook} running at once: {names:?}"),
            );
        }
    }

    // A hook is done once its Job or one of its pods says so.
    let hook_done = |hook: &str, o: &Observed| {
        o.jobs.values().any(|j| j.hook == hook && j.succeeded)
            || o.pods.values().any(|p| p.hook == hook && p.succeeded)
    };
    let running_after = |hook: &str| {
        jobs_after
            .items
            .iter()
            .filter(|j| hook_of(*j).as_deref() == Some(hook))
            .any(|j| !job_finished(j))
    };
    let exists_before = |hook: &str| {
        jobs_before
            .items
            .iter()
            .any(|j| hook_of(j).as_deref() == Some(hook))
    };

    // No pod of the new revision before the pre hooks passed.
    let pre_pending: Vec<&str> = case
        .pre
        .iter()
        .copied()
        .filter(|h| !hook_done(h, &o))
        .collect();
    if !pre_pending.is_empty() && (new_pods > 0 || new_spec > 0) {
        o.violate(
            "new-before-pre",
            format!(
                "{new_pods} pod(s) of the new revision (ReplicaSet wants {new_spec}) before pre hooks {pre_pending:?} passed"
            ),
        );
    }
    for (hook, at) in &case.mid {
        if exists_before(hook) {
            let held = o.held.entry(hook.to_string()).or_insert((*at, new_spec)).1;
            if running_after(hook) && !case.recreate && new_spec > held + SURGE {
                o.violate(
                    &format!("mid-passed-{hook}"),
                    format!(
                        "the rollout went on from {held} to {new_spec} new pod(s) while mid hook {hook} ran"
                    ),
                );
            }
            if case.recreate {
                if old_pods > 0 || old_replicas > 0 {
                    o.violate(
                        &format!("mid-early-{hook}"),
                        format!("Recreate mid hook {hook} runs while {old_pods} old pod(s) exist"),
                    );
                }
            } else if new_available < *at {
                o.violate(
                    &format!("mid-early-{hook}"),
                    format!("mid hook {hook} (at {at}) started with {new_available} new pod(s) available"),
                );
            }
        }
        if running_after(hook) {
            if !paused {
                o.violate(
                    &format!("mid-unpaused-{hook}"),
                    format!("the Deployment is not paused while mid hook {hook} runs"),
                );
            }
            if case.recreate && new_pods > 0 {
                o.violate(
                    &format!("mid-passed-{hook}"),
                    format!("{new_pods} new pod(s) while the Recreate mid hook {hook} runs"),
                );
            }
        }
    }
    if let Some(at) = case.approval_at
        && waiting_approval
    {
        let held = o.held.entry(APPROVAL.into()).or_insert((at, new_spec)).1;
        if !was_approved && new_spec > held + SURGE {
            o.violate(
                "approval-passed",
                format!(
                    "the rollout went on from {held} to {new_spec} new pod(s) before the approval gate was approved"
                ),
            );
        }
    }
    for hook in &case.post {
        if exists_before(hook) && (new_available < case.replicas || old_replicas > 0) {
            o.violate(
                &format!("post-early-{hook}"),
                format!(
                    "post hook {hook} exists while the rollout is incomplete ({new_available}/{} new available, {old_replicas} old)",
                    case.replicas
                ),
            );
        }
    }
}
