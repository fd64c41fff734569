//! The pod's view a runtime event carries (upstream's evented PLEG builds the pod status from
//! it): a container event with the status of its sandbox and of every container of that
//! sandbox, as the built-in runtime and containerd 1.7+ send them, updates the pod cache
//! without another read of the pod.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use runtime::cri;
use tokio::time::Instant;

use crate::model::RuntimePodStatus;
use crate::pod::sync::RuntimeSnapshot;
use crate::pod::termination;

/// The view of the pod event `ev` carries, when it carries a whole one: a container event
/// (not a deletion, which names a container no status can show any more) whose statuses
/// include that container's, for a pod whose only sandbox, as last seen (`cached`), is the
/// event's. `None` otherwise: the pod is read instead. A sandbox's own events are never
/// taken as whole (a runtime may send them without the containers' statuses, and a view
/// without containers would have the sync make them again).
pub fn of_event(
    ev: &cri::ContainerEventResponse,
    cached: Option<&RuntimeSnapshot>,
) -> Option<RuntimeSnapshot> {
    if ev.container_event_type == cri::ContainerEventType::ContainerDeletedEvent as i32 {
        return None;
    }
    let sandbox = ev.pod_sandbox_status.as_ref()?;
    if sandbox.id == ev.container_id
        || !ev
            .containers_statuses
            .iter()
            .any(|c| c.id == ev.container_id)
    {
        return None;
    }
    let only_this_sandbox =
        cached.is_some_and(|v| v.sandboxes.len() == 1 && v.sandboxes[0].id == sandbox.id);
    if !only_this_sandbox {
        return None;
    }
    let sandboxes = vec![sandbox.clone()];
    let mut containers = ev.containers_statuses.clone();
    // Exited containers: what they left in their termination message file (or log).
    termination::fill_messages(&mut containers);
    Some(RuntimeSnapshot {
        status: RuntimePodStatus::from_cri(&sandboxes, &containers),
        sandboxes,
        containers,
    })
}

/// When the runtime took the statuses event `ev` carries, on the cache's clock: its
/// `created_at` (wall-clock nanoseconds) as long ago from now, never after now.
pub fn taken_at(ev: &cri::ContainerEventResponse) -> Instant {
    let now = Instant::now();
    let wall = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let created = Duration::from_nanos(u64::try_from(ev.created_at).unwrap_or(0));
    let ago = wall.saturating_sub(created);
    now.checked_sub(ago).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(id: &str) -> cri::PodSandboxStatus {
        cri::PodSandboxStatus {
            id: id.to_string(),
            state: cri::PodSandboxState::SandboxReady as i32,
            ..Default::default()
        }
    }

    fn container(id: &str, state: cri::ContainerState) -> cri::ContainerStatus {
        cri::ContainerStatus {
            id: id.to_string(),
            state: state as i32,
            metadata: Some(cri::ContainerMetadata {
                name: format!("name-{id}"),
                attempt: 0,
            }),
            ..Default::default()
        }
    }

    fn cached(sandboxes: &[&str]) -> RuntimeSnapshot {
        let sandboxes: Vec<_> = sandboxes.iter().map(|s| sandbox(s)).collect();
        RuntimeSnapshot {
            status: RuntimePodStatus::from_cri(&sandboxes, &[]),
            sandboxes,
            containers: Vec::new(),
        }
    }

    fn event(kind: cri::ContainerEventType, id: &str) -> cri::ContainerEventResponse {
        cri::ContainerEventResponse {
            container_id: id.to_string(),
            container_event_type: kind as i32,
            created_at: 0,
            pod_sandbox_status: Some(sandbox("sb")),
            containers_statuses: vec![
                container("c1", cri::ContainerState::ContainerRunning),
                container("c2", cri::ContainerState::ContainerExited),
            ],
        }
    }

    #[test]
    fn a_whole_container_event_is_the_pods_view() {
        let ev = event(cri::ContainerEventType::ContainerStartedEvent, "c1");
        let view = of_event(&ev, Some(&cached(&["sb"]))).expect("a view");
        assert_eq!(view.sandboxes.len(), 1);
        assert_eq!(view.sandboxes[0].id, "sb");
        let ids: Vec<_> = view.containers.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["c1", "c2"]);
        assert_eq!(view.status.containers.len(), 2);
    }

    #[test]
    fn partial_or_unsafe_events_are_not_views() {
        let one = cached(&["sb"]);
        // The event's container is not among the statuses.
        let ev = event(cri::ContainerEventType::ContainerStartedEvent, "c3");
        assert!(of_event(&ev, Some(&one)).is_none());
        // No statuses at all (a runtime that sends none).
        let mut ev = event(cri::ContainerEventType::ContainerStartedEvent, "c1");
        ev.containers_statuses.clear();
        assert!(of_event(&ev, Some(&one)).is_none());
        // A deletion, and a sandbox's own event.
        let ev = event(cri::ContainerEventType::ContainerDeletedEvent, "c1");
        assert!(of_event(&ev, Some(&one)).is_none());
        let ev = event(cri::ContainerEventType::ContainerStoppedEvent, "sb");
        assert!(of_event(&ev, Some(&one)).is_none());
        // The pod was never seen, or has another sandbox too, or only another one.
        let ev = event(cri::ContainerEventType::ContainerStartedEvent, "c1");
        assert!(of_event(&ev, None).is_none());
        assert!(of_event(&ev, Some(&cached(&["sb", "old"]))).is_none());
        assert!(of_event(&ev, Some(&cached(&["new"]))).is_none());
        // No sandbox status.
        let mut ev = event(cri::ContainerEventType::ContainerStartedEvent, "c1");
        ev.pod_sandbox_status = None;
        assert!(of_event(&ev, Some(&one)).is_none());
    }

    #[test]
    fn an_events_time_is_when_the_runtime_took_it() {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let mut ev = event(cri::ContainerEventType::ContainerStartedEvent, "c1");
        ev.created_at = i64::try_from((wall - Duration::from_millis(200)).as_nanos()).unwrap();
        let ago = Instant::now().saturating_duration_since(taken_at(&ev));
        assert!(
            ago >= Duration::from_millis(200) && ago < Duration::from_secs(5),
            "{ago:?}"
        );
        // A time in the future is now.
        ev.created_at = i64::try_from((wall + Duration::from_secs(60)).as_nanos()).unwrap();
        assert!(Instant::now().saturating_duration_since(taken_at(&ev)) < Duration::from_secs(1));
    }
}
