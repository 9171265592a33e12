//! ClusterSpreadPolicy (issue 10), end to end: a platform default for the namespaces its
//! selector picks, a SpreadPolicy of the namespace winning whatever the priorities, the priority
//! rule among cluster policies, a status per namespace, deletion that takes the terms out, and
//! RBAC that lets only cluster admins write it.
//!
//! Each test namespace runs its own manager (`--watch-namespace`), so two managers share the
//! cluster policy here: each takes part only for its namespace, with a finalizer of its own, and
//! keeps the other's entry of `status.namespaces`.

mod support;

use k8s_openapi::api::apps::v1::Deployment;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use std::time::Duration;
use support::spread::{WAIT, condition, create, deployment, policy_yaml};
use support::{Cluster, Operator, TestNamespace, cluster, random_suffix, wait_until};

const LABEL: &str = "ballast.dev/test-cspol";

/// Deletes the test's cluster policies (finalizers first) whatever happens.
struct ClusterPolicies {
    names: Vec<String>,
    c: Cluster,
}

impl Drop for ClusterPolicies {
    fn drop(&mut self) {
        // Deleted while the managers still run (they release their namespaces), then whatever
        // is left of the finalizers goes: a deleted object takes no new finalizer.
        for n in &self.names {
            let _ = self.c.kubectl(&[
                "delete",
                "clusterspreadpolicy",
                n,
                "--ignore-not-found",
                "--wait=false",
            ]);
        }
        for n in &self.names {
            let _ = self.c.kubectl(&[
                "wait",
                "--for=delete",
                &format!("clusterspreadpolicy/{n}"),
                "--timeout=20s",
            ]);
            let _ = self.c.kubectl(&[
                "patch",
                "clusterspreadpolicy",
                n,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ]);
        }
    }
}

fn cluster_policy(name: &str, suffix: &str, priority: i32, key: &str) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: ClusterSpreadPolicy\nmetadata: {{name: {name}}}\nspec:\n  namespaceSelector: {{matchLabels: {{{LABEL}: '{suffix}'}}}}\n  selector: {{matchLabels: {{tier: web}}}}\n  priority: {priority}\n  spread: [{{topologyKey: {key}, mode: Preferred}}]\n"
    )
}

fn cspol(c: &Cluster, name: &str) -> Value {
    let out = c.kubectl(&["get", "clusterspreadpolicy", name, "-o", "json"]);
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

async fn owner(c: &Cluster, ns: &str, name: &str) -> Option<String> {
    let d = Api::<Deployment>::namespaced(c.client.clone(), ns)
        .get(name)
        .await
        .ok()?;
    d.annotations().get("ballast.dev/spread-policy").cloned()
}

async fn wait_owner(c: &Cluster, ns: &str, name: &str, want: Option<&str>) {
    wait_until(&format!("{ns}/{name} owned by {want:?}"), WAIT, || async {
        (owner(c, ns, name).await.as_deref() == want).then_some(())
    })
    .await;
}

fn namespace_entry(p: &Value, ns: &str) -> Option<Value> {
    p["status"]["namespaces"]
        .as_array()?
        .iter()
        .find(|n| n["namespace"] == ns)
        .cloned()
}

#[tokio::test]
async fn a_cluster_default_governs_selected_namespaces_and_yields_to_namespace_policies() {
    let c = cluster().await;
    c.install();
    let suffix = random_suffix();
    let a = TestNamespace::new(&c, "cspol-a").await;
    let b = TestNamespace::new(&c, "cspol-b").await;
    let _ops = (Operator::start(&c, &a.name), Operator::start(&c, &b.name));
    c.kubectl_ok(&["label", "namespace", &a.name, &format!("{LABEL}={suffix}")]);
    let zones = format!("t{suffix}-zones");
    let hosts = format!("t{suffix}-hosts");
    let _cleanup = ClusterPolicies {
        names: vec![zones.clone(), hosts.clone()],
        c: c.clone(),
    };

    for (ns, name) in [(&a.name, "web"), (&a.name, "api"), (&b.name, "web")] {
        create(
            &c,
            ns,
            deployment(name, 1, json!({"tier": "web", "name": name}), json!({})),
        )
        .await;
    }
    // A's own policy for api, at the lowest priority: it still wins over the cluster default.
    c.apply_yaml(
        &a.name,
        &policy_yaml(
            "local",
            "  selector: {matchLabels: {name: api}}\n  priority: -1000\n  spread: [{topologyKey: kubernetes.io/hostname, mode: Preferred}]\n",
        ),
    );
    c.apply_yaml(
        &a.name,
        &cluster_policy(&zones, &suffix, 0, "topology.kubernetes.io/zone"),
    );
    let cluster_owner = format!("ClusterSpreadPolicy/{zones}");

    wait_owner(&c, &a.name, "web", Some(&cluster_owner)).await;
    wait_owner(&c, &a.name, "api", Some("local")).await;
    let p = wait_until("zones: namespace a in status", WAIT, || async {
        let p = cspol(&c, &zones);
        let e = namespace_entry(&p, &a.name)?;
        (e["matched"] == 2 && e["applied"] == 1 && e["conflicted"] == 1).then_some(p)
    })
    .await;
    let conflicted = condition(&p["status"], "Conflicted").unwrap();
    assert!(
        conflicted["message"].as_str().unwrap().contains(&format!(
            "{}/Deployment/api is governed by SpreadPolicy local",
            a.name
        )),
        "{conflicted}"
    );
    let finalizers: Vec<String> =
        serde_json::from_value(p["metadata"]["finalizers"].clone()).unwrap_or_default();
    assert_eq!(
        finalizers,
        [format!("{}.ns.ballast.dev/spread-policy", a.name)],
        "b's manager has nothing to do yet"
    );
    // b is not selected: its web is left alone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(owner(&c, &b.name, "web").await, None);

    // Selecting b: its manager takes part, and both namespaces are in status.
    c.kubectl_ok(&["label", "namespace", &b.name, &format!("{LABEL}={suffix}")]);
    wait_owner(&c, &b.name, "web", Some(&cluster_owner)).await;
    wait_until("zones: both namespaces in status", WAIT, || async {
        let p = cspol(&c, &zones);
        let (ea, eb) = (namespace_entry(&p, &a.name)?, namespace_entry(&p, &b.name)?);
        (ea["applied"] == 1 && eb["applied"] == 1 && eb["state"] == "Applied").then_some(())
    })
    .await;

    // Among cluster policies, the higher priority wins.
    c.apply_yaml(
        &a.name,
        &cluster_policy(&hosts, &suffix, 1000, "kubernetes.io/hostname"),
    );
    let hosts_owner = format!("ClusterSpreadPolicy/{hosts}");
    wait_owner(&c, &a.name, "web", Some(&hosts_owner)).await;
    wait_owner(&c, &b.name, "web", Some(&hosts_owner)).await;
    assert_eq!(owner(&c, &a.name, "api").await.as_deref(), Some("local"));
    c.kubectl_ok(&["delete", "clusterspreadpolicy", &hosts, "--timeout=60s"]);
    wait_owner(&c, &a.name, "web", Some(&cluster_owner)).await;
    wait_owner(&c, &b.name, "web", Some(&cluster_owner)).await;

    let listed = c.kubectl_ok(&["get", "cspol", &zones]);
    let header: Vec<&str> = listed.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "NAMESPACES",
            "MATCHED",
            "APPLIED",
            "READY",
            "INFEASIBLE",
            "AGE"
        ],
        "{listed}"
    );

    // Deleting it takes its terms out in both namespaces and finishes.
    c.kubectl_ok(&["delete", "clusterspreadpolicy", &zones, "--timeout=90s"]);
    for ns in [&a.name, &b.name] {
        wait_owner(&c, ns, "web", None).await;
        let d = Api::<Deployment>::namespaced(c.client.clone(), ns)
            .get("web")
            .await
            .unwrap();
        let spec = serde_json::to_value(d.spec.unwrap().template.spec.unwrap()).unwrap();
        assert!(spec.get("affinity").is_none(), "{ns}: {spec}");
    }
    assert_eq!(owner(&c, &a.name, "api").await.as_deref(), Some("local"));
}

/// Only cluster admins write ClusterSpreadPolicies: a namespace's admin (the built-in `admin`
/// role, which ballast's editor role is folded into) may not; the cluster-policy-admin role
/// may; the built-in `view` may read them.
#[tokio::test]
async fn only_the_cluster_policy_admin_role_writes_cluster_spread_policies() {
    let c = cluster().await;
    c.install();
    let ns = TestNamespace::new(&c, "cspol-rbac").await;
    let who = format!("system:serviceaccount:{}:default", ns.name);
    let can = |verb: &str| {
        let out = c.kubectl(&[
            "auth",
            "can-i",
            verb,
            "clusterspreadpolicies.ballast.dev",
            "--as",
            &who,
        ]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    c.kubectl_ok(&[
        "create",
        "rolebinding",
        "admin",
        "-n",
        &ns.name,
        "--clusterrole=admin",
        &format!("--serviceaccount={}:default", ns.name),
    ]);
    let binding = format!("{}-cluster-policy-admin", ns.name);
    let view = format!("{}-view", ns.name);
    c.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        &view,
        "--clusterrole=view",
        &format!("--serviceaccount={}:default", ns.name),
    ]);
    wait_until("view reads them", WAIT, || async {
        (can("list") == "yes").then_some(())
    })
    .await;
    assert_eq!(
        can("create"),
        "no",
        "a namespace admin (and view) may not write them"
    );
    c.kubectl_ok(&[
        "create",
        "clusterrolebinding",
        &binding,
        "--clusterrole=ballast-cluster-policy-admin-role",
        &format!("--serviceaccount={}:default", ns.name),
    ]);
    wait_until("the aggregated admin role grants create", WAIT, || async {
        (can("create") == "yes").then_some(())
    })
    .await;
    c.kubectl_ok(&["delete", "clusterrolebinding", &binding, &view]);
}
