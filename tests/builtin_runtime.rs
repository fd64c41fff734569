//! The built-in runtime end to end, as root: every CRI RPC driven through the `RuntimeService`
//! and `ImageService` traits against real containers, sandbox processes started from the real
//! nodelet binary.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use runtime::builtin::BuiltinRuntime;
use runtime::{Code, ImageService, RuntimeService, cri};

#[tokio::test(flavor = "multi_thread")]
async fn container_lifecycle_logs_and_exit_codes() {
    if !root_or_skip("container_lifecycle_logs_and_exit_codes") {
        return;
    }
    let node = Node::new("life").await;
    let v = node
        .rt
        .version(cri::VersionRequest::default())
        .await
        .unwrap();
    assert_eq!(
        (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
        ("nodelet", "v1")
    );
    let sb = node.sandbox("life").await;
    let st = node
        .rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sb.0.clone(),
            verbose: true,
        })
        .await
        .unwrap();
    assert_eq!(
        st.status.as_ref().unwrap().state,
        cri::PodSandboxState::SandboxReady as i32
    );
    assert!(st.info.contains_key("info"));

    let id = node
        .container(&sb, "c", &["sh", "-c", "echo hello; echo oops >&2; exit 3"])
        .await;
    let s = node.wait_exited(&id).await;
    assert_eq!(s.exit_code, 3);
    assert_eq!(s.reason, "Error");
    assert!(s.started_at > 0 && s.finished_at >= s.started_at);
    assert_eq!(s.image.as_ref().unwrap().image, BUSYBOX);
    assert!(s.image_id.starts_with("sha256:"));
    let recs = log_records(std::path::Path::new(&s.log_path));
    assert!(
        recs.contains(&("stdout".into(), "F".into(), "hello".into())),
        "{recs:?}"
    );
    assert!(
        recs.contains(&("stderr".into(), "F".into(), "oops".into())),
        "{recs:?}"
    );

    let ok = node.container(&sb, "ok", &["true"]).await;
    let s = node.wait_exited(&ok).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (0, "Completed"));

    // List with filters.
    let all = node
        .rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap();
    assert_eq!(all.containers.len(), 2);
    let by_label = node
        .rt
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: [("container".to_string(), "ok".to_string())].into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    assert_eq!(by_label.containers.len(), 1);
    assert_eq!(by_label.containers[0].id, ok);
    let by_prefix = node
        .rt
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                id: ok[..12].to_string(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    assert_eq!(by_prefix.containers.len(), 1);
    let running = node
        .rt
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                state: Some(cri::ContainerStateValue {
                    state: cri::ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    assert!(running.containers.is_empty());

    // Stop and remove are idempotent.
    for _ in 0..2 {
        node.rt
            .stop_container(cri::StopContainerRequest {
                container_id: id.clone(),
                timeout: 1,
            })
            .await
            .unwrap();
        node.rt
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.clone(),
            })
            .await
            .unwrap();
    }
    let err = node
        .rt
        .container_status(cri::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    for _ in 0..2 {
        node.rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: sb.0.clone(),
            })
            .await
            .unwrap();
    }
    let st = node
        .rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sb.0.clone(),
            verbose: false,
        })
        .await
        .unwrap();
    assert_eq!(
        st.status.unwrap().state,
        cri::PodSandboxState::SandboxNotready as i32
    );
    // A stopped sandbox still reports its containers' last state.
    let s = node.status(&ok).await;
    assert_eq!(s.state, cri::ContainerState::ContainerExited as i32);
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn graceful_stop_then_sigkill() {
    if !root_or_skip("graceful_stop_then_sigkill") {
        return;
    }
    let node = Node::new("stop").await;
    let sb = node.sandbox("stop").await;
    let trap = node
        .container(
            &sb,
            "trap",
            &[
                "sh",
                "-c",
                "trap 'echo bye; exit 0' TERM; while true; do sleep 0.1; done",
            ],
        )
        .await;
    let stubborn = node.container(&sb, "stubborn", &["sleep", "1000"]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    node.rt
        .stop_container(cri::StopContainerRequest {
            container_id: trap.clone(),
            timeout: 10,
        })
        .await
        .unwrap();
    let s = node.status(&trap).await;
    assert_eq!(
        (s.state, s.exit_code),
        (cri::ContainerState::ContainerExited as i32, 0)
    );
    let recs = log_records(std::path::Path::new(&s.log_path));
    assert!(
        recs.iter().any(|r| r.2 == "bye"),
        "the TERM handler ran: {recs:?}"
    );
    let t0 = std::time::Instant::now();
    node.rt
        .stop_container(cri::StopContainerRequest {
            container_id: stubborn.clone(),
            timeout: 1,
        })
        .await
        .unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(900),
        "SIGKILL only after the grace period"
    );
    let s = node.status(&stubborn).await;
    assert_eq!(s.exit_code, 137);

    // Stopped right after starting, as the init of its own PID namespace: the kernel drops
    // SIGTERM until the shell has installed its trap, so the runtime repeats it; the container
    // ends through its handler, not through SIGKILL at the end of the grace period.
    let mut early = container_config(
        "early",
        &[
            "sh",
            "-c",
            "trap 'echo bye; exit 0' TERM; while true; do sleep 0.1; done",
        ],
    );
    early.linux = Some(cri::LinuxContainerConfig {
        security_context: Some(cri::LinuxContainerSecurityContext {
            namespace_options: Some(cri::NamespaceOption {
                pid: cri::NamespaceMode::Container as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let early = node.container_with(&sb, early).await;
    node.rt
        .stop_container(cri::StopContainerRequest {
            container_id: early.clone(),
            timeout: 60,
        })
        .await
        .unwrap();
    let s = node.status(&early).await;
    assert_eq!(s.exit_code, 0, "ended by its TERM handler, not killed");

    // A container's own stop signal (the kubelet's lifecycle.stopSignal) comes first; one that
    // names no signal is refused.
    let mut own = container_config(
        "own",
        &[
            "sh",
            "-c",
            "trap 'echo usr1; exit 0' USR1; trap 'echo term; exit 1' TERM; while true; do sleep 0.1; done",
        ],
    );
    own.annotations.insert(
        runtime::builtin::ANNOTATION_STOP_SIGNAL.into(),
        "SIGUSR1".into(),
    );
    let own = node.container_with(&sb, own).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    node.rt
        .stop_container(cri::StopContainerRequest {
            container_id: own.clone(),
            timeout: 10,
        })
        .await
        .unwrap();
    let s = node.status(&own).await;
    assert_eq!(s.exit_code, 0, "ended by its USR1 handler");
    let recs = log_records(std::path::Path::new(&s.log_path));
    assert!(recs.iter().any(|r| r.2 == "usr1"), "{recs:?}");
    let mut bad = container_config("bad", &["sleep", "1"]);
    bad.annotations.insert(
        runtime::builtin::ANNOTATION_STOP_SIGNAL.into(),
        "SIGNOPE".into(),
    );
    let err = node
        .rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb.0.clone(),
            config: Some(bad),
            sandbox_config: Some(sb.1.clone()),
        })
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("is not a signal"), "{err}");
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cgroup_limits_oom_stats_and_updates() {
    if !root_or_skip("cgroup_limits_oom_stats_and_updates") {
        return;
    }
    let node = Node::new("cg").await;
    let sb = node.sandbox("cg").await;
    let mut cfg = container_config("limited", &["sleep", "600"]);
    cfg.linux = Some(cri::LinuxContainerConfig {
        resources: Some(cri::LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            cpu_shares: 512,
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = node.container_with(&sb, cfg).await;
    let r = node
        .exec(
            &id,
            &[
                "sh",
                "-c",
                "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.shares",
            ],
        )
        .await;
    assert_eq!(
        String::from_utf8_lossy(&r.stdout),
        "67108864\n512\n",
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );

    node.rt
        .update_container_resources(cri::UpdateContainerResourcesRequest {
            container_id: id.clone(),
            linux: Some(cri::LinuxContainerResources {
                memory_limit_in_bytes: 96 << 20,
                cpu_shares: 512,
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let r = node
        .exec(&id, &["cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"])
        .await;
    assert_eq!(String::from_utf8_lossy(&r.stdout), "100663296\n");

    let stats = node
        .rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
    let stats = stats.stats.unwrap();
    let mem = stats.memory.unwrap();
    assert!(mem.usage_bytes.unwrap().value > 0);
    // The writable layer: what the container wrote, measured (1 MiB written now).
    let layer = |s: &cri::ContainerStats| {
        let w = s.writable_layer.clone().unwrap();
        (w.used_bytes.unwrap().value, w.inodes_used.unwrap().value)
    };
    let (before, _) = layer(&stats);
    node.exec(&id, &["sh", "-c", "head -c 1048576 /dev/zero > /big"])
        .await;
    let after = node
        .rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap()
        .stats
        .unwrap();
    let (bytes, inodes) = layer(&after);
    assert!(
        bytes >= before + 1_048_576 && inodes >= 2,
        "{before} -> {bytes} bytes, {inodes} inodes"
    );
    let list = node
        .rt
        .list_container_stats(cri::ListContainerStatsRequest { filter: None })
        .await
        .unwrap();
    assert_eq!(list.stats.len(), 1);
    let pod = node
        .rt
        .pod_sandbox_stats(cri::PodSandboxStatsRequest {
            pod_sandbox_id: sb.0.clone(),
        })
        .await
        .unwrap();
    let linux = pod.stats.unwrap().linux.unwrap();
    assert!(
        linux.process.unwrap().process_count.unwrap().value >= 2,
        "sandbox process and sleep"
    );
    // The pod's network namespace: its eth0, loopback left out.
    let net = linux.network.expect("network stats");
    assert_eq!(
        net.default_interface.as_ref().map(|i| i.name.as_str()),
        Some("eth0")
    );
    assert!(net.interfaces.iter().all(|i| i.name != "lo"), "{net:?}");

    let mut oom = container_config("oom", &["sh", "-c", "x=a; while true; do x=$x$x; done"]);
    oom.linux = Some(cri::LinuxContainerConfig {
        resources: Some(cri::LinuxContainerResources {
            memory_limit_in_bytes: 16 << 20,
            ..Default::default()
        }),
        ..Default::default()
    });
    let oom = node.container_with(&sb, oom).await;
    let s = node.wait_exited(&oom).await;
    assert_eq!((s.reason.as_str(), s.exit_code), ("OOMKilled", 137));
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_namespaces_exec_and_files() {
    if !root_or_skip("pod_namespaces_exec_and_files") {
        return;
    }
    let node = Node::new("ns").await;
    let sb = node.sandbox("nspod").await;
    let a = node.container(&sb, "a", &["sleep", "600"]).await;
    let b = node.container(&sb, "b", &["sleep", "600"]).await;
    let probe = "readlink /proc/self/ns/net; readlink /proc/self/ns/ipc; readlink /proc/self/ns/uts; hostname";
    let (ra, rb) = (
        node.exec(&a, &["sh", "-c", probe]).await,
        node.exec(&b, &["sh", "-c", probe]).await,
    );
    assert_eq!(ra.stdout, rb.stdout, "one pod, one set of namespaces");
    let text = String::from_utf8_lossy(&ra.stdout).into_owned();
    assert!(
        text.starts_with("net:[") && text.contains("\nipc:[") && text.contains("\nuts:["),
        "the probe read the namespaces: {text}"
    );
    assert!(String::from_utf8_lossy(&ra.stdout).ends_with("nspod\n"));
    let r = node
        .exec(
            &a,
            &[
                "sh",
                "-c",
                "grep -c localhost /etc/hosts; cat /etc/hostname; echo $$",
            ],
        )
        .await;
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(
        out.starts_with("2\nnspod\n") || out.starts_with("1\nnspod\n"),
        "{out}"
    );
    let r = node.exec(&a, &["sh", "-c", "exit 9"]).await;
    assert_eq!(r.exit_code, 9);
    let err = node
        .rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: a.clone(),
            cmd: vec!["sleep".into(), "10".into()],
            timeout: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded);
    // A second pod has its own network namespace.
    let other = node.sandbox("other").await;
    let c = node.container(&other, "c", &["sleep", "600"]).await;
    let rc = node.exec(&c, &["readlink", "/proc/self/ns/net"]).await;
    assert!(
        !String::from_utf8_lossy(&ra.stdout).contains(String::from_utf8_lossy(&rc.stdout).trim())
    );
    node.teardown().await;
}

/// The v1 controller lines of a `/proc/<pid>/cgroup` text (`controllers:path`), without named
/// hierarchies and the unified one.
fn controller_lines(text: &str) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .filter_map(|l| l.split_once(':').map(|(_, rest)| rest))
        .filter(|rest| !rest.starts_with(':') && !rest.starts_with("name="))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

/// The sandbox process moves itself into its cgroup and an exec's child into its container's
/// (on cgroup v1 through each hierarchy's `tasks`, which skips the kernel's grace-period wait):
/// both end up in every controller's cgroup, cpuset included, as a move of the whole process
/// would put them.
#[tokio::test(flavor = "multi_thread")]
async fn sandbox_and_exec_processes_are_in_their_cgroups_in_every_controller() {
    if !root_or_skip("sandbox_and_exec_processes_are_in_their_cgroups_in_every_controller") {
        return;
    }
    let node = Node::new("cgjoin").await;
    let sb = node.sandbox("cgjoin").await;
    let a = node.container(&sb, "a", &["sleep", "600"]).await;
    let sandbox = sandbox_pid(&node.rt, &sb.0).await;
    let own = std::fs::read_to_string(format!("/proc/{sandbox}/cgroup")).expect("its cgroups");
    let lines = controller_lines(&own);
    assert!(
        lines.iter().any(|l| l
            .split(':')
            .next()
            .is_some_and(|c| c.split(',').any(|c| c == "cpuset"))),
        "cpuset is among the sandbox's controllers: {own}"
    );
    for l in &lines {
        assert!(
            l.ends_with("/sandbox") && l.contains(node.cgroup_root.as_str()),
            "the sandbox process is in its pod's sandbox cgroup in every controller: {own}"
        );
    }
    let r = node
        .exec(
            &a,
            &[
                "sh",
                "-c",
                "cat /proc/self/cgroup; echo ---; cat /proc/1/cgroup",
            ],
        )
        .await;
    let out = String::from_utf8_lossy(&r.stdout).into_owned();
    let (exec, init) = out.split_once("---\n").expect("both cgroup files");
    assert_eq!(r.exit_code, 0, "{out}");
    assert_eq!(
        controller_lines(exec),
        controller_lines(init),
        "the exec is in its container's cgroups in every controller"
    );
    assert_ne!(
        controller_lines(exec),
        lines,
        "the container's cgroups are not the sandbox's"
    );
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_input_is_rejected_and_changes_nothing() {
    if !root_or_skip("bad_input_is_rejected_and_changes_nothing") {
        return;
    }
    let node = Node::new("bad").await;
    let sb = node.sandbox("bad").await;
    let good = node.container(&sb, "good", &["sleep", "600"]).await;

    let err = node
        .rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: None,
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = node
        .rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sb.1.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    let mut missing = container_config("missing", &["true"]);
    missing.image = Some(cri::ImageSpec {
        image: "no/such:image".into(),
        ..Default::default()
    });
    let err = node
        .rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb.0.clone(),
            config: Some(missing),
            sandbox_config: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err}");
    let mut escape = container_config("escape", &["true"]);
    escape.log_path = "../../../etc/evil".into();
    let err = node
        .rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb.0.clone(),
            config: Some(escape),
            sandbox_config: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
    let err = node
        .rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: "nope".into(),
            config: Some(container_config("x", &["true"])),
            sandbox_config: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = node
        .rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb.0.clone(),
            config: Some(cri::ContainerConfig::default()),
            sandbox_config: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = node
        .rt
        .start_container(cri::StartContainerRequest {
            container_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    let err = node
        .rt
        .start_container(cri::StartContainerRequest {
            container_id: good.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Code::FailedPrecondition,
        "starting a running container: {err}"
    );
    node.rt
        .stop_container(cri::StopContainerRequest {
            container_id: "nope".into(),
            timeout: 0,
        })
        .await
        .unwrap();
    node.rt
        .remove_container(cri::RemoveContainerRequest {
            container_id: "nope".into(),
        })
        .await
        .unwrap();
    node.rt
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: "nope".into(),
        })
        .await
        .unwrap();
    node.rt
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: "nope".into(),
        })
        .await
        .unwrap();
    let err = node
        .rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: "nope".into(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);

    // Nothing else changed: one sandbox, one running container, no stray rootfs.
    let list = node
        .rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .unwrap();
    assert_eq!(list.containers.len(), 1);
    assert_eq!(
        list.containers[0].state,
        cri::ContainerState::ContainerRunning as i32
    );
    assert_eq!(
        node.rt.image_store().rootfs_keys().unwrap(),
        vec![good.clone()]
    );
    let sbs = node
        .rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .unwrap();
    assert_eq!(sbs.items.len(), 1);
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn images_through_the_image_service() {
    if !root_or_skip("images_through_the_image_service") {
        return;
    }
    let node = Node::new("img").await;
    let list = node
        .rt
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap();
    assert_eq!(list.images.len(), 1);
    assert!(list.images[0].repo_tags.contains(&BUSYBOX.to_string()));
    let spec = |s: &str| {
        Some(cri::ImageSpec {
            image: s.into(),
            ..Default::default()
        })
    };
    let st = node
        .rt
        .image_status(cri::ImageStatusRequest {
            image: spec("busybox"),
            verbose: true,
        })
        .await
        .unwrap();
    let img = st.image.expect("short name resolves like containerd");
    assert_eq!(img.uid.map(|u| u.value), Some(0));
    let none = node
        .rt
        .image_status(cri::ImageStatusRequest {
            image: spec("nothere"),
            verbose: false,
        })
        .await
        .unwrap();
    assert!(none.image.is_none());
    let fs = node
        .rt
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .unwrap();
    assert!(fs.image_filesystems[0].used_bytes.as_ref().unwrap().value > 0);

    // Refused while a container uses it; removed with all tags once none does.
    let sb = node.sandbox("img").await;
    let c = node.container(&sb, "c", &["sleep", "600"]).await;
    let err = node
        .rt
        .remove_image(cri::RemoveImageRequest {
            image: spec(BUSYBOX),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    node.rt
        .remove_container(cri::RemoveContainerRequest { container_id: c })
        .await
        .unwrap();
    node.rt
        .remove_image(cri::RemoveImageRequest {
            image: spec(&img.id),
        })
        .await
        .unwrap();
    let list = node
        .rt
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .unwrap();
    assert!(list.images.is_empty());
    node.rt
        .remove_image(cri::RemoveImageRequest {
            image: spec(&img.id),
        })
        .await
        .unwrap();
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn container_events_are_streamed() {
    if !root_or_skip("container_events_are_streamed") {
        return;
    }
    use futures::StreamExt;
    let node = Node::new("ev").await;
    let mut events = node
        .rt
        .get_container_events(cri::GetEventsRequest {})
        .await
        .unwrap();
    let sb = node.sandbox("ev").await;
    let id = node.container(&sb, "c", &["true"]).await;
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !seen.contains(&(
        id.clone(),
        cri::ContainerEventType::ContainerStoppedEvent as i32,
    )) {
        let ev = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("event in time")
            .expect("stream open")
            .unwrap();
        // Each names its pod by its sandbox's status, as containerd's do (upstream's evented
        // PLEG reads the pod's UID from it): the sandbox's own events too.
        let status = ev
            .pod_sandbox_status
            .as_ref()
            .expect("the sandbox's status");
        assert_eq!(status.id, sb.0);
        assert_eq!(status.metadata, sb.1.metadata);
        assert_eq!(status.labels, sb.1.labels);
        assert_eq!(status.state, cri::PodSandboxState::SandboxReady as i32);
        seen.push((ev.container_id, ev.container_event_type));
    }
    assert!(seen.contains(&(
        id.clone(),
        cri::ContainerEventType::ContainerCreatedEvent as i32
    )));
    assert!(seen.contains(&(
        id.clone(),
        cri::ContainerEventType::ContainerStartedEvent as i32
    )));
    // Removing it is an event too.
    node.rt
        .remove_container(cri::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
    loop {
        let ev = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("the deleted event in time")
            .expect("stream open")
            .unwrap();
        if ev.container_id == id
            && ev.container_event_type == cri::ContainerEventType::ContainerDeletedEvent as i32
        {
            break;
        }
    }
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reopen_container_log_after_rotation() {
    if !root_or_skip("reopen_container_log_after_rotation") {
        return;
    }
    let node = Node::new("rot").await;
    let sb = node.sandbox("rot").await;
    let id = node
        .container(
            &sb,
            "c",
            &[
                "sh",
                "-c",
                "i=0; while true; do echo n$i; i=$((i+1)); sleep 0.05; done",
            ],
        )
        .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let log = std::path::PathBuf::from(node.status(&id).await.log_path);
    let rotated = log.with_extension("log.1");
    std::fs::rename(&log, &rotated).unwrap();
    node.rt
        .reopen_container_log(cri::ReopenContainerLogRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    node.rt
        .stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
    let old: Vec<u64> = log_records(&rotated)
        .iter()
        .filter_map(|r| r.2.strip_prefix('n')?.parse().ok())
        .collect();
    let new: Vec<u64> = log_records(&log)
        .iter()
        .filter_map(|r| r.2.strip_prefix('n')?.parse().ok())
        .collect();
    assert!(
        !old.is_empty() && !new.is_empty(),
        "both files have lines: {old:?} {new:?}"
    );
    let all: Vec<u64> = old.iter().chain(new.iter()).copied().collect();
    assert!(
        all.windows(2).all(|w| w[1] == w[0] + 1),
        "no line lost or repeated across the rotation: {all:?}"
    );
    // Reopening the log of an exited container is refused.
    let err = node
        .rt
        .reopen_container_log(cri::ReopenContainerLogRequest { container_id: id })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn host_pid_and_host_ipc_pods_share_the_nodes_namespaces() {
    if !root_or_skip("host_pid_and_host_ipc_pods_share_the_nodes_namespaces") {
        return;
    }
    let node = Node::new("hostns").await;
    let host = |ns: &str| {
        std::fs::read_link(format!("/proc/self/ns/{ns}"))
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    let sb = node
        .sandbox_with("hostns", |cfg| {
            cfg.linux = Some(cri::LinuxPodSandboxConfig {
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        pid: cri::NamespaceMode::Node as i32,
                        ipc: cri::NamespaceMode::Node as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        })
        .await;
    let id = node.container(&sb, "c", &["sleep", "600"]).await;
    let probe =
        "readlink /proc/self/ns/pid; readlink /proc/self/ns/ipc; readlink /proc/self/ns/net";
    let r = node.exec(&id, &["sh", "-c", probe]).await;
    let out = String::from_utf8_lossy(&r.stdout).into_owned();
    assert_eq!(r.exit_code, 0, "{}", String::from_utf8_lossy(&r.stderr));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some(host("pid").as_str()),
        "hostPID: {out}"
    );
    assert_eq!(
        lines.get(1).copied(),
        Some(host("ipc").as_str()),
        "hostIPC: {out}"
    );
    assert_ne!(
        lines.get(2).copied(),
        Some(host("net").as_str()),
        "the network stays the pod's own"
    );
    // With the node's PID namespace the test process is visible from inside the container.
    let me = std::process::id().to_string();
    let r = node
        .exec(
            &id,
            &["sh", "-c", &format!("test -d /proc/{me} && echo visible")],
        )
        .await;
    assert_eq!(String::from_utf8_lossy(&r.stdout), "visible\n");

    let other = node.sandbox("own").await;
    let c = node.container(&other, "c", &["sleep", "600"]).await;
    let r = node.exec(&c, &["sh", "-c", probe]).await;
    let out = String::from_utf8_lossy(&r.stdout).into_owned();
    assert!(
        !out.contains(&host("pid")) && !out.contains(&host("ipc")),
        "a normal pod has its own: {out}"
    );
    node.teardown().await;
}

/// A container that exits has its rootfs unmounted (containerd unmounts at exit too): a node
/// keeps dead containers for their logs, not their mounts. Its status, log and writable layer
/// (what it wrote, on disk and in its stats) still read; exec and ReopenContainerLog are
/// refused as for any exited container; StopContainer answers with the rootfs unmounted;
/// RemoveContainer then takes the rest. The same with an ID-mapped rootfs (a pod user
/// namespace).
#[tokio::test(flavor = "multi_thread")]
async fn an_exited_containers_rootfs_is_unmounted_and_the_rest_kept_until_removal() {
    if !root_or_skip("an_exited_containers_rootfs_is_unmounted_and_the_rest_kept_until_removal") {
        return;
    }
    let node = Node::new("unmount").await;
    let plain = node.sandbox("unmount").await;
    let userns = node
        .sandbox_with(
            "unmount-userns",
            userns_config(
                cri::NamespaceMode::Pod,
                vec![id_mapping(0, 100_000, 65_536)],
            ),
        )
        .await;
    let bundle = |id: &str| state_dir(node.root.path()).join("containers").join(id);
    let layer = |id: &str| node.root.path().join("images/containers").join(id);
    let mut exited = Vec::new();
    for sb in [&plain, &userns] {
        let pod = &sb.1.hostname;
        let id = node
            .container(
                sb,
                "c",
                &["sh", "-c", "echo kept > /written; echo bye; exit 3"],
            )
            .await;
        node.wait_exited(&id).await;
        settle(|| mounts_under(&bundle(&id)).is_empty()).await;
        assert_eq!(
            mounts_under(&bundle(&id)),
            Vec::<PathBuf>::new(),
            "{pod}: nothing of the exited container is mounted"
        );
        let s = node.status(&id).await;
        assert_eq!(
            (s.state, s.exit_code, s.reason.as_str()),
            (cri::ContainerState::ContainerExited as i32, 3, "Error"),
            "{pod}"
        );
        assert_eq!(log_output(Path::new(&s.log_path)).0, "bye\n", "{pod}");
        assert_eq!(
            std::fs::read_to_string(layer(&id).join("upper/written")).unwrap(),
            "kept\n",
            "{pod}: the writable layer stays"
        );
        let stats = node
            .rt
            .container_stats(cri::ContainerStatsRequest {
                container_id: id.clone(),
            })
            .await
            .expect("ContainerStats")
            .stats
            .expect("stats");
        let written = stats.writable_layer.expect("writable layer");
        assert!(
            written.used_bytes.is_some_and(|b| b.value > 0)
                && written.inodes_used.is_some_and(|i| i.value >= 2),
            "{pod}: {written:?}"
        );
        let err = node
            .rt
            .exec_sync(cri::ExecSyncRequest {
                container_id: id.clone(),
                cmd: vec!["true".into()],
                timeout: 5,
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{pod}: {err}");
        let err = node
            .rt
            .reopen_container_log(cri::ReopenContainerLogRequest {
                container_id: id.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{pod}: {err}");
        exited.push(id);
    }
    // A running container has its rootfs, until StopContainer answers.
    let running = node.container(&plain, "sleeper", &["sleep", "600"]).await;
    assert_eq!(
        mounts_under(&bundle(&running)),
        [bundle(&running).join("rootfs").canonicalize().unwrap()]
    );
    node.rt
        .stop_container(cri::StopContainerRequest {
            container_id: running.clone(),
            timeout: 0,
        })
        .await
        .expect("StopContainer");
    assert!(mounts_under(&bundle(&running)).is_empty());
    // Removal takes what was kept (in the background: settled).
    for id in &exited {
        node.rt
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.clone(),
            })
            .await
            .expect("RemoveContainer");
    }
    let gone = || {
        exited
            .iter()
            .all(|id| !bundle(id).exists() && !layer(id).exists())
    };
    settle(gone).await;
    assert!(
        gone(),
        "removed containers left their bundle or writable layer"
    );
    let keys = node.rt.image_store().rootfs_keys().unwrap();
    assert_eq!(keys, [running]);
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_root_dir_works_and_is_adopted_again() {
    if !root_or_skip("a_long_root_dir_works_and_is_adopted_again") {
        return;
    }
    // The sandbox's socket is <state dir>/sandboxes/<64 hex>/sandbox.sock: with this state dir
    // it is far longer than sun_path's 108 bytes. The root dir is as long.
    let top = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
    let root = top
        .path()
        .join("var-lib-nodelet-edge-site-0001")
        .join("a-rather-long-root-directory-name");
    let state = top
        .path()
        .join("run-nodelet-edge-site-0001")
        .join("a-rather-long-state-directory-name");
    import_busybox(&root);
    let cgroup_root = format!("/nodelet-test-longroot-{}", std::process::id());
    let config = |root: &std::path::Path, cgroup_root: &str| {
        let mut cfg = config(root, cgroup_root);
        cfg.state_dir = Some(state.clone());
        cfg
    };
    let rt = BuiltinRuntime::new(config(&root, &cgroup_root))
        .await
        .expect("runtime");
    let logs = root.join("logs");
    let sb = run_sandbox_on(&rt, "long", &logs).await;
    let id = start_container_on(
        &rt,
        &sb,
        container_config("c", &["sh", "-c", "echo hi; sleep 60"]),
    )
    .await;
    let status = |rt: BuiltinRuntime, id: String| async move {
        rt.container_status(cri::ContainerStatusRequest {
            container_id: id,
            verbose: false,
        })
        .await
        .expect("ContainerStatus")
        .status
        .expect("a status")
    };
    assert_eq!(
        status(rt.clone(), id.clone()).await.state,
        cri::ContainerState::ContainerRunning as i32
    );
    // A restarted agent (a new runtime on the same root) reaches the running sandbox.
    drop(rt);
    let rt = BuiltinRuntime::new(config(&root, &cgroup_root))
        .await
        .expect("runtime again");
    let s = status(rt.clone(), id.clone()).await;
    assert_eq!(s.state, cri::ContainerState::ContainerRunning as i32);
    let out = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["echo".into(), "adopted".into()],
            timeout: 10,
        })
        .await
        .expect("ExecSync through the adopted sandbox");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "adopted");
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sb.0.clone(),
    })
    .await
    .expect("stop");
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sb.0.clone(),
    })
    .await
    .expect("remove");
    drop(rt);
    remove_cgroup_root(&cgroup_root);
    assert_no_leaks(&root, &cgroup_root);
    assert_nothing_under(&state);
    for sub in ["sandboxes", "containers"] {
        let left = std::fs::read_dir(state.join(sub)).unwrap().count();
        assert_eq!(left, 0, "{sub} left in the state dir");
    }
}

/// A state dir under /run/nodelet/state as a runtime on the root dir
/// `/tmp/nl-gone-<pid>-<name>` (which does not exist) may leave it: `sandboxes` and
/// `containers`, what `fill` puts there, then its `boot_id` and its `root` file (last: a
/// runtime sweeping meanwhile takes no dir without one).
fn gone_root_state_dir(name: &str, fill: impl FnOnce(&Path)) -> PathBuf {
    let tag = format!("{:x}", std::process::id());
    let dir = Path::new("/run/nodelet/state").join(format!("test-{tag}-{name}"));
    for sub in ["sandboxes", "containers"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    fill(&dir);
    std::fs::write(dir.join("boot_id"), "00000000-0000-4000-8000-000000000000").unwrap();
    std::fs::write(dir.join("root"), format!("/tmp/nl-gone-{tag}-{name}")).unwrap();
    dir
}

/// Each root dir has its state dir under /run/nodelet/state, its `root` file naming the root
/// dir. A runtime alone on its root dir removes the state dirs of root dirs that are gone, but
/// only empty ones: one still holding a sandbox is left to whoever looks at it.
#[tokio::test(flavor = "multi_thread")]
async fn state_dirs_of_gone_root_dirs_are_swept_when_empty() {
    if !root_or_skip("state_dirs_of_gone_root_dirs_are_swept_when_empty") {
        return;
    }
    let empty = gone_root_state_dir("empty", |_| {});
    let holding = gone_root_state_dir("holding", |dir| {
        std::fs::create_dir_all(dir.join("sandboxes").join("some-sandbox")).unwrap();
    });
    let node = Node::new("sweep").await;
    assert!(
        !empty.exists(),
        "the empty state dir of a gone root dir is removed"
    );
    assert!(
        holding.join("sandboxes/some-sandbox").is_dir(),
        "one holding a sandbox stays"
    );
    let own = state_dir(node.root.path());
    assert_eq!(
        std::fs::read_to_string(own.join("root")).unwrap(),
        node.root.path().canonicalize().unwrap().to_string_lossy()
    );
    std::fs::remove_dir_all(&holding).unwrap();
    node.teardown().await;
}

/// Detaches the mounts and removes the dirs when dropped: what a test made in the node's
/// /run, gone whatever the test's outcome.
struct MadeInRun(Vec<PathBuf>, Vec<PathBuf>);

impl Drop for MadeInRun {
    fn drop(&mut self) {
        for m in &self.0 {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
        for d in &self.1 {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn mount_tmpfs(at: &Path) {
    std::fs::create_dir_all(at).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        at,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap_or_else(|e| panic!("mounting a tmpfs at {}: {e}", at.display()));
}

/// A runtime that stopped before unmounting a dead container's rootfs left the mount in its
/// state dir; once its root dir is gone, no runtime of its own will ever unmount it. The next
/// runtime alone on its root dir sweeps such a dir whose sandboxes were all shut down: it
/// unmounts what is mounted below it (deepest first, and only there: the overlay's layers
/// outside it are not touched) and removes it whole. A state dir with a sandbox that may still
/// run is left alone, its mounts with it.
#[tokio::test(flavor = "multi_thread")]
async fn a_gone_root_dirs_state_dir_with_rootfs_mounts_is_unmounted_and_swept() {
    if !root_or_skip("a_gone_root_dirs_state_dir_with_rootfs_mounts_is_unmounted_and_swept") {
        return;
    }
    // The layers of the rootfs left mounted, outside the state dir, as a gone image store's.
    let layers = tempfile::tempdir().unwrap();
    let (lower, upper, work) = (
        layers.path().join("lower"),
        layers.path().join("upper"),
        layers.path().join("work"),
    );
    for d in [&lower.join("dev"), &upper, &work] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(upper.join("written"), "by the container").unwrap();
    let mut made = MadeInRun(Vec::new(), Vec::new());
    let swept = gone_root_state_dir("mounted", |dir| {
        // A sandbox that was shut down (its stopped marker, as the sandbox process writes it)
        // and its container's bundle, the rootfs still mounted with a mount inside.
        let sandbox = dir.join("sandboxes/shut-down");
        std::fs::create_dir_all(sandbox.join("containers")).unwrap();
        std::fs::write(sandbox.join("stopped"), "").unwrap();
        let rootfs = dir.join("containers/dead/rootfs");
        std::fs::create_dir_all(&rootfs).unwrap();
        std::fs::write(dir.join("containers/dead/config.json"), "{}").unwrap();
        let options = format!(
            "lowerdir={},upperdir={},workdir={}",
            lower.display(),
            upper.display(),
            work.display()
        );
        nix::mount::mount(
            Some("overlay"),
            &rootfs,
            Some("overlay"),
            nix::mount::MsFlags::empty(),
            Some(options.as_str()),
        )
        .expect("mounting an overlay rootfs");
        mount_tmpfs(&rootfs.join("dev"));
        made.0.extend([rootfs.join("dev"), rootfs]);
    });
    made.1.push(swept.clone());
    // Its name starts with the other's: a sweep of the other must not reach into it.
    let held = gone_root_state_dir("mounted-held", |dir| {
        std::fs::create_dir_all(dir.join("sandboxes/maybe-running")).unwrap();
        mount_tmpfs(&dir.join("containers/live/rootfs"));
        made.0.push(dir.join("containers/live/rootfs"));
    });
    made.1.push(held.clone());
    // (Both mounts were made above. A runtime another test of this binary opens meanwhile may
    // sweep the dir before this node does, which is the behaviour under test all the same.)

    let node = Node::new("sweepmounts").await;
    assert!(
        mounts_under(&swept).is_empty(),
        "{:?}",
        mounts_under(&swept)
    );
    assert!(!swept.exists(), "the swept state dir is removed whole");
    assert_eq!(
        std::fs::read_to_string(upper.join("written")).unwrap(),
        "by the container",
        "the sweep removed nothing through a mount"
    );
    assert_eq!(
        mounts_under(&held),
        [held.join("containers/live/rootfs")],
        "a state dir with a sandbox that may run keeps its mounts"
    );
    assert!(held.join("sandboxes/maybe-running").is_dir());
    drop(made);
    assert!(!held.exists());
    node.teardown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn programs_that_cannot_be_executed_fail_the_start() {
    if !root_or_skip("programs_that_cannot_be_executed_fail_the_start") {
        return;
    }
    let node = Node::new("startfail").await;
    let sb = node.sandbox("startfail").await;
    let good = node.container(&sb, "good", &["sleep", "600"]).await;
    // A script whose interpreter the image lacks: the file exists and may be executed, the
    // kernel's execve fails (as for an ELF binary whose loader is missing).
    let script = node.root.path().join("orphan-script");
    std::fs::write(&script, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut orphan = container_config("orphan", &["/orphan"]);
    orphan.mounts = vec![cri::Mount {
        container_path: "/orphan".into(),
        host_path: script.to_string_lossy().into_owned(),
        readonly: true,
        ..Default::default()
    }];
    let cases = [
        (
            container_config("missing", &["/nonexistent"]),
            r#"exec: "/nonexistent": stat /nonexistent: no such file or directory"#,
        ),
        (
            container_config("data", &["/etc/passwd"]),
            r#"exec: "/etc/passwd": permission denied"#,
        ),
        (
            container_config("unknown", &["no-such-command"]),
            r#"exec: "no-such-command": executable file not found in $PATH"#,
        ),
        (orphan, "exec /orphan: no such file or directory"),
    ];
    for (config, why) in cases {
        let name = config.metadata.as_ref().unwrap().name.clone();
        let id = node.try_create(&sb, config).await.expect("CreateContainer");
        let err = node
            .rt
            .start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .expect_err(&name);
        assert!(err.message().contains(why), "{name}: {err}");
        let s = node.status(&id).await;
        assert_eq!(
            s.state,
            cri::ContainerState::ContainerExited as i32,
            "{name}"
        );
        assert_eq!(
            (s.exit_code, s.reason.as_str(), s.message.as_str()),
            (128, "StartError", why),
            "{name}"
        );
        assert_eq!(s.started_at, 0, "{name} never started");
        assert!(s.finished_at > 0, "{name}");
        // Nothing of libcontainer's in the container's own output.
        let recs = log_records(std::path::Path::new(&s.log_path));
        assert!(recs.is_empty(), "{name}: {recs:?}");
        // Starting it again is refused; removing it works.
        let again = node
            .rt
            .start_container(cri::StartContainerRequest {
                container_id: id.clone(),
            })
            .await;
        assert!(again.is_err(), "{name} started again");
        node.rt
            .remove_container(cri::RemoveContainerRequest { container_id: id })
            .await
            .expect("RemoveContainer");
    }

    // The pod's other containers are unaffected, and new ones start.
    let r = node.exec(&good, &["echo", "still here"]).await;
    assert_eq!(
        (r.exit_code, r.stdout.as_slice()),
        (0, &b"still here\n"[..])
    );
    let (code, out, _) = node
        .run_to_exit(&sb, container_config("after", &["echo", "after"]))
        .await;
    assert_eq!((code, out.as_str()), (0, "after\n"));
    node.teardown().await;
}

/// A sandbox process that dies (SIGKILL, as a crash) leaves nothing of its pod running: the
/// runtime kills the containers, an exec and the helpers through their cgroups, reports the
/// sandbox NotReady without an address and the containers exited (137, with the reason), and
/// tells watchers; the exec under way fails instead of hanging. Stop and remove then leave
/// nothing behind.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_sandbox_process_has_its_pod_reaped() {
    if !root_or_skip("a_dead_sandbox_process_has_its_pod_reaped") {
        return;
    }
    use futures::StreamExt;
    let node = Node::new("reap").await;
    let mut events = node
        .rt
        .get_container_events(cri::GetEventsRequest {})
        .await
        .unwrap();
    let sb = node.sandbox("reap").await;
    let a = node.container(&sb, "a", &["sleep", "600"]).await;
    let b = node
        .container(&sb, "b", &["sh", "-c", "trap '' TERM; sleep 600"])
        .await;
    let rt = node.rt.clone();
    let exec_in = a.clone();
    let exec = tokio::spawn(async move {
        rt.exec_sync(cri::ExecSyncRequest {
            container_id: exec_in,
            cmd: vec!["sleep".into(), "300".into()],
            timeout: 0,
        })
        .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = pids_in_cgroups(&node.cgroup_root);
    let sandbox = sandbox_pid(&node.rt, &sb.0).await;
    assert!(
        before.contains(&sandbox) && before.len() >= 4,
        "the sandbox, its containers and the exec are in the pod's cgroups: {before:?}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(sandbox),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill the sandbox process");

    let r = tokio::time::timeout(Duration::from_secs(20), exec)
        .await
        .expect("the exec under way ends instead of hanging")
        .expect("exec task");
    assert!(r.is_err(), "the exec fails: {r:?}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut stopped = std::collections::HashSet::new();
    while !(stopped.contains(&a) && stopped.contains(&b) && stopped.contains(&sb.0)) {
        let ev = tokio::time::timeout_at(deadline, events.next())
            .await
            .expect("stopped events in time")
            .expect("stream open")
            .unwrap();
        if ev.container_event_type == cri::ContainerEventType::ContainerStoppedEvent as i32 {
            stopped.insert(ev.container_id);
        }
    }
    let st = node
        .rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sb.0.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(st.state, cri::PodSandboxState::SandboxNotready as i32);
    assert_eq!(
        st.network.map(|n| n.ip).unwrap_or_default(),
        "",
        "the pod's address is freed"
    );
    for id in [&a, &b] {
        let s = node.status(id).await;
        assert_eq!(s.state, cri::ContainerState::ContainerExited as i32, "{id}");
        assert_eq!((s.exit_code, s.reason.as_str()), (137, "Error"), "{id}");
        assert!(s.message.contains("sandbox process died"), "{}", s.message);
        assert!(s.finished_at >= s.started_at, "{s:?}");
    }
    settle(|| before.iter().all(|p| process_gone(*p))).await;
    let left: Vec<String> = before
        .into_iter()
        .filter(|p| !process_gone(*p))
        .map(|p| {
            let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let cg = std::fs::read_to_string(format!("/proc/{p}/cgroup")).unwrap_or_default();
            format!("{p} {:?} in {cg}", String::from_utf8_lossy(&cmd))
        })
        .collect();
    assert!(
        left.is_empty(),
        "processes of the pod left running: {left:?}"
    );
    assert!(
        pids_in_cgroups(&node.cgroup_root).is_empty(),
        "nothing is left in the pod's cgroups"
    );
    // The kubelet's next steps: stop and remove, as for any sandbox.
    node.rt
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: sb.0.clone(),
        })
        .await
        .expect("StopPodSandbox of a dead sandbox");
    node.teardown().await;
}
