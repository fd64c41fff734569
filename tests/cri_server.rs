//! `nodelet cri serve` end to end: the real binary serves the built-in runtime on a unix socket
//! and the remote backend drives a pod through it: containers run, exit with their code, exec,
//! list with filters, stream events; bad requests get the right gRPC code and change nothing;
//! the server is SIGKILLed and restarted on the same socket, and the same client finds the
//! running container again (adopted by the new server). Needs root.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::cri_serve::CriNode;
use common::*;
use futures::StreamExt;
use runtime::remote::RemoteRuntime;
use runtime::{Code, ImageService, RuntimeService, cri};

async fn status(rt: &RemoteRuntime, id: &str) -> runtime::Result<cri::ContainerStatus> {
    rt.container_status(cri::ContainerStatusRequest {
        container_id: id.into(),
        verbose: false,
    })
    .await
    .map(|r| r.status.expect("status"))
}

async fn wait_exited(rt: &RemoteRuntime, id: &str) -> cri::ContainerStatus {
    wait_exited_on(rt, id).await
}

async fn run_container(
    rt: &RemoteRuntime,
    sandbox: &(String, cri::PodSandboxConfig),
    name: &str,
    cmd: &[&str],
) -> String {
    start_container_on(rt, sandbox, container_config(name, cmd)).await
}

async fn exec(rt: &RemoteRuntime, id: &str, cmd: &[&str]) -> cri::ExecSyncResponse {
    rt.exec_sync(cri::ExecSyncRequest {
        container_id: id.into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        timeout: 20,
    })
    .await
    .expect("ExecSync")
}

/// Ids and states of every sandbox and container, to check that bad requests change nothing.
async fn snapshot(rt: &RemoteRuntime) -> Vec<(String, i32)> {
    let mut all: Vec<(String, i32)> = rt
        .list_pod_sandbox(Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|s| (s.id, s.state))
        .collect();
    let containers = rt.list_containers(Default::default()).await.unwrap();
    all.extend(containers.containers.into_iter().map(|c| (c.id, c.state)));
    all.sort();
    all
}

fn container_filter(f: cri::ContainerFilter) -> cri::ListContainersRequest {
    cri::ListContainersRequest { filter: Some(f) }
}

async fn list_names(rt: &RemoteRuntime, f: cri::ContainerFilter) -> Vec<String> {
    let mut names: Vec<String> = rt
        .list_containers(container_filter(f))
        .await
        .expect("ListContainers")
        .containers
        .into_iter()
        .map(|c| c.metadata.unwrap_or_default().name)
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn cri_serve_runs_a_pod_for_a_remote_client_and_survives_a_restart() {
    if !root_or_skip("cri_serve_runs_a_pod_for_a_remote_client_and_survives_a_restart") {
        return;
    }
    let node = CriNode::new("cri");
    let (root, socket) = (&node.root, &node.socket);
    let server = node.serve("1.log", &[]).await;
    let rt = node.connect().await;
    let v = rt.version_info();
    assert_eq!(
        (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
        ("nodelet", "v1")
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(socket).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o660);

    // Images.
    let busybox = cri::ImageSpec {
        image: BUSYBOX.into(),
        ..Default::default()
    };
    let img = rt
        .image_status(cri::ImageStatusRequest {
            image: Some(busybox.clone()),
            verbose: false,
        })
        .await
        .unwrap()
        .image
        .expect("busybox is imported");
    let images = rt.list_images(Default::default()).await.unwrap().images;
    assert!(
        images
            .iter()
            .any(|i| i.id == img.id && i.repo_tags.contains(&BUSYBOX.to_string()))
    );
    let unknown = cri::ImageStatusRequest {
        image: Some(cri::ImageSpec {
            image: "example.com/none:1".into(),
            ..Default::default()
        }),
        verbose: false,
    };
    assert!(rt.image_status(unknown).await.unwrap().image.is_none());
    assert!(
        !rt.image_fs_info(Default::default())
            .await
            .unwrap()
            .image_filesystems
            .is_empty()
    );

    // A pod: one container exits with 3, one sleeps and runs execs.
    let mut events = rt.get_container_events(Default::default()).await.unwrap();
    let log_dir = root.path().join("logs");
    let sb = run_sandbox_on(&rt, "crisrv", &log_dir).await;
    let sb_id = sb.0.clone();
    let exiter = run_container(&rt, &sb, "exiter", &["sh", "-c", "echo hi; exit 3"]).await;
    let s = wait_exited(&rt, &exiter).await;
    assert_eq!(s.exit_code, 3);
    assert_eq!(log_output(Path::new(&s.log_path)).0, "hi\n");
    let sleeper = run_container(&rt, &sb, "sleeper", &["sleep", "3600"]).await;
    let r = exec(
        &rt,
        &sleeper,
        &["sh", "-c", "echo hello; echo oops >&2; exit 7"],
    )
    .await;
    assert_eq!(
        (r.stdout.as_slice(), r.stderr.as_slice(), r.exit_code),
        (&b"hello\n"[..], &b"oops\n"[..], 7)
    );
    let r = exec(
        &rt,
        &sleeper,
        &["sh", "-c", "echo before-restart > /tmp/marker"],
    )
    .await;
    assert_eq!(r.exit_code, 0);

    // The events of both containers arrived through the stream.
    let mut seen = Vec::new();
    let started = cri::ContainerEventType::ContainerStartedEvent as i32;
    while !seen.contains(&(sleeper.clone(), started)) {
        let ev = tokio::time::timeout(Duration::from_secs(10), events.next())
            .await
            .unwrap_or_else(|_| panic!("no sleeper start event; got {seen:?}"))
            .expect("stream open")
            .expect("event");
        seen.push((ev.container_id, ev.container_event_type));
    }
    for kind in [
        cri::ContainerEventType::ContainerCreatedEvent,
        cri::ContainerEventType::ContainerStartedEvent,
    ] {
        assert!(
            seen.contains(&(exiter.clone(), kind as i32)),
            "{kind:?} of exiter: {seen:?}"
        );
    }

    // Filters.
    let running = cri::ContainerStateValue {
        state: cri::ContainerState::ContainerRunning as i32,
    };
    let by_state = cri::ContainerFilter {
        state: Some(running),
        ..Default::default()
    };
    assert_eq!(list_names(&rt, by_state).await, ["sleeper"]);
    let by_pod = cri::ContainerFilter {
        pod_sandbox_id: sb_id.clone(),
        ..Default::default()
    };
    assert_eq!(list_names(&rt, by_pod).await, ["exiter", "sleeper"]);
    let by_label = cri::ContainerFilter {
        label_selector: [("container".to_string(), "exiter".to_string())].into(),
        ..Default::default()
    };
    assert_eq!(list_names(&rt, by_label).await, ["exiter"]);
    let pods = |f: cri::PodSandboxFilter| {
        let rt = rt.clone();
        async move {
            let req = cri::ListPodSandboxRequest { filter: Some(f) };
            rt.list_pod_sandbox(req).await.unwrap().items.len()
        }
    };
    let app = |v: &str| [("app".to_string(), v.to_string())].into();
    assert_eq!(
        pods(cri::PodSandboxFilter {
            label_selector: app("crisrv"),
            ..Default::default()
        })
        .await,
        1
    );
    assert_eq!(
        pods(cri::PodSandboxFilter {
            label_selector: app("other"),
            ..Default::default()
        })
        .await,
        0
    );
    let not_ready = cri::PodSandboxStateValue {
        state: cri::PodSandboxState::SandboxNotready as i32,
    };
    assert_eq!(
        pods(cri::PodSandboxFilter {
            state: Some(not_ready),
            ..Default::default()
        })
        .await,
        0
    );

    // Bad requests: the right code, and nothing changes.
    let before = snapshot(&rt).await;
    let no_config = rt.run_pod_sandbox(Default::default()).await.unwrap_err();
    assert_eq!(no_config.code(), Code::InvalidArgument, "{no_config}");
    let no_config = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb_id.clone(),
            config: None,
            sandbox_config: Some(sb.1.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(no_config.code(), Code::InvalidArgument, "{no_config}");
    let mut evil = container_config("evil", &["true"]);
    evil.log_path = "../../etc/x".into();
    let traversal = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb_id.clone(),
            config: Some(evil),
            sandbox_config: Some(sb.1.clone()),
        })
        .await
        .unwrap_err();
    assert_eq!(traversal.code(), Code::InvalidArgument, "{traversal}");
    assert!(!root.path().join("etc/x").exists() && !Path::new("/etc/x").exists());
    for err in [
        status(&rt, "does-not-exist").await.unwrap_err(),
        rt.start_container(cri::StartContainerRequest {
            container_id: "does-not-exist".into(),
        })
        .await
        .unwrap_err(),
        rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: "does-not-exist".into(),
            verbose: false,
        })
        .await
        .unwrap_err(),
    ] {
        assert_eq!(err.code(), Code::NotFound, "{err}");
    }
    assert_eq!(
        snapshot(&rt).await,
        before,
        "bad requests changed the runtime"
    );

    // SIGKILL the server: calls fail while it is down; a new server on the same socket adopts
    // the running container and the same client reaches it.
    let started_at = status(&rt, &sleeper).await.unwrap().started_at;
    drop(server);
    let down = rt.status(Default::default()).await.unwrap_err();
    assert_eq!(down.code(), Code::Unavailable, "{down}");
    let restarted = Instant::now();
    let server = node.serve("2.log", &[]).await;
    let s = loop {
        match status(&rt, &sleeper).await {
            Ok(s) => break s,
            Err(e) => {
                assert!(
                    restarted.elapsed() < Duration::from_secs(30),
                    "no reconnect: {e}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    eprintln!(
        "client reached the restarted server {:?} after it was started",
        restarted.elapsed()
    );
    assert_eq!(s.state, cri::ContainerState::ContainerRunning as i32);
    assert_eq!(
        s.started_at, started_at,
        "the same container, not a new one"
    );
    let r = exec(&rt, &sleeper, &["cat", "/tmp/marker"]).await;
    assert_eq!(r.stdout, b"before-restart\n");
    assert_eq!(status(&rt, &exiter).await.unwrap().exit_code, 3);

    // Tear down through the server, then stop it with SIGTERM: it removes its socket.
    rt.stop_container(cri::StopContainerRequest {
        container_id: sleeper.clone(),
        timeout: 2,
    })
    .await
    .unwrap();
    assert_eq!(
        status(&rt, &sleeper).await.unwrap().state,
        cri::ContainerState::ContainerExited as i32
    );
    for id in [&exiter, &sleeper] {
        rt.remove_container(cri::RemoveContainerRequest {
            container_id: id.to_string(),
        })
        .await
        .unwrap();
    }
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sb_id.clone(),
    })
    .await
    .unwrap();
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sb_id.clone(),
    })
    .await
    .unwrap();
    assert!(snapshot(&rt).await.is_empty());
    server.terminate().await;
    assert!(!socket.exists(), "the server left its socket behind");
    node.assert_all_gone();
}

/// CRI says an ExecSync without a timeout runs until its command ends: the server's request
/// timeout does not cut it short (one with a timeout gets the request timeout on top).
#[tokio::test(flavor = "multi_thread")]
async fn exec_sync_without_a_timeout_outlives_the_request_timeout() {
    if !root_or_skip("exec_sync_without_a_timeout_outlives_the_request_timeout") {
        return;
    }
    let node = CriNode::new("crix");
    let server = node.serve("server.log", &["--request-timeout", "3"]).await;
    let rt = node.connect().await;
    let (sb_id, cfg) = run_sandbox_on(&rt, "crix", &node.root.path().join("logs")).await;
    let sleeper = run_container(&rt, &(sb_id.clone(), cfg), "sleeper", &["sleep", "600"]).await;
    let started = Instant::now();
    let r = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: sleeper.clone(),
            cmd: vec!["sh".into(), "-c".into(), "sleep 4; echo done".into()],
            timeout: 0,
        })
        .await
        .expect("an ExecSync without a timeout");
    assert_eq!(
        (r.exit_code, r.stdout.as_slice()),
        (0, b"done\n".as_slice())
    );
    assert!(started.elapsed() >= Duration::from_secs(4));
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sb_id,
    })
    .await
    .unwrap();
    server.terminate().await;
    node.assert_all_gone();
}
