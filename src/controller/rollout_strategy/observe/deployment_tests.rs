use super::*;
use serde_json::json;

pub(crate) fn deployment() -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "uid": "d1", "generation": 3, "resourceVersion": "7"},
        "spec": {
            "paused": true, "replicas": 3,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "app", "image": "web:2"}]}}
        },
        "status": {"observedGeneration": 3, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3, "availableReplicas": 3}
    }))
    .unwrap()
}

pub(crate) fn replica_set(owner: &str, image: &str, available: i32) -> ReplicaSet {
    serde_json::from_value(json!({
        "metadata": {"name": format!("web-{image}"), "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": owner, "controller": true}]},
        "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"metadata": {"labels": {"app": "web", "pod-template-hash": "abc"}}, "spec": {"containers": [{"name": "app", "image": image}]}}},
        "status": {"replicas": available, "availableReplicas": available}
    }))
    .unwrap()
}

#[test]
fn deployment_view_knows_its_revision_and_its_replica_sets() {
    let d = deployment();
    let rss = [
        replica_set("d1", "web:2", 3),
        replica_set("d1", "web:1", 0),
        replica_set("other", "web:2", 5),
    ];
    let v = DeploymentView::from_parts(&d, &rss);
    assert!(v.paused && v.recreate && v.observed());
    assert_eq!(v.replicas, 3);
    assert_eq!(v.replica_sets.len(), 2, "only its own ReplicaSets");
    assert_eq!(v.available_of(&v.revision), 3);
    assert!(v.has_replica_set_of(&v.revision));
    assert!(v.complete());
    assert!(v.ever_rolled_out());
}

#[test]
fn a_deployment_not_yet_observed_is_not_complete() {
    let mut d = deployment();
    d.metadata.generation = Some(4);
    let v = DeploymentView::from_parts(&d, &[replica_set("d1", "web:2", 3)]);
    assert!(!v.complete());
}

#[test]
fn the_trimmed_cache_still_knows_who_paused_the_deployment() {
    let mut d: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "uid": "u", "managedFields": [
            {"manager": "kubectl-client-side-apply", "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:replicas": {}, "f:template": {}}}},
            {"manager": "kubectl-rollout", "operation": "Update", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:spec": {"f:paused": {}}}}
        ]},
        "spec": {"paused": true, "selector": {}, "template": {}}
    }))
    .unwrap();
    trim_deployment(&mut d);
    let fields = d.metadata.managed_fields.as_ref().unwrap();
    assert_eq!(fields.len(), 1, "only the owner of spec.paused is kept");
    let v = DeploymentView::from_parts(&d, &[]);
    assert_eq!(v.paused_by_someone_else(), Some("kubectl-rollout"));
}
