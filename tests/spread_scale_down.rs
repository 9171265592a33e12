//! Balanced scale-down (issue 10), end to end with the real ReplicaSet controller: a
//! Deployment spread 3/3/3 over three zones and scaled to 6 ends 2/2/2, and scaled to 3 ends
//! 1/1/1, when its policy says `scaleDown: Balanced`. Beside it, the same Deployment under a
//! policy without it, with the same history, shows what Kubernetes does on its own.
//!
//! The history is the one of kubernetes/kubernetes#124149: zone c was cordoned while the first
//! six pods were placed (3/3/0), came back, and a scale to 9 put the three new pods there. The
//! ReplicaSet controller deletes the most recently ready pods first, so on its own it empties
//! zone c again.

mod support;

use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use std::{collections::BTreeMap, time::Duration};
use support::spread::{
    Pool, WAIT, ZONE, create, deployment, phase, pods, policy_status, policy_yaml,
    running_per_domain,
};
use support::{Cluster, Operator, TestNamespace, cluster, random_suffix, wait_until};

const COST: &str = "controller.kubernetes.io/pod-deletion-cost";

fn zones(a: usize, b: usize, c: usize) -> BTreeMap<String, usize> {
    [("a", a), ("b", b), ("c", c)]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(z, n)| (z.to_string(), n))
        .collect()
}

async fn wait_zones(c: &Cluster, ns: &str, app: &str, want: BTreeMap<String, usize>) {
    wait_until(&format!("{app} spread as {want:?}"), WAIT, || async {
        let got = running_per_domain(c, ns, app, ZONE).await;
        let all = pods(c, ns, app).await;
        (got == want && all.len() == want.values().sum::<usize>()).then_some(())
    })
    .await;
}

/// Waits until `app`'s pods settle at `n`, and returns their zones.
async fn settled_zones(c: &Cluster, ns: &str, app: &str, n: usize) -> BTreeMap<String, usize> {
    wait_until(&format!("{app} at {n} pods"), WAIT, || async {
        let all = pods(c, ns, app).await;
        (all.len() == n && all.iter().all(|p| phase(p) == "Running")).then_some(())
    })
    .await;
    running_per_domain(c, ns, app, ZONE).await
}

fn cost(p: &Pod) -> Option<i32> {
    p.metadata.annotations.as_ref()?.get(COST)?.parse().ok()
}

/// Waits until every pod of `app` carries a cost, each zone's pods -1..-n.
async fn costs_in_place(c: &Cluster, ns: &str, app: &str, pool: &Pool) {
    wait_until(&format!("{app}'s deletion costs"), WAIT, || async {
        let all = pods(c, ns, app).await;
        let mut by_zone: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for p in &all {
            let node = p.spec.as_ref()?.node_name.clone()?;
            let zone = pool
                .zones
                .iter()
                .find(|(_, ns)| ns.contains(&node))?
                .0
                .clone();
            by_zone.entry(zone).or_default().push(cost(p)?);
        }
        by_zone
            .values_mut()
            .all(|cs| {
                cs.sort();
                *cs == (-(cs.len() as i32)..=-1).collect::<Vec<_>>()
            })
            .then_some(())
    })
    .await;
}

fn scale(c: &Cluster, ns: &str, app: &str, replicas: usize) {
    c.kubectl_ok(&[
        "scale",
        &format!("deployment/{app}"),
        "-n",
        ns,
        &format!("--replicas={replicas}"),
    ]);
}

#[tokio::test]
async fn balanced_scale_down_keeps_zones_even_where_the_replica_set_controller_empties_one() {
    let c = cluster().await;
    c.install();
    let ns = TestNamespace::new(&c, "spread-scaledown").await;
    let _op = Operator::start(&c, &ns.name);
    let suffix = random_suffix();
    let mut pools = BTreeMap::new();
    for (app, scale_down) in [("even", "Balanced"), ("plain", "Default")] {
        let pool = Pool::create(&c, &format!("s{suffix}-{app}"), &["a", "b", "c"], 1).await;
        pool.cordon(&c, &pool.zone("c")).await;
        let mut d = deployment(app, 6, json!({"tier": app}), pool.pod_spec());
        d.spec.as_mut().unwrap().paused = Some(true);
        create(&c, &ns.name, d).await;
        c.apply_yaml(
            &ns.name,
            &policy_yaml(
                app,
                &format!(
                    "  selector: {{matchLabels: {{tier: {app}}}}}\n  scaleDown: {scale_down}\n  spread: [{{topologyKey: {ZONE}, mode: Required, method: TopologySpread, maxSkew: 1}}]\n"
                ),
            ),
        );
        wait_until(&format!("{app}: terms applied"), WAIT, || async {
            (policy_status(&c, &ns.name, app)["applied"] == 1).then_some(())
        })
        .await;
        c.kubectl_ok(&[
            "rollout",
            "resume",
            &format!("deployment/{app}"),
            "-n",
            &ns.name,
        ]);
        pools.insert(app, pool);
    }
    for app in ["even", "plain"] {
        wait_zones(&c, &ns.name, app, zones(3, 3, 0)).await;
    }
    // The first pods age: the ReplicaSet controller ranks ready time by its logarithm.
    tokio::time::sleep(Duration::from_secs(40)).await;

    // Zone c comes back, and a scale to 9 fills it.
    for app in ["even", "plain"] {
        let pool = &pools[app];
        pool.uncordon(&c, &pool.zone("c")).await;
        scale(&c, &ns.name, app, 9);
    }
    for app in ["even", "plain"] {
        wait_zones(&c, &ns.name, app, zones(3, 3, 3)).await;
    }
    costs_in_place(&c, &ns.name, "even", &pools["even"]).await;

    // To 6.
    for app in ["even", "plain"] {
        scale(&c, &ns.name, app, 6);
    }
    let on = settled_zones(&c, &ns.name, "even", 6).await;
    let off = settled_zones(&c, &ns.name, "plain", 6).await;
    eprintln!("9 -> 6: Balanced {on:?}, Default {off:?}");
    assert_eq!(on, zones(2, 2, 2), "Balanced");
    assert_eq!(
        off,
        zones(3, 3, 0),
        "Default: the ReplicaSet controller deletes the most recently ready pods, all of zone c"
    );

    // To 3.
    costs_in_place(&c, &ns.name, "even", &pools["even"]).await;
    for app in ["even", "plain"] {
        scale(&c, &ns.name, app, 3);
    }
    let on = settled_zones(&c, &ns.name, "even", 3).await;
    let off = settled_zones(&c, &ns.name, "plain", 3).await;
    eprintln!("6 -> 3: Balanced {on:?}, Default {off:?}");
    assert_eq!(on, zones(1, 1, 1), "Balanced");
    assert_eq!(off.get("c"), None, "Default: zone c stays empty");
    assert_eq!(off.values().sum::<usize>(), 3);
    // The Default policy's pods never got a cost.
    assert!(
        pods(&c, &ns.name, "plain")
            .await
            .iter()
            .all(|p| cost(p).is_none())
    );
}
