//! Schema pieces both kinds share: patterns for Kubernetes names and label keys, hand-written
//! OpenAPI schemas for the upstream types we embed (label selectors, conditions, env vars,
//! int-or-string, timestamps, free-form objects), and the condition types the API promises.
//!
//! The upstream types are written out by hand rather than taken from `k8s-openapi` so that every
//! string and list carries the bounds the API server needs to estimate CEL cost, and so that the
//! rules users hit (a non-empty selector, `values` only with `In`/`NotIn`) live in the CRD.

use schemars::transform::{RecursiveTransform, Transform};
use schemars::{Schema, SchemaGenerator, json_schema};

/// API group of both kinds.
pub const GROUP: &str = "ballast.dev";
/// API version of both kinds.
pub const VERSION: &str = "v1alpha1";

/// Condition type: the object is converged (all that can be done is done).
pub const CONDITION_READY: &str = "Ready";
/// Condition type: the operator is changing something (rolling workloads, running hooks).
pub const CONDITION_PROGRESSING: &str = "Progressing";
/// Condition type (SpreadPolicy): another policy with higher precedence owns a matched workload.
pub const CONDITION_CONFLICTED: &str = "Conflicted";
/// Condition type (SpreadPolicy): a `Required` term asks for more domains than exist.
pub const CONDITION_INFEASIBLE: &str = "Infeasible";
/// Condition type (SpreadPolicy): running pods of a governed workload are spread more unevenly
/// than the policy asks (after an outage, say).
pub const CONDITION_SKEWED: &str = "Skewed";
/// Condition type (RolloutStrategy): the current revision failed.
pub const CONDITION_FAILED: &str = "Failed";

/// A DNS-1123 label: lower-case alphanumerics and `-`, starting and ending alphanumeric.
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// A DNS-1123 subdomain: dot-separated DNS labels (the rule for most object names).
pub const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A label key: an optional DNS subdomain prefix and `/`, then a name of at most 63 characters.
pub const LABEL_KEY_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
/// Longest label key: a 253-character prefix, `/`, and a 63-character name.
pub const LABEL_KEY_MAX_LENGTH: u32 = 317;
/// A label value: empty, or at most 63 alphanumerics, `-`, `_`, `.`, starting and ending
/// alphanumeric.
pub const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";

/// Schema of a `metav1.LabelSelector` that must select something: `matchLabels` or
/// `matchExpressions` has to be non-empty, because an empty selector matches everything.
pub fn label_selector_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "description": "A label query. The requirements of matchLabels and matchExpressions are ANDed; at least one of them must be non-empty.",
        "properties": {
            "matchLabels": {
                "type": "object",
                "description": "Labels that must all be present with these values.",
                "maxProperties": 32,
                "additionalProperties": {
                    "type": "string",
                    "maxLength": 63,
                    "pattern": LABEL_VALUE_PATTERN,
                },
            },
            "matchExpressions": {
                "type": "array",
                "description": "Label requirements that must all hold.",
                "maxItems": 16,
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {
                            "type": "string",
                            "description": "The label key the requirement applies to.",
                            "maxLength": LABEL_KEY_MAX_LENGTH,
                            "pattern": LABEL_KEY_PATTERN,
                        },
                        "operator": {
                            "type": "string",
                            "description": "How the key relates to the values: In, NotIn, Exists or DoesNotExist.",
                            "enum": ["In", "NotIn", "Exists", "DoesNotExist"],
                        },
                        "values": {
                            "type": "array",
                            "description": "Label values. Non-empty for In and NotIn, empty for Exists and DoesNotExist.",
                            "maxItems": 64,
                            "items": {"type": "string", "maxLength": 63},
                            "x-kubernetes-list-type": "atomic",
                        },
                    },
                    "x-kubernetes-validations": [{
                        "rule": "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : (!has(self.values) || size(self.values) == 0)",
                        "message": "values must be non-empty when operator is In or NotIn, and empty when operator is Exists or DoesNotExist",
                        "fieldPath": ".values",
                    }],
                },
                "x-kubernetes-list-type": "atomic",
            },
        },
        "x-kubernetes-map-type": "atomic",
        "x-kubernetes-validations": [{
            "rule": "(has(self.matchLabels) && size(self.matchLabels) > 0) || (has(self.matchExpressions) && size(self.matchExpressions) > 0)",
            "message": "selector must not be empty: set matchLabels or matchExpressions",
        }],
    })
}

/// Schema of a list of `metav1.Condition`, a list-map keyed by `type` as the API conventions ask.
pub fn conditions_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 16,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "type": "object",
            "required": ["type", "status", "lastTransitionTime", "reason", "message"],
            "properties": {
                "type": {
                    "type": "string",
                    "description": "Type of the condition, in CamelCase.",
                    "maxLength": 316,
                },
                "status": {
                    "type": "string",
                    "description": "True, False or Unknown.",
                    "enum": ["True", "False", "Unknown"],
                },
                "observedGeneration": {
                    "type": "integer",
                    "format": "int64",
                    "description": "The .metadata.generation the condition was computed from.",
                    "minimum": 0,
                },
                "lastTransitionTime": {
                    "type": "string",
                    "format": "date-time",
                    "description": "When status last changed. It does not move when only reason or message change.",
                },
                "reason": {
                    "type": "string",
                    "description": "Machine-readable CamelCase reason for the last transition.",
                    "maxLength": 1024,
                },
                "message": {
                    "type": "string",
                    "description": "Human-readable details.",
                    "maxLength": 32768,
                },
            },
        },
    })
}

fn key_ref_schema(description: &str) -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "description": description,
        "required": ["key"],
        "properties": {
            "name": {"type": "string", "description": "Name of the object in the hook's namespace.", "maxLength": 253},
            "key": {"type": "string", "description": "The key to select.", "maxLength": 253},
            "optional": {"type": "boolean", "description": "Whether the object or key may be missing."},
        },
        "x-kubernetes-map-type": "atomic",
    })
}

/// Schema of a list of `core/v1.EnvVar` (unique by name, like a container's `env`).
pub fn env_vars_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 128,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["name"],
        "items": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {
                    "type": "string",
                    "description": "Name of the environment variable.",
                    "minLength": 1,
                    "maxLength": 256,
                },
                "value": {
                    "type": "string",
                    "description": "Value; $(VAR) references to earlier variables are expanded.",
                    "maxLength": 32768,
                },
                "valueFrom": {
                    "type": "object",
                    "description": "Source of the value, as in a container's env. Cannot be used with value.",
                    "properties": {
                        "configMapKeyRef": key_ref_schema("A key of a ConfigMap."),
                        "secretKeyRef": key_ref_schema("A key of a Secret."),
                        "fieldRef": {
                            "type": "object",
                            "description": "A field of the pod, e.g. metadata.name.",
                            "required": ["fieldPath"],
                            "properties": {
                                "apiVersion": {"type": "string", "description": "Version of the schema fieldPath is written in; default v1.", "maxLength": 64},
                                "fieldPath": {"type": "string", "description": "Path of the field to select, e.g. metadata.name.", "maxLength": 256},
                            },
                            "x-kubernetes-map-type": "atomic",
                        },
                        "resourceFieldRef": {
                            "type": "object",
                            "description": "A resource limit or request of a container, e.g. limits.memory.",
                            "required": ["resource"],
                            "properties": {
                                "containerName": {"type": "string", "description": "Container whose resource is read; the hook container when empty.", "maxLength": 63},
                                "resource": {"type": "string", "description": "Resource to select, e.g. limits.cpu.", "maxLength": 256},
                                "divisor": {"x-kubernetes-int-or-string": true, "description": "Output unit of the value, e.g. 1Mi; default 1."},
                            },
                            "x-kubernetes-map-type": "atomic",
                        },
                        "fileKeyRef": {
                            "type": "object",
                            "description": "A key of an env file in a volume.",
                            "required": ["key", "path", "volumeName"],
                            "properties": {
                                "key": {"type": "string", "description": "Key in the env file.", "maxLength": 128},
                                "path": {"type": "string", "description": "Path of the env file within the volume.", "maxLength": 4096},
                                "volumeName": {"type": "string", "description": "Name of the volume holding the env file.", "maxLength": 63},
                                "optional": {"type": "boolean", "description": "Whether the file or key may be missing."},
                            },
                            "x-kubernetes-map-type": "atomic",
                        },
                    },
                },
            },
            "x-kubernetes-validations": [{
                "rule": "!(has(self.value) && has(self.valueFrom))",
                "message": "value and valueFrom are mutually exclusive",
            }],
        },
    })
}

/// Schema of a `metav1.Time`: an RFC 3339 timestamp.
pub fn time_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "string", "format": "date-time"})
}

/// Schema of a free-form object that the API server keeps as written.
pub fn preserve_unknown_object_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

/// Schema of an `IntOrString` (a count or a percent; CEL rules on the field narrow it further).
pub fn int_or_string_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "maxLength": 4,
    })
}

/// Joins the hard-wrapped lines of `///` comments in every description of a schema, keeping
/// paragraph breaks, so that `kubectl explain` can wrap the text to the terminal itself.
pub fn unwrap_descriptions(schema: &mut Schema) {
    fn unwrap_one(schema: &mut Schema) {
        if let Some(serde_json::Value::String(text)) = schema.get_mut("description") {
            *text = text
                .split("\n\n")
                .map(|paragraph| {
                    paragraph
                        .split('\n')
                        .map(str::trim)
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .collect::<Vec<_>>()
                .join("\n\n");
        }
    }
    RecursiveTransform(unwrap_one).transform(schema);
}
