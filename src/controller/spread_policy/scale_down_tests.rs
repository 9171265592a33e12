use super::*;
use crate::controller::spread_policy::feasibility::NodeInfo;
use crate::controller::spread_policy::feasibility::tests::{ZONE, three_zones};
use crate::controller::spread_policy::pods::Phase;
use std::collections::BTreeMap;

fn web() -> Workload {
    Workload {
        kind: WorkloadKind::Deployment,
        name: "web".into(),
        ..Default::default()
    }
}

fn pod(name: &str, node: &str) -> PodView {
    PodView {
        name: name.into(),
        uid: format!("uid-{name}").into(),
        node: Some(node.into()),
        phase: Phase::Running,
        ready: true,
        revision: Some("h".into()),
        ..Default::default()
    }
}

fn by_name(nodes: &[NodeInfo]) -> Nodes<'_> {
    nodes.iter().map(|n| (n.name.as_str(), n)).collect()
}

/// Applies the writes to the pods, as the API server would.
fn applied(mut pods: Vec<PodView>, writes: &[CostWrite]) -> Vec<PodView> {
    for w in writes {
        let p = pods.iter_mut().find(|p| *p.name == w.pod).unwrap();
        p.deletion_cost = w.cost;
        p.cost_ours = w.cost.is_some();
    }
    pods
}

/// What the ReplicaSet controller deletes when scaling `pods` down by `k`: the lowest costs
/// first (all pods ready, so nothing ranks before the cost), then the name.
fn scale_down(mut pods: Vec<PodView>, k: usize) -> Vec<PodView> {
    pods.sort_by_key(|p| (p.deletion_cost.unwrap_or(0), p.name.clone()));
    pods.split_off(k)
}

fn zones_of(pods: &[PodView], nodes: &[NodeInfo]) -> BTreeMap<String, usize> {
    let lookup = by_name(nodes);
    let mut out = BTreeMap::new();
    for p in pods {
        *out.entry(lookup[p.node.as_deref().unwrap()].labels[ZONE].clone())
            .or_insert(0) += 1;
    }
    out
}

fn nine() -> Vec<PodView> {
    // 3/3/3, two nodes per zone.
    ["a0", "a0", "a1", "b0", "b1", "b1", "c0", "c1", "c1"]
        .iter()
        .enumerate()
        .map(|(i, n)| pod(&format!("p{i}"), n))
        .collect()
}

#[test]
fn three_per_zone_scaled_to_six_and_three_stay_even() {
    let nodes = three_zones();
    let lookup = by_name(&nodes);
    let pods = applied(
        nine(),
        &cost_writes(Some(ZONE), true, &web(), &nine(), &lookup),
    );
    let six = scale_down(pods, 3);
    assert_eq!(
        zones_of(&six, &nodes),
        BTreeMap::from([("a".into(), 2), ("b".into(), 2), ("c".into(), 2)])
    );
    // The pods left keep valid costs: nothing to write before the next scale-down.
    assert_eq!(cost_writes(Some(ZONE), true, &web(), &six, &lookup), []);
    let three = scale_down(six, 3);
    assert_eq!(
        zones_of(&three, &nodes),
        BTreeMap::from([("a".into(), 1), ("b".into(), 1), ("c".into(), 1)])
    );
}

#[test]
fn the_most_crowded_zone_loses_pods_first() {
    let nodes = three_zones();
    let lookup = by_name(&nodes);
    let pods: Vec<PodView> = ["a0", "a0", "a1", "a1", "b0", "b1", "c0", "c1"]
        .iter()
        .enumerate()
        .map(|(i, n)| pod(&format!("p{i}"), n))
        .collect();
    let pods = applied(
        pods.clone(),
        &cost_writes(Some(ZONE), true, &web(), &pods, &lookup),
    );
    let six = scale_down(pods, 2);
    assert_eq!(
        zones_of(&six, &nodes),
        BTreeMap::from([("a".into(), 2), ("b".into(), 2), ("c".into(), 2)])
    );
}

#[test]
fn within_a_zone_the_pods_on_the_most_crowded_node_go_first() {
    let nodes = three_zones();
    let writes = cost_writes(Some(ZONE), true, &web(), &nine(), &by_name(&nodes));
    let cost = |name: &str| writes.iter().find(|w| w.pod == name).unwrap().cost;
    // Zone a: p0 and p1 on a0, p2 alone on a1.
    assert_eq!(
        (cost("p0"), cost("p1"), cost("p2")),
        (Some(-3), Some(-2), Some(-1))
    );
}

#[test]
fn only_pods_without_a_value_their_domain_needs_are_written() {
    let nodes = three_zones();
    let lookup = by_name(&nodes);
    let pods = applied(
        nine(),
        &cost_writes(Some(ZONE), true, &web(), &nine(), &lookup),
    );
    // Converged: nothing.
    assert!(cost_writes(Some(ZONE), true, &web(), &pods, &lookup).is_empty());
    // A new pod in zone b: one write, the value -4.
    let mut more = pods.clone();
    more.push(pod("p9", "b0"));
    assert_eq!(
        cost_writes(Some(ZONE), true, &web(), &more, &lookup),
        [CostWrite {
            pod: "p9".into(),
            uid: "uid-p9".into(),
            cost: Some(-4)
        }]
    );
    // A pod at -2 of zone a deleted: the one at -3 is out of range and takes -2.
    let fewer: Vec<PodView> = pods
        .iter()
        .filter(|p| !(p.node.as_deref().unwrap().starts_with('a') && p.deletion_cost == Some(-2)))
        .cloned()
        .collect();
    let writes = cost_writes(Some(ZONE), true, &web(), &fewer, &lookup);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].cost, Some(-2));
}

#[test]
fn each_replica_set_is_costed_on_its_own() {
    let nodes = three_zones();
    let mut pods = nine();
    for p in pods.iter_mut().take(3) {
        p.revision = Some("old".into());
    }
    let writes = cost_writes(Some(ZONE), true, &web(), &pods, &by_name(&nodes));
    let old: Vec<Option<i32>> = writes
        .iter()
        .filter(|w| ["p0", "p1", "p2"].contains(&w.pod.as_str()))
        .map(|w| w.cost)
        .collect();
    assert_eq!(old, [Some(-3), Some(-2), Some(-1)]);
    let p3 = writes.iter().find(|w| w.pod == "p3").unwrap();
    assert_eq!(
        p3.cost,
        Some(-1),
        "zone b of the new revision has one pod on b0"
    );
}

#[test]
fn without_balanced_only_ballast_s_own_costs_are_taken_away() {
    let nodes = three_zones();
    let lookup = by_name(&nodes);
    let mut pods = applied(
        nine(),
        &cost_writes(Some(ZONE), true, &web(), &nine(), &lookup),
    );
    pods[0].cost_ours = false; // set by someone else
    let writes = cost_writes(Some(ZONE), false, &web(), &pods, &lookup);
    assert_eq!(writes.len(), 8);
    assert!(writes.iter().all(|w| w.cost.is_none() && w.pod != "p0"));
    // StatefulSets get none: they delete their highest ordinal.
    let mut db = web();
    db.kind = WorkloadKind::StatefulSet;
    assert_eq!(cost_writes(Some(ZONE), true, &db, &pods, &lookup).len(), 8);
    assert!(cost_writes(Some(ZONE), true, &db, &nine(), &lookup).is_empty());
}

#[test]
fn pods_not_yet_on_a_node_or_going_away_are_not_costed() {
    let nodes = three_zones();
    let mut pending = pod("p9", "a0");
    pending.node = None;
    pending.phase = Phase::Pending;
    let mut going = pod("p10", "a0");
    going.deleting = true;
    let writes = cost_writes(
        Some(ZONE),
        true,
        &web(),
        &[pending, going, pod("p1", "a0")],
        &by_name(&nodes),
    );
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].pod, "p1");
}
