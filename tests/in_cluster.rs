//! The manager's in-cluster path: the binary run as the Pod of config/default's Deployment would
//! run it, with no kubeconfig anywhere. Its ServiceAccount token, the cluster CA and its
//! namespace are at /var/run/secrets/kubernetes.io/serviceaccount/, the API server is named by
//! `KUBERNETES_SERVICE_HOST`/`KUBERNETES_SERVICE_PORT`, the args, env and user come from the
//! rendered Deployment, and every filesystem is read-only (`readOnlyRootFilesystem`).
//!
//! There is no container engine on these machines (podman is not installed, and could not run a
//! container here without one), so the Pod is a private mount namespace (`unshare --mount`):
//! a tmpfs over /run holds the ServiceAccount files, every other mount is remounted read-only,
//! and `setpriv` drops to the Deployment's user and group with no capabilities. Only the mount
//! namespace is private: the network is the host's, so the Service host is 127.0.0.1, which
//! the API server's certificate names (hack/cluster-up.sh). Needs root, as a kubelet does; it
//! fails, never skips, without it.

mod support;

use k8s_openapi::api::{apps::v1::Deployment, coordination::v1::Lease};
use kube::Api;
use serde::Deserialize;
use serde_yaml::Value;
use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};
use support::{TestNamespace, cluster, wait_until};

/// Runs as root inside the new mount namespace, then becomes the Pod's process: `$@` is
/// `env -i <the container's env> <manager> <args>`.
const POD_SH: &str = r#"
set -eu
mount --make-rprivate /
mount -t tmpfs -o mode=0755,size=1m tmpfs /run
mkdir -p /var/run/secrets/kubernetes.io/serviceaccount
cp "$STAGE/token" "$STAGE/ca.crt" "$STAGE/namespace" /var/run/secrets/kubernetes.io/serviceaccount/
chmod 0644 /var/run/secrets/kubernetes.io/serviceaccount/*
# readOnlyRootFilesystem: every filesystem but the kernel's (proc, sys, dev) read-only.
awk '{print $2}' /proc/self/mounts | sort -u | while read -r m; do
  case "$m" in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*) continue ;; esac
  mount -o remount,bind,ro "$m"
done
if touch /run/probe 2>/dev/null || touch "$STAGE/probe" 2>/dev/null; then
  echo "the root filesystem is still writable" >&2
  exit 97
fi
exec setpriv --reuid="$RUN_UID" --regid="$RUN_GID" --clear-groups \
  --inh-caps=-all --bounding-set=-all --no-new-privs "$@"
"#;

/// The manager's Deployment of `kubectl kustomize config/default`.
fn shipped_deployment(rendered: &str) -> Value {
    serde_yaml::Deserializer::from_str(rendered)
        .map(|d| Value::deserialize(d).expect("parsing kubectl kustomize output"))
        .find(|o| {
            o["kind"] == "Deployment" && o["metadata"]["name"] == "ballast-controller-manager"
        })
        .expect("config/default renders the Deployment ballast-controller-manager")
}

fn str_of<'a>(v: &'a Value, what: &str) -> &'a str {
    v.as_str()
        .unwrap_or_else(|| panic!("{what} is not a string: {v:?}"))
}

struct Pod {
    child: Child,
    log: std::path::PathBuf,
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn the_manager_in_a_pod_s_view_acquires_its_lease_and_reconciles_an_example() {
    let c = cluster().await;
    c.install();
    let ns = TestNamespace::new(&c, "incluster").await;
    let id = nix_uid();
    assert_eq!(
        id, 0,
        "this test builds the Pod's mount namespace (unshare --mount, mount, setpriv) and needs root, as a kubelet does"
    );

    let deploy = shipped_deployment(&c.kubectl_ok(&["kustomize", "config/default"]));
    let system_ns = str_of(&deploy["metadata"]["namespace"], "metadata.namespace").to_string();
    let pod_spec = &deploy["spec"]["template"]["spec"];
    let sa = str_of(&pod_spec["serviceAccountName"], "serviceAccountName");
    let container = pod_spec["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "manager")
        .expect("a container named manager");
    assert_eq!(
        container["securityContext"]["readOnlyRootFilesystem"],
        Value::Bool(true),
        "the shipped manager has a read-only root"
    );
    let uid = pod_spec["securityContext"]["runAsUser"].as_u64().unwrap();
    let gid = pod_spec["securityContext"]["runAsGroup"].as_u64().unwrap();
    assert_eq!((uid, gid), (65532, 65532));

    let pod_name = format!("ballast-controller-manager-{}", support::random_suffix());
    let http_port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    // The shipped args, but /metrics on loopback only, and, since the tests share one cluster,
    // this namespace only and a Lease of its own (hack/gc-test-leases.sh collects it).
    let lease_name = format!("ballast-{}", ns.name);
    let mut args: Vec<String> = container["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| str_of(a, "an arg").to_string())
        .map(|a| {
            if a.starts_with("--http-addr=") {
                format!("--http-addr=127.0.0.1:{http_port}")
            } else {
                a
            }
        })
        .collect();
    assert!(args.iter().any(|a| a.starts_with("--http-addr=127.0.0.1:")));
    args.extend([
        format!("--watch-namespace={}", ns.name),
        format!("--lease-name={lease_name}"),
    ]);

    // The kubeconfig only tells the test where the API server listens (port) and its CA.
    let server = c.kubectl_ok(&[
        "config",
        "view",
        "--minify",
        "-o",
        "jsonpath={.clusters[0].cluster.server}",
    ]);
    let port = server
        .strip_prefix("https://127.0.0.1:")
        .unwrap_or_else(|| panic!("the API server is not on https://127.0.0.1: {server}"))
        .trim()
        .to_string();
    let mut env = vec![
        (
            "KUBERNETES_SERVICE_HOST".to_string(),
            "127.0.0.1".to_string(),
        ),
        ("KUBERNETES_SERVICE_PORT".to_string(), port.clone()),
        ("KUBERNETES_SERVICE_PORT_HTTPS".to_string(), port),
        ("HOSTNAME".to_string(), pod_name.clone()),
    ];
    for e in container["env"].as_sequence().unwrap() {
        let name = str_of(&e["name"], "env name").to_string();
        let value = if let Some(v) = e["value"].as_str() {
            v.to_string()
        } else {
            match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some("metadata.name") => pod_name.clone(),
                Some("metadata.namespace") => system_ns.clone(),
                other => {
                    panic!("env {name} from {other:?}: teach this test what a kubelet puts there")
                }
            }
        };
        env.push((name, value));
    }

    // What the kubelet projects into the Pod: a bound token of the ServiceAccount, the CA, the
    // namespace.
    let stage = c.dir.join(format!("in-cluster-{}", ns.name));
    std::fs::create_dir_all(&stage).unwrap();
    let token = c.kubectl_ok(&["create", "token", sa, "-n", &system_ns, "--duration=1h"]);
    std::fs::write(stage.join("token"), token.trim()).unwrap();
    std::fs::copy(c.dir.join("pki/ca.crt"), stage.join("ca.crt")).unwrap();
    std::fs::write(stage.join("namespace"), &system_ns).unwrap();

    let log = c
        .dir
        .join(format!("logs/operator-{}-in-cluster.log", ns.name));
    std::fs::create_dir_all(log.parent().unwrap()).unwrap();
    let file = std::fs::File::create(&log).unwrap();
    let child = Command::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            POD_SH,
            "pod",
        ])
        .arg("env")
        .arg("-i")
        .args(env.iter().map(|(k, v)| format!("{k}={v}")))
        .arg(env!("CARGO_BIN_EXE_ballast"))
        .args(&args)
        .env("STAGE", &stage)
        .env("RUN_UID", uid.to_string())
        .env("RUN_GID", gid.to_string())
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .expect("running unshare (util-linux)");
    let mut pod = Pod { child, log };
    let logs = |p: &Pod| std::fs::read_to_string(&p.log).unwrap_or_default();

    // It is the Pod's process: the user, the environment and the mounts a Pod would give it.
    let pid = pod.child.id();
    let proc_file = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}"));
    let status = wait_until(
        "the manager to run as 65532",
        Duration::from_secs(20),
        || {
            let s = proc_file("status").ok().filter(|s| {
                s.lines()
                    .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("65532"))
            });
            async move { s }
        },
    )
    .await;
    let field = |name: &str| -> Vec<String> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_default();
        line.split_whitespace()
            .skip(1)
            .map(str::to_string)
            .collect()
    };
    assert_eq!(field("Uid:"), ["65532"; 4], "{status}");
    assert_eq!(field("Gid:"), ["65532"; 4], "{status}");
    assert!(field("Groups:").is_empty(), "{status}");
    assert_eq!(field("CapEff:"), ["0000000000000000"], "{status}");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    let mut seen: Vec<String> = environ
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    seen.sort();
    let mut want: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    want.sort();
    assert_eq!(
        seen, want,
        "the manager's environment is the Pod's, no KUBECONFIG, no HOME"
    );
    let mounts = proc_file("mounts").unwrap();
    let root = mounts
        .lines()
        .rfind(|l| l.split_whitespace().nth(1) == Some("/"))
        .expect("a root mount");
    assert!(
        root.split_whitespace()
            .nth(3)
            .unwrap()
            .split(',')
            .any(|o| o == "ro"),
        "{root}"
    );
    assert!(
        mounts
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some("/run")),
        "the ServiceAccount files are on a tmpfs of the Pod:\n{mounts}"
    );
    assert_ne!(
        std::fs::read_link("/proc/self/ns/mnt").unwrap(),
        std::fs::read_link(format!("/proc/{pid}/ns/mnt")).unwrap(),
        "the Pod's mounts are its own"
    );

    // It acquires its Lease, as the Pod named by POD_NAME, in POD_NAMESPACE.
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &system_ns);
    wait_until(
        "the manager to hold its Lease",
        Duration::from_secs(60),
        || {
            let leases = leases.clone();
            let (lease_name, pod_name) = (lease_name.clone(), pod_name.clone());
            async move {
                let l = leases.get_opt(&lease_name).await.ok()??;
                (l.spec?.holder_identity? == pod_name).then_some(())
            }
        },
    )
    .await;
    let metrics = wait_until("/metrics on loopback", Duration::from_secs(20), || async {
        http_get(http_port, "/metrics")
            .await
            .filter(|(code, _)| *code == 200)
    })
    .await
    .1;
    assert!(
        metrics.lines().any(|l| l.trim() == "ballast_leader 1"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("leader"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let (code, _) = http_get(http_port, "/readyz").await.unwrap();
    assert_eq!(code, 200);
    // --log-format=json, as shipped.
    let first = logs(&pod).lines().next().unwrap_or_default().to_string();
    assert!(
        serde_json::from_str::<serde_json::Value>(&first).is_ok(),
        "a JSON log line: {first}"
    );

    // It reconciles an example: the SpreadPolicy's zone term lands in the Deployment.
    let example =
        std::fs::read_to_string(support::repo_root().join("examples/spread-zone.yaml")).unwrap();
    c.apply_yaml(&ns.name, &example);
    let deployments: Api<Deployment> = Api::namespaced(c.client.clone(), &ns.name);
    let d = wait_until("the zone term in Deployment web", Duration::from_secs(60), || {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get("web").await.ok()?;
            let spec = serde_json::to_value(d.spec.as_ref()?.template.spec.as_ref()?).ok()?;
            let terms = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                .as_array()?
                .clone();
            terms
                .iter()
                .any(|t| t["topologyKey"] == "topology.kubernetes.io/zone")
                .then_some((d, terms))
        }
    })
    .await;
    let (d, terms) = d;
    assert_eq!(terms.len(), 1, "{terms:?}");
    assert_eq!(
        terms[0]["matchLabelKeys"],
        serde_json::json!(["pod-template-hash"])
    );
    assert!(
        d.metadata
            .managed_fields
            .unwrap_or_default()
            .iter()
            .any(|m| m.manager.as_deref() == Some("ballast.dev/spread-policy")),
        "written by the manager's field manager"
    );

    // SIGTERM, as the kubelet stops a Pod: exit 0 and the Lease released for a standby.
    Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let exit = wait_until("the manager to exit", Duration::from_secs(30), || {
        let s = pod.child.try_wait().ok().flatten();
        async move { s }
    })
    .await;
    assert!(exit.success(), "{exit:?}\n{}", logs(&pod));
    let lease = leases.get(&lease_name).await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        None,
        "the Lease is released on SIGTERM"
    );
    let out = logs(&pod);
    assert!(!out.contains("\"level\":\"ERROR\""), "{out}");
    let _ = std::fs::remove_dir_all(&stage);
}

fn nix_uid() -> u32 {
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

async fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}
