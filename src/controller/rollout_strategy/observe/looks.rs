//! What the caches do not show of a target, read afresh: whether a decision needs it
//! ([`needs_fresh_target`]), the read ([`read_target`]), and when a target that stays missing is
//! looked for again ([`Looks`]).

use super::{DeploymentView, Observed, trim_deployment};
use crate::api::RolloutStrategyStatus;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use kube::{Api, Client, api::ListParams};
use std::time::Duration;

/// Whether the decision about `observed`'s Deployment needs it read afresh: the cache shows no
/// Deployment not labelled governed (its absence there does not mean it does not exist), nor
/// the template of any ReplicaSet, which adoption (no revision recorded in `status` yet) reads.
pub fn needs_fresh_target(status: &RolloutStrategyStatus, observed: &Observed) -> bool {
    let adopting = status.stable_revision.is_none() && status.current_revision.is_none();
    observed
        .deployment
        .as_ref()
        .is_none_or(|d| adopting || !d.governed_label)
}

/// The first wait before a target that was not found is looked for again ([`Looks`]).
pub const FIRST_LOOK: Duration = Duration::from_secs(10);
/// The longest wait between two looks for a target that stays missing, with the revision gate:
/// it labels a Deployment in the write that creates it, so only one created in the moment before
/// the API server's gate saw its strategy is missed, and that within [`FIRST_LOOK`] of the
/// strategy's first look. Held paused at rest, no gate labels a Deployment created after its
/// strategy, and the looks stay [`FIRST_LOOK`] apart.
pub const LAST_LOOK: Duration = Duration::from_secs(300);

/// When each strategy whose Deployment the cache does not show looks for it afresh again. The
/// cache shows only Deployments labelled governed, and a Deployment can exist without the label
/// where nothing would wake its strategy: created while the manager holds Deployments paused at
/// rest (no revision gate labels it), or in the moment before the API server's gate saw a
/// strategy created just before it. Such a strategy looks [`FIRST_LOOK`] after a look that did
/// not find it, then twice as long each time, up to [`LAST_LOOK`] with the gate and
/// [`FIRST_LOOK`] paused at rest: a GET now and then for a strategy whose Deployment does not
/// exist, none for one whose Deployment the cache shows. A look that did not find the target is
/// a failure of the controller's keyed backoff ([`Backoff`](crate::controller::backoff::Backoff)).
#[derive(Debug)]
pub struct Looks(crate::controller::backoff::Backoff);

impl Default for Looks {
    fn default() -> Self {
        Self(crate::controller::backoff::Backoff::new(
            FIRST_LOOK, LAST_LOOK,
        ))
    }
}

impl Looks {
    /// The longest wait between two looks with `gate` in force ([`LAST_LOOK`], [`FIRST_LOOK`]).
    pub fn longest(gate: crate::api::Gate) -> Duration {
        match gate {
            crate::api::Gate::Admission => LAST_LOOK,
            crate::api::Gate::PauseAtRest => FIRST_LOOK,
        }
    }

    /// Records that strategy `key` read its target afresh now with `gate` in force, and whether
    /// it was `found`.
    pub fn looked(&self, key: &str, found: bool, gate: crate::api::Gate) {
        if found {
            self.0.succeeded(key);
        } else {
            self.0.failed_within(key, Self::longest(gate));
        }
    }

    /// How long until strategy `key`, whose target the cache does not show, looks for it again
    /// with `gate` in force: zero when it may look now (it never looked, or found it last time).
    /// A wait set under the gate is cut to [`FIRST_LOOK`] once the manager holds Deployments
    /// paused at rest.
    pub fn wait(&self, key: &str, gate: crate::api::Gate) -> Duration {
        self.0.remaining_within(key, Self::longest(gate))
    }

    /// Forgets strategy `key` (deleted).
    pub fn forget(&self, key: &str) {
        self.0.succeeded(key);
    }
}

/// Reads Deployment `target` of `ns` afresh, with its ReplicaSets (one GET, and one LIST by its
/// selector when it exists): the view of it the cache does not keep whole.
pub async fn read_target(
    client: &Client,
    ns: &str,
    target: &str,
) -> kube::Result<Option<DeploymentView>> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let Some(mut d) = deployments.get_opt(target).await? else {
        return Ok(None);
    };
    trim_deployment(&mut d);
    let selector = d
        .spec
        .as_ref()
        .map(|s| s.selector.clone())
        .and_then(|s| kube::core::Selector::try_from(s).ok());
    let replica_sets = match selector {
        Some(selector) => {
            Api::<ReplicaSet>::namespaced(client.clone(), ns)
                .list(&ListParams::default().labels_from(&selector))
                .await?
                .items
        }
        None => Vec::new(),
    };
    Ok(Some(DeploymentView::from_parts(&d, &replica_sets)))
}

#[cfg(test)]
#[path = "looks_tests.rs"]
mod tests;
