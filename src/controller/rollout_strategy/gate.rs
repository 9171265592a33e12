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
    MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding,
};
use kube::{
    Api, Client,
    runtime::{WatchStreamExt, watcher},
};
use std::sync::Arc;
use tokio::sync::watch;

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
    pub binding: Option<MutatingAdmissionPolicyBinding>,
}

fn shipped() -> (MutatingAdmissionPolicy, MutatingAdmissionPolicyBinding) {
    let mut docs = serde_yaml::Deserializer::from_str(SHIPPED);
    let policy = docs
        .next()
        .map(MutatingAdmissionPolicy::deserialize)
        .and_then(Result::ok)
        .expect("config/admission/revision_gate.yaml: the policy");
    let binding = docs
        .next()
        .map(MutatingAdmissionPolicyBinding::deserialize)
        .and_then(Result::ok)
        .expect("config/admission/revision_gate.yaml: the binding");
    (policy, binding)
}

use serde::Deserialize as _;

/// Why an installed policy or binding is not the one this version expects, if it is not.
/// Compares what decides the gate's effect (param kind, rules, conditions, mutation, failure
/// policy, param selection), not what the API server defaults or kustomize renames.
fn mismatch(
    policy_name: &str,
    policy: &MutatingAdmissionPolicy,
    binding: &MutatingAdmissionPolicyBinding,
) -> Option<String> {
    let (want, want_binding) = shipped();
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
    let (want_b, have_b) = (
        want_binding.spec.unwrap_or_default(),
        binding.spec.clone().unwrap_or_default(),
    );
    if have_b.policy_name.as_deref() != Some(policy_name) {
        return Some(format!("binding {policy_name} binds another policy"));
    }
    if have_b.param_ref != want_b.param_ref {
        return Some(format!(
            "binding {policy_name} selects other params than every RolloutStrategy of the Deployment's namespace"
        ));
    }
    let narrowed = have_b.match_resources.as_ref().is_some_and(|m| {
        m.resource_rules.as_ref().is_some_and(|r| !r.is_empty())
            || m.object_selector
                .as_ref()
                .is_some_and(|s| s != &Default::default())
            || m.namespace_selector
                .as_ref()
                .is_some_and(|s| s != &Default::default())
    });
    if narrowed {
        return Some(format!(
            "binding {policy_name} narrows what the policy matches"
        ));
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
            let (Some(p), Some(b)) = (&seen.policy, &seen.binding) else {
                return fallback(format!(
                    "the revision gate (MutatingAdmissionPolicy and binding {policy_name}, from config/admission) is not installed"
                ));
            };
            if p.metadata.deletion_timestamp.is_some() || b.metadata.deletion_timestamp.is_some() {
                return fallback(format!("the revision gate {policy_name} is being deleted"));
            }
            match mismatch(policy_name, p, b) {
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
            match futures::try_join!(policies.get_opt(policy_name), bindings.get_opt(policy_name)) {
                Ok((p, b)) => (seen.policy, seen.binding) = (p, b),
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

/// Watches the policy and the binding (by name) and publishes each change of mode.
async fn follow(
    client: Client,
    name: String,
    mut seen: Seen,
    tx: Arc<watch::Sender<Mode>>,
    shutdown: crate::controller::ShutdownSignal,
) {
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let policies = watcher(
        Api::<MutatingAdmissionPolicy>::all(client.clone()),
        cfg.clone(),
    )
    .default_backoff()
    .map(|e| e.map(Change::Policy));
    let bindings = watcher(Api::<MutatingAdmissionPolicyBinding>::all(client), cfg)
        .default_backoff()
        .map(|e| e.map(Change::Binding));
    let mut events =
        std::pin::pin!(futures::stream::select(policies, bindings).take_until(shutdown));
    while let Some(ev) = events.next().await {
        match ev {
            Ok(Change::Policy(e)) => apply(&mut seen.policy, e),
            Ok(Change::Binding(e)) => apply(&mut seen.binding, e),
            Err(e) => {
                tracing::debug!(error = %e, "watching the revision gate");
                continue;
            }
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
    Binding(watcher::Event<MutatingAdmissionPolicyBinding>),
}

/// Folds one watch event of a single named object into what is known of it.
fn apply<K>(slot: &mut Option<K>, ev: watcher::Event<K>) {
    match ev {
        watcher::Event::Apply(o) | watcher::Event::InitApply(o) => *slot = Some(o),
        watcher::Event::Delete(_) => *slot = None,
        // A relist: what it does not name is gone.
        watcher::Event::Init => *slot = None,
        watcher::Event::InitDone => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn installed() -> Seen {
        let (mut p, mut b) = shipped();
        p.metadata.name = Some(DEFAULT_POLICY_NAME.into());
        b.metadata.name = Some(DEFAULT_POLICY_NAME.into());
        if let Some(s) = b.spec.as_mut() {
            s.policy_name = Some(DEFAULT_POLICY_NAME.into());
        }
        Seen {
            served: true,
            policy: Some(p),
            binding: Some(b),
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
        s.binding = None;
        let m = decide(GateFlag::Auto, DEFAULT_POLICY_NAME, &s);
        assert_eq!(m.gate, Gate::PauseAtRest);
        assert!(m.reason.contains("not installed"), "{}", m.reason);
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
        s.binding.as_mut().unwrap().spec.as_mut().unwrap().param_ref = None;
        assert_eq!(
            decide(GateFlag::Auto, DEFAULT_POLICY_NAME, &s).gate,
            Gate::PauseAtRest
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
        assert_eq!(
            decide(GateFlag::Auto, DEFAULT_POLICY_NAME, &s).gate,
            Gate::Admission
        );
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
