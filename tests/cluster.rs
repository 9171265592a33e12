//! The local control plane is real: the Deployment, ReplicaSet and Job
//! controllers, the scheduler and kwok's simulated kubelets do their jobs.

mod support;

use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    batch::v1::Job,
    core::v1::{Event, Node, Pod},
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use std::{collections::BTreeMap, time::Duration};
use support::{TestNamespace, cluster, wait_until};

fn deployment(name: &str, replicas: i32, anti_affinity_zone: bool) -> Deployment {
    let mut spec = json!({
        "containers": [{"name": "app", "image": "registry.example/app:1"}],
    });
    if anti_affinity_zone {
        spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"app": name}},
            "topologyKey": "topology.kubernetes.io/zone",
        }]}});
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }))
    .unwrap()
}

fn job(name: &str, fail: bool) -> Job {
    let mut labels = json!({"job": name});
    if fail {
        labels["pod-container-running-failed.stage.kwok.x-k8s.io"] = json!("true");
    }
    serde_json::from_value(json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "registry.example/job:1"}]},
            },
        },
    }))
    .unwrap()
}

async fn running_pods(pods: &Api<Pod>, selector: &str) -> Vec<Pod> {
    pods.list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect()
}

#[tokio::test]
async fn deployment_gets_a_replicaset_and_running_pods_on_kwok_nodes() {
    let c = cluster().await;
    let ns = TestNamespace::new(&c, "cluster-deploy").await;
    let deploys: Api<Deployment> = Api::namespaced(c.client.clone(), &ns.name);
    deploys
        .create(&PostParams::default(), &deployment("web", 3, false))
        .await
        .unwrap();

    let rss: Api<ReplicaSet> = Api::namespaced(c.client.clone(), &ns.name);
    wait_until(
        "a ReplicaSet owned by the Deployment",
        Duration::from_secs(60),
        || async {
            let list = rss
                .list(&ListParams::default().labels("app=web"))
                .await
                .ok()?;
            list.items.into_iter().find(|rs| {
                rs.owner_references()
                    .iter()
                    .any(|o| o.kind == "Deployment" && o.name == "web")
            })
        },
    )
    .await;

    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns.name);
    let running = wait_until("3 Running pods", Duration::from_secs(90), || async {
        let r = running_pods(&pods, "app=web").await;
        (r.len() == 3).then_some(r)
    })
    .await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    for p in &running {
        let node = p
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .expect("scheduled");
        let node = nodes.get(&node).await.unwrap();
        assert_eq!(
            node.labels().get("type").map(String::as_str),
            Some("kwok"),
            "pod on a kwok node"
        );
    }
    wait_until(
        "the Deployment to be available",
        Duration::from_secs(60),
        || async {
            let d = deploys.get("web").await.ok()?;
            (d.status?.available_replicas? == 3).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn required_zone_anti_affinity_places_one_pod_per_zone_and_a_fourth_stays_pending() {
    let c = cluster().await;
    let ns = TestNamespace::new(&c, "cluster-anti").await;
    let deploys: Api<Deployment> = Api::namespaced(c.client.clone(), &ns.name);
    deploys
        .create(&PostParams::default(), &deployment("spread", 3, true))
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns.name);
    let running = wait_until("3 Running pods", Duration::from_secs(90), || async {
        let r = running_pods(&pods, "app=spread").await;
        (r.len() == 3).then_some(r)
    })
    .await;
    let nodes: Api<Node> = Api::all(c.client.clone());
    let mut per_zone = BTreeMap::new();
    for p in &running {
        let node = nodes
            .get(p.spec.as_ref().unwrap().node_name.as_ref().unwrap())
            .await
            .unwrap();
        let zone = node.labels()["topology.kubernetes.io/zone"].clone();
        *per_zone.entry(zone).or_insert(0) += 1;
    }
    assert_eq!(
        per_zone,
        BTreeMap::from([
            ("zone-a".to_string(), 1),
            ("zone-b".to_string(), 1),
            ("zone-c".to_string(), 1)
        ])
    );

    deploys
        .patch(
            "spread",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 4}})),
        )
        .await
        .unwrap();
    let pending = wait_until(
        "a 4th pod that is Pending and unscheduled",
        Duration::from_secs(60),
        || async {
            let list = pods
                .list(&ListParams::default().labels("app=spread"))
                .await
                .ok()?;
            list.items.into_iter().find(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
                    && p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none()
            })
        },
    )
    .await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), &ns.name);
    let pod_name = pending.name_any();
    let event = wait_until(
        "a FailedScheduling event for the 4th pod",
        Duration::from_secs(60),
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("FailedScheduling")
                    && e.involved_object.name.as_deref() == Some(&pod_name)
            })
        },
    )
    .await;
    let message = event.message.unwrap_or_default();
    assert!(
        message.contains("anti-affinity"),
        "unexpected FailedScheduling message: {message}"
    );
    // Still Pending after the scheduler gave its verdict.
    let p = pods.get(&pod_name).await.unwrap();
    assert_eq!(p.status.unwrap().phase.as_deref(), Some("Pending"));
}

#[tokio::test]
async fn a_job_completes() {
    let c = cluster().await;
    let ns = TestNamespace::new(&c, "cluster-job").await;
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), &ns.name);
    jobs.create(&PostParams::default(), &job("ok", false))
        .await
        .unwrap();
    wait_until("the Job to complete", Duration::from_secs(90), || async {
        let j = jobs.get("ok").await.ok()?;
        let complete = j
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Complete" && c.status == "True");
        complete.then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_job_whose_pod_carries_the_failure_label_fails_with_exit_code_1() {
    let c = cluster().await;
    let ns = TestNamespace::new(&c, "cluster-jobfail").await;
    let jobs: Api<Job> = Api::namespaced(c.client.clone(), &ns.name);
    jobs.create(&PostParams::default(), &job("bad", true))
        .await
        .unwrap();
    wait_until("the Job to fail", Duration::from_secs(90), || async {
        let j = jobs.get("bad").await.ok()?;
        let failed = j
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Failed" && c.status == "True");
        failed.then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns.name);
    let list = pods
        .list(&ListParams::default().labels("job=bad"))
        .await
        .unwrap();
    let exit = list.items.iter().find_map(|p| {
        p.status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .state
            .as_ref()?
            .terminated
            .as_ref()
            .map(|t| t.exit_code)
    });
    assert_eq!(exit, Some(1));
}
