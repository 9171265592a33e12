//! Rebalancing (issue 10), end to end with the real scheduler, ReplicaSet controller and
//! disruption controller: zone c is cordoned while a Deployment of 6 is placed (3/3/0), then
//! uncordoned; the policy's `rebalance` evicts pods of the crowded zones one at a time until the
//! spread is 2/2/2, and a PodDisruptionBudget (minAvailable 5), checked every 100 ms, is never
//! violated.

mod support;

use k8s_openapi::api::core::v1::{Event, Pod};
use kube::{Api, api::ListParams};
use serde_json::json;
use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};
use support::spread::{
    Pool, WAIT, ZONE, condition, create, deployment, phase, policy_status, policy_yaml,
    running_per_domain,
};
use support::{Cluster, Operator, TestNamespace, cluster, random_suffix, wait_until};

fn zones(a: usize, b: usize, c: usize) -> BTreeMap<String, usize> {
    [("a", a), ("b", b), ("c", c)]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(z, n)| (z.to_string(), n))
        .collect()
}

/// Pods of `app=web` that count for a PodDisruptionBudget: Running, Ready, not terminating.
async fn healthy(c: &Cluster, ns: &str) -> Option<usize> {
    let pods = Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default().labels("app=web"))
        .await
        .ok()?;
    Some(
        pods.items
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && phase(p) == "Running")
            .filter(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count(),
    )
}

async fn eviction_events(c: &Cluster, ns: &str) -> Vec<Event> {
    let mut events: Vec<Event> = Api::<Event>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("PodEvicted"))
        .collect();
    events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    events
}

#[tokio::test]
async fn a_zone_back_from_an_outage_is_refilled_by_evictions_within_the_disruption_budget() {
    let c = cluster().await;
    c.install();
    let ns = TestNamespace::new(&c, "spread-rebalance").await;
    let _op = Operator::start(&c, &ns.name);
    let pool = Pool::create(&c, &format!("r{}", random_suffix()), &["a", "b", "c"], 2).await;
    pool.cordon(&c, &pool.zone("c")).await;

    let mut d = deployment("web", 6, json!({"tier": "web"}), pool.pod_spec());
    d.spec.as_mut().unwrap().paused = Some(true);
    create(&c, &ns.name, d).await;
    c.apply_yaml(
        &ns.name,
        &policy_yaml(
            "web",
            &format!(
                "  selector: {{matchLabels: {{tier: web}}}}\n  spread: [{{topologyKey: {ZONE}, mode: Required, method: TopologySpread, maxSkew: 1}}]\n  rebalance: {{maxUnavailable: 1, minInterval: 5s}}\n"
            ),
        ),
    );
    wait_until("terms applied", WAIT, || async {
        (policy_status(&c, &ns.name, "web")["applied"] == 1).then_some(())
    })
    .await;
    c.kubectl_ok(&["rollout", "resume", "deployment/web", "-n", &ns.name]);
    wait_until("3/3/0", WAIT, || async {
        (running_per_domain(&c, &ns.name, "web", ZONE).await == zones(3, 3, 0)).then_some(())
    })
    .await;
    // Nothing to rebalance while zone c takes no pod.
    let s = policy_status(&c, &ns.name, "web");
    assert_eq!(condition(&s, "Skewed").unwrap()["status"], "False", "{s}");

    c.apply_yaml(
        &ns.name,
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: web}\nspec:\n  minAvailable: 5\n  selector: {matchLabels: {app: web}}\n",
    );
    wait_until("the budget allows one disruption", WAIT, || async {
        let out = c.kubectl(&[
            "get",
            "pdb",
            "web",
            "-n",
            &ns.name,
            "-o",
            "jsonpath={.status.disruptionsAllowed}",
        ]);
        (String::from_utf8_lossy(&out.stdout) == "1").then_some(())
    })
    .await;

    // The budget, checked every 100 ms from now on.
    let stop = Arc::new(AtomicBool::new(false));
    let lowest = Arc::new(AtomicUsize::new(usize::MAX));
    let checks = Arc::new(AtomicUsize::new(0));
    let checker = {
        let (c, ns, stop, lowest, checks) = (
            c.clone(),
            ns.name.clone(),
            stop.clone(),
            lowest.clone(),
            checks.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                if let Some(n) = healthy(&c, &ns).await {
                    lowest.fetch_min(n, Ordering::SeqCst);
                    checks.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    let start = std::time::Instant::now();
    pool.uncordon(&c, &pool.zone("c")).await;
    wait_until("2/2/2 and Skewed=False", WAIT, || async {
        let even = running_per_domain(&c, &ns.name, "web", ZONE).await == zones(2, 2, 2);
        let s = policy_status(&c, &ns.name, "web");
        let balanced = condition(&s, "Skewed").is_some_and(|c| c["status"] == "False");
        (even && balanced).then_some(())
    })
    .await;
    let took = start.elapsed();
    // A little longer, to see nothing more is evicted.
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, Ordering::SeqCst);
    checker.await.unwrap();

    let lowest = lowest.load(Ordering::SeqCst);
    let checks = checks.load(Ordering::SeqCst);
    let events = eviction_events(&c, &ns.name).await;
    eprintln!(
        "rebalanced to 2/2/2 in {took:?}; {} evictions; {checks} budget checks, lowest healthy {lowest}",
        events.len()
    );
    for e in &events {
        eprintln!(
            "  {:?} {}",
            e.event_time.as_ref().map(|t| t.0),
            e.message.as_deref().unwrap_or("")
        );
    }
    assert!(checks > 50, "the budget was checked {checks} times");
    assert!(
        lowest >= 5,
        "the budget (minAvailable 5) was violated: {lowest} healthy"
    );
    assert_eq!(events.len(), 2, "3/3/0 -> 2/2/2 takes two evictions");
    for e in &events {
        let note = e.message.as_deref().unwrap_or("");
        assert!(
            note.starts_with("Deployment/web: topology.kubernetes.io/zone skew")
                && note.contains("evicted pod web-"),
            "{note}"
        );
    }
    let (t0, t1) = (
        events[0].event_time.as_ref().unwrap().0,
        events[1].event_time.as_ref().unwrap().0,
    );
    assert!(
        t1.duration_since(t0) >= jiff::SignedDuration::from_secs(4),
        "one batch at a time, minInterval 5s apart: {t0} and {t1}"
    );

    // A budget that allows no disruption: the evictions are refused, said in an Event, and
    // nothing moves until it allows one again.
    c.kubectl_ok(&[
        "patch",
        "pdb",
        "web",
        "-n",
        &ns.name,
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailable":6}}"#,
    ]);
    wait_until("the budget allows none", WAIT, || async {
        let out = c.kubectl(&[
            "get",
            "pdb",
            "web",
            "-n",
            &ns.name,
            "-o",
            "jsonpath={.status.disruptionsAllowed}",
        ]);
        (String::from_utf8_lossy(&out.stdout) == "0").then_some(())
    })
    .await;
    pool.cordon(&c, &pool.zone("c")).await;
    for node in pool.zone("c") {
        c.kubectl_ok(&[
            "delete",
            "pods",
            "-n",
            &ns.name,
            "-l",
            "app=web",
            "--field-selector",
            &format!("spec.nodeName={node}"),
        ]);
    }
    wait_until("3/3/0 again", WAIT, || async {
        (running_per_domain(&c, &ns.name, "web", ZONE).await == zones(3, 3, 0)).then_some(())
    })
    .await;
    pool.uncordon(&c, &pool.zone("c")).await;
    let refused = wait_until("an EvictionBlocked event", WAIT, || async {
        Api::<Event>::namespaced(c.client.clone(), &ns.name)
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("EvictionBlocked"))
    })
    .await;
    let message = refused.message.unwrap_or_default();
    assert!(message.contains("disruption budget"), "{message}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        running_per_domain(&c, &ns.name, "web", ZONE).await,
        zones(3, 3, 0),
        "nothing evicted against the budget"
    );
    assert_eq!(eviction_events(&c, &ns.name).await.len(), 2);
    c.kubectl_ok(&[
        "patch",
        "pdb",
        "web",
        "-n",
        &ns.name,
        "--type=merge",
        "-p",
        r#"{"spec":{"minAvailable":5}}"#,
    ]);
    wait_until("2/2/2 once the budget allows it", WAIT, || async {
        (running_per_domain(&c, &ns.name, "web", ZONE).await == zones(2, 2, 2)).then_some(())
    })
    .await;
}
