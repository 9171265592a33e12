//! Feasibility agrees with the scheduler (issue 10): for a matrix of node states (cordoned and
//! tainted zones, tolerations, nodeSelector and node affinity subsets, more replicas than
//! domains, minDomains), the Pending pods a SpreadPolicy predicts in its status before any pod
//! exists equal the pods the real kube-scheduler leaves Pending once they do.
//!
//! Each case runs on a node pool of its own (tests/support/spread.rs), so cordons and taints
//! touch no other test. Its Deployment is created paused: the operator writes its terms and
//! predicts with no pod placed yet; then it is resumed and the scheduler places what it can.

mod support;

use serde_json::{Value, json};
use support::spread::{
    self, Pool, ZONE, condition, deployment, policy_status, policy_yaml, settled,
};
use support::{Cluster, Operator, TestNamespace, cluster, random_suffix, wait_until};

/// One row of the matrix.
struct Case {
    name: &'static str,
    /// The policy's `spread` list (YAML flow).
    spread: &'static str,
    replicas: i32,
    /// What is done to the pool's nodes first.
    nodes: Nodes,
    /// Merged into the pod spec beside the pool's selector and toleration.
    pod_spec: Value,
    /// What both the prediction and the scheduler must come to.
    pending: usize,
}

enum Nodes {
    AsCreated,
    CordonZone(&'static str),
    TaintZone(&'static str),
    TaintFirstNode,
    /// Labels `disk=ssd` on the nodes of these zones.
    SsdIn(&'static [&'static str]),
}

const TAINT: &str = "ballast.dev/dedicated";

fn zone_anti(mode: &str) -> String {
    format!("[{{topologyKey: {ZONE}, mode: {mode}}}]")
}

fn cases() -> Vec<Case> {
    let anti = Box::leak(zone_anti("Required").into_boxed_str());
    let preferred = Box::leak(zone_anti("Preferred").into_boxed_str());
    let tolerate = json!({"tolerations": [{"key": TAINT, "operator": "Exists"}]});
    vec![
        Case {
            name: "anti-affinity-5-over-3-zones",
            spread: anti,
            replicas: 5,
            nodes: Nodes::AsCreated,
            pod_spec: json!({}),
            pending: 2,
        },
        Case {
            name: "preferred-anti-affinity-5-over-3-zones",
            spread: preferred,
            replicas: 5,
            nodes: Nodes::AsCreated,
            pod_spec: json!({}),
            pending: 0,
        },
        Case {
            name: "anti-affinity-cordoned-zone",
            spread: anti,
            replicas: 3,
            nodes: Nodes::CordonZone("c"),
            pod_spec: json!({}),
            pending: 1,
        },
        Case {
            name: "spread-cordoned-zone",
            spread: "[{topologyKey: topology.kubernetes.io/zone, mode: Required, method: TopologySpread, maxSkew: 1}]",
            replicas: 6,
            nodes: Nodes::CordonZone("c"),
            pod_spec: json!({}),
            pending: 0,
        },
        Case {
            name: "spread-min-domains-cordoned-zone",
            spread: "[{topologyKey: topology.kubernetes.io/zone, mode: Required, method: TopologySpread, maxSkew: 2, minDomains: 3}]",
            replicas: 6,
            nodes: Nodes::CordonZone("c"),
            pod_spec: json!({}),
            pending: 2,
        },
        Case {
            name: "anti-affinity-tainted-zone",
            spread: anti,
            replicas: 3,
            nodes: Nodes::TaintZone("b"),
            pod_spec: json!({}),
            pending: 1,
        },
        Case {
            name: "anti-affinity-tainted-zone-tolerated",
            spread: anti,
            replicas: 3,
            nodes: Nodes::TaintZone("b"),
            pod_spec: tolerate.clone(),
            pending: 0,
        },
        Case {
            name: "spread-min-domains-tainted-zone",
            spread: "[{topologyKey: topology.kubernetes.io/zone, mode: Required, method: TopologySpread, minDomains: 3}]",
            replicas: 3,
            nodes: Nodes::TaintZone("b"),
            pod_spec: json!({}),
            pending: 1,
        },
        Case {
            name: "spread-min-domains-tainted-zone-tolerated",
            spread: "[{topologyKey: topology.kubernetes.io/zone, mode: Required, method: TopologySpread, minDomains: 3}]",
            replicas: 3,
            nodes: Nodes::TaintZone("b"),
            pod_spec: tolerate,
            pending: 0,
        },
        Case {
            name: "anti-affinity-node-selector-subset",
            spread: anti,
            replicas: 3,
            nodes: Nodes::SsdIn(&["a", "b"]),
            pod_spec: json!({"nodeSelector": {"disk": "ssd"}}),
            pending: 1,
        },
        Case {
            name: "spread-min-domains-node-affinity-subset",
            spread: "[{topologyKey: topology.kubernetes.io/zone, mode: Required, method: TopologySpread, minDomains: 3}]",
            replicas: 4,
            nodes: Nodes::AsCreated,
            pod_spec: json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": "NotIn", "values": ["a"]}]}]}}}}),
            pending: 2,
        },
        Case {
            name: "spread-min-domains-4-over-3-zones",
            spread: "[{topologyKey: topology.kubernetes.io/zone, mode: Required, method: TopologySpread, maxSkew: 1, minDomains: 4}]",
            replicas: 5,
            nodes: Nodes::AsCreated,
            pod_spec: json!({}),
            pending: 2,
        },
        Case {
            name: "host-anti-affinity-tainted-host",
            spread: "[{topologyKey: kubernetes.io/hostname, mode: Required}]",
            replicas: 6,
            nodes: Nodes::TaintFirstNode,
            pod_spec: json!({}),
            pending: 1,
        },
        Case {
            name: "zone-spread-and-host-anti-affinity",
            spread: "[{topologyKey: topology.kubernetes.io/zone, mode: Required, method: TopologySpread}, {topologyKey: kubernetes.io/hostname, mode: Required}]",
            replicas: 8,
            nodes: Nodes::AsCreated,
            pod_spec: json!({}),
            pending: 2,
        },
    ]
}

/// The Pending pods the policy's status predicts: the count of its `Infeasible` message, or 0
/// once it says `Feasible`. `None` until the policy carries its terms and has said either.
fn predicted(status: &Value) -> Option<usize> {
    let ready = condition(status, "Ready")?;
    if ready["reason"] != "Applied" {
        return None;
    }
    let c = condition(status, "Infeasible")?;
    if c["status"] == "False" {
        return Some(0);
    }
    let msg = c["message"].as_str()?;
    let before = msg.split(" will stay Pending").next()?;
    before.rsplit(": ").next()?.split(' ').next()?.parse().ok()
}

async fn prepare(c: &Cluster, pool: &Pool, nodes: &Nodes) {
    match nodes {
        Nodes::AsCreated => {}
        Nodes::CordonZone(z) => pool.cordon(c, &pool.zone(z)).await,
        Nodes::TaintZone(z) => pool.taint(c, &pool.zone(z), TAINT).await,
        Nodes::TaintFirstNode => pool.taint(c, &pool.nodes()[..1], TAINT).await,
        Nodes::SsdIn(zones) => {
            for z in *zones {
                pool.label(&pool.zone(z), "disk=ssd");
            }
        }
    }
}

#[tokio::test]
async fn predicted_pending_pods_equal_what_the_scheduler_leaves_pending() {
    let c = cluster().await;
    c.install();
    let ns = TestNamespace::new(&c, "spread-feasible").await;
    let _op = Operator::start(&c, &ns.name);
    let suffix = random_suffix();
    let cases = cases();

    // Every case's pool, node state, paused Deployment and policy.
    let mut pools = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let pool = Pool::create(&c, &format!("f{suffix}-{i}"), &["a", "b", "c"], 2).await;
        prepare(&c, &pool, &case.nodes).await;
        let mut pod_spec = pool.pod_spec();
        for (k, v) in case.pod_spec.as_object().unwrap() {
            if k == "tolerations" {
                let mut all = pod_spec["tolerations"].as_array().unwrap().clone();
                all.extend(v.as_array().unwrap().iter().cloned());
                pod_spec["tolerations"] = Value::Array(all);
            } else if let (Some(mine), Some(theirs)) = (pod_spec[k].as_object_mut(), v.as_object())
            {
                mine.extend(theirs.clone());
            } else {
                pod_spec[k] = v.clone();
            }
        }
        let name = format!("c{i}");
        let mut d = deployment(&name, case.replicas, json!({"case": name}), pod_spec);
        d.spec.as_mut().unwrap().paused = Some(true);
        spread::create(&c, &ns.name, d).await;
        c.apply_yaml(
            &ns.name,
            &policy_yaml(
                &name,
                &format!(
                    "  selector: {{matchLabels: {{case: {name}}}}}\n  spread: {}\n",
                    case.spread
                ),
            ),
        );
        pools.push(pool);
    }

    // The predictions, with no pod placed yet.
    let mut predictions = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let name = format!("c{i}");
        let p = wait_until(
            &format!("{}: a prediction", case.name),
            spread::WAIT,
            || async { predicted(&policy_status(&c, &ns.name, &name)) },
        )
        .await;
        predictions.push(p);
    }
    for i in 0..cases.len() {
        c.kubectl_ok(&[
            "rollout",
            "resume",
            &format!("deployment/c{i}"),
            "-n",
            &ns.name,
        ]);
    }

    // What the scheduler did.
    let mut rows = Vec::new();
    let mut wrong = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let name = format!("c{i}");
        let (running, pending) = settled(&c, &ns.name, &name, case.replicas as usize).await;
        let row = format!(
            "{:<45} replicas {} predicted {} scheduler: {} running, {} Pending (expected {})",
            case.name, case.replicas, predictions[i], running, pending, case.pending
        );
        eprintln!("{row}");
        if predictions[i] != pending || pending != case.pending {
            wrong.push(row.clone());
        }
        rows.push(row);
    }
    assert!(
        wrong.is_empty(),
        "prediction and scheduler disagree:\n{}\nall:\n{}",
        wrong.join("\n"),
        rows.join("\n")
    );
    // Once the pods are placed, the status still says the same (it reads where they run).
    for (i, case) in cases.iter().enumerate() {
        let name = format!("c{i}");
        wait_until(
            &format!("{}: the prediction holds with the pods placed", case.name),
            spread::WAIT,
            || async {
                (predicted(&policy_status(&c, &ns.name, &name)) == Some(case.pending)).then_some(())
            },
        )
        .await;
    }
}
