//! A full disk under the built-in runtime: its root dir on a small tmpfs, filled up while a
//! container writes its log. Creating a container, importing and pulling an image fail with a clear
//! error and leave nothing half-written; the running container is unharmed (it runs on, its
//! log holds only whole records, exec works); once there is room again, its log goes on and
//! new containers start.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::containerd::registry;
use common::*;
use runtime::builtin::BuiltinRuntime;
use runtime::{ImageService, RuntimeService, cri};

/// A tmpfs of `size` at a fresh dir, unmounted (lazily) when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn new(size: &str) -> Tmpfs {
        let dir = tempfile::Builder::new()
            .prefix("nl")
            .tempdir()
            .expect("tempdir");
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(st.success(), "mounting a tmpfs");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .args(["-l"])
            .arg(self.dir.path())
            .status();
    }
}

/// Fills the filesystem of `path` up with a file there; returns the file.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    let chunk = vec![0x5au8; 64 * 1024];
    loop {
        if f.write_all(&chunk).is_err() {
            break;
        }
    }
    // Then the last few bytes a page leaves.
    while f.write_all(&[0x5a]).is_ok() {}
    path
}

/// Every file under `dir`, relative.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p.clone());
            }
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_disk_fails_requests_cleanly_and_running_containers_go_on() {
    if !root_or_skip("a_full_disk_fails_requests_cleanly_and_running_containers_go_on") {
        return;
    }
    let Some(reg) = registry::start_registry() else {
        return;
    };
    let client = registry::push_client(&reg.host);
    registry::push_archive(
        &client,
        &grpc_health_archive(),
        &reg.host,
        "nodelet/grpc-health",
        "1",
    )
    .await;
    let disk = Tmpfs::new("96m");
    let root = disk.path().join("root");
    let cgroup_root = format!("/nodelet-e2e-full-{}", std::process::id());
    let mut cfg = config(&root, &cgroup_root);
    cfg.registry.insecure = vec![reg.host.clone()];
    let rt = BuiltinRuntime::new(cfg).await.expect("runtime");
    rt.image_store()
        .import(&busybox_archive())
        .expect("import busybox");
    let logs = root.join("logs");
    let pod = run_sandbox_on(&rt, "full", &logs).await;
    let chatty = start_container_on(
        &rt,
        &pod,
        container_config(
            "chatty",
            &[
                "sh",
                "-c",
                "i=0; while true; do echo line $i; i=$((i+1)); sleep 0.01; done",
            ],
        ),
    )
    .await;
    let log = logs.join("full/chatty/0.log");
    settle(|| std::fs::metadata(&log).is_ok_and(|m| m.len() > 0)).await;

    let filler = fill(disk.path());
    let cri_files = files(&root.join("cri"));
    let images_before = rt.image_store().list().expect("list");
    let store_files = files(&root.join("images"));

    // Creating a container: a clear error, nothing of it kept.
    let err = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.0.clone(),
            config: Some(container_config("late", &["true"])),
            sandbox_config: Some(pod.1.clone()),
        })
        .await
        .expect_err("CreateContainer on a full disk");
    assert!(err.to_string().contains("No space left on device"), "{err}");
    let listed = rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .expect("list")
        .containers;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(files(&root.join("cri")), cri_files);
    // Importing an image: the same.
    let err = rt
        .image_store()
        .import(&grpc_health_archive())
        .expect_err("import on a full disk");
    assert!(err.to_string().contains("No space left on device"), "{err}");
    assert_eq!(rt.image_store().list().expect("list"), images_before);
    assert_eq!(files(&root.join("images")), store_files);
    // Pulling it: the same.
    let err = rt
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: format!("{}/nodelet/grpc-health:1", reg.host),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        })
        .await
        .expect_err("pull on a full disk");
    assert!(err.to_string().contains("No space left on device"), "{err}");
    assert_eq!(rt.image_store().list().expect("list"), images_before);
    assert_eq!(files(&root.join("images")), store_files);

    // The running container is unharmed: it runs, exec works, its log holds whole records.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: chatty.clone(),
            verbose: false,
        })
        .await
        .expect("status")
        .status
        .expect("status");
    assert_eq!(status.state, cri::ContainerState::ContainerRunning as i32);
    let out = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: chatty.clone(),
            cmd: vec!["echo".into(), "still here".into()],
            timeout: 20,
        })
        .await
        .unwrap_or_else(|e| {
            let log = std::fs::read_to_string(
                state_dir(&root)
                    .join("sandboxes")
                    .join(&pod.0)
                    .join("sandbox.log"),
            );
            panic!("ExecSync: {e}\nsandbox log: {log:?}")
        });
    assert_eq!(String::from_utf8_lossy(&out.stdout), "still here\n");
    let text = std::fs::read(&log).expect("log");
    assert_eq!(text.last(), Some(&b'\n'), "a torn record in the log");
    let count = |records: &[(String, String, String)]| records.len();
    let before = log_records(&log);
    assert!(
        before
            .iter()
            .all(|(s, t, c)| s == "stdout" && t == "F" && c.starts_with("line "))
    );

    // Room again: the log goes on, containers start.
    std::fs::remove_file(&filler).expect("removing the filler");
    settle(|| count(&log_records(&log)) > count(&before) + 5).await;
    assert!(
        count(&log_records(&log)) > count(&before) + 5,
        "the log stalled"
    );
    let late = start_container_on(&rt, &pod, container_config("late", &["true"])).await;
    wait_exited_on(&rt, &late).await;

    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: pod.0.clone(),
    })
    .await
    .expect("RemovePodSandbox");
    remove_cgroup_root(&cgroup_root);
    assert_no_leaks(&root, &cgroup_root);
}
