//! Listing containers, their stats, ExecSync, errors, programs that cannot run, and resource
//! updates.

use std::time::{Duration, Instant};

use runtime::{Code, cri};

use crate::ctx::{Ctx, state_is};
use crate::outcome::{OrFail, Step, ensure, ensure_eq, fail};

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

pub async fn list_containers_with_filters(c: &Ctx<'_>) -> Step {
    let p1 = c.pod("one").await?;
    let p2 = c.pod("two").await?;
    let done = c.run(&p1, "done", &["true"]).await?;
    c.wait_exited(&done).await?;
    let run1 = c.run(&p1, "run", &["sleep", "600"]).await?;
    let run2 = c.run(&p2, "run", &["sleep", "600"]).await?;
    let created = c.container_config("created", &["true"]);
    let created = c.create(&p2, created).await?.or_fail("CreateContainer")?;

    let all = vec![done.clone(), run1.clone(), run2.clone(), created.clone()];
    ensure_eq!(
        c.containers(Default::default()).await?,
        sorted(all),
        "ListContainers"
    );
    let f = |id: &str| cri::ContainerFilter {
        id: id.into(),
        ..Default::default()
    };
    ensure_eq!(c.containers(f(&run2)).await?, vec![run2.clone()], "by id");
    ensure_eq!(
        c.containers(f(&done[..12.min(done.len())])).await?,
        vec![done.clone()],
        "by id prefix"
    );
    ensure_eq!(
        c.containers(f("0000000000ff")).await?,
        Vec::<String>::new(),
        "by an unknown id"
    );
    let in_pod = |pod: &str| cri::ContainerFilter {
        pod_sandbox_id: pod.into(),
        ..Default::default()
    };
    ensure_eq!(
        c.containers(in_pod(&p1.0)).await?,
        sorted(vec![done.clone(), run1.clone()]),
        "by pod"
    );
    ensure_eq!(
        c.containers(in_pod(&p2.0)).await?,
        sorted(vec![run2.clone(), created.clone()]),
        "by pod"
    );
    let in_state = |s| cri::ContainerFilter {
        state: state_is(s),
        ..Default::default()
    };
    use cri::ContainerState::*;
    ensure_eq!(
        c.containers(in_state(ContainerRunning)).await?,
        sorted(vec![run1.clone(), run2.clone()]),
        "running containers"
    );
    ensure_eq!(
        c.containers(in_state(ContainerExited)).await?,
        vec![done.clone()],
        "exited containers"
    );
    ensure_eq!(
        c.containers(in_state(ContainerCreated)).await?,
        vec![created.clone()],
        "created containers"
    );
    let labelled = |pairs: &[(&str, &str)]| cri::ContainerFilter {
        label_selector: c.selector(pairs),
        ..Default::default()
    };
    ensure_eq!(
        c.containers(labelled(&[("container", "run")])).await?,
        sorted(vec![run1.clone(), run2.clone()]),
        "by label"
    );
    let mut combined = labelled(&[("container", "run")]);
    combined.pod_sandbox_id = p2.0.clone();
    combined.state = state_is(ContainerRunning);
    ensure_eq!(
        c.containers(combined).await?,
        vec![run2.clone()],
        "by label, pod and state"
    );
    let req = cri::ListContainersRequest {
        filter: Some(f(&run1)),
    };
    let listed = c
        .call(
            "ListContainers",
            Duration::ZERO,
            c.rt().list_containers(req),
        )
        .await?
        .or_fail("ListContainers")?
        .containers;
    let one = listed.first().or_fail("ListContainers by id")?;
    let name = one.metadata.as_ref().map(|m| m.name.as_str());
    ensure_eq!(
        (one.pod_sandbox_id.as_str(), one.state, name),
        (p1.0.as_str(), ContainerRunning as i32, Some("run")),
        "a listed container's pod, state and name"
    );
    Ok(())
}

/// Checks the stats of a running container `id` named "run".
fn running_stats(s: &cri::ContainerStats, id: &str) -> Step {
    let attrs = s.attributes.as_ref().or_fail("ContainerStats.attributes")?;
    ensure_eq!(attrs.id, id, "ContainerStats' id");
    let name = attrs.metadata.as_ref().map(|m| m.name.as_str());
    ensure_eq!(name, Some("run"), "ContainerStats' name");
    let cpu = s
        .cpu
        .as_ref()
        .or_fail("ContainerStats.cpu of a running container")?;
    ensure!(cpu.timestamp > 0, "no CPU timestamp: {s:?}");
    ensure!(cpu.usage_core_nano_seconds.is_some(), "no CPU usage: {s:?}");
    let mem = s
        .memory
        .as_ref()
        .or_fail("ContainerStats.memory of a running container")?;
    ensure!(mem.timestamp > 0, "no memory timestamp: {s:?}");
    let ws = mem.working_set_bytes.as_ref().map_or(0, |v| v.value);
    ensure!(ws > 0, "no working set for a running sleep: {s:?}");
    Ok(())
}

pub async fn container_stats(c: &Ctx<'_>) -> Step {
    let p1 = c.pod("one").await?;
    let p2 = c.pod("two").await?;
    let done = c.run(&p1, "done", &["true"]).await?;
    c.wait_exited(&done).await?;
    let run1 = c.run(&p1, "run", &["sleep", "600"]).await?;
    let run2 = c.run(&p2, "run", &["sleep", "600"]).await?;

    let req = cri::ContainerStatsRequest {
        container_id: run1.clone(),
    };
    let one = c
        .call(
            "ContainerStats",
            Duration::ZERO,
            c.rt().container_stats(req),
        )
        .await?
        .or_fail("ContainerStats")?
        .stats
        .or_fail("ContainerStats.stats")?;
    running_stats(&one, &run1)?;
    let list = |filter: cri::ContainerStatsFilter| async {
        let req = cri::ListContainerStatsRequest {
            filter: Some(filter),
        };
        let stats = c
            .call(
                "ListContainerStats",
                Duration::ZERO,
                c.rt().list_container_stats(req),
            )
            .await?
            .or_fail("ListContainerStats")?
            .stats;
        let mut by_id = Vec::new();
        for s in stats {
            let id = s
                .attributes
                .as_ref()
                .or_fail("ContainerStats.attributes")?
                .id
                .clone();
            by_id.push((id, s));
        }
        by_id.sort_by(|x, y| x.0.cmp(&y.0));
        Ok(by_id)
    };
    let stats = list(cri::ContainerStatsFilter {
        id: run2.clone(),
        ..Default::default()
    })
    .await?;
    let ids: Vec<&str> = stats.iter().map(|s| s.0.as_str()).collect();
    ensure_eq!(ids, [run2.as_str()], "ListContainerStats by id");
    running_stats(&stats[0].1, &run2)?;
    let stats = list(cri::ContainerStatsFilter {
        label_selector: c.selector(&[("container", "run")]),
        ..Default::default()
    })
    .await?;
    let ids: Vec<&str> = stats.iter().map(|s| s.0.as_str()).collect();
    ensure_eq!(
        ids,
        sorted(vec![run1.clone(), run2.clone()]),
        "ListContainerStats by label"
    );
    let stats = list(cri::ContainerStatsFilter {
        pod_sandbox_id: p1.0.clone(),
        ..Default::default()
    })
    .await?;
    // A runtime may also answer for a container that is not running (containerd 1.6 does,
    // with its attributes and no usage); the running one must be there with its usage.
    let mut found = false;
    for (id, s) in &stats {
        if *id == run1 {
            running_stats(s, &run1)?;
            found = true;
        } else if *id != done {
            fail!("ListContainerStats by pod answered for {id}, not of that pod");
        }
    }
    ensure!(
        found,
        "ListContainerStats by pod: no stats for its running container"
    );
    Ok(())
}

pub async fn exec_sync(c: &Ctx<'_>) -> Step {
    let pod = c.pod("exec").await?;
    let cmd = ["sh", "-c", "echo from-c > /tmp/mark; exec sleep 600"];
    let id = c.run(&pod, "c", &cmd).await?;
    let script = "echo out; echo err >&2; echo more; exit 4";
    let r = c.exec(&id, &["sh", "-c", script]).await?;
    ensure_eq!(
        (r.out.as_str(), r.err.as_str(), r.code),
        ("out\nmore\n", "err\n", 4),
        "ExecSync's stdout, stderr and exit code"
    );
    // The exec runs in the container: its files and its processes.
    let script = "while [ ! -e /tmp/mark ]; do sleep 0.05; done; cat /tmp/mark; \
                  ps -o args | grep -c '^sleep 600$'";
    let r = c.exec(&id, &["sh", "-c", script]).await?;
    ensure_eq!(
        (r.out.as_str(), r.code),
        ("from-c\n1\n", 0),
        "the container's file and process, seen by an exec"
    );
    let r = c.exec(&id, &["sh", "-c", "exit 0"]).await?;
    ensure_eq!(
        (r.out.as_str(), r.err.as_str(), r.code),
        ("", "", 0),
        "an exec with no output"
    );

    let t0 = Instant::now();
    let r = c.try_exec(&id, &["sleep", "30"], 1).await?;
    match r {
        Err(e) if e.code() == Code::DeadlineExceeded => {}
        other => fail!("ExecSync past its 1 s timeout: want DeadlineExceeded, got {other:?}"),
    }
    let took = t0.elapsed();
    ensure!(
        took < Duration::from_secs(10),
        "an ExecSync with a 1 s timeout took {took:?}"
    );
    let r = c
        .exec(&id, &["sh", "-c", "ps -o args | grep -c '^sleep 30$'"])
        .await?;
    ensure_eq!(r.out, "0\n", "the timed-out exec's process is still there");

    let r = c.try_exec("does-not-exist", &["true"], 5).await?;
    ensure!(
        matches!(&r, Err(e) if e.code() == Code::NotFound),
        "ExecSync in an unknown container: {r:?}"
    );
    Ok(())
}

pub async fn unknown_ids_and_missing_images(c: &Ctx<'_>) -> Step {
    let pod = c.pod("errs").await?;
    let good = c.run(&pod, "good", &["sleep", "600"]).await?;
    let not_found = |what: &str, r: &runtime::Result<()>| -> Step {
        ensure!(
            matches!(r, Err(e) if e.code() == Code::NotFound),
            "{what}: want NotFound, got {r:?}"
        );
        Ok(())
    };

    let r = c.try_status("does-not-exist").await?.map(drop);
    not_found("ContainerStatus of an unknown id", &r)?;
    let r = c.try_pod_status("does-not-exist").await?.map(drop);
    not_found("PodSandboxStatus of an unknown id", &r)?;
    let r = c.try_start("does-not-exist").await?;
    not_found("StartContainer of an unknown id", &r)?;

    let mut missing = c.container_config("missing", &["true"]);
    missing.image = Some(cri::ImageSpec {
        image: "cri-check.invalid/no/such:image".into(),
        ..Default::default()
    });
    let r = c.create(&pod, missing).await?;
    match &r {
        Err(e) if e.code() == Code::NotFound && e.message().contains("no/such:image") => {}
        _ => fail!("CreateContainer of an image not there: want NotFound naming it, got {r:?}"),
    }
    let unknown_pod = ("does-not-exist".to_string(), pod.1.clone());
    let r = c
        .create(&unknown_pod, c.container_config("x", &["true"]))
        .await?;
    not_found("CreateContainer in an unknown pod", &r.map(drop))?;

    // A running container cannot be started again (the code is the runtime's choice).
    let r = c.try_start(&good).await?;
    ensure!(
        r.is_err(),
        "StartContainer of a running container succeeded"
    );

    // Nothing changed: one pod, its one running container.
    let running = cri::ContainerFilter {
        state: state_is(cri::ContainerState::ContainerRunning),
        ..Default::default()
    };
    ensure_eq!(
        c.containers(running).await?,
        vec![good.clone()],
        "running containers after the errors"
    );
    ensure_eq!(
        c.containers(Default::default()).await?,
        vec![good.clone()],
        "containers after the errors"
    );
    ensure_eq!(
        c.pods(Default::default()).await?,
        vec![pod.0.clone()],
        "pods after the errors"
    );
    Ok(())
}

pub async fn programs_that_cannot_be_executed(c: &Ctx<'_>) -> Step {
    let pod = c.pod("noexec").await?;
    let good = c.run(&pod, "good", &["sleep", "600"]).await?;
    for (name, cmd) in [("missing", "/nonexistent"), ("data", "/etc/passwd")] {
        let id = c.container_config(name, &[cmd]);
        let id = c.create(&pod, id).await?.or_fail("CreateContainer")?;
        match c.try_start(&id).await? {
            Err(e) if e.message().contains(cmd) => {}
            Err(e) => fail!("StartContainer of {cmd}: the error does not name it: {e}"),
            Ok(()) => fail!("StartContainer of {cmd} succeeded"),
        }
        let s = c.status(&id).await?;
        ensure_eq!(
            (s.state, s.exit_code, s.reason.as_str()),
            (
                cri::ContainerState::ContainerExited as i32,
                128,
                "StartError"
            ),
            "the status of a container whose program ({cmd}) cannot run"
        );
        ensure!(
            s.message.contains(cmd),
            "its status message does not name {cmd}: {s:?}"
        );
        ensure_eq!(
            s.started_at,
            0,
            "started_at of a container that never started"
        );
        ensure!(s.finished_at > 0, "no finished_at: {s:?}");
        // (A runtime may not have made the file at all.)
        let log = std::fs::read_to_string(&s.log_path).unwrap_or_default();
        ensure!(log.is_empty(), "{name} wrote a log: {log:?}");
        c.remove_container(&id).await?.or_fail("RemoveContainer")?;
    }
    let r = c.exec(&good, &["echo", "still here"]).await?;
    ensure_eq!(
        (r.code, r.out.as_str()),
        (0, "still here\n"),
        "the pod's other container"
    );
    Ok(())
}

/// Whether this machine's cgroups are v2 (cgroup2 mounted at /sys/fs/cgroup).
fn cgroup_v2() -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mounts.lines().any(|l| {
        let mount_point = l.split(' ').nth(4);
        let fstype = l.split(" - ").nth(1).and_then(|r| r.split(' ').next());
        mount_point == Some("/sys/fs/cgroup") && fstype == Some("cgroup2")
    })
}

pub async fn update_container_resources(c: &Ctx<'_>) -> Step {
    let v2 = cgroup_v2();
    let pod = c.pod("res").await?;
    let mut cfg = c.container_config("limited", &["sleep", "600"]);
    cfg.linux = Some(cri::LinuxContainerConfig {
        resources: Some(cri::LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = c.run_with(&pod, cfg).await?;
    let read = if v2 {
        "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max"
    } else {
        "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us \
         /sys/fs/cgroup/cpu/cpu.cfs_period_us /sys/fs/cgroup/cpu/cpu.shares"
    };
    let r = c.exec(&id, &["sh", "-c", read]).await?;
    let want = if v2 {
        "67108864\n50000 100000\n"
    } else {
        "67108864\n50000\n100000\n512\n"
    };
    ensure_eq!(
        (r.out.as_str(), r.code),
        (want, 0),
        "the container's cgroup limits (stderr {:?})",
        r.err
    );

    let req = cri::UpdateContainerResourcesRequest {
        container_id: id.clone(),
        linux: Some(cri::LinuxContainerResources {
            memory_limit_in_bytes: 96 << 20,
            cpu_period: 100_000,
            cpu_quota: 20_000,
            cpu_shares: 256,
            ..Default::default()
        }),
        ..Default::default()
    };
    let update = c.rt().update_container_resources(req);
    c.call("UpdateContainerResources", Duration::ZERO, update)
        .await?
        .or_fail("UpdateContainerResources")?;
    let r = c.exec(&id, &["sh", "-c", read]).await?;
    let want = if v2 {
        "100663296\n20000 100000\n"
    } else {
        "100663296\n20000\n100000\n256\n"
    };
    ensure_eq!(
        (r.out.as_str(), r.code),
        (want, 0),
        "the container's cgroup limits after the update (stderr {:?})",
        r.err
    );
    let s = c.status(&id).await?;
    let res = s.resources.and_then(|r| r.linux);
    let res = res.or_fail("ContainerStatus.resources.linux")?;
    ensure_eq!(
        (res.memory_limit_in_bytes, res.cpu_quota, res.cpu_shares),
        (96 << 20, 20_000, 256),
        "the updated resources in ContainerStatus"
    );
    Ok(())
}
