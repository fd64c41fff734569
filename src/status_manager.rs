//! The status manager: the only writer of pod status to the API server, like the upstream
//! kubelet's `status.Manager`. The pod workers hand it each status they compute
//! ([`StatusManager::set_status`]); it keeps the latest per pod, and a background task PATCHes
//! the `pods/status` subresource of the pods whose status changed since the last successful
//! write (a strategic merge patch carrying `metadata.uid` as a precondition, so a recreated pod
//! of the same name is never written). A failed write stays due and is retried every
//! [`RESYNC_INTERVAL`], so status catches up after the API server was unreachable.
//!
//! Static pods have no object of their own in the API: their status goes to their mirror pod,
//! once it exists. When a pod that was deleted in the API has stopped
//! ([`StatusManager::terminated`]), the manager writes its final status and then deletes the
//! pod object with grace period 0, which completes the graceful deletion.
//!
//! Without an API server (standalone mode) the manager only keeps the statuses.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};
use tokio::sync::Notify;

use crate::model::Phase;
use crate::sources::api::{CONFIG_MIRROR_ANNOTATION, MirrorPods};
use crate::sources::{self, CONFIG_HASH_ANNOTATION, annotation};
use crate::util::lock;

/// How often writes that failed, or were not possible yet, are retried.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
struct Entry {
    namespace: String,
    name: String,
    uid: String,
    /// The static pod's hash (its mirror's `kubernetes.io/config.mirror`), for static pods.
    mirror_hash: Option<String>,
    status: PodStatus,
    version: u64,
    written: u64,
    /// Delete the pod object (grace 0) once the final status is written.
    delete: bool,
    /// When the kubelet first saw the pod (its `kubernetes.io/config.seen`, else its first
    /// status), and whether its start (Running) has been counted in
    /// `kubelet_pod_start_duration_seconds`.
    seen: SystemTime,
    start_counted: bool,
}

/// Keeps the latest status of every pod and writes it to the API server.
pub struct StatusManager {
    client: Option<Client>,
    /// The mirror pods the API source sees, where static pods' statuses go.
    mirrors: Mutex<Option<tokio::sync::watch::Receiver<MirrorPods>>>,
    entries: Mutex<HashMap<String, Entry>>,
    wake: Notify,
}

/// When the kubelet first saw the pod: its `kubernetes.io/config.seen` annotation.
fn first_seen(pod: &Pod) -> Option<SystemTime> {
    let seen = annotation(pod, sources::CONFIG_SEEN_ANNOTATION)?;
    let t: k8s_openapi::jiff::Timestamp = seen.parse().ok()?;
    Some(SystemTime::from(t))
}

pub use crate::model::is_api_pod;

impl StatusManager {
    /// A manager writing through `client`; `None` keeps statuses only (standalone).
    pub fn new(client: Option<Client>) -> Arc<Self> {
        Arc::new(StatusManager {
            client,
            mirrors: Mutex::new(None),
            entries: Mutex::new(HashMap::new()),
            wake: Notify::new(),
        })
    }

    /// Where to find the mirror pods of static pods (from the API source), for their statuses.
    pub fn set_mirrors(&self, mirrors: tokio::sync::watch::Receiver<MirrorPods>) {
        *lock(&self.mirrors) = Some(mirrors);
    }

    /// The UID of the mirror of the static pod `namespace/name` with `hash`, if the API server
    /// holds it.
    fn mirror_uid(&self, namespace: &str, name: &str, hash: &str) -> Option<String> {
        let mirrors = lock(&self.mirrors);
        let current = mirrors.as_ref()?.borrow();
        let mirror = current.get(&format!("{namespace}/{name}"))?;
        if annotation(mirror, CONFIG_MIRROR_ANNOTATION) != Some(hash) {
            return None;
        }
        mirror.metadata.uid.clone()
    }

    /// Records the pod's latest status; a change makes a write due.
    pub fn set_status(&self, pod: &Pod, status: PodStatus) {
        let uid = sources::pod_uid(pod).to_string();
        if uid.is_empty() {
            return;
        }
        let mut entries = lock(&self.entries);
        let entry = entries.entry(uid.clone()).or_insert_with(|| Entry {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid,
            mirror_hash: (!is_api_pod(pod))
                .then(|| annotation(pod, CONFIG_HASH_ANNOTATION).map(str::to_string))
                .flatten(),
            status: PodStatus::default(),
            version: 0,
            written: 0,
            delete: false,
            seen: first_seen(pod).unwrap_or_else(SystemTime::now),
            // A pod running at its first status (adopted after a restart) did not start now.
            start_counted: Phase::parse(status.phase.as_deref()) == Phase::Running,
        });
        if entry.version > 0 && entry.status == status {
            return;
        }
        if !entry.start_counted && Phase::parse(status.phase.as_deref()) == Phase::Running {
            entry.start_counted = true;
            let took = SystemTime::now()
                .duration_since(entry.seen)
                .unwrap_or_default();
            crate::metrics::get()
                .pod_start_duration
                .observe(took.as_secs_f64());
        }
        entry.status = status;
        entry.version += 1;
        drop(entries);
        self.wake.notify_one();
    }

    /// Whether the latest statuses of the pods `uids` are written (always, standalone).
    pub fn written(&self, uids: &[String]) -> bool {
        if self.client.is_none() {
            return true;
        }
        let entries = lock(&self.entries);
        uids.iter()
            .all(|u| entries.get(u).is_none_or(|e| e.written >= e.version))
    }

    /// The latest status recorded for a pod.
    pub fn status(&self, uid: &str) -> Option<PodStatus> {
        lock(&self.entries).get(uid).map(|e| e.status.clone())
    }

    /// The latest status of every pod, by UID.
    pub fn statuses(&self) -> HashMap<String, PodStatus> {
        lock(&self.entries)
            .iter()
            .map(|(uid, e)| (uid.clone(), e.status.clone()))
            .collect()
    }

    /// Compares the status the API server holds for a pod with ours, and writes ours again
    /// when they differ (another writer, or a write lost while the API server was away).
    pub fn reconcile(&self, api_pod: &Pod) {
        self.reconcile_status(sources::pod_uid(api_pod), api_pod.status.as_ref());
    }

    /// Like [`Self::reconcile`], for the pod with `uid` whose API object (a static pod's mirror)
    /// holds `api_status`.
    pub fn reconcile_status(&self, uid: &str, api_status: Option<&PodStatus>) {
        let mut entries = lock(&self.entries);
        let Some(entry) = entries.get_mut(uid) else {
            return;
        };
        if entry.written == entry.version && !same_owned_status(api_status, &entry.status) {
            entry.written = 0;
            drop(entries);
            self.wake.notify_one();
        }
    }

    /// The pod's containers are gone: once its final status is written, a pod deleted in the
    /// API (it has a `deletionTimestamp`) is deleted for good; otherwise it is forgotten.
    pub fn terminated(&self, pod: &Pod) {
        let uid = sources::pod_uid(pod);
        let deleted = pod.metadata.deletion_timestamp.is_some() && is_api_pod(pod);
        let mut entries = lock(&self.entries);
        if self.client.is_none() {
            entries.remove(uid);
        } else if let Some(e) = entries.get_mut(uid).filter(|_| deleted) {
            e.delete = true;
            drop(entries);
            self.wake.notify_one();
        }
        // Otherwise the final status stays due until written; `forget` drops it.
    }

    /// Drops a pod the kubelet no longer knows.
    pub fn forget(&self, uid: &str) {
        crate::metrics::get().pod_startup.forget(uid);
        lock(&self.entries).remove(uid);
    }

    /// Writes due statuses until the process ends: at once after a change, and every
    /// [`RESYNC_INTERVAL`] for writes that failed.
    pub async fn run(self: Arc<Self>) {
        let Some(client) = self.client.clone() else {
            return;
        };
        loop {
            let _ = tokio::time::timeout(RESYNC_INTERVAL, self.wake.notified()).await;
            let due: Vec<Entry> = lock(&self.entries)
                .values()
                .filter(|e| e.written < e.version || e.delete)
                .cloned()
                .collect();
            for entry in due {
                self.write(&client, entry).await;
            }
        }
    }

    /// [`run`](Self::run) until `cancel` fires.
    pub async fn run_until(self: Arc<Self>, cancel: tokio_util::sync::CancellationToken) {
        tokio::select! {
            _ = cancel.cancelled() => {}
            _ = self.run() => {}
        }
    }

    async fn write(&self, client: &Client, entry: Entry) {
        let api: Api<Pod> = Api::namespaced(client.clone(), &entry.namespace);
        let target_uid = match &entry.mirror_hash {
            None => entry.uid.clone(),
            Some(hash) => match self.mirror_uid(&entry.namespace, &entry.name, hash) {
                Some(uid) => uid,
                // No mirror pod yet: try again later.
                None => return,
            },
        };
        if entry.written < entry.version {
            let patch = serde_json::json!({
                "metadata": { "uid": target_uid },
                "status": status_patch(&entry.status),
            });
            match api
                .patch_status(
                    &entry.name,
                    &PatchParams::default(),
                    &Patch::Strategic(patch),
                )
                .await
            {
                Ok(written) => {
                    crate::metrics::get().pod_status_written(&written);
                    tracing::debug!(pod = %format!("{}/{}", entry.namespace, entry.name), "status written");
                    let mut entries = lock(&self.entries);
                    if let Some(e) = entries.get_mut(&entry.uid) {
                        e.written = e.written.max(entry.version);
                    }
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {
                    // The pod is gone, or a different pod now has the name: nothing to write.
                    tracing::info!(pod = %format!("{}/{}", entry.namespace, entry.name),
                        "pod status not written: {}", s.message);
                    let mut entries = lock(&self.entries);
                    if let Some(e) = entries.get_mut(&entry.uid) {
                        e.written = e.version;
                    }
                }
                Err(e) => {
                    tracing::warn!(pod = %format!("{}/{}", entry.namespace, entry.name),
                        "writing pod status (retrying): {e}");
                    return;
                }
            }
        }
        if entry.delete && entry.mirror_hash.is_none() {
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(entry.uid.clone()),
                    resource_version: None,
                }),
                ..Default::default()
            };
            match api.delete(&entry.name, &params).await {
                Ok(_) => {
                    tracing::info!(pod = %format!("{}/{}", entry.namespace, entry.name), "pod deleted");
                }
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => {
                    tracing::warn!(pod = %format!("{}/{}", entry.namespace, entry.name),
                        "deleting the pod (retrying): {e}");
                    return;
                }
            }
            lock(&self.entries).remove(&entry.uid);
        }
    }
}

/// The status as a strategic merge patch body. A container's `state` and `lastState` hold
/// exactly one of `waiting`, `running` and `terminated`: the patch names the other two as
/// `null`, or merging it into the stored status would leave, say, `running` beside the new
/// `terminated` (upstream's status manager sends a computed diff, which does the same); a
/// stopped container's `resources` are `null` likewise.
fn status_patch(status: &PodStatus) -> serde_json::Value {
    let mut v = serde_json::to_value(status).unwrap_or_default();
    // The kubelet's own conditions that come and go (a resize's) are deleted when ours has
    // none: a strategic merge keeps list elements the patch does not name.
    let has = |t: &str| status.conditions.iter().flatten().any(|c| c.type_ == t);
    let gone: Vec<serde_json::Value> = TRANSIENT_CONDITIONS
        .into_iter()
        .filter(|t| !has(t))
        .map(|t| serde_json::json!({"type": t, "$patch": "delete"}))
        .collect();
    if let Some(obj) = v.as_object_mut() {
        let list = obj
            .entry("conditions")
            .or_insert_with(|| serde_json::Value::Array(Vec::new()));
        if let Some(list) = list.as_array_mut() {
            // A condition that lost its reason or message (Ready again) says so, or the merge
            // would keep the old ones beside the new status.
            for c in list.iter_mut().filter_map(|c| c.as_object_mut()) {
                for field in ["reason", "message"] {
                    c.entry(field).or_insert(serde_json::Value::Null);
                }
            }
            list.extend(gone);
        }
    }
    // The pod's and host's IPs merge by `ip`: a new sandbox's address would be added beside the
    // old one, and a dual-stack order could not change. They are replaced whole.
    for list in ["podIPs", "hostIPs"] {
        if let Some(items) = v.get_mut(list).and_then(|l| l.as_array_mut()) {
            items.insert(0, serde_json::json!({"$patch": "replace"}));
        }
    }
    for list in [
        "containerStatuses",
        "initContainerStatuses",
        "ephemeralContainerStatuses",
    ] {
        let Some(items) = v.get_mut(list).and_then(|l| l.as_array_mut()) else {
            continue;
        };
        for item in items {
            // What a container shows only while it runs (its resources) is cleared once it
            // stops, or the merge would keep the last values.
            if let Some(obj) = item.as_object_mut() {
                obj.entry("resources").or_insert(serde_json::Value::Null);
            }
            for field in ["state", "lastState"] {
                let Some(obj) = item.as_object_mut() else {
                    continue;
                };
                let state = obj
                    .entry(field)
                    .or_insert_with(|| serde_json::Value::Object(Default::default()));
                if let Some(state) = state.as_object_mut() {
                    for key in ["waiting", "running", "terminated"] {
                        state.entry(key).or_insert(serde_json::Value::Null);
                    }
                }
            }
        }
    }
    v
}

/// True when the parts of the status the kubelet owns are the same in both.
fn same_owned_status(api: Option<&PodStatus>, ours: &PodStatus) -> bool {
    let Some(api) = api else {
        return false;
    };
    api.phase == ours.phase
        && api.container_statuses == ours.container_statuses
        && api.init_container_statuses == ours.init_container_statuses
        && api.host_ip == ours.host_ip
        && api.pod_ip == ours.pod_ip
        && api.reason == ours.reason
        && ours.conditions.iter().flatten().all(|c| {
            api.conditions
                .iter()
                .flatten()
                .any(|a| a.type_ == c.type_ && a.status == c.status)
        })
        && TRANSIENT_CONDITIONS.into_iter().all(|t| {
            let has = |s: &PodStatus| s.conditions.iter().flatten().any(|c| c.type_ == t);
            has(api) == has(ours)
        })
}

/// Conditions only the kubelet writes and that are there only for a while.
const TRANSIENT_CONDITIONS: [&str; 2] = [
    crate::kubelet::allocation::RESIZE_PENDING,
    crate::kubelet::allocation::RESIZE_IN_PROGRESS,
];

#[cfg(test)]
mod tests;
