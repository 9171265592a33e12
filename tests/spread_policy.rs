//! SpreadPolicy end to end: the real operator (under its ServiceAccount)
//! writes terms into real Deployments and StatefulSets, and the real
//! scheduler places kwok pods by them.

mod support;

use k8s_openapi::api::{
    apps::v1::{Deployment, StatefulSet},
    core::v1::{Event, Node, Pod},
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use std::{collections::BTreeMap, time::Duration};
use support::{Cluster, Operator, TestNamespace, cluster, wait_until};

const ZONE: &str = "topology.kubernetes.io/zone";
const HOST: &str = "kubernetes.io/hostname";
const WAIT: Duration = Duration::from_secs(90);
/// Most tests: one replica per zone at most, for workloads labelled `tier: web`.
const ZONE_REQUIRED: &str = "  selector: {matchLabels: {tier: web}}\n  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Required}]\n";

fn deployment(name: &str, replicas: i32, labels: Value, pod_spec_extra: Value) -> Deployment {
    let mut spec = json!({"containers": [{"name": "app", "image": "registry.example/app:1"}]});
    if let (Some(s), Some(extra)) = (spec.as_object_mut(), pod_spec_extra.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }))
    .unwrap()
}

async fn create_deployment(c: &Cluster, ns: &str, d: Deployment) -> Deployment {
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), ns);
    api.create(&PostParams::default(), &d).await.unwrap()
}

/// A Deployment labelled `tier: web`, the label most policies here select.
async fn create_web(
    c: &Cluster,
    ns: &str,
    name: &str,
    replicas: i32,
    pod_spec_extra: Value,
) -> Deployment {
    create_deployment(
        c,
        ns,
        deployment(name, replicas, json!({"tier": "web"}), pod_spec_extra),
    )
    .await
}

const ONE_PER_ZONE: [(&str, usize); 3] = [("zone-a", 1), ("zone-b", 1), ("zone-c", 1)];

async fn get_deployment(c: &Cluster, ns: &str, name: &str) -> Deployment {
    Api::<Deployment>::namespaced(c.client.clone(), ns)
        .get(name)
        .await
        .unwrap()
}

fn pod_spec(d: &Deployment) -> Value {
    serde_json::to_value(d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()).unwrap()
}

fn list(v: &Value, path: &[&str]) -> Vec<Value> {
    let mut cur = v;
    for p in path {
        match cur.get(p) {
            Some(n) => cur = n,
            None => return vec![],
        }
    }
    cur.as_array().cloned().unwrap_or_default()
}

fn anti_required(d: &Deployment) -> Vec<Value> {
    list(
        &pod_spec(d),
        &[
            "affinity",
            "podAntiAffinity",
            "requiredDuringSchedulingIgnoredDuringExecution",
        ],
    )
}

fn anti_preferred(d: &Deployment) -> Vec<Value> {
    list(
        &pod_spec(d),
        &[
            "affinity",
            "podAntiAffinity",
            "preferredDuringSchedulingIgnoredDuringExecution",
        ],
    )
}

fn policy_yaml(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: SpreadPolicy\nmetadata: {{name: {name}}}\nspec:\n{spec}"
    )
}

/// What ballast's writes leave on a workload: the generation, and when its
/// field manager last wrote (the Deployment controller's status updates
/// change the resourceVersion too, so that cannot tell).
fn our_writes(d: &Deployment) -> (Option<i64>, Vec<String>) {
    let times = d
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() == Some("ballast.dev/spread-policy"))
        .map(|m| format!("{:?} {:?}", m.operation, m.time.as_ref().map(|t| t.0)))
        .collect();
    (d.metadata.generation, times)
}

/// The status of a policy, as JSON.
fn policy_status(c: &Cluster, ns: &str, name: &str) -> Value {
    let out = c.kubectl(&["get", "spreadpolicy", name, "-n", ns, "-o", "json"]);
    serde_json::from_slice::<Value>(&out.stdout)
        .map(|v| v["status"].clone())
        .unwrap_or(Value::Null)
}

fn condition(status: &Value, type_: &str) -> Option<Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

async fn wait_condition(
    c: &Cluster,
    ns: &str,
    policy: &str,
    type_: &str,
    want: &str,
    msg_contains: &str,
) -> Value {
    let what = format!("{policy}: {type_}={want} with {msg_contains:?}");
    wait_until(&what, WAIT, || async {
        let s = policy_status(c, ns, policy);
        let cond = condition(&s, type_)?;
        (cond["status"] == want
            && cond["message"]
                .as_str()
                .unwrap_or("")
                .contains(msg_contains))
        .then_some(cond)
    })
    .await
}

async fn wait_deployment<F: Fn(&Deployment) -> bool>(
    c: &Cluster,
    ns: &str,
    name: &str,
    what: &str,
    f: F,
) -> Deployment {
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), ns);
    wait_until(what, WAIT, || async {
        let d = api.get(name).await.ok()?;
        f(&d).then_some(d)
    })
    .await
}

fn rolled_out(d: &Deployment) -> bool {
    let want = d.spec.as_ref().unwrap().replicas.unwrap_or(1);
    let Some(s) = &d.status else { return false };
    s.observed_generation >= d.metadata.generation
        && s.updated_replicas == Some(want)
        && s.replicas == Some(want)
        && s.available_replicas == Some(want)
}

async fn running_pods(c: &Cluster, ns: &str, selector: &str) -> Vec<Pod> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), ns);
    pods.list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect()
}

/// How many Running pods matching `selector` sit in each value of `key`.
async fn pods_per_domain(
    c: &Cluster,
    ns: &str,
    selector: &str,
    key: &str,
) -> BTreeMap<String, usize> {
    let nodes: Api<Node> = Api::all(c.client.clone());
    let mut out = BTreeMap::new();
    for p in running_pods(c, ns, selector).await {
        let node = nodes
            .get(p.spec.as_ref().unwrap().node_name.as_ref().unwrap())
            .await
            .unwrap();
        *out.entry(node.labels().get(key).cloned().unwrap_or_default())
            .or_insert(0) += 1;
    }
    out
}

async fn wait_spread(c: &Cluster, ns: &str, selector: &str, key: &str, want: &[(&str, usize)]) {
    let want: BTreeMap<String, usize> = want.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    let what = format!("pods of {selector} spread as {want:?}");
    wait_until(&what, WAIT, || async {
        let got = pods_per_domain(c, ns, selector, key).await;
        (got == want).then_some(())
    })
    .await;
}

/// Fields drop in order: the operator stops before its namespace goes.
struct Setup {
    op: Operator,
    c: Cluster,
    ns: TestNamespace,
}

async fn setup(prefix: &str) -> Setup {
    let c = cluster().await;
    c.install();
    let ns = TestNamespace::new(&c, prefix).await;
    let op = Operator::start(&c, &ns.name);
    Setup { c, ns, op }
}

// ---------------------------------------------------------------- terms and the scheduler

#[tokio::test]
async fn required_zone_anti_affinity_places_one_replica_per_zone() {
    let Setup { c, ns, op: _op } = setup("spol-zone").await;
    create_web(&c, &ns.name, "web", 3, json!({})).await;
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    let d = wait_deployment(&c, &ns.name, "web", "our anti-affinity term", |d| {
        !anti_required(d).is_empty()
    })
    .await;
    let terms = anti_required(&d);
    assert_eq!(terms.len(), 1);
    assert_eq!(terms[0]["topologyKey"], ZONE);
    assert_eq!(
        terms[0]["labelSelector"],
        json!({"matchLabels": {"app": "web"}}),
        "the workload's own selector"
    );
    assert_eq!(terms[0]["matchLabelKeys"], json!(["pod-template-hash"]));
    wait_spread(&c, &ns.name, "app=web", ZONE, &ONE_PER_ZONE).await;
    let ready = wait_condition(&c, &ns.name, "web-ha", "Ready", "True", "1 of 1").await;
    assert_eq!(ready["reason"], "Applied");
    let status = policy_status(&c, &ns.name, "web-ha");
    assert_eq!(status["matched"], 1);
    assert_eq!(status["applied"], 1);
    let zone = status["domains"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["topologyKey"] == ZONE)
        .unwrap()
        .clone();
    assert_eq!(zone["domains"], 3);
    assert_eq!(zone["schedulableNodes"], 6);
}

#[tokio::test]
async fn topology_spread_with_max_skew_one_places_six_replicas_two_per_zone() {
    let Setup { c, ns, op: _op } = setup("spol-tsc").await;
    create_web(&c, &ns.name, "web", 6, json!({})).await;
    c.apply_yaml(
        &ns.name,
        &policy_yaml(
            "web-tsc",
            "  selector: {matchLabels: {tier: web}}\n  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Required, method: TopologySpread, maxSkew: 1}]\n",
        ),
    );
    let d = wait_deployment(&c, &ns.name, "web", "our topology spread constraint", |d| {
        !list(&pod_spec(d), &["topologySpreadConstraints"]).is_empty()
    })
    .await;
    let tsc = list(&pod_spec(&d), &["topologySpreadConstraints"]);
    assert_eq!(tsc[0]["whenUnsatisfiable"], "DoNotSchedule");
    assert_eq!(tsc[0]["maxSkew"], 1);
    assert_eq!(tsc[0]["matchLabelKeys"], json!(["pod-template-hash"]));
    assert_eq!(
        (&tsc[0]["nodeAffinityPolicy"], &tsc[0]["nodeTaintsPolicy"]),
        (&json!("Honor"), &json!("Honor"))
    );
    wait_deployment(&c, &ns.name, "web", "the rollout", rolled_out).await;
    wait_spread(
        &c,
        &ns.name,
        "app=web",
        ZONE,
        &[("zone-a", 2), ("zone-b", 2), ("zone-c", 2)],
    )
    .await;
}

#[tokio::test]
async fn a_rolling_update_with_required_zone_anti_affinity_and_max_surge_completes() {
    let Setup { c, ns, op: _op } = setup("spol-roll").await;
    create_web(&c, &ns.name, "web", 3, json!({})).await;
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    wait_deployment(&c, &ns.name, "web", "terms applied and rolled out", |d| {
        !anti_required(d).is_empty() && rolled_out(d)
    })
    .await;
    // replicas == zones, maxSurge 1, maxUnavailable 0: the surge pod must
    // be able to land next to an old pod, which pod-template-hash allows.
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), &ns.name);
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Strategic(json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "registry.example/app:2"}]}}}})),
    )
    .await
    .unwrap();
    let d = wait_deployment(&c, &ns.name, "web", "the image update to complete", |d| {
        rolled_out(d) && d.status.as_ref().unwrap().observed_generation == d.metadata.generation
    })
    .await;
    assert_eq!(d.status.unwrap().updated_replicas, Some(3));
    wait_spread(&c, &ns.name, "app=web", ZONE, &ONE_PER_ZONE).await;
}

#[tokio::test]
async fn colocate_and_separate_place_pods_near_and_away_from_others() {
    let Setup { c, ns, op: _op } = setup("spol-colo").await;
    // A cache pinned to zone-b, and a batch job on one host of zone-a.
    create_deployment(
        &c,
        &ns.name,
        deployment(
            "cache",
            1,
            json!({}),
            json!({"nodeSelector": {ZONE: "zone-b"}}),
        ),
    )
    .await;
    create_deployment(
        &c,
        &ns.name,
        deployment(
            "batch",
            1,
            json!({}),
            json!({"nodeSelector": {HOST: "kwok-zone-a-0"}}),
        ),
    )
    .await;
    wait_until("cache and batch running", WAIT, || async {
        (running_pods(&c, &ns.name, "app in (cache,batch)")
            .await
            .len()
            == 2)
            .then_some(())
    })
    .await;
    create_deployment(
        &c,
        &ns.name,
        deployment("near", 2, json!({"tier": "near"}), json!({})),
    )
    .await;
    create_deployment(
        &c,
        &ns.name,
        deployment(
            "away",
            4,
            json!({"tier": "away"}),
            json!({"nodeSelector": {ZONE: "zone-a"}}),
        ),
    )
    .await;
    c.apply_yaml(
        &ns.name,
        &format!(
            "{}---\n{}",
            policy_yaml(
                "near-cache",
                "  selector: {matchLabels: {tier: near}}\n  colocate: [{labelSelector: {matchLabels: {app: cache}}, topologyKey: topology.kubernetes.io/zone, mode: Required}]\n"
            ),
            policy_yaml(
                "away-from-batch",
                "  selector: {matchLabels: {tier: away}}\n  separate: [{labelSelector: {matchLabels: {app: batch}}, topologyKey: kubernetes.io/hostname, mode: Required}]\n"
            )
        ),
    );
    wait_deployment(&c, &ns.name, "near", "terms and rollout", |d| {
        !list(
            &pod_spec(d),
            &[
                "affinity",
                "podAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution",
            ],
        )
        .is_empty()
            && rolled_out(d)
    })
    .await;
    wait_spread(&c, &ns.name, "app=near", ZONE, &[("zone-b", 2)]).await;
    wait_deployment(&c, &ns.name, "away", "terms and rollout", |d| {
        !anti_required(d).is_empty() && rolled_out(d)
    })
    .await;
    wait_spread(&c, &ns.name, "app=away", HOST, &[("kwok-zone-a-1", 4)]).await;
}

// ---------------------------------------------------------------- user terms survive

fn user_owned_pod_spec() -> Value {
    json!({
        "affinity": {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "type", "operator": "In", "values": ["kwok"]}]}]}},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 7, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": ZONE}}]},
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "noisy"}}, "topologyKey": HOST}],
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 3, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "other"}}, "topologyKey": HOST}}]},
        },
        "topologySpreadConstraints": [
            {"maxSkew": 2, "topologyKey": HOST, "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "web"}}}],
    })
}

/// The user's own parts of a pod spec, as they wrote them.
fn user_parts(d: &Deployment) -> Value {
    let s = pod_spec(d);
    let a = &s["affinity"];
    json!({
        "nodeAffinity": a["nodeAffinity"],
        "podAffinityPreferred": list(a, &["podAffinity", "preferredDuringSchedulingIgnoredDuringExecution"])
            .into_iter().filter(|t| t["weight"] == 7).collect::<Vec<_>>(),
        "antiRequired": list(a, &["podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution"])
            .into_iter().filter(|t| t["topologyKey"] == HOST).collect::<Vec<_>>(),
        "antiPreferred": list(a, &["podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution"])
            .into_iter().filter(|t| t["weight"] == 3).collect::<Vec<_>>(),
        "tsc": list(&s, &["topologySpreadConstraints"]).into_iter().filter(|t| t["topologyKey"] == HOST).collect::<Vec<_>>(),
    })
}

fn expected_user_parts() -> Value {
    let s = user_owned_pod_spec();
    json!({
        "nodeAffinity": s["affinity"]["nodeAffinity"],
        "podAffinityPreferred": s["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
        "antiRequired": s["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
        "antiPreferred": s["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"],
        "tsc": s["topologySpreadConstraints"],
    })
}

fn count_zone_terms(d: &Deployment) -> usize {
    anti_required(d)
        .iter()
        .filter(|t| t["topologyKey"] == ZONE)
        .count()
        + anti_preferred(d)
            .iter()
            .filter(|t| t["podAffinityTerm"]["topologyKey"] == ZONE)
            .count()
}

#[tokio::test]
async fn user_terms_survive_policy_create_update_and_delete_and_ours_appear_once() {
    let Setup { c, ns, op } = setup("spol-user").await;
    create_web(&c, &ns.name, "web", 2, user_owned_pod_spec()).await;
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    let d = wait_deployment(&c, &ns.name, "web", "our term", |d| {
        count_zone_terms(d) == 1
    })
    .await;
    assert_eq!(user_parts(&d), expected_user_parts());
    assert_eq!(
        anti_required(&d).len(),
        2,
        "user's term first, ours appended once"
    );
    assert_eq!(anti_required(&d)[0]["topologyKey"], HOST);
    wait_condition(&c, &ns.name, "web-ha", "Ready", "True", "1 of 1").await;

    // Converged: more reconciles, and an operator restart, write nothing.
    let before = wait_deployment(&c, &ns.name, "web", "rolled out", rolled_out).await;
    c.kubectl_ok(&[
        "annotate",
        "spreadpolicy",
        "web-ha",
        "-n",
        &ns.name,
        "poke=1",
    ]);
    drop(op);
    let _op2 = Operator::start(&c, &ns.name);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let after = get_deployment(&c, &ns.name, "web").await;
    assert_eq!(
        after.metadata.generation, before.metadata.generation,
        "no template write"
    );
    assert_eq!(
        our_writes(&after),
        our_writes(&before),
        "no write at all after a restart"
    );

    // Update: Required -> Preferred, and a host level added.
    c.apply_yaml(
        &ns.name,
        &policy_yaml(
            "web-ha",
            "  selector: {matchLabels: {tier: web}}\n  spread:\n  - {topologyKey: topology.kubernetes.io/zone, mode: Preferred, weight: 80}\n  - {topologyKey: kubernetes.io/hostname, mode: Preferred, method: TopologySpread, maxSkew: 1}\n",
        ),
    );
    let d = wait_deployment(&c, &ns.name, "web", "the preferred term", |d| {
        anti_preferred(d).iter().any(|t| t["weight"] == 80)
    })
    .await;
    assert_eq!(count_zone_terms(&d), 1);
    assert_eq!(
        anti_required(&d).len(),
        1,
        "our required term is gone, the user's stays"
    );
    assert_eq!(user_parts(&d), expected_user_parts());
    let tsc = list(&pod_spec(&d), &["topologySpreadConstraints"]);
    assert!(
        tsc.iter().any(|t| t["topologyKey"] == HOST
            && t["whenUnsatisfiable"] == "ScheduleAnyway"
            && t["maxSkew"] == 2),
        "the user's constraint on the same key and mode is kept, ours skipped: {tsc:?}"
    );
    assert_eq!(tsc.len(), 1);

    // Delete (deletionPolicy Remove): exactly our terms go, before the policy does.
    c.kubectl_ok(&[
        "delete",
        "spreadpolicy",
        "web-ha",
        "-n",
        &ns.name,
        "--wait=true",
        "--timeout=60s",
    ]);
    let d = get_deployment(&c, &ns.name, "web").await;
    assert_eq!(count_zone_terms(&d), 0);
    assert_eq!(user_parts(&d), expected_user_parts());
    assert!(!d.annotations().contains_key("ballast.dev/spread-terms"));
}

#[tokio::test]
async fn the_owner_reapplying_its_manifest_client_side_or_server_side_does_not_loop() {
    let Setup { c, ns, op: _op } = setup("spol-reapply").await;
    // "shared" declares the same atomic list our Preferred term goes into;
    // "plain" declares no pod anti-affinity at all.
    let shared = serde_json::to_string(&deployment(
        "shared",
        2,
        json!({"tier": "web"}),
        user_owned_pod_spec(),
    ))
    .unwrap();
    let plain =
        serde_json::to_string(&deployment("plain", 2, json!({"tier": "web"}), json!({}))).unwrap();
    for m in [&shared, &plain] {
        c.kubectl_stdin(&["apply", "-n", &ns.name, "-f", "-"], Some(m.as_str()));
    }
    c.apply_yaml(
        &ns.name,
        &policy_yaml("web-ha", "  selector: {matchLabels: {tier: web}}\n  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Preferred}]\n"),
    );
    let s0 = wait_deployment(&c, &ns.name, "shared", "our term", |d| {
        count_zone_terms(d) == 1 && rolled_out(d)
    })
    .await;
    let p0 = wait_deployment(&c, &ns.name, "plain", "our term", |d| {
        count_zone_terms(d) == 1 && rolled_out(d)
    })
    .await;

    // Client-side apply of unchanged manifests. For "plain" the three-way
    // merge sees nothing of ours in the owner's fields: no change at all.
    // For "shared" the owner's list replaces the live one (it is atomic),
    // ballast puts its term back once, and then everything is quiet.
    for m in [&shared, &plain] {
        c.kubectl_stdin(&["apply", "-n", &ns.name, "-f", "-"], Some(m.as_str()));
    }
    let s1 = wait_deployment(&c, &ns.name, "shared", "our term back", |d| {
        count_zone_terms(d) == 1 && rolled_out(d)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let p1 = get_deployment(&c, &ns.name, "plain").await;
    assert_eq!(
        p1.metadata.generation, p0.metadata.generation,
        "client-side re-apply leaves plain alone"
    );
    assert_eq!(count_zone_terms(&p1), 1);
    let s1g = get_deployment(&c, &ns.name, "shared")
        .await
        .metadata
        .generation
        .unwrap();
    assert!(
        s1g <= s0.metadata.generation.unwrap() + 2,
        "at most theirs and ours: {s1g}"
    );
    assert_eq!(user_parts(&s1), expected_user_parts());

    // Server-side apply of the same manifest conflicts on the atomic list
    // ballast co-wrote, naming our field manager...
    let out = c.kubectl_stdin(
        &["apply", "--server-side", "-n", &ns.name, "-f", "-"],
        Some(&shared),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("ballast.dev/spread-policy"),
        "{stderr}"
    );
    // ...and with --force-conflicts the owner takes the list back; ballast
    // puts its term back once.
    let out = c.kubectl_stdin(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-n",
            &ns.name,
            "-f",
            "-",
        ],
        Some(&shared),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s2 = wait_deployment(&c, &ns.name, "shared", "our term back", |d| {
        count_zone_terms(d) == 1 && rolled_out(d)
    })
    .await;
    assert_eq!(user_parts(&s2), expected_user_parts());
    let settled = get_deployment(&c, &ns.name, "shared")
        .await
        .metadata
        .generation
        .unwrap();
    // kubectl's server-side apply sends the configuration more than once
    // when it takes over from client-side apply (the apply, the
    // last-applied annotation, a managed-fields migration and the apply
    // again): ballast's put-back can land between them and be taken back
    // once more. So: at most two of theirs and two of ours, then quiet.
    assert!(
        settled <= s1g + 4,
        "at most theirs (twice) and ours (twice): {s1g} -> {settled}"
    );
    // No loop: nothing moves without a new apply.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        get_deployment(&c, &ns.name, "shared")
            .await
            .metadata
            .generation,
        Some(settled)
    );
    assert_eq!(
        get_deployment(&c, &ns.name, "plain")
            .await
            .metadata
            .generation,
        p0.metadata.generation
    );
}

// ---------------------------------------------------------------- changes

#[tokio::test]
async fn a_workload_relabelled_out_of_the_selector_loses_our_terms() {
    let Setup { c, ns, op: _op } = setup("spol-relabel").await;
    create_web(&c, &ns.name, "web", 1, user_owned_pod_spec()).await;
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    wait_deployment(&c, &ns.name, "web", "our term", |d| {
        count_zone_terms(d) == 1
    })
    .await;
    c.kubectl_ok(&[
        "label",
        "deployment",
        "web",
        "-n",
        &ns.name,
        "tier=batch",
        "--overwrite",
    ]);
    let d = wait_deployment(&c, &ns.name, "web", "our term removed", |d| {
        count_zone_terms(d) == 0
    })
    .await;
    assert_eq!(user_parts(&d), expected_user_parts());
    assert!(!d.annotations().contains_key("ballast.dev/spread-policy"));
    // The workload is written before the policy's status, in the same reconcile.
    wait_until("matched 0", Duration::from_secs(20), || async {
        (policy_status(&c, &ns.name, "web-ha")["matched"] == 0).then_some(())
    })
    .await;
}

#[tokio::test]
async fn deletion_policy_orphan_leaves_our_terms_in_place() {
    let Setup { c, ns, op: _op } = setup("spol-orphan").await;
    create_web(&c, &ns.name, "web", 1, json!({})).await;
    c.apply_yaml(
        &ns.name,
        &policy_yaml(
            "web-ha",
            &format!("{ZONE_REQUIRED}  deletionPolicy: Orphan\n"),
        ),
    );
    let d = wait_deployment(&c, &ns.name, "web", "our term", |d| {
        count_zone_terms(d) == 1
    })
    .await;
    c.kubectl_ok(&[
        "delete",
        "spreadpolicy",
        "web-ha",
        "-n",
        &ns.name,
        "--wait=true",
        "--timeout=60s",
    ]);
    let after = get_deployment(&c, &ns.name, "web").await;
    assert_eq!(count_zone_terms(&after), 1);
    assert_eq!(after.metadata.generation, d.metadata.generation);
}

#[tokio::test]
async fn suspend_stops_all_writes_and_keeps_what_is_written() {
    let Setup { c, ns, op: _op } = setup("spol-suspend").await;
    create_web(&c, &ns.name, "web", 1, json!({})).await;
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    let d = wait_deployment(&c, &ns.name, "web", "our term", |d| {
        count_zone_terms(d) == 1 && rolled_out(d)
    })
    .await;
    c.apply_yaml(
        &ns.name,
        &policy_yaml("web-ha", "  selector: {matchLabels: {tier: web}}\n  suspend: true\n  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Preferred}]\n"),
    );
    create_web(&c, &ns.name, "late", 1, json!({})).await;
    wait_condition(&c, &ns.name, "web-ha", "Progressing", "False", "suspend").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = get_deployment(&c, &ns.name, "web").await;
    assert_eq!(
        our_writes(&after),
        our_writes(&d),
        "no write while suspended"
    );
    assert_eq!(
        count_zone_terms(&get_deployment(&c, &ns.name, "late").await),
        0,
        "new workloads are not written either"
    );
    // Unsuspending applies the edited spec.
    c.apply_yaml(
        &ns.name,
        &policy_yaml("web-ha", "  selector: {matchLabels: {tier: web}}\n  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Preferred}]\n"),
    );
    wait_deployment(&c, &ns.name, "late", "our term", |d| {
        count_zone_terms(d) == 1
    })
    .await;
    wait_deployment(&c, &ns.name, "web", "the preferred term", |d| {
        anti_required(d).is_empty() && anti_preferred(d).len() == 1
    })
    .await;
}

#[tokio::test]
async fn stateful_sets_are_spread_without_the_template_hash_key() {
    let Setup { c, ns, op: _op } = setup("spol-sts").await;
    let sts: StatefulSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "db", "labels": {"tier": "web"}},
        "spec": {"replicas": 3, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                 "template": {"metadata": {"labels": {"app": "db"}},
                              "spec": {"containers": [{"name": "db", "image": "registry.example/db:1"}]}}},
    }))
    .unwrap();
    Api::<StatefulSet>::namespaced(c.client.clone(), &ns.name)
        .create(&PostParams::default(), &sts)
        .await
        .unwrap();
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    let api: Api<StatefulSet> = Api::namespaced(c.client.clone(), &ns.name);
    let terms = wait_until("our term on the StatefulSet", WAIT, || async {
        let s = api.get("db").await.ok()?;
        let spec = serde_json::to_value(s.spec?.template.spec?).ok()?;
        let t = list(
            &spec,
            &[
                "affinity",
                "podAntiAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution",
            ],
        );
        (!t.is_empty()).then_some(t)
    })
    .await;
    assert!(terms[0].get("matchLabelKeys").is_none(), "{terms:?}");
    wait_spread(&c, &ns.name, "app=db", ZONE, &ONE_PER_ZONE).await;
}

// ---------------------------------------------------------------- conflicts

#[tokio::test]
async fn the_higher_priority_policy_wins_and_deleting_it_hands_the_workload_over() {
    let Setup { c, ns, op: _op } = setup("spol-conflict").await;
    create_web(&c, &ns.name, "web", 2, json!({})).await;
    c.apply_yaml(
        &ns.name,
        &format!(
            "{}---\n{}",
            policy_yaml("low", "  selector: {matchLabels: {tier: web}}\n  spread: [{topologyKey: kubernetes.io/hostname, mode: Preferred, weight: 11}]\n"),
            policy_yaml("high", "  selector: {matchLabels: {tier: web}}\n  priority: 10\n  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Preferred, weight: 22}]\n"),
        ),
    );
    let d = wait_deployment(&c, &ns.name, "web", "the winner's term", |d| {
        anti_preferred(d).iter().any(|t| t["weight"] == 22)
    })
    .await;
    assert_eq!(anti_preferred(&d).len(), 1, "only the winner's terms");
    let cond = wait_condition(&c, &ns.name, "low", "Conflicted", "True", "Deployment/web").await;
    assert!(
        cond["message"]
            .as_str()
            .unwrap()
            .contains("SpreadPolicy high"),
        "{cond}"
    );
    wait_condition(&c, &ns.name, "high", "Conflicted", "False", "").await;

    c.kubectl_ok(&[
        "delete",
        "spreadpolicy",
        "high",
        "-n",
        &ns.name,
        "--wait=true",
        "--timeout=60s",
    ]);
    let d = wait_deployment(&c, &ns.name, "web", "the other policy's term", |d| {
        anti_preferred(d).iter().any(|t| t["weight"] == 11)
    })
    .await;
    assert_eq!(anti_preferred(&d).len(), 1, "the old winner's term is gone");
    assert_eq!(
        d.annotations()
            .get("ballast.dev/spread-policy")
            .map(String::as_str),
        Some("low")
    );
    wait_condition(&c, &ns.name, "low", "Conflicted", "False", "").await;
}

// ---------------------------------------------------------------- feasibility

/// Extra kwok nodes for one test, tainted so that only that test's pods
/// (which tolerate the taint) can land on them; deleted on drop.
struct ExtraNodes {
    names: Vec<String>,
    kubectl: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
}

impl ExtraNodes {
    fn add(c: &Cluster, taint: &str, nodes: &[(&str, Option<&str>)]) -> Self {
        let mut yaml = String::new();
        for (name, zone) in nodes {
            let zone_label = zone
                .map(|z| format!("    {ZONE}: {z}\n"))
                .unwrap_or_default();
            yaml.push_str(&format!(
                "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\n  annotations: {{kwok.x-k8s.io/node: fake}}\n  labels:\n    type: kwok\n    {HOST}: {name}\n{zone_label}spec:\n  taints: [{{key: {taint}, effect: NoSchedule}}]\nstatus:\n  allocatable: {{cpu: '32', memory: 256Gi, pods: '110'}}\n  capacity: {{cpu: '32', memory: 256Gi, pods: '110'}}\n"
            ));
        }
        let out = c.kubectl_stdin(&["apply", "-f", "-"], Some(&yaml));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        ExtraNodes {
            names: nodes.iter().map(|(n, _)| n.to_string()).collect(),
            kubectl: c.kubectl.clone(),
            kubeconfig: c.kubeconfig.clone(),
        }
    }
}

impl Drop for ExtraNodes {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = std::process::Command::new(&self.kubectl)
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["delete", "node", n, "--wait=false", "--ignore-not-found"])
                .output();
        }
    }
}

#[tokio::test]
async fn infeasible_required_spread_says_how_many_pods_stay_pending_and_follows_scale_and_nodes() {
    let Setup { c, ns, op: _op } = setup("spol-feasible").await;
    let taint = format!("ballast.dev/test-{}", ns.name);
    let tolerate = json!({"tolerations": [{"key": taint, "operator": "Exists"}]});
    create_web(&c, &ns.name, "web", 5, tolerate).await;
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    let cond = wait_condition(
        &c,
        &ns.name,
        "web-ha",
        "Infeasible",
        "True",
        "2 pods will stay Pending",
    )
    .await;
    assert_eq!(
        cond["message"].as_str().unwrap(),
        "web: 5 replicas, 3 domains of topology.kubernetes.io/zone: 2 pods will stay Pending"
    );
    assert_eq!(cond["reason"], "InsufficientDomains");
    // The scheduler agrees: the new revision's pods beyond one per zone
    // stay Pending (the old revision keeps serving meanwhile).
    wait_until("a Pending pod of the new revision", WAIT, || async {
        let pods: Api<Pod> = Api::namespaced(c.client.clone(), &ns.name);
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .ok()?;
        list.items.into_iter().find(|p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
                && p.spec.as_ref().and_then(|s| s.affinity.as_ref()).is_some()
        })
    })
    .await;
    // A Warning Event carried it.
    let events: Api<Event> = Api::namespaced(c.client.clone(), &ns.name);
    wait_until("an Infeasible Warning event", WAIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("Infeasible") && e.type_.as_deref() == Some("Warning")
        })
    })
    .await;

    // Scaling updates it.
    c.kubectl_ok(&["scale", "deployment", "web", "-n", &ns.name, "--replicas=4"]);
    wait_condition(
        &c,
        &ns.name,
        "web-ha",
        "Infeasible",
        "True",
        "web: 4 replicas, 3 domains of topology.kubernetes.io/zone: 1 pod will stay Pending",
    )
    .await;
    // So does a node in a new zone (tainted: only this test's pods use it).
    let suffix = ns.name.rsplit('-').next().unwrap().to_string();
    let _nodes = ExtraNodes::add(
        &c,
        &taint,
        &[(&format!("kwok-zone-d-{suffix}"), Some("zone-d"))],
    );
    let cond = wait_condition(&c, &ns.name, "web-ha", "Infeasible", "False", "").await;
    assert_eq!(cond["reason"], "Feasible");
    wait_deployment(&c, &ns.name, "web", "all 4 replicas available", rolled_out).await;
    // A node without the zone label makes required anti-affinity meaningless
    // there: warned about, not counted as a domain.
    let _bare = ExtraNodes::add(&c, &taint, &[(&format!("kwok-bare-{suffix}"), None)]);
    let cond = wait_condition(
        &c,
        &ns.name,
        "web-ha",
        "Infeasible",
        "False",
        "lack the label topology.kubernetes.io/zone",
    )
    .await;
    assert_eq!(cond["reason"], "NodesMissingTopologyLabel");
}

// ---------------------------------------------------------------- pacing

#[tokio::test]
async fn max_concurrent_paces_template_changes_across_many_workloads() {
    let Setup { c, ns, op: _op } = setup("spol-pace").await;
    let names: Vec<String> = (0..10).map(|i| format!("web-{i}")).collect();
    for n in &names {
        let mut d = deployment(n, 2, json!({"tier": "web"}), json!({}));
        // Each rollout takes a few seconds, so overlap would be visible.
        d.spec.as_mut().unwrap().min_ready_seconds = Some(2);
        create_deployment(&c, &ns.name, d).await;
    }
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), &ns.name);
    wait_until("all 10 Deployments available", WAIT, || async {
        let l = api
            .list(&ListParams::default().labels("tier=web"))
            .await
            .ok()?;
        (l.items.len() == 10 && l.items.iter().all(rolled_out)).then_some(())
    })
    .await;
    c.apply_yaml(
        &ns.name,
        &policy_yaml("paced", "  selector: {matchLabels: {tier: web}}\n  rollout: {maxConcurrent: 2}\n  spread: [{topologyKey: kubernetes.io/hostname, mode: Preferred}]\n"),
    );
    let mut max_seen = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(150);
    loop {
        let l = api
            .list(&ListParams::default().labels("tier=web"))
            .await
            .unwrap();
        // Rolling because of the policy: a template change (generation > 1)
        // whose rollout has not completed.
        let rolling = l
            .items
            .iter()
            .filter(|d| d.metadata.generation.unwrap_or(1) > 1 && !rolled_out(d))
            .count();
        max_seen = max_seen.max(rolling);
        assert!(rolling <= 2, "{rolling} Deployments rolling at once");
        let done = l
            .items
            .iter()
            .filter(|d| count_zone_terms(d) == 0 && anti_preferred(d).len() == 1 && rolled_out(d))
            .count();
        if done == 10 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {done} of 10 converged"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(max_seen >= 1, "the rollouts were observed");
    wait_condition(&c, &ns.name, "paced", "Ready", "True", "10 of 10").await;
}

// ---------------------------------------------------------------- bad input and confinement

#[tokio::test]
async fn a_spec_the_api_server_accepts_but_cannot_apply_is_reported_and_touches_nothing() {
    let Setup { c, ns, op: _op } = setup("spol-bad").await;
    let d0 = create_web(&c, &ns.name, "web", 1, json!({})).await;
    // A label key no pod template may carry passes the CRD schema (map keys
    // are not checked there) but the Deployment update is refused.
    c.apply_yaml(
        &ns.name,
        &policy_yaml(
            "bad",
            "  selector: {matchLabels: {tier: web}}\n  separate: [{labelSelector: {matchLabels: {'-not/a/key-': x}}, topologyKey: kubernetes.io/hostname, mode: Preferred}]\n",
        ),
    );
    let cond = wait_condition(&c, &ns.name, "bad", "Ready", "False", "Deployment/web").await;
    assert_eq!(cond["reason"], "WriteFailed");
    let s = policy_status(&c, &ns.name, "bad");
    assert_eq!(s["workloads"][0]["state"], "Error", "{s}");
    let events: Api<Event> = Api::namespaced(c.client.clone(), &ns.name);
    wait_until("a WriteFailed Warning event", WAIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("WriteFailed") && e.type_.as_deref() == Some("Warning")
        })
    })
    .await;
    let d = get_deployment(&c, &ns.name, "web").await;
    assert_eq!(
        d.metadata.generation, d0.metadata.generation,
        "the workload is untouched"
    );
}

#[tokio::test]
async fn nothing_outside_the_policys_namespace_is_selected_or_written() {
    let Setup { c, ns, op: _op } = setup("spol-confined").await;
    let other = TestNamespace::new(&c, "spol-elsewhere").await;
    create_deployment(
        &c,
        &other.name,
        deployment("web", 1, json!({"tier": "web"}), json!({})),
    )
    .await;
    let outsider = wait_deployment(
        &c,
        &other.name,
        "web",
        "the outsider rolled out",
        rolled_out,
    )
    .await;
    create_web(&c, &ns.name, "web", 1, json!({})).await;
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    wait_deployment(&c, &ns.name, "web", "our term", |d| {
        count_zone_terms(d) == 1
    })
    .await;
    wait_condition(&c, &ns.name, "web-ha", "Ready", "True", "1 of 1").await;
    let after = get_deployment(&c, &other.name, "web").await;
    assert_eq!(
        our_writes(&after),
        (outsider.metadata.generation, vec![]),
        "never written"
    );
    assert_eq!(policy_status(&c, &ns.name, "web-ha")["matched"], 1);
}

// ---------------------------------------------------------------- status and UX

#[tokio::test]
async fn events_mark_transitions_only_and_metrics_count_writes() {
    let Setup { c, ns, op } = setup("spol-events").await;
    create_web(&c, &ns.name, "web", 1, json!({})).await;
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    wait_condition(&c, &ns.name, "web-ha", "Ready", "True", "1 of 1").await;
    wait_deployment(&c, &ns.name, "web", "rolled out", rolled_out).await;
    wait_condition(&c, &ns.name, "web-ha", "Progressing", "False", "converged").await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), &ns.name);
    let ours = || async {
        let l = events.list(&ListParams::default()).await.unwrap();
        l.items
            .into_iter()
            .filter(|e| e.involved_object.kind.as_deref() == Some("SpreadPolicy"))
            .map(|e| (e.reason.unwrap_or_default(), e.count.unwrap_or(1)))
            .collect::<Vec<_>>()
    };
    let before = ours().await;
    assert!(
        before.iter().any(|(r, _)| r == "TermsApplied"),
        "{before:?}"
    );
    assert!(before.iter().any(|(r, _)| r == "Ready"), "{before:?}");
    // Reconciles that change nothing publish nothing.
    for i in 0..3 {
        c.kubectl_ok(&[
            "annotate",
            "spreadpolicy",
            "web-ha",
            "-n",
            &ns.name,
            &format!("poke={i}"),
            "--overwrite",
        ]);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(ours().await, before);
    let (_, metrics) = op.http_get("/metrics").await.unwrap();
    assert!(
        metrics.contains("ballast_workload_writes_total{controller=\"spread-policy\",kind=\"Deployment\",outcome=\"applied\"} 1"),
        "{metrics}"
    );
    // kubectl get shows the counts.
    let table = c.kubectl_ok(&["get", "spol", "-n", &ns.name]);
    let row: Vec<&str> = table.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(&row[..4], ["web-ha", "1", "1", "True"], "{table}");
}

// ---------------------------------------------------------------- hardening (issue 8)

/// The parts of a pod spec that policies and users write affinity into, as stored.
fn affinity_parts(d: &Deployment) -> Value {
    let s = pod_spec(d);
    json!({"affinity": s.get("affinity"), "topologySpreadConstraints": s.get("topologySpreadConstraints")})
}

/// The record of ballast's terms in the pod template, if any.
fn template_record(d: &Deployment) -> Option<String> {
    d.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get("ballast.dev/spread-terms")
        .cloned()
}

/// No trace of ballast on the workload: no owner, no record anywhere.
fn assert_no_ballast_annotations(d: &Deployment) {
    assert!(
        !d.annotations().contains_key("ballast.dev/spread-policy")
            && !d.annotations().contains_key("ballast.dev/spread-terms")
            && template_record(d).is_none(),
        "{:?} / {:?}",
        d.annotations(),
        template_record(d)
    );
}

/// Deletes a policy and waits (at most `within`) until it is gone.
async fn delete_policy_within(c: &Cluster, ns: &str, name: &str, within: Duration) {
    c.kubectl_ok(&["delete", "spreadpolicy", name, "-n", ns, "--wait=false"]);
    let what = format!("SpreadPolicy {name} gone");
    wait_until(&what, within, || async {
        let out = c.kubectl(&["get", "spreadpolicy", name, "-n", ns, "-o", "name"]);
        (!out.status.success()).then_some(())
    })
    .await;
}

async fn pending_pods(c: &Cluster, ns: &str, selector: &str) -> usize {
    Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending"))
        .count()
}

/// Issue 8, defect 3 of the list: required zone anti-affinity on a 3-replica
/// Deployment scaled to 5 (2 Pending, Infeasible); deleting the policy stayed
/// "Removing" forever, because the unavailable pods made the workload look
/// like a rollout in flight that held up the removal.
#[tokio::test]
async fn deleting_a_policy_finishes_while_a_governed_workload_is_infeasible() {
    let Setup { c, ns, op } = setup("spol-del-infeasible").await;
    let before = create_web(&c, &ns.name, "web", 3, user_owned_pod_spec()).await;
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    wait_deployment(&c, &ns.name, "web", "our term, rolled out", |d| {
        count_zone_terms(d) == 1 && rolled_out(d)
    })
    .await;
    c.kubectl_ok(&["scale", "deployment", "web", "-n", &ns.name, "--replicas=5"]);
    wait_condition(
        &c,
        &ns.name,
        "web-ha",
        "Infeasible",
        "True",
        "2 pods will stay Pending",
    )
    .await;
    // The cluster agrees: two pods the scheduler cannot place.
    wait_until("2 Pending pods", WAIT, || async {
        (pending_pods(&c, &ns.name, "app=web").await == 2).then_some(())
    })
    .await;

    let start = std::time::Instant::now();
    delete_policy_within(&c, &ns.name, "web-ha", Duration::from_secs(60)).await;
    eprintln!("deleted in {:?}", start.elapsed());
    let d = get_deployment(&c, &ns.name, "web").await;
    assert_eq!(count_zone_terms(&d), 0, "{}", op.logs());
    assert_eq!(
        affinity_parts(&d),
        affinity_parts(&before),
        "user terms byte-identical"
    );
    assert_no_ballast_annotations(&d);
}

#[tokio::test]
async fn deleting_a_suspended_policy_takes_its_terms_out() {
    let Setup { c, ns, op: _op } = setup("spol-del-suspended").await;
    let before = create_web(&c, &ns.name, "web", 2, user_owned_pod_spec()).await;
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    wait_deployment(&c, &ns.name, "web", "our term, rolled out", |d| {
        count_zone_terms(d) == 1 && rolled_out(d)
    })
    .await;
    c.apply_yaml(
        &ns.name,
        &policy_yaml("web-ha", &format!("{ZONE_REQUIRED}  suspend: true\n")),
    );
    wait_condition(&c, &ns.name, "web-ha", "Progressing", "False", "suspend").await;
    delete_policy_within(&c, &ns.name, "web-ha", Duration::from_secs(60)).await;
    let d = get_deployment(&c, &ns.name, "web").await;
    assert_eq!(count_zone_terms(&d), 0);
    assert_eq!(affinity_parts(&d), affinity_parts(&before));
    assert_no_ballast_annotations(&d);
}

/// Deployments that a RolloutStrategy holds paused while its hooks run are
/// rolling out: they count against `maxConcurrent` (they did not, so a policy
/// over governed Deployments changed all of them at once).
#[tokio::test]
async fn pacing_counts_paused_deployments_as_rolling_out() {
    let Setup { c, ns, op: _op } = setup("spol-pace-paused").await;
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), &ns.name);
    for i in 0..3 {
        create_web(&c, &ns.name, &format!("p-{i}"), 1, json!({})).await;
    }
    for i in 0..3 {
        wait_deployment(&c, &ns.name, &format!("p-{i}"), "rolled out", rolled_out).await;
        c.kubectl_ok(&[
            "rollout",
            "pause",
            &format!("deployment/p-{i}"),
            "-n",
            &ns.name,
        ]);
    }
    let gen0: Vec<Option<i64>> = {
        let mut g = vec![];
        for i in 0..3 {
            g.push(
                get_deployment(&c, &ns.name, &format!("p-{i}"))
                    .await
                    .metadata
                    .generation,
            );
        }
        g
    };
    c.apply_yaml(
        &ns.name,
        &policy_yaml("paced", "  selector: {matchLabels: {tier: web}}\n  rollout: {maxConcurrent: 1}\n  spread: [{topologyKey: kubernetes.io/hostname, mode: Preferred}]\n"),
    );
    wait_deployment(&c, &ns.name, "p-0", "the first write", |d| {
        anti_preferred(d).len() == 1
    })
    .await;
    // p-0 is paused with a template it has not rolled out: in flight.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (i, generation) in gen0.iter().enumerate().skip(1) {
        let d = get_deployment(&c, &ns.name, &format!("p-{i}")).await;
        assert_eq!(
            &d.metadata.generation, generation,
            "p-{i} written while p-0 was still paused"
        );
    }
    let s = policy_status(&c, &ns.name, "paced");
    assert!(
        s["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["state"] == "WaitingForRollout"),
        "{s}"
    );
    // Resuming each (as a RolloutStrategy does after its pre hooks) lets the next go.
    for i in 0..3 {
        let name = format!("p-{i}");
        wait_deployment(&c, &ns.name, &name, "its write", |d| {
            anti_preferred(d).len() == 1
        })
        .await;
        c.kubectl_ok(&[
            "rollout",
            "resume",
            &format!("deployment/{name}"),
            "-n",
            &ns.name,
        ]);
        wait_deployment(&c, &ns.name, &name, "rolled out", rolled_out).await;
    }
    let l = api.list(&ListParams::default()).await.unwrap();
    assert!(l.items.iter().all(|d| anti_preferred(d).len() == 1));
}

/// A workload that completed its rollout and then lost availability (scaled
/// past what a Required spread allows) is not a rollout in flight: it used to
/// hold up every further write of its policy forever.
#[tokio::test]
async fn a_workload_that_lost_availability_after_its_rollout_does_not_hold_up_pacing() {
    let Setup { c, ns, op } = setup("spol-pace-unhealthy").await;
    for (name, replicas) in [("a", 2), ("b", 2), ("z", 3)] {
        create_web(&c, &ns.name, name, replicas, json!({})).await;
    }
    c.apply_yaml(
        &ns.name,
        &policy_yaml(
            "web-ha",
            &format!("{ZONE_REQUIRED}  rollout: {{maxConcurrent: 1}}\n"),
        ),
    );
    for name in ["a", "b", "z"] {
        wait_deployment(&c, &ns.name, name, "our term, rolled out", |d| {
            count_zone_terms(d) == 1 && rolled_out(d)
        })
        .await;
    }
    c.kubectl_ok(&["scale", "deployment", "z", "-n", &ns.name, "--replicas=5"]);
    wait_condition(
        &c,
        &ns.name,
        "web-ha",
        "Infeasible",
        "True",
        "z: 5 replicas",
    )
    .await;
    wait_until("2 Pending pods of z", WAIT, || async {
        (pending_pods(&c, &ns.name, "app=z").await == 2).then_some(())
    })
    .await;
    // A policy change: every workload needs one more term.
    c.apply_yaml(
        &ns.name,
        &policy_yaml(
            "web-ha",
            "  selector: {matchLabels: {tier: web}}\n  rollout: {maxConcurrent: 1}\n  spread:\n  - {topologyKey: topology.kubernetes.io/zone, mode: Required}\n  - {topologyKey: kubernetes.io/hostname, mode: Preferred}\n",
        ),
    );
    for name in ["a", "b"] {
        let api: Api<Deployment> = Api::namespaced(c.client.clone(), &ns.name);
        let got = tokio::time::timeout(WAIT, async {
            loop {
                let d = api.get(name).await.unwrap();
                if anti_preferred(&d).len() == 1 && rolled_out(&d) {
                    return d;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
        .await;
        assert!(
            got.is_ok(),
            "{name} never got the new term; status: {}\n{}",
            policy_status(&c, &ns.name, "web-ha"),
            op.logs()
        );
    }
    wait_deployment(&c, &ns.name, "z", "the new term on z too", |d| {
        anti_preferred(d).len() == 1
    })
    .await;
}

/// The record of our terms lives in the pod template, so a template put back
/// by `kubectl rollout undo`, or by a rollback that writes only the template
/// (as a RolloutStrategy does), brings its own record: the policy's current
/// terms replace exactly the old ones, and deleting the policy leaves the
/// user's terms byte-identical to before it. With the record on the
/// Deployment's metadata, a template-only rollback left the old term in
/// place as if it were the user's, next to the new one, for good.
#[tokio::test]
async fn a_template_put_back_by_undo_or_a_rollback_brings_its_own_record() {
    let Setup { c, ns, op } = setup("spol-undo").await;
    let before = create_web(&c, &ns.name, "web", 2, user_owned_pod_spec()).await;
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    wait_deployment(&c, &ns.name, "web", "v1 rolled out", |d| {
        count_zone_terms(d) == 1 && anti_required(d).len() == 2 && rolled_out(d)
    })
    .await;
    let v2 = "  selector: {matchLabels: {tier: web}}\n  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Preferred, weight: 80}]\n";
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", v2));
    let is_v2 = |d: &Deployment| {
        count_zone_terms(d) == 1
            && anti_preferred(d).iter().any(|t| t["weight"] == 80)
            && anti_required(d).len() == 1
            && user_parts(d) == expected_user_parts()
    };
    wait_deployment(&c, &ns.name, "web", "v2 rolled out", |d| {
        is_v2(d) && rolled_out(d)
    })
    .await;

    // kubectl rollout undo: back to the v1 template; the policy brings v2
    // back (one change each; the v1 state may last only a moment).
    let g = get_deployment(&c, &ns.name, "web")
        .await
        .metadata
        .generation;
    c.kubectl_ok(&["rollout", "undo", "deployment/web", "-n", &ns.name]);
    wait_deployment(&c, &ns.name, "web", "v2 again after the undo", |d| {
        d.metadata.generation >= g.map(|g| g + 2) && is_v2(d) && rolled_out(d)
    })
    .await;

    // A rollback that writes the template only (a RolloutStrategy's): the
    // ReplicaSet of the v1 revision has that template, record included.
    let rss = Api::<k8s_openapi::api::apps::v1::ReplicaSet>::namespaced(c.client.clone(), &ns.name)
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items;
    let v1 = rss
        .iter()
        .find(|rs| {
            let spec = serde_json::to_value(&rs.spec.as_ref().unwrap().template).unwrap();
            list(
                &spec,
                &[
                    "spec",
                    "affinity",
                    "podAntiAffinity",
                    "requiredDuringSchedulingIgnoredDuringExecution",
                ],
            )
            .len()
                == 2
        })
        .expect("the v1 ReplicaSet");
    let mut template = serde_json::to_value(&v1.spec.as_ref().unwrap().template).unwrap();
    template["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("pod-template-hash");
    let d = get_deployment(&c, &ns.name, "web").await;
    let g = d.metadata.generation;
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": d.resource_version()},
        {"op": "replace", "path": "/spec/template", "value": template},
    ]))
    .unwrap();
    Api::<Deployment>::namespaced(c.client.clone(), &ns.name)
        .patch("web", &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .unwrap();
    let d = wait_deployment(&c, &ns.name, "web", "v2 again after the rollback", |d| {
        d.metadata.generation >= g.map(|g| g + 2) && is_v2(d) && rolled_out(d)
    })
    .await;
    assert_eq!(
        count_zone_terms(&d),
        1,
        "the old term is gone, not taken for the user's: {}",
        op.logs()
    );
    // The record says exactly what is ours.
    let record: Value = serde_json::from_str(&template_record(&d).unwrap()).unwrap();
    assert_eq!(record["antiAffinityPreferred"][0]["weight"], 80);
    assert!(record.get("antiAffinityRequired").is_none(), "{record}");

    delete_policy_within(&c, &ns.name, "web-ha", Duration::from_secs(60)).await;
    let d = get_deployment(&c, &ns.name, "web").await;
    assert_eq!(
        affinity_parts(&d),
        affinity_parts(&before),
        "user terms byte-identical"
    );
    assert_no_ballast_annotations(&d);
}

// ---------------------------------------------------------------- a stored object nobody can read

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

fn b64_encode(data: &[u8]) -> String {
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(B64[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn b64_decode(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = B64.iter().position(|x| *x == c).expect("base64") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

/// One call of etcd's JSON gateway on the local control plane (127.0.0.1).
async fn etcd(path: &str, body: Value) -> Value {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let port: u16 = std::env::var("BALLAST_ETCD_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(12379);
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("the local etcd");
    let body = body.to_string();
    s.write_all(
        format!(
            "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let (_, json) = buf.split_once("\r\n\r\n").expect("an HTTP response");
    serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {buf}"))
}

/// Rewrites a stored object behind the API server's back, the way an object
/// stored under an older CRD (before a bound existed) looks to the controller
/// today: the API server serves it as stored, without validating it again.
async fn rewrite_stored(key: &str, f: impl FnOnce(&mut Value)) {
    let k = b64_encode(key.as_bytes());
    let got = etcd("/v3/kv/range", json!({"key": k})).await;
    let stored = got["kvs"][0]["value"].as_str().expect("the stored object");
    let mut obj: Value = serde_json::from_slice(&b64_decode(stored)).unwrap();
    f(&mut obj);
    let value = b64_encode(obj.to_string().as_bytes());
    etcd("/v3/kv/put", json!({"key": k, "value": value})).await;
}

/// Issue 8, general rule: a stored policy the controller cannot decode (here
/// `maxSkew: 2147483648`, which a CRD without the bound let in) failed every
/// list of the typed watch, so after a restart no policy in scope was
/// reconciled at all. Now it is reported on itself and everything else goes
/// on; its deletion still takes its terms out.
#[tokio::test]
async fn a_policy_the_controller_cannot_read_is_reported_and_stops_nothing_else() {
    let Setup { c, ns, mut op } = setup("spol-poison").await;
    let legacy = create_deployment(
        &c,
        &ns.name,
        deployment("legacy", 1, json!({"tier": "old"}), json!({})),
    )
    .await;
    create_web(&c, &ns.name, "web", 2, json!({})).await;
    c.apply_yaml(
        &ns.name,
        &policy_yaml(
            "old",
            "  selector: {matchLabels: {tier: old}}\n  spread: [{topologyKey: topology.kubernetes.io/zone, mode: Required, method: TopologySpread, maxSkew: 1}]\n",
        ),
    );
    wait_deployment(&c, &ns.name, "legacy", "the old policy's constraint", |d| {
        !list(&pod_spec(d), &["topologySpreadConstraints"]).is_empty()
    })
    .await;
    op.kill();
    rewrite_stored(
        &format!("/registry/ballast.dev/spreadpolicies/{}/old", ns.name),
        |o| o["spec"]["spread"][0]["maxSkew"] = json!(2147483648u64),
    )
    .await;
    // A new operator lists the unreadable policy first thing.
    op = Operator::start_with(&c, &ns.name, &format!("ballast-{}-2", ns.name), &[]);
    c.apply_yaml(&ns.name, &policy_yaml("web-ha", ZONE_REQUIRED));
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), &ns.name);
    let applied = tokio::time::timeout(WAIT, async {
        loop {
            if count_zone_terms(&api.get("web").await.unwrap()) == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    })
    .await;
    assert!(
        applied.is_ok(),
        "the readable policy was never applied:\n{}",
        op.logs()
    );
    let ready = wait_condition(&c, &ns.name, "old", "Ready", "False", "cannot read").await;
    assert_eq!(ready["reason"], "InvalidSpec");
    assert!(
        ready["message"].as_str().unwrap().contains("2147483648"),
        "{ready}"
    );
    wait_condition(&c, &ns.name, "old", "Stalled", "True", "cannot read").await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), &ns.name);
    wait_until("an InvalidSpec Warning event", WAIT, || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("InvalidSpec") && e.type_.as_deref() == Some("Warning")
        })
    })
    .await;
    // Its deletion finishes, and takes its terms out.
    delete_policy_within(&c, &ns.name, "old", Duration::from_secs(60)).await;
    let d = get_deployment(&c, &ns.name, "legacy").await;
    assert_eq!(affinity_parts(&d), affinity_parts(&legacy));
    assert_no_ballast_annotations(&d);
}

/// A workload deleted, or deleted and created again under the same name,
/// while its rollout of our write was under way: the new one is a new
/// workload (it gets the terms and is never taken for the old one's pending
/// write), and the deletion of the policy is held up by neither.
#[tokio::test]
async fn a_workload_deleted_or_replaced_mid_rollout_holds_up_nothing() {
    let Setup { c, ns, op } = setup("spol-replaced").await;
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), &ns.name);
    for name in ["web-0", "web-1", "web-2"] {
        let mut d = deployment(name, 2, json!({"tier": "web"}), json!({}));
        d.spec.as_mut().unwrap().min_ready_seconds = Some(5);
        create_deployment(&c, &ns.name, d).await;
    }
    for name in ["web-0", "web-1", "web-2"] {
        wait_deployment(&c, &ns.name, name, "rolled out", rolled_out).await;
    }
    c.apply_yaml(
        &ns.name,
        &policy_yaml("paced", "  selector: {matchLabels: {tier: web}}\n  rollout: {maxConcurrent: 1}\n  spread: [{topologyKey: kubernetes.io/hostname, mode: Preferred}]\n"),
    );
    // web-0 is written first and is rolling out (minReadySeconds 5).
    wait_deployment(&c, &ns.name, "web-0", "the first write", |d| {
        anti_preferred(d).len() == 1
    })
    .await;
    c.kubectl_ok(&[
        "delete",
        "deployment",
        "web-0",
        "-n",
        &ns.name,
        "--wait=true",
    ]);
    let mut d = deployment("web-0", 2, json!({"tier": "web"}), json!({}));
    d.spec.as_mut().unwrap().min_ready_seconds = Some(5);
    create_deployment(&c, &ns.name, d).await;
    for name in ["web-0", "web-1", "web-2"] {
        let got = tokio::time::timeout(WAIT, async {
            loop {
                let d = api.get(name).await.unwrap();
                if anti_preferred(&d).len() == 1 && rolled_out(&d) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        })
        .await;
        assert!(
            got.is_ok(),
            "{name} never converged; status: {}\n{}",
            policy_status(&c, &ns.name, "paced"),
            op.logs()
        );
    }
    // One deleted outright while the policy goes away.
    c.kubectl_ok(&[
        "delete",
        "deployment",
        "web-2",
        "-n",
        &ns.name,
        "--wait=false",
    ]);
    delete_policy_within(&c, &ns.name, "paced", Duration::from_secs(60)).await;
    for name in ["web-0", "web-1"] {
        let d = get_deployment(&c, &ns.name, name).await;
        assert!(anti_preferred(&d).is_empty());
        assert_no_ballast_annotations(&d);
    }
}
