//! Fault scenarios of the SpreadPolicy controller (issue 8): F13 and F14.
//!
//! Both run the real operator (under its ServiceAccount) against the local
//! control plane and judge by the cluster's truth — Deployment generations,
//! ReplicaSets, where pods run, what the templates say — not only by the
//! policy's status. Each writes its row of the fault table
//! (`target/fault-results/F13.tsv`, `F14.tsv`) before it asserts.

mod support;

use ballast::api::RolloutPhase;
use k8s_openapi::api::{
    apps::v1::{Deployment, ReplicaSet},
    core::v1::Pod,
};
use kube::{
    Api, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};
use support::faults::{Row, record};
use support::rollout::{Env, adopt, job_hook};
use support::wait_until;

const ZONE: &str = "topology.kubernetes.io/zone";
const HOST: &str = "kubernetes.io/hostname";
const WAIT: Duration = Duration::from_secs(120);

/// Writes a failing row if the scenario panics before it recorded one.
struct RowGuard {
    id: &'static str,
    fault: &'static str,
    done: bool,
}

impl RowGuard {
    fn new(id: &'static str, fault: &'static str) -> Self {
        Self {
            id,
            fault,
            done: false,
        }
    }

    /// Records the outcome; the caller asserts afterwards.
    fn finish(&mut self, failures: &[String], checked: &str) {
        self.done = true;
        record(&Row {
            id: self.id,
            fault: self.fault,
            runs: 1,
            passed: u32::from(failures.is_empty()),
            checked,
        });
    }
}

impl Drop for RowGuard {
    fn drop(&mut self) {
        if !self.done {
            record(&Row {
                id: self.id,
                fault: self.fault,
                runs: 1,
                passed: 0,
                checked: "the scenario stopped before its checks (see the test output)",
            });
        }
    }
}

fn deployment(
    name: &str,
    replicas: i32,
    labels: Value,
    spec_extra: Value,
    pod: Value,
) -> Deployment {
    let mut pod_spec = json!({"containers": [{"name": "app", "image": "registry.example/app:1"}]});
    for (k, v) in pod.as_object().unwrap() {
        pod_spec[k] = v.clone();
    }
    let mut spec = json!({
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec},
    });
    for (k, v) in spec_extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": labels}, "spec": spec,
    }))
    .unwrap()
}

fn policy_yaml(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: SpreadPolicy\nmetadata: {{name: {name}}}\nspec:\n{spec}"
    )
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

const LISTS: [[&str; 3]; 4] = [
    [
        "affinity",
        "podAntiAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
    ],
    [
        "affinity",
        "podAntiAffinity",
        "preferredDuringSchedulingIgnoredDuringExecution",
    ],
    [
        "affinity",
        "podAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
    ],
    [
        "affinity",
        "podAffinity",
        "preferredDuringSchedulingIgnoredDuringExecution",
    ],
];

fn anti_preferred(d: &Deployment) -> Vec<Value> {
    list(&pod_spec(d), &LISTS[1])
}

fn anti_required(d: &Deployment) -> Vec<Value> {
    list(&pod_spec(d), &LISTS[0])
}

/// Terms that appear more than once in one affinity list of `d`'s template.
fn duplicates(d: &Deployment) -> Vec<Value> {
    let s = pod_spec(d);
    let mut out = vec![];
    for path in LISTS {
        let l = list(&s, &path);
        for (i, t) in l.iter().enumerate() {
            if l[..i].contains(t) {
                out.push(t.clone());
            }
        }
    }
    out
}

/// How many pod anti-affinity terms on topology key `key` `d`'s template
/// carries (the user's own anti-affinity here is on hosts only).
fn terms_on(d: &Deployment, key: &str) -> usize {
    let s = pod_spec(d);
    LISTS[..2]
        .iter()
        .flat_map(|p| list(&s, p))
        .filter(|t| t["topologyKey"] == key || t["podAffinityTerm"]["topologyKey"] == key)
        .count()
}

/// The affinity and topology spread constraints of `d`'s template, as stored.
fn affinity_parts(d: &Deployment) -> Value {
    let s = pod_spec(d);
    json!({"affinity": s.get("affinity"), "topologySpreadConstraints": s.get("topologySpreadConstraints")})
}

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

fn has_ballast_annotations(d: &Deployment) -> bool {
    d.annotations().contains_key("ballast.dev/spread-policy")
        || d.annotations().contains_key("ballast.dev/spread-terms")
        || template_record(d).is_some()
}

fn condition<'a>(
    d: &'a Deployment,
    type_: &str,
) -> Option<&'a k8s_openapi::api::apps::v1::DeploymentCondition> {
    d.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// Every replica runs the current template and is available.
fn rolled_out(d: &Deployment) -> bool {
    let want = d.spec.as_ref().unwrap().replicas.unwrap_or(1);
    let Some(s) = &d.status else { return false };
    s.observed_generation >= d.metadata.generation
        && s.updated_replicas == Some(want)
        && s.replicas == Some(want)
        && s.available_replicas == Some(want)
}

/// Whether `d`'s rollout is under way as the cluster tells it: the current
/// generation not observed, or replicas of an older template left (paused
/// or not), or the newest still becoming available. Not under way: complete
/// (also when pods became unavailable after completing), past its progress
/// deadline, or without progress for longer than that deadline (plus the
/// operator's 5 s grace).
fn rolling(d: &Deployment, now: jiff::Timestamp) -> bool {
    let spec = d.spec.as_ref().unwrap();
    let Some(s) = &d.status else { return true };
    let progressing = condition(d, "Progressing");
    if progressing.is_some_and(|c| c.reason.as_deref() == Some("ProgressDeadlineExceeded")) {
        return false;
    }
    let deadline = i64::from(spec.progress_deadline_seconds.unwrap_or(600)) + 5;
    if let Some(at) = progressing.and_then(|c| c.last_update_time.as_ref())
        && s.observed_generation >= d.metadata.generation
        && now.duration_since(at.0).as_secs() > deadline
    {
        return false;
    }
    if s.observed_generation < d.metadata.generation {
        return true;
    }
    let want = spec.replicas.unwrap_or(1);
    let updated = s.updated_replicas.unwrap_or(0);
    if updated < want || s.replicas.unwrap_or(0) > updated {
        return true;
    }
    let completed =
        progressing.is_some_and(|c| c.reason.as_deref() == Some("NewReplicaSetAvailable"));
    s.available_replicas.unwrap_or(0) < updated && !completed
}

async fn deployments(api: &Api<Deployment>) -> BTreeMap<String, Deployment> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|d| (d.name_any(), d))
        .collect()
}

/// ReplicaSets per Deployment name.
async fn replica_sets(c: &support::Cluster, ns: &str) -> BTreeMap<String, Vec<ReplicaSet>> {
    let mut out: BTreeMap<String, Vec<ReplicaSet>> = BTreeMap::new();
    for rs in Api::<ReplicaSet>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        if let Some(owner) = rs.owner_references().first() {
            out.entry(owner.name.clone()).or_default().push(rs);
        }
    }
    out
}

/// The Running pods of Deployment `name` that do not belong to the
/// ReplicaSet of its current template (by pod-template-hash): what is not
/// rolled out, as the kubelet sees it.
async fn pods_off_template(c: &support::Cluster, ns: &str, d: &Deployment) -> Vec<String> {
    let name = d.name_any();
    let rss = replica_sets(c, ns).await.remove(&name).unwrap_or_default();
    let current = rss.iter().max_by_key(|rs| {
        rs.annotations()
            .get("deployment.kubernetes.io/revision")
            .and_then(|r| r.parse::<i64>().ok())
            .unwrap_or(0)
    });
    let Some(hash) = current.and_then(|rs| rs.labels().get("pod-template-hash").cloned()) else {
        return vec!["no ReplicaSet".into()];
    };
    Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app={name}")))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter(|p| p.labels().get("pod-template-hash") != Some(&hash))
        .map(|p| p.name_any())
        .collect()
}

fn policy_gone(c: &support::Cluster, ns: &str, name: &str) -> bool {
    !c.kubectl(&["get", "spreadpolicy", name, "-n", ns, "-o", "name"])
        .status
        .success()
}

// ------------------------------------------------------------------------------------------ F13

const F13: &str = "pacing over paused and unhealthy workloads; deleting a suspended policy";

/// Seven Deployments under one policy with `maxConcurrent: 2`: four healthy,
/// two held paused (as a RolloutStrategy holds them while hooks run; the test
/// resumes each 3 s after its template changes), and one whose rollout
/// completed before it lost availability (scaled from 3 to 5 under a
/// Required zone spread of its own: 2 Pending). A policy change must never
/// have more than 2 of them rolling out at once, by the cluster's account,
/// and must reach all of them. Then the policy is suspended, the paused ones
/// paused again (never resumed, progressDeadlineSeconds 30), and the policy
/// deleted: done within 2 minutes, every term of ours gone, the users'
/// affinity as it was.
#[tokio::test]
async fn f13_pacing_over_paused_and_unhealthy_workloads_and_deleting_a_suspended_policy() {
    let mut row = RowGuard::new("F13", F13);
    let started = Instant::now();
    let env = Env::new("f13-pacing").await;
    let (c, ns) = (&env.c, env.ns.name.as_str());
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), ns);
    let web = json!({"tier": "web"});
    let mut originals = BTreeMap::new();
    for i in 0..4 {
        let d = deployment(
            &format!("h-{i}"),
            2,
            web.clone(),
            json!({"minReadySeconds": 2}),
            json!({}),
        );
        originals.insert(
            d.name_any(),
            api.create(&PostParams::default(), &d).await.unwrap(),
        );
    }
    for i in 0..2 {
        let d = deployment(&format!("p-{i}"), 1, web.clone(), json!({}), json!({}));
        originals.insert(
            d.name_any(),
            api.create(&PostParams::default(), &d).await.unwrap(),
        );
    }
    // One replica per zone by the owner's own rule (pod-template-hash keeps
    // its rollouts possible); 30 s of progress deadline.
    let own_spread = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "u-0"}}, "topologyKey": ZONE, "matchLabelKeys": ["pod-template-hash"]}]}}});
    let u = deployment(
        "u-0",
        3,
        web.clone(),
        json!({"progressDeadlineSeconds": 30}),
        own_spread,
    );
    originals.insert(
        "u-0".into(),
        api.create(&PostParams::default(), &u).await.unwrap(),
    );
    wait_until("all 7 rolled out", WAIT, || async {
        let ds = deployments(&api).await;
        (ds.len() == 7 && ds.values().all(rolled_out)).then_some(())
    })
    .await;

    let v = |weight: u32, extra: &str| {
        policy_yaml(
            "paced",
            &format!(
                "  selector: {{matchLabels: {{tier: web}}}}\n  rollout: {{maxConcurrent: 2}}\n  spread: [{{topologyKey: {HOST}, mode: Preferred, weight: {weight}}}]\n{extra}"
            ),
        )
    };
    env.apply(&v(100, ""));
    wait_until(
        "v1 on all 7, rolled out",
        Duration::from_secs(180),
        || async {
            let ds = deployments(&api).await;
            ds.values()
                .all(|d| anti_preferred(d).iter().any(|t| t["weight"] == 100) && rolled_out(d))
                .then_some(())
        },
    )
    .await;
    c.kubectl_ok(&["scale", "deployment", "u-0", "-n", ns, "--replicas=5"]);
    for p in ["p-0", "p-1"] {
        c.kubectl_ok(&["rollout", "pause", &format!("deployment/{p}"), "-n", ns]);
    }
    wait_until("u-0 complete with 2 Pending", WAIT, || async {
        let d = api.get("u-0").await.ok()?;
        let s = d.status.clone()?;
        (s.updated_replicas == Some(5) && s.available_replicas == Some(3)).then_some(())
    })
    .await;
    let rs_before: BTreeMap<String, usize> = replica_sets(c, ns)
        .await
        .into_iter()
        .map(|(k, v)| (k, v.len()))
        .collect();

    // The policy change, observed every 200 ms.
    env.apply(&v(50, ""));
    let mut failures = Vec::new();
    let (mut observations, mut max_seen) = (0u32, 0usize);
    let mut paused_seen: BTreeMap<String, Instant> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let ds = deployments(&api).await;
        let now = jiff::Timestamp::now();
        let changed = |d: &Deployment| anti_preferred(d).iter().any(|t| t["weight"] == 50);
        let in_flight: Vec<&str> = ds
            .values()
            .filter(|d| changed(d) && rolling(d, now))
            .map(|d| d.metadata.name.as_deref().unwrap())
            .collect();
        observations += 1;
        max_seen = max_seen.max(in_flight.len());
        if in_flight.len() > 2 && failures.len() < 5 {
            failures.push(format!(
                "{} rolling out at once: {in_flight:?}",
                in_flight.len()
            ));
        }
        // Resume a paused one 3 s after its template changed (a RolloutStrategy's pre hooks).
        for p in ["p-0", "p-1"] {
            let d = &ds[p];
            if changed(d) && d.spec.as_ref().unwrap().paused == Some(true) {
                let since = *paused_seen.entry(p.into()).or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_secs(3) {
                    c.kubectl_ok(&["rollout", "resume", &format!("deployment/{p}"), "-n", ns]);
                }
            }
        }
        let done = ds.values().all(changed)
            && ds
                .values()
                .filter(|d| d.name_any() != "u-0")
                .all(rolled_out);
        if done {
            break;
        }
        if Instant::now() > deadline {
            let waiting: Vec<&str> = ds
                .values()
                .filter(|d| !changed(d))
                .map(|d| d.metadata.name.as_deref().unwrap())
                .collect();
            failures.push(format!(
                "not converged within 240 s; without the change: {waiting:?}"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let paced_in = started.elapsed();
    // The cluster's truth: one new ReplicaSet per workload for the change,
    // and every Running pod of the healthy ones on the current template.
    let rs_after = replica_sets(c, ns).await;
    for (name, before) in &rs_before {
        let after = rs_after.get(name).map_or(0, Vec::len);
        if after != before + 1 {
            failures.push(format!(
                "{name}: {before} -> {after} ReplicaSets for one policy change"
            ));
        }
    }
    for d in deployments(&api).await.values() {
        if !duplicates(d).is_empty() {
            failures.push(format!(
                "{}: duplicated terms {:?}",
                d.name_any(),
                duplicates(d)
            ));
        }
        if d.name_any() != "u-0" {
            let off = pods_off_template(c, ns, d).await;
            if !off.is_empty() {
                failures.push(format!(
                    "{}: Running pods off the template: {off:?}",
                    d.name_any()
                ));
            }
        }
    }

    // Suspend, hold p-* paused for good (30 s deadline), delete.
    for p in ["p-0", "p-1"] {
        api.patch(
            p,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": true, "progressDeadlineSeconds": 30}})),
        )
        .await
        .unwrap();
    }
    env.apply(&v(50, "  suspend: true\n"));
    wait_until("Progressing=False (Suspended)", WAIT, || async {
        let out = c.kubectl(&[
            "get",
            "spreadpolicy",
            "paced",
            "-n",
            ns,
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Progressing")].reason}"#,
        ]);
        (String::from_utf8_lossy(&out.stdout) == "Suspended").then_some(())
    })
    .await;
    let t0 = Instant::now();
    c.kubectl_ok(&["delete", "spreadpolicy", "paced", "-n", ns, "--wait=false"]);
    while !policy_gone(c, ns, "paced") && t0.elapsed() < Duration::from_secs(150) {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let deleted_in = t0.elapsed();
    if !policy_gone(c, ns, "paced") || deleted_in > Duration::from_secs(120) {
        failures.push(format!(
            "the suspended policy was not deleted within 2 min ({deleted_in:?})"
        ));
    }
    for (name, d) in deployments(&api).await {
        if has_ballast_annotations(&d) || !anti_preferred(&d).is_empty() {
            failures.push(format!("{name}: ballast's terms or record left behind"));
        }
        if affinity_parts(&d) != affinity_parts(&originals[&name]) {
            failures.push(format!(
                "{name}: affinity differs from before the policy: {}",
                affinity_parts(&d)
            ));
        }
    }
    let checked = format!(
        "{observations} observations of the change, at most {max_seen} of 7 rolling out at once (maxConcurrent 2; 2 paused, 1 unavailable after completing), converged in {:.0?}; 1 new ReplicaSet per workload, no duplicated term, Running pods on the current template; suspended policy deleted in {deleted_in:.0?} with 2 Deployments held paused, no term or record left, affinity as before; wall {:.0?}",
        paced_in,
        started.elapsed()
    );
    row.finish(&failures, &checked);
    assert!(
        failures.is_empty(),
        "{}\n{}",
        failures.join("\n"),
        support::rollout::tail(&env.op.logs(), 60)
    );
}

// ------------------------------------------------------------------------------------------ F14

const F14: &str = "policy v1 -> v2, kubectl rollout undo, a template-only rollback, a RolloutStrategy rollback over policy terms, delete the policy";

/// The user's own terms, to be found byte-identical after the policy.
fn user_pod_spec() -> Value {
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
            {"maxSkew": 2, "topologyKey": HOST, "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "x"}}}],
    })
}

/// v1: one Required zone term; v2: a Preferred zone term instead (weight 80).
fn v1(name: &str, tier: &str) -> String {
    policy_yaml(
        name,
        &format!(
            "  selector: {{matchLabels: {{tier: {tier}}}}}\n  spread: [{{topologyKey: {ZONE}, mode: Required}}]\n"
        ),
    )
}

fn v2(name: &str, tier: &str) -> String {
    policy_yaml(
        name,
        &format!(
            "  selector: {{matchLabels: {{tier: {tier}}}}}\n  spread: [{{topologyKey: {ZONE}, mode: Preferred, weight: 80}}]\n"
        ),
    )
}

fn is_v1(d: &Deployment) -> bool {
    terms_on(d, ZONE) == 1 && anti_required(d).iter().any(|t| t["topologyKey"] == ZONE)
}

fn is_v2(d: &Deployment) -> bool {
    terms_on(d, ZONE) == 1 && anti_preferred(d).iter().any(|t| t["weight"] == 80)
}

/// What must hold of a workload carrying v2: ballast's term once, nothing
/// duplicated, the record naming exactly it, the user's terms untouched.
fn check_v2(d: &Deployment, user: &Value, failures: &mut Vec<String>, when: &str) {
    let name = d.name_any();
    if !is_v2(d) {
        failures.push(format!(
            "{when}: {name} does not carry v2 exactly once: {}",
            affinity_parts(d)
        ));
    }
    if !duplicates(d).is_empty() {
        failures.push(format!(
            "{when}: {name} has duplicated terms {:?}",
            duplicates(d)
        ));
    }
    let record: Value = template_record(d)
        .and_then(|r| serde_json::from_str(&r).ok())
        .unwrap_or(Value::Null);
    if record["antiAffinityPreferred"][0]["weight"] != 80
        || record.get("antiAffinityRequired").is_some()
    {
        failures.push(format!(
            "{when}: {name}'s record does not describe its terms: {record}"
        ));
    }
    // The user's terms: every user term still there, in order, once.
    let s = pod_spec(d);
    for path in LISTS {
        let users = list(user, &path);
        let live: Vec<Value> = list(&s, &path)
            .into_iter()
            .filter(|t| users.contains(t))
            .collect();
        if live != users {
            failures.push(format!(
                "{when}: {name}: user terms at {path:?} changed: {live:?}"
            ));
        }
    }
}

async fn wait_deployment(
    api: &Api<Deployment>,
    name: &str,
    what: &str,
    f: impl Fn(&Deployment) -> bool,
) -> Deployment {
    let what = format!("{name}: {what}");
    wait_until(&what, WAIT, || async {
        let d = api.get(name).await.ok()?;
        f(&d).then_some(d)
    })
    .await
}

/// Puts `name`'s template back to that of its ReplicaSet for which `pick`
/// holds, writing the template only (as a RolloutStrategy rollback does).
async fn template_only_rollback(
    api: &Api<Deployment>,
    rss: &[ReplicaSet],
    name: &str,
    pick: impl Fn(&Deployment) -> bool,
) {
    let rs = rss
        .iter()
        .find(|rs| {
            let d = Deployment {
                spec: Some(k8s_openapi::api::apps::v1::DeploymentSpec {
                    template: rs.spec.as_ref().unwrap().template.clone().unwrap(),
                    ..Default::default()
                }),
                ..Default::default()
            };
            pick(&d)
        })
        .expect("the ReplicaSet to go back to");
    let mut template =
        serde_json::to_value(rs.spec.as_ref().unwrap().template.as_ref().unwrap()).unwrap();
    template["metadata"]["labels"]
        .as_object_mut()
        .unwrap()
        .remove("pod-template-hash");
    let d = api.get(name).await.unwrap();
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": d.resource_version()},
        {"op": "replace", "path": "/spec/template", "value": template},
    ]))
    .unwrap();
    api.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch))
        .await
        .unwrap();
}

#[tokio::test]
async fn f14_policy_change_undo_rollbacks_and_deletion_keep_user_terms_byte_identical() {
    let mut row = RowGuard::new("F14", F14);
    let started = Instant::now();
    let env = Env::new("f14-undo").await;
    let (c, ns) = (&env.c, env.ns.name.as_str());
    let api: Api<Deployment> = Api::namespaced(c.client.clone(), ns);
    let mut failures = Vec::new();
    let user = user_pod_spec();

    // --- Plain Deployments: v1 -> v2, then an undo and a template-only rollback.
    let mut before = BTreeMap::new();
    for name in ["d-0", "d-1"] {
        let d = deployment(name, 2, json!({"tier": "web"}), json!({}), user.clone());
        before.insert(name, api.create(&PostParams::default(), &d).await.unwrap());
    }
    for name in ["d-0", "d-1"] {
        wait_deployment(&api, name, "rolled out", rolled_out).await;
    }
    env.apply(&v1("web-ha", "web"));
    let mut gen_v1 = BTreeMap::new();
    for name in ["d-0", "d-1"] {
        let d = wait_deployment(&api, name, "v1 rolled out", |d| is_v1(d) && rolled_out(d)).await;
        gen_v1.insert(name, d.metadata.generation.unwrap());
    }
    let rs_v1 = replica_sets(c, ns).await;
    env.apply(&v2("web-ha", "web"));
    for name in ["d-0", "d-1"] {
        let d = wait_deployment(&api, name, "v2 rolled out", |d| is_v2(d) && rolled_out(d)).await;
        check_v2(&d, &user, &mut failures, "after v1 -> v2");
        let changes = d.metadata.generation.unwrap() - gen_v1[name];
        let new_rs = replica_sets(c, ns).await[name].len() - rs_v1[name].len();
        if changes != 1 || new_rs != 1 {
            failures.push(format!(
                "{name}: v1 -> v2 made {changes} template changes and {new_rs} ReplicaSets"
            ));
        }
    }
    // kubectl rollout undo on d-0: the v1 template (and its record) back;
    // v2 again with one change (the v1 state may last only a moment).
    let generation = |d: &Deployment| d.metadata.generation.unwrap_or(0);
    let g0 = generation(&api.get("d-0").await.unwrap());
    c.kubectl_ok(&["rollout", "undo", "deployment/d-0", "-n", ns]);
    let d = wait_deployment(&api, "d-0", "v2 again after the undo", |d| {
        generation(d) >= g0 + 2 && is_v2(d) && rolled_out(d)
    })
    .await;
    check_v2(&d, &user, &mut failures, "after kubectl rollout undo");
    // A template-only rollback on d-1.
    let g1 = generation(&api.get("d-1").await.unwrap());
    let rss = replica_sets(c, ns).await.remove("d-1").unwrap();
    template_only_rollback(&api, &rss, "d-1", is_v1).await;
    let d = wait_deployment(&api, "d-1", "v2 again after the rollback", |d| {
        generation(d) >= g1 + 2 && is_v2(d) && rolled_out(d)
    })
    .await;
    check_v2(&d, &user, &mut failures, "after a template-only rollback");
    // Settled: one change of ours after each revert, then nothing moves.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let later = [
        generation(&api.get("d-0").await.unwrap()),
        generation(&api.get("d-1").await.unwrap()),
    ];
    if later != [g0 + 2, g1 + 2] {
        failures.push(format!(
            "after the undo and the rollback: generations {later:?}, expected {:?} (the revert, then ballast's one change)",
            [g0 + 2, g1 + 2]
        ));
    }

    // --- A RolloutStrategy rollback over policy terms, on Deployment `web`.
    adopt(
        &env,
        2,
        &format!(
            "  onFailure: Rollback\n  pre: [{{name: check, job: {}}}]\n",
            job_hook("check:1", "1s", false)
        ),
    )
    .await;
    let web_before = api.get("web").await.unwrap();
    c.kubectl_ok(&["label", "deployment", "web", "-n", ns, "tier=gated"]);
    env.apply(&v1("gated", "gated"));
    let s = env
        .wait_status("web", "v1 rolled out through its hooks", 120, |s| {
            s.phase == Some(RolloutPhase::Succeeded)
        })
        .await;
    let stable_v1 = s.stable_revision.clone();
    wait_deployment(&api, "web", "v1, every replica updated", |d| {
        is_v1(d)
            && d.status
                .as_ref()
                .is_some_and(|s| s.updated_replicas == Some(2) && s.replicas == Some(2))
    })
    .await;
    // The pre hook now fails: v2's revision is rolled back by the strategy.
    env.apply(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {{name: web}}\nspec:\n  targetRef: {{name: web}}\n  onFailure: Rollback\n  pre: [{{name: check, job: {}}}]\n",
        job_hook("check:1", "1s", true)
    ));
    let pods_before: Vec<String> = support::rollout::pod_uids(&env).await;
    env.apply(&v2("gated", "gated"));
    let s = env
        .wait_status("web", "v2's revision rolled back", 120, |s| {
            s.phase == Some(RolloutPhase::RolledBack)
        })
        .await;
    if s.stable_revision != stable_v1 {
        failures.push(format!(
            "the stable revision moved: {:?} -> {:?}",
            stable_v1, s.stable_revision
        ));
    }
    // ballast brings v2 back once; the strategy holds that failed revision
    // paused until a retry: no pod of it ever runs, and nobody fights.
    let d = wait_deployment(&api, "web", "v2 again after the strategy's rollback", is_v2).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let d2 = api.get("web").await.unwrap();
    if d2.metadata.generation != d.metadata.generation {
        failures.push(format!(
            "web's template kept changing after the rollback: generation {:?} -> {:?}",
            d.metadata.generation, d2.metadata.generation
        ));
    }
    if !duplicates(&d2).is_empty() || terms_on(&d2, ZONE) != 1 {
        failures.push(format!(
            "web: ballast's term not exactly once: {}",
            affinity_parts(&d2)
        ));
    }
    if support::rollout::pod_uids(&env).await != pods_before {
        failures.push("a pod of the failed revision ran, or the stable pods were replaced".into());
    }
    // The owner fixes the hook and deletes the policy: the removal is a new
    // revision that passes its hooks and rolls out.
    env.apply(&format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: RolloutStrategy\nmetadata: {{name: web}}\nspec:\n  targetRef: {{name: web}}\n  onFailure: Rollback\n  pre: [{{name: check, job: {}}}]\n",
        job_hook("check:2", "1s", false)
    ));

    // --- Delete both policies: exactly ballast's terms go.
    let t0 = Instant::now();
    c.kubectl_ok(&[
        "delete",
        "spreadpolicy",
        "web-ha",
        "gated",
        "-n",
        ns,
        "--wait=false",
    ]);
    while !(policy_gone(c, ns, "web-ha") && policy_gone(c, ns, "gated"))
        && t0.elapsed() < Duration::from_secs(120)
    {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let deleted_in = t0.elapsed();
    if !policy_gone(c, ns, "web-ha") || !policy_gone(c, ns, "gated") {
        failures.push(format!("policies not deleted within {deleted_in:?}"));
    }
    for name in ["d-0", "d-1"] {
        let d = api.get(name).await.unwrap();
        if affinity_parts(&d) != affinity_parts(&before[name]) || has_ballast_annotations(&d) {
            failures.push(format!(
                "{name}: not as before the policy: {}",
                affinity_parts(&d)
            ));
        }
    }
    env.wait_status(
        "web",
        "the removal rolled out through its hooks",
        120,
        |s| s.phase == Some(RolloutPhase::Succeeded) && s.stable_revision != stable_v1,
    )
    .await;
    let d = wait_deployment(&api, "web", "every replica updated", |d| {
        d.status
            .as_ref()
            .is_some_and(|s| s.updated_replicas == Some(2) && s.replicas == Some(2))
    })
    .await;
    if affinity_parts(&d) != affinity_parts(&web_before) || has_ballast_annotations(&d) {
        failures.push(format!(
            "web: not as before the policy: {}",
            affinity_parts(&d)
        ));
    }
    // The pods agree: what runs carries the user's affinity only.
    for p in Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        let affinity = serde_json::to_value(p.spec.as_ref().unwrap().affinity.clone()).unwrap();
        if affinity != affinity_parts(&web_before)["affinity"] {
            failures.push(format!("pod {}: affinity {affinity}", p.name_any()));
        }
    }
    let checked = format!(
        "v1 -> v2: 1 template change and 1 ReplicaSet per workload; after kubectl rollout undo and after a template-only rollback, v2 back once (record = terms, user terms in place, no duplicate), then quiet; a RolloutStrategy rollback of v2: stable pods untouched, v2 put back once and held, no fight; both policies deleted in {deleted_in:.0?}: user affinity byte-identical on all 3 Deployments and on the running pods, no record left; wall {:.0?}",
        started.elapsed()
    );
    row.finish(&failures, &checked);
    assert!(
        failures.is_empty(),
        "{}\n{}",
        failures.join("\n"),
        support::rollout::tail(&env.op.logs(), 60)
    );
}
