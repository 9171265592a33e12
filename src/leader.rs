//! Leader election on a `coordination.k8s.io/v1` Lease, so that two replicas of the manager never
//! both act.
//!
//! The protocol is client-go's: the holder renews `renewTime` every `retry_period`; anyone may
//! take the Lease once `renewTime + leaseDurationSeconds` has passed; every write is a replace
//! carrying the `resourceVersion` that was read, so two candidates cannot both win. What makes
//! it safe is the holder's side: every Lease call has its own timeout, and a timer set to
//! `renew_deadline` after the start of the last successful renewal fires even while a call
//! hangs. The holder then steps down (the manager exits at once), `lease_duration -
//! renew_deadline` before anyone else may take the Lease. On shutdown the holder releases the
//! Lease so that a standby takes over at once instead of after the lease duration.
//!
//! Why not kube-lease-manager (0.13, on kube 5): a holder that cannot reach the API server never
//! steps down. Its renewal is one call with no deadline of its own, and an error only makes it
//! retry: the "leader" flag it publishes stays `true` until it reaches the API server again and
//! sees another holder. `tests/foundation.rs` shows it against the local control plane:
//! `kube_lease_manager_keeps_leading_while_cut_off_from_the_api_server` (run by `make test`; it
//! starts failing the day a release steps down) cuts one manager off, and the other takes the Lease
//! while the first still says it leads; `a_leader_cut_off_from_the_api_server_steps_down_before_another_leads`
//! is the same scenario against this module.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use std::time::Duration;
use tokio::time::Instant;

/// Timings of the election.
#[derive(Clone, Debug)]
pub struct LeaseTimings {
    /// How long the Lease lasts without renewal (written into the Lease).
    pub lease_duration: Duration,
    /// How long the holder keeps acting without a successful renewal. Shorter than
    /// `lease_duration`: the difference covers clock skew and the time to stop.
    pub renew_deadline: Duration,
    /// Pause between two attempts.
    pub retry_period: Duration,
    /// Limit of one Lease API call.
    pub call_timeout: Duration,
}

impl LeaseTimings {
    /// Timings for a Lease of `lease_duration`, in client-go's proportions (15 s → renew
    /// deadline 10 s, retry 2 s).
    pub fn for_duration(lease_duration: Duration) -> Self {
        let renew_deadline = lease_duration * 2 / 3;
        Self {
            lease_duration,
            renew_deadline,
            retry_period: (renew_deadline / 3).min(Duration::from_secs(2)),
            call_timeout: renew_deadline / 2,
        }
    }
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self::for_duration(Duration::from_secs(15))
    }
}

/// Why leadership ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Lost {
    /// Another candidate holds the Lease.
    TakenBy(String),
    /// No renewal succeeded within the renew deadline.
    Deadline,
}

impl std::fmt::Display for Lost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lost::TakenBy(h) => write!(f, "the Lease is held by {h}"),
            Lost::Deadline => f.write_str("the Lease was not renewed within the renew deadline"),
        }
    }
}

pub struct LeaderElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    timings: LeaseTimings,
}

#[derive(Debug, PartialEq, Eq)]
enum Attempt {
    Acquired,
    HeldByOther(String),
    /// The Lease changed between our read and our write: read again.
    Conflict,
}

#[derive(Debug, thiserror::Error)]
enum CallError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

impl LeaderElector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timings: LeaseTimings,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_string(),
            identity: identity.to_string(),
            timings,
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Waits until this candidate holds the Lease; returns when the winning attempt began,
    /// which is what [`hold`](Self::hold) counts the renew deadline from.
    pub async fn acquire(&self) -> Instant {
        let mut last_holder = None;
        loop {
            let started = Instant::now();
            match self.attempt(self.timings.call_timeout).await {
                Ok(Attempt::Acquired) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "acquired leader lease");
                    return started;
                }
                Ok(Attempt::HeldByOther(holder)) => {
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(lease = %self.name, %holder, "waiting for the leader lease");
                        last_holder = Some(holder);
                    }
                }
                Ok(Attempt::Conflict) => {}
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "leader election failed; retrying")
                }
            }
            tokio::time::sleep(self.timings.retry_period).await;
        }
    }

    /// Renews the Lease, acquired by an attempt that began at `renewed`, until leadership is
    /// lost; returns why. Returns by `renewed + renew_deadline` of the last successful renewal
    /// at the latest, whatever the API server does.
    pub async fn hold(&self, mut renewed: Instant) -> Lost {
        loop {
            let deadline = renewed + self.timings.renew_deadline;
            let next = async {
                tokio::time::sleep(self.timings.retry_period).await;
                let started = Instant::now();
                // A call that would outlive the deadline is of no use.
                let limit = self
                    .timings
                    .call_timeout
                    .min(deadline.saturating_duration_since(started));
                (started, self.attempt(limit).await)
            };
            let (started, result) = tokio::select! {
                r = next => r,
                _ = tokio::time::sleep_until(deadline) => {
                    tracing::error!(lease = %self.name, deadline = ?self.timings.renew_deadline, "leader lease not renewed within the deadline");
                    return Lost::Deadline;
                }
            };
            match result {
                Ok(Attempt::Acquired) => renewed = started,
                Ok(Attempt::HeldByOther(holder)) => {
                    tracing::error!(lease = %self.name, %holder, "leader lease taken by another replica");
                    return Lost::TakenBy(holder);
                }
                Ok(Attempt::Conflict) => {
                    tracing::info!(lease = %self.name, "leader lease changed while renewing; reading it again")
                }
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "could not renew leader lease")
                }
            }
        }
    }

    /// Gives the Lease up (if still ours) so a standby can take over at once. Bounded: a
    /// release that cannot be made is left to expire.
    pub async fn release(&self) {
        let limit = self.timings.call_timeout;
        let Ok(Some(mut lease)) = self.call(limit, self.api.get_opt(&self.name)).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.acquire_time = None;
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        spec.lease_duration_seconds = Some(1);
        let pp = PostParams::default();
        let replace = self.api.replace(&self.name, &pp, &lease);
        match self.call(limit, replace).await {
            Ok(_) => tracing::info!(lease = %self.name, "released leader lease"),
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "could not release leader lease")
            }
        }
    }

    async fn call<T>(
        &self,
        limit: Duration,
        f: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, CallError> {
        match tokio::time::timeout(limit, f).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(CallError::Timeout(limit)),
        }
    }

    /// One read and (unless another holds it) one write of the Lease, each within `limit`.
    async fn attempt(&self, limit: Duration) -> Result<Attempt, CallError> {
        let now = Timestamp::now();
        let duration = i32::try_from(self.timings.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.call(limit, self.api.get_opt(&self.name)).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(duration),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            let pp = PostParams::default();
            let create = self.api.create(&pp, &lease);
            return match self.call(limit, create).await {
                Ok(_) => Ok(Attempt::Acquired),
                Err(CallError::Api(kube::Error::Api(s))) if s.code == 409 => Ok(Attempt::Conflict),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
        let ours = holder.as_deref() == Some(self.identity.as_str());
        if !ours {
            if let Some(holder) = holder
                && !expired(spec, now)
            {
                return Ok(Attempt::HeldByOther(holder));
            }
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            spec.holder_identity = Some(self.identity.clone());
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(duration);
        // The resourceVersion read above makes this a compare-and-swap.
        let pp = PostParams::default();
        let replace = self.api.replace(&self.name, &pp, &lease);
        match self.call(limit, replace).await {
            Ok(_) => Ok(Attempt::Acquired),
            Err(CallError::Api(kube::Error::Api(s))) if s.code == 409 => Ok(Attempt::Conflict),
            Err(e) => Err(e),
        }
    }
}

fn expired(spec: &LeaseSpec, now: Timestamp) -> bool {
    let Some(MicroTime(renewed)) = spec.renew_time else {
        return true;
    };
    let duration = SignedDuration::from_secs(spec.lease_duration_seconds.unwrap_or(0).into());
    renewed + duration < now
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(renewed_secs_ago: i64, duration: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some("other".into()),
            renew_time: Some(MicroTime(
                Timestamp::now() - SignedDuration::from_secs(renewed_secs_ago),
            )),
            lease_duration_seconds: Some(duration),
            ..Default::default()
        }
    }

    #[test]
    fn a_lease_renewed_within_its_duration_is_held() {
        assert!(!expired(&spec(5, 15), Timestamp::now()));
    }

    #[test]
    fn a_lease_not_renewed_within_its_duration_can_be_taken() {
        assert!(expired(&spec(16, 15), Timestamp::now()));
    }

    #[test]
    fn a_lease_without_renew_time_can_be_taken() {
        assert!(expired(&LeaseSpec::default(), Timestamp::now()));
    }

    #[test]
    fn the_holder_gives_up_well_before_the_lease_can_be_taken() {
        for secs in [6, 15, 60] {
            let t = LeaseTimings::for_duration(Duration::from_secs(secs));
            assert!(
                t.renew_deadline + t.retry_period <= t.lease_duration,
                "{t:?}"
            );
            assert!(t.call_timeout < t.renew_deadline, "{t:?}");
            assert!(t.retry_period > Duration::ZERO, "{t:?}");
        }
    }

    /// The deadline timer fires while a renewal hangs: an API server that accepts the
    /// connection and never answers.
    #[tokio::test]
    async fn a_hanging_renewal_still_steps_down_at_the_deadline() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let _blackhole = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let timings = LeaseTimings {
            lease_duration: Duration::from_secs(3),
            renew_deadline: Duration::from_millis(1500),
            retry_period: Duration::from_millis(200),
            // Longer than the deadline: only the deadline timer can end the wait.
            call_timeout: Duration::from_secs(60),
        };
        let e = LeaderElector::new(client, "ns", "lease", "me", timings);
        let renewed = Instant::now();
        let lost = tokio::time::timeout(Duration::from_secs(5), e.hold(renewed))
            .await
            .expect("hold returns although every call hangs");
        assert_eq!(lost, Lost::Deadline);
        let took = renewed.elapsed();
        assert!(
            took >= Duration::from_millis(1500) && took < Duration::from_millis(2500),
            "{took:?}"
        );
    }
}
