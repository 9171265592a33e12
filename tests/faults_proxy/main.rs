//! The fault-injection suite, proxy side (issue 8, F1–F4): the real operator binary against the
//! local control plane through the fault proxy (`tests/support/proxy.rs`), which crashes it
//! right after a write, drops a write's response, delays its watch events or cuts it off from
//! the API server. Each scenario records its row of the fault table
//! (`target/fault-results/`, printed by `hack/fault-table.sh`) before it asserts.
//!
//! F1 and F2 sweep the writes of a rollout: the first run of each case is undisturbed and
//! counts its writes (K); then one run per sampled N in 1..=K. CI samples N (see [`sample`]);
//! `BALLAST_FAULTS_FULL=1` runs every N, `BALLAST_FAULTS_STRIDE` / `BALLAST_FAULTS_OFFSET`
//! choose another sample, `BALLAST_FAULTS_PARALLEL` how many runs go at once (3), and
//! `BALLAST_FAULTS_DEBUG=<dir>` writes each run's proxy record and operator log there.

#[path = "../support/mod.rs"]
mod support;

mod lost;
mod monitor;
mod spread;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use lost::{Case, Fault, Outcome};
use std::time::{Duration, Instant};
use support::faults::{Row, record};
use support::proxy::FaultProxy;
use support::{Operator, TestNamespace, cluster, wait_until};

/// One scenario at a time: their timings (hooks, pacing, Lease expiry) are the point, and
/// each sweep already runs several operators at once.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Whether to run every N of a sweep instead of a sample.
fn full() -> bool {
    std::env::var("BALLAST_FAULTS_FULL").is_ok_and(|v| v == "1")
}

/// Runs at once in a sweep (each has its own namespace, proxy, operator and Lease).
fn parallel() -> usize {
    std::env::var("BALLAST_FAULTS_PARALLEL")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// Where a strided sample starts (0..stride): `BALLAST_FAULTS_OFFSET`, else it moves on every
/// day, so that successive CI runs cover every N between them.
fn offset(stride: u64) -> u64 {
    std::env::var("BALLAST_FAULTS_OFFSET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
                / 86_400
        })
        % stride.max(1)
}

/// The N of a sweep over K writes: every one when `full`, else every `stride`th from
/// `1 + offset`, plus the first and the last write.
fn sample(k: u64, stride: u64, offset: u64) -> Vec<u64> {
    let mut ns: Vec<u64> = if full() {
        (1..=k).collect()
    } else {
        (1 + offset..=k).step_by(stride.max(1) as usize).collect()
    };
    for n in [1, k] {
        if n > 0 && !ns.contains(&n) {
            ns.push(n);
        }
    }
    ns.sort();
    ns
}

/// What a sweep did, for the row and the failure message.
struct Sweep {
    runs: u32,
    passed: u32,
    notes: Vec<String>,
    failures: Vec<String>,
}

/// Measures K with an undisturbed run of `case`, then runs `fault(n)` for the sampled N.
async fn sweep(case: &Case, fault: fn(u64) -> Fault, stride: u64, prefix: &str) -> Sweep {
    let started = Instant::now();
    let base = lost::run(case, Fault::None, prefix).await;
    let k = base.writes;
    let stride = std::env::var("BALLAST_FAULTS_STRIDE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(stride);
    let offset = offset(stride);
    let ns = sample(k, stride, offset);
    eprintln!(
        "{}: undisturbed run: {k} writes in {:?}; faults at N = {ns:?}",
        case.name, base.elapsed
    );
    let mut out = Sweep {
        runs: 1,
        passed: u32::from(base.passed()),
        notes: vec![],
        failures: base
            .failures
            .iter()
            .map(|f| format!("{} undisturbed: {f}", case.name))
            .collect(),
    };
    let outcomes: Vec<Outcome> = futures::stream::iter(ns.iter().map(|n| {
        let case = case.clone();
        let fault = fault(*n);
        async move { lost::run(&case, fault, prefix).await }
    }))
    .buffer_unordered(parallel())
    .collect()
    .await;
    let mut extra_approvals = vec![];
    let mut overshoots = base.overshoots.len();
    let mut missed = vec![];
    for o in &outcomes {
        out.runs += 1;
        out.passed += u32::from(o.passed());
        let n = match o.fault {
            Fault::KillAfter(n) | Fault::DropResponseOf(n) => n,
            _ => 0,
        };
        eprintln!(
            "{} {:?}: {} in {:?}, {} restart(s), {} approval(s), {} writes{}",
            case.name,
            o.fault,
            if o.passed() { "passed" } else { "FAILED" },
            o.elapsed,
            o.restarts,
            o.approvals,
            o.writes,
            if o.hit { "" } else { " (fault not reached)" }
        );
        for f in &o.failures {
            out.failures
                .push(format!("{} {:?}: {f}", case.name, o.fault));
        }
        overshoots += usize::from(!o.overshoots.is_empty());
        if !o.overshoots.is_empty() {
            eprintln!("  overshoot: {:?}", o.overshoots);
        }
        if o.approvals > 1 {
            extra_approvals.push(n);
        }
        if !o.hit {
            missed.push(n);
        }
    }
    out.notes.push(format!(
        "{}: K={k}, N={}{}",
        case.name,
        if full() || stride <= 1 {
            "every write".to_string()
        } else {
            format!(
                "1, {}..{k} step {stride}, {k} (BALLAST_FAULTS_OFFSET={offset}; BALLAST_FAULTS_FULL=1 runs every N)",
                1 + offset
            )
        },
        if missed.is_empty() {
            String::new()
        } else {
            format!(" (N={missed:?} past the run's end)")
        }
    ));
    if !extra_approvals.is_empty() {
        out.notes.push(format!(
            "{}: approval asked again after the fault at N={extra_approvals:?}",
            case.name
        ));
    }
    if overshoots > 0 {
        out.notes.push(format!(
            "{}: in {overshoots} run(s) the Deployment controller got past a mid point by more than the surge before the pause landed (documented; not failed)",
            case.name
        ));
    }
    eprintln!("{}: sweep took {:?}", case.name, started.elapsed());
    out
}

const NOTHING_LOST: &str = "nothing lost: one Job created per (hook, revision, attempt), one success per hook, \
never two hook pods running, no new pod before pre hooks pass, mid hooks at their point and the rollout \
held while they run, post only after complete, user's template and replicas, unpaused once the strategy goes";

/// Strides for CI (a full sweep sets `BALLAST_FAULTS_FULL=1`). Measured with 3 runs at once on
/// a 2-core machine shared with other work: every N of the rolling case (K ≈ 45) takes about
/// 6 minutes and of the Recreate case (K ≈ 22) about 2, per fault; with stride 4, F1 takes
/// about 3 minutes and F2 about 2.5 (a run that wedges adds its 150 s bound).
const ROLLING_STRIDE: u64 = 4;
const RECREATE_STRIDE: u64 = 4;

/// Both sweeps, plus `extra` runs made before, into one row.
async fn sweep_both(
    id: &str,
    fault: &str,
    f: fn(u64) -> Fault,
    prefix: &str,
    extra: Vec<(String, Outcome)>,
) {
    let mut runs = 0;
    let mut passed = 0;
    let mut notes = vec![];
    let mut failures = vec![];
    for (what, o) in &extra {
        runs += 1;
        passed += u32::from(o.passed());
        notes.push(format!(
            "{what}: {}",
            if o.passed() { "passed" } else { "FAILED" }
        ));
        failures.extend(o.failures.iter().map(|f| format!("{what}: {f}")));
    }
    for (case, stride) in [
        (Case::rolling(), ROLLING_STRIDE),
        (Case::recreate(), RECREATE_STRIDE),
    ] {
        let s = sweep(&case, f, stride, prefix).await;
        runs += s.runs;
        passed += s.passed;
        notes.extend(s.notes);
        failures.extend(s.failures);
    }
    let checked = format!("{NOTHING_LOST}; {}", notes.join("; "));
    record(&Row {
        id,
        fault,
        runs,
        passed,
        checked: &checked,
    });
    assert!(failures.is_empty(), "{id}: {failures:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f1_sigkill_after_any_write_of_a_rollout_loses_nothing() {
    let _serial = SERIAL.lock().await;
    // Aimed: the approval annotation is consumed by a write of its own, before the status
    // records the approval.
    let aimed = lost::run(&Case::rolling(), Fault::KillAfterStrategyWrite, "f1-kill").await;
    sweep_both(
        "F1",
        "SIGKILL right after write N of a rollout (pre → mid smoke + approval → post; Recreate with a mid hook), then a new operator",
        Fault::KillAfter,
        "f1-kill",
        vec![(
            "SIGKILL right after the approval annotation is removed".to_string(),
            aimed,
        )],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f2_a_lost_response_of_any_write_loses_nothing() {
    let _serial = SERIAL.lock().await;
    sweep_both(
        "F2",
        "write N of a rollout applied, its response dropped (connection closed)",
        Fault::DropResponseOf,
        "f2-drop",
        vec![],
    )
    .await;
}

/// The SpreadPolicy half of F3: v1 → v2 over `n` workloads changed while no operator ran; the
/// new operator gets every watch event `delay` late. Returns the failures and what was seen.
async fn f3_spread(delay: Duration) -> (Vec<String>, String) {
    const N: usize = 4;
    let c = cluster().await;
    let ns = TestNamespace::new(&c, "f3-spol").await;
    let proxy = FaultProxy::start(&c);
    let kc = proxy.operator_kubeconfig(&c);
    let lease = |n: u32| format!("ballast-{}-{n}", ns.name);
    let mut op = Operator::start_with_kubeconfig(&kc, &ns.name, &lease(0), &[]);
    spread::create_workloads(&c.client, &ns.name, N).await;
    spread::apply_policy(&c.client, &ns.name, 1).await;
    spread::wait_converged(&c.client, &ns.name, N, 1, Duration::from_secs(120)).await;
    op.kill();

    let since = spread::generations(&c.client, &ns.name).await;
    let cut = proxy.log().len();
    spread::apply_policy(&c.client, &ns.name, 2).await;
    proxy.delay_watch_events(delay, Duration::from_secs(150));
    let op = Operator::start_with_kubeconfig(&kc, &ns.name, &lease(1), &[]);
    let pacing = spread::Pacing::spawn(c.client.clone(), &ns.name, since.clone());
    let converged = tokio::time::timeout(
        Duration::from_secs(180),
        spread::wait_converged(&c.client, &ns.name, N, 2, Duration::from_secs(185)),
    )
    .await;
    // Late events of the operator's own writes arrive after convergence: they must not make
    // it write again.
    tokio::time::sleep(delay + Duration::from_secs(3)).await;
    let paced = pacing.stop().await;
    let after = spread::generations(&c.client, &ns.name).await;
    drop(op);

    let mut failures = vec![];
    if converged.is_err() {
        failures.push("the workloads did not all converge to v2 within 180 s".into());
    }
    let log = proxy.log();
    let mut writes_per = vec![];
    for name in spread::names(N) {
        let changes =
            after.get(&name).copied().unwrap_or(0) - since.get(&name).copied().unwrap_or(0);
        if changes > 1 {
            failures.push(format!(
                "{name}: {changes} template changes for one policy change"
            ));
        }
        let writes = log[cut..]
            .iter()
            .filter(|e| {
                e.is_write() && e.applied() && e.path.ends_with(&format!("/deployments/{name}"))
            })
            .count();
        if writes > 1 {
            failures.push(format!("{name}: {writes} writes for one policy change"));
        }
        writes_per.push(writes);
    }
    if paced.max_in_flight > 1 {
        failures.push(format!(
            "{} workloads rolling out at once with maxConcurrent 1: {:?}",
            paced.max_in_flight, paced.widest
        ));
    }
    let seen = format!(
        "SpreadPolicy v1→v2 over {N} Deployments (maxConcurrent 1): writes per workload {writes_per:?}, at most {} rolling at once",
        paced.max_in_flight
    );
    (failures, seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f3_late_watch_events_after_a_restart_cause_no_extra_writes() {
    let _serial = SERIAL.lock().await;
    let delay = Duration::from_secs(7);
    let (mut failures, spread_seen) = f3_spread(delay).await;
    let spread_passed = failures.is_empty();
    let rollout = lost::run(
        &Case::rolling(),
        Fault::SlowWatchesAfterRestart(delay.as_millis() as u64),
        "f3-rost",
    )
    .await;
    eprintln!("F3 SpreadPolicy: {spread_seen}; failures {failures:?}");
    eprintln!("F3 rollout: {rollout:#?}");
    failures.extend(rollout.failures.iter().map(|f| format!("rollout: {f}")));
    let checked = format!(
        "events {delay:?} late for 60-150 s after a restart. {spread_seen}; ≤ 1 template change and ≤ 1 write per workload, ≤ maxConcurrent rolling. \
         Rollout ({}): nothing lost, one Job created per (hook, revision, attempt) ({} create(s) refused as already existing)",
        Case::rolling().name,
        rollout.refused_creates
    );
    record(&Row {
        id: "F3",
        fault: "watch events delayed 7 s after an operator restart",
        runs: 2,
        passed: u32::from(spread_passed) + u32::from(rollout.passed()),
        checked: &checked,
    });
    assert!(failures.is_empty(), "F3: {failures:#?}");
}

/// The holder of Lease `name` in ballast-system.
async fn lease_holder(client: &kube::Client, name: &str) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), "ballast-system");
    api.get_opt(name).await.ok()??.spec?.holder_identity
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn f4_a_partitioned_leader_writes_nothing_after_the_new_leader_starts() {
    let _serial = SERIAL.lock().await;
    const N: usize = 6;
    let partition = Duration::from_secs(40);
    let c = cluster().await;
    let ns = TestNamespace::new(&c, "f4-leader").await;
    let (pa, pb) = (FaultProxy::start(&c), FaultProxy::start(&c));
    let lease = format!("ballast-{}", ns.name);
    let mut a = Operator::start_with_kubeconfig(&pa.operator_kubeconfig(&c), &ns.name, &lease, &[]);
    let a_id = format!("-{}", a.pid());
    wait_until("A leads", Duration::from_secs(30), || async {
        lease_holder(&c.client, &lease)
            .await
            .filter(|h| h.ends_with(&a_id))
    })
    .await;
    let mut b = Operator::start_with_kubeconfig(&pb.operator_kubeconfig(&c), &ns.name, &lease, &[]);
    spread::create_workloads(&c.client, &ns.name, N).await;
    spread::apply_policy(&c.client, &ns.name, 1).await;
    spread::wait_converged(&c.client, &ns.name, N, 1, Duration::from_secs(120)).await;
    assert!(
        pb.writes().iter().all(|w| !w.applied()),
        "the standby wrote nothing while A led"
    );

    // Cut A off, and give the cluster work: v2 over every workload, paced one by one, so that
    // work is left when A comes back.
    pa.blackhole(true);
    let cut_at = std::time::Instant::now();
    spread::apply_policy(&c.client, &ns.name, 2).await;
    tokio::time::sleep(partition).await;
    pa.blackhole(false);
    let b_id = format!("-{}", b.pid());
    let holder = lease_holder(&c.client, &lease).await;
    let converged = tokio::time::timeout(
        Duration::from_secs(150),
        spread::wait_converged(&c.client, &ns.name, N, 2, Duration::from_secs(155)),
    )
    .await;
    // Long enough for A to notice, or to act on what it missed.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let a_exited = !a.is_running();
    let a_log = a.logs();
    a.kill();
    b.kill();

    let mut failures = vec![];
    let first_b = pb.writes().into_iter().find(|w| w.applied());
    let late_a: Vec<String> = match &first_b {
        Some(fb) => {
            let t = fb.answered.unwrap();
            pa.writes()
                .iter()
                .filter(|w| w.applied() && w.sent.is_some_and(|s| s > t))
                .map(|w| format!("{} {} {:?}", w.method, w.path, w.status))
                .collect()
        }
        None => {
            failures.push("B never wrote: it did not take over".into());
            vec![]
        }
    };
    if !late_a.is_empty() {
        failures.push(format!(
            "the old leader wrote after the new leader's first write: {late_a:?}"
        ));
    }
    if !holder.as_deref().is_some_and(|h| h.ends_with(&b_id)) {
        failures.push(format!(
            "B does not hold the Lease after the partition: {holder:?}"
        ));
    }
    if converged.is_err() {
        failures.push("the workloads did not converge to v2 after the takeover".into());
    }
    let takeover = first_b
        .as_ref()
        .map(|w| w.answered.unwrap().saturating_duration_since(cut_at));
    let checked = format!(
        "two managers on one Lease, the leader blackholed {partition:?} while a SpreadPolicy change over {N} Deployments was pending: \
         B's first write {takeover:?} into the partition; {} write(s) by A after it; A {} afterwards; the work finished under B",
        late_a.len(),
        if a_exited { "exited" } else { "kept running" }
    );
    record(&Row {
        id: "F4",
        fault: "two managers; the leader blackholed 40 s",
        runs: 1,
        passed: u32::from(failures.is_empty()),
        checked: &checked,
    });
    assert!(
        failures.is_empty(),
        "F4: {failures:#?}\nA's log tail:\n{}",
        support::rollout::tail(&a_log, 30)
    );
}
