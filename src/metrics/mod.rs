//! Prometheus metrics for both controllers, served at `/metrics`.
//!
//! Every reconcile, every error (by reason), every write to a workload (by
//! outcome), every hook run and every rollout phase change is counted here, so
//! that what the operator does to a cluster can be seen without its logs; and
//! every request to the API server ([`api`]).

pub mod api;

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub controller: &'static str,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub controller: &'static str,
    pub kind: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabels {
    pub point: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectPhaseLabels {
    pub namespace: String,
    pub name: String,
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ObjectLabels {
    pub namespace: String,
    pub name: String,
}

/// Every RolloutStrategy phase, as `ballast_rollout_strategy_phase` labels them.
pub const ROLLOUT_PHASES: [&str; 10] = [
    "Idle",
    "PreHook",
    "Rolling",
    "MidHook",
    "WaitingApproval",
    "WaitingExternal",
    "PostHook",
    "Succeeded",
    "Failed",
    "RolledBack",
];

/// One watch of the manager (`controller/resource`, as `/healthz` names it) and what its event
/// was: `list` (an object of the initial list or a relist), `apply` (added or modified) or
/// `delete`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WatchEventLabels {
    pub watch: &'static str,
    pub event: &'static str,
}

/// The counters of one watch's events, taken once so that counting an event costs an atomic
/// add, not a lookup in the family.
#[derive(Clone)]
pub struct WatchEvents {
    list: Counter,
    apply: Counter,
    delete: Counter,
}

impl WatchEvents {
    /// Counts one event of the watch (the start and end of a list are not objects: not counted).
    pub fn count<K>(&self, ev: &kube::runtime::watcher::Event<K>) {
        use kube::runtime::watcher::Event;
        let counter = match ev {
            Event::InitApply(_) => &self.list,
            Event::Apply(_) => &self.apply,
            Event::Delete(_) => &self.delete,
            Event::Init | Event::InitDone => return,
        };
        counter.inc();
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateLabels {
    pub mode: &'static str,
}

/// All metrics of the manager. Cheap to clone (everything inside is shared).
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    pub reconciles: Family<ControllerLabels, Counter>,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    pub reconcile_duration: Family<ControllerLabels, Histogram>,
    pub workload_writes: Family<WriteLabels, Counter>,
    pub hook_runs: Family<HookLabels, Counter>,
    pub hook_duration: Family<HookLabels, Histogram>,
    pub rollout_phases: Family<PhaseLabels, Counter>,
    pub leader: Gauge,
    pub api_requests: Family<api::ApiRequestLabels, Counter>,
    pub api_request_durations: Family<api::ApiDurationLabels, Histogram>,
    /// Objects each watch has received, by event.
    pub watch_events: Family<WatchEventLabels, Counter>,
    /// 1 for the RolloutStrategy gate in force (`admission` or `pause-at-rest`), 0 for the other.
    pub gate: Family<GateLabels, Gauge>,
    /// Per RolloutStrategy, 1 for its phase and 0 for the others (kube-state-metrics style).
    pub rollout_strategy_phase: Family<ObjectPhaseLabels, Gauge>,
    /// Per SpreadPolicy, the pods its Required spreads leave Pending.
    pub spread_policy_infeasible_pods: Family<ObjectLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("ballast");
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration =
            Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
                Histogram::new([0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0])
            });
        let workload_writes = Family::<WriteLabels, Counter>::default();
        let hook_runs = Family::<HookLabels, Counter>::default();
        let hook_duration = Family::<HookLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0])
        });
        let rollout_phases = Family::<PhaseLabels, Counter>::default();
        let leader = Gauge::default();
        let api_requests = Family::<api::ApiRequestLabels, Counter>::default();
        let api_request_durations = api::duration_family();
        let gate = Family::<GateLabels, Gauge>::default();
        let rollout_strategy_phase = Family::<ObjectPhaseLabels, Gauge>::default();
        let spread_policy_infeasible_pods = Family::<ObjectLabels, Gauge>::default();
        registry.register(
            "rollout_strategy_phase",
            "1 for the phase each RolloutStrategy is in, 0 for the other phases",
            rollout_strategy_phase.clone(),
        );
        registry.register(
            "spread_policy_infeasible_pods",
            "Pods each SpreadPolicy's Required spreads leave Pending (too few domains)",
            spread_policy_infeasible_pods.clone(),
        );
        registry.register("reconciles", "Reconciliations run", reconciles.clone());
        registry.register(
            "reconcile_errors",
            "Reconciliations that failed, by reason",
            reconcile_errors.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconciliation",
            reconcile_duration.clone(),
        );
        registry.register(
            "workload_writes",
            "Writes to Deployments and StatefulSets, by outcome",
            workload_writes.clone(),
        );
        registry.register(
            "hook_runs",
            "Finished hook Jobs, by result",
            hook_runs.clone(),
        );
        registry.register(
            "hook_duration_seconds",
            "Wall time of finished hook Jobs",
            hook_duration.clone(),
        );
        registry.register(
            "rollout_phase_transitions",
            "RolloutStrategy phase changes, by the phase entered",
            rollout_phases.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        registry.register(
            "api_requests",
            "Requests to the API server, by verb, group, resource and response code",
            api_requests.clone(),
        );
        registry.register(
            "api_request_duration_seconds",
            "Time from sending a request to the API server to its response, by verb, group and resource (watches left out)",
            api_request_durations.clone(),
        );
        let watch_events = Family::<WatchEventLabels, Counter>::default();
        registry.register(
            "watch_events",
            "Objects received by each watch of the manager, by event: list (initial list and relists), apply (added or modified), delete",
            watch_events.clone(),
        );
        registry.register(
            "gate",
            "1 for how RolloutStrategy holds governed Deployments: mode=admission (the revision gate) or mode=pause-at-rest",
            gate.clone(),
        );
        Self {
            registry: Arc::new(registry),
            reconciles,
            reconcile_errors,
            reconcile_duration,
            workload_writes,
            hook_runs,
            hook_duration,
            rollout_phases,
            leader,
            api_requests,
            api_request_durations,
            watch_events,
            gate,
            rollout_strategy_phase,
            spread_policy_infeasible_pods,
        }
    }
}

impl Metrics {
    /// The event counters of the watch `watch`.
    pub fn watch_events(&self, watch: &'static str) -> WatchEvents {
        let counter = |event| {
            self.watch_events
                .get_or_create(&WatchEventLabels { watch, event })
                .clone()
        };
        WatchEvents {
            list: counter("list"),
            apply: counter("apply"),
            delete: counter("delete"),
        }
    }

    /// Records the gate in force.
    pub fn set_gate(&self, admission: bool) {
        for (mode, on) in [("admission", admission), ("pause-at-rest", !admission)] {
            self.gate
                .get_or_create(&GateLabels { mode })
                .set(i64::from(on));
        }
    }

    /// Records the phase of RolloutStrategy `ns/name` (`None`: it is gone, its series go too).
    pub fn set_rollout_phase(&self, ns: &str, name: &str, phase: Option<&str>) {
        for p in ROLLOUT_PHASES {
            let labels = ObjectPhaseLabels {
                namespace: ns.to_string(),
                name: name.to_string(),
                phase: p,
            };
            match phase {
                Some(cur) => {
                    self.rollout_strategy_phase
                        .get_or_create(&labels)
                        .set(i64::from(cur == p));
                }
                None => {
                    self.rollout_strategy_phase.remove(&labels);
                }
            }
        }
    }

    /// Records the pods SpreadPolicy `ns/name` leaves Pending (`None`: it is gone), from its
    /// plan on every reconcile.
    pub fn set_spread_infeasible(&self, ns: &str, name: &str, pending: Option<i64>) {
        let labels = ObjectLabels {
            namespace: ns.to_string(),
            name: name.to_string(),
        };
        match pending {
            Some(n) => {
                self.spread_policy_infeasible_pods
                    .get_or_create(&labels)
                    .set(n);
            }
            None => {
                self.spread_policy_infeasible_pods.remove(&labels);
            }
        }
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }

    /// The tower layer that counts the client's requests into `api_requests` and times them
    /// into `api_request_durations`.
    pub fn api_layer(&self) -> api::ApiMetricsLayer {
        api::ApiMetricsLayer::new(
            self.api_requests.clone(),
            self.api_request_durations.clone(),
        )
    }

    pub fn count_reconcile(&self, controller: &'static str, seconds: f64) {
        self.reconciles
            .get_or_create(&ControllerLabels { controller })
            .inc();
        self.reconcile_duration
            .get_or_create(&ControllerLabels { controller })
            .observe(seconds);
    }

    pub fn count_error(&self, controller: &'static str, reason: &'static str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels { controller, reason })
            .inc();
    }

    pub fn count_write(&self, controller: &'static str, kind: &str, outcome: &'static str) {
        self.workload_writes
            .get_or_create(&WriteLabels {
                controller,
                kind: kind.to_string(),
                outcome,
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendered_metrics_carry_the_prefix_and_labels() {
        let m = Metrics::default();
        m.count_reconcile("spread-policy", 0.01);
        m.count_error("spread-policy", "ApplyFailed");
        m.count_write("spread-policy", "Deployment", "patched");
        let text = m.render();
        assert!(
            text.contains("ballast_reconciles_total{controller=\"spread-policy\"} 1"),
            "{text}"
        );
        assert!(text.contains("reason=\"ApplyFailed\""), "{text}");
        assert!(text.contains("ballast_workload_writes_total"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn each_object_a_watch_receives_is_counted_by_event_and_the_list_markers_are_not() {
        use kube::runtime::watcher::Event;
        let m = Metrics::default();
        let events = m.watch_events("spread-policy/deployments");
        for ev in [
            Event::Init,
            Event::InitApply(1),
            Event::InitApply(2),
            Event::InitDone,
            Event::Apply(1),
            Event::Delete(2),
        ] {
            events.count(&ev);
        }
        // A second handle on the same watch counts into the same series.
        m.watch_events("spread-policy/deployments")
            .count(&Event::Apply(3));
        let text = m.render();
        for (event, n) in [("list", 2), ("apply", 2), ("delete", 1)] {
            let line = format!(
                "ballast_watch_events_total{{watch=\"spread-policy/deployments\",event=\"{event}\"}} {n}\n"
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
    }

    #[test]
    fn the_phase_gauge_is_one_for_the_current_phase_and_goes_with_the_strategy() {
        let m = Metrics::default();
        m.set_rollout_phase("shop", "web", Some("PreHook"));
        m.set_rollout_phase("shop", "web", Some("WaitingApproval"));
        let text = m.render();
        let line = |phase: &str| {
            format!(
                "ballast_rollout_strategy_phase{{namespace=\"shop\",name=\"web\",phase=\"{phase}\"}}"
            )
        };
        assert!(
            text.contains(&format!("{} 1\n", line("WaitingApproval"))),
            "{text}"
        );
        assert!(text.contains(&format!("{} 0\n", line("PreHook"))), "{text}");
        assert_eq!(
            text.matches("ballast_rollout_strategy_phase{").count(),
            ROLLOUT_PHASES.len()
        );
        m.set_rollout_phase("shop", "web", None);
        assert!(!m.render().contains("ballast_rollout_strategy_phase{"));
        m.set_spread_infeasible("shop", "web-ha", Some(2));
        assert!(m.render().contains(
            "ballast_spread_policy_infeasible_pods{namespace=\"shop\",name=\"web-ha\"} 2"
        ));
    }
}
