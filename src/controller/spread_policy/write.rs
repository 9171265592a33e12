//! Act: the one place the SpreadPolicy controller writes workloads. Each
//! write is a server-side apply with the field manager
//! `ballast.dev/spread-policy` carrying only what ballast owns: the merged
//! affinity lists (atomic, so whole), our own topology spread constraints
//! (a list-map, so only our entries) and the record annotations. The
//! resourceVersion the merge was computed from is a precondition, so a
//! concurrent edit by the user is never overwritten: the write fails with a
//! conflict and the next reconcile merges again.

use super::plan::{ANNOTATION_POLICY, ANNOTATION_TERMS, Write};
use crate::api::spread_policy::WorkloadKind;
use crate::k8s::{SPREAD_POLICY_MANAGER, apply};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::{Api, Client, api::Patch};
use serde_json::{Map, Value, json};

/// The apply configuration for `w` in `namespace`. Pure.
pub fn apply_body(w: &Write, namespace: &str, live_has_list: impl Fn(&str, &str) -> bool) -> Value {
    let m = &w.merged;
    let mut metadata = json!({"name": w.name, "namespace": namespace});
    if let Some(rv) = &w.resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    if let Some(owner) = &w.owner {
        metadata["annotations"] = json!({
            ANNOTATION_POLICY: owner,
            ANNOTATION_TERMS: serde_json::to_string(&m.ours).expect("terms serialize"),
        });
    }
    // Send a list when it has terms, or when it has terms live that must go
    // (an empty list clears it). Lists nobody uses stay absent.
    let mut affinity = Map::new();
    for (group, req, pref, req_live, pref_live) in [
        (
            "podAntiAffinity",
            serde_json::to_value(&m.anti_affinity_required).unwrap(),
            serde_json::to_value(&m.anti_affinity_preferred).unwrap(),
            live_has_list("podAntiAffinity", "required"),
            live_has_list("podAntiAffinity", "preferred"),
        ),
        (
            "podAffinity",
            serde_json::to_value(&m.affinity_required).unwrap(),
            serde_json::to_value(&m.affinity_preferred).unwrap(),
            live_has_list("podAffinity", "required"),
            live_has_list("podAffinity", "preferred"),
        ),
    ] {
        let mut g = Map::new();
        if req.as_array().is_some_and(|a| !a.is_empty()) || req_live {
            g.insert("requiredDuringSchedulingIgnoredDuringExecution".into(), req);
        }
        if pref.as_array().is_some_and(|a| !a.is_empty()) || pref_live {
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
    let (api_version, kind) = match w.kind {
        WorkloadKind::Deployment => ("apps/v1", "Deployment"),
        WorkloadKind::StatefulSet => ("apps/v1", "StatefulSet"),
    };
    let mut body = json!({"apiVersion": api_version, "kind": kind, "metadata": metadata});
    if !pod_spec.is_empty() {
        body["spec"] = json!({"template": {"spec": Value::Object(pod_spec)}});
    }
    body
}

/// Applies `body`; returns the workload's new generation.
pub async fn apply_workload(
    client: &Client,
    namespace: &str,
    kind: WorkloadKind,
    name: &str,
    body: &Value,
) -> kube::Result<Option<i64>> {
    // Force: the atomic affinity lists we send are the user's lists plus
    // ours, merged from the resourceVersion above; taking them over is the
    // only way to write into an atomic list.
    let params = apply::params(SPREAD_POLICY_MANAGER, true);
    match kind {
        WorkloadKind::Deployment => {
            let api: Api<Deployment> = Api::namespaced(client.clone(), namespace);
            Ok(api
                .patch(name, &params, &Patch::Apply(body))
                .await?
                .metadata
                .generation)
        }
        WorkloadKind::StatefulSet => {
            let api: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
            Ok(api
                .patch(name, &params, &Patch::Apply(body))
                .await?
                .metadata
                .generation)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::spread_policy::merge::Merged;
    use crate::controller::spread_policy::terms::Terms;

    fn write(merged: Merged, owner: Option<&str>) -> Write {
        Write {
            kind: WorkloadKind::Deployment,
            name: "web".into(),
            merged,
            owner: owner.map(String::from),
            resource_version: Some("42".into()),
        }
    }

    #[test]
    fn the_body_carries_the_precondition_the_record_and_only_used_lists() {
        let mut merged = Merged {
            anti_affinity_required: vec![
                serde_json::from_value(json!({"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "web"}}}))
                    .unwrap(),
            ],
            ..Default::default()
        };
        merged.ours.anti_affinity_required = merged.anti_affinity_required.clone();
        let body = apply_body(&write(merged, Some("web-ha")), "shop", |_, _| false);
        assert_eq!(body["metadata"]["resourceVersion"], "42");
        assert_eq!(body["metadata"]["annotations"][ANNOTATION_POLICY], "web-ha");
        let terms: Terms = serde_json::from_str(
            body["metadata"]["annotations"][ANNOTATION_TERMS]
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
    fn a_removal_clears_lists_that_had_terms_and_drops_the_record() {
        let body = apply_body(&write(Merged::default(), None), "shop", |g, l| {
            g == "podAntiAffinity" && l == "required"
        });
        assert!(body["metadata"].get("annotations").is_none());
        let anti = &body["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
        assert_eq!(
            anti["requiredDuringSchedulingIgnoredDuringExecution"],
            json!([])
        );
    }
}
