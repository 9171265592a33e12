//! Liveness of the manager's watches, for `/healthz`: a watch that has failed without a single
//! success for longer than [`STALE_AFTER`] means the manager acts on a picture of the cluster
//! that no longer moves, and a restart (which relists everything) is the remedy kubelet can
//! apply. A quiet watch is healthy: only continuous failure counts.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// How long a watch may fail without a success before `/healthz` reports it.
pub const STALE_AFTER: Duration = Duration::from_secs(120);

/// Shared record of each named watch: since when it has been failing, if it is.
#[derive(Clone, Debug, Default)]
pub struct Health {
    failing_since: Arc<Mutex<BTreeMap<String, Instant>>>,
}

impl Health {
    /// Records an event or a (re)list of watch `name`.
    pub fn watch_ok(&self, name: &str) {
        let mut m = self.failing_since.lock().expect("health map poisoned");
        if m.contains_key(name) {
            m.remove(name);
        }
    }

    /// Records an error of watch `name`; the first of a run starts its clock.
    pub fn watch_failed(&self, name: &str) {
        self.failing_since
            .lock()
            .expect("health map poisoned")
            .entry(name.to_string())
            .or_insert_with(Instant::now);
    }

    /// `Err` naming the watches that have failed for longer than `after`.
    pub fn check(&self, after: Duration) -> Result<(), String> {
        let m = self.failing_since.lock().expect("health map poisoned");
        let stale: Vec<String> = m
            .iter()
            .filter(|(_, since)| since.elapsed() > after)
            .map(|(name, since)| format!("watch {name} failing for {}s", since.elapsed().as_secs()))
            .collect();
        if stale.is_empty() {
            Ok(())
        } else {
            Err(stale.join("; "))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_failing_past_the_limit_is_reported_until_it_recovers() {
        let h = Health::default();
        assert!(h.check(Duration::ZERO).is_ok());
        h.watch_failed("rollout-strategy/deployments");
        std::thread::sleep(Duration::from_millis(5));
        let err = h.check(Duration::from_millis(1)).unwrap_err();
        assert!(err.contains("rollout-strategy/deployments"), "{err}");
        assert!(h.check(Duration::from_secs(60)).is_ok(), "not yet stale");
        h.watch_ok("rollout-strategy/deployments");
        assert!(h.check(Duration::ZERO).is_ok());
    }
}
