//! One `set_condition` with the Kubernetes API conventions' rules, shared by
//! both controllers:
//!
//! - conditions are a list-map keyed by `type`; setting one never reorders
//!   the others and a new type is appended;
//! - `lastTransitionTime` moves only when `status` changes (a new reason or
//!   message alone keeps it);
//! - `observedGeneration` is the generation the condition was computed from.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// `True`, `False` or `Unknown`, as the API spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

impl From<bool> for Status {
    fn from(b: bool) -> Self {
        if b { Status::True } else { Status::False }
    }
}

/// Sets condition `type_` in `conditions`. Returns whether anything changed.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: Status,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Timestamp,
) -> bool {
    let message = message.into();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(c) => {
            let changed = c.status != status.as_str()
                || c.reason != reason
                || c.message != message
                || c.observed_generation != observed_generation;
            if c.status != status.as_str() {
                c.status = status.as_str().to_string();
                c.last_transition_time = Time(now);
            }
            c.reason = reason.to_string();
            c.message = message;
            c.observed_generation = observed_generation;
            changed
        }
        None => {
            conditions.push(Condition {
                type_: type_.to_string(),
                status: status.as_str().to_string(),
                reason: reason.to_string(),
                message,
                observed_generation,
                last_transition_time: Time(now),
            });
            true
        }
    }
}

/// The condition of type `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Whether condition `type_` is present with status `True`.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    find(conditions, type_).is_some_and(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::SignedDuration;

    fn t0() -> Timestamp {
        Timestamp::from_second(1_700_000_000).unwrap()
    }

    #[test]
    fn a_new_condition_is_appended_with_the_transition_time() {
        let mut cs = vec![];
        assert!(set_condition(
            &mut cs,
            "Ready",
            Status::True,
            "Applied",
            "ok",
            Some(1),
            t0()
        ));
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].last_transition_time, Time(t0()));
    }

    #[test]
    fn transition_time_moves_only_when_status_changes() {
        let mut cs = vec![];
        set_condition(
            &mut cs,
            "Ready",
            Status::False,
            "Pending",
            "a",
            Some(1),
            t0(),
        );
        let later = t0() + SignedDuration::from_secs(60);
        assert!(set_condition(
            &mut cs,
            "Ready",
            Status::False,
            "Other",
            "b",
            Some(2),
            later
        ));
        assert_eq!(
            cs[0].last_transition_time,
            Time(t0()),
            "reason change keeps the time"
        );
        assert_eq!(cs[0].reason, "Other");
        let even_later = later + SignedDuration::from_secs(60);
        assert!(set_condition(
            &mut cs,
            "Ready",
            Status::True,
            "Applied",
            "c",
            Some(2),
            even_later
        ));
        assert_eq!(cs[0].last_transition_time, Time(even_later));
    }

    #[test]
    fn setting_the_same_condition_again_reports_no_change() {
        let mut cs = vec![];
        set_condition(
            &mut cs,
            "Ready",
            Status::True,
            "Applied",
            "ok",
            Some(1),
            t0(),
        );
        let later = t0() + SignedDuration::from_secs(5);
        assert!(!set_condition(
            &mut cs,
            "Ready",
            Status::True,
            "Applied",
            "ok",
            Some(1),
            later
        ));
        assert_eq!(cs[0].last_transition_time, Time(t0()));
    }

    #[test]
    fn setting_one_condition_keeps_the_order_of_the_others() {
        let mut cs = vec![];
        for t in ["Ready", "Progressing", "Conflicted"] {
            set_condition(&mut cs, t, Status::False, "R", "", None, t0());
        }
        set_condition(&mut cs, "Progressing", Status::True, "R", "", None, t0());
        let types: Vec<_> = cs.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["Ready", "Progressing", "Conflicted"]);
        assert!(is_true(&cs, "Progressing"));
    }
}
