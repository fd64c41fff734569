//! Stopping a pod's containers and sandboxes, as upstream's `killContainer` and
//! `killPodWithSyncResult`: the `Killing` events, preStop hooks within the grace period, the
//! order of app containers and sidecars, and the least grace a late container gets.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};
use runtime::{RuntimeService, cri};

use super::actions::{ContainerInfo, RunState, RuntimePodStatus, is_sidecar};
use super::types::StopError;
use crate::api::events::{EventType, PodEvents, Reason};

/// Stops one container within `grace_secs` (upstream `killContainer`): records the `Killing`
/// event (`message`, else "Stopping container x"), runs a running container's preStop hook
/// within the grace period (a failure is a `FailedPreStopHook` event and the stop goes on),
/// then stops it with what is left of the period, at least [`MIN_GRACE_SECS`].
pub(super) async fn stop_one(
    rt: &dyn RuntimeService,
    events: &dyn PodEvents,
    pod: &Pod,
    c: &ContainerInfo,
    grace_secs: i64,
    message: Option<&str>,
    pod_ip: &str,
) -> Result<(), StopError> {
    let killing = message.map_or_else(|| format!("Stopping container {}", c.name), str::to_string);
    events.event(
        pod,
        Some(&c.name),
        EventType::Normal,
        Reason::KillingContainer,
        killing,
    );
    let spec = pod.spec.as_ref().and_then(|s| {
        s.init_containers
            .iter()
            .flatten()
            .chain(s.containers.iter())
            .find(|s| s.name == c.name)
    });
    let pre_stop = spec.and_then(|s| Some((s, s.lifecycle.as_ref()?.pre_stop.as_ref()?)));
    let mut grace = grace_secs;
    if let Some((spec, hook)) = pre_stop.filter(|_| c.state == RunState::Running && grace_secs > 0)
    {
        let began = std::time::Instant::now();
        let limit = Duration::from_secs(grace_secs.unsigned_abs());
        match tokio::time::timeout(limit, super::hooks::run(rt, pod, spec, &c.id, hook, pod_ip))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(_)) => {
                // What the hook printed may hold secrets: neither the event nor the log carries
                // it (upstream records the same words).
                tracing::info!(container = %c.name, "preStop hook failed");
                events.event(
                    pod,
                    Some(&c.name),
                    EventType::Warning,
                    Reason::FailedPreStopHook,
                    "PreStopHook failed".into(),
                );
            }
            Err(_) => {
                tracing::info!(container = %c.name, "preStop hook did not complete within {grace_secs}s");
            }
        }
        let spent = i64::try_from(began.elapsed().as_secs()).unwrap_or(i64::MAX);
        grace = grace_secs.saturating_sub(spent).max(MIN_GRACE_SECS);
    }
    rt.stop_container(cri::StopContainerRequest {
        container_id: c.id.clone(),
        timeout: grace,
    })
    .await
    .map(|_| ())
    .map_err(|source| StopError::Container {
        container: c.name.clone(),
        why: message.map(str::to_string),
        source,
    })
}

/// Stops every running or created container of the pod within one shared grace period of
/// `grace_secs`, then its sandboxes (upstream `killPodWithSyncResult`): the app containers (and
/// regular init containers) all at once, then the sidecars one by one in reverse order, each with
/// what is left of the period (at least 2 s, as upstream). Returns what failed; a failure does not
/// stop the rest.
pub async fn kill_pod(
    rt: &dyn RuntimeService,
    events: &dyn PodEvents,
    pod: &Pod,
    status: &RuntimePodStatus,
    grace_secs: i64,
    pod_ip: &str,
) -> Vec<StopError> {
    let began = std::time::Instant::now();
    let init: &[Container] = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or(&[]);
    let sidecar_rank = |name: &str| init.iter().position(|c| c.name == name && is_sidecar(c));
    let live: Vec<&ContainerInfo> = status
        .containers
        .iter()
        .filter(|c| matches!(c.state, RunState::Running | RunState::Created))
        .collect();
    let (mut sidecars, apps): (Vec<&ContainerInfo>, Vec<&ContainerInfo>) = live
        .into_iter()
        .partition(|c| sidecar_rank(&c.name).is_some());
    let mut errors: Vec<StopError> = futures::future::join_all(
        apps.iter()
            .map(|c| stop_one(rt, events, pod, c, grace_secs, None, pod_ip)),
    )
    .await
    .into_iter()
    .filter_map(|r| r.err())
    .collect();
    sidecars.sort_by_key(|c| std::cmp::Reverse(sidecar_rank(&c.name)));
    for c in sidecars {
        let spent = i64::try_from(began.elapsed().as_secs()).unwrap_or(i64::MAX);
        let left = grace_secs.saturating_sub(spent).max(MIN_GRACE_SECS);
        if let Err(e) = stop_one(rt, events, pod, c, left, None, pod_ip).await {
            errors.push(e);
        }
    }
    for sb in &status.sandboxes {
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: sb.id.clone(),
        };
        if let Err(source) = rt.stop_pod_sandbox(req).await {
            errors.push(StopError::Sandbox {
                sandbox: sb.id.clone(),
                source,
            });
        }
    }
    errors
}

/// The least grace a container stopped late in a pod's termination gets (upstream's
/// `minimumGracePeriodInSeconds`).
pub const MIN_GRACE_SECS: i64 = 2;

impl super::manager::RuntimeManager {
    /// Stops every running or created container of the pod, then its sandboxes (see
    /// [`kill_pod`]): what could not be stopped.
    pub async fn kill_pod(
        &self,
        pod: &Pod,
        status: &RuntimePodStatus,
        grace_secs: i64,
        pod_ip: &str,
    ) -> Vec<StopError> {
        let (rt, events) = (self.rt.as_ref(), self.events.as_ref());
        kill_pod(rt, events, pod, status, grace_secs, pod_ip).await
    }
}
