//! Publishing Events, for both controllers.
//!
//! kube's [`Recorder`] folds an Event into an earlier one with the same type, reason and
//! action on the same object (for six minutes) and keeps the earlier one's note, only counting
//! up its series: "pre hook migrate started" would then stand for "mid hook smoke started" as
//! well, and `kubectl describe` would tell an old story. The [`Publisher`] keeps one
//! `Recorder` per (object, type, reason, note), so an Event becomes a series only when it says
//! exactly the same thing again.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a recorder is kept after its last Event: beyond kube's six-minute series window,
/// so a repeat within the window always finds it.
const KEEP: Duration = Duration::from_secs(10 * 60);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Key {
    object: String,
    warning: bool,
    reason: String,
    note: String,
}

/// Publishes Events as the manager's reporter; see the module docs.
pub struct Publisher {
    client: Client,
    reporter: Reporter,
    recorders: Mutex<HashMap<Key, (Recorder, Instant)>>,
}

impl Publisher {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            recorders: Mutex::default(),
        }
    }

    pub async fn publish(
        &self,
        ev: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = Key {
            object: reference.uid.clone().unwrap_or_else(|| {
                format!(
                    "{}/{}/{}",
                    reference.kind.as_deref().unwrap_or_default(),
                    reference.namespace.as_deref().unwrap_or_default(),
                    reference.name.as_deref().unwrap_or_default()
                )
            }),
            warning: matches!(ev.type_, EventType::Warning),
            reason: ev.reason.clone(),
            note: ev.note.clone().unwrap_or_default(),
        };
        let recorder = {
            let mut recorders = self.recorders.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            recorders.retain(|_, (_, last)| now.duration_since(*last) < KEEP);
            let entry = recorders.entry(key).or_insert_with(|| {
                (
                    Recorder::new(self.client.clone(), self.reporter.clone()),
                    now,
                )
            });
            entry.1 = now;
            entry.0.clone()
        };
        recorder.publish(ev, reference).await
    }
}
