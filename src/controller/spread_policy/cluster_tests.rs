use super::*;
use crate::api::spread_distribution::WorkloadDistribution;
use crate::api::spread_policy::{WorkloadKind, WorkloadStatus};

fn plan(matched: i32, applied: i32, conflicts: usize) -> Plan {
    Plan {
        matched,
        applied,
        conflicts: (0..conflicts).map(|i| format!("c{i}")).collect(),
        released: true,
        ..Default::default()
    }
}

#[test]
fn namespaces_sum_up_and_messages_name_their_namespace() {
    let mut a = plan(3, 2, 1);
    a.shortfalls = vec!["web: 5 replicas, 3 domains of zone: 2 pods will stay Pending".into()];
    a.pending = 2;
    a.workloads = vec![WorkloadStatus {
        kind: WorkloadKind::Deployment,
        namespace: Some("a".into()),
        name: "web".into(),
        state: "Applied".into(),
        message: None,
    }];
    a.spread.add(
        WorkloadDistribution {
            name: "web".into(),
            namespace: Some("a".into()),
            running: 3,
            skewed: true,
            ..Default::default()
        },
        2,
    );
    let mut b = plan(1, 1, 0);
    b.released = false;
    b.rebalance_wait = Some(std::time::Duration::from_secs(3));
    let c = combine(&[("a".into(), &a), ("b".into(), &b)]);
    assert_eq!(
        (c.matched, c.applied, c.conflicts.len(), c.pending),
        (4, 3, 1, 2)
    );
    assert_eq!(
        c.shortfalls,
        ["a/web: 5 replicas, 3 domains of zone: 2 pods will stay Pending"]
    );
    assert!(!c.released, "b still carries terms");
    assert_eq!((c.distribution.governed, c.distribution.skewed), (1, 1));
    assert_eq!(c.rebalance_wait, Some(std::time::Duration::from_secs(3)));
}

#[test]
fn each_namespace_says_how_it_stands() {
    let state_of = |p: &Plan| namespace_status("shop", p).map(|n| n.state);
    assert_eq!(state_of(&plan(2, 2, 0)).as_deref(), Some(state::APPLIED));
    assert_eq!(state_of(&plan(2, 1, 0)).as_deref(), Some(state::PENDING));
    assert_eq!(state_of(&plan(2, 0, 2)).as_deref(), Some(state::CONFLICTED));
    assert_eq!(state_of(&plan(3, 2, 1)).as_deref(), Some(state::APPLIED));
    assert_eq!(state_of(&plan(0, 0, 0)), None, "nothing to say");
}

#[test]
fn a_manager_of_one_namespace_replaces_only_its_entry() {
    let entry = |ns: &str, matched: i32| NamespaceStatus {
        namespace: ns.into(),
        matched,
        applied: matched,
        state: state::APPLIED.into(),
        ..Default::default()
    };
    let old = ClusterSpreadPolicyStatus {
        namespaces: vec![entry("a", 2), entry("b", 5)],
        ..Default::default()
    };
    let s = cluster_status(
        Some(&old),
        Default::default(),
        vec![entry("b", 1)],
        Some("b"),
    );
    assert_eq!(s.namespaces, [entry("a", 2), entry("b", 1)]);
    assert_eq!(
        (s.matched, s.applied, s.selected_namespaces),
        (Some(3), Some(3), Some(2))
    );
    // A manager of every namespace says it all.
    let s = cluster_status(Some(&old), Default::default(), vec![entry("b", 1)], None);
    assert_eq!(s.namespaces, [entry("b", 1)]);
    assert_eq!(
        finalizer_for(Some("shop")),
        "shop.ns.ballast.dev/spread-policy"
    );
    assert_eq!(finalizer_for(None), "ballast.dev/spread-policy");
}
