//! Status: from the plan and the outcome of its writes to the status
//! subresource, with conditions that follow the API conventions (see
//! `k8s::conditions`). Computing it is pure; `events_for` says which
//! condition transitions deserve an Event.

use super::plan::{Plan, state};
use crate::api::common::{
    CONDITION_CONFLICTED, CONDITION_INFEASIBLE, CONDITION_PROGRESSING, CONDITION_READY,
    CONDITION_SKEWED,
};
use crate::api::spread_policy::{SpreadPolicy, SpreadPolicyStatus};
use crate::k8s::conditions::{Status, find, set_condition};
use crate::k8s::version_number;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

/// Condition reasons (CamelCase, as the conventions ask).
pub mod reason {
    pub const APPLIED: &str = "Applied";
    pub const NO_MATCHING_WORKLOADS: &str = "NoMatchingWorkloads";
    pub const PENDING: &str = "Pending";
    pub const INVALID_SPEC: &str = "InvalidSpec";
    pub const WRITE_FAILED: &str = "WriteFailed";
    pub const SUSPENDED: &str = "Suspended";
    pub const APPLYING: &str = "Applying";
    pub const ROLLING_OUT: &str = "RollingOut";
    pub const CONVERGED: &str = "Converged";
    pub const REMOVING: &str = "Removing";
    pub const CONFLICTED: &str = "Conflicted";
    pub const NO_CONFLICTS: &str = "NoConflicts";
    pub const INSUFFICIENT_DOMAINS: &str = "InsufficientDomains";
    pub const NODES_MISSING_TOPOLOGY_LABEL: &str = "NodesMissingTopologyLabel";
    pub const FEASIBLE: &str = "Feasible";
    pub const SKEWED: &str = "Skewed";
    pub const BALANCED: &str = "Balanced";
    /// The `Skewed` condition while `rebalance` moves pods back.
    pub const REBALANCING: &str = "Rebalancing";
    /// Events only: a pod evicted to rebalance, and an eviction a PodDisruptionBudget refused.
    pub const POD_EVICTED: &str = "PodEvicted";
    pub const EVICTION_BLOCKED: &str = "EvictionBlocked";
    /// Events only: workloads written with the policy's terms, or with them taken out.
    pub const TERMS_APPLIED: &str = "TermsApplied";
    pub const TERMS_REMOVED: &str = "TermsRemoved";
}

/// Longest condition message; the rest is summarised.
const MAX_MESSAGE: usize = 1024;

fn join_bounded(items: &[String]) -> String {
    let mut out = String::new();
    for (i, item) in items.iter().enumerate() {
        let sep = if out.is_empty() { "" } else { "; " };
        if out.len() + sep.len() + item.len() > MAX_MESSAGE {
            out.push_str(&format!("{sep}and {} more", items.len() - i));
            break;
        }
        out.push_str(sep);
        out.push_str(item);
    }
    out
}

/// The status the plan (after its writes) amounts to. `write_errors` are
/// `(workload, message)` of writes the API server refused.
pub fn build(
    policy: &SpreadPolicy,
    plan: &Plan,
    write_errors: &[(String, String)],
    now: Timestamp,
) -> SpreadPolicyStatus {
    let generation = policy.metadata.generation;
    let old = policy.status.clone().unwrap_or_default();
    let mut conditions: Vec<Condition> = old.conditions.clone();
    let deleting = policy.metadata.deletion_timestamp.is_some();
    let governed = plan
        .matched
        .saturating_sub(i32::try_from(plan.conflicts.len()).unwrap_or(i32::MAX));

    let (ready, ready_reason, ready_msg) = if let Some(invalid) = &plan.invalid {
        (Status::False, reason::INVALID_SPEC, invalid.clone())
    } else if !write_errors.is_empty() {
        let msgs: Vec<String> = write_errors
            .iter()
            .map(|(w, m)| format!("{w}: {m}"))
            .collect();
        (Status::False, reason::WRITE_FAILED, join_bounded(&msgs))
    } else if governed <= 0 && !deleting {
        (
            Status::True,
            reason::NO_MATCHING_WORKLOADS,
            "no workload in this namespace is governed by this policy".into(),
        )
    } else if plan.applied >= governed && !deleting {
        (
            Status::True,
            reason::APPLIED,
            format!(
                "{} of {} workloads carry this policy's terms",
                plan.applied, governed
            ),
        )
    } else if policy.spec.suspend {
        (
            Status::False,
            reason::SUSPENDED,
            format!(
                "suspended with {} of {} workloads converged",
                plan.applied, governed
            ),
        )
    } else {
        (
            Status::False,
            reason::PENDING,
            format!(
                "{} of {} workloads carry this policy's terms",
                plan.applied,
                governed.max(0)
            ),
        )
    };
    set_condition(
        &mut conditions,
        CONDITION_READY,
        ready,
        ready_reason,
        ready_msg,
        generation,
        now,
    );

    let (progressing, p_reason, p_msg) = if deleting {
        (
            Status::True,
            reason::REMOVING,
            "removing this policy's terms before deletion".to_string(),
        )
    } else if policy.spec.suspend {
        (
            Status::False,
            reason::SUSPENDED,
            "spec.suspend is true: nothing new is written".to_string(),
        )
    } else if !plan.writes.is_empty() || plan.waiting > 0 {
        (
            Status::True,
            reason::APPLYING,
            format!(
                "{} workload(s) written now, {} waiting for rollouts to finish",
                plan.writes.len(),
                plan.waiting
            ),
        )
    } else if plan.in_flight > 0 {
        (
            Status::True,
            reason::ROLLING_OUT,
            format!("{} workload(s) rolling out", plan.in_flight),
        )
    } else {
        (
            Status::False,
            reason::CONVERGED,
            "every governed workload is converged".to_string(),
        )
    };
    set_condition(
        &mut conditions,
        CONDITION_PROGRESSING,
        progressing,
        p_reason,
        p_msg,
        generation,
        now,
    );

    if plan.conflicts.is_empty() {
        set_condition(
            &mut conditions,
            CONDITION_CONFLICTED,
            Status::False,
            reason::NO_CONFLICTS,
            "",
            generation,
            now,
        );
    } else {
        set_condition(
            &mut conditions,
            CONDITION_CONFLICTED,
            Status::True,
            reason::CONFLICTED,
            join_bounded(&plan.conflicts),
            generation,
            now,
        );
    }

    if !plan.shortfalls.is_empty() {
        let mut msgs = plan.shortfalls.clone();
        msgs.extend(plan.warnings.iter().cloned());
        set_condition(
            &mut conditions,
            CONDITION_INFEASIBLE,
            Status::True,
            reason::INSUFFICIENT_DOMAINS,
            join_bounded(&msgs),
            generation,
            now,
        );
    } else if !plan.warnings.is_empty() {
        set_condition(
            &mut conditions,
            CONDITION_INFEASIBLE,
            Status::False,
            reason::NODES_MISSING_TOPOLOGY_LABEL,
            join_bounded(&plan.warnings),
            generation,
            now,
        );
    } else {
        set_condition(
            &mut conditions,
            CONDITION_INFEASIBLE,
            Status::False,
            reason::FEASIBLE,
            "every Required spread fits the domains available",
            generation,
            now,
        );
    }

    if plan.skewed.is_empty() {
        set_condition(
            &mut conditions,
            CONDITION_SKEWED,
            Status::False,
            reason::BALANCED,
            "the running pods of every governed workload are spread as the policy asks",
            generation,
            now,
        );
    } else {
        set_condition(
            &mut conditions,
            CONDITION_SKEWED,
            Status::True,
            if plan.rebalancing {
                reason::REBALANCING
            } else {
                reason::SKEWED
            },
            join_bounded(&plan.skewed),
            generation,
            now,
        );
    }

    let mut workloads = plan.workloads.clone();
    for (w, msg) in write_errors {
        if let Some(s) = workloads
            .iter_mut()
            .find(|s| format!("{:?}/{}", s.kind, s.name) == *w)
        {
            s.state = state::ERROR.into();
            s.message = Some(msg.clone());
        }
    }

    SpreadPolicyStatus {
        observed_generation: generation,
        conditions,
        matched: Some(plan.matched),
        applied: Some(plan.applied),
        domains: plan.domains.clone(),
        workloads,
        distribution: Some(plan.distribution.clone()),
    }
}

/// Whether `new` differs from `old` only in `distribution`: pods coming and going, which
/// [`Pacer`] holds to one status write per [`DISTRIBUTION_EVERY`].
pub fn only_distribution_changed(old: &SpreadPolicyStatus, new: &SpreadPolicyStatus) -> bool {
    let strip = |s: &SpreadPolicyStatus| SpreadPolicyStatus {
        distribution: None,
        ..s.clone()
    };
    strip(old) == strip(new)
}

/// How often a policy's status is written when only where its pods run changed.
pub const DISTRIBUTION_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The memory of each policy's last status write, for two decisions:
/// - pacing: status writes that only move pod counts are held to one per [`DISTRIBUTION_EVERY`]
///   per policy, so pods coming and going (a rollout, a scale, churn) do not become a stream of
///   status writes; any other change is written at once;
/// - no echo: until the cache shows a write, a reconcile reads the status from before it, finds
///   it different from the one it builds, and would send the same status again (a write that
///   changes nothing, and the Events of its transitions a second time). The status written is
///   remembered with the resourceVersion the write was answered with, until the cache shows it.
///
/// In memory, and only for [`DISTRIBUTION_EVERY`] after a write: a restart writes at once.
#[derive(Default)]
pub struct Pacer {
    last: std::sync::Mutex<std::collections::HashMap<String, LastWrite>>,
}

struct LastWrite {
    at: std::time::Instant,
    /// The resourceVersion the write was answered with, and a fingerprint of the status
    /// written; `None` once the cache has caught up with it.
    echo: Option<(u64, u64)>,
}

impl Pacer {
    /// How long the status write of `key` must wait (`None`: write now).
    pub fn wait(&self, key: &str, now: std::time::Instant) -> Option<std::time::Duration> {
        let last = self.last.lock().expect("not poisoned");
        let since = now.saturating_duration_since(last.get(key)?.at);
        DISTRIBUTION_EVERY
            .checked_sub(since)
            .filter(|d| !d.is_zero())
    }

    /// Whether `status` is what was written last for `key` while the cache, showing the policy at
    /// `cached`, is still behind that write: older than the resourceVersion it was answered with.
    /// (Behind our first write or our second alike: comparing with the version before the write
    /// took a cache that showed the first of two quick writes for caught up.) A resourceVersion
    /// that is not a number (etcd's are; the API makes no promise) compares nothing.
    pub fn already(&self, key: &str, cached: Option<&str>, status: &impl serde::Serialize) -> bool {
        let mut last = self.last.lock().expect("not poisoned");
        let Some(entry) = last.get_mut(key) else {
            return false;
        };
        let behind = |answered: u64| {
            cached
                .and_then(version_number)
                .is_some_and(|c| c < answered)
        };
        match entry.echo {
            Some((answered, fp)) if behind(answered) => fp == fingerprint(status),
            _ => {
                // The cache has caught up (or someone else wrote): decide on what it shows.
                entry.echo = None;
                false
            }
        }
    }

    /// Remembers that `status` was written for `key` at `now`, and the API server answered with
    /// resourceVersion `answered`.
    pub fn wrote(
        &self,
        key: &str,
        now: std::time::Instant,
        answered: Option<&str>,
        status: &impl serde::Serialize,
    ) {
        let mut last = self.last.lock().expect("not poisoned");
        // Forget what is past the window, so the map holds only recent writers.
        last.retain(|_, w| now.saturating_duration_since(w.at) < DISTRIBUTION_EVERY);
        let echo = answered
            .and_then(version_number)
            .map(|v| (v, fingerprint(status)));
        last.insert(key.to_string(), LastWrite { at: now, echo });
    }
}

/// A hash of `status` without its conditions' transition times. A reconcile on a cache that
/// does not show our last write builds the same transition again, stamped with its own `now`:
/// the status is the one written, and the API server keeps the first write's time.
fn fingerprint(status: &impl serde::Serialize) -> u64 {
    let mut v = serde_json::to_value(status).expect("a status serializes");
    if let Some(conditions) = v.get_mut("conditions").and_then(|c| c.as_array_mut()) {
        for c in conditions.iter_mut().filter_map(|c| c.as_object_mut()) {
            c.remove("lastTransitionTime");
        }
    }
    crate::k8s::digest::json(&v)
}

/// An Event worth publishing: (warning?, reason, note).
pub type EventSpec = (bool, &'static str, String);

/// Events for condition transitions between `old` and `new` (not for every
/// reconcile: an unchanged condition says nothing).
pub fn events_for(old: &[Condition], new: &[Condition]) -> Vec<EventSpec> {
    let mut out = Vec::new();
    let changed = |t: &str| {
        let n = find(new, t)?;
        let o = find(old, t);
        (o.map(|o| (&o.status, &o.reason)) != Some((&n.status, &n.reason))).then_some(n.clone())
    };
    if let Some(c) = changed(CONDITION_INFEASIBLE) {
        match c.reason.as_str() {
            reason::INSUFFICIENT_DOMAINS => out.push((true, "Infeasible", c.message)),
            reason::NODES_MISSING_TOPOLOGY_LABEL => {
                out.push((true, "NodesMissingTopologyLabel", c.message))
            }
            _ if find(old, CONDITION_INFEASIBLE).is_some() => {
                out.push((false, "Feasible", c.message))
            }
            _ => {}
        }
    }
    if let Some(c) = changed(CONDITION_SKEWED) {
        if c.status == "True" && c.reason == reason::SKEWED {
            out.push((true, reason::SKEWED, c.message));
        } else if c.status == "True" {
            out.push((false, reason::REBALANCING, c.message));
        } else if find(old, CONDITION_SKEWED).is_some() {
            out.push((false, reason::BALANCED, c.message));
        }
    }
    if let Some(c) = changed(CONDITION_CONFLICTED)
        && c.status == "True"
    {
        out.push((true, "Conflicted", c.message));
    }
    if let Some(c) = changed(CONDITION_READY) {
        match c.reason.as_str() {
            reason::INVALID_SPEC => out.push((true, "InvalidSpec", c.message)),
            reason::WRITE_FAILED => out.push((true, "WriteFailed", c.message)),
            _ if c.status == "True" => out.push((false, "Ready", c.message)),
            _ => {}
        }
    }
    out
}

/// Workloads an Event names before it only counts the rest.
pub const EVENT_NAMES: usize = 10;

/// One Event's note for the workloads that one reconcile wrote: `single` says what happened
/// to one workload; for more, the note names the first [`EVENT_NAMES`] (sorted) and counts
/// the rest, so a policy fanned out to thousands of workloads publishes one Event, not one
/// per workload. Pure.
pub fn written_note(targets: &[String], single: &str, many: &str) -> String {
    if let [one] = targets {
        return format!("{one}: {single}");
    }
    let mut sorted: Vec<&String> = targets.iter().collect();
    sorted.sort();
    let named: Vec<&str> = sorted
        .iter()
        .take(EVENT_NAMES)
        .map(|s| s.as_str())
        .collect();
    let more = targets.len().saturating_sub(EVENT_NAMES);
    let rest = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "{} workloads {many}: {}{rest}",
        targets.len(),
        named.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_names_a_bounded_number_of_written_workloads() {
        let one = written_note(&["Deployment/web".into()], "2 term(s)", "carry terms");
        assert_eq!(one, "Deployment/web: 2 term(s)");
        let many: Vec<String> = (0..1000)
            .rev()
            .map(|i| format!("Deployment/d-{i:04}"))
            .collect();
        let note = written_note(&many, "2 term(s)", "now carry this policy's terms");
        assert!(
            note.starts_with("1000 workloads now carry this policy's terms: Deployment/d-0000, Deployment/d-0001,"),
            "{note}"
        );
        assert!(note.ends_with("Deployment/d-0009 and 990 more"), "{note}");
        let few = written_note(
            &["Deployment/b".into(), "Deployment/a".into()],
            "",
            "had this policy's terms removed",
        );
        assert_eq!(
            few,
            "2 workloads had this policy's terms removed: Deployment/a, Deployment/b"
        );
    }
    use serde_json::json;

    fn policy() -> SpreadPolicy {
        serde_json::from_value(json!({
            "apiVersion": "ballast.dev/v1alpha1", "kind": "SpreadPolicy",
            "metadata": {"name": "web-ha", "namespace": "shop", "generation": 3},
            "spec": {"selector": {"matchLabels": {"tier": "web"}},
                     "spread": [{"topologyKey": "topology.kubernetes.io/zone", "mode": "Required"}]},
        }))
        .unwrap()
    }

    #[test]
    fn an_infeasible_plan_says_how_many_pods_stay_pending() {
        let plan = Plan {
            matched: 1,
            applied: 1,
            shortfalls: vec!["web: 5 replicas, 3 domains of topology.kubernetes.io/zone: 2 pods will stay Pending".into()],
            ..Default::default()
        };
        let s = build(&policy(), &plan, &[], Timestamp::now());
        let c = find(&s.conditions, CONDITION_INFEASIBLE).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reason::INSUFFICIENT_DOMAINS)
        );
        assert!(c.message.contains("2 pods will stay Pending"));
        assert_eq!(s.observed_generation, Some(3));
        assert_eq!(find(&s.conditions, CONDITION_READY).unwrap().status, "True");
        let events = events_for(&[], &s.conditions);
        assert!(
            events
                .iter()
                .any(|(warn, r, _)| *warn && *r == "Infeasible")
        );
    }

    #[test]
    fn the_same_status_twice_emits_no_event() {
        let plan = Plan {
            matched: 2,
            applied: 1,
            ..Default::default()
        };
        let s1 = build(&policy(), &plan, &[], Timestamp::now());
        let mut p = policy();
        p.status = Some(s1.clone());
        let s2 = build(&p, &plan, &[], Timestamp::now());
        assert_eq!(
            s1.conditions, s2.conditions,
            "lastTransitionTime does not move"
        );
        assert!(events_for(&s1.conditions, &s2.conditions).is_empty());
    }

    #[test]
    fn skewed_workloads_set_the_condition_and_an_event_and_back() {
        let plan = Plan {
            matched: 1,
            applied: 1,
            skewed: vec!["web: topology.kubernetes.io/zone skew 3 > 1 (a 0, b 3, c 3)".into()],
            ..Default::default()
        };
        let s = build(&policy(), &plan, &[], Timestamp::now());
        let c = find(&s.conditions, CONDITION_SKEWED).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", reason::SKEWED)
        );
        assert!(
            events_for(&[], &s.conditions)
                .iter()
                .any(|(warn, r, _)| *warn && *r == "Skewed")
        );
        let mut p = policy();
        p.status = Some(s.clone());
        let even = build(
            &p,
            &Plan {
                skewed: vec![],
                ..plan
            },
            &[],
            Timestamp::now(),
        );
        let events = events_for(&s.conditions, &even.conditions);
        assert!(
            events.iter().any(|(warn, r, _)| !*warn && *r == "Balanced"),
            "{events:?}"
        );
    }

    /// The status of a policy with one workload, applied.
    fn one_applied() -> SpreadPolicyStatus {
        let plan = Plan {
            matched: 1,
            applied: 1,
            ..Default::default()
        };
        build(&policy(), &plan, &[], Timestamp::now())
    }

    #[test]
    fn distribution_only_changes_are_paced_and_others_are_not() {
        let a = one_applied();
        let mut moved = a.clone();
        moved.distribution.as_mut().unwrap().running_pods = 7;
        assert!(only_distribution_changed(&a, &moved));
        let mut other = moved.clone();
        other.applied = Some(0);
        assert!(!only_distribution_changed(&a, &other));
        let pacer = Pacer::default();
        let t0 = std::time::Instant::now();
        assert_eq!(pacer.wait("shop/web", t0), None, "never written: now");
        pacer.wrote("shop/web", t0, None, &a);
        let later = t0 + std::time::Duration::from_secs(2);
        assert_eq!(
            pacer.wait("shop/web", later),
            Some(std::time::Duration::from_secs(3))
        );
        assert_eq!(pacer.wait("shop/web", t0 + DISTRIBUTION_EVERY), None);
        assert_eq!(pacer.wait("shop/other", later), None);
    }

    #[test]
    fn a_status_just_written_is_not_written_again_until_the_cache_shows_it() {
        let a = one_applied();
        let mut b = a.clone();
        b.applied = Some(0);
        let written = Pacer::default();
        assert!(
            !written.already("shop/web", Some("10"), &a),
            "nothing written yet"
        );
        let t0 = std::time::Instant::now();
        written.wrote("shop/web", t0, Some("11"), &a);
        // The cache still shows resourceVersion 10: the same status is not sent again, another is.
        assert!(written.already("shop/web", Some("10"), &a));
        assert!(!written.already("shop/web", Some("10"), &b));
        assert!(!written.already("shop/other", Some("10"), &a));
        // Two quick writes: a cache that shows the first is still behind the second.
        written.wrote("shop/web", t0, Some("12"), &b);
        assert!(written.already("shop/web", Some("11"), &b));
        // Once the cache has caught up, what it shows decides, even for the same status.
        assert!(!written.already("shop/web", Some("12"), &b));
        assert!(
            !written.already("shop/web", Some("11"), &b),
            "the entry is gone"
        );
        // Built again on the same stale cache, a transition carries a later time: the same status.
        let mut later = a.clone();
        later.conditions[0].last_transition_time =
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                Timestamp::now() + jiff::SignedDuration::from_secs(2),
            );
        written.wrote("shop/web", t0, Some("13"), &a);
        assert!(written.already("shop/web", Some("12"), &later));
        // A resourceVersion that is not a number compares nothing.
        assert!(!written.already("shop/web", Some("x"), &a));
        // It lasts as long as the pacing window: deleted policies leave nothing behind.
        written.wrote("shop/web", t0, Some("14"), &a);
        assert!(written.already("shop/web", Some("13"), &a));
        written.wrote("shop/other", t0 + DISTRIBUTION_EVERY, None, &b);
        assert!(!written.already("shop/web", Some("13"), &a));
    }

    #[test]
    fn write_errors_make_ready_false_and_name_the_workload() {
        let plan = Plan {
            matched: 1,
            ..Default::default()
        };
        let errors = vec![(
            "Deployment/web".to_string(),
            "admission webhook denied".to_string(),
        )];
        let s = build(&policy(), &plan, &errors, Timestamp::now());
        let c = find(&s.conditions, CONDITION_READY).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", reason::WRITE_FAILED)
        );
        assert!(
            c.message
                .contains("Deployment/web: admission webhook denied")
        );
    }

    #[test]
    fn long_lists_are_summarised() {
        let items: Vec<String> = (0..200)
            .map(|i| format!("Deployment/web-{i:03} is governed by SpreadPolicy x"))
            .collect();
        let m = join_bounded(&items);
        assert!(m.len() <= MAX_MESSAGE + 20);
        assert!(m.ends_with("more"));
    }
}
