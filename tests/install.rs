//! The three ways to install, against each other and on a cluster: `dist/install.yaml`
//! (hack/installer.sh) and the Helm chart (charts/ballast) must give the objects of
//! `kubectl kustomize config/default`, install with `kubectl apply --server-side -f` and
//! `helm install`, and uninstall in the documented order (docs/install.md) with nothing left
//! behind.
//!
//! Installing and uninstalling the CRDs would break every test running beside it, so the cluster
//! test runs on a cluster of its own (`target/install-cluster`, ports of its own; overrides
//! `BALLAST_INSTALL_CLUSTER_DIR` and `BALLAST_INSTALL_{APISERVER,ETCD,ETCD_PEER,KCM,SCHEDULER,KWOK}_PORT`),
//! which hack/test.sh runs in a phase of its own. The render comparison needs no cluster. Both
//! need helm (hack/build-tool.sh helm) and fail, never skip, without it.

mod support;

use serde::Deserialize;
use serde_yaml::Value;
use std::{
    collections::BTreeMap,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};
use support::{Cluster, own_cluster, repo_root};

/// The labels Helm's conventions add to every object of the chart (and config/ does not).
const HELM_LABELS: [&str; 4] = [
    "helm.sh/chart",
    "app.kubernetes.io/managed-by",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
];

/// Cluster-scoped kinds that kustomize does not know, so config/default gives them a namespace
/// (that the API server ignores).
const CLUSTER_SCOPED_ADMISSION: [&str; 4] = [
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
];

/// A made-up digest: kwok never pulls, and the test checks where it ends up.
const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

fn helm() -> PathBuf {
    support::go_tool("helm")
}

fn kubectl_bin() -> PathBuf {
    let versions = std::fs::read_to_string(repo_root().join("hack/versions.env")).unwrap();
    let v = versions
        .lines()
        .find_map(|l| l.strip_prefix("KUBERNETES_VERSION="))
        .expect("KUBERNETES_VERSION in hack/versions.env");
    let cache = std::env::var_os("BALLAST_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/ballast"));
    let k = cache.join(format!("bin/kubernetes-{v}/kubectl"));
    assert!(
        k.exists(),
        "{} is missing: run `make cluster-build`",
        k.display()
    );
    k
}

#[track_caller]
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .output()
        .expect("spawning");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn documents(yaml: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).expect("parsing YAML"))
        .filter(|v| !v.is_null())
        .collect()
}

/// `kind/name` of an object.
fn key(o: &Value) -> String {
    format!(
        "{}/{}",
        o["kind"].as_str().unwrap(),
        o["metadata"]["name"].as_str().unwrap()
    )
}

/// Numbers as f64 (a CRD file says `100.0` where kustomize writes `100`), so that only values
/// are compared, not their spelling.
fn numbers_as_floats(v: &mut Value) {
    match v {
        Value::Number(n) => *v = Value::from(n.as_f64().unwrap()),
        Value::Sequence(s) => s.iter_mut().for_each(numbers_as_floats),
        Value::Mapping(m) => m.values_mut().for_each(numbers_as_floats),
        _ => {}
    }
}

/// The objects of a render by `kind/name`, with the differences that are not the objects' own
/// taken out: Helm's labels, config/default's part-of label on the CRDs (a chart's crds/ are not
/// templated), and the namespace kustomize gives cluster-scoped admission objects.
fn normalized(yaml: &str) -> BTreeMap<String, Value> {
    documents(yaml)
        .into_iter()
        .map(|mut o| {
            let kind = o["kind"].as_str().unwrap().to_string();
            let meta = o["metadata"].as_mapping_mut().unwrap();
            if CLUSTER_SCOPED_ADMISSION.contains(&kind.as_str()) {
                meta.remove("namespace");
            }
            if let Some(labels) = meta.get_mut("labels").and_then(Value::as_mapping_mut) {
                for l in HELM_LABELS {
                    labels.remove(l);
                }
                if kind == "CustomResourceDefinition" {
                    labels.remove("app.kubernetes.io/part-of");
                }
                if labels.is_empty() {
                    meta.remove("labels");
                }
            }
            numbers_as_floats(&mut o);
            (key(&o), o)
        })
        .collect()
}

fn kustomize_default() -> String {
    run(Command::new(kubectl_bin()).args(["kustomize", "config/default"]))
}

fn helm_template(extra: &[&str]) -> String {
    run(Command::new(helm())
        .args([
            "template",
            "ballast",
            "charts/ballast",
            "--namespace",
            "ballast-system",
            "--include-crds",
        ])
        .args(extra))
}

/// Where two renders differ, as `kind/name` and the two objects.
fn differences(a: &BTreeMap<String, Value>, b: &BTreeMap<String, Value>) -> Vec<String> {
    let mut out = vec![];
    for (k, v) in a {
        match b.get(k) {
            None => out.push(format!("{k}: only in the first")),
            Some(w) if w != v => out.push(format!(
                "{k} differs:\n{}\n---\n{}",
                serde_yaml::to_string(v).unwrap(),
                serde_yaml::to_string(w).unwrap()
            )),
            _ => {}
        }
    }
    out.extend(
        b.keys()
            .filter(|k| !a.contains_key(*k))
            .map(|k| format!("{k}: only in the second")),
    );
    out
}

#[test]
fn the_chart_renders_the_objects_of_config_default() {
    let mut kustomize = normalized(&kustomize_default());
    // The chart leaves the namespace to `helm install --create-namespace` (docs/install.md).
    assert!(kustomize.remove("Namespace/ballast-system").is_some());
    // config/default's values: one replica, the image ballast:<appVersion>.
    let chart = normalized(&helm_template(&["--set", "replicaCount=1"]));
    let diff = differences(&kustomize, &chart);
    assert!(
        diff.is_empty(),
        "config/default and charts/ballast differ:\n{}",
        diff.join("\n")
    );
}

#[test]
fn the_chart_s_defaults_add_a_standby_its_disruption_budget_and_host_anti_affinity() {
    let chart = normalized(&helm_template(&[]));
    let d = &chart["Deployment/ballast-controller-manager"];
    // By default webhook hooks call no URL host: the flag is left out, as in config/default.
    assert!(
        !serde_yaml::to_string(&d["spec"]["template"]["spec"]["containers"][0]["args"])
            .unwrap()
            .contains("--webhook-allowed-hosts"),
        "{d:?}"
    );
    assert_eq!(d["spec"]["replicas"], Value::from(2.0));
    let term = &d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        term["labelSelector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    let pdb = &chart["PodDisruptionBudget/ballast-controller-manager"];
    assert_eq!(pdb["spec"]["minAvailable"], Value::from(1.0));
    assert_eq!(pdb["spec"]["selector"], d["spec"]["selector"]);

    // The toggles.
    let all = normalized(&helm_template(&[
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "watchNamespace=shop",
        "--set",
        "logFormat=text",
        "--set",
        "admission.enabled=false",
        "--set",
        "image.repository=registry.example/ballast",
        "--set",
        &format!("image.digest={DIGEST}"),
        "--set",
        "podAntiAffinity=hard",
        "--set",
        "webhook.allowedHosts={jenkins.example.com,10.0.0.7}",
    ]));
    assert!(all.contains_key("ServiceMonitor/ballast-controller-manager"));
    assert!(all.contains_key("NetworkPolicy/ballast-controller-manager"));
    assert!(
        !all.keys().any(|k| k.contains("AdmissionPolicy")),
        "{all:?}"
    );
    let c = &all["Deployment/ballast-controller-manager"]["spec"]["template"]["spec"];
    let args: Vec<&str> = c["containers"][0]["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--watch-namespace=shop"), "{args:?}");
    assert!(args.contains(&"--log-format=text"), "{args:?}");
    assert!(
        args.contains(&"--webhook-allowed-hosts=jenkins.example.com,10.0.0.7"),
        "{args:?}"
    );
    assert_eq!(
        c["containers"][0]["image"],
        format!("registry.example/ballast:0.1.0@{DIGEST}").as_str()
    );
    assert!(
        c["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            .is_sequence()
    );
    // No PDB and no anti-affinity for a single replica.
    let one = normalized(&helm_template(&["--set", "replicaCount=1"]));
    assert!(!one.contains_key("PodDisruptionBudget/ballast-controller-manager"));

    // Two managers without a Lease would both act: refused.
    let out = Command::new(helm())
        .args([
            "template",
            "ballast",
            "charts/ballast",
            "--set",
            "leaderElection.enabled=false",
        ])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("leaderElection"));

    run(Command::new(helm()).args(["lint", "--strict", "charts/ballast"]));
}

/// The installer pins the image it is given by digest and is config/default otherwise.
#[test]
fn the_installer_is_config_default_with_the_image_pinned_by_digest() {
    let out = repo_root().join("target/install-test/render.yaml");
    run(Command::new(repo_root().join("hack/installer.sh"))
        .arg(&out)
        .env("DIGEST", DIGEST)
        .env("IMG", "registry.example/team/ballast:0.1.0"));
    let mut installer = normalized(&std::fs::read_to_string(&out).unwrap());
    let mut kustomize = normalized(&kustomize_default());
    let image = |objs: &mut BTreeMap<String, Value>| {
        let c = &mut objs
            .get_mut("Deployment/ballast-controller-manager")
            .unwrap()["spec"]["template"]["spec"]["containers"][0];
        std::mem::replace(&mut c["image"], Value::Null)
    };
    assert_eq!(
        image(&mut installer),
        format!("registry.example/team/ballast@{DIGEST}").as_str()
    );
    assert_eq!(image(&mut kustomize), "ballast:0.1.0");
    let diff = differences(&kustomize, &installer);
    assert!(diff.is_empty(), "{}", diff.join("\n"));
}

/// Ports below Linux's ephemeral range (32768-60999): a CI run failed when an outgoing
/// connection held 52380, the etcd peer port this cluster used before, as etcd started.
fn own_cluster_config() -> (PathBuf, Vec<(String, String)>) {
    let dir = std::env::var_os("BALLAST_INSTALL_CLUSTER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/install-cluster"));
    let ports = [
        ("APISERVER", 18443),
        ("ETCD", 18379),
        ("ETCD_PEER", 18380),
        ("KCM", 18257),
        ("SCHEDULER", 18259),
        ("KWOK", 18247),
    ]
    .iter()
    .map(|(what, default)| {
        let port = std::env::var(format!("BALLAST_INSTALL_{what}_PORT"))
            .unwrap_or_else(|_| default.to_string());
        (format!("BALLAST_{what}_PORT"), port)
    })
    .collect();
    (dir, ports)
}

struct StopOnDrop(Cluster);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Which of `objects` (`kind/name` with their namespace) the cluster still has.
fn present(c: &Cluster, objects: &[(String, Option<String>)]) -> Vec<String> {
    objects
        .iter()
        .filter(|(k, ns)| {
            let mut args = vec!["get", k.as_str(), "--ignore-not-found", "-o", "name"];
            if let Some(ns) = ns {
                args.extend(["-n", ns.as_str()]);
            }
            !c.kubectl_ok(&args).trim().is_empty()
        })
        .map(|(k, _)| k.clone())
        .collect()
}

/// `kind/name` and namespace of every object of a render, as kubectl names them.
fn identities(yaml: &str) -> Vec<(String, Option<String>)> {
    documents(yaml)
        .iter()
        .map(|o| {
            let kind = o["kind"].as_str().unwrap();
            let ns = o["metadata"]["namespace"]
                .as_str()
                .filter(|_| !CLUSTER_SCOPED_ADMISSION.contains(&kind))
                .map(String::from);
            (
                format!(
                    "{}/{}",
                    kind.to_lowercase(),
                    o["metadata"]["name"].as_str().unwrap()
                ),
                ns,
            )
        })
        .collect()
}

#[track_caller]
fn wait_gone(c: &Cluster, objects: &[(String, Option<String>)], what: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let left = present(c, objects);
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: still there after 120 s: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The uninstall of docs/install.md, first steps: the custom resources (while the manager
/// runs), then the revision gate.
fn delete_crs_and_gate(c: &Cluster) {
    c.kubectl_ok(&[
        "delete",
        "rolloutstrategies.ballast.dev,spreadpolicies.ballast.dev,clusterspreadpolicies.ballast.dev",
        "--all",
        "--all-namespaces",
        "--ignore-not-found",
        "--wait",
        "--timeout=180s",
    ]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn installer_and_chart_install_and_uninstall_cleanly_on_a_cluster_of_their_own() {
    let (dir, ports) = own_cluster_config();
    assert!(
        dir != repo_root().join(".cluster") && ports.iter().all(|(_, p)| p != "16443"),
        "this test deletes the CRDs: never on the shared cluster"
    );
    let started = Instant::now();
    let c = own_cluster(&dir, &ports).await;
    let _stop = StopOnDrop(c.clone());
    eprintln!("own cluster up in {:?}", started.elapsed());

    // dist/install.yaml, as a release makes it.
    let file = repo_root().join("target/install-test/install.yaml");
    run(Command::new(repo_root().join("hack/installer.sh"))
        .arg(&file)
        .env("DIGEST", DIGEST));
    let file_s = file.to_str().unwrap();
    let objects = identities(&std::fs::read_to_string(&file).unwrap());
    // 22 before the revision gate's and the hold's eight shard bindings each.
    assert_eq!(objects.len(), 38, "{objects:?}");
    c.kubectl_ok(&["apply", "--server-side", "-f", file_s]);
    assert_eq!(present(&c, &objects).len(), objects.len());
    let image = c.kubectl_ok(&[
        "get",
        "deployment/ballast-controller-manager",
        "-n",
        "ballast-system",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].image}",
    ]);
    assert_eq!(image, format!("ballast@{DIGEST}"));
    c.kubectl_ok(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/spreadpolicies.ballast.dev",
        "crd/rolloutstrategies.ballast.dev",
        "crd/clusterspreadpolicies.ballast.dev",
    ]);
    // Applying it again changes nothing.
    let again = c.kubectl_ok(&["apply", "--server-side", "-f", file_s]);
    assert!(
        again.lines().all(|l| l.ends_with("serverside-applied")),
        "{again}"
    );

    // The documented uninstall (docs/install.md): CRs, the gate, then the rest.
    delete_crs_and_gate(&c);
    c.kubectl_ok(&[
        "delete",
        "mutatingadmissionpolicybindings,mutatingadmissionpolicies,validatingadmissionpolicybindings,validatingadmissionpolicies",
        "-l",
        "app.kubernetes.io/part-of=ballast,app.kubernetes.io/component=admission",
    ]);
    c.kubectl_ok(&["delete", "-f", file_s, "--ignore-not-found", "--wait"]);
    wait_gone(&c, &objects, "after the installer's uninstall");
    assert_left_nothing(&c);

    // The chart.
    let helm = helm();
    let kubeconfig = c.kubeconfig.to_str().unwrap().to_string();
    let helm_run = |args: &[&str]| {
        run(Command::new(&helm)
            .args(["--kubeconfig", &kubeconfig])
            .args(args))
    };
    helm_run(&[
        "install",
        "ballast",
        "charts/ballast",
        "--namespace",
        "ballast-system",
        "--create-namespace",
        "--set",
        &format!("image.digest={DIGEST}"),
    ]);
    let rendered = helm_template(&["--set", &format!("image.digest={DIGEST}")]);
    let chart_objects = identities(&rendered);
    assert_eq!(present(&c, &chart_objects).len(), chart_objects.len());
    let replicas = c.kubectl_ok(&[
        "get",
        "deployment/ballast-controller-manager",
        "-n",
        "ballast-system",
        "-o",
        "jsonpath={.spec.replicas}",
    ]);
    assert_eq!(replicas, "2");
    let status = helm_run(&["status", "ballast", "-n", "ballast-system"]);
    assert!(status.contains("STATUS: deployed"), "{status}");

    delete_crs_and_gate(&c);
    helm_run(&["uninstall", "ballast", "-n", "ballast-system", "--wait"]);
    // Helm keeps a chart's crds/ and the namespace it created: the last steps of docs/install.md.
    c.kubectl_ok(&[
        "delete",
        "crd",
        "spreadpolicies.ballast.dev",
        "rolloutstrategies.ballast.dev",
        "clusterspreadpolicies.ballast.dev",
    ]);
    c.kubectl_ok(&["delete", "namespace", "ballast-system", "--wait"]);
    wait_gone(&c, &chart_objects, "after helm uninstall");
    assert_left_nothing(&c);
    eprintln!("install test took {:?}", started.elapsed());
}

/// Nothing of ballast's anywhere: no object labelled part-of=ballast of any kind it ships, no
/// CRD, no namespace.
fn assert_left_nothing(c: &Cluster) {
    let left = c.kubectl_ok(&[
        "get",
        "clusterroles,clusterrolebindings,mutatingadmissionpolicies,mutatingadmissionpolicybindings,validatingadmissionpolicies,validatingadmissionpolicybindings,customresourcedefinitions,namespaces",
        "-l",
        "app.kubernetes.io/part-of=ballast",
        "-o",
        "name",
    ]);
    assert!(left.trim().is_empty(), "left behind: {left}");
    let crds = c.kubectl_ok(&["get", "crd", "-o", "name"]);
    assert!(!crds.contains("ballast.dev"), "{crds}");
    let ns = c.kubectl_ok(&["get", "namespace", "-o", "name"]);
    assert!(!ns.contains("ballast-system"), "{ns}");
}
