//! What the controller's own writes lead it to expect of its watch caches, so that it decides
//! on the caches instead of reading the strategy afresh before every step.
//!
//! A cache can lag our own last write: the status we wrote a moment ago, the Deployment we
//! just unpaused, the Job we just created. Deciding on such a copy could repeat a step (a
//! sequence started twice counts its attempts twice). So every write records the
//! `resourceVersion` the API server answered with, and a step is decided only on caches that
//! show at least that version of each object written (the watch event of the write is on its
//! way and wakes the strategy again); a deleted Job must be gone from the cache. Nothing
//! recorded (the first step after the manager started, when a write just before a restart may
//! not be in the API server's watch cache yet) means: read the strategy afresh, once. A
//! resourceVersion that is not a number (etcd's are; the API makes no promise) or a cache that
//! has not caught up within [`PATIENCE`] means the same.
//!
//! What ballast writes is compared, not what others write: a cache that lags someone else's
//! change is the same as its watch event coming a moment later, which every decision allows for
//! (see `sync` in the module above).

use crate::k8s::version_number;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a cache may take to show one of our writes before the object is read afresh.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// An object ballast writes, by kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    Strategy(String, String),
    Deployment(String, String),
    Job(String, String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// Written at this resourceVersion (or later).
    AtLeast(u64),
    /// Deleted.
    Gone,
}

/// Whether a cached copy shows what we expect of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// It shows our last write (or later), or we expect nothing of it.
    Yes,
    /// Our last write is not in it yet: its watch event is on its way.
    NotYet,
    /// We do not know (nothing recorded since the start, not a number, or waited too long):
    /// read it afresh.
    Unknown,
}

/// The expectations of one controller.
#[derive(Debug, Default)]
pub struct Expectations {
    wants: Mutex<HashMap<Key, (Want, Instant)>>,
}

impl Expectations {
    /// Records our write of `key`, answered with `rv`. A version that is not a number leaves
    /// nothing to compare: the object's next decision reads it afresh.
    pub fn wrote(&self, key: Key, rv: Option<&str>) {
        let mut wants = self.wants.lock().unwrap_or_else(|p| p.into_inner());
        match rv.and_then(version_number) {
            Some(v) => {
                wants.insert(key, (Want::AtLeast(v), Instant::now()));
            }
            None => {
                wants.remove(&key);
            }
        }
    }

    /// Records our delete of `key`.
    pub fn deleted(&self, key: Key) {
        let mut wants = self.wants.lock().unwrap_or_else(|p| p.into_inner());
        wants.insert(key, (Want::Gone, Instant::now()));
    }

    /// Whether a cached copy of `key` at `cached` (`None`: not in the cache) shows what we
    /// expect of it. `known` says whether nothing recorded means "nothing expected" (objects we
    /// may never have written) or [`Seen::Unknown`] (the strategy, whose own copy decides).
    /// Met expectations are dropped; so are those older than [`PATIENCE`] (then `Unknown`).
    pub fn seen(&self, key: &Key, cached: Option<&str>, known: bool) -> Seen {
        let mut wants = self.wants.lock().unwrap_or_else(|p| p.into_inner());
        let Some((want, since)) = wants.get(key).copied() else {
            return if known { Seen::Yes } else { Seen::Unknown };
        };
        let shown = match (want, cached) {
            (Want::Gone, None) => Some(true),
            (Want::Gone, Some(_)) | (Want::AtLeast(_), None) => Some(false),
            (Want::AtLeast(v), Some(rv)) => version_number(rv).map(|c| c >= v),
        };
        match shown {
            Some(true) if known => {
                wants.remove(key);
                Seen::Yes
            }
            // The strategy's copy stays the reference: only our next write replaces it.
            Some(true) => Seen::Yes,
            Some(false) if since.elapsed() < PATIENCE => Seen::NotYet,
            _ => {
                wants.remove(key);
                Seen::Unknown
            }
        }
    }

    /// Forgets what is expected of `key` (it is gone for good).
    pub fn forget(&self, key: &Key) {
        let mut wants = self.wants.lock().unwrap_or_else(|p| p.into_inner());
        wants.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strategy() -> Key {
        Key::Strategy("ns".into(), "web".into())
    }

    #[test]
    fn a_strategy_never_written_since_the_start_is_read_afresh() {
        let e = Expectations::default();
        assert_eq!(e.seen(&strategy(), Some("5"), false), Seen::Unknown);
    }

    #[test]
    fn a_cache_behind_our_own_write_waits_and_one_that_caught_up_decides() {
        let e = Expectations::default();
        e.wrote(strategy(), Some("120"));
        assert_eq!(e.seen(&strategy(), Some("119"), false), Seen::NotYet);
        assert_eq!(e.seen(&strategy(), Some("120"), false), Seen::Yes);
        assert_eq!(e.seen(&strategy(), Some("500"), false), Seen::Yes);
        // Still the reference for the strategy: an older copy is never taken for it.
        assert_eq!(e.seen(&strategy(), Some("119"), false), Seen::NotYet);
    }

    #[test]
    fn objects_we_did_not_write_are_taken_as_cached_and_met_ones_are_forgotten() {
        let e = Expectations::default();
        let dep = Key::Deployment("ns".into(), "web".into());
        assert_eq!(e.seen(&dep, Some("7"), true), Seen::Yes);
        e.wrote(dep.clone(), Some("9"));
        assert_eq!(e.seen(&dep, Some("7"), true), Seen::NotYet);
        assert_eq!(e.seen(&dep, Some("9"), true), Seen::Yes);
        assert_eq!(
            e.seen(&dep, Some("7"), true),
            Seen::Yes,
            "forgotten once met"
        );
    }

    #[test]
    fn a_created_job_must_be_cached_and_a_deleted_one_gone() {
        let e = Expectations::default();
        let job = Key::Job("ns".into(), "web-migrate-1".into());
        e.wrote(job.clone(), Some("30"));
        assert_eq!(e.seen(&job, None, true), Seen::NotYet);
        assert_eq!(e.seen(&job, Some("30"), true), Seen::Yes);
        e.deleted(job.clone());
        assert_eq!(e.seen(&job, Some("31"), true), Seen::NotYet);
        assert_eq!(e.seen(&job, None, true), Seen::Yes);
    }

    #[test]
    fn a_version_that_is_not_a_number_is_read_afresh() {
        let e = Expectations::default();
        e.wrote(strategy(), Some("opaque"));
        assert_eq!(e.seen(&strategy(), Some("5"), false), Seen::Unknown);
        e.wrote(strategy(), Some("5"));
        assert_eq!(e.seen(&strategy(), Some("opaque"), false), Seen::Unknown);
    }
}
