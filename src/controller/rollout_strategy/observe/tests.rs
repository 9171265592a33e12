use super::deployment::tests::{deployment, replica_set};
use super::jobs::tests::{job, pod};
use super::*;
use serde_json::json;

fn labelled(mut meta: ObjectMeta, strategy: &str) -> ObjectMeta {
    meta.labels
        .get_or_insert_default()
        .insert(LABEL_STRATEGY.into(), label_value(strategy));
    meta
}

#[test]
fn reduce_keeps_only_the_strategys_jobs_and_pods() {
    let mut mine = job(json!({"active": 1}));
    mine.metadata = labelled(mine.metadata, "web");
    let mut other = job(json!({"active": 1}));
    other.metadata = labelled(other.metadata, "api");
    other.metadata.name = Some("api-migrate-b-1".into());
    let mut running = pod(json!({"phase": "Running"}));
    running.metadata = labelled(running.metadata, "web");
    let mut theirs = pod(json!({"phase": "Running"}));
    theirs.metadata = labelled(theirs.metadata, "api");
    theirs.metadata.name = Some("q".into());
    let o = reduce(
        "web",
        Some(&deployment()),
        &[
            replica_set("d1", "web:2", 3),
            replica_set("other", "web:1", 1),
        ],
        &[mine, other],
        &[running, theirs],
    );
    let names: Vec<&str> = o.jobs.iter().map(|j| j.name.as_str()).collect();
    assert_eq!(names, ["web-migrate-b-1"]);
    assert_eq!(o.jobs[0].pod.as_ref().map(|p| p.name.as_str()), Some("p"));
    assert_eq!(o.live_pods.len(), 1);
    assert_eq!(o.live_pods[0].job, "web-migrate-b-1");
    assert_eq!(o.deployment.unwrap().replica_sets.len(), 1);
    assert!(reduce("web", None, &[], &[], &[]).deployment.is_none());
}
