use super::*;
use crate::api::spread_policy::WorkloadKind;
use crate::controller::spread_policy::feasibility::tests::{ZONE, three_zones};
use crate::controller::spread_policy::pods::Phase;
use serde_json::json;

fn spec(rebalance: serde_json::Value) -> (SpreadPolicySpec, Rebalance) {
    let s: SpreadPolicySpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"a": "b"}},
        "spread": [{"topologyKey": ZONE, "mode": "Required", "method": "TopologySpread", "maxSkew": 1},
                   {"topologyKey": "kubernetes.io/hostname", "mode": "Preferred"}],
        "rebalance": rebalance,
    }))
    .unwrap();
    let r = s.rebalance.clone().unwrap();
    (s, r)
}

fn web(replicas: i32) -> Workload {
    Workload {
        kind: WorkloadKind::Deployment,
        name: "web".into(),
        replicas,
        ..Default::default()
    }
}

fn pod(name: &str, node: &str, created: i64) -> PodView {
    PodView {
        name: name.into(),
        uid: format!("uid-{name}").into(),
        node: Some(node.into()),
        phase: Phase::Running,
        ready: true,
        created,
        revision: Some("h".into()),
        ..Default::default()
    }
}

/// Zones b and c hold 3 each, zone a (back from an outage) none.
fn after_outage() -> Vec<PodView> {
    ["b0", "b0", "b1", "c0", "c1", "c1"]
        .iter()
        .enumerate()
        .map(|(i, n)| pod(&format!("p{i}"), n, i as i64))
        .collect()
}

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn run(
    s: &SpreadPolicySpec,
    r: &Rebalance,
    w: &Workload,
    pods: &[PodView],
    last: Option<Timestamp>,
) -> Decision {
    let nodes = three_zones();
    let lookup: Nodes = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    decide(
        s,
        r,
        w,
        pods,
        &nodes,
        &lookup,
        Clock {
            last,
            now: t("2026-01-01T00:01:00Z"),
        },
    )
}

#[test]
fn a_zone_back_from_an_outage_gets_one_pod_at_a_time_from_the_most_crowded_node() {
    let (s, r) = spec(json!({}));
    let d = run(&s, &r, &web(6), &after_outage(), None);
    assert!(d.wanted);
    assert_eq!(d.evict.len(), 1, "maxUnavailable 1");
    // b and c tie: b first. b0 holds two pods (p0, p1); of those the newest, p1.
    assert_eq!(d.evict[0].pod, "p1");
    assert_eq!(
        d.evict[0].why,
        "Deployment/web: topology.kubernetes.io/zone skew 3 > maxSkew 1 (a 0, b 3, c 3); evicted pod p1 from b so the scheduler places it in a less crowded domain"
    );
}

#[test]
fn a_batch_is_as_large_as_max_unavailable_allows_and_the_skew_needs() {
    let (s, r) = spec(json!({"maxUnavailable": 5}));
    let d = run(&s, &r, &web(6), &after_outage(), None);
    let names: Vec<&str> = d.evict.iter().map(|e| e.pod.as_str()).collect();
    // 3/3/0 -> 2/2/2 takes two moves, one from each crowded zone.
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(d.evict.iter().any(|e| e.why.contains("from b")));
    assert!(d.evict.iter().any(|e| e.why.contains("from c")));
}

#[test]
fn nothing_is_evicted_while_pods_are_unavailable_pending_rolling_or_within_min_interval() {
    let (s, r) = spec(json!({"minInterval": "30s"}));
    let mut pods = after_outage();
    pods[0].ready = false;
    let d = run(&s, &r, &web(6), &pods, None);
    assert!(d.wanted && d.evict.is_empty(), "one unavailable already");
    let mut pending = after_outage();
    pending.push(PodView {
        name: "new".into(),
        ..Default::default()
    });
    assert!(run(&s, &r, &web(7), &pending, None).evict.is_empty());
    let mut rolling = web(6);
    rolling.rollout = Rollout::InProgress;
    assert!(
        run(&s, &r, &rolling, &after_outage(), None)
            .evict
            .is_empty()
    );
    let d = run(
        &s,
        &r,
        &web(6),
        &after_outage(),
        Some(t("2026-01-01T00:00:40Z")),
    );
    assert_eq!((d.evict.len(), d.wait), (0, Some(Duration::from_secs(10))));
    let d = run(
        &s,
        &r,
        &web(6),
        &after_outage(),
        Some(t("2026-01-01T00:00:30Z")),
    );
    assert_eq!(d.evict.len(), 1, "30 s since the last batch");
}

#[test]
fn an_even_spread_or_a_preferred_only_spread_is_left_alone() {
    let (s, r) = spec(json!({}));
    let even: Vec<PodView> = ["a0", "b0", "c0", "a1", "b1", "c1"]
        .iter()
        .enumerate()
        .map(|(i, n)| pod(&format!("p{i}"), n, 0))
        .collect();
    let d = run(&s, &r, &web(6), &even, None);
    assert_eq!(d, Decision::default());
    let preferred: SpreadPolicySpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"a": "b"}},
        "spread": [{"topologyKey": ZONE, "mode": "Preferred", "method": "TopologySpread"}],
        "rebalance": {},
    }))
    .unwrap();
    assert_eq!(
        run(&preferred, &r, &web(6), &after_outage(), None),
        Decision::default()
    );
}

#[test]
fn nothing_is_evicted_when_the_replacements_could_not_be_placed() {
    // One pod per host as well: zone a's hosts are full (tainted), so a replacement from b
    // would stay Pending.
    let s: SpreadPolicySpec = serde_json::from_value(json!({
        "selector": {"matchLabels": {"a": "b"}},
        "spread": [{"topologyKey": ZONE, "mode": "Required", "method": "TopologySpread"},
                   {"topologyKey": "kubernetes.io/hostname", "mode": "Required"}],
        "rebalance": {},
    }))
    .unwrap();
    let r = s.rebalance.clone().unwrap();
    let mut nodes = three_zones();
    for n in nodes.iter_mut().filter(|n| n.labels[ZONE] == "a") {
        n.taints = vec![crate::controller::spread_policy::feasibility::tests::taint(
            "x",
        )];
    }
    let pods = [pod("p0", "b0", 0), pod("p1", "b1", 0), pod("p2", "c0", 0)];
    let lookup: Nodes = nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    // Zone a is no usable domain here: b 2, c 1 is within maxSkew.
    let d = decide(
        &s,
        &r,
        &web(3),
        &pods,
        &nodes,
        &lookup,
        Clock {
            last: None,
            now: t("2026-01-01T00:01:00Z"),
        },
    );
    assert!(!d.wanted);
}
