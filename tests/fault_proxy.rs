//! The fault proxy (`tests/support/proxy.rs`) does what the fault suite relies on, checked by its
//! effects on the real local API server: writes it forwards are applied and recorded in order,
//! a kill follows exactly the Nth write, a dropped response's write is applied all the same,
//! injected failures never reach the server, watch events arrive late, and a partition loses
//! what it catches. The client is the manager's ServiceAccount, as the operator's would be.

mod support;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::{batch::v1::Job, events::v1::Event};
use kube::{
    Api, Client, Config, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use serde_json::json;
use std::{
    os::unix::process::ExitStatusExt,
    path::Path,
    time::{Duration, Instant},
};
use support::proxy::{Fate, FaultProxy};
use support::rollout::{Env, adopt};
use support::{Cluster, Operator, TestNamespace, cluster, wait_until};

/// A client through the proxy; `retry: false` turns off kube's own retry of 429/503/504 so a
/// test sees each injected answer.
async fn client_via(kubeconfig: &Path, retry: bool) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).unwrap();
    let mut config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .unwrap();
    assert_eq!(config.cluster_url.host(), Some("127.0.0.1"));
    config.default_retry = retry;
    Client::try_from(config).unwrap()
}

const REPORTER: &str = "ballast.dev/fault-proxy-test";

fn event(ns: &str, name: &str) -> Event {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "regarding": {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "namespace": ns},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": REPORTER,
        "reportingInstance": "test",
        "action": "Test", "reason": "Test", "type": "Normal", "note": name,
    }))
    .unwrap()
}

/// A Job that never makes a pod (suspended): a cheap object the ServiceAccount may watch and
/// delete.
fn suspended_job(name: &str) -> Job {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "t", "image": "t:1"}]}}},
    }))
    .unwrap()
}

async fn event_names(c: &Cluster, ns: &str) -> Vec<String> {
    let mut names: Vec<String> = Api::<Event>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        // The Job controller reports on suspended Jobs in the same namespace.
        .filter(|e| e.reporting_controller.as_deref() == Some(REPORTER))
        .map(|e| e.name_any())
        .collect();
    names.sort();
    names
}

struct Setup {
    c: Cluster,
    ns: TestNamespace,
    proxy: FaultProxy,
    client: Client,
}

async fn setup(prefix: &str, retry: bool) -> Setup {
    let c = cluster().await;
    let ns = TestNamespace::new(&c, prefix).await;
    let proxy = FaultProxy::start(&c);
    let client = client_via(&proxy.operator_kubeconfig(&c), retry).await;
    Setup {
        c,
        ns,
        proxy,
        client,
    }
}

#[tokio::test]
async fn writes_are_forwarded_and_recorded_in_order() {
    let s = setup("proxy-rec", false).await;
    let events: Api<Event> = Api::namespaced(s.client.clone(), &s.ns.name);
    for name in ["e1", "e2", "e3"] {
        events
            .create(&PostParams::default(), &event(&s.ns.name, name))
            .await
            .unwrap();
    }
    events
        .patch(
            "e2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"patched": "yes"}}})),
        )
        .await
        .unwrap();
    Api::<Job>::namespaced(s.c.client.clone(), &s.ns.name)
        .create(&PostParams::default(), &suspended_job("j"))
        .await
        .unwrap();
    let jobs: Api<Job> = Api::namespaced(s.client.clone(), &s.ns.name);
    assert_eq!(
        jobs.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    jobs.delete("j", &DeleteParams::background()).await.unwrap();

    assert_eq!(event_names(&s.c, &s.ns.name).await, ["e1", "e2", "e3"]);
    let e2 = Api::<Event>::namespaced(s.c.client.clone(), &s.ns.name)
        .get("e2")
        .await
        .unwrap();
    assert_eq!(
        e2.labels().get("patched").map(String::as_str),
        Some("yes"),
        "the PATCH was applied"
    );

    let writes = s.proxy.writes();
    let seen: Vec<String> = writes
        .iter()
        .map(|w| {
            format!(
                "{} {} {} #{}",
                w.method,
                w.object().unwrap_or("?"),
                w.status.unwrap_or(0),
                w.write.unwrap_or(0)
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            "POST e1 201 #1",
            "POST e2 201 #2",
            "POST e3 201 #3",
            "PATCH e2 200 #4",
            "DELETE j 200 #5",
        ]
    );
    assert!(
        writes
            .iter()
            .all(|w| w.fate == Fate::Forwarded && w.applied())
    );
    assert_eq!(s.proxy.writes_to("/events").len(), 4);
    assert_eq!(s.proxy.writes_to("/jobs/j").len(), 1);
    let counts = s.proxy.request_counts();
    assert_eq!(counts.writes, 5);
    assert_eq!(counts.counted_writes, 5);
    assert_eq!(counts.reads, 1, "the one list: {counts:?}");
    assert_eq!(counts.watches, 0);
    assert_eq!(counts.total, 6);
}

#[tokio::test]
async fn kill_after_write_kills_right_after_the_nth_response_and_lets_nothing_else_through() {
    let s = setup("proxy-kill", false).await;
    let mut victim = std::process::Command::new("sleep")
        .arg("120")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // A write before arming does not count: numbers are relative to the arming.
    let events: Api<Event> = Api::namespaced(s.client.clone(), &s.ns.name);
    events
        .create(&PostParams::default(), &event(&s.ns.name, "before"))
        .await
        .unwrap();
    s.proxy.kill_after_write(3, victim.id());
    let mut outcomes = vec![];
    for i in 1..=3 {
        let r = events
            .create(&PostParams::default(), &event(&s.ns.name, &format!("e{i}")))
            .await;
        outcomes.push(r.is_ok());
    }
    assert_eq!(
        outcomes,
        [true, true, true],
        "the Nth response is delivered"
    );
    // Sent before the kill landed: held back, then dropped, never applied.
    let fourth = events
        .create(&PostParams::default(), &event(&s.ns.name, "e4"))
        .await;
    assert!(fourth.is_err(), "a write after the Nth is not answered");
    let status = victim.wait().unwrap();
    assert_eq!(status.signal(), Some(9), "SIGKILLed");
    let kills = s.proxy.kills();
    assert_eq!(kills.len(), 1);
    assert_eq!(kills[0].pid, victim.id());
    assert_eq!(
        kills[0].after_write, 4,
        "the 3rd write after arming is the 4th counted"
    );
    assert!(!s.proxy.kill_pending());
    // After the kill, traffic flows again.
    events
        .create(&PostParams::default(), &event(&s.ns.name, "e5"))
        .await
        .unwrap();
    assert_eq!(
        event_names(&s.c, &s.ns.name).await,
        ["before", "e1", "e2", "e3", "e5"]
    );
    let writes = s.proxy.writes();
    let third = writes
        .iter()
        .find(|w| w.name.as_deref() == Some("e3"))
        .unwrap();
    assert!(kills[0].at > third.answered.unwrap());
    let fourth = writes
        .iter()
        .find(|w| w.name.as_deref() == Some("e4"))
        .unwrap();
    assert_eq!(fourth.fate, Fate::Frozen);
    assert_eq!(fourth.write, None);
    assert_eq!(s.proxy.request_counts().frozen, 1);
}

#[tokio::test]
async fn a_dropped_response_write_is_applied_all_the_same() {
    let s = setup("proxy-drop", false).await;
    let events: Api<Event> = Api::namespaced(s.client.clone(), &s.ns.name);
    s.proxy.drop_response_of_write(2);
    let mut outcomes = vec![];
    for name in ["e1", "e2", "e3"] {
        outcomes.push(
            events
                .create(&PostParams::default(), &event(&s.ns.name, name))
                .await
                .is_ok(),
        );
    }
    assert_eq!(
        outcomes,
        [true, false, true],
        "only the 2nd goes unanswered"
    );
    assert_eq!(
        event_names(&s.c, &s.ns.name).await,
        ["e1", "e2", "e3"],
        "the write whose response was dropped is in the cluster"
    );
    let dropped: Vec<_> = s
        .proxy
        .writes()
        .into_iter()
        .filter(|w| w.fate == Fate::ResponseDropped)
        .collect();
    assert_eq!(dropped.len(), 1);
    assert_eq!(dropped[0].name.as_deref(), Some("e2"));
    assert_eq!(dropped[0].status, Some(201));
    assert!(dropped[0].applied());
    // The retry a client makes then meets the object it created.
    let again = events
        .create(&PostParams::default(), &event(&s.ns.name, "e2"))
        .await;
    assert!(matches!(again, Err(kube::Error::Api(e)) if e.code == 409));
}

#[tokio::test]
async fn injected_failures_never_reach_the_server() {
    let s = setup("proxy-fail", false).await;
    let events: Api<Event> = Api::namespaced(s.client.clone(), &s.ns.name);
    s.proxy.fail_next_writes(2, 429);
    let mut codes = vec![];
    for name in ["e1", "e2", "e3"] {
        codes.push(
            match events
                .create(&PostParams::default(), &event(&s.ns.name, name))
                .await
            {
                Ok(_) => 201,
                Err(kube::Error::Api(e)) => e.code,
                Err(e) => panic!("{e}"),
            },
        );
    }
    assert_eq!(codes, [429, 429, 201]);
    assert_eq!(event_names(&s.c, &s.ns.name).await, ["e3"]);
    let w = s.proxy.writes();
    assert_eq!(w[0].fate, Fate::Injected);
    assert_eq!(
        w[0].write, None,
        "an injected answer is not a counted write"
    );
    assert_eq!(w[2].write, Some(1));

    // Retry-After comes with a 429, and reads fail too with fail_next.
    s.proxy.fail_next(1, 429);
    let req = hyper::Request::get(format!("/apis/batch/v1/namespaces/{}/jobs", s.ns.name))
        .body(kube::client::Body::empty())
        .unwrap();
    let resp = s.client.send(req).await.unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(resp.headers()["retry-after"], "1");
    s.proxy.fail_next(1, 500);
    let jobs: Api<Job> = Api::namespaced(s.client.clone(), &s.ns.name);
    let err = jobs.list(&ListParams::default()).await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(e) if e.code == 500));
    assert_eq!(s.proxy.request_counts().injected, 4);

    // kube's default client retries a 429 by itself: the operator's calls see a burst of
    // throttling as latency.
    let retrying = client_via(&s.proxy.operator_kubeconfig(&s.c), true).await;
    s.proxy.fail_next(2, 429);
    let jobs: Api<Job> = Api::namespaced(retrying, &s.ns.name);
    jobs.list(&ListParams::default()).await.unwrap();
    let tail: Vec<Fate> = s
        .proxy
        .log()
        .iter()
        .rev()
        .take(3)
        .map(|e| e.fate.clone())
        .collect();
    assert_eq!(tail, [Fate::Forwarded, Fate::Injected, Fate::Injected]);
}

/// The next ADDED event of `stream` for `name`, and when it came.
async fn next_added(
    stream: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<Job>>> + Unpin),
    name: &str,
) -> Instant {
    loop {
        match stream.try_next().await.unwrap() {
            Some(WatchEvent::Added(j)) if j.name_any() == name => return Instant::now(),
            Some(_) => continue,
            None => panic!("the watch ended"),
        }
    }
}

#[tokio::test]
async fn watch_events_are_delayed_for_the_period_then_prompt() {
    let s = setup("proxy-delay", false).await;
    let admin: Api<Job> = Api::namespaced(s.c.client.clone(), &s.ns.name);
    let jobs: Api<Job> = Api::namespaced(s.client.clone(), &s.ns.name);
    let rv = jobs
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = jobs
        .watch(&WatchParams::default().timeout(60), &rv)
        .await
        .unwrap()
        .boxed();
    s.proxy
        .delay_watch_events(Duration::from_secs(3), Duration::from_secs(6));
    let t0 = Instant::now();
    admin
        .create(&PostParams::default(), &suspended_job("late"))
        .await
        .unwrap();
    let late = next_added(&mut stream, "late").await - t0;
    assert!(
        late >= Duration::from_millis(2900),
        "an event in the period arrives 3 s late: {late:?}"
    );
    tokio::time::sleep_until((t0 + Duration::from_secs(7)).into()).await;
    let t1 = Instant::now();
    admin
        .create(&PostParams::default(), &suspended_job("prompt"))
        .await
        .unwrap();
    let prompt = next_added(&mut stream, "prompt").await - t1;
    assert!(
        prompt < Duration::from_secs(1),
        "after the period, events are prompt: {prompt:?}"
    );
    assert_eq!(s.proxy.request_counts().watches, 1);
}

#[tokio::test]
async fn a_partition_answers_nothing_and_loses_what_it_caught() {
    let s = setup("proxy-bh", false).await;
    let admin: Api<Job> = Api::namespaced(s.c.client.clone(), &s.ns.name);
    let jobs: Api<Job> = Api::namespaced(s.client.clone(), &s.ns.name);
    let rv = jobs
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = jobs
        .watch(&WatchParams::default().timeout(120), &rv)
        .await
        .unwrap()
        .boxed();
    s.proxy.blackhole(true);
    let read = tokio::spawn({
        let jobs = jobs.clone();
        async move { jobs.list(&ListParams::default()).await }
    });
    let write = tokio::spawn({
        let events: Api<Event> = Api::namespaced(s.client.clone(), &s.ns.name);
        let lost = event(&s.ns.name, "lost");
        async move { events.create(&PostParams::default(), &lost).await }
    });
    admin
        .create(&PostParams::default(), &suspended_job("unseen"))
        .await
        .unwrap();
    let quiet = tokio::time::timeout(Duration::from_secs(3), stream.next()).await;
    assert!(quiet.is_err(), "the open watch is stalled: {quiet:?}");
    assert!(!read.is_finished(), "a read is never answered");
    assert!(!write.is_finished(), "a write is never answered");
    s.proxy.blackhole(false);
    assert!(read.await.unwrap().is_err(), "held read cut at the end");
    assert!(write.await.unwrap().is_err(), "held write cut at the end");
    let end = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the watch is cut when the partition ends");
    assert!(
        !matches!(end, Some(Ok(WatchEvent::Added(_)))),
        "nothing caught in the partition is delivered: {end:?}"
    );
    assert!(
        event_names(&s.c, &s.ns.name).await.is_empty(),
        "a write caught in the partition is never applied"
    );
    jobs.list(&ListParams::default()).await.unwrap();
    let counts = s.proxy.request_counts();
    assert_eq!(counts.blackholed, 2, "{counts:?}");
}

#[tokio::test]
async fn the_operator_runs_through_the_proxy_as_its_service_account() {
    let mut env = Env::new("proxy-op").await;
    env.kill();
    let proxy = FaultProxy::start(&env.c);
    env.op = Operator::start_with_kubeconfig(
        &proxy.operator_kubeconfig(&env.c),
        &env.ns.name,
        &format!("ballast-{}", env.ns.name),
        &[],
    );
    adopt(
        &env,
        1,
        "  pre: [{name: migrate, container: {from: app, command: [m]}}]\n",
    )
    .await;
    let writes = proxy.writes();
    assert!(
        writes
            .iter()
            .any(|w| w.path.ends_with("/deployments/web") && w.applied()),
        "the adoption's pause went through the proxy: {writes:#?}"
    );
    assert!(
        writes
            .iter()
            .any(|w| w.path.contains("/leases") && w.write.is_none()),
        "Lease writes are recorded but not counted"
    );
    assert!(proxy.request_counts().watches >= 1);
    wait_until("no error in the log", Duration::from_secs(1), || async {
        (!env.op.logs().contains("Unauthorized")).then_some(())
    })
    .await;
}
