use super::*;
use crate::controller::spread_policy::feasibility::tests::{ZONE, node, three_zones};
use serde_json::json;

fn spec(v: serde_json::Value) -> SpreadPolicySpec {
    serde_json::from_value(json!({"selector": {"matchLabels": {"a": "b"}}, "spread": v})).unwrap()
}

fn web(replicas: i32) -> Workload {
    Workload {
        kind: WorkloadKind::Deployment,
        name: "web".into(),
        replicas,
        ..Default::default()
    }
}

fn running(name: &str, node: &str) -> PodView {
    PodView {
        name: name.into(),
        node: Some(node.into()),
        phase: Phase::Running,
        ready: true,
        revision: Some("h1".into()),
        ..Default::default()
    }
}

fn by_name(nodes: &[NodeInfo]) -> Nodes<'_> {
    nodes.iter().map(|n| (n.name.as_str(), n)).collect()
}

fn zone_spread() -> SpreadPolicySpec {
    spec(
        json!([{"topologyKey": ZONE, "mode": "Required", "method": "TopologySpread", "maxSkew": 1}]),
    )
}

#[test]
fn pods_are_counted_per_domain_of_their_real_node_with_empty_domains_listed() {
    let nodes = three_zones();
    let pods = [
        running("p1", "b0"),
        running("p2", "b1"),
        running("p3", "c0"),
    ];
    let (d, excess) = of(
        &zone_spread(),
        &web(3),
        &pods,
        &nodes,
        &by_name(&nodes),
        false,
    );
    let zone = &d.levels[0];
    assert_eq!(
        zone.pods,
        BTreeMap::from([("a".into(), 0), ("b".into(), 2), ("c".into(), 1)])
    );
    assert_eq!((zone.skew, zone.max_skew, zone.domains), (2, 1, 3));
    assert_eq!((excess, d.skewed, d.running), (1, true, 3));
    assert_eq!(
        skew_message(&d),
        "web: topology.kubernetes.io/zone skew 2 > 1 (a 0, b 2, c 1)"
    );
}

#[test]
fn a_domain_no_pod_may_use_counts_its_pods_but_is_not_the_emptiest() {
    // Zone a cordoned after two pods landed there: b and c are the domains pods may use.
    let mut nodes = three_zones();
    for n in nodes.iter_mut().filter(|n| n.labels[ZONE] == "a") {
        n.unschedulable = true;
    }
    let pods = [
        running("p1", "a0"),
        running("p2", "b0"),
        running("p3", "c0"),
    ];
    let (d, _) = of(
        &zone_spread(),
        &web(3),
        &pods,
        &nodes,
        &by_name(&nodes),
        false,
    );
    assert_eq!(d.levels[0].skew, 0, "1 in each, a included");
    let pods = [
        running("p1", "b0"),
        running("p2", "b1"),
        running("p3", "c0"),
    ];
    let (d, _) = of(
        &zone_spread(),
        &web(3),
        &pods,
        &nodes,
        &by_name(&nodes),
        false,
    );
    assert_eq!(
        (d.levels[0].skew, d.skewed),
        (1, false),
        "a is no domain now"
    );
}

#[test]
fn a_workload_rolling_out_is_not_skewed() {
    let nodes = three_zones();
    let pods = [
        running("p1", "b0"),
        running("p2", "b1"),
        running("p3", "b0"),
    ];
    let mut w = web(3);
    w.rollout = Rollout::InProgress;
    let (d, excess) = of(&zone_spread(), &w, &pods, &nodes, &by_name(&nodes), false);
    assert_eq!((excess, d.skewed), (2, false));
}

#[test]
fn anti_affinity_allows_a_skew_of_one_and_each_key_is_one_level() {
    let nodes = three_zones();
    let s = spec(json!([
        {"topologyKey": ZONE, "mode": "Preferred"},
        {"topologyKey": ZONE, "mode": "Required", "method": "TopologySpread", "maxSkew": 3},
        {"topologyKey": "kubernetes.io/hostname", "mode": "Preferred"}]));
    assert_eq!(
        levels(&s),
        [
            Level {
                key: ZONE.into(),
                max_skew: 1
            },
            Level {
                key: "kubernetes.io/hostname".into(),
                max_skew: 1
            }
        ]
    );
    let pods = [
        running("p1", "a0"),
        running("p2", "a1"),
        running("p3", "b0"),
    ];
    let (d, excess) = of(&s, &web(3), &pods, &nodes, &by_name(&nodes), false);
    assert_eq!(d.levels[1].skew, 1, "hosts: 1 or 0 each");
    assert_eq!((excess, d.skewed), (1, true), "zones a 2, c 0");
}

#[test]
fn pending_pods_are_grouped_by_the_scheduler_s_reason() {
    let nodes = three_zones();
    let unschedulable = |name: &str| PodView {
        name: name.into(),
        unschedulable: Some(
            "0/6 nodes are available: 6 node(s) didn't match pod anti-affinity rules.".into(),
        ),
        ..Default::default()
    };
    let pods = [
        running("p1", "a0"),
        unschedulable("p2"),
        unschedulable("p3"),
        PodView {
            name: "p4".into(),
            ..Default::default()
        },
        PodView {
            name: "p5".into(),
            node: Some("b0".into()),
            ..Default::default()
        },
        PodView {
            name: "p6".into(),
            deleting: true,
            ..Default::default()
        },
    ];
    let (d, _) = of(
        &zone_spread(),
        &web(5),
        &pods,
        &nodes,
        &by_name(&nodes),
        false,
    );
    assert_eq!((d.running, d.pending), (1, 4));
    let reasons: Vec<(&str, i32)> = d
        .pending_reasons
        .iter()
        .map(|r| (r.reason.as_str(), r.pods))
        .collect();
    assert_eq!(
        reasons,
        [("Unschedulable", 2), ("NotScheduled", 1), ("Starting", 1)]
    );
    assert!(d.pending_reasons[0].message.starts_with("0/6 nodes"));
}

#[test]
fn more_than_32_domains_list_the_most_crowded_and_the_emptiest() {
    let nodes: Vec<NodeInfo> = (0..40)
        .map(|i| node(&format!("n{i:02}"), Some("a")))
        .collect();
    let pods: Vec<PodView> = (0..20)
        .map(|i| running(&format!("p{i}"), &format!("n{:02}", i % 10)))
        .collect();
    let s = spec(json!([{"topologyKey": "kubernetes.io/hostname", "mode": "Preferred"}]));
    let (d, _) = of(&s, &web(20), &pods, &nodes, &by_name(&nodes), false);
    let host = &d.levels[0];
    assert_eq!((host.domains, host.pods.len(), host.skew), (40, 32, 2));
    assert_eq!(host.pods.values().filter(|c| **c == 2).count(), 10);
}

#[test]
fn the_current_revision_s_placed_pods_are_those_of_the_newest_pod() {
    let nodes = three_zones();
    let mut old = running("old", "a0");
    old.revision = Some("h0".into());
    old.created = 10;
    let mut new = running("new", "b0");
    new.created = 20;
    let mut pending = PodView {
        name: "new-pending".into(),
        revision: Some("h1".into()),
        created: 21,
        ..Default::default()
    };
    let pods = [old.clone(), new.clone(), pending.clone()];
    let lookup = by_name(&nodes);
    let names: Vec<&str> = placed(&web(3), &pods, &lookup)
        .iter()
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(names, ["b0"]);
    pending.deleting = true;
    let mut sts = web(3);
    sts.kind = WorkloadKind::StatefulSet;
    assert_eq!(placed(&sts, &[old, new, pending], &lookup).len(), 2);
}

#[test]
fn the_summary_counts_everything_and_lists_pending_then_most_skewed_first() {
    let entry = |name: &str, pending: i32, skewed: bool| WorkloadDistribution {
        kind: WorkloadKind::Deployment,
        name: name.into(),
        running: 3,
        pending,
        skewed,
        ..Default::default()
    };
    let mut entries = vec![
        (entry("even", 0, false), -1),
        (entry("off", 0, true), 2),
        (entry("stuck", 2, false), 0),
    ];
    entries.extend((0..30).map(|i| (entry(&format!("w{i:02}"), 0, false), 0)));
    let mut summary = Summary::default();
    for (d, excess) in entries {
        summary.add(d, excess);
    }
    let s = summary.distribution();
    assert_eq!(
        (s.governed, s.skewed, s.running_pods, s.pending_pods),
        (33, 1, 99, 2)
    );
    let names: Vec<&str> = s.workloads.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names.len(), MAX_DISTRIBUTION_WORKLOADS);
    assert_eq!(&names[..3], ["stuck", "off", "w00"]);
}
