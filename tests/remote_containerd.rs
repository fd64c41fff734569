//! The remote backend against a real containerd (Debian's `containerd` package, with `runc`):
//! a private containerd (own config, root, state and socket in a temp dir; CRI plugin with
//! `restrict_oom_score_adj`, cgroups on, CNI pointing at empty dirs) is driven through
//! `RemoteRuntime`: version negotiation, status, images imported with `ctr`, and a hostNetwork
//! pod whose sandbox image is the project's busybox re-tagged with a long-running command (no
//! registry, so no real pause image), running a container to its exit code and an exec. Needs
//! root and containerd; skips loudly otherwise.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::containerd::{Containerd, PAUSE, find, pause_archive};
use common::*;
use runtime::remote::{self, RemoteRuntime};
use runtime::{ImageService, RuntimeService, cri};

async fn wait_exited(rt: &RemoteRuntime, id: &str) -> cri::ContainerStatus {
    wait_exited_on(rt, id).await
}

async fn create_and_start(
    rt: &RemoteRuntime,
    sandbox: &(String, cri::PodSandboxConfig),
    name: &str,
    cmd: &[&str],
) -> String {
    start_container_on(rt, sandbox, container_config(name, cmd)).await
}

#[tokio::test(flavor = "multi_thread")]
async fn remote_runtime_drives_a_real_containerd() {
    if !root_or_skip("remote_runtime_drives_a_real_containerd") {
        return;
    }
    let (Some(bin), Some(_)) = (find("containerd"), find("ctr")) else {
        eprintln!("SKIP (needs containerd): install Debian's containerd and runc packages");
        return;
    };
    let began = Instant::now();
    let mut ctd = Containerd::start(&bin);
    ctd.wait_listening().await;
    let rt = remote::connect(&ctd.endpoint(), Duration::from_secs(20))
        .await
        .expect("connect to containerd");
    let v = rt.version_info().clone();
    eprintln!("containerd: {v:?}");
    assert_eq!(
        (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
        ("containerd", "v1")
    );
    let conditions = rt
        .status(Default::default())
        .await
        .unwrap()
        .status
        .unwrap()
        .conditions;
    let ready = |t: &str| conditions.iter().any(|c| c.r#type == t && c.status);
    assert!(ready("RuntimeReady"), "{conditions:?}");
    // No CNI config: the node network is not ready, which hostNetwork pods do not need.
    assert!(!ready("NetworkReady"), "{conditions:?}");
    // Optional RPCs: answered, or Unimplemented by an older containerd (1.6 has neither).
    match rt.runtime_config(Default::default()).await {
        Ok(rc) => eprintln!("RuntimeConfig: {rc:?}"),
        Err(e) => assert_eq!(e.code(), runtime::Code::Unimplemented, "{e}"),
    }
    match rt.get_container_events(Default::default()).await {
        Ok(_) => eprintln!("GetContainerEvents: streaming"),
        Err(e) => assert_eq!(e.code(), runtime::Code::Unimplemented, "{e}"),
    }

    // Images, imported with ctr (no registry here).
    assert!(
        rt.list_images(Default::default())
            .await
            .unwrap()
            .images
            .is_empty()
    );
    let work = tempfile::tempdir().unwrap();
    let pause = work.path().join("pause.tar");
    pause_archive(&busybox_archive(), &pause);
    ctd.ctr(&["images", "import", busybox_archive().to_str().unwrap()]);
    ctd.ctr(&["images", "import", pause.to_str().unwrap()]);
    let images = rt.list_images(Default::default()).await.unwrap().images;
    for name in [BUSYBOX, PAUSE] {
        assert!(
            images.iter().any(|i| i.repo_tags.iter().any(|t| t == name)),
            "{name}: {images:?}"
        );
    }
    let spec = |image: &str| cri::ImageSpec {
        image: image.into(),
        ..Default::default()
    };
    let st = rt
        .image_status(cri::ImageStatusRequest {
            image: Some(spec(BUSYBOX)),
            verbose: false,
        })
        .await
        .unwrap();
    assert!(st.image.is_some());
    let fs = rt.image_fs_info(Default::default()).await.unwrap();
    assert!(!fs.image_filesystems.is_empty());

    // A hostNetwork pod: a container runs to its exit code, another takes an exec.
    let logs = work.path().join("logs");
    let mut cfg = sandbox_config("ctd", &logs);
    // A hostNetwork pod shares the node's UTS namespace: no hostname of its own (as the kubelet
    // sends it; runc refuses to set one).
    cfg.hostname = String::new();
    cfg.linux = Some(cri::LinuxPodSandboxConfig {
        security_context: Some(cri::LinuxSandboxSecurityContext {
            namespace_options: Some(cri::NamespaceOption {
                network: cri::NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let run = cri::RunPodSandboxRequest {
        config: Some(cfg.clone()),
        runtime_handler: String::new(),
    };
    let sb_id = match rt.run_pod_sandbox(run).await {
        Ok(r) => r.pod_sandbox_id,
        Err(e) => panic!("RunPodSandbox: {e}\n{}", ctd.log()),
    };
    let sb = (sb_id.clone(), cfg);
    let exiter = create_and_start(&rt, &sb, "exiter", &["sh", "-c", "echo hi; exit 3"]).await;
    let s = wait_exited(&rt, &exiter).await;
    assert_eq!(s.exit_code, 3);
    assert_eq!(log_output(Path::new(&s.log_path)).0, "hi\n");
    let sleeper = create_and_start(&rt, &sb, "sleeper", &["sleep", "3600"]).await;
    let r = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: sleeper.clone(),
            cmd: vec!["sh".into(), "-c".into(), "echo hello; exit 4".into()],
            timeout: 10,
        })
        .await
        .expect("ExecSync");
    assert_eq!((r.stdout.as_slice(), r.exit_code), (&b"hello\n"[..], 4));
    let unknown = cri::ContainerStatusRequest {
        container_id: "does-not-exist".into(),
        verbose: false,
    };
    let err = rt.container_status(unknown).await.unwrap_err();
    assert_eq!(err.code(), runtime::Code::NotFound, "{err}");

    let stop = cri::StopPodSandboxRequest {
        pod_sandbox_id: sb_id.clone(),
    };
    rt.stop_pod_sandbox(stop).await.expect("StopPodSandbox");
    let remove = cri::RemovePodSandboxRequest {
        pod_sandbox_id: sb_id,
    };
    rt.remove_pod_sandbox(remove)
        .await
        .expect("RemovePodSandbox");
    let left = rt
        .list_containers(Default::default())
        .await
        .unwrap()
        .containers;
    assert!(left.is_empty(), "{left:?}");
    assert!(
        rt.list_pod_sandbox(Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    // containerd, its shims and its mounts go with it.
    let dir = ctd.dir().to_string_lossy().into_owned();
    drop(ctd);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&dir), "mounts left under {dir}");
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        assert!(!cmdline.contains(&dir), "process left: {cmdline}");
    }
    eprintln!("containerd test took {:?}", began.elapsed());
}
