//! Pod workers: one task per pod UID, the single owner of that pod's lifecycle.
//!
//! Updates for a pod are serialised (one sync at a time per pod) and coalesced (while a sync
//! runs, newer updates replace older pending ones: the latest wins). A pod moves through three
//! states, as in the upstream kubelet: *syncing* (brought towards its spec by
//! [`PodSyncer::sync_pod`], again at every update and every resync interval), *terminating*
//! (its containers are stopped by [`PodSyncer::sync_terminating_pod`] within the grace period,
//! retried until it succeeds) and *terminated* (cleaned up by
//! [`PodSyncer::sync_terminated_pod`], retried until it succeeds). Other subsystems ask the
//! workers about a pod ([`PodWorkers::could_have_running_containers`], ...) instead of guessing.
//! Nothing here talks to a runtime: that is the syncer's job.

use crate::util::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::Notify;

/// Why a pod is being synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateType {
    /// The pod is new to the node.
    Create,
    /// The pod's spec changed.
    Update,
    /// Periodic resync, a PLEG event or a probe result.
    Sync,
    /// The pod must stop: deleted, evicted or rejected.
    Kill,
}

pub use crate::pod::SyncError;

/// How a sync of a running pod ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncOutcome {
    /// The pod finished on its own (every container exited for good under its restart policy).
    pub finished: bool,
    /// Sync again after this long at the latest (a back-off ends then), instead of at the next
    /// resync.
    pub requeue_after: Option<Duration>,
}

impl SyncOutcome {
    /// The pod runs on; sync it at the next resync.
    pub const RUNNING: SyncOutcome = SyncOutcome {
        finished: false,
        requeue_after: None,
    };
    /// The pod has finished.
    pub const FINISHED: SyncOutcome = SyncOutcome {
        finished: true,
        requeue_after: None,
    };
}

/// The lifecycle operations the workers drive. Implemented over the runtime traits by the
/// kubelet, and by recording fakes in tests.
#[async_trait::async_trait]
pub trait PodSyncer: Send + Sync + 'static {
    /// Brings the pod towards its spec; says whether it has finished on its own and when it
    /// wants to be synced again. An error is retried after the worker's error back-off.
    async fn sync_pod(&self, update: UpdateType, pod: &Pod) -> Result<SyncOutcome, SyncError>;
    /// Stops every container of the pod, giving each at most `grace` to exit.
    async fn sync_terminating_pod(&self, pod: &Pod, grace: Duration) -> Result<(), SyncError>;
    /// Releases what the stopped pod still holds (sandbox, volumes, cgroups).
    async fn sync_terminated_pod(&self, pod: &Pod) -> Result<(), SyncError>;
}

/// A worker's state, as other subsystems may see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerState {
    Syncing,
    Terminating,
    Terminated,
}

/// Timing of the workers.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How often a running pod is synced without any update (the kubelet's syncFrequency).
    pub resync: Duration,
    /// First retry delay after a failed sync; doubles up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            resync: Duration::from_secs(60),
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    }
}

struct Pending {
    pod: Pod,
    update: UpdateType,
    grace: Option<Duration>,
}

struct Slot {
    pending: Mutex<Option<Pending>>,
    state: Mutex<WorkerState>,
    wake: Notify,
}

/// The set of pod workers.
#[derive(Clone)]
pub struct PodWorkers {
    syncer: Arc<dyn PodSyncer>,
    timing: Timing,
    workers: Arc<Mutex<HashMap<String, Arc<Slot>>>>,
}

fn uid_of(pod: &Pod) -> String {
    crate::model::pod_uid(pod).to_string()
}

impl PodWorkers {
    pub fn new(syncer: Arc<dyn PodSyncer>, timing: Timing) -> Self {
        PodWorkers {
            syncer,
            timing,
            workers: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Hands an update to the pod's worker, starting one for a new pod. `grace` applies to
    /// `Kill` (default: the pod's terminationGracePeriodSeconds, else 30s). Updates to a
    /// terminating or terminated pod other than `Kill` are ignored: a pod never comes back.
    pub fn update_pod(&self, pod: Pod, update: UpdateType, grace: Option<Duration>) {
        let uid = uid_of(&pod);
        let slot = {
            let mut workers = lock(&self.workers);
            if let Some(slot) = workers.get(&uid) {
                slot.clone()
            } else {
                let slot = Arc::new(Slot {
                    pending: Mutex::new(None),
                    state: Mutex::new(WorkerState::Syncing),
                    wake: Notify::new(),
                });
                workers.insert(uid.clone(), slot.clone());
                let (syncer, timing, slot2) = (self.syncer.clone(), self.timing, slot.clone());
                tokio::spawn(async move { run_worker(syncer, timing, slot2).await });
                slot
            }
        };
        if *lock(&slot.state) != WorkerState::Syncing && update != UpdateType::Kill {
            return;
        }
        {
            let mut pending = lock(&slot.pending);
            // A pending kill is never replaced by a mere sync.
            let keep_kill = pending
                .as_ref()
                .is_some_and(|p| p.update == UpdateType::Kill && update != UpdateType::Kill);
            if keep_kill {
                if let Some(p) = pending.as_mut() {
                    p.pod = pod;
                }
            } else {
                *pending = Some(Pending { pod, update, grace });
            }
        }
        slot.wake.notify_one();
    }

    /// The worker state of a pod, or `None` if no worker knows it.
    pub fn state(&self, uid: &str) -> Option<WorkerState> {
        lock(&self.workers).get(uid).map(|s| *lock(&s.state))
    }

    /// Whether the pod may still have running containers (unknown pods: no).
    pub fn could_have_running_containers(&self, uid: &str) -> bool {
        matches!(
            self.state(uid),
            Some(WorkerState::Syncing | WorkerState::Terminating)
        )
    }

    /// Forgets terminated pods that are no longer desired (housekeeping). Returns their UIDs.
    pub fn forget_terminated(&self, desired: &[String]) -> Vec<String> {
        let mut workers = lock(&self.workers);
        let gone: Vec<String> = workers
            .iter()
            .filter(|(uid, s)| *lock(&s.state) == WorkerState::Terminated && !desired.contains(uid))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &gone {
            workers.remove(uid);
        }
        gone
    }

    /// UIDs of every pod a worker knows.
    pub fn known(&self) -> Vec<String> {
        lock(&self.workers).keys().cloned().collect()
    }
}

fn default_grace(pod: &Pod) -> Duration {
    let secs = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

async fn run_worker(syncer: Arc<dyn PodSyncer>, timing: Timing, slot: Arc<Slot>) {
    let mut pod: Option<Pod> = None;
    let mut grace = Duration::ZERO;
    let mut retry = timing.backoff;
    let mut next_wait = Duration::ZERO;
    loop {
        // Wait for an update, or until the next resync/retry is due.
        let got = lock(&slot.pending).take();
        let update = match got {
            Some(p) => {
                if p.update == UpdateType::Kill {
                    grace = p.grace.unwrap_or_else(|| default_grace(&p.pod));
                }
                let u = p.update;
                pod = Some(p.pod);
                u
            }
            None => {
                if tokio::time::timeout(next_wait, slot.wake.notified())
                    .await
                    .is_ok()
                {
                    continue;
                }
                UpdateType::Sync
            }
        };
        let Some(current) = pod.clone() else {
            next_wait = timing.resync;
            continue;
        };
        if *lock(&slot.state) == WorkerState::Syncing && update == UpdateType::Kill {
            *lock(&slot.state) = WorkerState::Terminating;
        }
        let state = *lock(&slot.state);
        let result = match state {
            WorkerState::Syncing => match syncer.sync_pod(update, &current).await {
                Ok(o) if o.finished => {
                    // Finished on its own: stop what is left, then clean up.
                    *lock(&slot.state) = WorkerState::Terminating;
                    grace = Duration::ZERO;
                    Ok(None)
                }
                Ok(o) => Ok(Some(o.requeue_after)),
                Err(e) => Err(e),
            },
            WorkerState::Terminating => match syncer.sync_terminating_pod(&current, grace).await {
                Ok(()) => {
                    *lock(&slot.state) = WorkerState::Terminated;
                    Ok(None)
                }
                Err(e) => Err(e),
            },
            WorkerState::Terminated => match syncer.sync_terminated_pod(&current).await {
                Ok(()) => {
                    tracing::debug!(pod = %uid_of(&current), "pod worker done");
                    return;
                }
                Err(e) => Err(e),
            },
        };
        next_wait = match result {
            // A state change: go on at once.
            Ok(None) => Duration::ZERO,
            Ok(Some(requeue)) => {
                retry = timing.backoff;
                requeue.map_or(timing.resync, |r| r.min(timing.resync))
            }
            Err(e) => {
                tracing::warn!(pod = %uid_of(&current), "sync failed, retrying in {retry:?}: {e}");
                let wait = retry;
                retry = (retry * 2).min(timing.max_backoff);
                wait
            }
        };
    }
}

#[cfg(test)]
mod tests;
