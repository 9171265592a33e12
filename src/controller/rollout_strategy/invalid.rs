//! A stored strategy this version cannot read ([`Invalid`]): reported on itself, and on
//! deletion the Deployment it names is still released.

use super::error::Error;
use super::{FINALIZER, State, release, seniority, set_finalizers};
use crate::api::RolloutStrategy;
use crate::k8s::lenient::{Invalid, Lenient};
use crate::k8s::{ROLLOUT_STRATEGY_MANAGER, finalizer};
use kube::{Api, Resource, ResourceExt, runtime::controller::Action};

/// A stored strategy this version cannot read: reported on itself, and on deletion the
/// Deployment it names is still released, so deletion finishes and nothing stays paused.
pub(super) async fn sync_invalid(
    obj: &Lenient<RolloutStrategy>,
    inv: &Invalid,
    st: &State,
) -> Result<Action, Error> {
    let ns = obj.namespace().unwrap_or_default();
    let client = &st.ctx.client;
    if obj.meta().deletion_timestamp.is_some() {
        if !obj.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(Action::await_change());
        }
        if let Some(target) = inv
            .raw
            .pointer("/spec/targetRef/name")
            .and_then(|v| v.as_str())
        {
            let original = inv
                .raw
                .pointer("/status/originalReplicas")
                .and_then(|v| v.as_i64())
                .and_then(|v| i32::try_from(v).ok());
            release(st, &ns, target, &seniority(obj.meta()), original).await?;
        }
        let api: Api<Lenient<RolloutStrategy>> = Api::namespaced(client.clone(), &ns);
        return set_finalizers(&api, obj, finalizer::without(obj, FINALIZER))
            .await
            .map(|_| Action::await_change());
    }
    super::super::report_invalid::<Lenient<RolloutStrategy>>(
        client,
        &st.recorder,
        ROLLOUT_STRATEGY_MANAGER,
        inv,
    )
    .await
    .map_err(Error::ReportInvalid)?;
    Ok(Action::await_change())
}
