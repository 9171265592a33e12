//! Leader election on a `coordination.k8s.io/v1` Lease, so that two replicas
//! of the manager never both act.
//!
//! The protocol is client-go's: the holder renews `renewTime` every
//! `retry_period`; anyone may take the Lease once `renewTime +
//! leaseDurationSeconds` has passed; every write is a replace carrying the
//! `resourceVersion` that was read, so two candidates cannot both win. A
//! holder that cannot renew within `renew_deadline` gives up and stops acting
//! before anyone else may take over. On shutdown the holder releases the
//! Lease so that a standby takes over at once instead of after the lease
//! duration.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::{
    Api, Client,
    api::{ObjectMeta, PostParams},
};
use std::time::Duration;

/// Timings of the election (client-go's defaults).
#[derive(Clone, Debug)]
pub struct LeaseTimings {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
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

    /// Waits until this candidate holds the Lease.
    pub async fn acquire(&self) {
        let mut last_holder = None;
        loop {
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Acquired) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "acquired leader lease");
                    return;
                }
                Ok(Attempt::HeldByOther(holder)) => {
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(lease = %self.name, %holder, "waiting for the leader lease");
                        last_holder = Some(holder);
                    }
                }
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "leader election failed; retrying")
                }
            }
            tokio::time::sleep(self.timings.retry_period).await;
        }
    }

    /// Renews the Lease until a renewal fails for longer than the renew
    /// deadline; returns when leadership is lost.
    pub async fn hold(&self) {
        let mut last_renew = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.timings.retry_period).await;
            match self.try_acquire_or_renew().await {
                Ok(Attempt::Acquired) => last_renew = tokio::time::Instant::now(),
                Ok(Attempt::HeldByOther(holder)) => {
                    tracing::error!(lease = %self.name, %holder, "leader lease taken by another replica");
                    return;
                }
                Err(e) => {
                    tracing::warn!(lease = %self.name, error = %e, "could not renew leader lease");
                    if last_renew.elapsed() > self.timings.renew_deadline {
                        tracing::error!(lease = %self.name, "leader lease not renewed within the deadline");
                        return;
                    }
                }
            }
        }
    }

    /// Gives the Lease up (if still ours) so a standby can take over at once.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await else {
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
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => tracing::info!(lease = %self.name, "released leader lease"),
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "could not release leader lease")
            }
        }
    }

    async fn try_acquire_or_renew(&self) -> kube::Result<Attempt> {
        let now = Timestamp::now();
        let duration = self.timings.lease_duration.as_secs() as i32;
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
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
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Attempt::Acquired),
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    Ok(Attempt::HeldByOther("unknown".into()))
                }
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
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            spec.holder_identity = Some(self.identity.clone());
        }
        spec.renew_time = Some(MicroTime(now));
        spec.lease_duration_seconds = Some(duration);
        // The resourceVersion read above makes this a compare-and-swap.
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(Attempt::Acquired),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(Attempt::HeldByOther("unknown".into())),
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
}
