//! The remote backend against a real containerd (Debian's `containerd` package, with `runc`):
//! a private containerd (own config, root, state and socket in a temp dir; CRI plugin with
//! `restrict_oom_score_adj`, cgroups on, CNI pointing at empty dirs) is driven through
//! `RemoteRuntime`: version negotiation, status, images imported with `ctr`, and a hostNetwork
//! pod whose sandbox image is the project's busybox re-tagged with a long-running command (no
//! registry, so no real pause image), running a container to its exit code and an exec. Needs
//! root and containerd; skips loudly otherwise.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use runtime::remote::{self, RemoteRuntime};
use runtime::{ImageService, RuntimeService, cri};
use sha2::Digest;

/// The sandbox ("pause") image: busybox whose command sleeps instead of exiting.
const PAUSE: &str = "nodelet.test/pause:busybox";

fn find(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([
            "/usr/sbin".into(),
            "/usr/bin".into(),
            "/usr/local/bin".into(),
        ])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// A private containerd; killed, with its shims and mounts, when dropped.
struct Containerd {
    child: Child,
    dir: tempfile::TempDir,
}

impl Containerd {
    fn start(bin: &Path) -> Containerd {
        let dir = tempfile::Builder::new().prefix("ctd").tempdir().unwrap();
        let d = dir.path().display();
        let config = format!(
            r#"version = 2
root = "{d}/root"
state = "{d}/state"
disabled_plugins = ["io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{d}/containerd.sock"
[ttrpc]
  address = "{d}/containerd.sock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  restrict_oom_score_adj = true
  disable_cgroup = false
  sandbox_image = "{PAUSE}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{d}/cni/bin"
    conf_dir = "{d}/cni/conf"
"#
        );
        std::fs::write(dir.path().join("config.toml"), config).unwrap();
        let log = std::fs::File::create(dir.path().join("containerd.log")).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(dir.path().join("config.toml"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn containerd");
        Containerd { child, dir }
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("containerd.log"));
        let log = log.unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    async fn wait_listening(&mut self) {
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(self.socket()).is_err() {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("containerd exited with {st}:\n{}", self.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "containerd not listening"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn ctr(&self, args: &[&str]) {
        let out = Command::new(find("ctr").expect("ctr"))
            .arg("--address")
            .arg(self.socket())
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ctr {args:?}: {err}");
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let start = Instant::now();
        while matches!(self.child.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(5)
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Shims outlive containerd; they name its socket on their command line.
        let dir = self.dir.path().to_string_lossy().into_owned();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&dir) {
                let pid = entry.file_name().to_string_lossy().into_owned();
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for m in mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.contains(&dir))
        {
            let _ = Command::new("umount").args(["-l", m]).status();
        }
    }
}

/// Writes the busybox archive re-tagged as [`PAUSE`] with `sleep` as its command.
fn pause_archive(busybox: &Path, out: &Path) {
    let mut blobs = std::collections::BTreeMap::new();
    let mut archive = tar::Archive::new(std::fs::File::open(busybox).unwrap());
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.header().entry_type().is_file() {
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            blobs.insert(entry.path().unwrap().to_string_lossy().into_owned(), data);
        }
    }
    let blob = |digest: &serde_json::Value| {
        let hex = digest.as_str().unwrap().trim_start_matches("sha256:");
        format!("blobs/sha256/{hex}")
    };
    let mut index: serde_json::Value = serde_json::from_slice(&blobs["index.json"]).unwrap();
    let manifest_path = blob(&index["manifests"][0]["digest"]);
    let mut manifest: serde_json::Value = serde_json::from_slice(&blobs[&manifest_path]).unwrap();
    let config_path = blob(&manifest["config"]["digest"]);
    let mut config: serde_json::Value = serde_json::from_slice(&blobs[&config_path]).unwrap();
    config["config"]["Cmd"] = serde_json::json!(["sleep", "86400"]);
    let mut put = |value: &serde_json::Value, old: &str| {
        let data = serde_json::to_vec(value).unwrap();
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&data)));
        blobs.remove(old);
        blobs.insert(blob(&serde_json::json!(digest)), data.clone());
        (digest, data.len())
    };
    let (digest, size) = put(&config, &config_path);
    manifest["config"]["digest"] = digest.into();
    manifest["config"]["size"] = size.into();
    let (digest, size) = put(&manifest, &manifest_path);
    index["manifests"][0]["digest"] = digest.into();
    index["manifests"][0]["size"] = size.into();
    index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] = PAUSE.into();
    blobs.insert("index.json".into(), serde_json::to_vec(&index).unwrap());
    let mut builder = tar::Builder::new(std::fs::File::create(out).unwrap());
    for (path, data) in &blobs {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, path, data.as_slice())
            .unwrap();
    }
    builder.finish().unwrap();
}

async fn wait_exited(rt: &RemoteRuntime, id: &str) -> cri::ContainerStatus {
    for _ in 0..200 {
        let req = cri::ContainerStatusRequest {
            container_id: id.into(),
            verbose: false,
        };
        let s = rt.container_status(req).await.unwrap().status.unwrap();
        if s.state == cri::ContainerState::ContainerExited as i32 {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("container {id} did not exit");
}

async fn create_and_start(
    rt: &RemoteRuntime,
    sandbox: &(String, cri::PodSandboxConfig),
    name: &str,
    cmd: &[&str],
) -> String {
    let id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.0.clone(),
            config: Some(container_config(name, cmd)),
            sandbox_config: Some(sandbox.1.clone()),
        })
        .await
        .expect("CreateContainer")
        .container_id;
    let start = cri::StartContainerRequest {
        container_id: id.clone(),
    };
    rt.start_container(start).await.expect("StartContainer");
    id
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
    let endpoint = format!("unix://{}", ctd.socket().display());
    let rt = remote::connect(&endpoint, Duration::from_secs(20))
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
    let dir = ctd.dir.path().to_string_lossy().into_owned();
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
