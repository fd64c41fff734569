//! Sandbox and container lifecycle, idempotency and concurrency.

use std::sync::Arc;

use super::*;

#[tokio::test]
async fn sandbox_and_container_lifecycle() {
    let rt = FakeRuntime::new();
    let sb = run_sandbox(&rt, "web", &[]).await;
    assert!(is_hex_id(&sb));
    let st = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sb.clone(),
            verbose: false,
        })
        .await
        .expect("sandbox status")
        .status
        .expect("status set");
    assert_eq!(st.state(), PS::SandboxReady);
    assert!(!st.network.expect("network").ip.is_empty());

    let c = create(&rt, &sb, "app", &[]).await;
    assert!(is_hex_id(&c));
    assert_ne!(c, sb);
    let s = status(&rt, &c).await.expect("status");
    assert_eq!(s.state(), CS::ContainerCreated);
    assert_eq!(s.log_path, "/var/log/pods/default_web/app/0.log");
    assert!(s.created_at > 0 && s.started_at == 0);

    start(&rt, &c).await.expect("start");
    let s = status(&rt, &c).await.expect("status");
    assert_eq!(s.state(), CS::ContainerRunning);
    assert!(s.started_at >= s.created_at);

    let code = start(&rt, &c).await.err().map(|e| e.code());
    assert_eq!(code, Some(Code::FailedPrecondition));

    rt.stop_container(cri::StopContainerRequest {
        container_id: c.clone(),
        timeout: 10,
    })
    .await
    .expect("stop");
    let s = status(&rt, &c).await.expect("status");
    assert_eq!(s.state(), CS::ContainerExited);
    assert_eq!((s.exit_code, s.reason.as_str()), (0, "Completed"));
    assert!(s.finished_at >= s.started_at);

    rt.remove_container(cri::RemoveContainerRequest {
        container_id: c.clone(),
    })
    .await
    .expect("remove");
    let code = status(&rt, &c).await.err().map(|e| e.code());
    assert_eq!(code, Some(Code::NotFound));

    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    })
    .await
    .expect("stop sandbox");
    assert_eq!(rt.sandboxes()[0].state, PS::SandboxNotready);
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    })
    .await
    .expect("remove sandbox");
    assert!(rt.sandboxes().is_empty());
    let err = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sb,
            verbose: false,
        })
        .await
        .err();
    assert_eq!(err.map(|e| e.code()), Some(Code::NotFound));
}

#[tokio::test]
async fn stop_and_remove_are_idempotent() {
    let rt = FakeRuntime::new();
    let sb = run_sandbox(&rt, "web", &[]).await;
    let c = create(&rt, &sb, "app", &[]).await;
    start(&rt, &c).await.expect("start");
    for _ in 0..2 {
        let req = cri::StopContainerRequest {
            container_id: c.clone(),
            timeout: 0,
        };
        rt.stop_container(req).await.expect("stop container");
    }
    for _ in 0..2 {
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: sb.clone(),
        };
        rt.stop_pod_sandbox(req).await.expect("stop sandbox");
    }
    for _ in 0..2 {
        let req = cri::RemoveContainerRequest {
            container_id: c.clone(),
        };
        rt.remove_container(req).await.expect("remove container");
        let req = cri::RemovePodSandboxRequest {
            pod_sandbox_id: sb.clone(),
        };
        rt.remove_pod_sandbox(req).await.expect("remove sandbox");
    }
    let unknown = "f".repeat(64);
    let req = cri::StopPodSandboxRequest {
        pod_sandbox_id: unknown.clone(),
    };
    rt.stop_pod_sandbox(req)
        .await
        .expect("stop unknown sandbox");
    let req = cri::StopContainerRequest {
        container_id: unknown.clone(),
        timeout: 0,
    };
    rt.stop_container(req)
        .await
        .expect("stop unknown container");
    let img = cri::ImageSpec {
        image: "never-pulled".to_string(),
        ..Default::default()
    };
    let req = cri::RemoveImageRequest { image: Some(img) };
    rt.remove_image(req).await.expect("remove unknown image");
}

#[tokio::test]
async fn stopping_a_sandbox_kills_its_running_containers() {
    let rt = FakeRuntime::new();
    let sb = run_sandbox(&rt, "web", &[]).await;
    let running = create(&rt, &sb, "running", &[]).await;
    let created = create(&rt, &sb, "created", &[]).await;
    start(&rt, &running).await.expect("start");
    let req = cri::StopPodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    };
    rt.stop_pod_sandbox(req).await.expect("stop sandbox");

    let s = status(&rt, &running).await.expect("status");
    assert_eq!((s.state(), s.exit_code), (CS::ContainerExited, 137));
    let s = status(&rt, &created).await.expect("status");
    assert_eq!(s.state(), CS::ContainerCreated);
    let code = start(&rt, &created).await.err().map(|e| e.code());
    assert_eq!(code, Some(Code::FailedPrecondition));
    assert!(rt.sandboxes()[0].network.ip.is_empty());

    let req = cri::RemovePodSandboxRequest { pod_sandbox_id: sb };
    rt.remove_pod_sandbox(req).await.expect("remove sandbox");
    assert!(rt.containers().is_empty());
}

#[tokio::test]
async fn create_container_validates_its_request() {
    let rt = FakeRuntime::new();
    let missing = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: "0".repeat(64),
            config: Some(container_config("app", &[])),
            sandbox_config: None,
        })
        .await
        .err();
    assert_eq!(missing.map(|e| e.code()), Some(Code::NotFound));

    let sb = run_sandbox(&rt, "web", &[]).await;
    let no_config = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb.clone(),
            config: None,
            sandbox_config: None,
        })
        .await
        .err();
    assert_eq!(no_config.map(|e| e.code()), Some(Code::InvalidArgument));
    let mut config = container_config("app", &[]);
    config.metadata = None;
    let no_meta = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb,
            config: Some(config),
            sandbox_config: None,
        })
        .await
        .err();
    assert_eq!(no_meta.map(|e| e.code()), Some(Code::InvalidArgument));
    let no_sandbox_config = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest::default())
        .await
        .err();
    assert_eq!(
        no_sandbox_config.map(|e| e.code()),
        Some(Code::InvalidArgument)
    );
    assert!(rt.containers().is_empty());
}

#[tokio::test]
async fn exec_sync_and_exited_helper() {
    let rt = FakeRuntime::new();
    let sb = run_sandbox(&rt, "web", &[]).await;
    let c = create(&rt, &sb, "app", &[]).await;
    let exec = |id: String| cri::ExecSyncRequest {
        container_id: id,
        cmd: vec!["true".to_string()],
        timeout: 1,
    };
    let not_running = rt.exec_sync(exec(c.clone())).await.err();
    assert_eq!(
        not_running.map(|e| e.code()),
        Some(Code::FailedPrecondition)
    );
    start(&rt, &c).await.expect("start");
    let out = rt.exec_sync(exec(c.clone())).await.expect("exec");
    assert_eq!((out.exit_code, out.stdout.len()), (0, 0));
    rt.set_exec_sync_response(cri::ExecSyncResponse {
        stdout: b"hi".to_vec(),
        stderr: Vec::new(),
        exit_code: 3,
    });
    let out = rt.exec_sync(exec(c.clone())).await.expect("exec");
    assert_eq!((out.exit_code, out.stdout.as_slice()), (3, &b"hi"[..]));

    rt.set_container_exited(&c, 2, "Error")
        .expect("known container");
    let s = status(&rt, &c).await.expect("status");
    assert_eq!(
        (s.state(), s.exit_code, s.reason.as_str()),
        (CS::ContainerExited, 2, "Error")
    );
    let unknown = rt.set_container_exited("nope", 1, "Error").err();
    assert_eq!(unknown.map(|e| e.code()), Some(Code::NotFound));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_are_safe() {
    let rt = Arc::new(FakeRuntime::new());
    let sb = run_sandbox(&rt, "web", &[]).await;
    let mut tasks = Vec::new();
    for i in 0..16 {
        let (rt, sb) = (rt.clone(), sb.clone());
        tasks.push(tokio::spawn(async move {
            let c = create(&rt, &sb, &format!("c{i}"), &[]).await;
            start(&rt, &c).await.map(|_| c)
        }));
    }
    for t in tasks {
        let joined = t.await.expect("task");
        assert!(joined.is_ok());
    }
    let running = rt
        .containers()
        .iter()
        .filter(|c| c.state == CS::ContainerRunning)
        .count();
    assert_eq!(running, 16);
}
