//! Container start latency and sandbox memory of the built-in runtime, against Debian's `runc`.
//!
//! ```sh
//! sudo cargo bench --bench runtime            # BENCH_ITERS=100 for more samples
//! ```
//!
//! One run measures, on the same busybox image (built by `scripts/build-busybox-image.sh`):
//! 1. the built-in runtime through the `RuntimeService` trait, in one pod sandbox created up
//!    front: CreateContainer + StartContainer + wait for the ContainerStoppedEvent (from one
//!    `get_container_events` subscription) + RemoveContainer of a container running `true`,
//!    with the time of each phase;
//! 2. `runc run` (foreground: create, start, wait, delete) on an OCI bundle holding a plain copy
//!    of the image's rootfs and the `config.json` the built-in runtime generated, adjusted for
//!    runc: once with fresh namespaces, once joining the pod sandbox's network/IPC/UTS
//!    namespaces as the built-in runtime's containers do;
//! 3. the ratios of the medians;
//!
//! steps 1 and 2 (with the image store's rootfs mount and release alone) twice: on a quiet
//! machine, then while a writer dirties the filesystem the runtime's root dir is on (64 MiB
//! files written over and over, never synced), the two series side by side. Both runtimes
//! keep their state (the built-in runtime's state dir, runc's `--root`) on a tmpfs the bench
//! mounts, as a systemd host has at /run;
//! 4. the PSS (also RSS, private dirty, and the PSS split into anonymous memory, the own
//!    executable and other files) of a sandbox process (idle, and holding one running
//!    `sleep 600`), of that container and of this process (the agent).
//!
//! Needs root and `runc` on PATH; otherwise prints a SKIP line and exits 0. Everything it makes
//! (pod sandboxes, runc containers, temp dirs, mounts, cgroups) is removed at the end, also when
//! a step fails.

mod common;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use common::{Stats, loadavg, remove_cgroup, stats, unmount_under};
use futures::StreamExt;
use runtime::builtin::{BuiltinRuntime, Config};
use runtime::{EventStream, RuntimeService, cri};
use serde_json::Value;

const BUSYBOX: &str = "docker.io/library/busybox:latest";
const WARMUP: usize = 3;
const DEFAULT_ITERS: usize = 30;
/// How long one container may take to exit, or a `runc run` to finish.
const TIMEOUT: Duration = Duration::from_secs(60);
fn main() -> ExitCode {
    if !common::bench_run("runtime", "the runtime benchmark runs real containers") {
        return ExitCode::SUCCESS;
    }
    let Some(runc) = find_in_path("runc") else {
        println!("SKIP (needs runc): no `runc` on PATH (Debian: apt-get install -y runc)");
        return ExitCode::SUCCESS;
    };
    common::run_bench(async { bench(runc, iterations()?).await })
}

/// Sets everything up, runs every measurement, and cleans up whatever happened.
async fn bench(runc: PathBuf, iters: usize) -> Result<()> {
    let env = Env::new(runc).await?;
    let result = measure(&env, iters).await;
    let cleanup = env.cleanup().await;
    result?.print(iters);
    cleanup
}

// ---------------------------------------------------------------------------------------------
// The environment: a built-in runtime in a temp root, a work dir, a bench cgroup.

struct Env {
    rt: BuiltinRuntime,
    /// The built-in runtime's root dir (short: sandbox socket paths must fit sun_path).
    root: tempfile::TempDir,
    /// Image archive, runc state, bundles, rootfs copy.
    work: tempfile::TempDir,
    /// The cgroup (in every hierarchy) all pods and runc containers go under.
    cgroup_root: String,
    runc: PathBuf,
    runc_root: PathBuf,
}

impl Env {
    async fn new(runc: PathBuf) -> Result<Env> {
        let nodelet = nodelet_binary()?;
        let root = tempfile::Builder::new()
            .prefix("nlb")
            .tempdir()
            .context("creating the runtime root dir")?;
        let work = tempfile::Builder::new()
            .prefix("nodelet-bench-")
            .tempdir()
            .context("creating the work dir")?;
        let cgroup_root = format!("/nodelet-bench-{}", std::process::id());
        // What a systemd host has at /run: a tmpfs, for both runtimes' state (the built-in
        // runtime's state dir, runc's --root), whatever /run is on this machine.
        let run = work.path().join("run");
        std::fs::create_dir_all(&run).with_context(|| format!("creating {}", run.display()))?;
        nix::mount::mount(
            Some("tmpfs"),
            &run,
            Some("tmpfs"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some("mode=755,size=256m"),
        )
        .with_context(|| format!("mounting a tmpfs at {}", run.display()))?;
        let mut cfg = Config::new(root.path()).context("runtime config")?;
        cfg.sandbox_program = nodelet;
        cfg.cgroup_root = cgroup_root.clone();
        cfg.state_dir = Some(run.join("nodelet"));
        let rt = match BuiltinRuntime::new(cfg).await {
            Ok(rt) => rt,
            Err(e) => {
                let _ = unmount_under(work.path());
                return Err(anyhow!(e).context("opening the built-in runtime"));
            }
        };
        let runc_root = run.join("runc");
        let env = Env {
            rt,
            root,
            work,
            cgroup_root,
            runc,
            runc_root,
        };
        if let Err(e) = env.import_busybox() {
            env.cleanup().await.ok();
            return Err(e);
        }
        Ok(env)
    }

    /// Builds the busybox image with scripts/build-busybox-image.sh and imports it.
    fn import_busybox(&self) -> Result<()> {
        let archive = self.work.path().join("busybox.tar");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-busybox-image.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg(&archive)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running `bash {}`", script.display()))?;
        ensure!(
            out.status.success(),
            "{} failed ({}): {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        self.rt
            .image_store()
            .import(&archive)
            .context("importing the busybox image")?;
        Ok(())
    }

    fn log_dir(&self) -> PathBuf {
        self.root.path().join("logs")
    }

    /// Removes everything the bench made. Keeps going after failures; returns the first.
    async fn cleanup(&self) -> Result<()> {
        let mut first: Option<anyhow::Error> = None;
        let mut note = |e: anyhow::Error| {
            eprintln!("cleanup: {e:#}");
            first.get_or_insert(e);
        };
        if let Err(e) = self.runc_cleanup() {
            note(e);
        }
        match self
            .rt
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
        {
            Ok(list) => {
                for sb in list.items {
                    if let Err(e) = remove_sandbox(&self.rt, &sb.id).await {
                        note(e);
                    }
                }
            }
            Err(e) => note(anyhow!(e).context("listing pod sandboxes")),
        }
        for dir in [self.root.path(), self.work.path()] {
            if let Err(e) = unmount_under(dir) {
                note(e);
            }
        }
        if let Err(e) = remove_cgroup(&self.cgroup_root) {
            note(e);
        }
        // The temp dirs go when `self` is dropped.
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// `runc delete -f` of every container left in our runc state dir.
    fn runc_cleanup(&self) -> Result<()> {
        if !self.runc_root.exists() {
            return Ok(());
        }
        let out = Command::new(&self.runc)
            .arg("--root")
            .arg(&self.runc_root)
            .args(["list", "-q"])
            .stdin(Stdio::null())
            .output()
            .context("running runc list")?;
        ensure!(
            out.status.success(),
            "runc list failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        for id in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let st = Command::new(&self.runc)
                .arg("--root")
                .arg(&self.runc_root)
                .args(["delete", "-f", id])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .status()
                .with_context(|| format!("running runc delete -f {id}"))?;
            ensure!(st.success(), "runc delete -f {id} failed ({st})");
        }
        Ok(())
    }
}

async fn remove_sandbox(rt: &BuiltinRuntime, id: &str) -> Result<()> {
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: id.to_string(),
    })
    .await
    .with_context(|| format!("StopPodSandbox {id}"))?;
    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: id.to_string(),
    })
    .await
    .with_context(|| format!("RemovePodSandbox {id}"))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The measurements.

struct Report {
    /// On a quiet machine, then while a writer dirties the filesystem the runtime is on.
    quiet: Series,
    loaded: Series,
    memory: Memory,
}

/// One series of lifecycle measurements: the built-in runtime, its image store alone, runc.
struct Series {
    builtin: Phases,
    overlay: Overlay,
    runc_fresh: Vec<Duration>,
    runc_joined: Vec<Duration>,
    /// /proc/loadavg before and after the timed runs (the machine may be shared).
    load: [String; 2],
    /// What the writer wrote meanwhile (MiB), for the loaded series.
    written_mib: Option<u64>,
}

/// A writer dirtying the filesystem of `dir` while it lives: 64 MiB files written over and
/// over in 1 MiB pieces, never synced, as a busy node's logs, images and volumes do, so that
/// the kernel's write-back, and every fsync or syncfs, has plenty to do.
struct WriteLoad {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl WriteLoad {
    fn start(dir: &Path) -> WriteLoad {
        use std::io::Write;
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let path = dir.join("write-load");
        let thread = std::thread::spawn(move || {
            let chunk = vec![0xa5u8; 1 << 20];
            let mut written = 0u64;
            while !flag.load(Ordering::Relaxed) {
                let Ok(mut f) = std::fs::File::create(&path) else {
                    break;
                };
                for _ in 0..64 {
                    if flag.load(Ordering::Relaxed) || f.write_all(&chunk).is_err() {
                        break;
                    }
                    written += 1;
                }
            }
            let _ = std::fs::remove_file(&path);
            written
        });
        WriteLoad {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops the writer; returns the MiB it wrote.
    fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

impl Drop for WriteLoad {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Per-iteration durations of each phase of the built-in runtime's container lifecycle.
#[derive(Default)]
struct Phases {
    create: Vec<Duration>,
    start: Vec<Duration>,
    wait: Vec<Duration>,
    remove: Vec<Duration>,
    total: Vec<Duration>,
}

struct Memory {
    /// The benchmark's sandbox after all its containers came and went.
    used_sandbox: Smaps,
    used_sandbox_containers: usize,
    /// A fresh sandbox with no container, then holding one.
    idle_sandbox: Smaps,
    busy_sandbox: Smaps,
    container: Smaps,
    agent: Smaps,
}

async fn measure(env: &Env, iters: usize) -> Result<Report> {
    let mut events = env
        .rt
        .get_container_events(cri::GetEventsRequest {})
        .await
        .context("GetContainerEvents")?;
    let pod = Pod::run(&env.rt, "bench", &env.log_dir()).await?;
    let bundles = Bundles::prepare(env, &pod).await?;
    eprintln!("== quiet");
    let quiet = series(env, &pod, &bundles, &mut events, iters, "quiet").await?;
    eprintln!("== under write load (a writer dirtying the runtime's filesystem)");
    let load = WriteLoad::start(env.root.path());
    let loaded = series(env, &pod, &bundles, &mut events, iters, "loaded").await;
    let written = load.stop();
    let mut loaded = loaded?;
    loaded.written_mib = Some(written);
    // The benchmark's sandbox, the only one running, after all its containers came and went.
    let used_sandbox = smaps(pod.sandbox_pid(&env.rt).await?)?;
    let used_sandbox_containers = 2 * (WARMUP + iters) + 1;
    remove_sandbox(&env.rt, &pod.id).await?;

    // A fresh sandbox, measured while it is the only sandbox process (PSS splits shared pages
    // among the processes mapping them).
    let fresh = Pod::run(&env.rt, "memory", &env.log_dir()).await?;
    let sandbox_pid = fresh.sandbox_pid(&env.rt).await?;
    let idle_sandbox = smaps(sandbox_pid)?;
    let id = fresh.create(&env.rt, "sleeper", &["sleep", "600"]).await?;
    env.rt
        .start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .context("StartContainer sleeper")?;
    let container_pid = container_pid(&env.rt, &id).await?;
    wait_for_sleeping(container_pid, "sleep").await?;
    let busy_sandbox = smaps(sandbox_pid)?;
    let container = smaps(container_pid)?;
    let agent = smaps_of(Path::new("/proc/self"))?;
    remove_sandbox(&env.rt, &fresh.id).await?;

    Ok(Report {
        quiet,
        loaded,
        memory: Memory {
            used_sandbox,
            used_sandbox_containers,
            idle_sandbox,
            busy_sandbox,
            container,
            agent,
        },
    })
}

/// The built-in runtime's lifecycle, its image store alone, and runc, one after the other.
async fn series(
    env: &Env,
    pod: &Pod,
    bundles: &Bundles,
    events: &mut EventStream,
    iters: usize,
    tag: &str,
) -> Result<Series> {
    let load_before = loadavg();
    eprintln!("built-in runtime: {WARMUP} warm-up + {iters} containers running `true`...");
    let mut builtin = Phases::default();
    for i in 0..WARMUP + iters {
        let sample = builtin_once(env, pod, events, &format!("true-{tag}-{i}")).await?;
        if i >= WARMUP {
            builtin.push(sample);
        }
    }
    eprintln!("image store: {WARMUP} warm-up + {iters} rootfs mounts and releases...");
    let overlay = overlay_runs(env, iters, tag)?;
    eprintln!("runc: {WARMUP} warm-up + {iters} `runc run` with fresh namespaces...");
    let runc_fresh = runc_runs(env, &bundles.fresh, &format!("fresh-{tag}"), iters)?;
    eprintln!("runc: {WARMUP} warm-up + {iters} `runc run` joining the pod's namespaces...");
    let runc_joined = runc_runs(env, &bundles.joined, &format!("joined-{tag}"), iters)?;
    Ok(Series {
        builtin,
        overlay,
        runc_fresh,
        runc_joined,
        load: [load_before, loadavg()],
        written_mib: None,
    })
}

struct Sample {
    create: Duration,
    start: Duration,
    wait: Duration,
    remove: Duration,
}

impl Phases {
    fn push(&mut self, s: Sample) {
        self.create.push(s.create);
        self.start.push(s.start);
        self.wait.push(s.wait);
        self.remove.push(s.remove);
        self.total.push(s.create + s.start + s.wait + s.remove);
    }
}

/// One container running `true` through the trait: create, start, stopped event, remove.
async fn builtin_once(
    env: &Env,
    pod: &Pod,
    events: &mut EventStream,
    name: &str,
) -> Result<Sample> {
    let t0 = Instant::now();
    let id = pod.create(&env.rt, name, &["true"]).await?;
    let t1 = Instant::now();
    env.rt
        .start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .with_context(|| format!("StartContainer {name}"))?;
    let t2 = Instant::now();
    wait_stopped(events, &id).await?;
    let t3 = Instant::now();
    // Not timed: the exit code, so a failing container cannot pass for a fast one.
    let status = env
        .rt
        .container_status(cri::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        })
        .await
        .with_context(|| format!("ContainerStatus {name}"))?
        .status
        .ok_or_else(|| anyhow!("ContainerStatus {name}: no status"))?;
    ensure!(
        status.state == cri::ContainerState::ContainerExited as i32 && status.exit_code == 0,
        "container {name} did not exit cleanly: state {} exit code {} reason {:?} {:?}",
        status.state,
        status.exit_code,
        status.reason,
        status.message
    );
    let t4 = Instant::now();
    env.rt
        .remove_container(cri::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .with_context(|| format!("RemoveContainer {name}"))?;
    let t5 = Instant::now();
    Ok(Sample {
        create: t1 - t0,
        start: t2 - t1,
        wait: t3 - t2,
        remove: t5 - t4,
    })
}

/// The image store's part of CreateContainer and RemoveContainer, alone.
#[derive(Default)]
struct Overlay {
    prepare: Vec<Duration>,
    release: Vec<Duration>,
}

/// Warm-up plus `iters` timed `prepare_rootfs` (record with fsync, overlay mount) and
/// `release_rootfs` (unmount, delete upper/work) of the busybox image.
fn overlay_runs(env: &Env, iters: usize, tag: &str) -> Result<Overlay> {
    let store = env.rt.image_store();
    let image = store
        .resolve(BUSYBOX)
        .context("resolving the busybox image")?
        .ok_or_else(|| anyhow!("{BUSYBOX} is not in the image store"))?;
    let mut out = Overlay::default();
    for i in 0..WARMUP + iters {
        let key = format!("bench-overlay-{tag}-{i}");
        let target = env.work.path().join(&key);
        let t0 = Instant::now();
        store
            .prepare_rootfs(&image.id, &key, &target)
            .with_context(|| format!("prepare_rootfs {key}"))?;
        let t1 = Instant::now();
        store
            .release_rootfs(&key, &target)
            .with_context(|| format!("release_rootfs {key}"))?;
        let t2 = Instant::now();
        std::fs::remove_dir(&target).with_context(|| format!("removing {}", target.display()))?;
        if i >= WARMUP {
            out.prepare.push(t1 - t0);
            out.release.push(t2 - t1);
        }
    }
    Ok(out)
}

/// Waits for the ContainerStoppedEvent of `id` on the subscription.
async fn wait_stopped(events: &mut EventStream, id: &str) -> Result<()> {
    let stopped = cri::ContainerEventType::ContainerStoppedEvent as i32;
    let wait = async {
        while let Some(ev) = events.next().await {
            let ev = ev.context("container event stream")?;
            if ev.container_id == id && ev.container_event_type == stopped {
                return Ok(());
            }
        }
        bail!("the container event stream ended")
    };
    tokio::time::timeout(TIMEOUT, wait)
        .await
        .map_err(|_| anyhow!("no stopped event for container {id} within {TIMEOUT:?}"))?
}

/// A pod sandbox as the kubelet asks for one: own network/IPC/UTS, containers in their own PID
/// namespaces (no shareProcessNamespace).
struct Pod {
    id: String,
    config: cri::PodSandboxConfig,
}

impl Pod {
    async fn run(rt: &BuiltinRuntime, name: &str, log_dir: &Path) -> Result<Pod> {
        let ns = cri::NamespaceOption {
            pid: cri::NamespaceMode::Container as i32,
            ..Default::default()
        };
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: format!("bench-{name}-{}", std::process::id()),
                namespace: "bench".into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: log_dir.join(name).to_string_lossy().into_owned(),
            linux: Some(cri::LinuxPodSandboxConfig {
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(ns),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await
            .with_context(|| format!("RunPodSandbox {name}"))?
            .pod_sandbox_id;
        Ok(Pod { id, config })
    }

    async fn create(&self, rt: &BuiltinRuntime, name: &str, cmd: &[&str]) -> Result<String> {
        let config = cri::ContainerConfig {
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
            ..Default::default()
        };
        Ok(rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: self.id.clone(),
                config: Some(config),
                sandbox_config: Some(self.config.clone()),
            })
            .await
            .with_context(|| format!("CreateContainer {name}"))?
            .container_id)
    }

    async fn sandbox_pid(&self, rt: &BuiltinRuntime) -> Result<u32> {
        let resp = rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: self.id.clone(),
                verbose: true,
            })
            .await
            .context("PodSandboxStatus")?;
        pid_from_info(&resp.info, "PodSandboxStatus")
    }
}

async fn container_pid(rt: &BuiltinRuntime, id: &str) -> Result<u32> {
    let resp = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: true,
        })
        .await
        .context("ContainerStatus")?;
    pid_from_info(&resp.info, "ContainerStatus")
}

/// The `"pid"` of a verbose status's `info["info"]` JSON.
fn pid_from_info(info: &HashMap<String, String>, what: &str) -> Result<u32> {
    let json = info
        .get("info")
        .ok_or_else(|| anyhow!("{what}: no \"info\" in the verbose info"))?;
    let v: Value = serde_json::from_str(json).with_context(|| format!("{what}: parsing info"))?;
    v.get("pid")
        .and_then(Value::as_u64)
        .and_then(|p| u32::try_from(p).ok())
        .filter(|&p| p > 0)
        .ok_or_else(|| anyhow!("{what}: no pid in {json}"))
}

/// Waits until process `pid` runs `comm` and sleeps (interruptibly): the container's init has
/// exec'd its command and the dynamic loader is done, so its memory is what it keeps.
async fn wait_for_sleeping(pid: u32, comm: &str) -> Result<()> {
    let path = format!("/proc/{pid}/stat");
    for _ in 0..500 {
        // "<pid> (<comm>) <state> ...": comm is in parentheses and may contain spaces.
        let stat = std::fs::read_to_string(&path).unwrap_or_default();
        let settled = stat
            .split_once(" (")
            .and_then(|(_, rest)| rest.rsplit_once(") "));
        if let Some((c, rest)) = settled {
            if c == comm && rest.starts_with('S') {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("process {pid} did not settle as a sleeping {comm:?}")
}

// ---------------------------------------------------------------------------------------------
// runc.

/// Two OCI bundles over one plain copy of the busybox rootfs.
struct Bundles {
    /// runc creates fresh namespaces (the spec's namespace paths removed).
    fresh: PathBuf,
    /// runc joins the pod sandbox's network/IPC/UTS namespaces, as the built-in runtime does.
    joined: PathBuf,
}

impl Bundles {
    /// Copies the image's rootfs to a plain dir and derives both bundles' `config.json` from
    /// the one the built-in runtime writes for a container running `true` in `pod`.
    async fn prepare(env: &Env, pod: &Pod) -> Result<Bundles> {
        let work = env.work.path();
        let rootfs = work.join("rootfs");
        copy_image_rootfs(env, &rootfs)?;

        let id = pod.create(&env.rt, "template", &["true"]).await?;
        let generated = env
            .work
            .path()
            .join("run/nodelet/containers")
            .join(&id)
            .join("config.json");
        let text = std::fs::read_to_string(&generated)
            .with_context(|| format!("reading {}", generated.display()));
        // The copy of the pod's files (/etc/hosts...) outlives the template container.
        let etc = work.join("pod-files");
        std::fs::create_dir_all(&etc).with_context(|| format!("creating {}", etc.display()))?;
        let spec = text.and_then(|t| {
            let mut spec: Value = serde_json::from_str(&t)
                .with_context(|| format!("parsing {}", generated.display()))?;
            copy_mount_sources(&mut spec, env.root.path(), &etc)?;
            Ok(spec)
        });
        env.rt
            .remove_container(cri::RemoveContainerRequest { container_id: id })
            .await
            .context("RemoveContainer template")?;
        let spec = spec?;

        let cgroup = format!("{}/runc", env.cgroup_root);
        let fresh = work.join("bundle-fresh");
        let joined = work.join("bundle-joined");
        write_bundle(&fresh, &spec, &rootfs, &cgroup, false)?;
        write_bundle(&joined, &spec, &rootfs, &cgroup, true)?;
        Ok(Bundles { fresh, joined })
    }
}

/// Copies the busybox image's rootfs (an overlay from the image store) to the plain dir `to`.
fn copy_image_rootfs(env: &Env, to: &Path) -> Result<()> {
    let store = env.rt.image_store();
    let image = store
        .resolve(BUSYBOX)
        .context("resolving the busybox image")?
        .ok_or_else(|| anyhow!("{BUSYBOX} is not in the image store"))?;
    let key = "bench-runc-rootfs";
    let mnt = env.work.path().join("rootfs-overlay");
    store
        .prepare_rootfs(&image.id, key, &mnt)
        .context("mounting the busybox rootfs")?;
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    let copied = Command::new("cp")
        .arg("-a")
        .arg(mnt.join("."))
        .arg(to)
        .stdin(Stdio::null())
        .output()
        .context("running cp -a");
    let released = store
        .release_rootfs(key, &mnt)
        .context("unmounting the busybox rootfs");
    let copied = copied?;
    ensure!(
        copied.status.success(),
        "copying the busybox rootfs failed: {}",
        String::from_utf8_lossy(&copied.stderr).trim()
    );
    released
}

/// Bind-mount sources under the runtime's root dir (the pod's /etc/hosts, hostname,
/// resolv.conf) are copied to `to` and the spec pointed at the copies.
fn copy_mount_sources(spec: &mut Value, runtime_root: &Path, to: &Path) -> Result<()> {
    let Some(mounts) = spec.get_mut("mounts").and_then(Value::as_array_mut) else {
        return Ok(());
    };
    for (i, m) in mounts.iter_mut().enumerate() {
        let Some(src) = m.get("source").and_then(Value::as_str).map(PathBuf::from) else {
            continue;
        };
        if !src.starts_with(runtime_root) || !src.is_file() {
            continue;
        }
        let name = src
            .file_name()
            .map(OsStr::to_string_lossy)
            .unwrap_or_default();
        let copy = to.join(format!("{i}-{name}"));
        std::fs::copy(&src, &copy)
            .with_context(|| format!("copying {} to {}", src.display(), copy.display()))?;
        m["source"] = Value::String(copy.to_string_lossy().into_owned());
    }
    Ok(())
}

/// Writes `<dir>/config.json`: the built-in runtime's spec, with `true` as the process, the
/// plain rootfs copy, the bench cgroup, and namespaces either fresh or joined.
fn write_bundle(dir: &Path, spec: &Value, rootfs: &Path, cgroup: &str, join: bool) -> Result<()> {
    let mut spec = spec.clone();
    let process = spec
        .get_mut("process")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| anyhow!("generated spec has no process"))?;
    process.insert("args".into(), serde_json::json!(["true"]));
    process.insert("terminal".into(), Value::Bool(false));
    spec["root"]["path"] = Value::String(rootfs.to_string_lossy().into_owned());
    let linux = spec
        .get_mut("linux")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| anyhow!("generated spec has no linux section"))?;
    linux.insert("cgroupsPath".into(), Value::String(cgroup.into()));
    if !join {
        if let Some(nss) = linux.get_mut("namespaces").and_then(Value::as_array_mut) {
            for ns in nss {
                if let Some(ns) = ns.as_object_mut() {
                    ns.remove("path");
                }
            }
        }
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join("config.json");
    let text = serde_json::to_string_pretty(&spec).context("serialising config.json")?;
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
}

/// Warm-up plus `iters` timed `runc run`s of the bundle; returns the timed ones.
fn runc_runs(env: &Env, bundle: &Path, tag: &str, iters: usize) -> Result<Vec<Duration>> {
    let mut out = Vec::with_capacity(iters);
    for i in 0..WARMUP + iters {
        let id = format!("bench-{tag}-{i}");
        let t0 = Instant::now();
        let res = Command::new(&env.runc)
            .arg("--root")
            .arg(&env.runc_root)
            .arg("run")
            .arg("--bundle")
            .arg(bundle)
            .arg(&id)
            .stdin(Stdio::null())
            .output()
            .context("running runc run")?;
        let took = t0.elapsed();
        ensure!(
            res.status.success(),
            "runc run {id} failed ({}): {}",
            res.status,
            String::from_utf8_lossy(&res.stderr).trim()
        );
        ensure!(took < TIMEOUT, "runc run {id} took {took:?}");
        if i >= WARMUP {
            out.push(took);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// Memory.

/// A process's memory, in kB: the totals of `/proc/<pid>/smaps_rollup`, and its PSS split by
/// mapping from `/proc/<pid>/smaps`.
struct Smaps {
    pss: u64,
    rss: u64,
    /// Private_Dirty: what no other process can share (heap, stacks, relocated data).
    private_dirty: u64,
    /// Mappings without a file: heap, stacks, anonymous memory.
    pss_anon: u64,
    /// Mappings of the process's own executable.
    pss_exe: u64,
    /// Other file mappings (shared libraries, the dynamic loader).
    pss_files: u64,
}

fn smaps(pid: u32) -> Result<Smaps> {
    smaps_of(&PathBuf::from(format!("/proc/{pid}")))
}

fn smaps_of(proc_dir: &Path) -> Result<Smaps> {
    let rollup = proc_dir.join("smaps_rollup");
    let text = std::fs::read_to_string(&rollup)
        .with_context(|| format!("reading {}", rollup.display()))?;
    let field = |name: &str| -> Result<u64> {
        text.lines()
            .find_map(|l| kb_field(l, name))
            .ok_or_else(|| anyhow!("no {name} in {}", rollup.display()))?
            .with_context(|| format!("parsing {name} of {}", rollup.display()))
    };
    let mut out = Smaps {
        pss: field("Pss")?,
        rss: field("Rss")?,
        private_dirty: field("Private_Dirty")?,
        pss_anon: 0,
        pss_exe: 0,
        pss_files: 0,
    };

    let exe = std::fs::read_link(proc_dir.join("exe"))
        .with_context(|| format!("reading {}/exe", proc_dir.display()))?;
    let exe = exe.to_string_lossy();
    let exe = exe.trim_end_matches(" (deleted)");
    let maps = proc_dir.join("smaps");
    let text =
        std::fs::read_to_string(&maps).with_context(|| format!("reading {}", maps.display()))?;
    let mut bucket = &mut out.pss_anon;
    for line in text.lines() {
        if let Some(path) = mapping_path(line) {
            bucket = if path.is_empty() || path.starts_with('[') {
                &mut out.pss_anon
            } else if path.trim_end_matches(" (deleted)") == exe {
                &mut out.pss_exe
            } else {
                &mut out.pss_files
            };
        } else if let Some(kb) = kb_field(line, "Pss") {
            *bucket += kb.with_context(|| format!("parsing {line:?} of {}", maps.display()))?;
        }
    }
    Ok(out)
}

/// `Some(value)` when `line` is `<name>: <value> kB`.
fn kb_field(line: &str, name: &str) -> Option<Result<u64>> {
    let rest = line.strip_prefix(name)?.strip_prefix(':')?;
    Some(
        rest.trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .map_err(anyhow::Error::from),
    )
}

/// The path of an smaps mapping header (`start-end perms offset dev inode [path]`), empty for
/// an anonymous mapping; `None` for the other lines.
fn mapping_path(line: &str) -> Option<&str> {
    let (range, mut rest) = line.split_once(' ')?;
    let (start, end) = range.split_once('-')?;
    let hex = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex(start) || !hex(end) {
        return None;
    }
    for _ in 0..4 {
        rest = rest.trim_start().split_once(' ').map_or("", |(_, r)| r);
    }
    Some(rest.trim())
}

// ---------------------------------------------------------------------------------------------
// Output.

/// One phase in both series: medians with p90s.
fn pair(label: &str, quiet: &[Duration], loaded: &[Duration]) -> (Stats, Stats) {
    let (q, l) = (stats(quiet), stats(loaded));
    println!(
        "{label:<48} {:>7.1} ms {:>9}   {:>7.1} ms {:>9}",
        q.median,
        format!("[{:.1}]", q.p90),
        l.median,
        format!("[{:.1}]", l.p90),
    );
    (q, l)
}

fn mem_line(label: &str, m: &Smaps) {
    let mib = |kb: u64| kb as f64 / 1024.0;
    println!(
        "{label:<48} PSS {:>6.2} MiB  RSS {:>6.2} MiB  private dirty {:>6.2} MiB",
        mib(m.pss),
        mib(m.rss),
        mib(m.private_dirty)
    );
    println!(
        "{:<48} PSS: anonymous {:.2}, own binary {:.2}, other files {:.2} MiB",
        "",
        mib(m.pss_anon),
        mib(m.pss_exe),
        mib(m.pss_files)
    );
}

impl Report {
    fn print(&self, iters: usize) {
        let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
        println!();
        println!(
            "== container lifecycle of `true` (busybox), {iters} iterations after {WARMUP} \
             warm-ups, {cpus} CPUs: quiet, then under write load"
        );
        println!(
            "{:<48} {:>12} {:>12}   (medians; p90 in brackets)",
            "", "quiet", "write load"
        );
        let (q, l) = (&self.quiet, &self.loaded);
        let b = pair(
            "builtin create+start+wait(true)+remove:",
            &q.builtin.total,
            &l.builtin.total,
        );
        pair("  CreateContainer", &q.builtin.create, &l.builtin.create);
        pair("  StartContainer", &q.builtin.start, &l.builtin.start);
        pair(
            "  wait (start -> stopped event)",
            &q.builtin.wait,
            &l.builtin.wait,
        );
        pair("  RemoveContainer", &q.builtin.remove, &l.builtin.remove);
        pair(
            "  (image store alone: prepare_rootfs)",
            &q.overlay.prepare,
            &l.overlay.prepare,
        );
        pair(
            "  (image store alone: release_rootfs)",
            &q.overlay.release,
            &l.overlay.release,
        );
        let f = pair("runc run (fresh namespaces):", &q.runc_fresh, &l.runc_fresh);
        let j = pair(
            "runc run (joining the pod's net/ipc/uts):",
            &q.runc_joined,
            &l.runc_joined,
        );
        println!(
            "{:<48} {:>12.2} {:>12.2}   (builtin / runc fresh namespaces)",
            "ratio of medians:",
            b.0.median / f.0.median,
            b.1.median / f.1.median
        );
        println!(
            "{:<48} {:>12.2} {:>12.2}   (builtin / runc joining the pod's namespaces)",
            "",
            b.0.median / j.0.median,
            b.1.median / j.1.median
        );
        println!(
            "{:<48} quiet {} -> {}; loaded {} -> {}",
            "load average (1/5/15 min):", q.load[0], q.load[1], l.load[0], l.load[1]
        );
        if let Some(mib) = l.written_mib {
            println!("{:<48} {mib} MiB written, never synced", "the writer:");
        }
        println!();
        println!("== memory (/proc/<pid>/smaps_rollup)");
        let m = &self.memory;
        mem_line("sandbox process, fresh, no container:", &m.idle_sandbox);
        mem_line(
            "sandbox process, fresh, one running container:",
            &m.busy_sandbox,
        );
        mem_line("  its container (busybox sleep 600):", &m.container);
        mem_line(
            &format!(
                "sandbox process after {} containers:",
                m.used_sandbox_containers
            ),
            &m.used_sandbox,
        );
        mem_line("agent (this benchmark process):", &m.agent);
    }
}

// ---------------------------------------------------------------------------------------------
// Host helpers.

/// The 1, 5 and 15 minute load averages.
fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/usr/bin".into(), "/sbin".into()])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn iterations() -> Result<usize> {
    match std::env::var("BENCH_ITERS") {
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_ITERS),
        Err(e) => bail!("BENCH_ITERS: {e}"),
        Ok(s) => match s.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => bail!("BENCH_ITERS must be a positive integer, not {s:?}"),
        },
    }
}

/// The nodelet binary cargo built for this bench; it runs the sandbox processes.
fn nodelet_binary() -> Result<PathBuf> {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_nodelet"));
    ensure!(
        bin.is_file(),
        "the nodelet binary {} is missing; run through `cargo bench --bench runtime`, which \
         builds it",
        bin.display()
    );
    Ok(bin)
}
