//! Merging our terms into a workload's pod template without touching the
//! user's. Pure.
//!
//! Affinity term lists are atomic under server-side apply: whoever writes one
//! writes all of it. So ballast keeps a record, on the workload, of exactly
//! the terms it injected (`ballast.dev/spread-terms`) and rebuilds each list
//! as *the live list minus what the record says is ours, plus what we want
//! now*. The user's terms keep their order and are never duplicated: a term
//! the user already has is not added again (and so is not ours).
//!
//! Topology spread constraints are a list-map keyed by (topologyKey,
//! whenUnsatisfiable): ballast applies only its own entries and never takes
//! over a key the user already uses (that entry is reported as skipped).

use super::terms::{Terms, constraint_key};
use super::workload::Workload;
use k8s_openapi::api::core::v1::{
    PodAffinityTerm, TopologySpreadConstraint, WeightedPodAffinityTerm,
};

/// The pod template lists after the merge, and what is ours in them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Merged {
    pub anti_affinity_required: Vec<PodAffinityTerm>,
    pub anti_affinity_preferred: Vec<WeightedPodAffinityTerm>,
    pub affinity_required: Vec<PodAffinityTerm>,
    pub affinity_preferred: Vec<WeightedPodAffinityTerm>,
    /// The whole topology spread constraint list after the merge: the
    /// user's entries in their order, then ours.
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// The terms ballast will have injected: the new record.
    pub ours: Terms,
    /// Desired constraints left out because the user has one with that key.
    pub skipped: Vec<String>,
    /// Whether the pod template changes (which rolls the pods out).
    pub template_changed: bool,
}

/// Rebuilds one atomic list: live minus recorded (each recorded term removes
/// its last occurrence, which is where we appended it), then desired terms
/// the user does not already have. Returns (new list, ours).
fn merge_atomic<T: PartialEq + Clone>(
    live: &[T],
    recorded: &[T],
    desired: &[T],
) -> (Vec<T>, Vec<T>) {
    let mut list = live.to_vec();
    for r in recorded {
        if let Some(pos) = list.iter().rposition(|x| x == r) {
            list.remove(pos);
        }
    }
    let mut ours: Vec<T> = Vec::new();
    for d in desired {
        if !list.contains(d) && !ours.contains(d) {
            ours.push(d.clone());
        }
    }
    list.extend(ours.iter().cloned());
    (list, ours)
}

/// The live constraints ballast owns: those whose key the record names.
pub fn owned_constraints<'a>(
    live: &'a [TopologySpreadConstraint],
    recorded: &Terms,
) -> Vec<&'a TopologySpreadConstraint> {
    live.iter()
        .filter(|c| {
            recorded
                .topology_spread_constraints
                .iter()
                .any(|r| constraint_key(r) == constraint_key(c))
        })
        .collect()
}

/// Merges `desired` into `workload`'s template, given the `recorded` terms
/// ballast injected before. `desired` empty means "take ours out".
pub fn merge(workload: &Workload, recorded: &Terms, desired: &Terms) -> Merged {
    let aff = &workload.affinity;
    let anti = aff.pod_anti_affinity.clone().unwrap_or_default();
    let pro = aff.pod_affinity.clone().unwrap_or_default();
    let live_anti_req = anti
        .required_during_scheduling_ignored_during_execution
        .unwrap_or_default();
    let live_anti_pref = anti
        .preferred_during_scheduling_ignored_during_execution
        .unwrap_or_default();
    let live_aff_req = pro
        .required_during_scheduling_ignored_during_execution
        .unwrap_or_default();
    let live_aff_pref = pro
        .preferred_during_scheduling_ignored_during_execution
        .unwrap_or_default();

    let (anti_req, ours_anti_req) = merge_atomic(
        &live_anti_req,
        &recorded.anti_affinity_required,
        &desired.anti_affinity_required,
    );
    let (anti_pref, ours_anti_pref) = merge_atomic(
        &live_anti_pref,
        &recorded.anti_affinity_preferred,
        &desired.anti_affinity_preferred,
    );
    let (aff_req, ours_aff_req) = merge_atomic(
        &live_aff_req,
        &recorded.affinity_required,
        &desired.affinity_required,
    );
    let (aff_pref, ours_aff_pref) = merge_atomic(
        &live_aff_pref,
        &recorded.affinity_preferred,
        &desired.affinity_preferred,
    );

    let live_tsc = &workload.topology_spread_constraints;
    let owned = owned_constraints(live_tsc, recorded);
    let user_tsc: Vec<&TopologySpreadConstraint> =
        live_tsc.iter().filter(|c| !owned.contains(c)).collect();
    let mut ours_tsc = Vec::new();
    let mut skipped = Vec::new();
    for d in &desired.topology_spread_constraints {
        if user_tsc
            .iter()
            .any(|u| constraint_key(u) == constraint_key(d))
        {
            skipped.push(format!(
                "topology spread constraint ({}, {}) is already set by the workload's owner",
                d.topology_key, d.when_unsatisfiable
            ));
        } else {
            ours_tsc.push(d.clone());
        }
    }
    // A list-map: the same entries in another order are no change.
    let tsc_changed =
        !(owned.len() == ours_tsc.len() && ours_tsc.iter().all(|d| owned.contains(&d)));

    let template_changed = anti_req != live_anti_req
        || anti_pref != live_anti_pref
        || aff_req != live_aff_req
        || aff_pref != live_aff_pref
        || tsc_changed;

    let mut all_tsc: Vec<TopologySpreadConstraint> = user_tsc.into_iter().cloned().collect();
    all_tsc.extend(ours_tsc.iter().cloned());

    Merged {
        anti_affinity_required: anti_req,
        anti_affinity_preferred: anti_pref,
        affinity_required: aff_req,
        affinity_preferred: aff_pref,
        topology_spread_constraints: all_tsc,
        ours: Terms {
            anti_affinity_required: ours_anti_req,
            anti_affinity_preferred: ours_anti_pref,
            affinity_required: ours_aff_req,
            affinity_preferred: ours_aff_pref,
            topology_spread_constraints: ours_tsc,
        },
        skipped,
        template_changed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::spread_policy::WorkloadKind;
    use serde_json::json;

    fn term(key: &str, app: &str) -> PodAffinityTerm {
        serde_json::from_value(
            json!({"labelSelector": {"matchLabels": {"app": app}}, "topologyKey": key}),
        )
        .unwrap()
    }

    fn weighted(key: &str, app: &str, w: i32) -> WeightedPodAffinityTerm {
        WeightedPodAffinityTerm {
            pod_affinity_term: term(key, app),
            weight: w,
        }
    }

    fn tsc(key: &str, when: &str, skew: i32) -> TopologySpreadConstraint {
        TopologySpreadConstraint {
            topology_key: key.into(),
            when_unsatisfiable: when.into(),
            max_skew: skew,
            ..Default::default()
        }
    }

    /// A workload as the API server would hold it after applying `m`.
    fn applied(mut w: Workload, m: &Merged) -> Workload {
        let mut anti = w.affinity.pod_anti_affinity.clone().unwrap_or_default();
        anti.required_during_scheduling_ignored_during_execution =
            Some(m.anti_affinity_required.clone());
        anti.preferred_during_scheduling_ignored_during_execution =
            Some(m.anti_affinity_preferred.clone());
        let mut pro = w.affinity.pod_affinity.clone().unwrap_or_default();
        pro.required_during_scheduling_ignored_during_execution = Some(m.affinity_required.clone());
        pro.preferred_during_scheduling_ignored_during_execution =
            Some(m.affinity_preferred.clone());
        w.affinity.pod_anti_affinity = Some(anti);
        w.affinity.pod_affinity = Some(pro);
        let recorded_keys: Vec<_> = w.topology_spread_constraints.clone();
        let mut tscs: Vec<TopologySpreadConstraint> = recorded_keys
            .into_iter()
            .filter(|c| {
                !m.ours
                    .topology_spread_constraints
                    .iter()
                    .any(|o| constraint_key(o) == constraint_key(c))
            })
            .collect();
        tscs.extend(m.ours.topology_spread_constraints.iter().cloned());
        w.topology_spread_constraints = tscs;
        w
    }

    fn user_workload() -> Workload {
        let mut w = Workload {
            kind: WorkloadKind::Deployment,
            name: "web".into(),
            ..Default::default()
        };
        w.affinity = serde_json::from_value(json!({
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]}},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "user-a"}}, "topologyKey": "rack"},
                {"labelSelector": {"matchLabels": {"app": "user-b"}}, "topologyKey": "rack"}]},
            "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 7, "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone"}}]},
        }))
        .unwrap();
        w.topology_spread_constraints = vec![tsc("rack", "DoNotSchedule", 1)];
        w
    }

    fn desired() -> Terms {
        Terms {
            anti_affinity_required: vec![term("zone", "web")],
            anti_affinity_preferred: vec![weighted("host", "web", 100)],
            affinity_required: vec![],
            affinity_preferred: vec![weighted("zone", "cache", 50)],
            topology_spread_constraints: vec![tsc("zone", "ScheduleAnyway", 1)],
        }
    }

    #[test]
    fn our_terms_are_appended_after_the_users_in_every_list() {
        let w = user_workload();
        let m = merge(&w, &Terms::default(), &desired());
        assert_eq!(
            m.anti_affinity_required,
            vec![
                term("rack", "user-a"),
                term("rack", "user-b"),
                term("zone", "web")
            ]
        );
        assert_eq!(
            m.anti_affinity_preferred,
            vec![weighted("host", "web", 100)]
        );
        assert_eq!(
            m.affinity_preferred,
            vec![weighted("zone", "db", 7), weighted("zone", "cache", 50)]
        );
        assert_eq!(m.ours, desired());
        assert!(m.template_changed);
        assert!(m.skipped.is_empty());
    }

    #[test]
    fn merging_twice_is_merging_once() {
        let w = user_workload();
        let first = merge(&w, &Terms::default(), &desired());
        let w2 = applied(w, &first);
        let second = merge(&w2, &first.ours, &desired());
        assert!(!second.template_changed, "{second:?}");
        assert_eq!(second.anti_affinity_required, first.anti_affinity_required);
        assert_eq!(second.affinity_preferred, first.affinity_preferred);
        assert_eq!(second.ours, first.ours);
    }

    #[test]
    fn removal_takes_out_exactly_our_terms_and_keeps_the_users_in_order() {
        let w = user_workload();
        let original = w.clone();
        let added = merge(&w, &Terms::default(), &desired());
        let w2 = applied(w, &added);
        let removed = merge(&w2, &added.ours, &Terms::default());
        assert!(removed.template_changed);
        assert!(removed.ours.is_empty());
        let orig_anti = original
            .affinity
            .pod_anti_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap();
        assert_eq!(removed.anti_affinity_required, orig_anti);
        assert_eq!(removed.affinity_preferred, vec![weighted("zone", "db", 7)]);
        assert!(removed.anti_affinity_preferred.is_empty());
    }

    #[test]
    fn a_term_the_user_already_has_is_not_duplicated_nor_claimed() {
        let mut w = user_workload();
        w.affinity
            .pod_anti_affinity
            .as_mut()
            .unwrap()
            .required_during_scheduling_ignored_during_execution = Some(vec![term("zone", "web")]);
        let m = merge(&w, &Terms::default(), &desired());
        assert_eq!(m.anti_affinity_required, vec![term("zone", "web")]);
        assert!(
            m.ours.anti_affinity_required.is_empty(),
            "the user's term stays the user's"
        );
        // Removing ours later leaves the user's identical term in place.
        let w2 = applied(w, &m);
        let removed = merge(&w2, &m.ours, &Terms::default());
        assert_eq!(removed.anti_affinity_required, vec![term("zone", "web")]);
    }

    #[test]
    fn a_policy_change_replaces_only_our_terms() {
        let w = user_workload();
        let first = merge(&w, &Terms::default(), &desired());
        let w2 = applied(w, &first);
        let mut changed = desired();
        // Required -> Preferred for the zone term.
        changed.anti_affinity_required.clear();
        changed
            .anti_affinity_preferred
            .insert(0, weighted("zone", "web", 100));
        let second = merge(&w2, &first.ours, &changed);
        assert_eq!(
            second.anti_affinity_required,
            vec![term("rack", "user-a"), term("rack", "user-b")]
        );
        assert_eq!(
            second.anti_affinity_preferred,
            vec![weighted("zone", "web", 100), weighted("host", "web", 100)]
        );
        assert!(second.template_changed);
    }

    #[test]
    fn a_constraint_key_the_user_owns_is_skipped_not_taken_over() {
        let w = user_workload();
        let mut d = desired();
        d.topology_spread_constraints
            .push(tsc("rack", "DoNotSchedule", 3));
        let m = merge(&w, &Terms::default(), &d);
        assert_eq!(
            m.ours.topology_spread_constraints,
            vec![tsc("zone", "ScheduleAnyway", 1)]
        );
        assert_eq!(m.skipped.len(), 1);
        assert!(m.skipped[0].contains("rack"));
    }

    #[test]
    fn our_constraint_is_updated_in_place_and_removed_by_key() {
        let w = user_workload();
        let first = merge(&w, &Terms::default(), &desired());
        let w2 = applied(w, &first);
        let mut d = desired();
        d.topology_spread_constraints[0].max_skew = 2;
        let second = merge(&w2, &first.ours, &d);
        assert!(second.template_changed);
        assert_eq!(second.ours.topology_spread_constraints[0].max_skew, 2);
        let w3 = applied(w2, &second);
        let third = merge(&w3, &second.ours, &d);
        assert!(!third.template_changed);
    }

    #[test]
    fn an_untouched_workload_without_terms_needs_no_change() {
        let w = user_workload();
        let m = merge(&w, &Terms::default(), &Terms::default());
        assert!(!m.template_changed);
        assert!(m.ours.is_empty());
    }
}
