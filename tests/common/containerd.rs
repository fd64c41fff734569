//! A private containerd for tests and benchmarks (Debian's `containerd` package, with `runc`):
//! own config, root, state and socket in a temp dir; CRI plugin with `restrict_oom_score_adj`
//! and cgroups on.
//!
//! - **Images**: a docker-registry of its own on 127.0.0.1 (Debian's `docker-registry`) serves
//!   the project's busybox as [`BUSYBOX`] and a sandbox ("pause") image, [`PAUSE`]: busybox
//!   re-tagged with a long-running command ([`pause_archive`]). containerd's registry hosts dir
//!   (`config_path`, one `hosts.toml` per registry name) points `docker.io`, `registry.k8s.io`
//!   and every other name at that registry and nowhere else, so CRI `PullImage` and the
//!   sandbox-image pull happen through a real registry and never leave the machine.
//! - **Pod network**: with Debian's `containernetworking-plugins` in [`CNI_BIN_DIR`], a CNI
//!   conflist of bridge (host-local IPAM) + portmap on a /24 of its own in [`POD_RANGE`] and a
//!   bridge `ctdt<N>` of its own, claimed at start so parallel test binaries never share one;
//!   no masquerade (nothing leaves the machine). Without the plugins, containerd has no CNI
//!   config, reports NetworkReady=false and runs hostNetwork pods only
//!   ([`Containerd::has_pod_network`] says which).
//!
//! Dropping a [`Containerd`] kills it, its shims and their processes, unmounts what it left,
//! deletes its bridge and any portmap rules of its network left by pods it did not remove, and
//! stops its registry.
//!
//! Self-contained (no use of the rest of `tests/common`), so a benchmark can include it with
//! `#[path = "../tests/common/containerd.rs"] mod containerd;`.
#![allow(dead_code)]

/// Debian's docker-registry on a free local port, and pushing to it (shared with the images
/// crate's tests and `tests/builtin_pull.rs`).
#[path = "../../images/tests/common/mod.rs"]
pub mod registry;

use std::io::Read;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use sha2::Digest;

/// The project's busybox, as the registry serves it under `docker.io`.
pub const BUSYBOX: &str = "docker.io/library/busybox:latest";
/// The sandbox ("pause") image: busybox whose command sleeps instead of exiting, served under
/// `registry.k8s.io` (a tag of our own: it is not the upstream pause image).
pub const PAUSE: &str = "registry.k8s.io/pause:nodelet-busybox";
/// Where Debian's `containernetworking-plugins` installs the plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The plugins the pod network needs (containerd adds the loopback network itself).
const CNI_PLUGINS: [&str; 4] = ["bridge", "host-local", "portmap", "loopback"];
/// The private range the pod networks are cut from, one /24 (`10.222.<N>.0/24`) per instance.
pub const POD_RANGE: &str = "10.222.0.0/16";
const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

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

/// The containerd binary, or what this machine lacks to run [`Containerd`] (for a SKIP line).
pub fn prerequisites() -> Result<PathBuf, String> {
    let Some(bin) = find("containerd") else {
        return Err(
            "needs containerd: install Debian's containerd and runc, or run \
                    scripts/setup.sh"
                .into(),
        );
    };
    if find("runc").is_none() {
        return Err("needs runc: run scripts/setup.sh".into());
    }
    if !Path::new(REGISTRY_BIN).is_file() {
        return Err(format!(
            "needs {REGISTRY_BIN} to serve containerd's images: run scripts/setup.sh"
        ));
    }
    Ok(bin)
}

/// The pod network of one [`Containerd`]: its bridge and /24.
#[derive(Debug, Clone)]
pub struct PodNetwork {
    /// The CNI network name (in portmap's rule comments).
    pub name: String,
    /// The bridge, created at claim time and deleted on drop.
    pub bridge: String,
    /// `10.222.<N>.0`, a /24.
    pub subnet: Ipv4Addr,
    /// The bridge's address, `10.222.<N>.1`: the host's side of the network.
    pub gateway: Ipv4Addr,
}

impl PodNetwork {
    /// Whether `ip` is in this network's /24.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        ip.octets()[..3] == self.subnet.octets()[..3]
    }

    /// Claims a free /24 of [`POD_RANGE`] by creating its bridge `ctdt<N>`: `ip link add`
    /// fails when another instance (in this or another process) holds that name, so the
    /// kernel arbitrates. Skips any `N` whose /24 already has an address on this machine.
    fn claim() -> Option<PodNetwork> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let ip = find("ip")?;
        let addrs = Command::new(&ip).args(["-o", "-4", "addr"]).output().ok()?;
        let addrs = String::from_utf8_lossy(&addrs.stdout).into_owned();
        let first = std::process::id().wrapping_mul(37);
        for _ in 0..256 {
            let n = (first.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed)) % 256) as u8;
            if addrs.contains(&format!(" 10.222.{n}.")) {
                continue;
            }
            let bridge = format!("ctdt{n}");
            let created = Command::new(&ip)
                .args(["link", "add", &bridge, "type", "bridge"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if created {
                return Some(PodNetwork {
                    name: format!("nodelet-test-{bridge}"),
                    bridge,
                    subnet: Ipv4Addr::new(10, 222, n, 0),
                    gateway: Ipv4Addr::new(10, 222, n, 1),
                });
            }
        }
        None
    }

    /// The CNI conflist: bridge (gateway on the bridge, no masquerade) with host-local IPAM
    /// keeping its state under `ipam_dir`, then portmap for hostPorts.
    fn conflist(&self, ipam_dir: &Path) -> serde_json::Value {
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": self.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{
                            "subnet": format!("{}/24", self.subnet),
                            "gateway": self.gateway.to_string(),
                        }]],
                        "dataDir": ipam_dir,
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        })
    }

    /// Removes portmap's rules for this network's pods (a pod removed through CRI takes its own
    /// with it; these are what a failed test left), then the bridge.
    fn remove(&self) {
        remove_portmap_rules(&self.name);
        if let Some(ip) = find("ip") {
            let _ = Command::new(ip)
                .args(["link", "del", &self.bridge])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Deletes, in one `iptables-restore --noflush`, portmap's per-pod DNAT rules whose comment
/// names `network` and the per-pod chains they jump to. The shared `CNI-HOSTPORT-*` chains stay:
/// other networks on this machine may use them.
fn remove_portmap_rules(network: &str) {
    let (Some(save), Some(restore)) = (find("iptables-save"), find("iptables-restore")) else {
        return;
    };
    let Ok(out) = Command::new(save).args(["-t", "nat"]).output() else {
        return;
    };
    let rules = String::from_utf8_lossy(&out.stdout);
    let tag = format!("name: \\\"{network}\\\"");
    let mut script = String::from("*nat\n");
    let mut chains = Vec::new();
    for rule in rules.lines().filter(|l| l.contains(&tag)) {
        let Some(spec) = rule.strip_prefix("-A ") else {
            continue;
        };
        script += &format!("-D {spec}\n");
        if let Some(chain) = spec.rsplit_once(" -j ").map(|(_, c)| c.trim())
            && chain.starts_with("CNI-DN-")
        {
            chains.push(chain.to_string());
        }
    }
    if script == "*nat\n" {
        return;
    }
    for chain in &chains {
        script += &format!("-F {chain}\n-X {chain}\n");
    }
    script += "COMMIT\n";
    let child = Command::new(restore)
        .arg("--noflush")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn();
    if let Ok(mut child) = child {
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write;
            let _ = stdin.write_all(script.as_bytes());
        }
        let _ = child.wait();
    }
}

/// A private containerd; killed, with its shims and mounts, when dropped.
pub struct Containerd {
    child: Child,
    network: Option<PodNetwork>,
    registry: registry::Registry,
    dir: tempfile::TempDir,
}

impl Containerd {
    /// Starts the registry and pushes [`BUSYBOX`] (from the OCI archive `busybox`) and
    /// [`PAUSE`] to it, claims a pod network when the CNI plugins are there, then starts
    /// containerd and waits until its CRI service answers. Nothing is pulled yet: see
    /// [`Containerd::pull`]. Check [`prerequisites`] first.
    pub async fn start(bin: &Path, busybox: &Path) -> Containerd {
        Self::start_with_root(bin, busybox, None).await
    }

    /// As [`Containerd::start`], its root dir (the content store and the snapshots: the
    /// image filesystem) on a tmpfs of `root_size` (`"96m"`) of its own when given, unmounted
    /// with the rest when dropped.
    pub async fn start_with_root(
        bin: &Path,
        busybox: &Path,
        root_size: Option<&str>,
    ) -> Containerd {
        let dir = tempfile::Builder::new().prefix("ctd").tempdir().unwrap();
        if let Some(size) = root_size {
            let root = dir.path().join("root");
            std::fs::create_dir(&root).unwrap();
            // (nix directly: benches include this file without the tests' common module.)
            nix::mount::mount(
                Some("tmpfs"),
                &root,
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                Some(format!("size={size}").as_str()),
            )
            .expect("mounting a tmpfs on containerd's root");
        }
        let reg = registry::start_registry().expect("docker-registry (see prerequisites())");
        let pause = dir.path().join("pause.tar");
        pause_archive(busybox, &pause);
        let client = registry::push_client(&reg.host);
        for (archive, image) in [(busybox, BUSYBOX), (pause.as_path(), PAUSE)] {
            let (repo, tag) = repo_and_tag(image);
            registry::push_archive(&client, archive, &reg.host, repo, tag).await;
        }
        let d = dir.path().display();

        // Every registry name resolves to the local registry only: the `server` replaces the
        // upstream host (plain HTTP by its scheme), and the one `host` entry is the same
        // registry: containerd 1.6 rejects a hosts.toml without a `host` table ("invalid `host`
        // tree") and then falls back to the upstream host. `_default` covers names without a
        // dir of their own. (The older `registry.mirrors` config would always append the
        // upstream host after the mirror, so a miss would go to the internet.)
        let server = format!("http://{}", reg.host);
        for name in ["docker.io", "registry.k8s.io", "_default"] {
            let hosts = dir.path().join("certs.d").join(name);
            std::fs::create_dir_all(&hosts).unwrap();
            let toml = format!(
                "server = \"{server}\"\n\n[host.\"{server}\"]\n  \
                 capabilities = [\"pull\", \"resolve\"]\n"
            );
            std::fs::write(hosts.join("hosts.toml"), toml).unwrap();
        }

        let plugins_present = CNI_PLUGINS
            .iter()
            .all(|p| Path::new(CNI_BIN_DIR).join(p).is_file());
        let network = if plugins_present {
            let network = PodNetwork::claim();
            if network.is_none() {
                eprintln!("NOTE: no free bridge/subnet in {POD_RANGE}: hostNetwork pods only");
            }
            network
        } else {
            eprintln!(
                "NOTE: no CNI plugins in {CNI_BIN_DIR} (Debian's containernetworking-plugins): \
                 containerd runs hostNetwork pods only"
            );
            None
        };
        let conf_dir = dir.path().join("cni/conf");
        std::fs::create_dir_all(&conf_dir).unwrap();
        let bin_dir = match &network {
            Some(net) => {
                let list = net.conflist(&dir.path().join("cni/ipam"));
                std::fs::write(
                    conf_dir.join("10-nodelet-test.conflist"),
                    serde_json::to_vec_pretty(&list).unwrap(),
                )
                .unwrap();
                CNI_BIN_DIR.to_string()
            }
            None => format!("{d}/cni/bin"),
        };

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
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{bin_dir}"
    conf_dir = "{}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{d}/certs.d"
"#,
            conf_dir.display()
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
        let mut ctd = Containerd {
            child,
            network,
            registry: reg,
            dir,
        };
        ctd.wait_ready().await;
        ctd
    }

    /// Whether pods get a network of their own (CNI bridge); otherwise hostNetwork only.
    pub fn has_pod_network(&self) -> bool {
        self.network.is_some()
    }

    pub fn pod_network(&self) -> Option<&PodNetwork> {
        self.network.as_ref()
    }

    /// The local registry (`127.0.0.1:<port>`) containerd pulls every image from.
    pub fn registry_host(&self) -> &str {
        &self.registry.host
    }

    /// Pulls `image` through CRI `PullImage` (from the local registry); returns its image ref.
    pub async fn pull(&self, images: &dyn runtime::ImageService, image: &str) -> String {
        let req = runtime::cri::PullImageRequest {
            image: Some(runtime::cri::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        match images.pull_image(req).await {
            Ok(r) => r.image_ref,
            Err(e) => panic!("PullImage {image}: {e}\n{}", self.log()),
        }
    }

    /// Pushes the OCI archive `archive` to the local registry as `image` (a `docker.io` name)
    /// and pulls it through CRI.
    pub async fn add_image(&self, images: &dyn runtime::ImageService, archive: &Path, image: &str) {
        let (repo, tag) = repo_and_tag(image);
        let client = registry::push_client(&self.registry.host);
        registry::push_archive(&client, archive, &self.registry.host, repo, tag).await;
        self.pull(images, image).await;
    }

    /// Pulls [`BUSYBOX`] and the sandbox image [`PAUSE`], as a node is set up.
    pub async fn pull_all(&self, images: &dyn runtime::ImageService) {
        for image in [BUSYBOX, PAUSE] {
            self.pull(images, image).await;
        }
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

    /// Waits until the CRI service answers `Version`: containerd listens on its socket before
    /// its CRI plugin is initialized, and answers "server is not initialized yet" meanwhile.
    async fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            let err = match runtime::remote::connect(&self.endpoint(), Duration::from_secs(5)).await
            {
                Ok(_) => return,
                Err(e) => e,
            };
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("containerd exited with {st}:\n{}", self.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "containerd's CRI service not ready: {err}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // What pods are left (a failed test): their processes outlive containerd and the shims
        // (the pods' PID-1s hold their network namespaces, and with them the veths).
        let tasks = self.tasks();
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
        for (pid, _) in &tasks {
            let _ = Command::new("kill").args(["-KILL", pid]).status();
        }
        // Shims outlive containerd; they name its socket on their command line.
        let dir = self.dir.path().to_string_lossy().into_owned();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&dir) {
                let pid = entry.file_name().to_string_lossy().into_owned();
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
        }
        // Rootfs mounts and the pods' network namespaces (under the state dir).
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for m in mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.contains(&dir))
        {
            let _ = Command::new("umount").args(["-l", m]).status();
        }
        if let Some(net) = &self.network {
            net.remove();
        }
        // The tasks' cgroups, once their processes are gone.
        let start = Instant::now();
        for (pid, cgroups) in &tasks {
            while Path::new("/proc").join(pid).exists() && start.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            for cg in cgroups {
                let _ = std::fs::remove_dir(cg);
            }
        }
    }
}

impl Containerd {
    /// The init process of each task (pod sandbox or container) its shims run, from the
    /// bundle dirs' `init.pid`, with the task's cgroup dirs: (pid, cgroup dirs). Only a process
    /// whose cgroup path names the task id counts (the pid was not reused).
    fn tasks(&self) -> Vec<(String, Vec<PathBuf>)> {
        let root = self.dir.path().join("state/io.containerd.runtime.v2.task");
        let bundles = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|ns| std::fs::read_dir(ns.path()).into_iter().flatten().flatten());
        let mut tasks = Vec::new();
        for bundle in bundles {
            let id = bundle.file_name().to_string_lossy().into_owned();
            let Ok(pid) = std::fs::read_to_string(bundle.path().join("init.pid")) else {
                continue;
            };
            let pid = pid.trim().to_string();
            if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let cgroup = std::fs::read_to_string(Path::new("/proc").join(&pid).join("cgroup"));
            let cgroup = cgroup.unwrap_or_default();
            if !cgroup.contains(&id) {
                continue;
            }
            // "N:controllers:/path" (v1; "name=systemd" is mounted as "systemd") or "0::/path".
            let dirs = cgroup
                .lines()
                .filter_map(|l| {
                    let mut f = l.splitn(3, ':');
                    let (_, ctrl, path) = (f.next()?, f.next()?, f.next()?);
                    let ctrl = ctrl.trim_start_matches("name=");
                    let path = path.trim_start_matches('/');
                    Some(Path::new("/sys/fs/cgroup").join(ctrl).join(path))
                })
                .collect();
            tasks.push((pid, dirs));
        }
        tasks
    }
}

/// `docker.io/library/busybox:latest` → (`library/busybox`, `latest`).
fn repo_and_tag(image: &str) -> (&str, &str) {
    let path = image.split_once('/').map_or(image, |(_, p)| p);
    path.rsplit_once(':').unwrap_or((path, "latest"))
}

/// Writes the busybox archive re-tagged as [`PAUSE`] with `sleep` as its command.
pub fn pause_archive(busybox: &Path, out: &Path) {
    retagged_archive(busybox, out, PAUSE, &["sleep", "86400"]);
}

/// Writes the busybox OCI archive re-tagged as `name` with `cmd` as its command (so a new
/// config, manifest and image id; the layer is busybox's).
pub fn retagged_archive(busybox: &Path, out: &Path, name: &str, cmd: &[&str]) {
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
    config["config"]["Cmd"] = serde_json::json!(cmd);
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
    index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"] = name.into();
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
