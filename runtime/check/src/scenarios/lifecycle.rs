//! Containers from start to exit, stopping them, and stopping and removing their pods.

use std::path::Path;
use std::time::{Duration, Instant};

use runtime::{Code, cri};

use crate::ctx::{Ctx, now_ns, parse_log};
use crate::outcome::{OrFail, Step, ensure, ensure_eq};

const EXITED: i32 = cri::ContainerState::ContainerExited as i32;

pub async fn container_lifecycle_logs_and_exit_codes(c: &Ctx<'_>) -> Step {
    let pod = c.pod("life").await?;
    let before = now_ns();
    let script = "echo hello; echo oops >&2; echo world; exit 3";
    let id = c.run(&pod, "c", &["sh", "-c", script]).await?;
    let s = c.wait_exited(&id).await?;
    ensure_eq!(s.id, id, "ContainerStatus's id");
    let name = s.metadata.as_ref().map(|m| m.name.as_str());
    ensure_eq!(name, Some("c"), "ContainerStatus's metadata name");
    ensure_eq!(
        (s.exit_code, s.reason.as_str()),
        (3, "Error"),
        "exit code and reason of `exit 3`"
    );
    ensure!(
        s.created_at >= before - 1_000_000_000 && s.started_at >= s.created_at,
        "created_at and started_at out of order: {s:?}"
    );
    // containerd 1.6 stamps started_at when its own Start call returns but takes finished_at
    // from its shim, so a container that exits at once may finish "before" it started by well
    // under a second: a second of slack.
    ensure!(
        s.finished_at >= s.started_at - 1_000_000_000,
        "finished_at before started_at: {s:?}"
    );
    let image = s.image.as_ref().map(|i| i.image.as_str()).unwrap_or("");
    let tag = c.env.image.repo_tag.as_deref();
    ensure!(
        image == c.image() || Some(image) == tag || image == c.env.image.id,
        "ContainerStatus's image {image:?} is not the test image {}",
        c.image()
    );
    let img = c.image_status(&s.image_ref).await?;
    let img = img.or_fail(format_args!("ImageStatus of the image_ref {}", s.image_ref))?;
    ensure!(
        img.id == c.env.image.id
            && (img.repo_digests.contains(&s.image_ref) || s.image_ref == img.id),
        "image_ref {:?} is neither a repo digest nor the id of {img:?}",
        s.image_ref
    );
    ensure_eq!(
        s.labels.get("container").map(String::as_str),
        Some("c"),
        "ContainerStatus's label"
    );
    let log = c.log_dir("life").join("c/0.log");
    ensure_eq!(
        Path::new(&s.log_path),
        log.as_path(),
        "ContainerStatus's log_path"
    );
    let recs = parse_log(&log)?;
    let lines: Vec<(&str, &str, &str)> = recs
        .iter()
        .map(|(_, s, t, l)| (s.as_str(), t.as_str(), l.as_str()))
        .collect();
    let out: Vec<_> = lines.iter().filter(|r| r.0 == "stdout").collect();
    ensure_eq!(
        out,
        [&("stdout", "F", "hello"), &("stdout", "F", "world")],
        "stdout in the CRI log"
    );
    let err: Vec<_> = lines.iter().filter(|r| r.0 == "stderr").collect();
    ensure_eq!(err, [&("stderr", "F", "oops")], "stderr in the CRI log");
    for (t, ..) in &recs {
        ensure!(
            *t >= s.created_at - 1_000_000_000 && *t <= s.finished_at + 1_000_000_000,
            "log time {t} outside the container's life {}..{}",
            s.created_at,
            s.finished_at
        );
    }

    let ok = c.run(&pod, "ok", &["true"]).await?;
    let s = c.wait_exited(&ok).await?;
    ensure_eq!(
        (s.exit_code, s.reason.as_str()),
        (0, "Completed"),
        "exit code and reason of `true`"
    );
    let two = c.run(&pod, "two", &["sh", "-c", "exit 42"]).await?;
    let s = c.wait_exited(&two).await?;
    ensure_eq!(
        (s.exit_code, s.reason.as_str()),
        (42, "Error"),
        "exit code and reason of `exit 42`"
    );
    Ok(())
}

pub async fn stop_container_grace_period(c: &Ctx<'_>) -> Step {
    let pod = c.pod("stop").await?;
    // Ignores SIGTERM: only SIGKILL ends it.
    let stubborn_cmd = ["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"];
    let stubborn = c.run(&pod, "stubborn", &stubborn_cmd).await?;
    let trap_cmd = "trap 'echo bye; exit 0' TERM; while true; do sleep 0.1; done";
    let trap = c.run(&pod, "trap", &["sh", "-c", trap_cmd]).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    let t0 = Instant::now();
    c.stop_container(&trap, 10)
        .await?
        .or_fail("StopContainer")?;
    let took = t0.elapsed();
    ensure!(
        took < Duration::from_secs(5),
        "StopContainer of a container that exits on SIGTERM took {took:?}"
    );
    let s = c.status(&trap).await?;
    ensure_eq!(
        (s.state, s.exit_code, s.reason.as_str()),
        (EXITED, 0, "Completed"),
        "a container that exited 0 on SIGTERM"
    );
    let recs = parse_log(Path::new(&s.log_path))?;
    ensure!(
        recs.iter().any(|r| r.3 == "bye"),
        "the SIGTERM handler's output is not in the log: {recs:?}"
    );

    let t0 = Instant::now();
    c.stop_container(&stubborn, 2)
        .await?
        .or_fail("StopContainer")?;
    let took = t0.elapsed();
    ensure!(
        took >= Duration::from_millis(1900) && took < Duration::from_secs(10),
        "SIGKILL only after the 2 s grace period, but StopContainer took {took:?}"
    );
    let s = c.status(&stubborn).await?;
    ensure_eq!(
        (s.state, s.exit_code, s.reason.as_str()),
        (EXITED, 137, "Error"),
        "a container killed by SIGKILL"
    );
    c.remove_container(&stubborn)
        .await?
        .or_fail("RemoveContainer")?;
    let err = c.try_status(&stubborn).await?;
    ensure!(
        matches!(&err, Err(e) if e.code() == Code::NotFound),
        "ContainerStatus of a removed container: {err:?}"
    );
    ensure_eq!(
        c.containers(Default::default()).await?,
        vec![trap.clone()],
        "ListContainers after RemoveContainer"
    );
    Ok(())
}

pub async fn stop_and_remove_pod_sandbox(c: &Ctx<'_>) -> Step {
    let pod = c.pod("stop").await?;
    let a = c.run(&pod, "a", &["sleep", "1000"]).await?;
    let b = c.run(&pod, "b", &["sleep", "1000"]).await?;
    c.stop_pod(&pod.0).await?.or_fail("StopPodSandbox")?;
    let st = c.pod_status(&pod.0).await?;
    ensure_eq!(
        st.state,
        cri::PodSandboxState::SandboxNotready as i32,
        "a stopped pod's state"
    );
    for id in [&a, &b] {
        let s = c.status(id).await?;
        ensure_eq!(s.state, EXITED, "a container of a stopped pod");
    }
    let mut both = vec![a.clone(), b.clone()];
    both.sort();
    ensure_eq!(
        c.containers(Default::default()).await?,
        both,
        "ListContainers of a stopped pod"
    );

    // RemovePodSandbox takes its containers with it.
    c.remove_pod(&pod.0).await?.or_fail("RemovePodSandbox")?;
    let r = c.try_pod_status(&pod.0).await?;
    ensure!(
        matches!(&r, Err(e) if e.code() == Code::NotFound),
        "PodSandboxStatus of a removed pod: {r:?}"
    );
    for id in [&a, &b] {
        let r = c.try_status(id).await?;
        ensure!(
            matches!(&r, Err(e) if e.code() == Code::NotFound),
            "ContainerStatus of a removed pod's container: {r:?}"
        );
    }
    ensure_eq!(
        c.containers(Default::default()).await?,
        Vec::<String>::new(),
        "ListContainers after RemovePodSandbox"
    );
    ensure_eq!(
        c.pods(Default::default()).await?,
        Vec::<String>::new(),
        "ListPodSandbox after RemovePodSandbox"
    );
    Ok(())
}

pub async fn out_of_memory(c: &Ctx<'_>) -> Step {
    let pod = c.pod("oom").await?;
    // A string doubled until it outgrows the limit (no swap to spill into).
    let script = "a=x; while true; do a=\"$a$a\"; done";
    let mut cfg = c.container_config("hog", &["sh", "-c", script]);
    cfg.linux = Some(cri::LinuxContainerConfig {
        resources: Some(cri::LinuxContainerResources {
            memory_limit_in_bytes: 32 << 20,
            memory_swap_limit_in_bytes: 32 << 20,
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = c.run_with(&pod, cfg).await?;
    let s = c.wait_exited(&id).await?;
    ensure_eq!(
        (s.exit_code, s.reason.as_str()),
        (137, "OOMKilled"),
        "a container killed for memory"
    );
    // The pod and its other containers carry on.
    let other = c.run(&pod, "other", &["sleep", "600"]).await?;
    let r = c.exec(&other, &["true"]).await?;
    ensure_eq!(r.code, 0, "the pod's other container after the OOM kill");
    Ok(())
}
