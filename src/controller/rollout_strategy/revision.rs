//! The operator's own revision of a pod template: the first 10 hex characters of the sha256 of
//! its canonical JSON (object keys sorted). It names hook Jobs and is what approvals and retries
//! refer to. ReplicaSets carry the Deployment's template plus a `pod-template-hash` label, which
//! is dropped before hashing so a ReplicaSet has the revision of the template it was made from.

use k8s_openapi::api::core::v1::PodTemplateSpec;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Length of a revision in hex characters.
pub const REVISION_LEN: usize = 10;

/// Label the Deployment controller adds to the templates of its ReplicaSets.
const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// JSON text of `v` with every object's keys sorted, independent of serde_json's map order.
pub fn canonical_json(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&map[k], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

/// Short sha256 hex digest of `text`.
pub fn short_hash(text: &str, len: usize) -> String {
    let digest = Sha256::digest(text.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    hex[..len.min(hex.len())].to_string()
}

/// The revision of a template given as JSON.
pub fn of_json(template: &Value) -> String {
    short_hash(&canonical_json(template), REVISION_LEN)
}

/// The revision of a Deployment's pod template.
pub fn of_template(template: &PodTemplateSpec) -> String {
    of_json(&serde_json::to_value(template).unwrap_or(Value::Null))
}

/// The Deployment template a ReplicaSet was made from: its template without `pod-template-hash`.
pub fn deployment_template_of(mut t: PodTemplateSpec) -> PodTemplateSpec {
    if let Some(labels) = t.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        labels.remove(POD_TEMPLATE_HASH);
    }
    t
}

/// The revision of the template a ReplicaSet was made from (its `pod-template-hash` dropped).
pub fn of_replica_set_template(template: &PodTemplateSpec) -> String {
    of_template(&deployment_template_of(template.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn template(image: &str) -> PodTemplateSpec {
        serde_json::from_value(json!({
            "metadata": {"labels": {"app": "web", "tier": "front"}},
            "spec": {"containers": [{"name": "app", "image": image}]}
        }))
        .unwrap()
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let a = json!({"b": 1, "a": {"d": [1, {"z": 1, "y": 2}], "c": "x"}});
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"c":"x","d":[1,{"y":2,"z":1}]},"b":1}"#
        );
    }

    #[test]
    fn revision_is_ten_hex_chars_and_stable() {
        let r = of_template(&template("web:1"));
        assert_eq!(r.len(), REVISION_LEN);
        assert!(r.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(r, of_template(&template("web:1")));
    }

    #[test]
    fn a_different_image_is_a_different_revision() {
        assert_ne!(
            of_template(&template("web:1")),
            of_template(&template("web:2"))
        );
    }

    #[test]
    fn key_order_does_not_change_the_revision() {
        let a = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"containers": []}});
        let b = json!({"spec": {"containers": []}, "metadata": {"labels": {"b": "2", "a": "1"}}});
        assert_eq!(of_json(&a), of_json(&b));
    }

    #[test]
    fn replica_set_template_without_its_hash_label_has_the_deployment_revision() {
        let t = template("web:1");
        let mut rs = t.clone();
        rs.metadata
            .as_mut()
            .unwrap()
            .labels
            .as_mut()
            .unwrap()
            .insert("pod-template-hash".into(), "5d9c7b".into());
        assert_eq!(of_replica_set_template(&rs), of_template(&t));
        assert_ne!(of_template(&rs), of_template(&t));
    }
}
