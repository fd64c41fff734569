//! The eviction manager's loop (upstream's `managerImpl.synchronize`): one cycle per monitoring
//! period, at most one pod evicted per cycle, then a wait (up to 30 s) for that pod's end
//! before the next.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use runtime::{ImageService, RuntimeService, cri};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::rank::{self, Usage};
use super::signals::{self, NodeSignals};
use super::thresholds::{self, Observations, Threshold, Tracker};
use super::{EvictionState, Pressure, Signal, local_storage};
use crate::api::events::{EventRecorder, EventType, Reason, pod_ref};
use crate::kubelet::image_gc::ImageGc;
use crate::kubelet::syncer::{Stopped, Syncer};
use crate::model::{pod_full_name, pod_uid};
use crate::pod_workers::{PodWorkers, UpdateType, WorkerState};
use crate::server::summary;

/// The grace period of a pod evicted for a hard threshold (upstream's
/// `immediateEvictionGracePeriodSeconds`).
const IMMEDIATE_GRACE: Duration = Duration::from_secs(1);
/// How long a cycle waits for the pod it evicted to end (upstream's `podCleanupTimeout`).
const CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// What the manager reads and drives.
pub struct EvictionParts {
    pub thresholds: Vec<Threshold>,
    pub transition: Duration,
    /// `evictionMaxPodGracePeriod` (seconds), for soft thresholds.
    pub max_pod_grace: i64,
    pub period: Duration,
    pub signals: NodeSignals,
    pub state: Arc<EvictionState>,
    pub workers: PodWorkers,
    /// The pods the sources want (the sync loop publishes them).
    pub pods: watch::Receiver<Arc<Vec<Pod>>>,
    pub rt: Arc<dyn RuntimeService>,
    pub images: Arc<dyn ImageService>,
    pub image_gc: Option<Arc<ImageGc>>,
    pub events: EventRecorder,
    /// Marks a pod as evicted, for its final status.
    pub syncer: Arc<Syncer>,
    pub node_name: String,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
}

/// The eviction manager.
pub struct EvictionManager {
    parts: EvictionParts,
    tracker: Tracker,
}

impl EvictionManager {
    pub fn new(parts: EvictionParts) -> Self {
        EvictionManager {
            parts,
            tracker: Tracker::default(),
        }
    }

    /// A cycle every monitoring period, and at once when the kernel tells the node's memory
    /// crossed its `memory.available` threshold, until `cancel` fires.
    pub async fn run(mut self, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.parts.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut notifier = None;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tick.tick() => {}
                _ = signals::notified(&notifier) => {
                    tracing::debug!("memory threshold notice");
                }
            }
            if let Some(pod) = self.synchronize(Instant::now()).await {
                self.wait_for_cleanup(&pod, &cancel).await;
            }
            notifier = self.arm_notifier();
        }
    }

    /// A notifier for the highest `memory.available` threshold (the first crossed), armed
    /// anew each cycle.
    fn arm_notifier(&self) -> Option<signals::MemoryNotifier> {
        let capacity = self.parts.signals.memory_capacity;
        let threshold = self
            .parts
            .thresholds
            .iter()
            .filter(|t| t.signal == super::Signal::MemoryAvailable)
            .map(|t| t.value.absolute(capacity))
            .max()?;
        signals::MemoryNotifier::arm(capacity, threshold)
    }

    /// The pods the workers run (evictable ones among them).
    fn active_pods(&self) -> Vec<Pod> {
        self.parts
            .pods
            .borrow()
            .iter()
            .filter(|p| self.parts.workers.state(pod_uid(p)) == Some(WorkerState::Syncing))
            .cloned()
            .collect()
    }

    /// One cycle at `now`: local storage limits, then the thresholds. Returns the pod evicted.
    pub async fn synchronize(&mut self, now: Instant) -> Option<Pod> {
        let active = self.active_pods();
        if active.iter().any(local_storage::has_limits)
            && let Some(usage) = self.usage().await
        {
            for pod in &active {
                let Some(u) = usage.get(pod_uid(pod)) else {
                    continue;
                };
                if let Some(message) = local_storage::violation(pod, u) {
                    if self.evict(pod, Duration::ZERO, message, false) {
                        return Some(pod.clone());
                    }
                }
            }
        }
        let observations = self.parts.signals.observe().await;
        let decision = self.tracker.observe(
            &self.parts.thresholds,
            &observations,
            self.parts.transition,
            now,
        );
        let before = self.parts.state.conditions();
        if before != decision.conditions {
            tracing::info!(conditions = ?decision.conditions, ?observations, "node pressure changed");
        }
        self.parts.state.set(decision.conditions.clone());
        let first = decision.act_on.first()?.clone();
        let resource = first.signal.resource();
        tracing::warn!(
            signal = first.signal.as_str(),
            resource,
            ?observations,
            "eviction threshold met"
        );
        let node = self.parts.events.node_ref();
        self.parts.events.event(
            &node,
            EventType::Warning,
            Reason::EvictionThresholdMet,
            format!("Attempting to reclaim {resource}"),
        );
        let disk = first.signal.pressure() == Pressure::Disk;
        let dedicated_image_fs = disk && self.parts.signals.dedicated_image_fs().await;
        if disk
            && self
                .reclaim_disk(&decision.act_on, dedicated_image_fs)
                .await
        {
            return None;
        }
        let usage = self.usage().await?;
        let mut candidates: Vec<Pod> = active
            .into_iter()
            .filter(|p| !rank::is_critical(p))
            .collect();
        if candidates.is_empty() {
            tracing::error!(
                resource,
                "eviction threshold met, but no pod may be evicted"
            );
            return None;
        }
        rank::rank(
            &mut candidates,
            resource,
            &usage,
            disk_measure(first.signal, dedicated_image_fs),
        );
        let pod = candidates.into_iter().next()?;
        let grace = if first.is_hard() {
            IMMEDIATE_GRACE
        } else {
            let own = pod
                .spec
                .as_ref()
                .and_then(|s| s.termination_grace_period_seconds)
                .unwrap_or(30);
            Duration::from_secs(u64::try_from(own.min(self.parts.max_pod_grace)).unwrap_or(0))
        };
        let message = rank::message(
            resource,
            &pod,
            usage.get(pod_uid(&pod)),
            &decision.act_on,
            &observations,
        );
        self.evict(&pod, grace, message, true).then_some(pod)
    }

    /// Frees node-level disk (upstream's `reclaimNodeLevelResources`): every dead container,
    /// then every unused image. True when the thresholds acted on are no longer met (their
    /// minimum reclaim counted). With the images on a filesystem of their own, `nodefs`
    /// pressure has nothing to reclaim there (upstream's reclaim functions for it are none):
    /// pods are evicted for it at once.
    async fn reclaim_disk(&self, acted_on: &[Threshold], dedicated_image_fs: bool) -> bool {
        if dedicated_image_fs && acted_on.iter().all(|t| t.signal.on_node_fs()) {
            tracing::info!(
                "nodefs pressure with a dedicated image filesystem: no node-level reclaim (no \
                 image or container would free the root dir's filesystem)"
            );
            return false;
        }
        let removed = self.remove_dead_containers().await;
        let freed = match &self.parts.image_gc {
            Some(gc) => match gc.delete_unused(runtime::clock::now()).await {
                Ok(report) => report.freed,
                Err(e) => {
                    tracing::warn!("deleting unused images: {e}");
                    0
                }
            },
            None => 0,
        };
        let observations: Observations = self.parts.signals.observe().await;
        let still = thresholds::met(acted_on, &observations, true);
        tracing::info!(
            dead_containers = removed,
            image_bytes = freed,
            resolved = still.is_empty(),
            "reclaimed node-level disk"
        );
        still.is_empty()
    }

    /// Removes every exited container; returns how many went.
    async fn remove_dead_containers(&self) -> usize {
        let filter = cri::ContainerFilter {
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerExited as i32,
            }),
            ..Default::default()
        };
        let Ok(list) = self
            .parts
            .rt
            .list_containers(cri::ListContainersRequest {
                filter: Some(filter),
            })
            .await
        else {
            return 0;
        };
        let mut removed = 0;
        for c in list.containers {
            match self
                .parts
                .rt
                .remove_container(cri::RemoveContainerRequest {
                    container_id: c.id.clone(),
                })
                .await
            {
                Ok(_) => removed += 1,
                Err(e) => tracing::warn!(container = %c.id, "removing a dead container: {e}"),
            }
        }
        removed
    }

    /// What each pod uses, from the summary provider (`/stats/summary`'s); `None` when it
    /// cannot be read (then, as upstream, nothing is evicted this round: a ranking without
    /// usage would pick a pod at random).
    async fn usage(&self) -> Option<Usage> {
        let pods_dir = self.parts.root_dir.join("pods");
        let src = summary::Sources {
            node_name: &self.parts.node_name,
            root_dir: &self.parts.root_dir,
            pod_logs_dir: &self.parts.pod_logs_dir,
            pods_dir: &pods_dir,
        };
        match summary::summary(&src, self.parts.rt.as_ref(), self.parts.images.as_ref()).await {
            Ok(s) => Some(rank::usage_of(&s)),
            Err(e) => {
                tracing::warn!("reading the pods' usage: {e}; no eviction this round");
                None
            }
        }
    }

    /// Evicts `pod` within `grace` (upstream's `evictPod`): never a critical pod. Its status
    /// says why, an `Evicted` event too.
    fn evict(&self, pod: &Pod, grace: Duration, message: String, disruption: bool) -> bool {
        if rank::is_critical(pod) {
            tracing::error!(pod = %pod_full_name(pod), "cannot evict a critical pod: {message}");
            return false;
        }
        tracing::warn!(pod = %pod_full_name(pod), ?grace, "evicting: {message}");
        self.parts.events.event(
            &pod_ref(pod),
            EventType::Warning,
            Reason::Evicted,
            message.clone(),
        );
        self.parts.syncer.mark_stopped(
            pod_uid(pod),
            Stopped::Evicted {
                message,
                disruption,
            },
        );
        self.parts
            .workers
            .update_pod(pod.clone(), UpdateType::Kill, Some(grace));
        true
    }

    /// Waits until the evicted pod's worker finished (or the cleanup timeout).
    async fn wait_for_cleanup(&self, pod: &Pod, cancel: &CancellationToken) {
        let end = tokio::time::Instant::now() + CLEANUP_TIMEOUT;
        while tokio::time::Instant::now() < end && !cancel.is_cancelled() {
            if matches!(
                self.parts.workers.state(pod_uid(pod)),
                None | Some(WorkerState::Terminated)
            ) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// How pods' disk usage is measured for ranking under `signal`'s pressure (upstream's
/// `rankDiskPressureFunc` arguments): everything when the images share the root dir's
/// filesystem; else logs and local volumes for `nodefs`, writable layers for `imagefs`.
fn disk_measure(signal: Signal, dedicated_image_fs: bool) -> rank::DiskMeasure {
    match (dedicated_image_fs, signal.on_node_fs()) {
        (false, _) => rank::DiskMeasure::Everything,
        (true, true) => rank::DiskMeasure::LogsAndLocalVolumes,
        (true, false) => rank::DiskMeasure::WritableLayers,
    }
}
