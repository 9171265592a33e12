use super::*;
use serde_json::json;

pub(crate) fn job(status: serde_json::Value) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": "web-migrate-b-1", "uid": "j1", "labels": {"ballast.dev/hook": "migrate", "ballast.dev/revision": "b", "ballast.dev/attempt": "1"}},
        "status": status
    }))
    .unwrap()
}

pub(crate) fn pod(status: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "p", "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "web-migrate-b-1", "uid": "j1"}]},
        "status": status
    }))
    .unwrap()
}

#[test]
fn a_failed_job_carries_its_pods_exit_code() {
    let j = job(
        json!({"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "m"}]}),
    );
    let p = pod(
        json!({"phase": "Failed", "containerStatuses": [{"name": "t", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "boom"}}}]}),
    );
    let v = JobView::from_parts(&j, &[p]);
    assert_eq!((v.hook.as_str(), v.attempt), ("migrate", 1));
    assert!(
        matches!(v.state, JobState::Failed { ref reason, .. } if reason == "BackoffLimitExceeded")
    );
    let t = v.pod.unwrap().terminated.unwrap();
    assert_eq!((t.exit_code, t.message.as_deref()), (1, Some("boom")));
}

#[test]
fn an_unschedulable_pod_says_why_it_waits() {
    let j = job(json!({"active": 1}));
    let p = pod(
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/6 nodes"}]}),
    );
    let v = JobView::from_parts(&j, &[p]);
    assert_eq!(v.state, JobState::Active);
    let p = v.pod.unwrap();
    assert_eq!(p.waiting_reason.as_deref(), Some("Unschedulable"));
    assert!(p.running_since.is_none());
}

#[test]
fn a_job_status_names_but_the_cache_lacks_is_unseen() {
    use crate::api::HookStatus;
    let entry = |name: &str, phase: HookPhase| HookStatus {
        name: name.into(),
        phase,
        job_name: Some(format!("web-{name}-b-1")),
        ..Default::default()
    };
    let status = RolloutStrategyStatus {
        hooks: vec![
            entry("migrate", HookPhase::Running),
            entry("seed", HookPhase::Pending),
            entry("purge", HookPhase::Succeeded),
        ],
        ..Default::default()
    };
    let cached = Observed {
        deployment: None,
        jobs: vec![JobView::from_parts(&job(json!({"active": 1})), &[])],
        live_pods: vec![],
    };
    // migrate's Job is cached; purge ended, so its Job no longer matters.
    assert_eq!(unseen_jobs(&status, &cached), ["web-seed-b-1"]);
}

#[test]
fn a_complete_job_succeeded() {
    let j = job(
        json!({"conditions": [{"type": "Complete", "status": "True"}], "completionTime": "2026-01-01T00:00:00Z"}),
    );
    let v = JobView::from_parts(&j, &[]);
    assert!(matches!(v.state, JobState::Succeeded { finished: Some(_) }));
    assert!(v.finished());
}
