//! The node conditions (MemoryPressure, DiskPressure, PIDPressure, Ready), a pure function of
//! a [`Health`] report, the previous conditions and the current time, with upstream's reasons
//! and messages. `lastHeartbeatTime` is always now; `lastTransitionTime` moves only when a
//! condition's status flips (or the condition is new). Conditions of other types (for example
//! `NetworkUnavailable`, written by others) are kept as they are.

use std::time::Duration;

use k8s_openapi::api::core::v1::{NodeCondition, NodeFeatures, NodeRuntimeHandler};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// Upstream's message when the runtime has not answered a status check recently.
pub const RUNTIME_DOWN: &str = "container runtime is down";
/// Upstream's message before the first runtime status check.
pub const RUNTIME_CHECK_PENDING: &str = "container runtime status check may not have completed yet";

/// What the kubelet knows about its own health (and its runtime) when the status is computed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Health {
    /// Why the node is not ready, one message each (e.g. [`RUNTIME_DOWN`],
    /// [`pleg_unhealthy`]); empty: ready.
    pub problems: Vec<String>,
    /// The eviction manager's pressure conditions.
    pub memory_pressure: bool,
    pub disk_pressure: bool,
    pub pid_pressure: bool,
    /// The runtime's handlers for `status.runtimeHandlers` (`None`: not known yet, the Node
    /// keeps what it has).
    pub runtime_handlers: Option<Vec<NodeRuntimeHandler>>,
    /// The runtime's features for `status.features` (`None`: not known yet).
    pub features: Option<NodeFeatures>,
}

impl Health {
    /// A healthy node.
    pub fn ready() -> Health {
        Health::default()
    }

    /// A node that is not ready for these reasons.
    pub fn not_ready<S: Into<String>>(problems: impl IntoIterator<Item = S>) -> Health {
        Health {
            problems: problems.into_iter().map(Into::into).collect(),
            ..Default::default()
        }
    }
}

/// Upstream's PLEG health message: `PLEG is not healthy: pleg was last seen active 3m5s ago;
/// threshold is 3m0s` (durations in Go's notation).
pub fn pleg_unhealthy(last_seen_ago: Duration, threshold: Duration) -> String {
    format!(
        "PLEG is not healthy: pleg was last seen active {} ago; threshold is {}",
        crate::util::go_duration(last_seen_ago),
        crate::util::go_duration(threshold)
    )
}

/// The Ready condition's message for several problems, as upstream's error aggregate prints
/// them: one problem as it is, more as `[a, b]`, duplicates once.
pub fn not_ready_message(problems: &[String]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for p in problems {
        if !seen.contains(&p.as_str()) {
            seen.push(p);
        }
    }
    match seen.as_slice() {
        [one] => one.to_string(),
        many => format!("[{}]", many.join(", ")),
    }
}

/// The conditions after `previous`, for `health` at `now`.
pub fn node_conditions(
    previous: &[NodeCondition],
    health: &Health,
    now: Timestamp,
) -> Vec<NodeCondition> {
    let pressure = |type_: &str, on: bool, yes: (&str, &str), no: (&str, &str)| {
        let (reason, message) = if on { yes } else { no };
        (
            type_.to_string(),
            status_str(on),
            reason.to_string(),
            message.to_string(),
        )
    };
    let ready = if health.problems.is_empty() {
        (
            "Ready".to_string(),
            "True",
            "KubeletReady".to_string(),
            "kubelet is posting ready status".to_string(),
        )
    } else {
        (
            "Ready".to_string(),
            "False",
            "KubeletNotReady".to_string(),
            not_ready_message(&health.problems),
        )
    };
    let wanted = [
        pressure(
            "MemoryPressure",
            health.memory_pressure,
            (
                "KubeletHasInsufficientMemory",
                "kubelet has insufficient memory available",
            ),
            (
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
        ),
        pressure(
            "DiskPressure",
            health.disk_pressure,
            ("KubeletHasDiskPressure", "kubelet has disk pressure"),
            ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ),
        pressure(
            "PIDPressure",
            health.pid_pressure,
            (
                "KubeletHasInsufficientPID",
                "kubelet has insufficient PID available",
            ),
            (
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
        ),
        ready,
    ];
    let mut out = previous.to_vec();
    for (type_, status, reason, message) in wanted {
        let mut cond = NodeCondition {
            type_,
            status: status.to_string(),
            reason: Some(reason),
            message: Some(message),
            last_heartbeat_time: Some(Time(now)),
            last_transition_time: Some(Time(now)),
        };
        match out.iter_mut().find(|c| c.type_ == cond.type_) {
            Some(old) => {
                if old.status == cond.status && old.last_transition_time.is_some() {
                    cond.last_transition_time = old.last_transition_time.clone();
                }
                *old = cond;
            }
            None => out.push(cond),
        }
    }
    out
}

fn status_str(on: bool) -> &'static str {
    if on { "True" } else { "False" }
}

#[cfg(test)]
mod tests;
