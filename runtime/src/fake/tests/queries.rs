//! Filters, error injection, call recording, images and events.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;

use super::*;

#[tokio::test]
async fn list_filters() {
    let rt = FakeRuntime::new();
    let sb1 = run_sandbox(&rt, "one", &[("app", "a")]).await;
    let sb2 = run_sandbox(&rt, "two", &[("app", "b")]).await;
    let c1 = create(&rt, &sb1, "c1", &[("tier", "web")]).await;
    let c2 = create(&rt, &sb1, "c2", &[("tier", "db")]).await;
    let c3 = create(&rt, &sb2, "c3", &[("tier", "web")]).await;
    start(&rt, &c1).await.expect("start");

    let all = cri::ContainerFilter::default();
    assert_eq!(
        list(&rt, all.clone()).await,
        vec![c1.clone(), c2.clone(), c3.clone()]
    );
    let by_id = cri::ContainerFilter {
        id: c2.clone(),
        ..all.clone()
    };
    assert_eq!(list(&rt, by_id).await, vec![c2.clone()]);
    let by_prefix = cri::ContainerFilter {
        id: c3[..12].to_string(),
        ..all.clone()
    };
    assert_eq!(list(&rt, by_prefix).await, vec![c3.clone()]);
    let unknown = cri::ContainerFilter {
        id: "nope".to_string(),
        ..all.clone()
    };
    assert!(list(&rt, unknown).await.is_empty());
    let running = cri::ContainerFilter {
        state: Some(cri::ContainerStateValue {
            state: CS::ContainerRunning as i32,
        }),
        ..all.clone()
    };
    assert_eq!(list(&rt, running).await, vec![c1.clone()]);
    let in_sb2 = cri::ContainerFilter {
        pod_sandbox_id: sb2.clone(),
        ..all.clone()
    };
    assert_eq!(list(&rt, in_sb2).await, vec![c3.clone()]);
    let web_in_sb1 = cri::ContainerFilter {
        pod_sandbox_id: sb1[..10].to_string(),
        label_selector: HashMap::from([("tier".to_string(), "web".to_string())]),
        ..all.clone()
    };
    assert_eq!(list(&rt, web_in_sb1).await, vec![c1.clone()]);

    let none = cri::PodSandboxFilter::default();
    assert_eq!(
        list_sandboxes(&rt, none.clone()).await,
        vec![sb1.clone(), sb2.clone()]
    );
    let app_b = cri::PodSandboxFilter {
        label_selector: HashMap::from([("app".to_string(), "b".to_string())]),
        ..none.clone()
    };
    assert_eq!(list_sandboxes(&rt, app_b).await, vec![sb2.clone()]);
    let req = cri::StopPodSandboxRequest {
        pod_sandbox_id: sb2.clone(),
    };
    rt.stop_pod_sandbox(req).await.expect("stop");
    let ready = cri::PodSandboxFilter {
        state: Some(cri::PodSandboxStateValue {
            state: PS::SandboxReady as i32,
        }),
        ..none.clone()
    };
    assert_eq!(list_sandboxes(&rt, ready).await, vec![sb1.clone()]);
    let by_id = cri::PodSandboxFilter {
        id: sb2.clone(),
        ..none
    };
    assert_eq!(list_sandboxes(&rt, by_id).await, vec![sb2]);

    let stats = rt
        .list_container_stats(cri::ListContainerStatsRequest { filter: None })
        .await
        .expect("stats")
        .stats;
    let ids: Vec<_> = stats
        .iter()
        .filter_map(|s| s.attributes.as_ref().map(|a| a.id.clone()))
        .collect();
    assert_eq!(ids, vec![c1]);
}

#[tokio::test]
async fn injected_errors_are_fifo_per_rpc_and_recorded() {
    let rt = FakeRuntime::new();
    rt.inject_error("Version", Error::unavailable("first"));
    rt.inject_error("Version", Error::internal("second"));
    rt.inject_error("Status", Error::deadline_exceeded("status"));

    let e1 = rt.version(cri::VersionRequest::default()).await.err();
    assert_eq!(
        e1.map(|e| (e.code(), e.message().to_string())),
        Some((Code::Unavailable, "first".to_string()))
    );
    let e2 = rt.version(cri::VersionRequest::default()).await.err();
    assert_eq!(e2.map(|e| e.code()), Some(Code::Internal));
    let v = rt
        .version(cri::VersionRequest::default())
        .await
        .expect("third call succeeds");
    assert_eq!(v.runtime_name, "fake-runtime");
    assert_eq!(v.runtime_api_version, "v1");

    rt.inject_error("RunPodSandbox", Error::resource_exhausted("no room"));
    let failed = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config("x", &[])),
            runtime_handler: String::new(),
        })
        .await;
    assert!(failed.is_err());
    assert!(rt.sandboxes().is_empty(), "a failed call has no effect");

    rt.assert_calls(&["Version", "Version", "Version", "RunPodSandbox"])
        .expect("calls recorded");
    let e3 = rt.status(cri::StatusRequest::default()).await.err();
    assert_eq!(e3.map(|e| e.code()), Some(Code::DeadlineExceeded));
}

#[tokio::test]
async fn call_recording() {
    let rt = FakeRuntime::new();
    let sb = run_sandbox(&rt, "web", &[]).await;
    let c = create(&rt, &sb, "app", &[]).await;
    start(&rt, &c).await.expect("start");
    let _ = rt.image_fs_info(cri::ImageFsInfoRequest {}).await;
    rt.assert_calls(&[
        "RunPodSandbox",
        "CreateContainer",
        "StartContainer",
        "ImageFsInfo",
    ])
    .expect("calls");
    let err = rt
        .assert_calls(&["RunPodSandbox"])
        .err()
        .unwrap_or_default();
    assert!(err.contains("CreateContainer"), "{err}");
    rt.clear_calls();
    assert!(rt.called().is_empty());
}

#[tokio::test]
async fn status_version_and_runtime_config() {
    let rt = FakeRuntime::new();
    let st = rt
        .status(cri::StatusRequest { verbose: false })
        .await
        .expect("status");
    let conds = st.status.expect("runtime status").conditions;
    let ready = |t: &str| conds.iter().any(|c| c.r#type == t && c.status);
    assert!(ready("RuntimeReady") && ready("NetworkReady"));
    let cfg = rt
        .runtime_config(cri::RuntimeConfigRequest {})
        .await
        .expect("runtime config");
    assert!(cfg.linux.is_some());
    rt.update_runtime_config(cri::UpdateRuntimeConfigRequest {
        runtime_config: Some(cri::RuntimeConfig {
            network_config: Some(cri::NetworkConfig {
                pod_cidr: "10.88.0.0/16".to_string(),
            }),
        }),
    })
    .await
    .expect("update runtime config");
    assert_eq!(rt.pod_cidr().as_deref(), Some("10.88.0.0/16"));
}

#[tokio::test]
async fn ambiguous_or_empty_ids_are_invalid() {
    let rt = FakeRuntime::new();
    let sb = run_sandbox(&rt, "web", &[]).await;
    let err = status(&rt, "").await.err();
    assert_eq!(err.map(|e| e.code()), Some(Code::InvalidArgument));
    // Create containers until two share a first hex digit.
    let mut ids: Vec<String> = Vec::new();
    let prefix = loop {
        let id = create(&rt, &sb, "c", &[]).await;
        if let Some(other) = ids.iter().find(|o| o[..1] == id[..1]) {
            break other[..1].to_string();
        }
        ids.push(id);
    };
    let err = status(&rt, &prefix).await.err();
    assert_eq!(err.map(|e| e.code()), Some(Code::InvalidArgument));
    let unique = &ids[0][..20];
    assert_eq!(status(&rt, unique).await.expect("prefix").id, ids[0]);
}

#[tokio::test]
async fn images() {
    let rt = FakeRuntime::new();
    let spec = |s: &str| {
        Some(cri::ImageSpec {
            image: s.to_string(),
            ..Default::default()
        })
    };
    let status_of = |s: &str| cri::ImageStatusRequest {
        image: spec(s),
        verbose: false,
    };
    let st = rt.image_status(status_of("busybox")).await.expect("status");
    assert!(st.image.is_none());
    let pulled = rt
        .pull_image(cri::PullImageRequest {
            image: spec("busybox"),
            ..Default::default()
        })
        .await
        .expect("pull");
    assert!(pulled.image_ref.starts_with("sha256:"));
    let again = rt
        .pull_image(cri::PullImageRequest {
            image: spec("busybox:latest"),
            ..Default::default()
        })
        .await
        .expect("pull again");
    assert_eq!(again.image_ref, pulled.image_ref);
    let img = rt
        .image_status(status_of(&pulled.image_ref))
        .await
        .expect("status")
        .image
        .expect("present");
    assert_eq!(img.repo_tags, vec!["busybox:latest".to_string()]);

    rt.set_fake_images(&["nginx:1.25", "pause:3.9"]);
    let listed = rt
        .list_images(cri::ListImagesRequest { filter: None })
        .await
        .expect("list")
        .images;
    assert_eq!(listed.len(), 2);
    let filtered = rt
        .list_images(cri::ListImagesRequest {
            filter: Some(cri::ImageFilter {
                image: spec("pause:3.9"),
            }),
        })
        .await
        .expect("list")
        .images;
    assert_eq!(filtered.len(), 1);
    let fs = rt
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .expect("fs info");
    assert_eq!(fs.image_filesystems.len(), 1);
    let used = fs.image_filesystems[0].used_bytes.map(|u| u.value);
    assert_eq!(used, Some(2 * FAKE_IMAGE_SIZE));

    for _ in 0..2 {
        let req = cri::RemoveImageRequest {
            image: spec("nginx:1.25"),
        };
        rt.remove_image(req).await.expect("remove is idempotent");
    }
    assert_eq!(rt.images().len(), 1);
    let bad = rt.pull_image(cri::PullImageRequest::default()).await.err();
    assert_eq!(bad.map(|e| e.code()), Some(Code::InvalidArgument));
}

#[tokio::test]
async fn container_events_are_streamed() {
    let rt = Arc::new(FakeRuntime::new());
    let mut events = rt
        .get_container_events(cri::GetEventsRequest {})
        .await
        .expect("events");
    let sb = run_sandbox(&rt, "web", &[]).await;
    let c = create(&rt, &sb, "app", &[]).await;
    start(&rt, &c).await.expect("start");
    let mut got = Vec::new();
    for _ in 0..4 {
        let ev = events.next().await.expect("an event").expect("ok event");
        got.push((ev.container_id.clone(), ev.container_event_type));
        assert!(ev.pod_sandbox_status.is_some());
    }
    use cri::ContainerEventType as E;
    assert_eq!(
        got,
        vec![
            (sb.clone(), E::ContainerCreatedEvent as i32),
            (sb, E::ContainerStartedEvent as i32),
            (c.clone(), E::ContainerCreatedEvent as i32),
            (c, E::ContainerStartedEvent as i32),
        ]
    );
}

#[tokio::test]
async fn auxiliary_rpcs() {
    let rt = FakeRuntime::new();
    let sb = run_sandbox(&rt, "web", &[("app", "a")]).await;
    let c = create(&rt, &sb, "app", &[]).await;
    let log = cri::ReopenContainerLogRequest {
        container_id: c.clone(),
    };
    let err = rt.reopen_container_log(log.clone()).await.err();
    assert_eq!(err.map(|e| e.code()), Some(Code::FailedPrecondition));
    start(&rt, &c).await.expect("start");
    rt.reopen_container_log(log).await.expect("reopen log");

    let linux = cri::LinuxContainerResources {
        cpu_shares: 512,
        ..Default::default()
    };
    rt.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: c.clone(),
        linux: Some(linux.clone()),
        ..Default::default()
    })
    .await
    .expect("update resources");
    let res = status(&rt, &c).await.expect("status").resources;
    assert_eq!(res.and_then(|r| r.linux), Some(linux));

    let exec = rt
        .exec(cri::ExecRequest {
            container_id: c.clone(),
            ..Default::default()
        })
        .await
        .expect("exec");
    assert!(exec.url.contains(&c));
    let attach = rt
        .attach(cri::AttachRequest {
            container_id: c.clone(),
            ..Default::default()
        })
        .await
        .expect("attach");
    assert!(attach.url.contains(&c));
    let pf = rt
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: sb.clone(),
            port: vec![80],
        })
        .await
        .expect("port forward");
    assert!(pf.url.contains(&sb));

    let stats = rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: c.clone(),
        })
        .await
        .expect("container stats");
    assert!(stats.stats.is_some_and(|s| s.cpu.is_some()));
    let sb_stats = rt
        .pod_sandbox_stats(cri::PodSandboxStatsRequest {
            pod_sandbox_id: sb.clone(),
        })
        .await
        .expect("sandbox stats")
        .stats
        .and_then(|s| s.linux)
        .map(|l| l.containers.len());
    assert_eq!(sb_stats, Some(1));
    let listed = rt
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest {
            filter: Some(cri::PodSandboxStatsFilter {
                id: String::new(),
                label_selector: HashMap::from([("app".to_string(), "z".to_string())]),
            }),
        })
        .await
        .expect("list sandbox stats");
    assert!(listed.stats.is_empty());
    let missing = rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: "nope".to_string(),
        })
        .await
        .err();
    assert_eq!(missing.map(|e| e.code()), Some(Code::NotFound));

    rt.checkpoint_container(cri::CheckpointContainerRequest {
        container_id: c,
        ..Default::default()
    })
    .await
    .expect("checkpoint");
    let descriptors = rt
        .list_metric_descriptors(cri::ListMetricDescriptorsRequest {})
        .await
        .expect("descriptors");
    assert!(descriptors.descriptors.is_empty());

    rt.set_runtime_conditions(vec![cri::RuntimeCondition {
        r#type: "NetworkReady".to_string(),
        status: false,
        reason: "NoCNI".to_string(),
        message: String::new(),
    }]);
    let conds = rt
        .status(cri::StatusRequest::default())
        .await
        .expect("status")
        .status
        .map(|s| s.conditions)
        .unwrap_or_default();
    assert_eq!(conds.len(), 1);
    assert!(!conds[0].status);
}
