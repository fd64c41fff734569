//! Container events (`GetContainerEvents`, what an evented PLEG listens to) and the log file's
//! reopening (`ReopenContainerLog`, what log rotation calls).

use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use runtime::cri;

use crate::ctx::{Ctx, Pod, parse_log};
use crate::outcome::{OrFail, Step, ensure, ensure_eq, fail};

const CREATED: i32 = cri::ContainerEventType::ContainerCreatedEvent as i32;
const STARTED: i32 = cri::ContainerEventType::ContainerStartedEvent as i32;
const STOPPED: i32 = cri::ContainerEventType::ContainerStoppedEvent as i32;
const DELETED: i32 = cri::ContainerEventType::ContainerDeletedEvent as i32;

/// A pod's container created, started, stopped and removed with an event stream open: the
/// pod, the container's id and its events, in order (other containers' are passed over).
async fn lifecycle_events(
    c: &Ctx<'_>,
    name: &str,
) -> Step<(Pod, String, Vec<cri::ContainerEventResponse>)> {
    let mut stream = c
        .call(
            "GetContainerEvents",
            Duration::ZERO,
            c.rt().get_container_events(cri::GetEventsRequest {}),
        )
        .await?
        .or_fail("GetContainerEvents")?;
    let pod = c.pod(name).await?;
    let id = c.run(&pod, "c", &["sleep", "600"]).await?;
    c.stop_container(&id, 0).await?.or_fail("StopContainer")?;
    c.remove_container(&id).await?.or_fail("RemoveContainer")?;
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !events
        .iter()
        .any(|e: &cri::ContainerEventResponse| e.container_event_type == DELETED)
    {
        let seen: Vec<i32> = events.iter().map(|e| e.container_event_type).collect();
        let event = match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => fail!("events seen for the container within 20 s: {seen:?} (no deletion)"),
            Ok(None) => fail!("the event stream ended; seen: {seen:?}"),
            Ok(Some(e)) => e.or_fail("an event")?,
        };
        if event.container_id == id {
            events.push(event);
        }
    }
    Ok((pod, id, events))
}

pub async fn container_events(c: &Ctx<'_>) -> Step {
    let (pod, _, events) = lifecycle_events(c, "events").await?;
    let kinds: Vec<i32> = events.iter().map(|e| e.container_event_type).collect();
    ensure_eq!(
        kinds,
        vec![CREATED, STARTED, STOPPED, DELETED],
        "the container's events (created, started, stopped, deleted)"
    );
    let mut last = 0;
    for e in &events {
        ensure!(
            e.created_at > 0 && e.created_at >= last,
            "events' times out of order: {events:?}"
        );
        last = e.created_at;
        ensure!(
            e.pod_sandbox_status.as_ref().is_some_and(|p| p.id == pod.0),
            "event {} without its pod's status",
            e.container_event_type
        );
    }
    Ok(())
}

pub async fn container_events_carry_statuses(c: &Ctx<'_>) -> Step {
    let (_, id, events) = lifecycle_events(c, "eventstatus").await?;
    // What an evented PLEG updates its cache from without reading the pod again: the
    // container's status as of the event (gone once it is deleted).
    let want = [
        (CREATED, cri::ContainerState::ContainerCreated),
        (STARTED, cri::ContainerState::ContainerRunning),
        (STOPPED, cri::ContainerState::ContainerExited),
    ];
    for (kind, state) in want {
        let event = events.iter().find(|e| e.container_event_type == kind);
        let status = event.and_then(|e| e.containers_statuses.iter().find(|s| s.id == id));
        let Some(status) = status else {
            fail!("event {kind} does not carry the container's status");
        };
        ensure_eq!(
            status.state,
            state as i32,
            "the container's state in event {kind}"
        );
    }
    Ok(())
}

pub async fn reopen_container_log(c: &Ctx<'_>) -> Step {
    let pod = c.pod("reopen").await?;
    let script = "i=0; while true; do echo line $i; i=$((i+1)); sleep 0.1; done";
    let id = c.run(&pod, "c", &["sh", "-c", script]).await?;
    let log = c.log_dir("reopen").join("c/0.log");
    wait_for_lines(&log, 3).await?;
    // Rotated as the kubelet does: the file renamed, then the runtime told to reopen it.
    let rotated = log.with_extension("log.1");
    std::fs::rename(&log, &rotated)
        .map_err(|e| crate::outcome::Stop::Fail(format!("renaming {}: {e}", log.display())))?;
    let req = cri::ReopenContainerLogRequest {
        container_id: id.clone(),
    };
    c.call(
        "ReopenContainerLog",
        Duration::ZERO,
        c.rt().reopen_container_log(req),
    )
    .await?
    .or_fail("ReopenContainerLog")?;
    wait_for_lines(&log, 3).await?;
    let old = parse_log(&rotated)?;
    let new = parse_log(&log)?;
    let (Some(last_old), Some(first_new)) = (old.last(), new.first()) else {
        fail!("no lines in the rotated or the new log");
    };
    ensure!(
        first_new.0 >= last_old.0,
        "the new log starts before the old one ends: {last_old:?} then {first_new:?}"
    );
    let n = |line: &str| line.trim_start_matches("line ").parse::<u64>().ok();
    ensure!(
        matches!((n(&last_old.3), n(&first_new.3)), (Some(a), Some(b)) if b > a),
        "the lines go on in the new file: {last_old:?} then {first_new:?}"
    );
    // A stopped container's log cannot be reopened.
    c.stop_container(&id, 0).await?.or_fail("StopContainer")?;
    let req = cri::ReopenContainerLogRequest {
        container_id: id.clone(),
    };
    let r = c
        .call(
            "ReopenContainerLog",
            Duration::ZERO,
            c.rt().reopen_container_log(req),
        )
        .await?;
    ensure!(
        r.is_err(),
        "ReopenContainerLog of a stopped container succeeded"
    );
    Ok(())
}

/// Waits (10 s at most) until `path` holds `n` whole lines.
async fn wait_for_lines(path: &Path, n: usize) -> Step {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.lines().count() >= n && text.ends_with('\n') {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{} holds {} lines after 10 s",
            path.display(),
            text.lines().count()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
