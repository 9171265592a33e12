//! ballast: a Kubernetes operator with two custom resources.
//!
//! - [`api`]: the CRD types (`SpreadPolicy`, `RolloutStrategy`), nothing else.
//! - [`controller`]: one folder per controller, each read → decide → write → status.
//! - [`k8s`]: the thin layer that knows server-side apply, names, labels and conditions.
//! - [`client`], [`leader`], [`metrics`], [`telemetry`], [`http`], [`health`]: what the manager
//!   binary wires together.
#![forbid(unsafe_code)]

pub mod api;
pub mod client;
pub mod controller;
pub mod health;
pub mod http;
pub mod k8s;
pub mod leader;
pub mod metrics;
pub mod plugin;
pub mod telemetry;
