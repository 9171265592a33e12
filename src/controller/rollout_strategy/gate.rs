//! How governed Deployments are held while a revision's hooks run ([`Gate`]), chosen at start by
//! `--gate` and, for `auto`, from what the API server really has:
//!
//! - `admission`: ballast's revision gate (`config/admission`, a MutatingAdmissionPolicy and its
//!   binding) pauses a governed Deployment in the very write that creates a new revision; at
//!   rest the Deployment is not paused, so `kubectl rollout restart/undo`, Argo CD and Flux see
//!   an ordinary Deployment.
//! - `pause-at-rest`: the Deployment is kept paused at rest; a new template waits for the
//!   operator, which then runs the hooks.
//! - `auto` (default): `admission` when the API server serves MutatingAdmissionPolicy v1 *and*
//!   ballast's own policy and binding are installed and say what this version expects;
//!   otherwise `pause-at-rest`, with the reason in a log line, the `ballast_gate` metric and
//!   each strategy's status. The two objects are watched: removing the policy (or installing
//!   it) switches the mode while the manager runs, and every strategy is reconciled again.
//!
//! The API alone is not trusted: a manager started without `config/` (as `make run` might be)
//! must never let a revision through unhooked because the API server *could* gate it.

use crate::api::Gate;
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
    NamedRuleWithOperations,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;

/// On a Deployment governed by a strategy: what the revision gate's cheap bindings select. The
/// policy keeps it on every Deployment it governs; the operator sets it when it adopts one.
pub const GOVERNED_LABEL: &str = "ballast.dev/governed";
/// On a RolloutStrategy: its Deployment carries [`GOVERNED_LABEL`] (or does not exist), so the
/// binding that evaluates every update of the namespace may leave this strategy out.
pub const TARGET_GOVERNED_LABEL: &str = "ballast.dev/target-governed";

/// On a governed Deployment and on its RolloutStrategy: the gate shard of the Deployment's name
/// ([`shard_of`]). The revision gate and the hold bind each shard on its own, with only the
/// strategies of that shard as params: the API server evaluates a policy once per param, each
/// time converting the Deployment (old and new) for CEL, so a write of a governed Deployment in a
/// namespace of many strategies costs as if there were about 1/[`SHARDS`] of them. Without the
/// label (not set yet, or removed), or with any other value, the bindings that take every
/// strategy of the namespace apply, as before shards; a strategy without it is a param of every
/// shard.
pub const SHARD_LABEL: &str = "ballast.dev/gate-shard";
/// Gate shards; `config/admission` has one binding of each policy per shard.
pub const SHARDS: u32 = 8;

/// The gate shard of Deployment `name`: FNV-1a (32 bits) of the name, modulo [`SHARDS`]. Stable
/// across versions: the labels of Deployments and strategies already out there depend on it.
pub fn shard_of(name: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in name.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h % SHARDS).to_string()
}

/// The revision gate as `config/admission` ships it (before kustomize's `namePrefix`).
const SHIPPED: &str = include_str!("../../../config/admission/revision_gate.yaml");
/// Name of the policy and its binding as `config/default` installs them.
pub const DEFAULT_POLICY_NAME: &str = "ballast-revision-gate";

/// `--gate`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GateFlag {
    /// The admission gate when it is served and installed, else pause-at-rest.
    #[default]
    Auto,
    /// The admission gate, without checking that it is installed.
    Admission,
    /// Keep governed Deployments paused at rest.
    PauseAtRest,
}

/// The mode in force and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mode {
    pub gate: Gate,
    pub reason: String,
}

/// What `auto` looks at.
#[derive(Clone, Debug, Default)]
pub struct Seen {
    /// The API server serves `mutatingadmissionpolicies` in admissionregistration.k8s.io/v1.
    pub served: bool,
    pub policy: Option<MutatingAdmissionPolicy>,
    /// The installed bindings of [`binding_names`], by name.
    pub bindings: BTreeMap<String, MutatingAdmissionPolicyBinding>,
}

/// The policy, and its bindings with the suffix each adds to the policy's name.
fn shipped() -> (
    MutatingAdmissionPolicy,
    Vec<(String, MutatingAdmissionPolicyBinding)>,
) {
    let mut docs = serde_yaml::Deserializer::from_str(SHIPPED);
    let policy = docs
        .next()
        .map(MutatingAdmissionPolicy::deserialize)
        .and_then(Result::ok)
        .expect("config/admission/revision_gate.yaml: the policy");
    let name = policy.metadata.name.clone().unwrap_or_default();
    let bindings = docs
        .map(|d| {
            let b = MutatingAdmissionPolicyBinding::deserialize(d)
                .expect("config/admission/revision_gate.yaml: a binding");
            let suffix = b
                .metadata
                .name
                .as_deref()
                .and_then(|n| n.strip_prefix(name.as_str()))
                .expect("a binding named after its policy")
                .to_string();
            (suffix, b)
        })
        .collect();
    (policy, bindings)
}

/// The names of the policy's bindings as installed, for the policy named `policy_name`.
pub fn binding_names(policy_name: &str) -> Vec<String> {
    shipped()
        .1
        .into_iter()
        .map(|(suffix, _)| format!("{policy_name}{suffix}"))
        .collect()
}

use serde::Deserialize as _;

/// What a binding selects, without what the API server defaults.
fn normalized(m: Option<MatchResources>) -> MatchResources {
    let mut m = m.unwrap_or_default();
    let rules = |r: Option<Vec<NamedRuleWithOperations>>| {
        let r: Vec<_> = r
            .unwrap_or_default()
            .into_iter()
            .map(|mut r| {
                r.scope = None;
                r
            })
            .collect();
        (!r.is_empty()).then_some(r)
    };
    let selector = |s: Option<LabelSelector>| {
        let mut s = s.unwrap_or_default();
        s.match_expressions = s.match_expressions.filter(|e| !e.is_empty());
        s.match_labels = s.match_labels.filter(|l| !l.is_empty());
        for e in s.match_expressions.iter_mut().flatten() {
            e.values = e.values.take().filter(|v| !v.is_empty());
        }
        Some(s)
    };
    m.resource_rules = rules(m.resource_rules);
    m.exclude_resource_rules = rules(m.exclude_resource_rules);
    m.match_policy = Some(m.match_policy.unwrap_or_else(|| "Equivalent".into()));
    m.namespace_selector = selector(m.namespace_selector);
    m.object_selector = selector(m.object_selector);
    m
}

/// Why an installed policy or its bindings are not the ones this version expects, if they are
/// not. Compares what decides the gate's effect (param kind, rules, conditions, mutation,
/// failure policy, what each binding selects), not what the API server defaults or kustomize
/// renames.
fn mismatch(
    policy_name: &str,
    policy: &MutatingAdmissionPolicy,
    bindings: &BTreeMap<String, MutatingAdmissionPolicyBinding>,
) -> Option<String> {
    let (want, want_bindings) = shipped();
    let (want, have) = (
        want.spec.unwrap_or_default(),
        policy.spec.clone().unwrap_or_default(),
    );
    let rules = |s: &k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicySpec| {
        s.match_constraints
            .as_ref()
            .and_then(|m| m.resource_rules.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|mut r| {
                r.resource_names = None;
                r.scope = None;
                r
            })
            .collect::<Vec<_>>()
    };
    if have.param_kind != want.param_kind {
        return Some(format!("policy {policy_name} has another paramKind"));
    }
    if rules(&have) != rules(&want) {
        return Some(format!("policy {policy_name} matches other resources"));
    }
    if have.match_conditions != want.match_conditions {
        return Some(format!("policy {policy_name} has other matchConditions"));
    }
    if have.mutations != want.mutations {
        return Some(format!("policy {policy_name} has other mutations"));
    }
    if have.failure_policy.as_deref().unwrap_or("Fail") != "Fail" {
        return Some(format!("policy {policy_name} does not fail closed"));
    }
    for (suffix, want_binding) in want_bindings {
        let name = format!("{policy_name}{suffix}");
        let Some(binding) = bindings.get(&name) else {
            return Some(format!("binding {name} is missing"));
        };
        let (want_b, have_b) = (
            want_binding.spec.unwrap_or_default(),
            binding.spec.clone().unwrap_or_default(),
        );
        if have_b.policy_name.as_deref() != Some(policy_name) {
            return Some(format!("binding {name} binds another policy"));
        }
        if have_b.param_ref != want_b.param_ref {
            return Some(format!("binding {name} selects other RolloutStrategies"));
        }
        if normalized(have_b.match_resources) != normalized(want_b.match_resources) {
            return Some(format!("binding {name} matches other Deployment writes"));
        }
    }
    None
}

/// The mode `flag` gives with what the API server has. Pure.
pub fn decide(flag: GateFlag, policy_name: &str, seen: &Seen) -> Mode {
    match flag {
        GateFlag::Admission => Mode {
            gate: Gate::Admission,
            reason: "--gate=admission".into(),
        },
        GateFlag::PauseAtRest => Mode {
            gate: Gate::PauseAtRest,
            reason: "--gate=pause-at-rest".into(),
        },
        GateFlag::Auto => {
            let fallback = |why: String| Mode {
                gate: Gate::PauseAtRest,
                reason: format!("{why}: governed Deployments are kept paused at rest"),
            };
            if !seen.served {
                return fallback(
                    "the API server does not serve MutatingAdmissionPolicy (admissionregistration.k8s.io/v1)".into(),
                );
            }
            let Some(p) = &seen.policy else {
                return fallback(format!(
                    "the revision gate (MutatingAdmissionPolicy {policy_name} and its bindings, from config/admission) is not installed"
                ));
            };
            if p.metadata.deletion_timestamp.is_some()
                || seen
                    .bindings
                    .values()
                    .any(|b| b.metadata.deletion_timestamp.is_some())
            {
                return fallback(format!("the revision gate {policy_name} is being deleted"));
            }
            match mismatch(policy_name, p, &seen.bindings) {
                Some(why) => fallback(format!(
                    "{why} than this version of ballast installs (config/admission)"
                )),
                None => Mode {
                    gate: Gate::Admission,
                    reason: format!("the revision gate {policy_name} is installed"),
                },
            }
        }
    }
}

/// Whether the API server serves MutatingAdmissionPolicy v1.
async fn served(client: &Client) -> Result<bool, kube::Error> {
    match client
        .list_api_group_resources("admissionregistration.k8s.io/v1")
        .await
    {
        Ok(list) => Ok(list
            .resources
            .iter()
            .any(|r| r.name == "mutatingadmissionpolicies")),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e),
    }
}

/// The mode in force, shared with the controller; see the module docs.
#[derive(Clone)]
pub struct Gates {
    rx: watch::Receiver<Mode>,
}

impl Gates {
    /// A fixed mode (tests, and `--gate=admission|pause-at-rest`).
    pub fn fixed(mode: Mode) -> Self {
        let (tx, rx) = watch::channel(mode);
        // Nothing will change it; the sender may go.
        drop(tx);
        Self { rx }
    }

    /// Detects the mode for `flag` now (a few reads for `auto`), and for `auto` keeps it up to
    /// date by watching the policy and its binding until `shutdown`.
    pub async fn start(
        client: &Client,
        flag: GateFlag,
        policy_name: &str,
        shutdown: crate::controller::ShutdownSignal,
    ) -> Result<Self, kube::Error> {
        if flag != GateFlag::Auto {
            let mode = decide(flag, policy_name, &Seen::default());
            tracing::info!(gate = mode.gate.as_str(), reason = %mode.reason, "rollout gate");
            return Ok(Self::fixed(mode));
        }
        let mut seen = Seen {
            served: served(client).await?,
            ..Default::default()
        };
        let mut mode = None;
        if seen.served {
            let policies: Api<MutatingAdmissionPolicy> = Api::all(client.clone());
            let bindings: Api<MutatingAdmissionPolicyBinding> = Api::all(client.clone());
            let names = binding_names(policy_name);
            let read = futures::try_join!(
                policies.get_opt(policy_name),
                futures::future::try_join_all(names.iter().map(|n| bindings.get_opt(n)))
            );
            match read {
                Ok((p, b)) => {
                    seen.policy = p;
                    seen.bindings = names
                        .into_iter()
                        .zip(b)
                        .filter_map(|(n, b)| Some((n, b?)))
                        .collect();
                }
                // Not allowed to read them (an older config/rbac): unknown is not installed.
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    mode = Some(Mode {
                        gate: Gate::PauseAtRest,
                        reason: format!(
                            "cannot read the revision gate {policy_name} ({}): governed Deployments are kept paused at rest",
                            s.message
                        ),
                    })
                }
                Err(e) => return Err(e),
            }
        }
        let followed = seen.served && mode.is_none();
        let mode = mode.unwrap_or_else(|| decide(flag, policy_name, &seen));
        log(&mode);
        let (tx, rx) = watch::channel(mode);
        if followed {
            tokio::spawn(follow(
                client.clone(),
                policy_name.to_string(),
                seen,
                Arc::new(tx),
                shutdown,
            ));
        }
        Ok(Self { rx })
    }

    pub fn current(&self) -> Mode {
        self.rx.borrow().clone()
    }

    /// A stream that yields each time the mode changes.
    pub fn changes(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        futures::stream::unfold(self.rx.clone(), |mut rx| async move {
            rx.changed().await.ok()?;
            Some(((), rx))
        })
    }
}

fn log(mode: &Mode) {
    match mode.gate {
        Gate::Admission => {
            tracing::info!(gate = mode.gate.as_str(), reason = %mode.reason, "rollout gate: admission")
        }
        Gate::PauseAtRest => {
            tracing::warn!(gate = mode.gate.as_str(), reason = %mode.reason, "rollout gate: falling back to pause-at-rest")
        }
    }
}

/// Watches the policy and its bindings (by name) and publishes each change of mode.
async fn follow(
    client: Client,
    name: String,
    mut seen: Seen,
    tx: Arc<watch::Sender<Mode>>,
    shutdown: crate::controller::ShutdownSignal,
) {
    let by_name = |n: &str| watcher::Config::default().fields(&format!("metadata.name={n}"));
    let policies = watcher(
        Api::<MutatingAdmissionPolicy>::all(client.clone()),
        by_name(&name),
    )
    .default_backoff()
    .map(|e| e.map(Change::Policy))
    .boxed();
    let bindings = binding_names(&name).into_iter().map(|n| {
        watcher(
            Api::<MutatingAdmissionPolicyBinding>::all(client.clone()),
            by_name(&n),
        )
        .default_backoff()
        .map(move |e| e.map(|e| Change::Binding(n.clone(), e)))
        .boxed()
    });
    let all = futures::stream::select_all(std::iter::once(policies).chain(bindings));
    let mut events = std::pin::pin!(all.take_until(shutdown));
    let mut lists = Lists::default();
    while let Some(ev) = events.next().await {
        // A (re)list of one object is folded in once it is complete, and the mode decided only
        // while no list is under way: until then the object would read as missing, and the
        // mode flip to pause-at-rest and back.
        match ev {
            Ok(Change::Policy(e)) => lists.fold(String::new(), &mut seen.policy, e),
            Ok(Change::Binding(n, e)) => {
                let mut slot = seen.bindings.remove(&n);
                lists.fold(n.clone(), &mut slot, e);
                if let Some(b) = slot {
                    seen.bindings.insert(n, b);
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "watching the revision gate");
                continue;
            }
        }
        if lists.under_way() {
            continue;
        }
        let mode = decide(GateFlag::Auto, &name, &seen);
        tx.send_if_modified(|m| {
            if *m == mode {
                return false;
            }
            log(&mode);
            *m = mode;
            true
        });
    }
}

enum Change {
    Policy(watcher::Event<MutatingAdmissionPolicy>),
    Binding(String, watcher::Event<MutatingAdmissionPolicyBinding>),
}

/// The (re)lists under way, by object (`""` for the policy, else the binding's name): whether
/// each has named its object yet.
#[derive(Default)]
struct Lists(BTreeMap<String, bool>);

impl Lists {
    /// Folds one watch event of the single named object `key` into what is known of it (`slot`):
    /// a list replaces it only when complete, with nothing if it did not name it.
    fn fold<K>(&mut self, key: String, slot: &mut Option<K>, ev: watcher::Event<K>) {
        match ev {
            watcher::Event::Apply(o) => *slot = Some(o),
            watcher::Event::Delete(_) => *slot = None,
            watcher::Event::Init => {
                self.0.insert(key, false);
            }
            watcher::Event::InitApply(o) => {
                *slot = Some(o);
                self.0.insert(key, true);
            }
            watcher::Event::InitDone => {
                if self.0.remove(&key) == Some(false) {
                    *slot = None;
                }
            }
        }
    }

    fn under_way(&self) -> bool {
        !self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::admissionregistration::v1::MutatingAdmissionPolicyBindingSpec;

    fn installed() -> Seen {
        let (mut p, bindings) = shipped();
        p.metadata.name = Some(DEFAULT_POLICY_NAME.into());
        let bindings = bindings
            .into_iter()
            .map(|(suffix, mut b)| {
                let name = format!("{DEFAULT_POLICY_NAME}{suffix}");
                b.metadata.name = Some(name.clone());
                if let Some(s) = b.spec.as_mut() {
                    s.policy_name = Some(DEFAULT_POLICY_NAME.into());
                }
                (name, b)
            })
            .collect();
        Seen {
            served: true,
            policy: Some(p),
            bindings,
        }
    }

    fn binding<'a>(s: &'a mut Seen, suffix: &str) -> &'a mut MutatingAdmissionPolicyBindingSpec {
        s.bindings
            .get_mut(&format!("{DEFAULT_POLICY_NAME}{suffix}"))
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
    }

    #[test]
    fn the_gate_shard_of_a_name_is_fnv_1a_and_stays_so() {
        // Deployments and strategies out there carry these: a change would part them.
        let shards: Vec<String> = ["", "a", "web", "h-00", "r-0"]
            .iter()
            .map(|n| shard_of(n))
            .collect();
        assert_eq!(shards, ["5", "4", "1", "6", "0"]);
    }

    /// The `ballast.dev/gate-shard` values of a selector's expressions with `operator`.
    fn shard_values(selector: &serde_yaml::Value, operator: &str) -> Option<Vec<String>> {
        selector["matchExpressions"]
            .as_sequence()?
            .iter()
            .find(|e| e["key"] == SHARD_LABEL && e["operator"] == operator)
            .map(|e| {
                e["values"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
                    .collect()
            })
    }

    /// Both policies' bindings of governed Deployments cover every gate shard, each with its own
    /// strategies and the unlabelled ones, and a Deployment of no shard with every strategy: a
    /// revision of a governed Deployment is never evaluated without its strategy.
    #[test]
    fn every_gate_shard_is_bound_with_its_strategies_and_no_shard_with_all() {
        let all: Vec<String> = (0..SHARDS).map(|i| i.to_string()).collect();
        for file in [
            SHIPPED,
            include_str!("../../../config/admission/revision_hold.yaml"),
        ] {
            let bindings: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(file)
                .map(|d| serde_yaml::Value::deserialize(d).unwrap())
                .filter(|d| d["kind"].as_str().is_some_and(|k| k.ends_with("Binding")))
                .collect();
            let of_governed = |b: &&serde_yaml::Value| {
                b["spec"]["matchResources"]["objectSelector"]["matchExpressions"]
                    .as_sequence()
                    .is_some_and(|e| {
                        e.iter().any(|e| {
                            e["key"] == GOVERNED_LABEL && e["operator"] == "Exists"
                                || e["key"]
                                    == crate::controller::rollout_strategy::machine::PHASE_LABEL
                        })
                    })
            };
            let governed: Vec<&serde_yaml::Value> = bindings.iter().filter(of_governed).collect();
            let object = |b: &serde_yaml::Value, op| {
                shard_values(&b["spec"]["matchResources"]["objectSelector"], op)
            };
            let params =
                |b: &serde_yaml::Value, op| shard_values(&b["spec"]["paramRef"]["selector"], op);
            // No shard (or another value): every strategy.
            let fallback: Vec<_> = governed
                .iter()
                .filter(|b| object(b, "NotIn").as_ref() == Some(&all))
                .collect();
            assert_eq!(fallback.len(), 1, "{file}");
            assert_eq!(
                fallback[0]["spec"]["paramRef"]["selector"],
                serde_yaml::Value::Mapping(Default::default())
            );
            for i in &all {
                let others: Vec<String> = all.iter().filter(|j| *j != i).cloned().collect();
                let of_shard: Vec<_> = governed
                    .iter()
                    .filter(|b| object(b, "In") == Some(vec![i.clone()]))
                    .collect();
                assert_eq!(of_shard.len(), 1, "shard {i}");
                assert_eq!(params(of_shard[0], "NotIn"), Some(others), "shard {i}");
            }
            assert_eq!(governed.len(), all.len() + 1);
        }
    }

    #[test]
    fn auto_uses_the_gate_only_when_served_and_installed_as_shipped() {
        let m = decide(GateFlag::Auto, DEFAULT_POLICY_NAME, &installed());
        assert_eq!(m.gate, Gate::Admission, "{}", m.reason);

        let m = decide(
            GateFlag::Auto,
            DEFAULT_POLICY_NAME,
            &Seen {
                served: false,
                ..installed()
            },
        );
        assert_eq!(m.gate, Gate::PauseAtRest);
        assert!(m.reason.contains("does not serve"), "{}", m.reason);

        let mut s = installed();
        s.policy = None;
        let m = decide(GateFlag::Auto, DEFAULT_POLICY_NAME, &s);
        assert_eq!(m.gate, Gate::PauseAtRest);
        assert!(m.reason.contains("not installed"), "{}", m.reason);

        let names = binding_names(DEFAULT_POLICY_NAME);
        assert_eq!(
            names[..3],
            [
                "ballast-revision-gate",
                "ballast-revision-gate-governed",
                "ballast-revision-gate-adopting"
            ]
        );
        let shards: Vec<String> = (0..SHARDS)
            .map(|i| format!("ballast-revision-gate-shard-{i}"))
            .collect();
        assert_eq!(names[3..], shards);
        for name in binding_names(DEFAULT_POLICY_NAME) {
            let mut s = installed();
            s.bindings.remove(&name);
            let m = decide(GateFlag::Auto, DEFAULT_POLICY_NAME, &s);
            assert_eq!(m.gate, Gate::PauseAtRest);
            assert!(
                m.reason.contains(&format!("{name} is missing")),
                "{}",
                m.reason
            );
        }
    }

    #[test]
    fn auto_falls_back_when_the_installed_gate_says_something_else() {
        let mut s = installed();
        s.policy
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
            .failure_policy = Some("Ignore".into());
        assert_eq!(
            decide(GateFlag::Auto, DEFAULT_POLICY_NAME, &s).gate,
            Gate::PauseAtRest
        );

        let mut s = installed();
        s.policy
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
            .match_conditions = None;
        let m = decide(GateFlag::Auto, DEFAULT_POLICY_NAME, &s);
        assert!(m.reason.contains("matchConditions"), "{}", m.reason);

        let mut s = installed();
        binding(&mut s, "-governed").param_ref = None;
        assert_eq!(
            decide(GateFlag::Auto, DEFAULT_POLICY_NAME, &s).gate,
            Gate::PauseAtRest
        );

        // A binding that selects fewer writes (here: only one namespace) leaves some unhooked.
        let mut s = installed();
        binding(&mut s, "-adopting")
            .match_resources
            .as_mut()
            .unwrap()
            .namespace_selector = Some(LabelSelector {
            match_labels: Some([("team".to_string(), "a".to_string())].into()),
            ..Default::default()
        });
        let m = decide(GateFlag::Auto, DEFAULT_POLICY_NAME, &s);
        assert!(
            m.reason.contains("matches other Deployment writes"),
            "{}",
            m.reason
        );

        // What the API server defaults does not count as a difference.
        let mut s = installed();
        for r in s
            .policy
            .as_mut()
            .unwrap()
            .spec
            .as_mut()
            .unwrap()
            .match_constraints
            .as_mut()
            .unwrap()
            .resource_rules
            .as_mut()
            .unwrap()
        {
            r.scope = Some("*".into());
        }
        let m = binding(&mut s, "-governed")
            .match_resources
            .as_mut()
            .unwrap();
        m.match_policy = Some("Equivalent".into());
        m.namespace_selector = Some(LabelSelector::default());
        for r in m.resource_rules.iter_mut().flatten() {
            r.scope = Some("*".into());
        }
        let m = decide(GateFlag::Auto, DEFAULT_POLICY_NAME, &s);
        assert_eq!(m.gate, Gate::Admission, "{}", m.reason);
    }

    /// `auto` reads the policy and each binding by name: the ClusterRole must name them all, or
    /// the read is refused and `auto` falls back for good.
    #[test]
    fn the_manager_may_read_the_policy_and_every_binding() {
        let role: serde_yaml::Value =
            serde_yaml::from_str(include_str!("../../../config/rbac/role.yaml")).unwrap();
        let names = |resource: &str| -> Vec<String> {
            role["rules"]
                .as_sequence()
                .unwrap()
                .iter()
                .filter(|r| {
                    r["resources"]
                        .as_sequence()
                        .is_some_and(|rs| rs.iter().any(|x| x.as_str() == Some(resource)))
                })
                .flat_map(|r| {
                    r["resourceNames"]
                        .as_sequence()
                        .cloned()
                        .unwrap_or_default()
                })
                .filter_map(|n| n.as_str().map(String::from))
                .collect()
        };
        assert_eq!(names("mutatingadmissionpolicies"), [DEFAULT_POLICY_NAME]);
        let readable = names("mutatingadmissionpolicybindings");
        for b in binding_names(DEFAULT_POLICY_NAME) {
            assert!(
                readable.contains(&b),
                "config/rbac/role.yaml: {b} in {readable:?}"
            );
        }
    }

    #[test]
    fn a_relist_replaces_the_object_only_once_complete() {
        let mut lists = Lists::default();
        let mut slot = Some(1);
        lists.fold("b".into(), &mut slot, watcher::Event::Init);
        assert_eq!(slot, Some(1), "kept while the list runs");
        assert!(lists.under_way());
        lists.fold("b".into(), &mut slot, watcher::Event::InitApply(2));
        lists.fold("b".into(), &mut slot, watcher::Event::InitDone);
        assert_eq!(slot, Some(2));
        assert!(!lists.under_way());
        // A list that does not name it: gone, once the list is done.
        lists.fold("b".into(), &mut slot, watcher::Event::Init);
        assert_eq!(slot, Some(2));
        lists.fold("b".into(), &mut slot, watcher::Event::InitDone);
        assert_eq!(slot, None);
    }

    #[test]
    fn fixed_flags_are_obeyed() {
        assert_eq!(
            decide(GateFlag::PauseAtRest, DEFAULT_POLICY_NAME, &installed()).gate,
            Gate::PauseAtRest
        );
        assert_eq!(
            decide(GateFlag::Admission, DEFAULT_POLICY_NAME, &Seen::default()).gate,
            Gate::Admission
        );
    }
}
