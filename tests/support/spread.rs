//! What the SpreadPolicy tests beyond placement share (tests/spread_*.rs): node pools of their
//! own, Deployments pinned to a pool, policies, and reading status and pods.
//!
//! A [`Pool`] is a set of kwok nodes that only one test uses: they carry a pool label and a
//! taint naming the pool, and the test's workloads select the label and tolerate the taint.
//! So a test may cordon, taint and relabel them while the other tests run on the shared nodes,
//! and the real scheduler places the test's pods only there.

use super::{Cluster, wait_until};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, ResourceExt,
    api::{ListParams, PostParams},
};
use serde_json::{Value, json};
use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
    time::Duration,
};

pub const ZONE: &str = "topology.kubernetes.io/zone";
pub const HOST: &str = "kubernetes.io/hostname";
/// The label and taint key that tie a pool's nodes to its test.
pub const POOL: &str = "ballast.dev/test-pool";
pub const WAIT: Duration = Duration::from_secs(120);

/// Nodes of one test; deleted when dropped.
pub struct Pool {
    pub name: String,
    /// Node names by zone, in order.
    pub zones: BTreeMap<String, Vec<String>>,
    kubectl: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
}

impl Pool {
    /// `per_zone` nodes in each of `zones`, named `<name>-<zone>-<i>`, Ready and carrying only
    /// the pool's taint when this returns.
    pub async fn create(c: &Cluster, name: &str, zones: &[&str], per_zone: usize) -> Pool {
        let mut yaml = String::new();
        let mut by_zone = BTreeMap::new();
        for z in zones {
            for i in 0..per_zone {
                let node = format!("{name}-{z}-{i}");
                yaml.push_str(&format!(
                    "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: {node}\n  annotations: {{kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: '0'}}\n  labels:\n    type: kwok\n    {POOL}: {name}\n    {HOST}: {node}\n    {ZONE}: {z}\nspec:\n  taints: [{{key: {POOL}, value: {name}, effect: NoSchedule}}]\nstatus:\n  allocatable: {{cpu: '32', memory: 256Gi, pods: '110'}}\n  capacity: {{cpu: '32', memory: 256Gi, pods: '110'}}\n"
                ));
                by_zone
                    .entry(z.to_string())
                    .or_insert_with(Vec::new)
                    .push(node);
            }
        }
        let out = c.kubectl_stdin(&["apply", "-f", "-"], Some(&yaml));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pool = Pool {
            name: name.to_string(),
            zones: by_zone,
            kubectl: c.kubectl.clone(),
            kubeconfig: c.kubeconfig.clone(),
        };
        let nodes: Api<Node> = Api::all(c.client.clone());
        let selector = format!("{POOL}={name}");
        let want = zones.len() * per_zone;
        wait_until(&format!("pool {name} Ready"), WAIT, || async {
            let list = nodes
                .list(&ListParams::default().labels(&selector))
                .await
                .ok()?;
            let ready = list
                .items
                .iter()
                .filter(|n| node_ready(n) && node_taints(n) == [POOL.to_string()])
                .count();
            (ready == want).then_some(())
        })
        .await;
        pool
    }

    pub fn nodes(&self) -> Vec<String> {
        self.zones.values().flatten().cloned().collect()
    }

    pub fn zone(&self, zone: &str) -> Vec<String> {
        self.zones[zone].clone()
    }

    /// The pod spec fields that put a workload on this pool (merged into its pod spec).
    pub fn pod_spec(&self) -> Value {
        json!({
            "nodeSelector": {POOL: self.name},
            "tolerations": [{"key": POOL, "operator": "Equal", "value": self.name, "effect": "NoSchedule"}],
        })
    }

    fn kubectl(&self, args: &[&str]) {
        let out = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("kubectl");
        assert!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Cordons `nodes` and waits until their controller has tainted them (what the scheduler's
    /// filters and ballast both read).
    pub async fn cordon(&self, c: &Cluster, nodes: &[String]) {
        for n in nodes {
            self.kubectl(&["cordon", n]);
        }
        self.wait_taint(c, nodes, "node.kubernetes.io/unschedulable", true)
            .await;
    }

    pub async fn uncordon(&self, c: &Cluster, nodes: &[String]) {
        for n in nodes {
            self.kubectl(&["uncordon", n]);
        }
        self.wait_taint(c, nodes, "node.kubernetes.io/unschedulable", false)
            .await;
    }

    /// Taints `nodes` with `key:NoSchedule`.
    pub async fn taint(&self, c: &Cluster, nodes: &[String], key: &str) {
        for n in nodes {
            self.kubectl(&["taint", "node", n, &format!("{key}=x:NoSchedule")]);
        }
        self.wait_taint(c, nodes, key, true).await;
    }

    pub fn label(&self, nodes: &[String], label: &str) {
        for n in nodes {
            self.kubectl(&["label", "node", n, label, "--overwrite"]);
        }
    }

    async fn wait_taint(&self, c: &Cluster, nodes: &[String], key: &str, present: bool) {
        let api: Api<Node> = Api::all(c.client.clone());
        for n in nodes {
            wait_until(&format!("{n}: taint {key} {present}"), WAIT, || async {
                let node = api.get(n).await.ok()?;
                (node_taints(&node).iter().any(|t| t == key) == present).then_some(())
            })
            .await;
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        if std::env::var_os("BALLAST_KEEP_NAMESPACES").is_some() {
            return;
        }
        let _ = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args([
                "delete",
                "nodes",
                "-l",
                &format!("{POOL}={}", self.name),
                "--wait=false",
            ])
            .stdin(Stdio::null())
            .output();
    }
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn node_taints(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| ts.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

/// A Deployment `name` (pods `app=<name>`) with `labels` on the object and `pod_spec` merged
/// into its pod spec.
pub fn deployment(name: &str, replicas: i32, labels: Value, pod_spec: Value) -> Deployment {
    let mut spec = json!({"containers": [{"name": "app", "image": "registry.example/app:1"}],
                          "terminationGracePeriodSeconds": 0});
    for (k, v) in pod_spec.as_object().into_iter().flatten() {
        spec[k] = v.clone();
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

pub async fn create(c: &Cluster, ns: &str, d: Deployment) -> Deployment {
    Api::<Deployment>::namespaced(c.client.clone(), ns)
        .create(&PostParams::default(), &d)
        .await
        .unwrap()
}

pub fn policy_yaml(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: ballast.dev/v1alpha1\nkind: SpreadPolicy\nmetadata: {{name: {name}}}\nspec:\n{spec}"
    )
}

/// The status of SpreadPolicy `name`, as JSON (`Null` when it cannot be read).
pub fn policy_status(c: &Cluster, ns: &str, name: &str) -> Value {
    let out = c.kubectl(&["get", "spreadpolicy", name, "-n", ns, "-o", "json"]);
    serde_json::from_slice::<Value>(&out.stdout)
        .map(|v| v["status"].clone())
        .unwrap_or(Value::Null)
}

pub fn condition(status: &Value, type_: &str) -> Option<Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

/// The pods of `app=<app>` in `ns` that are not being deleted.
pub async fn pods(c: &Cluster, ns: &str, app: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(c.client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect()
}

pub fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

/// Whether the scheduler has tried `p` and found no node (`PodScheduled=False`, `Unschedulable`).
pub fn unschedulable(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
        })
}

/// Running pods of `app` per value of `key` on their real nodes (`""` for a node without it).
pub async fn running_per_domain(
    c: &Cluster,
    ns: &str,
    app: &str,
    key: &str,
) -> BTreeMap<String, usize> {
    let nodes: Api<Node> = Api::all(c.client.clone());
    let mut out = BTreeMap::new();
    for p in pods(c, ns, app).await {
        if phase(&p) != "Running" {
            continue;
        }
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let Ok(node) = nodes.get(&node).await else {
            continue;
        };
        *out.entry(node.labels().get(key).cloned().unwrap_or_default())
            .or_insert(0) += 1;
    }
    out
}

/// Waits until `app`'s `replicas` pods have settled: each Running or found unschedulable by
/// the scheduler, with the same counts for 3 s. Returns (running, pending).
pub async fn settled(c: &Cluster, ns: &str, app: &str, replicas: usize) -> (usize, usize) {
    let count = || async {
        let ps = pods(c, ns, app).await;
        let running = ps.iter().filter(|p| phase(p) == "Running").count();
        let pending = ps
            .iter()
            .filter(|p| phase(p) == "Pending" && unschedulable(p))
            .count();
        (ps.len() == replicas && running + pending == replicas).then_some((running, pending))
    };
    loop {
        let first = wait_until(&format!("{app}'s pods settled"), WAIT, count).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        if count().await == Some(first) {
            return first;
        }
    }
}
