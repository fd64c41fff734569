//! A private containerd for tests and benchmarks (Debian's `containerd` package, with `runc`):
//! own config, root, state and socket in a temp dir; CRI plugin with `restrict_oom_score_adj`,
//! cgroups on, and CNI pointing at empty dirs (no pod network: hostNetwork pods only). Its
//! sandbox ("pause") image is the project's busybox re-tagged with a long-running command
//! ([`pause_archive`]), since there is no registry. Dropping a [`Containerd`] kills it, its shims
//! and their processes, and unmounts what it left.
//!
//! Self-contained (no use of the rest of `tests/common`), so a benchmark can include it with
//! `#[path = "../tests/common/containerd.rs"] mod containerd;`.
#![allow(dead_code)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sha2::Digest;

/// The sandbox ("pause") image: busybox whose command sleeps instead of exiting.
pub const PAUSE: &str = "nodelet.test/pause:busybox";

pub fn find(program: &str) -> Option<PathBuf> {
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
pub struct Containerd {
    child: Child,
    dir: tempfile::TempDir,
}

impl Containerd {
    pub fn start(bin: &Path) -> Containerd {
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

    /// The temp dir holding its config, root, state, socket and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The containerd process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The CRI endpoint, for `runtime::remote::connect`.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket().display())
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    pub fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.path().join("containerd.log"));
        let log = log.unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    pub async fn wait_listening(&mut self) {
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

    pub fn ctr(&self, args: &[&str]) {
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
pub fn pause_archive(busybox: &Path, out: &Path) {
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
