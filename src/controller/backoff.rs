//! Per-object error backoff, shared by both controllers: the delay before the next try doubles
//! with each consecutive failure of one object (1 s, 2 s, 4 s … capped at 5 minutes) and starts
//! over after a success, so one object that keeps failing neither spins nor slows the others.
//!
//! kube-runtime's `Controller` leaves the retry delay to the error policy and keeps no per-object
//! failure count; `backon` has the arithmetic but not the keyed memory that resets on success,
//! which is the part that matters here, so this small map stays ours.

use std::{collections::HashMap, sync::Mutex, time::Duration};

/// First delay after a failure.
pub const BASE: Duration = Duration::from_secs(1);
/// Longest delay.
pub const MAX: Duration = Duration::from_secs(300);

/// The delay after the `failures`th consecutive failure (from 1).
pub fn delay(failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    BASE.saturating_mul(1u32 << exp).min(MAX)
}

/// Consecutive failures per object key (`namespace/name`).
#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    /// Records a failure of `key`; returns how long to wait before trying it again.
    pub fn failed(&self, key: &str) -> Duration {
        let mut m = self.failures.lock().expect("backoff map poisoned");
        let n = m.entry(key.to_string()).or_default();
        *n = n.saturating_add(1);
        delay(*n)
    }

    /// Records a success of `key`: its next failure waits [`BASE`] again.
    pub fn succeeded(&self, key: &str) {
        self.failures
            .lock()
            .expect("backoff map poisoned")
            .remove(key);
    }

    /// Consecutive failures of `key` so far.
    pub fn failures(&self, key: &str) -> u32 {
        self.failures
            .lock()
            .expect("backoff map poisoned")
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_and_are_capped() {
        let d: Vec<u64> = (1..=11).map(|n| delay(n).as_secs()).collect();
        assert_eq!(d, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        assert_eq!(delay(u32::MAX), MAX);
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
}
