//! What the controller remembers between reconciles about rollouts, so that
//! pacing counts them right and every wait has a bound:
//!
//! - the template writes it made, until the cache shows them and their
//!   rollouts are over. A write the cache has not caught up with must not be
//!   made twice, and a removal's rollout still counts against the policy's
//!   `maxConcurrent` although it left no annotation on the workload to say so.
//!   An entry is tied to the workload's UID: a workload deleted and created
//!   again under the same name is a new one and inherits nothing.
//! - when each rollout under way was first seen, which bounds how long a
//!   rollout without progress holds up the others (see [`workload::bound`]).
//! - which policy each workload still rolling out a write of ours rolls it out for
//!   ([`Seen::rolling_for`]): kept beside the views rather than set on them, since a view is
//!   shared with the cache and setting it would copy it, a few KiB for every workload of a
//!   fan-out, at every reconcile until its rollout ends.
//! - the pod template each workload last completed a rollout of. Until its
//!   controller observes a change, a workload's status cannot say whether the
//!   change was a new template (a rollout) or, say, a scale; a change that left
//!   the template it had rolled out as it was is no rollout. Without this, every
//!   scale of a governed workload counted as a rollout for a moment: it held up
//!   pacing and flipped the policy's `Progressing` condition twice (issue 9, P2).
//!
//! Kept in memory only: after a restart the bounds start again, which only
//! ever waits longer, never writes more. Pure apart from the clock the caller
//! passes in.

use super::workload::{self, Rollout, Workload};
use crate::api::spread_policy::WorkloadKind;
use jiff::Timestamp;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

/// A workload: namespace, kind, name.
pub type Key = (String, WorkloadKind, String);

/// One template write of ours.
#[derive(Clone, Debug, PartialEq)]
struct Written {
    policy: String,
    uid: Option<String>,
    generation: i64,
}

#[derive(Debug, Default)]
pub struct Tracker {
    writes: HashMap<Key, Written>,
    rolling_since: HashMap<Key, Timestamp>,
    /// The uid and template hash of each workload when it was last seen rolled out.
    settled: HashMap<Key, (Option<String>, u64)>,
}

/// What the tracker tells one reconcile about a namespace.
#[derive(Debug, Default, PartialEq)]
pub struct Seen {
    /// Workloads whose last write by us the cache has not caught up with.
    pub unobserved: BTreeSet<(WorkloadKind, String)>,
    /// Workloads still rolling out a write of ours (those unobserved included), and the policy
    /// that made it: a removal leaves no annotation behind to tell.
    pub rolling: BTreeMap<(WorkloadKind, String), String>,
    /// The soonest a rollout under way stops counting (stops holding up pacing).
    pub next_bound: Option<Duration>,
}

impl Seen {
    /// The policy whose template write `w` is still rolling out, if any.
    pub fn rolling_for(&self, w: &Workload) -> Option<&str> {
        self.rolling
            .get(&(w.kind, w.name.clone()))
            .map(String::as_str)
    }
}

impl Tracker {
    /// Records a template write of `policy` that produced `generation`.
    pub fn wrote(&mut self, key: Key, policy: &str, uid: Option<String>, generation: i64) {
        self.writes.insert(
            key,
            Written {
                policy: policy.to_string(),
                uid,
                generation,
            },
        );
    }

    /// The policy whose write `key` is still rolling out, if any: a change of
    /// that workload must wake the policy even when the write took its owner
    /// annotation away (its rollout ending frees the policy's pacing budget).
    pub fn rolling_for(&self, key: &Key) -> Option<&str> {
        self.writes.get(key).map(|w| w.policy.as_str())
    }

    /// Brings the memory up to date with the cached `workloads` of `ns` and
    /// marks them: rollouts without progress for longer than their bound
    /// become [`Rollout::Stalled`], and a scale of a template rolled out is no rollout. A
    /// workload still rolling out a write of ours is named in [`Seen::rolling`], not marked.
    /// Each workload is copied only when something is set on it (its view is shared with the
    /// cache otherwise), which the steady state and a fan-out never do.
    pub fn observe(&mut self, ns: &str, workloads: &mut [Arc<Workload>], now: Timestamp) -> Seen {
        let mut seen = Seen::default();
        let present: BTreeSet<(WorkloadKind, &str)> = workloads
            .iter()
            .map(|w| (w.kind, w.name.as_str()))
            .collect();
        // Workloads that are gone hold nothing up.
        let gone = |k: &Key| k.0 == ns && !present.contains(&(k.1, k.2.as_str()));
        self.writes.retain(|k, _| !gone(k));
        self.rolling_since.retain(|k, _| !gone(k));
        self.settled.retain(|k, _| !gone(k));

        for w in workloads.iter_mut() {
            let key: Key = (ns.to_string(), w.kind, w.name.clone());
            if !w.unobserved && w.rollout == Rollout::Complete {
                self.settled
                    .insert(key.clone(), (w.uid.clone(), w.template_hash));
            } else if w.unobserved
                && w.rollout == Rollout::InProgress
                && !self.writes.contains_key(&key)
                && self.settled.get(&key) == Some(&(w.uid.clone(), w.template_hash))
            {
                // Changed outside the pod template it had rolled out: no rollout.
                Arc::make_mut(w).rollout = Rollout::Complete;
            }
            if w.rollout == Rollout::InProgress && !w.deleting {
                let first = *self.rolling_since.entry(key.clone()).or_insert(now);
                if let Some(left) = workload::bound(w, first, now) {
                    seen.next_bound = Some(seen.next_bound.map_or(left, |n| n.min(left)));
                }
            } else {
                self.rolling_since.remove(&key);
            }
            let Some(written) = self.writes.get(&key) else {
                continue;
            };
            let replaced = written.uid.is_some() && w.uid.is_some() && written.uid != w.uid;
            if replaced || w.deleting {
                self.writes.remove(&key);
                continue;
            }
            if w.generation.unwrap_or(0) < written.generation {
                seen.unobserved.insert((w.kind, w.name.clone()));
                seen.rolling
                    .insert((w.kind, w.name.clone()), written.policy.clone());
            } else if w.rollout == Rollout::InProgress {
                seen.rolling
                    .insert((w.kind, w.name.clone()), written.policy.clone());
            } else {
                self.writes.remove(&key);
            }
        }
        seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `observe` on plain views, as the tests build them: what it sets on one is copied back.
    fn observe(tr: &mut Tracker, ns: &str, ws: &mut [Workload], now: Timestamp) -> Seen {
        let mut shared: Vec<Arc<Workload>> = ws.iter().cloned().map(Arc::new).collect();
        let seen = tr.observe(ns, &mut shared, now);
        for (w, s) in ws.iter_mut().zip(shared) {
            *w = Arc::unwrap_or_clone(s);
        }
        seen
    }

    fn web(generation: i64, uid: &str, rollout: Rollout) -> Workload {
        Workload {
            kind: WorkloadKind::Deployment,
            name: "web".into(),
            namespace: "shop".into(),
            uid: Some(uid.into()),
            generation: Some(generation),
            rollout,
            progress_deadline: Duration::from_secs(600),
            ..Default::default()
        }
    }

    fn key() -> Key {
        ("shop".into(), WorkloadKind::Deployment, "web".into())
    }

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const T0: &str = "2026-01-01T00:00:00Z";

    #[test]
    fn a_write_is_unobserved_until_the_cache_has_it_then_rolls_until_complete() {
        let mut tr = Tracker::default();
        tr.wrote(key(), "web-ha", Some("u1".into()), 2);
        let mut ws = [web(1, "u1", Rollout::Complete)];
        let seen = observe(&mut tr, "shop", &mut ws, t(T0));
        assert!(
            seen.unobserved
                .contains(&(WorkloadKind::Deployment, "web".into()))
        );
        assert_eq!(seen.rolling_for(&ws[0]), Some("web-ha"));

        let mut ws = [web(2, "u1", Rollout::InProgress)];
        let seen = observe(&mut tr, "shop", &mut ws, t(T0));
        assert!(seen.unobserved.is_empty());
        assert_eq!(seen.rolling_for(&ws[0]), Some("web-ha"));
        assert_eq!(seen.next_bound, Some(Duration::from_secs(605)));

        let mut ws = [web(2, "u1", Rollout::Complete)];
        let seen = observe(&mut tr, "shop", &mut ws, t(T0));
        assert_eq!(seen.rolling_for(&ws[0]), None);
        let mut ws = [web(2, "u1", Rollout::InProgress)];
        let seen = observe(&mut tr, "shop", &mut ws, t(T0));
        assert_eq!(seen.rolling_for(&ws[0]), None, "forgotten once complete");
    }

    /// `web` whose controller has not observed its last change yet, with template `hash`.
    fn changed(generation: i64, hash: u64) -> Workload {
        Workload {
            unobserved: true,
            template_hash: hash,
            ..web(generation, "u1", Rollout::InProgress)
        }
    }

    #[test]
    fn a_scale_of_a_rolled_out_template_is_no_rollout_but_a_new_template_is() {
        let mut tr = Tracker::default();
        let settled = Workload {
            template_hash: 7,
            ..web(1, "u1", Rollout::Complete)
        };
        observe(&mut tr, "shop", &mut [settled], t(T0));
        // A scale: the same template, not observed yet.
        let mut ws = [changed(2, 7)];
        observe(&mut tr, "shop", &mut ws, t(T0));
        assert_eq!(ws[0].rollout, Rollout::Complete);
        // A new template is a rollout until its controller says it is done.
        let mut ws = [changed(3, 8)];
        observe(&mut tr, "shop", &mut ws, t(T0));
        assert_eq!(ws[0].rollout, Rollout::InProgress);
        // So is a workload created again under the name, and one never seen rolled out.
        let mut ws = [Workload {
            uid: Some("u2".into()),
            ..changed(1, 7)
        }];
        observe(&mut tr, "shop", &mut ws, t(T0));
        assert_eq!(ws[0].rollout, Rollout::InProgress);
        let mut fresh = Tracker::default();
        let mut ws = [changed(2, 7)];
        observe(&mut fresh, "shop", &mut ws, t(T0));
        assert_eq!(ws[0].rollout, Rollout::InProgress);
    }

    #[test]
    fn a_template_change_of_ours_not_observed_yet_is_a_rollout_whatever_the_hash() {
        let mut tr = Tracker::default();
        observe(
            &mut tr,
            "shop",
            &mut [Workload {
                template_hash: 7,
                ..web(1, "u1", Rollout::Complete)
            }],
            t(T0),
        );
        tr.wrote(key(), "web-ha", Some("u1".into()), 2);
        let mut ws = [changed(2, 7)];
        observe(&mut tr, "shop", &mut ws, t(T0));
        assert_eq!(ws[0].rollout, Rollout::InProgress);
    }

    #[test]
    fn a_removal_is_remembered_for_waking_its_policy_until_its_rollout_ends() {
        let mut tr = Tracker::default();
        tr.wrote(key(), "web-ha", Some("u1".into()), 2);
        assert_eq!(tr.rolling_for(&key()), Some("web-ha"));
        observe(
            &mut tr,
            "shop",
            &mut [web(2, "u1", Rollout::Complete)],
            t(T0),
        );
        assert_eq!(tr.rolling_for(&key()), None);
    }

    #[test]
    fn a_workload_created_again_under_the_same_name_inherits_nothing() {
        let mut tr = Tracker::default();
        tr.wrote(key(), "web-ha", Some("u1".into()), 5);
        // The new object starts at generation 1, below the old write's.
        let mut ws = [web(1, "u2", Rollout::InProgress)];
        let seen = observe(&mut tr, "shop", &mut ws, t(T0));
        assert!(seen.unobserved.is_empty());
        assert_eq!(seen.rolling_for(&ws[0]), None);
    }

    #[test]
    fn a_deleted_workload_is_forgotten() {
        let mut tr = Tracker::default();
        tr.wrote(key(), "web-ha", Some("u1".into()), 5);
        observe(&mut tr, "shop", &mut [], t(T0));
        let mut ws = [web(1, "u1", Rollout::Complete)];
        assert!(
            observe(&mut tr, "shop", &mut ws, t(T0))
                .unobserved
                .is_empty()
        );
    }

    #[test]
    fn a_rollout_stops_counting_its_deadline_after_it_was_first_seen() {
        let mut tr = Tracker::default();
        let mut ws = [web(2, "u1", Rollout::InProgress)];
        observe(&mut tr, "shop", &mut ws, t(T0));
        let mut ws = [web(2, "u1", Rollout::InProgress)];
        let seen = observe(&mut tr, "shop", &mut ws, t("2026-01-01T00:10:04Z"));
        assert_eq!(seen.next_bound, Some(Duration::from_secs(1)));
        let mut ws = [web(2, "u1", Rollout::InProgress)];
        let seen = observe(&mut tr, "shop", &mut ws, t("2026-01-01T00:10:05Z"));
        assert_eq!(ws[0].rollout, Rollout::Stalled);
        assert_eq!(seen.next_bound, None);
        // Completing and starting again starts a new bound.
        observe(
            &mut tr,
            "shop",
            &mut [web(3, "u1", Rollout::Complete)],
            t("2026-01-01T00:11:00Z"),
        );
        let mut ws = [web(4, "u1", Rollout::InProgress)];
        observe(&mut tr, "shop", &mut ws, t("2026-01-01T00:12:00Z"));
        assert_eq!(ws[0].rollout, Rollout::InProgress);
    }

    #[test]
    fn other_namespaces_are_left_alone() {
        let mut tr = Tracker::default();
        tr.wrote(key(), "web-ha", Some("u1".into()), 5);
        observe(&mut tr, "other", &mut [], t(T0));
        let mut ws = [web(1, "u1", Rollout::Complete)];
        assert!(
            !observe(&mut tr, "shop", &mut ws, t(T0))
                .unobserved
                .is_empty()
        );
    }
}
