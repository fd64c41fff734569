//! The built-in runtime: CRI requests carried out by nodelet itself, with no containerd, shims
//! or CNI binaries. Each pod sandbox is a `sandbox` process (the nodelet binary re-executed);
//! images come from the `images` store. This module only adapts: it converts CRI messages into
//! the leaves' own types (an OCI bundle, a `sandbox::Spec`) and their answers back into CRI.
//!
//! On disk, under the root dir: `images/` (the image store, with every container's writable
//! layer) and `cri/` (what CRI asked for, so a restarted agent adopts every sandbox and
//! container). Under the state dir, on tmpfs (`/run`), what need not survive a reboot and is
//! written on the request path: `sandboxes/<id>/` (each sandbox process's sockets, pid file,
//! libcontainer state and its containers' statuses) and `containers/<id>/` (each container's
//! OCI bundle and rootfs mount point). After a reboot the records outlive the state dir: such a
//! sandbox reads as stopped and its containers as exited with an unknown code (255), as
//! containerd reports containers whose task is gone, and the kubelet makes the pods again.

pub mod cdi;
mod cni;
mod container;
mod dirs;
mod image;
mod network;
mod pod;
mod recovery;
mod service;
pub mod spec;
mod stats;
mod store;
mod streaming;
mod userns;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::broadcast;

use crate::{Code, Error, Result, cri};
pub use cni::CniConfig;
pub use dirs::default_state_dir;
pub use images::{
    FALLBACK_ROOTS_FILE, RegistriesConfigError, RegistryConfig, fallback_trust_roots,
};
pub use network::{
    NetworkConfig, VxlanDevice, VxlanPeer, ensure_vxlan, format_mac, parse_mac, parse_pod_cidr,
    parse_pod_cidrs, remove_node_network, sync_node_routes, sync_vxlan,
};
/// An IPv4 subnet (a pod CIDR).
pub use sandbox::net::Subnet;
pub use service::RUNTIME_NAME;

/// The CDI spec dirs of [`Config::new`]: `/etc/cdi`, then `/var/run/cdi`.
pub const DEFAULT_CDI_SPEC_DIRS: &[&str] = cdi::DEFAULT_SPEC_DIRS;

/// The container annotation naming the signal StopContainer sends first (`"SIGUSR1"`,
/// `"10"`, ...), instead of the image's STOPSIGNAL or SIGTERM: how the kubelet passes a
/// container's `lifecycle.stopSignal` to the built-in runtime, since CRI v1's
/// `ContainerConfig` as the `k8s-cri` bindings have it has no stop signal.
pub const ANNOTATION_STOP_SIGNAL: &str = "io.nodelet.container.stopSignal";
use store::Records;

/// The hidden subcommand under which the nodelet binary runs as a sandbox process.
pub const SANDBOX_SUBCOMMAND: &str = "__sandbox";

/// Runs the sandbox process for `state_dir`. Call it from `main` before anything starts a
/// thread (in particular before building a tokio runtime); returns the process exit code.
pub fn sandbox_main(state_dir: &Path) -> i32 {
    sandbox::process::main(state_dir)
}

/// How the built-in runtime is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where everything lives (default /var/lib/nodelet).
    pub root_dir: PathBuf,
    /// Where the state that need not survive a reboot lives; `None` is
    /// [`default_state_dir`] of the root dir.
    pub state_dir: Option<PathBuf>,
    /// The binary to re-execute as a sandbox process (normally the running nodelet).
    pub sandbox_program: PathBuf,
    /// Arguments before the state dir (normally [`SANDBOX_SUBCOMMAND`]).
    pub sandbox_args: Vec<String>,
    /// The cgroup pods go under when CRI gives no cgroup parent.
    pub cgroup_root: String,
    /// The systemd cgroup driver (containerd's `SystemdCgroup`): CRI cgroup parents are slice
    /// names, each pod's cgroups go in a delegated systemd scope in its slice (in
    /// `system.slice` when CRI gives none), and RuntimeConfig reports `systemd`.
    pub systemd_cgroup: bool,
    /// Registry settings for pulls (insecure registries, mirrors).
    pub registry: images::RegistryConfig,
    /// The streaming server (Exec, PortForward URLs); it starts on the first such request.
    pub streaming: crate::streaming::Config,
    /// The pod network; `None` gives pods without hostNetwork loopback only.
    pub network: Option<NetworkConfig>,
    /// CNI mode: pods join the network the CNI config describes, through its plugins, instead
    /// of the runtime's own bridge (`network` must then be `None`).
    pub cni: Option<CniConfig>,
    /// The CDI spec dirs, later ones taking priority ([`cdi`]); read again for each container
    /// that asks for a CDI device.
    pub cdi_spec_dirs: Vec<PathBuf>,
}

impl Config {
    /// Defaults for `root_dir`, running the current executable as sandbox processes.
    pub fn new(root_dir: impl Into<PathBuf>) -> Result<Self> {
        let exe = std::env::current_exe()
            .map_err(|e| Error::internal(format!("finding the nodelet binary: {e}")))?;
        Ok(Config {
            root_dir: root_dir.into(),
            state_dir: None,
            sandbox_program: exe,
            sandbox_args: vec![SANDBOX_SUBCOMMAND.to_string()],
            cgroup_root: "/nodelet".to_string(),
            systemd_cgroup: false,
            registry: images::RegistryConfig::default(),
            streaming: crate::streaming::Config::default(),
            network: Some(NetworkConfig::default()),
            cni: None,
            cdi_spec_dirs: DEFAULT_CDI_SPEC_DIRS.iter().map(PathBuf::from).collect(),
        })
    }
}

/// The built-in runtime; implements [`crate::RuntimeService`] and [`crate::ImageService`].
/// Cheap to clone.
#[derive(Clone)]
pub struct BuiltinRuntime {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: Config,
    images: images::Store,
    records: Records,
    events: broadcast::Sender<cri::ContainerEventResponse>,
    /// Names of sandboxes and containers being created: a second request for the same name
    /// fails instead of racing (like containerd's name index), while creations of different
    /// objects run in parallel.
    reserved: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Per sandbox: creating or removing one of its containers holds it shared; removing the
    /// sandbox holds it exclusively, so no container is created into a sandbox being removed.
    sandbox_locks:
        std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::RwLock<()>>>>,
    streaming: tokio::sync::OnceCell<crate::streaming::Server>,
    network: Option<network::Network>,
    /// CNI mode's network (see `cni.rs`).
    cni: Option<cni::PodCni>,
    /// A shared lock on `cri/agents.lock` held while this runtime lives: every agent on the
    /// root dir holds one, so one that gets it exclusively at start knows it is alone, and only
    /// then takes what has no record for the remains of a creation cut short (another live
    /// agent may be creating it).
    agents: std::sync::Mutex<Option<nix::fcntl::Flock<std::fs::File>>>,
    /// Rootfs releases of removed containers under way in the background.
    releases: Releases,
    /// The state dir (see the module's doc), resolved.
    state_dir: PathBuf,
    /// Sandboxes and containers an older nodelet made with their state under the root dir.
    legacy: dirs::Legacy,
}

#[derive(Default)]
struct Releases {
    pending: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

/// A reserved name, released when dropped.
struct Reservation {
    inner: Arc<Inner>,
    key: String,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        store::lock(&self.inner.reserved).remove(&self.key);
    }
}

impl BuiltinRuntime {
    /// Opens (or creates) the runtime's state under `cfg.root_dir` and adopts every sandbox and
    /// container a previous agent left running.
    pub async fn new(mut cfg: Config) -> Result<Self> {
        if cfg.root_dir.as_os_str().is_empty() {
            return Err(Error::invalid_argument("the root dir must not be empty"));
        }
        if cfg.systemd_cgroup && !sandbox::cgroup::systemd_booted() {
            return Err(Error::failed_precondition(
                "the systemd cgroup driver needs systemd as this machine's init system (there is \
                 no /run/systemd/system): use the cgroupfs driver",
            ));
        }
        let state_dir = dirs::prepare(&mut cfg)?;
        let legacy = dirs::Legacy::find(&cfg.root_dir);
        let (agents, alone) =
            recovery::lock_agents(&cfg.root_dir.join("cri").join("agents.lock")).await?;
        let images = images::Store::open(cfg.root_dir.join("images")).map_err(image_error)?;
        let records = Records::load(&cfg.root_dir.join("cri"))?;
        let (events, _) = broadcast::channel(1024);
        if cfg.cni.is_some() && cfg.network.is_some() {
            return Err(Error::invalid_argument(
                "both the built-in bridge network and CNI are configured: choose one",
            ));
        }
        let network = cfg.network.clone().map(network::Network::new).transpose()?;
        let cni = cfg.cni.clone().map(|c| cni::PodCni::new(c, &state_dir));
        let rt = BuiltinRuntime {
            inner: Arc::new(Inner {
                cfg,
                images,
                records,
                events,
                reserved: Default::default(),
                sandbox_locks: Default::default(),
                streaming: tokio::sync::OnceCell::new(),
                network,
                cni,
                agents: std::sync::Mutex::new(Some(agents)),
                releases: Releases::default(),
                state_dir,
                legacy,
            }),
        };
        rt.adopt(alone).await;
        rt.discard_set_aside().await;
        rt.restore_rootfs_records();
        if alone {
            rt.discard_orphans().await;
            rt.release_stale_addresses();
            rt.collect_cni_garbage();
            dirs::sweep_stale(&rt.inner.state_dir);
        } else {
            tracing::info!("another agent uses this root dir: leaving what has no record to it");
        }
        // Others may start now.
        if let Some(lock) = store::lock(&rt.inner.agents).as_ref() {
            if let Err(e) = lock.relock(nix::fcntl::FlockArg::LockShared) {
                tracing::warn!("sharing the agents' lock: {e}");
            }
        }
        Ok(rt)
    }

    /// Gives up this runtime's claim on its root dir (its share of the agents' lock), so that
    /// a runtime opened next in the same process (an agent restarting in place, a test) is
    /// alone there. This one must not be used afterwards.
    pub fn leave(&self) {
        store::lock(&self.inner.agents).take();
    }

    /// The runtime's root dir.
    pub fn root_dir(&self) -> &Path {
        &self.inner.cfg.root_dir
    }

    /// The image store (for import and other node-local image commands).
    pub fn image_store(&self) -> &images::Store {
        &self.inner.images
    }

    /// Sandbox `id`'s state dir (see the module's doc).
    fn sandbox_dir(&self, id: &str) -> PathBuf {
        let base = if self.inner.legacy.sandboxes.contains(id) {
            &self.inner.cfg.root_dir
        } else {
            &self.inner.state_dir
        };
        base.join("sandboxes").join(id)
    }

    /// Container `id`'s OCI bundle (see the module's doc).
    fn bundle_dir(&self, id: &str) -> PathBuf {
        let base = if self.inner.legacy.containers.contains(id) {
            &self.inner.cfg.root_dir
        } else {
            &self.inner.state_dir
        };
        base.join("containers").join(id)
    }

    /// Reserves `key` unless it is reserved already or `taken()` (checked while holding the
    /// reservations, so a check and a reservation are one step) names an existing object.
    fn reserve(&self, key: String, taken: impl FnOnce() -> Result<()>) -> Result<Reservation> {
        let mut reserved = store::lock(&self.inner.reserved);
        if reserved.contains(&key) {
            return Err(Error::already_exists(format!(
                "{key} is being created by another request"
            )));
        }
        taken()?;
        reserved.insert(key.clone());
        Ok(Reservation {
            inner: self.inner.clone(),
            key,
        })
    }

    /// The lock of one sandbox (see `Inner::sandbox_locks`).
    fn sandbox_lock(&self, sandbox_id: &str) -> Arc<tokio::sync::RwLock<()>> {
        store::lock(&self.inner.sandbox_locks)
            .entry(sandbox_id.to_string())
            .or_default()
            .clone()
    }

    fn client(&self, sandbox_id: &str) -> sandbox::Client {
        sandbox::Client::new(self.sandbox_dir(sandbox_id))
    }

    /// Subscribes to sandbox `id`'s container events for as long as it runs and turns them into
    /// CRI events, an exited container's rootfs unmounted first; a sandbox whose process ends
    /// without having been shut down is reaped.
    async fn watch_sandbox(&self, id: &str) {
        let rx = match self.client(id).subscribe().await {
            Ok(rx) => rx,
            Err(e) => {
                if !self.reap_if_dead(id).await {
                    tracing::warn!(sandbox = %id, "cannot subscribe to sandbox events: {e}");
                }
                return;
            }
        };
        let this = self.clone();
        let id = id.to_string();
        tokio::spawn(async move {
            let mut rx = rx;
            loop {
                while let Some(ev) = rx.recv().await {
                    let kind = match ev.status.state {
                        // CreateContainer tells of it once the container's record is saved:
                        // the event carries the container's status, which needs the record.
                        sandbox::State::Created => continue,
                        sandbox::State::Running => cri::ContainerEventType::ContainerStartedEvent,
                        _ => cri::ContainerEventType::ContainerStoppedEvent,
                    };
                    // An exited container's rootfs goes before watchers hear of the exit.
                    if ev.status.state == sandbox::State::Exited {
                        this.unmount_rootfs_of(vec![ev.status.id.clone()]).await;
                    }
                    let taken = (!ev.containers.is_empty()).then_some((ev.containers, ev.at));
                    this.emit_in(Some(&id), &ev.status.id, kind, taken);
                }
                // The subscription ends with the process; one that is alive (it dropped us)
                // is subscribed to again while its sandbox exists.
                loop {
                    if this.reap_if_dead(&id).await
                        || !this.sandbox_dir(&id).exists()
                        || this.client(&id).is_stopped()
                        || this.inner.records.sandbox(&id).is_none_or(|r| r.stopped)
                    {
                        // A shutdown asked by an agent that died may end only now.
                        this.unmount_exited_in(&id).await;
                        return;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                    match this.client(&id).subscribe().await {
                        Ok(again) => {
                            rx = again;
                            // Exits while no one was subscribed sent no event.
                            this.unmount_exited_in(&id).await;
                            break;
                        }
                        Err(e) => tracing::debug!(sandbox = %id, "subscribing again: {e}"),
                    }
                }
            }
        });
    }

    /// When sandbox `id`'s process has died without being shut down (killed, crashed): kills
    /// what is left of its pod and records its containers as exited
    /// ([`sandbox::Client::reap_dead`]), frees its address, marks it stopped (NotReady, as a
    /// sandbox whose pause container died) and tells watchers, so the kubelet makes a new
    /// sandbox. Returns whether it was dead.
    async fn reap_if_dead(&self, id: &str) -> bool {
        let client = self.client(id);
        // A removed sandbox (its state dir gone) has nothing left to reap.
        if !self.sandbox_dir(id).exists() || client.is_stopped() || client.process_alive() {
            return false;
        }
        let lock = self.sandbox_lock(id);
        let _exclusive = lock.write().await;
        let Some(mut rec) = self.inner.records.sandbox(id) else {
            return true;
        };
        if rec.stopped {
            return true;
        }
        tracing::warn!(sandbox = %id, "the sandbox process died; killing what is left of its pod");
        if let Err(e) = self.kill_pod(id, Some(&rec.cgroup_parent)).await {
            tracing::error!(sandbox = %id, "reaping its pod: {e}");
        }
        self.teardown_cni_logged(&mut rec).await;
        rec.stopped = true;
        if let Err(e) = self.inner.records.save_sandbox(&rec) {
            tracing::error!(sandbox = %id, "{e}");
        }
        self.release_address(id, rec.bridge_ips());
        self.unmount_exited_in(id).await;
        self.emit(id, cri::ContainerEventType::ContainerStoppedEvent);
        true
    }

    /// Kills whatever still serves sandbox `id`'s state dir (a sandbox process that does not
    /// answer, or would not shut down) and then, given its cgroup parent, what is left of its
    /// pod in its cgroups, recording the containers that were still running as exited
    /// ([`sandbox::Client::reap_dead`]) and telling watchers of each.
    async fn kill_pod(&self, id: &str, cgroup_parent: Option<&str>) -> Result<()> {
        let (client, parent) = (self.client(id), cgroup_parent.map(str::to_string));
        let (killed, reaped) = tokio::task::spawn_blocking(move || {
            let killed = client.kill_serving();
            (killed, parent.map(|p| client.reap_dead(&p)))
        })
        .await
        .map_err(|e| Error::internal(format!("reaping sandbox {id}: {e}")))?;
        if killed > 0 {
            tracing::warn!(sandbox = %id, "killed {killed} process(es) still serving it");
        }
        for s in reaped
            .transpose()
            .map_err(sandbox_error)?
            .unwrap_or_default()
        {
            self.emit(&s.id, cri::ContainerEventType::ContainerStoppedEvent);
        }
        Ok(())
    }

    /// Removes the cgroups a sandbox made: `<parent>/sandbox` and, when the runtime made the
    /// parent for it (`owned`), the parent with every container cgroup below it. Whatever still
    /// runs there (a helper that outlived the sandbox process, a process still exiting) is
    /// killed first. A cgroup that will not go is an error, so that the sandbox stays listed
    /// and its removal can be retried: nothing is left that the runtime does not list.
    async fn remove_sandbox_cgroups(parent: &str, owned: bool) -> Result<()> {
        const WAIT: std::time::Duration = std::time::Duration::from_secs(10);
        let parent = parent.trim_end_matches('/').to_string();
        if parent.is_empty() {
            return Ok(());
        }
        tokio::task::spawn_blocking(move || {
            sandbox::cgroup::remove_tree(&format!("{parent}/sandbox"), WAIT)?;
            if owned {
                sandbox::cgroup::remove_tree(&parent, WAIT)?;
            }
            Ok(())
        })
        .await
        .map_err(|e| Error::internal(format!("removing cgroups: {e}")))?
        .map_err(sandbox_error)
    }

    /// Publishes a CRI container event (for GetContainerEvents and the kubelet's PLEG), with the
    /// status of the pod's sandbox as containerd sends it (upstream's evented PLEG knows the
    /// pod by it): the container's sandbox, or the sandbox itself for a sandbox's events, from
    /// the records (no call to the sandbox process; ready unless stopped). None once the
    /// container's record is gone (a deletion), as the kubelet knows that container already.
    pub(crate) fn emit(&self, container_id: &str, kind: cri::ContainerEventType) {
        self.emit_in(None, container_id, kind, None);
    }

    /// [`Self::emit`] for an event of sandbox `sandbox_id` (given when the container's record
    /// may be gone), with the statuses of the sandbox's containers when they were `taken` (and
    /// when, in nanoseconds since the epoch): the event then carries them, as containerd's do
    /// and as upstream's evented PLEG reads them. Containers without a record (being created
    /// or deleted) are left out.
    fn emit_in(
        &self,
        sandbox_id: Option<&str>,
        container_id: &str,
        kind: cri::ContainerEventType,
        taken: Option<(Vec<sandbox::ContainerStatus>, i64)>,
    ) {
        let records = &self.inner.records;
        // The sandbox process names its sandbox; otherwise the container's record does.
        let pod_sandbox_status = sandbox_id
            .map(str::to_string)
            .or_else(|| records.sandbox_of(container_id))
            .and_then(|sb| records.sandbox(&sb))
            .or_else(|| records.sandbox(container_id))
            .map(|rec| {
                let ready = !rec.stopped && !self.client(&rec.id).is_stopped();
                pod::sandbox_status_of(&rec, ready)
            });
        let (containers_statuses, at) = match taken {
            Some((statuses, at)) => (
                statuses
                    .iter()
                    .filter_map(|st| Some(self.cri_status(&records.container(&st.id)?, Some(st))))
                    .collect(),
                at,
            ),
            None => (Vec::new(), 0),
        };
        let ev = cri::ContainerEventResponse {
            container_id: container_id.to_string(),
            container_event_type: kind as i32,
            created_at: if at > 0 { at } else { sandbox::now_ns() },
            pod_sandbox_status,
            containers_statuses,
        };
        let _ = self.inner.events.send(ev);
    }
}

/// A new random 64-hex-digit id, as CRI runtimes use.
fn new_id() -> Result<String> {
    use std::io::Read;
    let mut buf = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| Error::internal(format!("reading /dev/urandom: {e}")))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Maps a sandbox error onto the CRI error codes.
fn sandbox_error(e: sandbox::Error) -> Error {
    let code = match e.kind() {
        sandbox::Kind::NotFound => Code::NotFound,
        sandbox::Kind::AlreadyExists => Code::AlreadyExists,
        sandbox::Kind::InvalidArgument => Code::InvalidArgument,
        sandbox::Kind::FailedPrecondition => Code::FailedPrecondition,
        sandbox::Kind::Unavailable => Code::Unavailable,
        sandbox::Kind::DeadlineExceeded => Code::DeadlineExceeded,
        sandbox::Kind::Internal => Code::Internal,
    };
    Error::new(code, e.to_string())
}

/// Maps an image store error onto the CRI error codes.
fn image_error(e: images::Error) -> Error {
    let code = match e.kind() {
        images::Kind::NotFound => Code::NotFound,
        images::Kind::InvalidArgument => Code::InvalidArgument,
        images::Kind::InUse => Code::FailedPrecondition,
        images::Kind::Unavailable => Code::Unavailable,
        images::Kind::PermissionDenied => Code::PermissionDenied,
        _ => Code::Internal,
    };
    Error::new(code, e.to_string())
}
