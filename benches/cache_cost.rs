//! `make bench`: how many bytes the manager's watch caches keep for one workload of a
//! namespace (issue 9: "say in the docs how many bytes one governed workload costs"), and for
//! one pod of a Deployment in the SpreadPolicy controller's pod index (issue 10).
//!
//! For each cache, N copies of a real object (`benches/fixtures/`: a Deployment and its
//! ReplicaSet as the API server returns them, managedFields included) go through the same trim
//! the controller applies before its cache and into that cache (a kube-runtime reflector store,
//! or the controller's own index: the SpreadPolicy controller's workload views, the
//! RolloutStrategy controller's ReplicaSets), as a watch would put them; a counting allocator gives the bytes still allocated per object (live heap,
//! as requested of the allocator: malloc's own overhead, ~16 B per allocation, is counted
//! apart), and the untrimmed object is measured the same way as the floor. No cluster.
//!
//! Then what decoding costs, per object, in CPU time and allocations: a watch event of a
//! Deployment a SpreadPolicy governs, into the SpreadPolicy controller's view, and the API
//! server's answer to a write, as the controllers decode them, each side by side with its
//! k8s-openapi type (what a plain kube watcher or `Api<Deployment>::patch` decodes) and with a
//! scan of the JSON that keeps nothing (the floor no decoder goes under).

use ballast::controller::{
    rollout_strategy::{
        cache::{CachedDeployment, CachedReplicaSet},
        replica_sets::ReplicaSets,
    },
    spread_policy::{
        pods::{PodIndex, WatchedPod},
        read::{Cached, Relevant, Workloads},
    },
};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Resource,
    runtime::{reflector, watcher},
};
use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicIsize, Ordering::Relaxed},
};

struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static LIVE_ALLOCS: AtomicIsize = AtomicIsize::new(0);
/// Every allocation made, freed or not (the decode measures).
static ALLOCS: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Relaxed);
        LIVE_ALLOCS.fetch_add(1, Relaxed);
        ALLOCS.fetch_add(1, Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Relaxed);
        LIVE_ALLOCS.fetch_sub(1, Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as isize - layout.size() as isize, Relaxed);
        ALLOCS.fetch_add(1, Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const N: usize = 5000;

fn copies<K: Resource + serde::de::DeserializeOwned>(fixture: &str, i: usize) -> K {
    let mut v: serde_json::Value = serde_json::from_str(fixture).expect("fixture");
    let name = format!("w{i:05}");
    v["metadata"]["name"] = name.clone().into();
    v["metadata"]["uid"] = format!("00000000-0000-0000-0000-{i:012}").into();
    v["metadata"]["resourceVersion"] = (100_000 + i).to_string().into();
    serde_json::from_value(v).expect("object")
}

/// Live bytes and allocations per object that `fill` leaves allocated: it returns what keeps
/// them (dropped once counted) and how many it keeps, which must be N.
fn per_kept<T>(fill: impl FnOnce() -> (T, usize)) -> (f64, f64) {
    let (bytes0, allocs0) = (LIVE_BYTES.load(Relaxed), LIVE_ALLOCS.load(Relaxed));
    let (kept, n) = fill();
    let bytes = LIVE_BYTES.load(Relaxed) - bytes0;
    let allocs = LIVE_ALLOCS.load(Relaxed) - allocs0;
    assert_eq!(n, N);
    drop(kept);
    (bytes as f64 / N as f64, allocs as f64 / N as f64)
}

/// Live bytes and allocations per object kept in a reflector store, after `trim`.
fn per_object<K>(fixture: &str, trim: impl Fn(&mut K)) -> (f64, f64)
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + Send + Sync + 'static,
{
    per_kept(|| {
        let (reader, mut writer) = reflector::store::<K>();
        for i in 0..N {
            let mut obj: K = copies(fixture, i);
            trim(&mut obj);
            writer.apply_watcher_event(&watcher::Event::Apply(obj));
        }
        let n = reader.state().len();
        ((reader, writer), n)
    })
}

/// Live bytes and allocations per Deployment filed in the SpreadPolicy controller's
/// [`Workloads`] index (its view), as its watch's first list fills it.
fn per_workload_in_index(fixture: &str) -> (f64, f64) {
    per_kept(|| {
        let index = Workloads::default();
        let kind = ballast::api::spread_policy::WorkloadKind::Deployment;
        index.apply::<Deployment>(kind, &watcher::Event::Init);
        for i in 0..N {
            let d: Cached<Deployment> = copies(fixture, i);
            index.apply(kind, &watcher::Event::InitApply(d));
        }
        index.apply::<Deployment>(kind, &watcher::Event::InitDone);
        let n = index.len();
        (index, n)
    })
}

/// Live bytes and allocations per ReplicaSet filed in the RolloutStrategy controller's
/// [`ReplicaSets`] index, as its watch's first list fills it: ReplicaSet `i` of Deployment
/// `w<i>`, with a uid of its own.
fn per_replica_set_in_index(fixture: &str) -> (f64, f64) {
    per_kept(|| {
        let index = ReplicaSets::default();
        index.apply(&watcher::Event::Init);
        for i in 0..N {
            let mut v: serde_json::Value = serde_json::from_str(fixture).expect("fixture");
            v["metadata"]["name"] = format!("w{i:05}-7977c7f9b5").into();
            v["metadata"]["ownerReferences"][0]["name"] = format!("w{i:05}").into();
            v["metadata"]["ownerReferences"][0]["uid"] =
                format!("00000000-0000-0000-0000-{i:012}").into();
            let rs: CachedReplicaSet = serde_json::from_value(v).expect("ReplicaSet");
            index.apply(&watcher::Event::InitApply(rs));
        }
        index.apply(&watcher::Event::InitDone);
        let n = index.len();
        (index, n)
    })
}

/// The pod fixture as pod `i` of Deployment `w<i/3>` (three pods a Deployment), with its own
/// name, uid, node and ReplicaSet.
fn pod_copy(fixture: &str, i: usize) -> serde_json::Value {
    let mut v: serde_json::Value = serde_json::from_str(fixture).expect("fixture");
    let hash = v["metadata"]["labels"]["pod-template-hash"]
        .as_str()
        .expect("a Deployment's pod")
        .to_string();
    let rs = format!("w{:05}-{hash}", i / 3);
    v["metadata"]["name"] = format!("{rs}-{i:05}").into();
    v["metadata"]["uid"] = format!("00000000-0000-0000-0000-{i:012}").into();
    v["metadata"]["resourceVersion"] = (100_000 + i).to_string().into();
    v["metadata"]["ownerReferences"][0]["name"] = rs.into();
    v["spec"]["nodeName"] = format!("kwok-node-{}", i % 300).into();
    v
}

/// Live bytes and allocations per pod filed in the SpreadPolicy controller's [`PodIndex`],
/// as its watch's first list fills it.
fn per_pod_in_index(fixture: &str) -> (f64, f64) {
    per_kept(|| {
        let index = PodIndex::default();
        index.apply(watcher::Event::Init);
        for i in 0..N {
            let pod: WatchedPod = serde_json::from_value(pod_copy(fixture, i)).expect("pod");
            index.apply(watcher::Event::InitApply(pod));
        }
        index.apply(watcher::Event::InitDone);
        let n = index.len();
        (index, n)
    })
}

/// The pod as received, in a reflector store (the floor).
fn per_pod_as_received(fixture: &str) -> (f64, f64) {
    per_kept(|| {
        let (reader, mut writer) = reflector::store::<Pod>();
        for i in 0..N {
            let pod: Pod = serde_json::from_value(pod_copy(fixture, i)).expect("pod");
            writer.apply_watcher_event(&watcher::Event::Apply(pod));
        }
        let n = reader.state().len();
        ((reader, writer), n)
    })
}

fn row(what: &str, (bytes, allocs): (f64, f64)) -> f64 {
    let with_overhead = bytes + 16.0 * allocs;
    println!(
        "{what:<62} {:>8.0} B  {:>6.1} allocs  {:>8.0} B with malloc's overhead",
        bytes, allocs, with_overhead
    );
    with_overhead
}

/// `fixture` labelled `ballast.dev/governed`, as the RolloutStrategy controller's watch selects.
fn labelled_governed(fixture: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(fixture).expect("fixture");
    v["metadata"]["labels"]["ballast.dev/governed"] = "true".into();
    v.to_string()
}

/// The Deployment fixture as a SpreadPolicy leaves it: one preferred anti-affinity term over
/// its own pods, the record of that term in the template, and the policy's annotation.
fn governed(fixture: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(fixture).expect("fixture");
    let selector = v["spec"]["selector"].clone();
    let term = serde_json::json!({"weight": 100, "podAffinityTerm": {
        "labelSelector": selector, "topologyKey": "kubernetes.io/hostname"}});
    v["metadata"]["annotations"]["ballast.dev/spread-policy"] = "spread".into();
    let template = &mut v["spec"]["template"];
    template["metadata"]["annotations"]["ballast.dev/spread-terms"] =
        serde_json::json!({"antiAffinityPreferred": [term]})
            .to_string()
            .into();
    template["spec"]["affinity"] = serde_json::json!({"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [term]}});
    v.to_string()
}

/// `governed`'s Deployment as the API server sends it once ballast has applied the term: with
/// the managedFields entry of that apply.
fn governed_as_sent(fixture: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(&governed(fixture)).expect("governed");
    let entry = serde_json::json!({
        "apiVersion": "apps/v1", "fieldsType": "FieldsV1", "manager": "ballast.dev/spread-policy",
        "operation": "Apply", "time": "2026-12-03T19:12:15Z",
        "fieldsV1": {
            "f:metadata": {"f:annotations": {"f:ballast.dev/spread-policy": {}}},
            "f:spec": {"f:template": {
                "f:metadata": {"f:annotations": {"f:ballast.dev/spread-terms": {}}},
                "f:spec": {"f:affinity": {"f:podAntiAffinity": {
                    "f:preferredDuringSchedulingIgnoredDuringExecution": {}}}}}}}});
    v["metadata"]["managedFields"]
        .as_array_mut()
        .expect("managedFields")
        .push(entry);
    v.to_string()
}

/// Nanoseconds and allocations per decode of `json` by `decode`: the median of 9 batches of
/// `REPS` decodes, the batches of every decoder of a row taken in turn, so that they share
/// what the machine was doing.
const REPS: usize = 20_000;

type Decoder<'a> = (&'a str, &'a dyn Fn(&str));

/// One row per decoder, and last a scan of the JSON that keeps nothing (the floor of any
/// decoder).
fn decode_rows(what: &str, json: &str, decoders: &[Decoder]) {
    let scan: Decoder = (
        "a scan that keeps nothing (IgnoredAny)",
        &whole::<serde::de::IgnoredAny>,
    );
    let decoders: Vec<Decoder> = decoders.iter().copied().chain([scan]).collect();
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); decoders.len()];
    let mut allocs = vec![0.0; decoders.len()];
    for _ in 0..9 {
        for (i, (_, decode)) in decoders.iter().enumerate() {
            let a0 = ALLOCS.load(Relaxed);
            let t0 = std::time::Instant::now();
            for _ in 0..REPS {
                decode(std::hint::black_box(json));
            }
            times[i].push(t0.elapsed().as_nanos() as f64 / REPS as f64);
            allocs[i] = (ALLOCS.load(Relaxed) - a0) as f64 / REPS as f64;
        }
    }
    println!("{what} ({} bytes):", json.len());
    let median = |t: &mut Vec<f64>| {
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    };
    let floor = median(&mut times[0].clone());
    for (i, (name, _)) in decoders.iter().enumerate() {
        let ns = median(&mut times[i]);
        println!(
            "  {name:<60} {:>7.1} µs  {:>6.1} allocs  {:>5.2}x the first",
            ns / 1000.0,
            allocs[i],
            ns / floor
        );
    }
}

/// Decodes `json` as a `T`, and drops it.
fn whole<T: serde::de::DeserializeOwned>(json: &str) {
    let t: T = serde_json::from_str(json).expect("decodes");
    std::hint::black_box(t);
}

fn decode_cost(deployment: &str) {
    use ballast::k8s::written::Written;
    let sent = governed_as_sent(deployment);
    println!("\nCPU time and allocations per decode (median of 9 batches of {REPS}):");
    decode_rows(
        "a watch event of a governed Deployment, SpreadPolicy controller",
        &sent,
        &[
            (
                "k8s-openapi Deployment, then its view (the old decode)",
                &|j| {
                    let d: Deployment = serde_json::from_str(j).expect("decodes");
                    std::hint::black_box(Cached::of(&d));
                },
            ),
            (
                "Cached<Deployment>: the parts the view reads, then the view",
                &whole::<Cached<Deployment>>,
            ),
            (
                "k8s-openapi Deployment alone (what a plain watcher decodes)",
                &whole::<Deployment>,
            ),
        ],
    );
    // The RolloutStrategy controller receives only the Deployments labelled governed.
    let sent_governed = labelled_governed(&sent);
    decode_rows(
        "the same event of a Deployment labelled governed, RolloutStrategy controller",
        &sent_governed,
        &[
            (
                "k8s-openapi Deployment alone (what a plain watcher decodes)",
                &whole::<Deployment>,
            ),
            (
                "CachedDeployment, then trimmed for its cache (its view)",
                &|j| {
                    let mut c: CachedDeployment = serde_json::from_str(j).expect("decodes");
                    c.trim();
                    std::hint::black_box(c);
                },
            ),
        ],
    );
    let replica_set = include_str!("fixtures/replicaset.json");
    decode_rows(
        "a watch event of a ReplicaSet, RolloutStrategy controller",
        replica_set,
        &[
            (
                "k8s-openapi ReplicaSet (what a plain watcher decodes)",
                &whole::<ReplicaSet>,
            ),
            ("CachedReplicaSet", &whole::<CachedReplicaSet>),
        ],
    );
    decode_rows(
        "the answer to a write of a Deployment, both controllers",
        &sent,
        &[
            (
                "k8s-openapi Deployment (the old decode)",
                &whole::<Deployment>,
            ),
            (
                "Written<Deployment>: identity and version",
                &whole::<Written<Deployment>>,
            ),
        ],
    );
}

/// What the SpreadPolicy controller's watch filter ([`Relevant`]) costs per Deployment event
/// that changes nothing a decision reads (a status update of the Deployment controller, the
/// most common event of a fan-out), beside the decode that every event pays first.
fn filter_cost(sent: &str) {
    let cached: Cached<Deployment> = serde_json::from_str(sent).expect("decodes");
    let ev = watcher::Event::Apply(cached);
    let relevant = std::cell::RefCell::new(Relevant::default());
    assert!(relevant.borrow_mut().pass(&ev, |c| c.workload.clone()));
    decode_rows(
        "\nthe same event again, unchanged, through the SpreadPolicy controller's watch filter",
        sent,
        &[
            (
                "Cached<Deployment>: the decode every event pays",
                &whole::<Cached<Deployment>>,
            ),
            ("the filter (Relevant::pass): fingerprint, look-up", &|_| {
                let passed = relevant.borrow_mut().pass(&ev, |c| c.workload.clone());
                assert!(!std::hint::black_box(passed));
            }),
        ],
    );
}

fn main() {
    let deployment = include_str!("fixtures/deployment.json");
    let governed_deployment = governed(deployment);
    let replica_set = include_str!("fixtures/replicaset.json");
    println!("bytes kept per object in each cache, {N} objects each (live heap):");
    row(
        "Deployment, as received (floor: no trim)",
        per_object::<Deployment>(deployment, |_| {}),
    );
    let spread = row(
        "Deployment, SpreadPolicy's index (its Workload view)",
        per_workload_in_index(deployment),
    );
    // The RolloutStrategy controller watches only the Deployments labelled governed: of the
    // others it keeps nothing.
    row(
        "Deployment labelled governed, RolloutStrategy's cache (its view)",
        per_object::<CachedDeployment>(&labelled_governed(deployment), CachedDeployment::trim),
    );
    let spread_governed = row(
        "Deployment with a SpreadPolicy's term, SpreadPolicy's index",
        per_workload_in_index(&governed_deployment),
    );
    row(
        "ReplicaSet, as received (floor: no trim)",
        per_object::<ReplicaSet>(replica_set, |_| {}),
    );
    let rs = row(
        "ReplicaSet, RolloutStrategy's index (by its Deployment)",
        per_replica_set_in_index(replica_set),
    );
    println!(
        "one ungoverned Deployment with one ReplicaSet, both caches: {:.1} KiB ({:.0} MiB at N = 5000)",
        (spread + rs) / 1024.0,
        (spread + rs) * 5000.0 / (1024.0 * 1024.0)
    );
    // A template write makes a second ReplicaSet (the old one stays, scaled to 0).
    let spread_bytes = spread_governed + 2.0 * rs;
    println!(
        "one Deployment a SpreadPolicy governs, with its two ReplicaSets, both caches: {:.1} KiB ({:.0} MiB at N = 5000)",
        spread_bytes / 1024.0,
        spread_bytes * 5000.0 / (1024.0 * 1024.0)
    );
    let pod_fixture = include_str!("fixtures/pod.json");
    row(
        "Pod of a Deployment, as received (floor: no trim)",
        per_pod_as_received(pod_fixture),
    );
    let pod = row(
        "Pod of a Deployment, SpreadPolicy's pod index (its PodView)",
        per_pod_in_index(pod_fixture),
    );
    println!(
        "pods of Deployments in the pod index: {pod:.0} B each ({:.1} MiB for 15000 pods, 3 per workload at N = 5000)",
        pod * 15000.0 / (1024.0 * 1024.0)
    );
    decode_cost(deployment);
    filter_cost(&governed_as_sent(deployment));
}
