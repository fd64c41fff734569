//! The CRI server and the remote backend against each other: a `FakeRuntime` served on a temp
//! unix socket by `runtime::server`, driven through `runtime::remote::RemoteRuntime`. Every RPC
//! of both traits must round-trip (answers and errors, code and message), events must stream,
//! malformed requests must come back as the runtime's `InvalidArgument`, the client must follow
//! the server through restarts and crashes on the same socket path, and connecting to something
//! that is not a CRI v1 runtime must fail clearly.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use runtime::fake::{FAKE_RUNTIME_NAME, FakeRuntime};
use runtime::remote::{self, RemoteRuntime};
use runtime::server::{self, ServerConfig};
use runtime::{Code, Error, ImageService, RuntimeService, cri};
use tokio::sync::oneshot;

mod edge;
mod negotiation;
mod restart;
mod rpcs;
use rpcs::ALL_RPCS;

/// A server task over a fake runtime.
struct Served {
    fake: Arc<FakeRuntime>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<runtime::Result<()>>,
}

async fn serve(path: &Path, fake: Arc<FakeRuntime>) -> Served {
    let (tx, rx) = oneshot::channel::<()>();
    let (p, f) = (path.to_path_buf(), fake.clone());
    let cfg = ServerConfig {
        shutdown_grace: Duration::from_secs(2),
        ..Default::default()
    };
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = rx.await;
        };
        server::serve_unix_with(&p, f.clone(), f, cfg, shutdown).await
    });
    wait_listening(path).await;
    Served {
        fake,
        stop: Some(tx),
        task,
    }
}

impl Served {
    /// Graceful stop: returns once the server has closed the socket.
    async fn stop(mut self) {
        let _ = self.stop.take().map(|tx| tx.send(()));
        self.task
            .await
            .expect("server task")
            .expect("server result");
    }

    /// A crash: the serving future is dropped mid-flight.
    async fn crash(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

async fn wait_listening(path: &Path) {
    let start = Instant::now();
    while std::os::unix::net::UnixStream::connect(path).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "server did not listen"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn socket(dir: &tempfile::TempDir) -> (PathBuf, String) {
    let path = dir.path().join("run/cri.sock");
    let endpoint = format!("unix://{}", path.display());
    (path, endpoint)
}

async fn setup() -> (tempfile::TempDir, Served, RemoteRuntime) {
    let dir = tempfile::tempdir().unwrap();
    let (path, endpoint) = socket(&dir);
    let served = serve(&path, Arc::new(FakeRuntime::new())).await;
    let remote = remote::connect(&endpoint, Duration::from_secs(5))
        .await
        .expect("connect");
    (dir, served, remote)
}

fn sandbox_config(name: &str) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "test".into(),
            attempt: 0,
        }),
        labels: [("app".to_string(), name.to_string())].into(),
        log_directory: format!("/var/log/pods/{name}"),
        ..Default::default()
    }
}

fn container_config(name: &str) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: "busybox".into(),
            ..Default::default()
        }),
        command: vec!["sleep".into(), "1000".into()],
        log_path: format!("{name}/0.log"),
        labels: [("c".to_string(), name.to_string())].into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn every_rpc_round_trips_and_matches_the_runtime() {
    let (dir, served, rt) = setup().await;
    let fake = served.fake.clone();
    let mode = std::fs::metadata(socket(&dir).0).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o660);

    let v = rt.version_info();
    assert_eq!(
        (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
        (FAKE_RUNTIME_NAME, "v1")
    );
    assert_eq!(rt.version(Default::default()).await.unwrap(), *v);
    let st = rt.status(Default::default()).await.unwrap();
    assert_eq!(st.status.unwrap().conditions.len(), 2);
    let rc = rt.runtime_config(Default::default()).await.unwrap();
    assert_eq!(
        rc.linux.unwrap().cgroup_driver,
        cri::CgroupDriver::Cgroupfs as i32
    );
    rt.update_runtime_config(cri::UpdateRuntimeConfigRequest {
        runtime_config: Some(cri::RuntimeConfig {
            network_config: Some(cri::NetworkConfig {
                pod_cidr: "10.1.0.0/16".into(),
            }),
        }),
    })
    .await
    .unwrap();
    assert_eq!(fake.pod_cidr().as_deref(), Some("10.1.0.0/16"));

    // Images.
    let spec = |image: &str| cri::ImageSpec {
        image: image.into(),
        ..Default::default()
    };
    let pulled = rt
        .pull_image(cri::PullImageRequest {
            image: Some(spec("busybox")),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(pulled.image_ref.starts_with("sha256:"));
    let listed = rt.list_images(Default::default()).await.unwrap();
    assert_eq!(listed, fake.list_images(Default::default()).await.unwrap());
    assert_eq!(listed.images[0].repo_tags, ["busybox:latest"]);
    let status = rt
        .image_status(cri::ImageStatusRequest {
            image: Some(spec("busybox")),
            verbose: false,
        })
        .await
        .unwrap();
    assert_eq!(status.image.unwrap().id, pulled.image_ref);
    let fs = rt.image_fs_info(Default::default()).await.unwrap();
    assert_eq!(fs.image_filesystems.len(), 1);

    // A pod and a container through their whole life.
    let sb = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config("web")),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .pod_sandbox_id;
    let sid = |id: &str| cri::PodSandboxStatusRequest {
        pod_sandbox_id: id.into(),
        verbose: false,
    };
    let pss = rt
        .pod_sandbox_status(sid(&sb))
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(pss.state, cri::PodSandboxState::SandboxReady as i32);
    let by_label = cri::ListPodSandboxRequest {
        filter: Some(cri::PodSandboxFilter {
            label_selector: [("app".to_string(), "web".to_string())].into(),
            ..Default::default()
        }),
    };
    let pods = rt.list_pod_sandbox(by_label.clone()).await.unwrap();
    assert_eq!(pods, fake.list_pod_sandbox(by_label).await.unwrap());
    assert_eq!(pods.items.len(), 1);

    // CDI devices are the runtime's to resolve: they reach it as the kubelet sent them.
    let cdi = vec![cri::CdiDevice {
        name: "vendor.com/gpu=0".into(),
    }];
    let c = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sb.clone(),
            config: Some(cri::ContainerConfig {
                cdi_devices: cdi.clone(),
                ..container_config("app")
            }),
            sandbox_config: Some(sandbox_config("web")),
        })
        .await
        .unwrap()
        .container_id;
    assert_eq!(fake.containers()[0].config.cdi_devices, cdi);
    let cid = || c.clone();
    rt.start_container(cri::StartContainerRequest {
        container_id: cid(),
    })
    .await
    .unwrap();
    let cs_req = cri::ContainerStatusRequest {
        container_id: cid(),
        verbose: false,
    };
    let cs = rt.container_status(cs_req.clone()).await.unwrap();
    assert_eq!(cs, fake.container_status(cs_req.clone()).await.unwrap());
    let cs = cs.status.unwrap();
    assert_eq!(cs.state, cri::ContainerState::ContainerRunning as i32);
    assert_eq!(cs.log_path, "/var/log/pods/web/app/0.log");
    let running = cri::ListContainersRequest {
        filter: Some(cri::ContainerFilter {
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerRunning as i32,
            }),
            pod_sandbox_id: sb.clone(),
            ..Default::default()
        }),
    };
    let listed = rt.list_containers(running.clone()).await.unwrap();
    assert_eq!(listed, fake.list_containers(running).await.unwrap());
    assert_eq!(listed.containers.len(), 1);

    let resources = cri::LinuxContainerResources {
        cpu_shares: 512,
        memory_limit_in_bytes: 64 << 20,
        ..Default::default()
    };
    rt.update_container_resources(cri::UpdateContainerResourcesRequest {
        container_id: cid(),
        linux: Some(resources.clone()),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(
        fake.containers()[0].resources.as_ref().unwrap().linux,
        Some(resources)
    );
    rt.reopen_container_log(cri::ReopenContainerLogRequest {
        container_id: cid(),
    })
    .await
    .unwrap();
    let exec_answer = cri::ExecSyncResponse {
        stdout: b"out\n".to_vec(),
        stderr: vec![0, 159, 146, 150, 255], // not UTF-8: bytes must pass untouched
        exit_code: 3,
    };
    fake.set_exec_sync_response(exec_answer.clone());
    let exec = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: cid(),
            cmd: vec!["true".into()],
            timeout: 5,
        })
        .await
        .unwrap();
    assert_eq!(exec, exec_answer);
    let url = rt
        .exec(cri::ExecRequest {
            container_id: cid(),
            cmd: vec!["sh".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .url;
    assert!(url.ends_with(&format!("/exec/{c}")), "{url}");
    let url = rt
        .attach(cri::AttachRequest {
            container_id: cid(),
            ..Default::default()
        })
        .await
        .unwrap()
        .url;
    assert!(url.contains("/attach/"), "{url}");
    let url = rt
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: sb.clone(),
            port: vec![80],
        })
        .await
        .unwrap()
        .url;
    assert!(url.contains("/portforward/"), "{url}");
    let stats = rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: cid(),
        })
        .await
        .unwrap();
    assert_eq!(stats.stats.unwrap().attributes.unwrap().id, c);
    let all = rt.list_container_stats(Default::default()).await.unwrap();
    assert_eq!(all.stats.len(), 1);
    let ps = rt
        .pod_sandbox_stats(cri::PodSandboxStatsRequest {
            pod_sandbox_id: sb.clone(),
        })
        .await
        .unwrap();
    assert_eq!(ps.stats.unwrap().attributes.unwrap().id, sb);
    assert_eq!(
        rt.list_pod_sandbox_stats(Default::default())
            .await
            .unwrap()
            .stats
            .len(),
        1
    );
    rt.checkpoint_container(cri::CheckpointContainerRequest {
        container_id: cid(),
        location: "/tmp/cp.tar".into(),
        timeout: 10,
    })
    .await
    .unwrap();
    rt.list_metric_descriptors(Default::default())
        .await
        .unwrap();
    rt.list_pod_sandbox_metrics(Default::default())
        .await
        .unwrap();

    rt.stop_container(cri::StopContainerRequest {
        container_id: cid(),
        timeout: 10,
    })
    .await
    .unwrap();
    let cs = rt.container_status(cs_req).await.unwrap().status.unwrap();
    assert_eq!(cs.state, cri::ContainerState::ContainerExited as i32);
    rt.remove_container(cri::RemoveContainerRequest {
        container_id: cid(),
    })
    .await
    .unwrap();
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    })
    .await
    .unwrap();
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sb.clone(),
    })
    .await
    .unwrap();
    rt.remove_image(cri::RemoveImageRequest {
        image: Some(spec("busybox")),
    })
    .await
    .unwrap();
    assert!(
        fake.sandboxes().is_empty() && fake.containers().is_empty() && fake.images().is_empty()
    );

    // Every RPC of both services reached the runtime (GetContainerEvents: see the events test).
    let called = fake.called();
    for rpc in ALL_RPCS.iter().filter(|r| **r != "GetContainerEvents") {
        assert!(
            called.iter().any(|c| c == rpc),
            "{rpc} never reached the runtime: {called:?}"
        );
    }
    served.stop().await;
    assert!(
        !socket(&dir).0.exists(),
        "a stopped server removes its socket"
    );
}
