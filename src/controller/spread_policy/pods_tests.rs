use super::*;
use serde_json::json;

fn pod(name: &str, owner: (&str, &str), hash: &str, node: Option<&str>, phase: &str) -> WatchedPod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"), "resourceVersion": "7",
                     "creationTimestamp": "2026-01-01T00:00:10Z",
                     "labels": {"app": "web", "pod-template-hash": hash, "other": "x".repeat(200)},
                     "annotations": {"controller.kubernetes.io/pod-deletion-cost": "-3", "big": "y".repeat(5000)},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner.0, "name": owner.1, "uid": "u", "controller": true}],
                     "managedFields": [{"manager": "ballast.dev/spread-policy", "operation": "Apply",
                                        "fieldsV1": {"f:metadata": {"f:annotations": {"f:controller.kubernetes.io/pod-deletion-cost": {}}}}}]},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "x"}]},
        "status": {"phase": phase, "conditions": [
            {"type": "PodScheduled", "status": if node.is_some() {"True"} else {"False"}, "reason": "Unschedulable",
             "message": "0/6 nodes are available"},
            {"type": "Ready", "status": if phase == "Running" {"True"} else {"False"}}]},
    }))
    .unwrap()
}

#[test]
fn a_pod_is_read_into_its_view_and_its_deployment() {
    let p = pod(
        "web-5d8f-abc",
        ("ReplicaSet", "web-5d8f"),
        "5d8f",
        Some("n1"),
        "Running",
    );
    assert_eq!(p.workload, Some((WorkloadKind::Deployment, "web".into())));
    let v = &p.view;
    assert_eq!(
        (
            &*v.name,
            v.revision.as_deref(),
            v.node.as_deref(),
            v.phase,
            v.ready
        ),
        (
            "web-5d8f-abc",
            Some("5d8f"),
            Some("n1"),
            Phase::Running,
            true
        )
    );
    assert_eq!(
        (v.deletion_cost, v.cost_ours, v.created),
        (Some(-3), true, 1767225610)
    );
    assert_eq!(v.unschedulable, None, "scheduled");
    let pending = pod(
        "web-5d8f-x",
        ("ReplicaSet", "web-5d8f"),
        "5d8f",
        None,
        "Pending",
    );
    assert_eq!(
        pending.view.unschedulable.as_deref(),
        Some("0/6 nodes are available")
    );
}

#[test]
fn pods_of_a_replica_set_without_a_deployment_or_of_a_job_belong_to_no_workload() {
    let bare = pod(
        "x-1",
        ("ReplicaSet", "handmade"),
        "5d8f",
        Some("n1"),
        "Running",
    );
    assert_eq!(bare.workload, None);
    let job = pod("j-1", ("Job", "j"), "5d8f", Some("n1"), "Running");
    assert_eq!(job.workload, None);
    let sts = pod(
        "db-0",
        ("StatefulSet", "db"),
        "db-7c",
        Some("n1"),
        "Running",
    );
    assert_eq!(sts.workload, Some((WorkloadKind::StatefulSet, "db".into())));
}

#[test]
fn the_index_files_pods_by_workload_and_reports_only_real_changes() {
    let idx = PodIndex::default();
    idx.apply(watcher::Event::Init);
    idx.apply(watcher::Event::InitApply(pod(
        "web-h-1",
        ("ReplicaSet", "web-h"),
        "h",
        Some("n1"),
        "Running",
    )));
    assert_eq!(idx.apply(watcher::Event::InitDone), Changed::All);
    let web = (
        "shop".to_string(),
        WorkloadKind::Deployment,
        "web".to_string(),
    );
    let p2 = pod("web-h-2", ("ReplicaSet", "web-h"), "h", None, "Pending");
    assert_eq!(
        idx.apply(watcher::Event::Apply(p2.clone())),
        Changed::Some(vec![web.clone()])
    );
    // The same view again (a status update ballast does not read): nothing changed.
    assert_eq!(
        idx.apply(watcher::Event::Apply(p2.clone())),
        Changed::Some(vec![])
    );
    assert_eq!(idx.pods("shop", WorkloadKind::Deployment, "web").len(), 2);
    // Orphaned: it leaves the workload.
    let mut orphan = p2.clone();
    orphan.workload = None;
    assert_eq!(
        idx.apply(watcher::Event::Apply(orphan)),
        Changed::Some(vec![web.clone()])
    );
    assert_eq!(idx.pods("shop", WorkloadKind::Deployment, "web").len(), 1);
    assert_eq!(
        idx.apply(watcher::Event::Delete(pod(
            "web-h-1",
            ("ReplicaSet", "web-h"),
            "h",
            None,
            "Running"
        ))),
        Changed::Some(vec![web])
    );
    assert!(idx.pods("shop", WorkloadKind::Deployment, "web").is_empty());
    assert!(idx.is_empty());
}
