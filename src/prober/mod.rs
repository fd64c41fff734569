//! Container probes (upstream `pkg/kubelet/prober`): liveness, readiness and startup probes
//! with the exec, HTTP, TCP and gRPC handlers.
//!
//! The [`ProbeManager`] runs one worker task per (pod, container, probe kind), outside the sync
//! loop. A worker reads the container from the status the kubelet last computed (its ID, its
//! state, when it started, the pod IP), runs the probe every `periodSeconds` after a random
//! first delay, counts consecutive results against the thresholds and sets the result of the
//! container in the [`ResultsManager`]. A change of result goes to the sync loop, which syncs the
//! pod: readiness becomes the container's `ready` and the pod's conditions, a startup result its
//! `started`, and a liveness or startup failure makes the sync kill and restart the container
//! ([`crate::pod::compute_pod_actions_with`]). Results belong to a container ID: a restarted
//! container starts over from the kind's initial result.

pub mod http;
mod manager;
mod results;
mod run;
mod target;
mod worker;

#[cfg(test)]
mod worker_tests;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Probe};

pub use manager::{ProbeManager, ProbeView};
pub use results::{ResultsManager, Update};
pub use run::{Attempt, Prober, RuntimeProber, Target, exec, resolve_port};
pub use worker::StatusSource;

/// The kind of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeKind {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeKind {
    pub const ALL: [ProbeKind; 3] = [
        ProbeKind::Liveness,
        ProbeKind::Readiness,
        ProbeKind::Startup,
    ];

    /// As events name it: `Liveness`, `Readiness`, `Startup`.
    pub fn label(self) -> &'static str {
        match self {
            ProbeKind::Liveness => "Liveness",
            ProbeKind::Readiness => "Readiness",
            ProbeKind::Startup => "Startup",
        }
    }

    /// The container's probe of this kind.
    pub fn of(self, c: &Container) -> Option<&Probe> {
        match self {
            ProbeKind::Liveness => c.liveness_probe.as_ref(),
            ProbeKind::Readiness => c.readiness_probe.as_ref(),
            ProbeKind::Startup => c.startup_probe.as_ref(),
        }
    }

    /// The result a container has before its first probe counted: not ready, not yet started,
    /// alive (upstream's initial values).
    pub fn initial(self) -> ProbeResult {
        match self {
            ProbeKind::Liveness => ProbeResult::Success,
            ProbeKind::Readiness => ProbeResult::Failure,
            ProbeKind::Startup => ProbeResult::Unknown,
        }
    }
}

/// A container's probe result, after the thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeResult {
    Unknown,
    Success,
    Failure,
}

/// A probe's timing and thresholds, with the API's defaults for what is unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeParams {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

fn secs(v: Option<i32>, default: u64, min: u64) -> Duration {
    let s = v.and_then(|v| u64::try_from(v).ok()).unwrap_or(default);
    Duration::from_secs(s.max(min))
}

fn count(v: Option<i32>, default: u32) -> u32 {
    v.and_then(|v| u32::try_from(v).ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

impl ProbeParams {
    /// The probe's parameters: `initialDelaySeconds` 0, `periodSeconds` 10, `timeoutSeconds` 1,
    /// `successThreshold` 1, `failureThreshold` 3 when unset, as the API server defaults them.
    pub fn of(p: &Probe) -> ProbeParams {
        ProbeParams {
            initial_delay: secs(p.initial_delay_seconds, 0, 0),
            period: secs(p.period_seconds, 10, 1),
            timeout: secs(p.timeout_seconds, 1, 1),
            success_threshold: count(p.success_threshold, 1),
            failure_threshold: count(p.failure_threshold, 3),
        }
    }
}

/// A probe or hook the API server's validation would refuse: the field and why, as its
/// message says (`spec.containers[0].livenessProbe: must specify a handler type`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidHandler(pub String);

/// Checks a container's probes and hooks as the API server's validation does: one handler per
/// probe, positive periods, timeouts and thresholds, `successThreshold` 1 for liveness and
/// startup probes, a positive probe-level `terminationGracePeriodSeconds`, non-negative hook
/// sleeps; and no probes or hooks on regular init containers (`regular_init`).
pub fn validate_container(
    field: &str,
    c: &Container,
    regular_init: bool,
) -> Result<(), InvalidHandler> {
    for kind in ProbeKind::ALL {
        let Some(p) = kind.of(c) else { continue };
        let f = format!("{field}.{}Probe", kind.label().to_lowercase());
        if regular_init {
            return Err(InvalidHandler(format!(
                "{f}: may not be set for init containers without restartPolicy=Always"
            )));
        }
        let handlers = [
            p.exec.is_some(),
            p.http_get.is_some(),
            p.tcp_socket.is_some(),
            p.grpc.is_some(),
        ];
        match handlers.iter().filter(|h| **h).count() {
            1 => {}
            0 => return Err(InvalidHandler(format!("{f}: must specify a handler type"))),
            _ => {
                return Err(InvalidHandler(format!(
                    "{f}: may not specify more than 1 handler type"
                )));
            }
        }
        for (name, v) in [
            ("initialDelaySeconds", p.initial_delay_seconds),
            ("timeoutSeconds", p.timeout_seconds),
            ("periodSeconds", p.period_seconds),
            ("successThreshold", p.success_threshold),
            ("failureThreshold", p.failure_threshold),
        ] {
            if v.is_some_and(|v| v < 0) {
                return Err(InvalidHandler(format!(
                    "{f}.{name}: must be greater than or equal to 0"
                )));
            }
        }
        if kind != ProbeKind::Readiness && p.success_threshold.is_some_and(|v| v > 1) {
            return Err(InvalidHandler(format!("{f}.successThreshold: must be 1")));
        }
        if let Some(g) = p.termination_grace_period_seconds {
            if kind == ProbeKind::Readiness {
                return Err(InvalidHandler(format!(
                    "{f}.terminationGracePeriodSeconds: must not be set for readinessProbes"
                )));
            }
            if g <= 0 {
                return Err(InvalidHandler(format!(
                    "{f}.terminationGracePeriodSeconds: must be greater than 0"
                )));
            }
        }
        if let Some(e) = &p.exec {
            if e.command.as_ref().is_none_or(|c| c.is_empty()) {
                return Err(InvalidHandler(format!("{f}.exec.command: Required value")));
            }
        }
        if let Some(g) = &p.grpc {
            if !(1..=65535).contains(&g.port) {
                return Err(InvalidHandler(format!(
                    "{f}.grpc.port: must be between 1 and 65535, inclusive"
                )));
            }
        }
    }
    if let Some(l) = &c.lifecycle {
        if regular_init && (l.post_start.is_some() || l.pre_stop.is_some()) {
            return Err(InvalidHandler(format!(
                "{field}.lifecycle: may not be set for init containers without restartPolicy=Always"
            )));
        }
        for (name, h) in [("postStart", &l.post_start), ("preStop", &l.pre_stop)] {
            let Some(h) = h else { continue };
            let f = format!("{field}.lifecycle.{name}");
            let handlers = [
                h.exec.is_some(),
                h.http_get.is_some(),
                h.tcp_socket.is_some(),
                h.sleep.is_some(),
            ];
            match handlers.iter().filter(|h| **h).count() {
                1 => {}
                0 => return Err(InvalidHandler(format!("{f}: must specify a handler type"))),
                _ => {
                    return Err(InvalidHandler(format!(
                        "{f}: may not specify more than 1 handler type"
                    )));
                }
            }
            if let Some(s) = &h.sleep {
                if s.seconds < 0 {
                    return Err(InvalidHandler(format!(
                        "{f}.sleep.seconds: must be greater than or equal to 0"
                    )));
                }
            }
            if let Some(e) = &h.exec {
                if e.command.as_ref().is_none_or(|c| c.is_empty()) {
                    return Err(InvalidHandler(format!("{f}.exec.command: Required value")));
                }
            }
        }
    }
    Ok(())
}

/// `kube-probe/<major>.<minor>`: the User-Agent of HTTP probes and hooks, as upstream.
pub fn user_agent() -> String {
    let v = crate::version::KUBERNETES_VERSION;
    let minor: Vec<&str> = v.split('.').take(2).collect();
    format!("kube-probe/{}", minor.join("."))
}
