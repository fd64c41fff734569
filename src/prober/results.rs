//! The probe results of containers, by container ID and probe kind (upstream
//! `prober/results`). Setting a result that differs from the one held sends an [`Update`],
//! which the sync loop turns into a sync of the pod.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::mpsc;

use super::{ProbeKind, ProbeResult};

/// A container's result changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub pod_uid: String,
    pub container_id: String,
    pub kind: ProbeKind,
    pub result: ProbeResult,
}

/// The results of every probed container.
pub struct ResultsManager {
    results: Mutex<HashMap<(String, ProbeKind), ProbeResult>>,
    updates: mpsc::UnboundedSender<Update>,
}

impl ResultsManager {
    /// A manager sending each change to `updates`.
    pub fn new(updates: mpsc::UnboundedSender<Update>) -> Self {
        ResultsManager {
            results: Mutex::new(HashMap::new()),
            updates,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, ProbeKind), ProbeResult>> {
        self.results.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The result of the container `id`'s probe of `kind`, if it has one.
    pub fn get(&self, id: &str, kind: ProbeKind) -> Option<ProbeResult> {
        self.lock().get(&(id.to_string(), kind)).copied()
    }

    /// Sets the result; a change is sent as an [`Update`] for `pod_uid`.
    pub fn set(&self, pod_uid: &str, id: &str, kind: ProbeKind, result: ProbeResult) {
        let previous = self.lock().insert((id.to_string(), kind), result);
        if previous != Some(result) {
            let _ = self.updates.send(Update {
                pod_uid: pod_uid.to_string(),
                container_id: id.to_string(),
                kind,
                result,
            });
        }
    }

    /// Forgets the container `id`'s result of `kind`.
    pub fn remove(&self, id: &str, kind: ProbeKind) {
        self.lock().remove(&(id.to_string(), kind));
    }
}
