//! Housekeeping, off the sync loop (upstream `HandlePodCleanups` and the GC loops): every time
//! the loop publishes the desired pods, stop and remove the sandboxes of pods no source wants,
//! give back user namespaces, tear down the written volumes of pods gone, remove the cgroups
//! of pods no longer running, drop old back-off entries, collect garbage (dead containers,
//! sandboxes, pod and log directories), and keep the mirror pods of static pods in step.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use runtime::RuntimeService;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::gc::{GarbageCollector, PodState};
use super::mirror::MirrorManager;
use super::pod_cache::PodCache;
use super::userns::UsernsManager;
use super::{Syncer, remove_orphans};
use crate::node::NodeAgent;
use crate::pod_workers::{PodWorkers, WorkerState};
use crate::sources::{self, api::MirrorPods};
use crate::status_manager::{self, StatusManager};

/// What the sync loop wants, as of its last housekeeping tick.
#[derive(Debug, Clone, Default)]
pub struct Desired {
    /// Every pod some source wants.
    pub pods: Vec<Pod>,
    /// Every configured source has sent its first full set (before that, a pod missing from
    /// the set may only not have arrived yet: nothing is removed).
    pub all_sources_seen: bool,
    /// The API source has sent its first set (mirror pods can be compared).
    pub api_seen: bool,
    /// How many things have happened to pods so far (see `SyncLoop::changes`).
    pub changes: u64,
}

/// How often garbage is collected when nothing happens to any pod (upstream's container GC
/// period); otherwise it is collected on the housekeeping pass after something did.
pub const GC_PERIOD: Duration = Duration::from_secs(60);

/// The housekeeping task's parts.
pub struct Housekeeping {
    pub rt: Arc<dyn RuntimeService>,
    pub workers: PodWorkers,
    pub userns: Arc<UsernsManager>,
    pub syncer: Arc<Syncer>,
    pub status: Arc<StatusManager>,
    pub gc: GarbageCollector,
    pub mirror_manager: Option<MirrorManager>,
    pub mirrors: watch::Receiver<MirrorPods>,
    pub node_agent: Option<Arc<NodeAgent>>,
    pub cache: Arc<PodCache>,
}

impl Housekeeping {
    /// Destroys the cgroups of pods not running any more (as upstream's
    /// `cleanupOrphanedPodCgroups`): kept are the pods a worker syncs or terminates, and those
    /// wanted that no worker has yet.
    async fn remove_pod_cgroups(&self, wanted: &HashSet<String>) {
        let cm = self.syncer.cm.clone();
        let workers = &self.workers;
        let keep = |uid: &str| match workers.state(uid) {
            Some(WorkerState::Syncing | WorkerState::Terminating) => true,
            Some(WorkerState::Terminated) => false,
            None => wanted.contains(uid),
        };
        let orphans = match cm.orphans(keep) {
            Ok(o) if o.is_empty() => return,
            Ok(o) => o,
            Err(e) => {
                tracing::warn!("listing the pod cgroups: {e}");
                return;
            }
        };
        // Killing what is left in them may wait a little: off the async workers.
        let errors = tokio::task::spawn_blocking(move || cm.destroy_pods(orphans)).await;
        for e in errors.into_iter().flatten() {
            tracing::warn!("removing a pod cgroup: {e}");
        }
    }

    /// Runs a pass each time the loop publishes, until `cancel` fires.
    pub async fn run(self, mut desired: watch::Receiver<Desired>, cancel: CancellationToken) {
        // The changes count and time of the last collection.
        let mut collected: Option<(u64, Instant)> = None;
        // Whether the allocations of pods gone while the agent was down were forgotten.
        let mut pruned = false;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = desired.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let d = desired.borrow_and_update().clone();
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = self.pass(&d, &mut collected, &mut pruned) => {}
                    }
                }
            }
        }
    }

    async fn pass(&self, d: &Desired, collected: &mut Option<(u64, Instant)>, pruned: &mut bool) {
        tracing::debug!(
            pods = d.pods.len(),
            all_seen = d.all_sources_seen,
            "housekeeping"
        );
        let wanted: HashSet<String> = d
            .pods
            .iter()
            .map(|p| sources::pod_uid(p).to_string())
            .collect();
        let uids: Vec<String> = wanted.iter().cloned().collect();
        self.syncer.gc_backoff(runtime::clock::now());
        if d.all_sources_seen {
            remove_orphans(self.rt.as_ref(), &uids, &self.workers).await;
            self.userns
                .release_others(|uid| wanted.contains(uid) || self.workers.state(uid).is_some());
            // Written volumes (a tmpfs) of pods gone while the kubelet was down, which would
            // keep the garbage collector from removing their directories.
            self.syncer
                .volumes
                .tear_down_gone(|uid| wanted.contains(uid) || self.workers.state(uid).is_some());
            self.remove_pod_cgroups(&wanted).await;
            // Devices held by pods that ended are free again.
            if let Some(devices) = &self.syncer.opts.device_manager {
                devices.retain(|uid| self.workers.could_have_running_containers(uid));
            }
            // Once, when every source was seen: later deletions forget their own.
            if !*pruned {
                self.syncer
                    .allocations
                    .forget_others(|uid| wanted.contains(uid) || self.workers.state(uid).is_some());
                *pruned = true;
            }
            let workers = &self.workers;
            let state = |uid: &str| match workers.state(uid) {
                Some(WorkerState::Syncing | WorkerState::Terminating) => PodState::Active,
                Some(WorkerState::Terminated) => PodState::Terminated,
                None if wanted.contains(uid) => PodState::Terminated,
                None => PodState::Gone,
            };
            // The runtime is listed only when something happened since the last collection, or
            // a period passed: a quiet node costs nothing.
            let due = collected
                .is_none_or(|(changes, at)| changes != d.changes || at.elapsed() >= GC_PERIOD);
            if due {
                let report = self.gc.collect(&state).await;
                tracing::debug!(?report, "garbage collection");
                for e in &report.errors {
                    tracing::warn!("garbage collection: {e}");
                }
                let again =
                    !report.removed_containers.is_empty() || !report.removed_sandboxes.is_empty();
                // What a collection removed may leave more to collect (a sandbox emptied, a pod
                // dir freed): the next pass collects again. Failures wait for the period.
                *collected = Some((if again { u64::MAX } else { d.changes }, Instant::now()));
            }
            for uid in self.cache.uids() {
                if !wanted.contains(&uid) && workers.state(&uid).is_none() {
                    self.cache.delete(&uid);
                }
            }
        }
        if let Some(mm) = &self.mirror_manager {
            if d.api_seen {
                let static_pods: Vec<Pod> = d
                    .pods
                    .iter()
                    .filter(|p| !status_manager::is_api_pod(p))
                    .cloned()
                    .collect();
                let current = self.mirrors.borrow().clone();
                let node_uid = self
                    .node_agent
                    .as_ref()
                    .and_then(|a| a.node())
                    .and_then(|n| n.metadata.uid);
                mm.sync(&static_pods, &current, node_uid.as_deref()).await;
                // A mirror created afresh, or changed by someone else, gets the status.
                for p in &static_pods {
                    if let Some(m) = current.get(&sources::pod_full_name(p)) {
                        self.status
                            .reconcile_status(sources::pod_uid(p), m.status.as_ref());
                    }
                }
            }
        }
    }
}
