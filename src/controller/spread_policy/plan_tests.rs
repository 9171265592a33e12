use super::*;
use crate::controller::spread_policy::select::Governor;
use crate::controller::spread_policy::tracker::Seen;
use crate::controller::spread_policy::workload::{PodSelector, Rollout};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;
use std::sync::Arc;

fn policy(extra: serde_json::Value) -> SpreadPolicy {
    let mut spec = json!({"selector": {"matchLabels": {"tier": "web"}},
        "spread": [{"topologyKey": "zone", "mode": "Required"}]});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    let mut p: SpreadPolicy = serde_json::from_value(json!({
        "apiVersion": "ballast.dev/v1alpha1", "kind": "SpreadPolicy",
        "metadata": {"name": "web-ha", "namespace": "shop"}, "spec": spec,
    }))
    .unwrap();
    p.metadata.creation_timestamp = Some(Time(Timestamp::from_second(100).unwrap()));
    p
}

fn deleting(mut p: SpreadPolicy) -> SpreadPolicy {
    p.metadata.deletion_timestamp = Some(Time(Timestamp::from_second(200).unwrap()));
    p
}

fn web(name: &str) -> Workload {
    Workload {
        kind: WorkloadKind::Deployment,
        name: name.into(),
        namespace: "shop".into(),
        labels: [("tier".to_string(), "web".to_string())].into(),
        selector: PodSelector {
            match_labels: [("app", name)].into(),
            ..Default::default()
        },
        replicas: 3,
        resource_version: Some("1".into()),
        ..Default::default()
    }
}

/// `w` as it is once `p`'s terms are written into it.
fn carrying(p: &SpreadPolicy, mut w: Workload) -> Workload {
    let terms = desired_terms(&p.spec, w.kind, &w.selector.to_label_selector());
    let m = merge(&w, &Terms::default(), &terms);
    w.affinity.pod_anti_affinity = Some(k8s_openapi::api::core::v1::PodAntiAffinity {
        required_during_scheduling_ignored_during_execution: Some(m.anti_affinity_required),
        ..Default::default()
    });
    w.record = Some(record_text(&m.ours));
    w.annotations = [(ANNOTATION_POLICY.to_string(), p.name_any())].into();
    w
}

fn run(p: &SpreadPolicy, ws: &[Workload]) -> Plan {
    run_tracked(p, ws, &Seen::default())
}

/// As [`run`], with what the tracker knows of our writes.
fn run_tracked(p: &SpreadPolicy, ws: &[Workload], tracked: &Seen) -> Plan {
    let ws: Vec<Arc<Workload>> = ws.iter().cloned().map(Arc::new).collect();
    plan(&Inputs {
        policy: &Governor::from(p.clone()),
        policies: &[Arc::new(Governor::from(p.clone()))],
        budget_used_elsewhere: 0,
        workloads: &ws,
        nodes: &[],
        pods: &PodSnapshot::new(),
        tracked,
        evicted: &Default::default(),
        now: Timestamp::from_second(1000).unwrap(),
    })
}

#[test]
fn pending_pods_are_summed_over_the_workloads_the_nodes_cannot_place() {
    // Required over `zone`, two zones: 3 replicas leave 1 Pending, 5 leave 3, 2 none.
    let p = policy(json!({}));
    let nodes: Vec<NodeInfo> = ["a", "b"]
        .iter()
        .map(|z| NodeInfo {
            name: format!("n-{z}"),
            labels: [("zone".to_string(), z.to_string())].into(),
            ready: true,
            ..Default::default()
        })
        .collect();
    let mut big = web("b");
    big.replicas = 5;
    let mut small = web("c");
    small.replicas = 2;
    let out = plan(&Inputs {
        policy: &Governor::from(p.clone()),
        policies: &[Arc::new(Governor::from(p.clone()))],
        budget_used_elsewhere: 0,
        workloads: &[Arc::new(web("a")), Arc::new(big), Arc::new(small)],
        nodes: &nodes,
        pods: &PodSnapshot::new(),
        tracked: &Seen::default(),
        evicted: &Default::default(),
        now: Timestamp::from_second(1000).unwrap(),
    });
    assert_eq!(out.shortfalls.len(), 2, "{:?}", out.shortfalls);
    assert_eq!(out.pending, 4);
}

#[test]
fn a_converged_workload_needs_no_write() {
    let p = policy(json!({}));
    let out = run(&p, &[carrying(&p, web("a"))]);
    assert!(out.writes.is_empty(), "{:?}", out.writes);
    assert_eq!(out.applied, 1);
}

#[test]
fn deleting_a_suspended_policy_still_takes_its_terms_out() {
    let p = policy(json!({"suspend": true}));
    let ws = [carrying(&p, web("a"))];
    assert!(run(&p, &ws).writes.is_empty(), "suspended: nothing new");
    let out = run(&deleting(p), &ws);
    assert_eq!(out.writes.len(), 1);
    assert!(out.writes[0].is_removal());
    assert!(
        out.writes[0]
            .merged(&ws[0])
            .anti_affinity_required
            .is_empty()
    );
    assert!(!out.released, "released once the removal is seen");
}

#[test]
fn an_unhealthy_workload_whose_rollout_completed_does_not_hold_up_pacing() {
    let p = policy(json!({}));
    let mut a = carrying(&p, web("a"));
    a.rollout = Rollout::Complete; // 2 of 5 Pending, rollout done
    let out = run(&p, &[a.clone(), web("b")]);
    assert_eq!(out.in_flight, 0);
    assert_eq!(out.writes.len(), 1);
    // A paused one with a new template is in flight; past its bound it is Stalled.
    a.rollout = Rollout::InProgress;
    let out = run(&p, &[a.clone(), web("b")]);
    assert_eq!((out.in_flight, out.writes.len(), out.waiting), (1, 0, 1));
    a.rollout = Rollout::Stalled;
    assert_eq!(run(&p, &[a, web("b")]).writes.len(), 1);
}

#[test]
fn a_workload_in_flight_is_not_held_up_by_itself() {
    // Stuck in its own rollout (5 replicas, 3 zones, from the start): the
    // policy's deletion takes the terms out at once.
    let p = policy(json!({}));
    let mut stuck = carrying(&p, web("a"));
    stuck.rollout = Rollout::InProgress;
    let out = run(
        &deleting(p.clone()),
        &[stuck.clone(), carrying(&p, web("b"))],
    );
    assert_eq!(out.writes.len(), 1, "{:?}", out.workloads);
    assert_eq!(out.writes[0].name, "a");
    assert_eq!(out.waiting, 1, "b waits for a");
}

#[test]
fn a_removal_still_rolling_out_counts_against_max_concurrent() {
    let p = deleting(policy(json!({})));
    let mut gone = web("a");
    gone.rollout = Rollout::InProgress;
    let tracked = Seen {
        rolling: [(
            (WorkloadKind::Deployment, "a".to_string()),
            "web-ha".to_string(),
        )]
        .into(),
        ..Seen::default()
    };
    let out = run_tracked(&p, &[gone, carrying(&p, web("b"))], &tracked);
    assert_eq!((out.in_flight, out.writes.len(), out.waiting), (1, 0, 1));
}

#[test]
fn a_workload_being_deleted_is_not_written_and_does_not_hold_up_deletion() {
    let p = policy(json!({}));
    let mut w = carrying(&p, web("a"));
    w.deleting = true;
    w.rollout = Rollout::InProgress;
    let out = run(&deleting(p), &[w]);
    assert!(out.writes.is_empty());
    assert!(out.released);
}

#[test]
fn a_template_put_back_with_its_own_record_is_brought_to_the_policy_once() {
    // Policy v1 wrote a zone term; v2 wants host instead. `kubectl rollout
    // undo` put the v1 template back, record and all.
    let v1 = policy(json!({}));
    let v2 = policy(json!({"spread": [{"topologyKey": "host", "mode": "Required"}]}));
    let mut user = web("a");
    user.affinity = serde_json::from_value(json!({"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "noisy"}}, "topologyKey": "host"}]}}))
    .unwrap();
    let undone = carrying(&v1, user.clone());
    let out = run(&v2, std::slice::from_ref(&undone));
    let w = &out.writes[0];
    let merged = w.merged(&undone);
    let keys: Vec<&str> = merged
        .anti_affinity_required
        .iter()
        .map(|t| t.topology_key.as_str())
        .collect();
    assert_eq!(
        keys,
        ["host", "host"],
        "the user's term, then v2's; v1's gone"
    );
    assert_eq!(
        merged.anti_affinity_required[0],
        user.affinity
            .pod_anti_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap()[0]
    );
    assert!(w.template_changed);
}

#[test]
fn a_record_that_differs_from_the_template_terms_is_a_template_change() {
    let p = policy(json!({}));
    let mut w = carrying(&p, web("a"));
    w.record = None; // someone dropped the record: the terms become the user's
    let out = run(&p, &[w.clone()]);
    assert!(out.writes.is_empty(), "{:?}", out.writes);
    w.record = Some("{\"antiAffinityRequired\":[]}".into());
    let out = run(&p, &[w]);
    assert!(out.writes[0].template_changed);
}

#[test]
fn a_plan_over_many_workloads_lists_the_problems_first_and_no_more_than_status_holds() {
    use crate::api::spread_distribution::MAX_DISTRIBUTION_WORKLOADS;
    use crate::api::spread_policy::MAX_WORKLOAD_STATUSES;
    let p = policy(json!({}));
    // 300 carry the terms already, 3 of them (late in name order) do not yet.
    let mut ws: Vec<Workload> = (0..300)
        .map(|i| carrying(&p, web(&format!("w{i:03}"))))
        .collect();
    for i in [297, 298, 299] {
        ws[i] = web(&format!("w{i:03}"));
    }
    let out = run(&p, &ws);
    assert_eq!(
        (out.matched, out.applied, out.writes.len(), out.waiting),
        (300, 297, 1, 2),
        "one at a time"
    );
    let names: Vec<&str> = out.workloads.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names.len(), MAX_WORKLOAD_STATUSES);
    assert_eq!(
        &names[..4],
        ["w297", "w298", "w299", "w000"],
        "those to write first"
    );
    assert_eq!(names[MAX_WORKLOAD_STATUSES - 1], "w046");
    assert_eq!(out.distribution.governed, 300);
    assert_eq!(out.distribution.workloads.len(), MAX_DISTRIBUTION_WORKLOADS);
    assert_eq!(out.distribution.workloads[0].name, "w000", "then by name");
}
