//! The pod startup latency tracker behind `kubelet_pod_start_sli_duration_seconds` and
//! `kubelet_pod_start_total_duration_seconds`, as upstream's `pod_startup_latency_tracker.go`:
//!
//! - a pod is tracked from the first time the API watch shows it with no `status.startTime`
//!   (no kubelet acknowledged it yet), so pods found already started after a restart, and static
//!   pods, are not; a pod the scheduler could not place (`PodScheduled=False`) never is;
//! - image pulls of the pod are recorded as sessions (each pull's start is paired, oldest first,
//!   with the next successful pull's end) and their union subtracted; so is the time each
//!   regular init container ran (from its start by the kubelet to its finish);
//! - once the kubelet has written a status with every container running and the watch has
//!   shown the pod so (in either order: the write's watch event may arrive before its answer),
//!   the start is observed once, from creationTimestamp to that watch event: the total, and
//!   the SLI (minus pulls and init containers) unless the pod is stateful (a volume other
//!   than secret, configMap, downwardAPI, emptyDir, projected, image, ephemeral or an inline
//!   ephemeral CSI volume);
//! - terminal pods, and pods gone from the kubelet, are forgotten.
//!
//! Times are wall-clock ([`SystemTime`]): the end points are the API's creationTimestamp and
//! the runtime's finish times.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::model::pod_uid as uid;
use k8s_openapi::api::core::v1::Pod;

/// What one pod's start observed: the total since creation, and the SLI duration (None for a
/// stateful pod, which the SLI leaves out).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observation {
    pub total: Duration,
    pub sli: Option<Duration>,
}

#[derive(Debug, Default)]
struct PodState {
    /// Pulls started and not yet paired with an end, oldest first.
    pull_starts: VecDeque<SystemTime>,
    /// Finished pull sessions.
    pulls: Vec<(SystemTime, SystemTime)>,
    /// The regular init container started last (its name) and not yet seen finished.
    init_started: Option<(String, SystemTime)>,
    init_total: Duration,
    /// When a written status first had every container running.
    running_written: Option<SystemTime>,
    /// When the watch first showed every container running (the kubelet's write may come back
    /// on the watch before the answer to it does).
    running_watched: Option<SystemTime>,
    /// The pod's creationTimestamp, and whether it is stateful, from the watch.
    created: Option<SystemTime>,
    stateful: bool,
    recorded: bool,
}

impl PodState {
    /// The start, once both the kubelet's write and the watch have shown it running.
    fn observe(&mut self) -> Option<Observation> {
        if self.recorded || self.running_written.is_none() {
            return None;
        }
        let when = self.running_watched?;
        let total = when.duration_since(self.created?).unwrap_or_default();
        self.recorded = true;
        let sli = (!self.stateful).then(|| {
            total
                .saturating_sub(pulling_time(&self.pulls))
                .saturating_sub(self.init_total)
        });
        Some(Observation { total, sli })
    }
}

#[derive(Debug, Default)]
struct State {
    pods: HashMap<String, PodState>,
    /// Pods left out for good (they were unschedulable).
    excluded: HashSet<String>,
}

/// The tracker; every method takes the time it happened at, for tests.
#[derive(Debug, Default)]
pub struct StartupTracker {
    state: Mutex<State>,
}

impl StartupTracker {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut s = crate::util::lock(&self.state);
        f(&mut s)
    }

    fn with_pod(&self, uid: &str, f: impl FnOnce(&mut PodState)) {
        self.with(|s| {
            if let Some(p) = s.pods.get_mut(uid) {
                f(p);
            }
        });
    }

    /// The API watch showed `pod` at `when` (upstream's `ObservedPodOnWatch`); what its start
    /// observed, once, when it is the first sight of it running after the kubelet wrote so.
    pub fn observed_on_watch(&self, pod: &Pod, when: SystemTime) -> Option<Observation> {
        let uid = uid(pod);
        if uid.is_empty() {
            return None;
        }
        let status = pod.status.as_ref();
        let phase = crate::model::Phase::parse(status.and_then(|s| s.phase.as_deref()));
        self.with(|s| {
            if phase.is_terminal() {
                s.pods.remove(uid);
                return None;
            }
            let Some(state) = s.pods.get_mut(uid) else {
                if s.excluded.contains(uid) || status.is_some_and(|st| st.start_time.is_some()) {
                    return None;
                }
                if unschedulable(pod) {
                    s.excluded.insert(uid.to_string());
                } else {
                    s.pods.insert(uid.to_string(), PodState::default());
                }
                return None;
            };
            if unschedulable(pod) {
                s.pods.remove(uid);
                s.excluded.insert(uid.to_string());
                return None;
            }
            state.created = pod
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| SystemTime::from(t.0));
            state.stateful = stateful(pod);
            if state.running_watched.is_none() && all_running(pod) {
                state.running_watched = Some(when);
            }
            state.observe()
        })
    }

    /// An image pull for the pod began (queued included, as upstream records it before the pull).
    pub fn pull_started(&self, uid: &str, at: SystemTime) {
        self.with_pod(uid, |p| p.pull_starts.push_back(at));
    }

    /// An image pull for the pod succeeded: it ends the oldest open pull.
    pub fn pull_finished(&self, uid: &str, at: SystemTime) {
        self.with_pod(uid, |p| {
            if let Some(start) = p.pull_starts.pop_front() {
                p.pulls.push((start, at));
            }
        });
    }

    /// The kubelet started the pod's regular (not restartable) init container `name`.
    pub fn init_started(&self, uid: &str, name: &str, at: SystemTime) {
        self.with_pod(uid, |p| p.init_started = Some((name.to_string(), at)));
    }

    /// The init container `name` was seen finished successfully at `at`: the time since the
    /// kubelet started it counts once, if it is the one started last and finished after.
    pub fn init_finished(&self, uid: &str, name: &str, at: SystemTime) {
        self.with_pod(uid, |p| {
            let Some((started, since)) = &p.init_started else {
                return;
            };
            if started == name
                && let Ok(ran) = at.duration_since(*since)
            {
                p.init_total += ran;
                p.init_started = None;
            }
        });
    }

    /// The kubelet wrote the pod's status; `pod` is the object the API server returned. What
    /// the start observed, if the watch already showed the pod running.
    pub fn status_written(&self, pod: &Pod, at: SystemTime) -> Option<Observation> {
        if !all_running(pod) {
            return None;
        }
        self.with(|s| {
            let p = s.pods.get_mut(uid(pod))?;
            if p.running_written.is_none() {
                p.running_written = Some(at);
            }
            p.observe()
        })
    }

    /// The pod is gone from the kubelet.
    pub fn forget(&self, uid: &str) {
        self.with(|s| {
            s.pods.remove(uid);
            s.excluded.remove(uid);
        });
    }
}

/// Every container has been started (running, with a start time), as upstream's
/// `hasPodStartedSLO`; a status listing no containers yet has not.
fn all_running(pod: &Pod) -> bool {
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_deref())
        .unwrap_or(&[]);
    !statuses.is_empty()
        && statuses.iter().all(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.running.as_ref())
                .is_some_and(|r| r.started_at.is_some())
        })
}

fn unschedulable(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or(&[])
        .iter()
        .any(|c| c.type_ == "PodScheduled" && c.status == "False")
}

/// A pod mounting anything but ephemeral volumes (the SLI's "stateful pod").
fn stateful(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or(&[])
        .iter()
        .any(|v| {
            let ephemeral_csi = v.csi.as_ref().is_some_and(|c| {
                c.volume_attributes
                    .as_ref()
                    .and_then(|a| a.get("csi.storage.k8s.io/ephemeral"))
                    .is_some_and(|e| e == "true")
            });
            v.secret.is_none()
                && v.config_map.is_none()
                && v.downward_api.is_none()
                && v.empty_dir.is_none()
                && v.projected.is_none()
                && v.git_repo.is_none()
                && v.image.is_none()
                && v.ephemeral.is_none()
                && !ephemeral_csi
        })
}

/// The time covered by at least one pull session (overlapping pulls counted once).
fn pulling_time(sessions: &[(SystemTime, SystemTime)]) -> Duration {
    let mut sorted: Vec<_> = sessions.iter().filter(|(s, e)| e > s).copied().collect();
    sorted.sort();
    let mut total = Duration::ZERO;
    let mut covered: Option<SystemTime> = None;
    for (start, end) in sorted {
        let from = covered.map_or(start, |c| c.max(start));
        if end > from {
            total += end.duration_since(from).unwrap_or_default();
            covered = Some(end);
        }
    }
    total
}

#[cfg(test)]
mod tests;
