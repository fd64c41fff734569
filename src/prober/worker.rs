//! One probe worker: a container's probe of one kind, run every period (upstream
//! `prober/worker.go`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStatus, Pod, PodStatus, Probe,
};
use tokio_util::sync::CancellationToken;

use super::results::ResultsManager;
use super::run::{Attempt, Prober, Target};
use super::{ProbeKind, ProbeParams, ProbeResult};
use crate::api::events::PodEvents;
use crate::api::events::{EventType, Reason};
use crate::model::pod_uid as uid;
use crate::model::{Phase, RestartPolicy};

/// Where a worker reads the pod's last computed status (the status manager).
pub trait StatusSource: Send + Sync {
    fn pod_status(&self, uid: &str) -> Option<PodStatus>;
}

impl StatusSource for crate::status_manager::StatusManager {
    fn pod_status(&self, uid: &str) -> Option<PodStatus> {
        self.status(uid)
    }
}

/// What every worker shares.
#[derive(Clone)]
pub struct Shared {
    pub prober: Arc<dyn Prober>,
    pub statuses: Arc<dyn StatusSource>,
    pub results: Arc<ResultsManager>,
    pub events: Arc<dyn PodEvents>,
}

/// How often an attempt that could not be run is tried again within one period.
const MAX_TRIES: usize = 3;

pub struct Worker {
    pub shared: Shared,
    pub pod: Arc<Pod>,
    pub container: Container,
    pub kind: ProbeKind,
    pub probe: Probe,
    pub params: ProbeParams,
    /// The container the results are for.
    container_id: Option<String>,
    last: Option<ProbeResult>,
    /// How many attempts in a row gave `last`.
    run: u32,
    /// A liveness or startup failure stops probing until the container is replaced.
    on_hold: bool,
}

fn started_at(s: &ContainerStatus) -> Option<SystemTime> {
    let t = s.state.as_ref()?.running.as_ref()?.started_at.as_ref()?;
    let ns = u64::try_from(t.0.as_nanosecond()).ok()?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_nanos(ns))
}

impl Worker {
    pub fn new(
        shared: Shared,
        pod: Arc<Pod>,
        container: Container,
        kind: ProbeKind,
        probe: Probe,
    ) -> Self {
        let params = ProbeParams::of(&probe);
        Worker {
            shared,
            pod,
            container,
            kind,
            probe,
            params,
            container_id: None,
            last: None,
            run: 0,
            on_hold: false,
        }
    }

    /// Probes every period, starting after a random part of one period, until `stop` fires or
    /// the container will not run again; then forgets its result.
    pub async fn run(mut self, stop: CancellationToken) {
        let jitter = self.params.period.mul_f64(fastrand::f64());
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(jitter) => {
                let mut tick = tokio::time::interval(self.params.period);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tick.tick() => {}
                    }
                    if !self.do_probe().await {
                        break;
                    }
                }
            }
        }
        if let Some(id) = &self.container_id {
            self.shared.results.remove(id, self.kind);
        }
    }

    /// One period's work (upstream `doProbe`); false once probing is over for good.
    pub async fn do_probe(&mut self) -> bool {
        let uid = uid(&self.pod).to_string();
        let Some(status) = self.shared.statuses.pod_status(&uid) else {
            return true; // not synced yet
        };
        if Phase::parse(status.phase.as_deref()).is_terminal() {
            return false;
        }
        let name = &self.container.name;
        let Some(c) = status
            .container_statuses
            .iter()
            .flatten()
            .chain(status.init_container_statuses.iter().flatten())
            .find(|c| &c.name == name)
        else {
            return true;
        };
        let Some(id) = c
            .container_id
            .as_deref()
            .filter(|id| !id.is_empty())
            .map(|id| id.split_once("://").map_or(id, |(_, id)| id).to_string())
        else {
            return true; // not created yet
        };
        self.follow(&uid, &id);
        if self.on_hold {
            return true;
        }
        let state = c.state.clone().unwrap_or_default();
        if state.running.is_none() {
            return self.not_running(&uid, &id, &state);
        }
        if !self.due(c) {
            return true;
        }
        let pod_ip = status.pod_ip.clone().unwrap_or_default();
        let attempt = self.attempt(&id, &pod_ip).await;
        self.count(&attempt, &uid);
        if let Some(result) = self.report(attempt) {
            self.record(&uid, &id, result);
        }
        true
    }

    /// Starts over with the container `id` when it is a new one (a restart).
    fn follow(&mut self, uid: &str, id: &str) {
        if self.container_id.as_deref() == Some(id) {
            return;
        }
        if let Some(old) = self.container_id.take() {
            self.shared.results.remove(&old, self.kind);
        }
        self.shared
            .results
            .set(uid, id, self.kind, self.kind.initial());
        self.container_id = Some(id.to_string());
        self.last = None;
        self.run = 0;
        self.on_hold = false;
    }

    /// A container not running: not ready; whether probing goes on (not when the container
    /// ended and will not run again).
    fn not_running(&self, uid: &str, id: &str, state: &ContainerState) -> bool {
        // (Upstream also sets liveness to failure here; a created container that then starts
        // under the same ID would be killed for it.)
        if self.kind == ProbeKind::Readiness {
            self.shared
                .results
                .set(uid, id, self.kind, ProbeResult::Failure);
        }
        let policy = crate::model::restart_policy(&self.pod);
        let sidecar = crate::model::is_sidecar(&self.container);
        state.terminated.is_none() || sidecar || policy != RestartPolicy::Never
    }

    /// Whether this probe runs now: a startup probe until the start, the others after it,
    /// and none before the initial delay.
    fn due(&self, c: &ContainerStatus) -> bool {
        let started = c.started == Some(true);
        if self.kind == ProbeKind::Startup && started {
            return false; // a startup probe ends with the start
        }
        if self.kind != ProbeKind::Startup && !started {
            return false; // the startup probe has not passed yet
        }
        let since = started_at(c).map(|at| {
            runtime::clock::now()
                .duration_since(at)
                .unwrap_or(Duration::ZERO)
        });
        since.is_none_or(|since| since >= self.params.initial_delay)
    }

    /// One attempt, tried again (up to [`MAX_TRIES`]) while it errs.
    async fn attempt(&self, id: &str, pod_ip: &str) -> Attempt {
        let target = Target {
            pod: &self.pod,
            container: &self.container,
            container_id: id,
            pod_ip,
        };
        let mut attempt = Attempt::Error(String::new());
        for _ in 0..MAX_TRIES {
            let prober = &self.shared.prober;
            attempt = prober
                .probe(&self.probe, self.params.timeout, &target)
                .await;
            if !matches!(attempt, Attempt::Error(_)) {
                break;
            }
        }
        attempt
    }

    /// Counts the attempt in `prober_probe_total`.
    fn count(&self, attempt: &Attempt, uid: &str) {
        let counted = match attempt {
            Attempt::Success(_) | Attempt::Warning(_) => "successful",
            Attempt::Failure(_) => "failed",
            Attempt::Error(_) => "unknown",
        };
        let meta = &self.pod.metadata;
        crate::metrics::get()
            .probe_total
            .get_or_create(&crate::metrics::ProbeLabels {
                probe_type: self.kind.label().to_string(),
                result: counted.to_string(),
                container: self.container.name.clone(),
                pod: meta.name.clone().unwrap_or_default(),
                namespace: meta.namespace.clone().unwrap_or_default(),
                pod_uid: uid.to_string(),
            })
            .inc();
    }

    /// The attempt's result, with its event; `None` for an error (it counts for nothing).
    fn report(&self, attempt: Attempt) -> Option<ProbeResult> {
        let label = self.kind.label();
        let name = Some(self.container.name.as_str());
        let say = |reason: Reason, message: String| {
            let events = &self.shared.events;
            events.event(&self.pod, name, EventType::Warning, reason, message)
        };
        match attempt {
            Attempt::Success(_) => Some(ProbeResult::Success),
            Attempt::Warning(out) => {
                let message = format!("{label} probe warning: {out}");
                say(Reason::ContainerProbeWarning, message);
                Some(ProbeResult::Success)
            }
            Attempt::Failure(out) => {
                say(
                    Reason::ContainerUnhealthy,
                    format!("{label} probe failed: {out}"),
                );
                Some(ProbeResult::Failure)
            }
            Attempt::Error(why) => {
                say(
                    Reason::ContainerUnhealthy,
                    format!("{label} probe errored: {why}"),
                );
                None
            }
        }
    }

    /// Counts `result` in its run and publishes it once the run reaches its threshold.
    fn record(&mut self, uid: &str, id: &str, result: ProbeResult) {
        if self.last == Some(result) {
            self.run = self.run.saturating_add(1);
        } else {
            self.last = Some(result);
            self.run = 1;
        }
        let threshold = match result {
            ProbeResult::Failure => self.params.failure_threshold,
            _ => self.params.success_threshold,
        };
        if self.run < threshold {
            return;
        }
        self.shared.results.set(uid, id, self.kind, result);
        if result == ProbeResult::Failure && self.kind != ProbeKind::Readiness {
            // The container is killed; probe again only once it is replaced.
            self.on_hold = true;
            self.run = 0;
        }
    }
}
