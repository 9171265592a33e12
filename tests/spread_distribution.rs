//! The real distribution in status (issue 10), end to end on a node pool of the test's own:
//! the pods per domain a policy reports equal the zones and hosts of the pods' real nodes; a
//! zone that comes back after an outage makes the policy `Skewed`; Pending pods are counted
//! with the scheduler's reason; and pods coming and going make a bounded number of status
//! writes, none once they settle.

mod support;

use ballast::api::spread_policy::SpreadPolicy;
use futures::StreamExt;
use kube::{
    Api,
    runtime::{WatchStreamExt, watcher},
};
use serde_json::{Value, json};
use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use support::spread::{
    HOST, Pool, WAIT, ZONE, condition, create, deployment, policy_status, policy_yaml,
    running_per_domain,
};
use support::{Cluster, Operator, TestNamespace, cluster, random_suffix, wait_until};

/// `status.distribution.workloads[name]` of policy `policy`.
fn entry(c: &Cluster, ns: &str, policy: &str, name: &str) -> Option<Value> {
    policy_status(c, ns, policy)["distribution"]["workloads"]
        .as_array()?
        .iter()
        .find(|w| w["name"] == name)
        .cloned()
}

/// Pods per domain of `key` in a distribution entry.
fn reported(entry: &Value, key: &str) -> BTreeMap<String, usize> {
    entry["levels"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["topologyKey"] == key)
        .and_then(|l| l["pods"].as_object().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|(_, v)| v.as_u64() != Some(0))
        .map(|(k, v)| (k, v.as_u64().unwrap() as usize))
        .collect()
}

/// The entry of `app` when the policy reports exactly where its Running pods are, at every
/// level it has (zone, and host for `web`).
async fn equal_to_real(c: &Cluster, ns: &str, policy: &str, app: &str) -> Option<Value> {
    let e = entry(c, ns, policy, app)?;
    let zones = running_per_domain(c, ns, app, ZONE).await;
    let running: usize = zones.values().sum();
    let hosts_ok = match e["levels"].as_array()?.len() {
        2 => reported(&e, HOST) == running_per_domain(c, ns, app, HOST).await,
        _ => true,
    };
    (reported(&e, ZONE) == zones && hosts_ok && e["running"].as_u64() == Some(running as u64))
        .then_some(e)
}

/// Waits until [`equal_to_real`].
async fn reported_equals_real(c: &Cluster, ns: &str, policy: &str, app: &str) -> Value {
    wait_until(
        &format!("{policy}: {app}'s distribution equal to its pods' nodes"),
        WAIT,
        || equal_to_real(c, ns, policy, app),
    )
    .await
}

/// Counts the writes to SpreadPolicy `name` from now on (each new resourceVersion).
fn count_writes(c: &Cluster, ns: &str, name: &str) -> Arc<AtomicUsize> {
    let n = Arc::new(AtomicUsize::new(0));
    let api: Api<SpreadPolicy> = Api::namespaced(c.client.clone(), ns);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let counter = n.clone();
    tokio::spawn(async move {
        let mut last: Option<String> = None;
        let mut events = watcher(api, cfg).applied_objects().boxed();
        while let Some(Ok(p)) = events.next().await {
            let rv = p.metadata.resource_version.clone();
            if last.is_some() && rv != last {
                counter.fetch_add(1, Ordering::SeqCst);
                if std::env::var_os("BALLAST_TEST_DEBUG").is_some() {
                    let st = p.status.as_ref().unwrap();
                    let conds: Vec<String> = st
                        .conditions
                        .iter()
                        .map(|c| format!("{}={}", c.type_, c.status))
                        .collect();
                    eprintln!(
                        "write: {conds:?} {:?}",
                        st.distribution.as_ref().map(|d| (
                            d.running_pods,
                            d.pending_pods,
                            d.skewed
                        ))
                    );
                }
            }
            last = rv;
        }
    });
    n
}

#[tokio::test]
async fn the_status_reports_where_pods_really_run_skew_and_pending_with_few_writes() {
    let c = cluster().await;
    c.install();
    let ns = TestNamespace::new(&c, "spread-dist").await;
    let _op = Operator::start(&c, &ns.name);
    let pool = Pool::create(&c, &format!("d{}", random_suffix()), &["a", "b", "c"], 2).await;

    // A zone spread (maxSkew 1) with hosts preferred; and one pod per zone, asked of four.
    // Created paused, so that their first pods already carry the terms.
    for (name, replicas) in [("web", 6), ("api", 4)] {
        let mut d = deployment(name, replicas, json!({"tier": name}), pool.pod_spec());
        d.spec.as_mut().unwrap().paused = Some(true);
        create(&c, &ns.name, d).await;
    }
    c.apply_yaml(
        &ns.name,
        &policy_yaml(
            "web",
            "  selector: {matchLabels: {tier: web}}\n  spread:\n  - {topologyKey: topology.kubernetes.io/zone, mode: Required, method: TopologySpread, maxSkew: 1}\n  - {topologyKey: kubernetes.io/hostname, mode: Preferred}\n",
        ),
    );
    c.apply_yaml(
        &ns.name,
        &policy_yaml(
            "api",
            "  selector: {matchLabels: {tier: api}}\n  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Required}]\n",
        ),
    );
    for name in ["web", "api"] {
        wait_until(&format!("{name}: terms applied"), WAIT, || async {
            let s = policy_status(&c, &ns.name, name);
            (s["applied"] == 1).then_some(())
        })
        .await;
        c.kubectl_ok(&[
            "rollout",
            "resume",
            &format!("deployment/{name}"),
            "-n",
            &ns.name,
        ]);
    }

    let web = reported_equals_real(&c, &ns.name, "web", "web").await;
    assert_eq!(
        reported(&web, ZONE),
        BTreeMap::from([("a".into(), 2), ("b".into(), 2), ("c".into(), 2)])
    );
    let zone = &web["levels"][0];
    assert_eq!((&zone["skew"], &zone["maxSkew"]), (&json!(0), &json!(1)));
    assert_eq!(web["skewed"], false);

    // api: three run, one zone each; the fourth is Pending, with the scheduler's reason.
    let api = wait_until("api's Pending pod reported", WAIT, || async {
        let e = equal_to_real(&c, &ns.name, "api", "api").await?;
        (e["pending"] == 1 && e["pendingReasons"][0]["reason"] == "Unschedulable").then_some(e)
    })
    .await;
    let why = api["pendingReasons"][0]["message"].as_str().unwrap();
    assert!(why.contains("anti-affinity"), "{why}");
    let s = policy_status(&c, &ns.name, "api");
    assert_eq!(
        (
            &s["distribution"]["governed"],
            &s["distribution"]["runningPods"],
            &s["distribution"]["pendingPods"]
        ),
        (&json!(1), &json!(3), &json!(1))
    );

    // Settled: no write to either policy for 15 s.
    let web_writes = count_writes(&c, &ns.name, "web");
    let api_writes = count_writes(&c, &ns.name, "api");
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        (
            web_writes.load(Ordering::SeqCst),
            api_writes.load(Ordering::SeqCst)
        ),
        (0, 0),
        "steady state writes nothing"
    );

    // Churn: scale web to 18 and back to 6 while counting its status writes. Each write waits
    // at least 5 s after the one before when only the counts moved.
    let start = std::time::Instant::now();
    c.kubectl_ok(&["scale", "deployment/web", "-n", &ns.name, "--replicas=18"]);
    wait_until("18 web pods running and reported", WAIT, || async {
        let e = equal_to_real(&c, &ns.name, "web", "web").await?;
        (e["running"] == 18).then_some(())
    })
    .await;
    c.kubectl_ok(&["scale", "deployment/web", "-n", &ns.name, "--replicas=6"]);
    reported_equals_real(&c, &ns.name, "web", "web").await;
    let elapsed = start.elapsed();
    let writes = web_writes.load(Ordering::SeqCst);
    // 24 pods created or deleted, each going through several phases: without pacing that is
    // dozens of writes. With it: one per 5 s, plus the conditions that change at once (the
    // Deployment controller reports each scale as progressing: Progressing goes True and
    // False twice).
    let bound = (elapsed.as_secs() / 5) as usize + 5;
    eprintln!("churn: {writes} status writes in {elapsed:?} (bound {bound})");
    assert!(
        writes <= bound,
        "{writes} status writes in {elapsed:?}, more than {bound}"
    );

    // An outage: zone c is cordoned and its pods are gone; they come back in a and b.
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
            "--wait=false",
        ]);
    }
    let web = wait_until("web's pods back in zones a and b", WAIT, || async {
        let e = equal_to_real(&c, &ns.name, "web", "web").await?;
        (reported(&e, ZONE) == BTreeMap::from([("a".into(), 3), ("b".into(), 3)])).then_some(e)
    })
    .await;
    assert_eq!(
        web["skewed"], false,
        "zone c takes no pod: as even as it gets"
    );
    // Zone c back: 3, 3 and 0 is a skew of 3 where 1 is allowed.
    pool.uncordon(&c, &pool.zone("c")).await;
    let skewed = wait_until("Skewed=True", WAIT, || async {
        let s = policy_status(&c, &ns.name, "web");
        condition(&s, "Skewed").filter(|c| c["status"] == "True")
    })
    .await;
    let message = skewed["message"].as_str().unwrap();
    assert!(
        message.starts_with("web: topology.kubernetes.io/zone skew 3 > 1 (a 3, b 3, c 0)"),
        "{message}"
    );
    let e = entry(&c, &ns.name, "web", "web").unwrap();
    assert_eq!(
        (&e["skewed"], &e["levels"][0]["skew"]),
        (&json!(true), &json!(3))
    );
}
