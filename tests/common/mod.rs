//! Shared helpers of the end-to-end tests: the root check, a busybox image built from Debian's
//! packages, a built-in runtime in a temp root dir, and CRI request builders. Fixtures of their
//! own: [`api_node`] (the agent with the test API server), [`containerd`], [`cri_serve`] and
//! [`standalone`].
#![allow(dead_code)]

pub mod api_node;
pub mod cni;
pub mod containerd;
pub mod cri_serve;
pub mod reboot;
pub mod standalone;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use runtime::builtin::{BuiltinRuntime, Config};
use runtime::{RuntimeService, cri};

pub const BUSYBOX: &str = "docker.io/library/busybox:latest";

/// True when running as root; otherwise [`skip`]s `test`.
pub fn root_or_skip(test: &str) -> bool {
    if nix_is_root() {
        return true;
    }
    skip("needs root", &format!("{test} runs real containers"));
    false
}

/// Says that `test` cannot run on this machine because of `why`: a loud `SKIP (why): test` line
/// on stderr, and the test passes. Under CI (`CI` set to `true` or `1`, as CI systems do) the
/// test fails with that line instead: CI never passes a test it did not run.
pub fn skip(why: &str, test: &str) {
    let line = format!("SKIP ({why}): {test}");
    if ci() {
        panic!("{line}");
    }
    eprintln!("{line}");
}

/// True when the `CI` environment variable says this is a CI run.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(2) == Some("0"))
        })
        .unwrap_or(false)
}

/// Where a test binary keeps the image archives it builds: under the target dir (cleaned with
/// it), one dir per test process.
fn images_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("nodelet-e2e-{}", std::process::id()))
}

/// The busybox OCI archive, built once per test binary.
pub fn busybox_archive() -> PathBuf {
    static ARCHIVE: OnceLock<PathBuf> = OnceLock::new();
    ARCHIVE
        .get_or_init(|| {
            let dir = images_dir();
            std::fs::create_dir_all(&dir).expect("temp dir");
            let out = dir.join("busybox.tar");
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-busybox-image.sh");
            let st = std::process::Command::new("bash")
                .arg(script)
                .arg(&out)
                .status()
                .expect("running build-busybox-image.sh");
            assert!(st.success(), "building the busybox image failed");
            out
        })
        .clone()
}

/// A built-in runtime in its own root dir and cgroup root, with busybox imported.
pub struct Node {
    pub rt: BuiltinRuntime,
    pub root: tempfile::TempDir,
    pub cgroup_root: String,
    /// The pod network the runtime was opened with (and is reopened with).
    pub network: Option<runtime::builtin::NetworkConfig>,
}

/// The nodelet binary the end-to-end tests run (as the agent and as sandbox processes):
/// `NODELET_BIN` when set, so that CI runs suites on the static build
/// (`scripts/build-static.sh`), else the one cargo built for the tests.
pub fn nodelet_bin() -> PathBuf {
    match std::env::var_os("NODELET_BIN") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(env!("CARGO_BIN_EXE_nodelet")),
    }
}

pub fn config(root: &Path, cgroup_root: &str) -> Config {
    let mut cfg = Config::new(root).expect("config");
    cfg.sandbox_program = nodelet_bin();
    cfg.cgroup_root = cgroup_root.to_string();
    cfg
}

impl Node {
    pub async fn new(name: &str) -> Node {
        Node::with_network(name, |_| {}).await
    }

    /// A node whose runtime's pod network (the default one to start with) `tweak` changed.
    pub async fn with_network(
        name: &str,
        tweak: impl FnOnce(&mut Option<runtime::builtin::NetworkConfig>),
    ) -> Node {
        let root = tempfile::Builder::new()
            .prefix("nl")
            .tempdir()
            .expect("tempdir");
        let cgroup_root = format!("/nodelet-e2e-{name}-{}", std::process::id());
        let mut cfg = config(root.path(), &cgroup_root);
        tweak(&mut cfg.network);
        let network = cfg.network.clone();
        let rt = BuiltinRuntime::new(cfg).await.expect("runtime");
        rt.image_store()
            .import(&busybox_archive())
            .expect("import busybox");
        Node {
            rt,
            root,
            cgroup_root,
            network,
        }
    }

    /// The same node, served by `rt` (a runtime reopened on its root dir) from now on.
    pub fn with_runtime(self, rt: BuiltinRuntime) -> Node {
        Node { rt, ..self }
    }

    /// A fresh runtime over the same root dir, as a restarted agent would open it.
    pub async fn reopen(&self) -> BuiltinRuntime {
        let mut cfg = config(self.root.path(), &self.cgroup_root);
        cfg.network = self.network.clone();
        BuiltinRuntime::new(cfg).await.expect("reopen runtime")
    }

    pub fn log_dir(&self) -> PathBuf {
        self.root.path().join("logs")
    }

    pub async fn sandbox(&self, name: &str) -> (String, cri::PodSandboxConfig) {
        run_sandbox_on(&self.rt, name, &self.log_dir()).await
    }

    pub async fn container(
        &self,
        sandbox: &(String, cri::PodSandboxConfig),
        name: &str,
        cmd: &[&str],
    ) -> String {
        self.container_with(sandbox, container_config(name, cmd))
            .await
    }

    pub async fn container_with(
        &self,
        sandbox: &(String, cri::PodSandboxConfig),
        config: cri::ContainerConfig,
    ) -> String {
        start_container_on(&self.rt, sandbox, config).await
    }

    pub async fn status(&self, id: &str) -> cri::ContainerStatus {
        self.rt
            .container_status(cri::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await
            .expect("ContainerStatus")
            .status
            .expect("status")
    }

    pub async fn wait_exited(&self, id: &str) -> cri::ContainerStatus {
        wait_exited_on(&self.rt, id).await
    }

    pub async fn exec(&self, id: &str, cmd: &[&str]) -> cri::ExecSyncResponse {
        self.rt
            .exec_sync(cri::ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout: 20,
            })
            .await
            .expect("ExecSync")
    }

    /// Stops and removes every sandbox, then checks nothing is left: no mount under the root dir,
    /// no cgroup under the cgroup root, no process of ours.
    pub async fn teardown(self) {
        let list = self
            .rt
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .expect("list");
        for sb in list.items {
            self.rt
                .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                    pod_sandbox_id: sb.id,
                })
                .await
                .expect("RemovePodSandbox");
        }
        remove_cgroup_root(&self.cgroup_root);
        assert_no_leaks(self.root.path(), &self.cgroup_root);
    }
}

/// Removes a cgroup root the tests gave a runtime (v1 controllers and the v2 dir alike).
pub fn remove_cgroup_root(path: &str) {
    let path = path.trim_start_matches('/');
    for ctrl in [
        "memory", "cpu", "cpuacct", "cpuset", "pids", "blkio", "devices", "freezer", "systemd",
        "unified",
    ] {
        let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(ctrl).join(path));
    }
    let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup").join(path));
}

/// The eviction thresholds test nodes run with unless a test sets its own: the tests' dirs share
/// the host's disk, and on a host disk over 85% full upstream's defaults (`imagefs.available`
/// 15%) would put every test node under disk pressure, refusing pods and removing images.
pub const TEST_EVICTION_HARD: &str =
    "evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}\n";
/// Image garbage collection by disk usage off on test nodes unless a test sets it (the same
/// reason).
pub const TEST_IMAGE_GC: &str =
    "imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n";

/// [`TEST_EVICTION_HARD`] and [`TEST_IMAGE_GC`], each unless `config` (a test's own lines) sets
/// its fields.
pub fn test_node_defaults(config: &str) -> String {
    let mut out = String::new();
    if !config.contains("evictionHard") {
        out.push_str(TEST_EVICTION_HARD);
    }
    if !config.contains("imageGCHighThresholdPercent") {
        out.push_str(TEST_IMAGE_GC);
    }
    out
}

/// A kubelet's cgroup root of the test's own (`cgroupRoot`), named after its temp dir so that
/// test nodes running at once never share a `kubepods` tree.
pub fn kubelet_cgroup_root(dir: &Path) -> String {
    let tag = dir.file_name().map(|n| n.to_string_lossy().into_owned());
    format!("/nl-e2e-{}", tag.unwrap_or_default())
}

/// The directory of the cgroup `path` in every mounted hierarchy (each v1 controller, or the
/// unified one).
fn cgroup_dirs(path: &str) -> Vec<PathBuf> {
    let rel = path.trim_start_matches('/');
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.procs").exists() {
        return vec![base.join(rel)];
    }
    std::fs::read_dir(base)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join(rel))
        .collect()
}

/// The pod cgroups (`pod<uid>`) left in the kubelet tree under `cgroup_root`.
pub fn pod_cgroups_left(cgroup_root: &str) -> Vec<String> {
    let memory = Path::new("/sys/fs/cgroup/memory");
    let base = if memory.is_dir() {
        memory
    } else {
        Path::new("/sys/fs/cgroup")
    };
    let kubepods = base
        .join(cgroup_root.trim_start_matches('/'))
        .join("kubepods");
    let mut out = Vec::new();
    for dir in [
        kubepods.clone(),
        kubepods.join("burstable"),
        kubepods.join("besteffort"),
    ] {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("pod") && e.path().is_dir() {
                out.push(e.path().display().to_string());
            }
        }
    }
    out
}

/// Removes the cgroup `path` and everything below it from every hierarchy, killing what still
/// runs there (what a failed test's node left).
pub fn destroy_cgroup_tree(path: &str) {
    fn walk(dir: &Path, pids: &mut Vec<i32>, dirs: &mut Vec<PathBuf>) {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        pids.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if e.path().is_dir() {
                walk(&e.path(), pids, dirs);
            }
        }
        dirs.push(dir.to_path_buf());
    }
    for _ in 0..100 {
        let (mut pids, mut dirs) = (Vec::new(), Vec::new());
        for d in cgroup_dirs(path).iter().filter(|d| d.is_dir()) {
            walk(d, &mut pids, &mut dirs);
        }
        if dirs.is_empty() {
            return;
        }
        for pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(*pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // Children first: `walk` lists each directory after those below it.
        for d in &dirs {
            let _ = std::fs::remove_dir(d);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    eprintln!("NOTE: cgroup {path} could not be removed");
}

/// Checks that no mount and no process mentions `dir` any more.
pub fn assert_nothing_under(dir: &Path) {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let dir_s = dir.to_string_lossy().to_string();
    let leaked: Vec<&str> = mounts.lines().filter(|l| l.contains(&dir_s)).collect();
    assert!(leaked.is_empty(), "mounts left behind: {leaked:?}");
    let mut procs = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("proc").flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        if cmdline.contains(&dir_s) {
            procs.push(cmdline.into_owned());
        }
    }
    assert!(procs.is_empty(), "processes left behind: {procs:?}");
}

/// Every mount point this process sees (field 5 of `/proc/self/mountinfo`, `\040` and friends
/// unescaped).
pub fn mount_points() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("reading mountinfo");
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mount(p)))
        .collect()
}

fn unescape_mount(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &s[i + 1..i + 4];
            if let Ok(v) = u8::from_str_radix(oct, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Mount points at or below `dir`.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    mount_points()
        .into_iter()
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// The built-in runtime's state dir (its default) for root dir `root`: where its sandboxes'
/// state (`sandboxes/<id>`) and its containers' bundles (`containers/<id>`) are.
pub fn state_dir(root: &Path) -> PathBuf {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
    runtime::builtin::default_state_dir(&root)
}

/// The entries of `<state dir of root>/<sub>` (`sandboxes` or `containers`); none if missing.
pub fn state_entries(root: &Path, sub: &str) -> Vec<String> {
    std::fs::read_dir(state_dir(root).join(sub))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Checks that a runtime in `root` under `cgroup_root` left no mount, cgroup or process, and
/// no sandbox state or bundle in its state dir.
pub fn assert_no_leaks(root: &Path, cgroup_root: &str) {
    assert_nothing_under(root);
    assert_nothing_under(&state_dir(root));
    for sub in ["sandboxes", "containers"] {
        let left = state_entries(root, sub);
        assert!(left.is_empty(), "{sub} left in the state dir: {left:?}");
    }
    let left: Vec<String> = ["memory", "pids", "cpu"]
        .iter()
        .map(|ctrl| {
            Path::new("/sys/fs/cgroup")
                .join(ctrl)
                .join(cgroup_root.trim_start_matches('/'))
        })
        .filter(|p| p.exists())
        .map(|p| describe_cgroup_tree(&p))
        .collect();
    assert!(left.is_empty(), "cgroups left behind:\n{}", left.join("\n"));
}

/// The cgroup dirs under `dir` (itself included), each with the processes in it and their
/// command lines: what a leak report needs to say who left it.
fn describe_cgroup_tree(dir: &Path) -> String {
    let mut out = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let procs = std::fs::read_to_string(d.join("cgroup.procs")).unwrap_or_default();
        let procs: Vec<String> = procs
            .split_whitespace()
            .map(|pid| {
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                format!(
                    "{pid} {:?}",
                    String::from_utf8_lossy(&cmd).replace('\0', " ")
                )
            })
            .collect();
        out.push_str(&format!("{} processes {procs:?}\n", d.display()));
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    out
}

/// RunPodSandbox of `sandbox_config(name)` on any CRI runtime; returns the id and the config.
pub async fn run_sandbox_on(
    rt: &dyn RuntimeService,
    name: &str,
    log_dir: &Path,
) -> (String, cri::PodSandboxConfig) {
    let cfg = sandbox_config(name, log_dir);
    let id = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cfg.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox")
        .pod_sandbox_id;
    (id, cfg)
}

/// CreateContainer then StartContainer on any CRI runtime; returns the container id.
pub async fn start_container_on(
    rt: &dyn RuntimeService,
    sandbox: &(String, cri::PodSandboxConfig),
    config: cri::ContainerConfig,
) -> String {
    let id = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.0.clone(),
            config: Some(config),
            sandbox_config: Some(sandbox.1.clone()),
        })
        .await
        .expect("CreateContainer")
        .container_id;
    rt.start_container(cri::StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .expect("StartContainer");
    id
}

/// Polls ContainerStatus on any CRI runtime until the container has exited (15 s at most).
pub async fn wait_exited_on(rt: &dyn RuntimeService, id: &str) -> cri::ContainerStatus {
    for _ in 0..300 {
        let s = rt
            .container_status(cri::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await
            .expect("ContainerStatus")
            .status
            .expect("status");
        if s.state == cri::ContainerState::ContainerExited as i32 {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("container {id} did not exit");
}

/// A child process (usually the nodelet binary) killed and reaped when dropped.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Imports the busybox image into a root dir through `nodelet images import`.
pub fn import_busybox(root: &Path) {
    import_archive(root, &busybox_archive());
}

/// Imports an image archive into a root dir through `nodelet images import`.
pub fn import_archive(root: &Path, archive: &Path) {
    let out = std::process::Command::new(nodelet_bin())
        .arg("--root-dir")
        .arg(root)
        .args(["images", "import"])
        .arg(archive)
        .output()
        .expect("run nodelet images import");
    assert!(out.status.success(), "{out:?}");
}

/// The image of the gRPC probe tests: busybox with the project's gRPC health server
/// (`examples/grpc_health_server.rs`) as `/bin/grpc-health-server`.
pub const GRPC_HEALTH: &str = "docker.io/library/grpc-health:latest";

/// The [`GRPC_HEALTH`] OCI archive, built once per test binary from the example `cargo test`
/// builds beside the tests (`target/<profile>/examples/grpc_health_server`).
pub fn grpc_health_archive() -> PathBuf {
    static ARCHIVE: OnceLock<PathBuf> = OnceLock::new();
    ARCHIVE
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("the test binary's path");
            let server = exe
                .parent()
                .and_then(Path::parent)
                .map(|d| d.join("examples/grpc_health_server"))
                .expect("target dir");
            assert!(
                server.is_file(),
                "{} is missing: `cargo test` builds it with the tests; alone, run                  `cargo build --example grpc_health_server` first",
                server.display()
            );
            let dir = images_dir();
            std::fs::create_dir_all(&dir).expect("temp dir");
            let out = dir.join("grpc-health.tar");
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-busybox-image.sh");
            let st = std::process::Command::new("bash")
                .arg(script)
                .arg(&out)
                .args(["--name", GRPC_HEALTH, "--add"])
                .arg(format!("{}:/bin/grpc-health-server", server.display()))
                .status()
                .expect("running build-busybox-image.sh");
            assert!(st.success(), "building the grpc-health image failed");
            out
        })
        .clone()
}

pub fn sandbox_config(name: &str, log_dir: &Path) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "e2e".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.join(name).to_string_lossy().into_owned(),
        labels: [("app".to_string(), name.to_string())].into(),
        ..Default::default()
    }
}

/// A sandbox config change giving the pod a user namespace of `mode` (CRI `userns_options`)
/// with `ids` as both its UID and GID mappings; for [`Node::sandbox_with`].
pub fn userns_config(
    mode: cri::NamespaceMode,
    ids: Vec<cri::IdMapping>,
) -> impl Fn(&mut cri::PodSandboxConfig) {
    move |c: &mut cri::PodSandboxConfig| {
        c.linux = Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    userns_options: Some(cri::UserNamespace {
                        mode: mode as i32,
                        uids: ids.clone(),
                        gids: ids.clone(),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    }
}

/// One ID mapping of a user namespace.
pub fn id_mapping(container_id: u32, host_id: u32, length: u32) -> cri::IdMapping {
    cri::IdMapping {
        container_id,
        host_id,
        length,
    }
}

pub fn container_config(name: &str, cmd: &[&str]) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: BUSYBOX.into(),
            ..Default::default()
        }),
        command: cmd.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}/0.log"),
        labels: [("container".to_string(), name.to_string())].into(),
        ..Default::default()
    }
}

/// The (stream, tag, content) of each CRI log record in a file.
pub fn log_records(path: &Path) -> Vec<(String, String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let mut it = l.splitn(4, ' ');
            let ts = it.next().unwrap_or("");
            assert!(
                ts.ends_with('Z') && ts.contains('T'),
                "bad timestamp in {l:?}"
            );
            (
                it.next().unwrap_or("").into(),
                it.next().unwrap_or("").into(),
                it.next().unwrap_or("").into(),
            )
        })
        .collect()
}

impl Node {
    /// Runs a pod sandbox from `sandbox_config(name)` after `tweak` changed it.
    pub async fn sandbox_with(
        &self,
        name: &str,
        tweak: impl FnOnce(&mut cri::PodSandboxConfig),
    ) -> (String, cri::PodSandboxConfig) {
        let mut cfg = sandbox_config(name, &self.log_dir());
        tweak(&mut cfg);
        let id = self
            .try_sandbox(cfg.clone())
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}"));
        (id, cfg)
    }

    /// RunPodSandbox, returning its error.
    pub async fn try_sandbox(&self, cfg: cri::PodSandboxConfig) -> runtime::Result<String> {
        self.rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(cfg),
                runtime_handler: String::new(),
            })
            .await
            .map(|r| r.pod_sandbox_id)
    }

    /// CreateContainer only, returning its error.
    pub async fn try_create(
        &self,
        sandbox: &(String, cri::PodSandboxConfig),
        config: cri::ContainerConfig,
    ) -> runtime::Result<String> {
        self.rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox.0.clone(),
                config: Some(config),
                sandbox_config: Some(sandbox.1.clone()),
            })
            .await
            .map(|r| r.container_id)
    }

    /// Creates and starts a container, waits for it to exit and returns its exit code and what
    /// it wrote to stdout and stderr (from its CRI log).
    pub async fn run_to_exit(
        &self,
        sandbox: &(String, cri::PodSandboxConfig),
        config: cri::ContainerConfig,
    ) -> (i32, String, String) {
        let id = self.container_with(sandbox, config).await;
        let s = self.wait_exited(&id).await;
        let (out, err) = log_output(Path::new(&s.log_path));
        (s.exit_code, out, err)
    }
}

/// The stdout and stderr text of a CRI log file (partial lines joined, full lines ended by `\n`).
pub fn log_output(path: &Path) -> (String, String) {
    let (mut out, mut err) = (String::new(), String::new());
    for (stream, tag, content) in log_records(path) {
        let s = if stream == "stderr" {
            &mut err
        } else {
            &mut out
        };
        s.push_str(&content);
        if tag == "F" {
            s.push('\n');
        }
    }
    (out, err)
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// The body of `GET /` (HTTP/1.0) from a server at `addr`, retried for up to 20 s while the
/// server starts; the answer must be 200.
pub async fn http_get(addr: std::net::SocketAddr) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let attempt = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            use std::io::{Read, Write};
            let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
            conn.set_read_timeout(Some(Duration::from_secs(5)))?;
            conn.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
            let mut reply = String::new();
            conn.read_to_string(&mut reply)?;
            Ok(reply)
        })
        .await
        .expect("http_get task");
        match attempt {
            Ok(reply) if reply.starts_with("HTTP/1.") => {
                assert!(reply.contains(" 200 "), "{addr}: {reply}");
                return reply
                    .split_once("\r\n\r\n")
                    .map(|(_, body)| body.to_string())
                    .unwrap_or_default();
            }
            other if std::time::Instant::now() >= deadline => {
                panic!("GET http://{addr}/: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// The PIDs in every cgroup below `cgroup_root` (the pids hierarchy on v1, the unified one on v2).
pub fn pids_in_cgroups(cgroup_root: &str) -> Vec<i32> {
    fn walk(dir: &Path, out: &mut Vec<i32>) {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        out.extend(procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                walk(&entry.path(), out);
            }
        }
    }
    let rel = cgroup_root.trim_start_matches('/');
    let mut out = Vec::new();
    for base in ["/sys/fs/cgroup/pids", "/sys/fs/cgroup"] {
        let dir = Path::new(base).join(rel);
        if dir.join("cgroup.procs").exists() {
            walk(&dir, &mut out);
            break;
        }
    }
    out
}

/// Waits (5 s at most) until `done()` holds: killed processes take a moment to finish exiting.
pub async fn settle(done: impl Fn() -> bool) {
    for _ in 0..100 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet: it runs nothing).
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

/// The PID of sandbox `id`'s process, from its verbose status.
pub async fn sandbox_pid(rt: &dyn RuntimeService, id: &str) -> i32 {
    sandbox_info(rt, id).await["pid"]
        .as_i64()
        .and_then(|p| i32::try_from(p).ok())
        .expect("the sandbox's pid")
}

/// The built-in runtime's verbose information on sandbox `id` (its pid, state dir, cgroup
/// parent...).
pub async fn sandbox_info(rt: &dyn RuntimeService, id: &str) -> serde_json::Value {
    let st = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        })
        .await
        .expect("PodSandboxStatus");
    serde_json::from_str(&st.info["info"]).expect("verbose info is JSON")
}

/// The sandbox process (found from /proc, without opening a runtime in this process: one would
/// watch the sandbox and act on its death as an agent does) of the container process whose
/// command line is `cmdline` (NUL-separated, as in /proc): the parent of that process, when
/// its own command line names a path in the state dir of `root`.
pub fn sandbox_of_process(root: &Path, cmdline: &[u8]) -> Option<i32> {
    let read = |pid: &str| std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    // A sandbox process's last argument is its state dir, in the runtime's state dir.
    let state = state_dir(root).to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if read(&pid) != cmdline {
            continue;
        }
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1))
        else {
            continue;
        };
        if String::from_utf8_lossy(&read(ppid)).contains(&state) {
            return ppid.parse().ok();
        }
    }
    None
}

/// A bridge and /24 of this test binary's own, so parallel test binaries never share them.
pub fn own_network(root: &Path) -> runtime::builtin::NetworkConfig {
    let n = std::process::id() % 250 + 1;
    runtime::builtin::NetworkConfig {
        bridge: format!("nlt{}", std::process::id() % 100_000),
        pod_cidrs: vec![
            runtime::builtin::parse_pod_cidr(&format!("10.89.{n}.0/24")).expect("cidr"),
        ],
        ipam_dir: root.join("ipam"),
        masquerade: true,
        cluster_cidrs: Vec::new(),
    }
}

/// Removes the node side of a test's own network (bridge, rules, leases) when dropped.
pub struct NetworkGuard(pub runtime::builtin::NetworkConfig);

impl Drop for NetworkGuard {
    fn drop(&mut self) {
        let _ = runtime::builtin::remove_node_network(&self.0);
        let _ = std::fs::remove_dir_all(&self.0.ipam_dir);
    }
}

/// Unmounts the tmpfs at its path when dropped (declare it before the node whose root it is,
/// so that it drops after it), then removes the node's dir, which could not go through the
/// mount.
pub struct Tmpfs(pub Option<PathBuf>);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (`"128m"`) on `dir` and remembers it.
    pub fn mount(&mut self, dir: &Path, size: &str) {
        nix::mount::mount(
            Some("tmpfs"),
            dir,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(format!("size={size}").as_str()),
        )
        .expect("mounting a tmpfs");
        self.0 = Some(dir.to_path_buf());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
            if let Some(dir) = p.parent() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// Capacity and available bytes of the filesystem of `path`.
pub fn fs_space(path: &Path) -> (u64, u64) {
    let st = nix::sys::statvfs::statvfs(path).expect("statvfs");
    let f = st.fragment_size();
    (st.blocks() * f, st.blocks_available() * f)
}
