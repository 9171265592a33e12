use super::*;
use crate::api::spread_policy::WorkloadKind;
use crate::controller::spread_policy::feasibility::UNSCHEDULABLE_TAINT;
use crate::controller::spread_policy::feasibility::tests::{
    HOST, ZONE, node, taint, three_zones, tolerate,
};
use serde_json::json;

fn spec(v: serde_json::Value) -> SpreadPolicySpec {
    serde_json::from_value(json!({"selector": {"matchLabels": {"a": "b"}}, "spread": v})).unwrap()
}

fn zone_required() -> SpreadPolicySpec {
    spec(json!([{"topologyKey": ZONE, "mode": "Required"}]))
}

fn zone_spread(max_skew: i32, min_domains: Option<i32>) -> SpreadPolicySpec {
    let mut term = json!({"topologyKey": ZONE, "mode": "Required", "method": "TopologySpread", "maxSkew": max_skew});
    if let Some(m) = min_domains {
        term["minDomains"] = json!(m);
    }
    spec(json!([term]))
}

fn web(replicas: i32) -> Workload {
    Workload {
        kind: WorkloadKind::Deployment,
        name: "web".into(),
        replicas,
        ..Default::default()
    }
}

fn pending(s: &SpreadPolicySpec, w: &Workload, nodes: &[NodeInfo]) -> i32 {
    assess(s, w, nodes, &[])
        .shortfall
        .map_or(0, |short| short.pending)
}

fn cordon_zone(nodes: &mut [NodeInfo], zone: &str) {
    for n in nodes.iter_mut().filter(|n| n.labels[ZONE] == zone) {
        n.unschedulable = true;
        n.taints.push(taint(UNSCHEDULABLE_TAINT));
    }
}

#[test]
fn more_replicas_than_zones_leaves_the_difference_pending() {
    let f = assess(&zone_required(), &web(5), &three_zones(), &[]);
    assert_eq!(
        f.shortfall.unwrap().message("web"),
        "web: 5 replicas, 3 domains of topology.kubernetes.io/zone: 2 pods will stay Pending"
    );
}

#[test]
fn as_many_replicas_as_zones_is_feasible() {
    assert_eq!(pending(&zone_required(), &web(3), &three_zones()), 0);
}

#[test]
fn preferred_spread_is_never_infeasible() {
    for method in ["AntiAffinity", "TopologySpread"] {
        let s = spec(json!([{"topologyKey": ZONE, "mode": "Preferred", "method": method}]));
        assert_eq!(pending(&s, &web(50), &three_zones()), 0, "{method}");
    }
}

#[test]
fn a_cordoned_zone_leaves_anti_affinity_one_domain_short() {
    let mut nodes = three_zones();
    cordon_zone(&mut nodes, "c");
    let f = assess(&zone_required(), &web(3), &nodes, &[]);
    let short = f.shortfall.unwrap();
    assert_eq!((short.domains, short.pending), (2, 1));
}

/// Issue 10: with the scheduler's default `nodeTaintsPolicy: Ignore`, a cordoned zone counts
/// as a domain with no pods and keeps every zone at maxSkew; ballast writes `Honor`, so the
/// other zones take all six.
#[test]
fn a_cordoned_zone_is_no_domain_of_a_topology_spread() {
    let mut nodes = three_zones();
    cordon_zone(&mut nodes, "c");
    assert_eq!(pending(&zone_spread(1, None), &web(6), &nodes), 0);
    // Unless minDomains asks for three: then two zones hold maxSkew each.
    let f = assess(&zone_spread(2, Some(3)), &web(6), &nodes, &[]);
    let short = f.shortfall.unwrap();
    assert_eq!((short.domains, short.pending), (2, 2));
}

#[test]
fn tainted_nodes_count_only_for_pods_that_tolerate_them() {
    let mut nodes = three_zones();
    for n in nodes.iter_mut().filter(|n| n.labels[ZONE] == "b") {
        n.taints = vec![taint("dedicated")];
    }
    assert_eq!(pending(&zone_required(), &web(3), &nodes), 1);
    assert_eq!(pending(&zone_spread(1, Some(3)), &web(3), &nodes), 1);
    let mut tolerant = web(3);
    tolerant.tolerations = vec![tolerate("dedicated")];
    assert_eq!(pending(&zone_required(), &tolerant, &nodes), 0);
    assert_eq!(pending(&zone_spread(1, Some(3)), &tolerant, &nodes), 0);
}

#[test]
fn a_node_selector_subset_narrows_the_domains() {
    let mut nodes = three_zones();
    for n in nodes.iter_mut().filter(|n| n.labels[ZONE] != "c") {
        n.labels.insert("disk".into(), "ssd".into());
    }
    let mut w = web(3);
    w.node_selector = [("disk", "ssd")].into();
    assert_eq!(pending(&zone_required(), &w, &nodes), 1);
    // Spread over the two zones it may use: nothing Pending without minDomains.
    w.replicas = 6;
    assert_eq!(pending(&zone_spread(1, None), &w, &nodes), 0);
    assert_eq!(pending(&zone_spread(1, Some(3)), &w, &nodes), 4);
}

#[test]
fn required_node_affinity_narrows_the_domains() {
    let mut w = web(2);
    w.affinity = serde_json::from_value(json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["a", "b"]}]}]}}}))
    .unwrap();
    let f = assess(&zone_required(), &w, &three_zones(), &[]);
    assert_eq!(
        f.shortfall.unwrap().message("web"),
        "web: 2 replicas, 1 domains of topology.kubernetes.io/zone: 1 pod will stay Pending"
    );
}

#[test]
fn topology_spread_below_min_domains_caps_each_domain_at_max_skew() {
    let f = assess(&zone_spread(1, Some(4)), &web(5), &three_zones(), &[]);
    let short = f.shortfall.unwrap();
    assert_eq!((short.domains, short.pending), (3, 2));
    assert_eq!(pending(&zone_spread(1, None), &web(50), &three_zones()), 0);
}

#[test]
fn unlabelled_nodes_make_anti_affinity_unbounded_and_are_warned_about() {
    let mut nodes = three_zones();
    nodes.push(node("bare", None));
    let f = assess(&zone_required(), &web(10), &nodes, &[]);
    assert!(f.shortfall.is_none());
    assert_eq!(
        f.warnings,
        vec!["web: 1 of 7 schedulable nodes lack the label topology.kubernetes.io/zone"]
    );
    // A topology spread never uses them: minDomains still binds.
    assert_eq!(pending(&zone_spread(1, Some(4)), &web(5), &nodes), 2);
}

#[test]
fn a_tainted_host_leaves_host_anti_affinity_one_short() {
    let mut nodes = three_zones();
    nodes[0].taints = vec![taint("dedicated")];
    let s = spec(json!([{"topologyKey": HOST, "mode": "Required"}]));
    assert_eq!(pending(&s, &web(6), &nodes), 1);
}

#[test]
fn zone_spread_and_host_anti_affinity_together_name_the_rule_that_binds() {
    let s = spec(json!([
        {"topologyKey": ZONE, "mode": "Required", "method": "TopologySpread"},
        {"topologyKey": HOST, "mode": "Required"}]));
    let f = assess(&s, &web(8), &three_zones(), &[]);
    let short = f.shortfall.unwrap();
    assert_eq!(
        (short.topology_key.as_str(), short.domains, short.pending),
        (HOST, 6, 2)
    );
    assert_eq!(pending(&s, &web(6), &three_zones()), 0);
}

#[test]
fn two_rules_that_each_fit_alone_can_still_leave_pods_pending_together() {
    // Zone a has one host, zones b and c two: one pod per host, and at most one more in a
    // zone than in the emptiest. Zone a caps at one, so b and c at two: five in all.
    let mut nodes = three_zones();
    nodes.remove(1);
    let s = spec(json!([
        {"topologyKey": ZONE, "mode": "Required", "method": "TopologySpread", "minDomains": 3},
        {"topologyKey": HOST, "mode": "Required"}]));
    assert_eq!(pending(&s, &web(5), &nodes), 0);
    assert_eq!(pending(&s, &web(6), &nodes), 1);
}

#[test]
fn pods_already_placed_stay_where_they_are() {
    // One pod per zone was placed before zone c was cordoned: nothing is Pending.
    let mut nodes = three_zones();
    let placed_on = [nodes[0].clone(), nodes[2].clone(), nodes[4].clone()];
    cordon_zone(&mut nodes, "c");
    let placed: Vec<&NodeInfo> = placed_on.iter().collect();
    assert!(
        assess(&zone_required(), &web(3), &nodes, &placed)
            .shortfall
            .is_none()
    );
    // A fourth replica finds no free zone.
    let f = assess(&zone_required(), &web(4), &nodes, &placed);
    assert_eq!(f.shortfall.unwrap().pending, 1);
    // Below minDomains, placed pods use up their zone's room.
    let s = zone_spread(2, Some(4));
    let two_in_a = [nodes[0].clone(), nodes[1].clone()];
    let placed: Vec<&NodeInfo> = two_in_a.iter().collect();
    assert_eq!(assess(&s, &web(6), &three_zones(), &placed).shortfall, None);
    assert_eq!(
        assess(&s, &web(7), &three_zones(), &placed)
            .shortfall
            .unwrap()
            .pending,
        1
    );
}

#[test]
fn the_largest_skew_and_min_domains_do_not_overflow() {
    let s = zone_spread(i32::MAX, Some(i32::MAX));
    assert_eq!(pending(&s, &web(5), &three_zones()), 0);
    assert_eq!(
        pending(&s, &web(i32::MAX), &three_zones()),
        0,
        "room saturates"
    );
    assert_eq!(pending(&s, &web(i32::MIN), &three_zones()), 0);
    let both = spec(json!([
        {"topologyKey": ZONE, "mode": "Required", "method": "TopologySpread", "maxSkew": i32::MAX},
        {"topologyKey": HOST, "mode": "Required"}]));
    assert_eq!(pending(&both, &web(i32::MAX), &three_zones()), i32::MAX - 6);
}

/// The closed form for one rule is what following the pods one by one gives, over many node
/// sets (a fixed pseudo-random sequence: zones, hosts, cordons, taints, placed pods).
#[test]
fn one_rule_s_closed_form_agrees_with_the_simulation() {
    let mut seed: u64 = 0x5eed;
    let mut next = |m: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % m
    };
    for case in 0..400 {
        let mut nodes = Vec::new();
        for i in 0..(1 + next(9)) {
            let zone = (next(5) > 0).then(|| ["a", "b", "c", "d"][next(4) as usize]);
            let mut n = node(&format!("n{i}"), zone);
            if next(6) == 0 {
                n.unschedulable = true;
                n.taints.push(taint(UNSCHEDULABLE_TAINT));
            }
            if next(6) == 0 {
                n.taints.push(taint("dedicated"));
            }
            // Not Ready, before its controller taints it: a domain no pod can go to.
            if next(8) == 0 {
                n.ready = false;
            }
            nodes.push(n);
        }
        let placed: Vec<&NodeInfo> = (0..next(4))
            .map(|_| &nodes[next(nodes.len() as u64) as usize])
            .collect();
        let rule = if next(2) == 0 {
            Rule::AntiAffinity { key: ZONE.into() }
        } else {
            Rule::Spread {
                key: ZONE.into(),
                max_skew: 1 + next(3) as i32,
                min_domains: 1 + next(5) as i32,
            }
        };
        let mut w = web(0);
        if next(2) == 0 {
            w.tolerations = vec![tolerate("dedicated")];
        }
        let want = next(12) as i64;
        let closed = placeable(std::slice::from_ref(&rule), &w, &nodes, &placed, want);
        // The same rule twice takes the simulation's path and changes nothing.
        let simulated = placeable(&[rule.clone(), rule.clone()], &w, &nodes, &placed, want);
        assert_eq!(closed, simulated, "case {case}: {rule:?}, want {want}");
    }
}
