//! The sync loop (upstream `syncLoopIteration`): one `select!` over the sources' changes, the
//! PLEG's changed pods, problems to report and the housekeeping tick. Every branch only
//! dispatches: it hands pods to the workers, events to the recorder's queue and the desired
//! pods to the housekeeping task, and awaits no runtime or API call, so a slow runtime or API
//! server never stalls it.

use std::collections::HashSet;

use k8s_openapi::api::core::v1::Node;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::housekeeping::Desired;
use super::{HOUSEKEEPING_INTERVAL, PENDING_RESIZE_RETRY, dispatch, retry_pending_resizes};
use crate::api::events::{EventRecorder, EventType, Reason};
use crate::pod_workers::{PodWorkers, UpdateType};
use crate::sources::{self, PodUpdate, merge::Merger};
use crate::status_manager::StatusManager;
use std::sync::Arc;

/// The loop's state: everything it owns, nothing it awaits.
pub struct SyncLoop {
    /// Touched every time the loop goes round (`/healthz`, the watchdog).
    pub health: Arc<super::notify::SyncLoopHealth>,
    pub workers: PodWorkers,
    pub status: Arc<StatusManager>,
    pub merger: Merger,
    pub rejected: HashSet<String>,
    /// The Node admission checks against (the registered one, or the local view).
    pub node: Box<dyn Fn() -> Node + Send>,
    pub expected_sources: Vec<&'static str>,
    pub recorder: EventRecorder,
    pub desired: watch::Sender<Desired>,
    /// The pods the sources want, for the kubelet server (`/pods`, `/containerLogs`).
    pub pods: watch::Sender<Arc<Vec<k8s_openapi::api::core::v1::Pod>>>,
    /// Things that happened to pods (source changes, PLEG changes, workers forgotten): the
    /// housekeeping task collects garbage when this moved.
    pub changes: u64,
    /// Set once the node shuts down: new pods are refused.
    pub shutdown: Arc<super::shutdown::ShutdownState>,
    /// The node's pressure, for admission.
    pub eviction: Arc<super::eviction::EvictionState>,
    /// The pods' allocated resources (in-place resize).
    pub allocations: Arc<super::allocation::Allocations>,
    /// Device plugins' devices, for admission.
    pub devices: Option<crate::devices::DeviceManager>,
}

/// What the loop listens to.
pub struct Inputs {
    /// The sources' merged changes.
    pub updates: mpsc::Receiver<PodUpdate>,
    /// Pods the PLEG saw change, by UID.
    pub changed: mpsc::UnboundedReceiver<String>,
    /// Probe results that changed.
    pub probes: mpsc::UnboundedReceiver<crate::prober::Update>,
    /// Problems of the sources to report as node events.
    pub problems: mpsc::UnboundedReceiver<String>,
}

impl SyncLoop {
    /// Runs until `cancel` fires.
    pub async fn run(mut self, inputs: Inputs, cancel: CancellationToken) {
        let Inputs {
            mut updates,
            mut changed,
            probes: mut probe_results,
            mut problems,
        } = inputs;
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING_INTERVAL);
        housekeeping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut resizes = tokio::time::interval(PENDING_RESIZE_RETRY);
        resizes.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        resizes.reset();
        loop {
            self.health.touch();
            tokio::select! {
                _ = cancel.cancelled() => break,
                Some(update) = updates.recv() => {
                    self.changes += 1;
                    let node = (self.node)();
                    let shutting_down = self.shutdown.shutting_down();
                    let changes = self.merger.merge(update);
                    // Devices stay with pods that may run (their workers say so) and with pods
                    // that arrived but are not dispatched yet (after a restart, every pod).
                    let (workers, merger) = (&self.workers, &self.merger);
                    let holds = |uid: &str| {
                        workers.could_have_running_containers(uid)
                            || (workers.state(uid).is_none() && merger.pod(uid).is_some())
                    };
                    let device_holders: Option<&dyn Fn(&str) -> bool> =
                        self.all_sources_seen().then_some(&holds);
                    for change in changes {
                        let admit = super::Admit { node: &node, allocations: &self.allocations, shutting_down, eviction: &self.eviction, devices: self.devices.as_ref(), device_holders };
                        dispatch(&self.workers, &self.status, &mut self.rejected, &self.merger, &admit, change);
                    }
                    self.pods.send_replace(Arc::new(self.merger.pods()));
                }
                Some(uid) = changed.recv() => {
                    self.changes += 1;
                    if let Some(p) = self.merger.pod(&uid) {
                        self.workers.update_pod(p.clone(), UpdateType::Sync, None);
                    }
                }
                Some(result) = probe_results.recv() => {
                    // A readiness change is the container's `ready`; a liveness or startup
                    // failure makes the sync restart it.
                    if let Some(p) = self.merger.pod(&result.pod_uid) {
                        self.workers.update_pod(p.clone(), UpdateType::Sync, None);
                    }
                }
                Some(problem) = problems.recv() => {
                    let node = self.recorder.node_ref();
                    self.recorder.event(&node, EventType::Warning, Reason::FailedValidation, problem);
                }
                _ = housekeeping.tick() => self.housekeeping(),
                _ = resizes.tick() => {
                    // Room may have come without a pod going (the Node's allocatable grew).
                    let node = (self.node)();
                    retry_pending_resizes(&self.workers, &self.merger, &self.allocations, &node);
                }
            }
        }
    }

    /// Whether every configured source has sent its first full set.
    fn all_sources_seen(&self) -> bool {
        self.expected_sources
            .iter()
            .all(|s| self.merger.seen_source(s))
    }

    /// Forgets terminated workers no source wants and hands the desired pods to the
    /// housekeeping task, which does the slow part.
    fn housekeeping(&mut self) {
        let pods = self.merger.pods();
        let uids: Vec<String> = pods
            .iter()
            .map(|p| sources::pod_uid(p).to_string())
            .collect();
        let forgotten = self.workers.forget_terminated(&uids);
        self.changes += forgotten.len() as u64;
        let all_seen = self.all_sources_seen();
        self.desired.send_replace(Desired {
            pods,
            all_sources_seen: all_seen,
            api_seen: self.merger.seen_source(sources::API_SOURCE),
            changes: self.changes,
        });
    }
}
