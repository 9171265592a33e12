//! Keyed exponential backoff, shared by both controllers: per object key, the wait before the
//! next try is twice the last one after each consecutive failure (from a first wait, capped at a
//! longest one) and starts over after a success, so one object that keeps failing neither spins
//! nor slows the others. It also remembers when each key last failed, so a caller can ask how
//! long is left of its wait ([`Backoff::remaining`]) without a timer of its own.
//!
//! Two uses: the error policy of both controllers (1 s doubling to 5 minutes, [`BASE`] and
//! [`MAX`]), and the RolloutStrategy controller's looks for a target its cache does not show
//! ([`Looks`](super::rollout_strategy::observe::Looks)).
//!
//! kube-runtime's `Controller` leaves the retry delay to the error policy and keeps no per-object
//! failure count; `backon` has the arithmetic but not the keyed memory that resets on success,
//! which is the part that matters here, so this small map stays ours.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

/// First delay after a reconcile error.
pub const BASE: Duration = Duration::from_secs(1);
/// Longest delay after reconcile errors.
pub const MAX: Duration = Duration::from_secs(300);

/// Per object key (`namespace/name`): consecutive failures, and when the last one was.
#[derive(Debug)]
pub struct Backoff {
    first: Duration,
    longest: Duration,
    tries: Mutex<HashMap<String, Failed>>,
}

#[derive(Debug, Clone, Copy)]
struct Failed {
    count: u32,
    at: Instant,
    wait: Duration,
}

impl Default for Backoff {
    /// The error policy's: [`BASE`] doubling to [`MAX`].
    fn default() -> Self {
        Self::new(BASE, MAX)
    }
}

impl Backoff {
    /// Waits of `first` after a first failure, doubling up to `longest`.
    pub fn new(first: Duration, longest: Duration) -> Self {
        Self {
            first,
            longest,
            tries: Mutex::default(),
        }
    }

    fn tries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Failed>> {
        // A panic while holding the lock leaves a consistent map: each method makes one change.
        self.tries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a failure of `key` now; returns how long to wait before trying it again.
    pub fn failed(&self, key: &str) -> Duration {
        self.failed_within(key, self.longest)
    }

    /// As [`Backoff::failed`], with a longest wait of `longest` for this failure (a cap that
    /// depends on the moment, such as the gate in force). The next failure doubles the wait
    /// this one got, so a wait held down by a cap grows again from there once the cap is lifted.
    pub fn failed_within(&self, key: &str, longest: Duration) -> Duration {
        let mut tries = self.tries();
        let last = tries.get(key).copied();
        let count = last.map_or(0, |f| f.count).saturating_add(1);
        let wait = last
            .map_or(self.first, |f| f.wait.saturating_mul(2).max(self.first))
            .min(longest.min(self.longest));
        tries.insert(
            key.to_string(),
            Failed {
                count,
                at: Instant::now(),
                wait,
            },
        );
        wait
    }

    /// Records a success of `key` (or forgets it): its next failure waits the first wait again.
    pub fn succeeded(&self, key: &str) {
        self.tries().remove(key);
    }

    /// Consecutive failures of `key` so far.
    pub fn failures(&self, key: &str) -> u32 {
        self.tries().get(key).map_or(0, |f| f.count)
    }

    /// How long is left of the wait after `key`'s last failure: zero when it may be tried now
    /// (it never failed, succeeded since, or its wait is over).
    pub fn remaining(&self, key: &str) -> Duration {
        self.remaining_within(key, self.longest)
    }

    /// As [`Backoff::remaining`], of a wait cut to at most `longest` (a cap lowered since the
    /// failure).
    pub fn remaining_within(&self, key: &str, longest: Duration) -> Duration {
        self.tries().get(key).map_or(Duration::ZERO, |f| {
            f.wait.min(longest).saturating_sub(f.at.elapsed())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_and_are_capped() {
        let b = Backoff::default();
        let d: Vec<u64> = (1..=11).map(|_| b.failed("a/x").as_secs()).collect();
        assert_eq!(d, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        for _ in 0..100 {
            b.failed("a/x");
        }
        assert_eq!(b.failed("a/x"), MAX);
        assert_eq!(b.failures("a/x"), 112);
        let s = Duration::from_secs;
        let b = Backoff::new(s(10), s(60));
        let d: Vec<u64> = (1..=4).map(|_| b.failed("a/x").as_secs()).collect();
        assert_eq!(d, [10, 20, 40, 60]);
    }

    #[test]
    fn a_success_resets_the_backoff_of_that_object_only() {
        let b = Backoff::default();
        assert_eq!(b.failed("a/x"), Duration::from_secs(1));
        assert_eq!(b.failed("a/x"), Duration::from_secs(2));
        assert_eq!(b.failed("a/y"), Duration::from_secs(1));
        b.succeeded("a/x");
        assert_eq!(b.failures("a/x"), 0);
        assert_eq!(b.failed("a/x"), Duration::from_secs(1));
        assert_eq!(b.failures("a/y"), 1);
    }

    #[test]
    fn what_remains_of_a_wait_counts_down_from_the_last_failure() {
        let b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        assert_eq!(b.remaining("a/x"), Duration::ZERO, "never failed: now");
        b.failed("a/x");
        let left = b.remaining("a/x");
        assert!(left > Duration::from_secs(9) && left <= Duration::from_secs(10));
        b.failed("a/x");
        assert!(
            b.remaining("a/x") > Duration::from_secs(10),
            "twice as long"
        );
        b.succeeded("a/x");
        assert_eq!(b.remaining("a/x"), Duration::ZERO, "succeeded: now");
    }

    #[test]
    fn a_cap_given_with_a_failure_bounds_that_wait_and_the_next_grows_from_it() {
        let s = Duration::from_secs;
        let b = Backoff::new(s(10), s(300));
        for _ in 0..6 {
            assert_eq!(
                b.failed_within("a/x", s(10)),
                s(10),
                "held at the cap given"
            );
        }
        assert_eq!(
            b.failed("a/x"),
            s(20),
            "twice the last wait once the cap is lifted"
        );
        assert_eq!(b.failed("a/x"), s(40));
        for _ in 0..4 {
            b.failed_within("a/x", s(900));
        }
        assert_eq!(
            b.failed_within("a/x", s(900)),
            s(300),
            "never past the backoff's own"
        );
    }

    #[test]
    fn a_cap_lowered_since_the_failure_shortens_what_remains() {
        let s = Duration::from_secs;
        let b = Backoff::new(s(10), s(300));
        for _ in 0..5 {
            b.failed("a/x");
        }
        assert!(b.remaining("a/x") > s(150), "160 s");
        let left = b.remaining_within("a/x", s(10));
        assert!(left > s(9) && left <= s(10), "{left:?}");
    }
}
