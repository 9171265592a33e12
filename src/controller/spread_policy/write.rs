//! Act: the one place the SpreadPolicy controller writes workloads.
//!
//! Applying a policy's terms is a server-side apply with the field manager
//! `ballast.dev/spread-policy` carrying only what ballast owns: the merged
//! affinity lists (atomic, so whole), our own topology spread constraints (a
//! list-map, so only our entries), the owner annotation and the record of our
//! terms in the pod template. The resourceVersion the merge was computed from
//! is a precondition, so a concurrent edit by the user is never overwritten:
//! the write fails with a conflict and the next reconcile merges again.
//!
//! Taking the terms out (the policy deleted, the workload no longer matched)
//! is a JSON merge patch under the same field manager and the same precondition.
//! An apply cannot remove a field another manager also owns (after a
//! `kubectl rollout undo` or `kubectl edit`, the lists and the record are
//! theirs too), and it leaves empty `podAntiAffinity: {}` behind; the patch
//! puts back exactly the template without our terms, so the user's affinity is
//! byte for byte what it was before the policy.

use super::plan::{ANNOTATION_POLICY, ANNOTATION_TERMS, Write, record_text};
use super::pods::DELETION_COST;
use super::scale_down::CostWrite;
use super::workload::Workload;
use crate::api::spread_policy::WorkloadKind;
use crate::k8s::{SPREAD_POLICY_MANAGER, apply, written::Written};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use serde_json::{Map, Value, json};
use std::time::Duration;

/// A write, ready to send.
#[derive(Clone, Debug, PartialEq)]
pub enum Body {
    /// A server-side apply configuration.
    Apply(Value),
    /// A JSON merge patch (with the resourceVersion as a precondition).
    Patch(Value),
}

/// The write for `w` in `namespace`, given the `live` workload it was merged from. Pure.
pub fn body(w: &Write, namespace: &str, live: &Workload) -> Body {
    if w.is_removal() {
        Body::Patch(removal_patch(w, live))
    } else {
        Body::Apply(apply_body(w, namespace, live))
    }
}

/// Takes `list` out when empty (a merge patch deletes a key set to null).
fn list_or_null<T: serde::Serialize>(list: &[T]) -> Value {
    if list.is_empty() {
        Value::Null
    } else {
        serde_json::to_value(list).expect("terms serialize")
    }
}

/// The merge patch that takes our terms, the record and the owner annotation
/// out of `live`, leaving no empty affinity objects behind. Keys set to null
/// go; keys absent from the patch stay as they are (the node affinity). The
/// resourceVersion is a precondition: a stale merge fails with a conflict.
/// Pure.
pub fn removal_patch(w: &Write, live: &Workload) -> Value {
    let m = &w.merged(live);
    let group = |required: Value, preferred: Value| {
        if required.is_null() && preferred.is_null() {
            Value::Null
        } else {
            json!({"requiredDuringSchedulingIgnoredDuringExecution": required,
                   "preferredDuringSchedulingIgnoredDuringExecution": preferred})
        }
    };
    let anti = group(
        list_or_null(&m.anti_affinity_required),
        list_or_null(&m.anti_affinity_preferred),
    );
    let pro = group(
        list_or_null(&m.affinity_required),
        list_or_null(&m.affinity_preferred),
    );
    let affinity = if anti.is_null() && pro.is_null() && live.affinity.node_affinity.is_none() {
        Value::Null
    } else {
        json!({"podAntiAffinity": anti, "podAffinity": pro})
    };
    let mut template = json!({"spec": {
        "affinity": affinity,
        "topologySpreadConstraints": list_or_null(&m.topology_spread_constraints),
    }});
    if live.record.is_some() {
        template["metadata"] = json!({"annotations": {ANNOTATION_TERMS: null}});
    }
    // The owner, and a record where an earlier version kept it.
    json!({
        "metadata": {
            "resourceVersion": w.resource_version,
            "annotations": {ANNOTATION_POLICY: null, ANNOTATION_TERMS: null},
        },
        "spec": {"template": template},
    })
}

/// The apply configuration that puts `w`'s terms into `live`. Pure.
pub fn apply_body(w: &Write, namespace: &str, live: &Workload) -> Value {
    let m = &w.merged(live);
    let mut metadata = json!({"name": w.name, "namespace": namespace});
    if let Some(rv) = &w.resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    if let Some(owner) = &w.owner {
        metadata["annotations"] = json!({ANNOTATION_POLICY: owner});
    }
    let live_list = |group: &str, required: bool| {
        let a = &live.affinity;
        match (group, required) {
            ("podAntiAffinity", true) => a
                .pod_anti_affinity
                .as_ref()
                .and_then(|x| {
                    x.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .is_some_and(|v| !v.is_empty()),
            ("podAntiAffinity", false) => a
                .pod_anti_affinity
                .as_ref()
                .and_then(|x| {
                    x.preferred_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .is_some_and(|v| !v.is_empty()),
            (_, true) => a
                .pod_affinity
                .as_ref()
                .and_then(|x| {
                    x.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .is_some_and(|v| !v.is_empty()),
            (_, false) => a
                .pod_affinity
                .as_ref()
                .and_then(|x| {
                    x.preferred_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .is_some_and(|v| !v.is_empty()),
        }
    };
    // Send a list when it has terms, or when it has terms live that must go
    // (an empty list clears it). Lists nobody uses stay absent.
    let mut affinity = Map::new();
    for (group, req, pref) in [
        (
            "podAntiAffinity",
            serde_json::to_value(&m.anti_affinity_required).unwrap(),
            serde_json::to_value(&m.anti_affinity_preferred).unwrap(),
        ),
        (
            "podAffinity",
            serde_json::to_value(&m.affinity_required).unwrap(),
            serde_json::to_value(&m.affinity_preferred).unwrap(),
        ),
    ] {
        let mut g = Map::new();
        if req.as_array().is_some_and(|a| !a.is_empty()) || live_list(group, true) {
            g.insert("requiredDuringSchedulingIgnoredDuringExecution".into(), req);
        }
        if pref.as_array().is_some_and(|a| !a.is_empty()) || live_list(group, false) {
            g.insert(
                "preferredDuringSchedulingIgnoredDuringExecution".into(),
                pref,
            );
        }
        if !g.is_empty() {
            affinity.insert(group.into(), Value::Object(g));
        }
    }
    let mut pod_spec = Map::new();
    if !affinity.is_empty() {
        pod_spec.insert("affinity".into(), Value::Object(affinity));
    }
    if !m.ours.topology_spread_constraints.is_empty() {
        pod_spec.insert(
            "topologySpreadConstraints".into(),
            serde_json::to_value(&m.ours.topology_spread_constraints).unwrap(),
        );
    }
    let mut template = Map::new();
    // The record goes where the terms are. No record and nothing of ours is
    // the same as an empty record: it is not added for nothing.
    if live.record.is_some() || !m.ours.is_empty() {
        template.insert(
            "metadata".into(),
            json!({"annotations": {ANNOTATION_TERMS: record_text(&m.ours)}}),
        );
    }
    if !pod_spec.is_empty() {
        template.insert("spec".into(), Value::Object(pod_spec));
    }
    let kind = match w.kind {
        WorkloadKind::Deployment => "Deployment",
        WorkloadKind::StatefulSet => "StatefulSet",
    };
    let mut body = json!({"apiVersion": "apps/v1", "kind": kind, "metadata": metadata});
    if !template.is_empty() {
        body["spec"] = json!({"template": Value::Object(template)});
    }
    body
}

/// The apply configuration of a pod's deletion cost (`cost: None`: none, which takes away the
/// one ballast set: server-side apply removes a field its manager no longer applies). The
/// uid pins the pod: a pod deleted and created again under the same name is not written.
/// Pure.
pub fn cost_body(namespace: &str, c: &CostWrite) -> Value {
    let mut metadata = json!({"name": c.pod, "namespace": namespace, "uid": c.uid});
    if let Some(cost) = c.cost {
        metadata["annotations"] = json!({DELETION_COST: cost.to_string()});
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata})
}

/// Applies `body` (from [`cost_body`]) to pod `name`.
pub async fn write_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    body: &Value,
) -> kube::Result<()> {
    let api: Api<Written<Pod>> = Api::namespaced(client.clone(), namespace);
    // Force: with `scaleDown: Balanced` the cost of a governed pod is ballast's to keep.
    api.patch(
        name,
        &apply::params(SPREAD_POLICY_MANAGER, true),
        &Patch::Apply(body),
    )
    .await
    .map(|_| ())
}

/// How long a 429 asks us to wait: its `Retry-After` (in the Status details), else `fallback`.
pub fn throttle_delay(s: &kube::core::Status, fallback: Duration) -> Duration {
    s.details
        .as_ref()
        .map(|d| d.retry_after_seconds)
        .filter(|secs| *secs > 0)
        .map_or(fallback, |secs| Duration::from_secs(u64::from(secs)))
}

/// What a write left: the workload's uid and generation afterwards.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    pub uid: Option<String>,
    pub generation: Option<i64>,
}

/// Sends `body` to workload `name`. Of the answer only the identity and version are decoded
/// ([`Written`]).
pub async fn write_workload(
    client: &Client,
    namespace: &str,
    kind: WorkloadKind,
    name: &str,
    body: &Body,
) -> kube::Result<Outcome> {
    let written = match kind {
        WorkloadKind::Deployment => {
            let api: Api<Written<Deployment>> = Api::namespaced(client.clone(), namespace);
            send(&api, name, body).await?.into_meta()
        }
        WorkloadKind::StatefulSet => {
            let api: Api<Written<StatefulSet>> = Api::namespaced(client.clone(), namespace);
            send(&api, name, body).await?.into_meta()
        }
    };
    Ok(Outcome {
        uid: written.uid,
        generation: written.generation,
    })
}

async fn send<K>(api: &Api<Written<K>>, name: &str, body: &Body) -> kube::Result<Written<K>>
where
    K: kube::Resource<DynamicType = ()>,
{
    match body {
        // Force: the atomic affinity lists we send are the user's lists plus
        // ours, merged from the resourceVersion above; taking them over is the
        // only way to write into an atomic list.
        Body::Apply(v) => {
            api.patch(
                name,
                &apply::params(SPREAD_POLICY_MANAGER, true),
                &Patch::Apply(v),
            )
            .await
        }
        Body::Patch(v) => {
            let pp = PatchParams {
                field_manager: Some(SPREAD_POLICY_MANAGER.into()),
                ..Default::default()
            };
            api.patch(name, &pp, &Patch::Merge(v)).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::spread_policy::merge::{Merged, merge};
    use crate::controller::spread_policy::plan::recorded_terms;
    use crate::controller::spread_policy::terms::Terms;

    #[test]
    fn a_cost_is_applied_with_the_pod_s_uid_and_taken_away_by_applying_none() {
        let set = CostWrite {
            pod: "web-1".into(),
            uid: "u1".into(),
            cost: Some(-3),
        };
        assert_eq!(
            cost_body("shop", &set),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-1", "namespace": "shop",
                   "uid": "u1", "annotations": {DELETION_COST: "-3"}}})
        );
        let none = CostWrite { cost: None, ..set };
        assert!(
            cost_body("shop", &none)["metadata"]
                .get("annotations")
                .is_none()
        );
    }

    #[test]
    fn a_429_waits_as_long_as_the_api_server_asks() {
        let mut s: kube::core::Status = serde_json::from_value(json!({
            "status": "Failure", "code": 429, "reason": "TooManyRequests",
            "details": {"retryAfterSeconds": 3},
        }))
        .unwrap();
        let fallback = Duration::from_secs(1);
        assert_eq!(throttle_delay(&s, fallback), Duration::from_secs(3));
        s.details = None;
        assert_eq!(throttle_delay(&s, fallback), fallback);
    }

    fn write(merged: Merged, owner: Option<&str>) -> Write {
        Write {
            kind: WorkloadKind::Deployment,
            name: "web".into(),
            record: record_text(&merged.ours),
            template_changed: merged.template_changed,
            owner: owner.map(String::from),
            resource_version: Some("42".into()),
        }
    }

    fn zone_term() -> k8s_openapi::api::core::v1::PodAffinityTerm {
        serde_json::from_value(
            json!({"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "web"}}}),
        )
        .unwrap()
    }

    #[test]
    fn the_body_carries_the_precondition_the_owner_the_record_in_the_template_and_only_used_lists()
    {
        let mut merged = Merged {
            anti_affinity_required: vec![zone_term()],
            ..Default::default()
        };
        merged.ours.anti_affinity_required = merged.anti_affinity_required.clone();
        let body = apply_body(&write(merged, Some("web-ha")), "shop", &Workload::default());
        assert_eq!(body["metadata"]["resourceVersion"], "42");
        assert_eq!(body["metadata"]["annotations"][ANNOTATION_POLICY], "web-ha");
        assert!(
            body["metadata"]["annotations"]
                .get(ANNOTATION_TERMS)
                .is_none(),
            "the record is in the template"
        );
        let terms: Terms = serde_json::from_str(
            body["spec"]["template"]["metadata"]["annotations"][ANNOTATION_TERMS]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(terms.anti_affinity_required.len(), 1);
        let anti = &body["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
        assert_eq!(
            anti["requiredDuringSchedulingIgnoredDuringExecution"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
        assert!(
            anti.get("preferredDuringSchedulingIgnoredDuringExecution")
                .is_none()
        );
        assert!(
            body["spec"]["template"]["spec"]["affinity"]
                .get("podAffinity")
                .is_none()
        );
        assert!(
            body["spec"]["template"]["spec"]
                .get("topologySpreadConstraints")
                .is_none()
        );
    }

    #[test]
    fn nothing_of_ours_and_no_record_adds_no_record() {
        let body = apply_body(
            &write(Merged::default(), Some("web-ha")),
            "shop",
            &Workload::default(),
        );
        assert!(body.get("spec").is_none(), "{body}");
    }

    fn live_with(affinity: Value, tsc: Value) -> Workload {
        let mut w = Workload {
            kind: WorkloadKind::Deployment,
            name: "web".into(),
            affinity: serde_json::from_value(affinity).unwrap(),
            topology_spread_constraints: serde_json::from_value(tsc).unwrap(),
            ..Default::default()
        };
        w.annotations = [(ANNOTATION_POLICY, "web-ha")].into();
        w
    }

    /// What the API server makes of a merge patch (RFC 7396), for the tests.
    fn merged_into(mut target: Value, patch: &Value) -> Value {
        fn merge(t: &mut Value, p: &Value) {
            let Value::Object(po) = p else {
                *t = p.clone();
                return;
            };
            if !t.is_object() {
                *t = json!({});
            }
            let to = t.as_object_mut().unwrap();
            for (k, v) in po {
                if v.is_null() {
                    to.remove(k);
                } else {
                    merge(to.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        merge(&mut target, patch);
        target
    }

    #[test]
    fn a_removal_puts_back_the_template_without_our_terms_and_no_empty_objects() {
        // The user had only a node affinity and a host constraint; ours is a
        // zone anti-affinity term and a zone constraint.
        let user_node = json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]}});
        let user_tsc =
            json!({"maxSkew": 2, "topologyKey": "host", "whenUnsatisfiable": "ScheduleAnyway"});
        let our_tsc =
            json!({"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"});
        let ours = Terms {
            anti_affinity_required: vec![zone_term()],
            topology_spread_constraints: vec![serde_json::from_value(our_tsc.clone()).unwrap()],
            ..Default::default()
        };
        let record = record_text(&ours);
        let before = json!({
            "metadata": {"annotations": {"keep": "me"}},
            "spec": {"template": {"metadata": {"annotations": {"pod": "x"}}, "spec": {
                "affinity": {"nodeAffinity": user_node}, "topologySpreadConstraints": [user_tsc]}}},
        });
        let with_ours = json!({
            "metadata": {"annotations": {"keep": "me", ANNOTATION_POLICY: "web-ha"}},
            "spec": {"template": {"metadata": {"annotations": {"pod": "x", ANNOTATION_TERMS: record}}, "spec": {
                "affinity": {"nodeAffinity": user_node, "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [zone_term()]}},
                "topologySpreadConstraints": [user_tsc, our_tsc]}}},
        });
        let mut live = live_with(
            with_ours["spec"]["template"]["spec"]["affinity"].clone(),
            json!([user_tsc, our_tsc]),
        );
        live.record = Some(record.clone());
        let merged = merge(&live, &recorded_terms(&live), &Terms::default());
        let patch = removal_patch(&write(merged, None), &live);
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        let mut after = merged_into(with_ours.clone(), &patch);
        after["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        assert_eq!(after, before, "exactly the template before the policy");

        // Nothing of the user's: the affinity and the constraints go entirely.
        let bare_before = json!({"metadata": {}, "spec": {"template": {"metadata": {"annotations": {}}, "spec": {}}}});
        let bare_with_ours = json!({
            "metadata": {"annotations": {ANNOTATION_POLICY: "web-ha"}},
            "spec": {"template": {"metadata": {"annotations": {ANNOTATION_TERMS: record}}, "spec": {
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [zone_term()]}},
                "topologySpreadConstraints": [our_tsc]}}},
        });
        let mut bare = live_with(
            bare_with_ours["spec"]["template"]["spec"]["affinity"].clone(),
            json!([our_tsc]),
        );
        bare.record = Some(record);
        let merged = merge(&bare, &recorded_terms(&bare), &Terms::default());
        let mut after = merged_into(bare_with_ours, &removal_patch(&write(merged, None), &bare));
        after["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("resourceVersion");
        after["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("annotations");
        assert_eq!(after, bare_before);
    }
}
