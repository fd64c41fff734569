//! The sequences the kubelet itself issues: an init container run to completion before the
//! app container, and a container restarted after it exited (a new attempt beside the old,
//! each with its own log, the old one then removed).

use std::path::Path;

use runtime::cri;

use crate::ctx::{Ctx, parse_log};
use crate::outcome::{OrFail, Step, ensure, ensure_eq};

const RUNNING: i32 = cri::ContainerState::ContainerRunning as i32;

/// The lines of a CRI log file.
fn lines(path: &Path) -> Step<Vec<String>> {
    Ok(parse_log(path)?.into_iter().map(|r| r.3).collect())
}

pub async fn init_container_then_app_container(c: &Ctx<'_>) -> Step {
    let pod = c.pod("withinit").await?;
    let init = c
        .run(&pod, "init", &["sh", "-c", "echo initialised"])
        .await?;
    let done = c.wait_exited(&init).await?;
    ensure_eq!(
        (done.exit_code, done.reason.as_str()),
        (0, "Completed"),
        "the init container's exit"
    );
    let app = c.run(&pod, "app", &["sleep", "600"]).await?;
    let running = c.status(&app).await?;
    ensure_eq!(running.state, RUNNING, "the app container's state");
    ensure!(
        running.started_at >= done.finished_at,
        "the app container started before the init container finished"
    );
    // The exited init container stays, with its status and log, for the pod's status.
    let filter = cri::ContainerFilter {
        pod_sandbox_id: pod.0.clone(),
        ..Default::default()
    };
    let mut want = vec![init.clone(), app.clone()];
    want.sort();
    ensure_eq!(c.containers(filter).await?, want, "the pod's containers");
    let again = c.status(&init).await?;
    ensure_eq!(again.exit_code, 0, "the init container's status, later");
    let log = c.log_dir("withinit").join("init/0.log");
    ensure_eq!(
        lines(&log)?,
        vec!["initialised".to_string()],
        "the init container's log"
    );
    Ok(())
}

pub async fn restart_after_exit(c: &Ctx<'_>) -> Step {
    let pod = c.pod("restarts").await?;
    let first = c
        .run(&pod, "app", &["sh", "-c", "echo first; exit 1"])
        .await?;
    let exited = c.wait_exited(&first).await?;
    ensure_eq!(exited.exit_code, 1, "the first attempt's exit code");
    // The kubelet's restart: the same name, the next attempt, its own log file.
    let mut cfg = c.container_config("app", &["sh", "-c", "echo second; exec sleep 600"]);
    if let Some(m) = cfg.metadata.as_mut() {
        m.attempt = 1;
    }
    cfg.log_path = "app/1.log".into();
    let second = c.run_with(&pod, cfg).await?;
    ensure!(second != first, "the second attempt has the first's id");
    let s = c.status(&second).await?;
    ensure_eq!(s.state, RUNNING, "the second attempt's state");
    ensure_eq!(
        s.metadata.as_ref().map(|m| (m.name.as_str(), m.attempt)),
        Some(("app", 1)),
        "the second attempt's metadata"
    );
    let old = c.status(&first).await?;
    ensure_eq!(
        (old.exit_code, old.metadata.map(|m| m.attempt)),
        (1, Some(0)),
        "the first attempt, still there"
    );
    let dir = c.log_dir("restarts");
    ensure_eq!(
        lines(&dir.join("app/0.log"))?,
        vec!["first".to_string()],
        "attempt 0's log"
    );
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while lines(&dir.join("app/1.log")).unwrap_or_default().is_empty() {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "attempt 1 logged nothing in 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    ensure_eq!(
        lines(&dir.join("app/1.log"))?,
        vec!["second".to_string()],
        "attempt 1's log"
    );
    // The old attempt is garbage: removed, the new one runs on.
    c.remove_container(&first)
        .await?
        .or_fail("RemoveContainer of the first attempt")?;
    let filter = cri::ContainerFilter {
        pod_sandbox_id: pod.0.clone(),
        ..Default::default()
    };
    ensure_eq!(
        c.containers(filter).await?,
        vec![second.clone()],
        "the pod's containers"
    );
    ensure_eq!(
        c.status(&second).await?.state,
        RUNNING,
        "the second attempt's state"
    );
    Ok(())
}
