//! Graceful node shutdown (upstream's `nodeshutdown` manager), run when systemd-logind announces
//! the machine's shutdown (see [`logind`]: the agent holds a delay inhibitor lock meanwhile), or
//! when the agent gets SIGTERM with `nodeletShutdownOnSigterm: true` (an init system without
//! logind handing nodelet the grace period). From then on new pods are refused (`NodeShutdown`) and
//! the Node is NotReady ("node is shutting down"); the running pods are stopped by priority
//! group, lowest first, each within the smaller of its own grace period and its group's, and
//! end Failed with reason `Terminated`, upstream's message and the `DisruptionTarget`
//! condition; the agent exits once their final statuses are written (or the time is up).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};

use crate::config::PriorityGroup;
use crate::model::Phase;
use crate::pod_workers::{PodWorkers, UpdateType, WorkerState};
use crate::sources;
use crate::status_manager::StatusManager;

pub mod logind;

/// The reason of pods refused and stopped because the node shuts down (upstream's).
pub const REASON: &str = "NodeShutdown";
/// Why a new pod is refused meanwhile.
pub const REJECT_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// The stopped pods' status reason and message.
pub const STOPPED_REASON: &str = "Terminated";
pub const STOPPED_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// The Node's Ready message meanwhile.
pub const NOT_READY: &str = "node is shutting down";

/// Whether the node is shutting down: read by admission and the Node's readiness.
#[derive(Debug, Default)]
pub struct ShutdownState {
    shutting_down: AtomicBool,
}

impl ShutdownState {
    pub fn begin(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// A shutdown was cancelled: new pods are admitted again.
    pub fn end(&self) {
        self.shutting_down.store(false, Ordering::SeqCst);
    }

    pub fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}

/// What a status of a pod the kubelet stopped for the node's shutdown says (upstream's
/// `PodStatusFunc` of the shutdown manager): Failed, `Terminated`, the message, and the
/// `DisruptionTarget` condition.
pub fn stopped_status(status: &mut PodStatus) {
    status.phase = Some(Phase::Failed.as_str().into());
    status.reason = Some(STOPPED_REASON.into());
    status.message = Some(STOPPED_MESSAGE.into());
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if !conditions.iter().any(|c| c.type_ == "DisruptionTarget") {
        conditions.push(PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some(STOPPED_MESSAGE.into()),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            )),
            ..Default::default()
        });
    }
}

/// The parts the shutdown sequence drives.
pub struct NodeShutdown {
    pub groups: Vec<PriorityGroup>,
    pub state: Arc<ShutdownState>,
    pub workers: PodWorkers,
    pub status: Arc<StatusManager>,
    /// The pods the sources want (the sync loop publishes them).
    pub pods: tokio::sync::watch::Receiver<Arc<Vec<Pod>>>,
    /// Marks a pod as stopped for the shutdown, for its final status.
    pub mark_stopped: Box<dyn Fn(&str) + Send + Sync>,
}

impl NodeShutdown {
    /// Runs the sequence (nothing when no grace period is configured).
    pub async fn run(&self) {
        if self.groups.is_empty() {
            return;
        }
        self.state.begin();
        let total: Duration = self.groups.iter().map(|g| g.grace).sum();
        tracing::info!(grace = ?total, groups = self.groups.len(), "node shutting down: stopping the pods");
        let deadline = tokio::time::Instant::now() + total;
        let pods: Vec<Pod> = self
            .pods
            .borrow()
            .iter()
            .filter(|p| self.workers.state(sources::pod_uid(p)) == Some(WorkerState::Syncing))
            .cloned()
            .collect();
        let mut stopped = Vec::new();
        for (i, group) in self.groups.iter().enumerate() {
            let next = self.groups.get(i + 1).map(|g| g.priority);
            let members: Vec<&Pod> = pods
                .iter()
                .filter(|p| {
                    let prio = priority(p);
                    (i == 0 || prio >= group.priority) && next.is_none_or(|n| prio < n)
                })
                .collect();
            let group_end = tokio::time::Instant::now() + group.grace;
            for pod in &members {
                let uid = sources::pod_uid(pod).to_string();
                let own = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
                    .map_or(Duration::from_secs(30), |s| {
                        Duration::from_secs(u64::try_from(s).unwrap_or(0))
                    });
                (self.mark_stopped)(&uid);
                tracing::info!(pod = %sources::pod_full_name(pod), grace = ?own.min(group.grace), "stopping for the node's shutdown");
                self.workers.update_pod(
                    (*pod).clone(),
                    UpdateType::Kill,
                    Some(own.min(group.grace)),
                );
                stopped.push(uid);
            }
            // The group's pods stopped, or its time up (a stop's last SIGKILL is in flight).
            let done = || {
                members.iter().all(|p| {
                    matches!(
                        self.workers.state(sources::pod_uid(p)),
                        None | Some(WorkerState::Terminated)
                    )
                })
            };
            while !done() && tokio::time::Instant::now() < group_end + Duration::from_secs(2) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // Their final statuses in the API server, before the agent goes.
        let deadline = deadline.max(tokio::time::Instant::now()) + Duration::from_secs(5);
        while !self.status.written(&stopped) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::info!(pods = stopped.len(), "node shutdown: the pods are stopped");
    }
}

/// A pod's priority (`spec.priority`; 0 when unset, as upstream).
fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_status_says_why_once() {
        let mut st = PodStatus {
            phase: Some("Running".into()),
            ..Default::default()
        };
        stopped_status(&mut st);
        stopped_status(&mut st);
        assert_eq!(st.phase.as_deref(), Some("Failed"));
        assert_eq!(st.reason.as_deref(), Some("Terminated"));
        assert_eq!(st.message.as_deref(), Some(STOPPED_MESSAGE));
        let conditions = st.conditions.unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].type_, "DisruptionTarget");
        assert_eq!(
            conditions[0].reason.as_deref(),
            Some("TerminationByKubelet")
        );
    }
}
