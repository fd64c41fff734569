//! The sandbox crate's own input and state types. They say nothing of CRI: the built-in runtime
//! adapter converts CRI requests into these.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Whether a namespace is the pod's own, the node's, or (for PID) each container's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum NamespaceMode {
    /// One namespace for the whole pod, held by the sandbox process.
    #[default]
    Pod,
    /// Each container gets its own (only meaningful for PID).
    Container,
    /// The node's namespace (hostNetwork, hostPID, hostIPC).
    Node,
}

/// The namespaces of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Namespaces {
    pub network: NamespaceMode,
    pub ipc: NamespaceMode,
    pub pid: NamespaceMode,
}

impl Default for Namespaces {
    fn default() -> Self {
        Namespaces {
            network: NamespaceMode::Pod,
            ipc: NamespaceMode::Pod,
            pid: NamespaceMode::Container,
        }
    }
}

/// DNS settings written into the pod's resolv.conf.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// Everything the sandbox process needs to set a pod up.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    /// The sandbox's id; also the name of its state directory.
    pub id: String,
    /// The pod's hostname (ignored with a node network namespace, which keeps the node's).
    pub hostname: String,
    pub namespaces: Namespaces,
    /// Absolute cgroup path of the pod (e.g. `/kubepods/burstable/pod1234`). The sandbox process
    /// lives in `<cgroup_parent>/sandbox`; containers are placed below `cgroup_parent` by the caller.
    pub cgroup_parent: String,
    /// Whether the sandbox created `cgroup_parent` and must remove it when it goes.
    pub owns_cgroup_parent: bool,
    /// With the systemd cgroup driver: the slice the pod's scope goes in. The sandbox process
    /// then first asks systemd for a delegated scope `nodelet-<id>.scope` in that slice (whose
    /// cgroup is `cgroup_parent`), so that systemd knows the pod's processes and leaves the
    /// cgroups below the scope to the sandbox.
    #[serde(default)]
    pub systemd_slice: Option<String>,
    /// DNS for resolv.conf; `None` copies the node's /etc/resolv.conf.
    pub dns: Option<Dns>,
    /// Extra `/etc/hosts` lines (ip, names).
    pub host_aliases: Vec<(String, Vec<String>)>,
    /// Namespaced sysctls to set in the pod's namespaces.
    pub sysctls: BTreeMap<String, String>,
    /// The pod's network interface, with its own network namespace; `None` gives it
    /// loopback only (or the node's network with a node network namespace).
    #[serde(default)]
    pub network: Option<PodNetwork>,
    /// A user namespace for the pod, with these ID mappings: the pod's network, IPC and UTS
    /// namespaces are then created inside it (so its containers, which join it, own them).
    #[serde(default)]
    pub user_namespace: Option<IdMappings>,
}

/// One contiguous range of IDs: `size` IDs from `container` inside map to `host` outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    pub container: u32,
    pub host: u32,
    pub size: u32,
}

/// The UID and GID mappings of a user namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMappings {
    pub uids: IdRange,
    pub gids: IdRange,
}

/// A pod's `eth0`: one end of a veth pair whose other end is on a bridge of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodNetwork {
    /// The node's bridge (created, with the gateway address, if missing).
    pub bridge: String,
    /// The node's end of the veth pair (at most 15 bytes).
    pub host_interface: String,
    /// The pod's first address (an IPv4 or IPv6 one).
    pub address: std::net::IpAddr,
    pub prefix_len: u8,
    /// The bridge's address of the same family: the pod's default route.
    pub gateway: std::net::IpAddr,
    /// The pod's address of the other family, on a dual-stack network.
    #[serde(default)]
    pub second: Option<PodAddress>,
    /// Node ports forwarded to the pod.
    #[serde(default)]
    pub ports: Vec<PortMapping>,
}

/// One address of a pod, with its subnet's length and gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodAddress {
    pub address: std::net::IpAddr,
    pub prefix_len: u8,
    pub gateway: std::net::IpAddr,
}

impl PodNetwork {
    /// Every address of the pod: the first, then the other family's.
    pub fn addresses(&self) -> impl Iterator<Item = PodAddress> + '_ {
        std::iter::once(PodAddress {
            address: self.address,
            prefix_len: self.prefix_len,
            gateway: self.gateway,
        })
        .chain(self.second)
    }
}

/// A port of the node forwarded to a port of the pod (a Kubernetes hostPort).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortMapping {
    pub protocol: Protocol,
    /// The node address to listen on; `None` listens on all of them.
    pub host_ip: Option<std::net::IpAddr>,
    pub host_port: u16,
    pub container_port: u16,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        })
    }
}

/// Where a sandbox keeps its files; all paths derive from the state directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub dir: PathBuf,
}

impl Layout {
    /// The layout of the sandbox whose state directory is `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Layout { dir: dir.into() }
    }
    pub fn spec(&self) -> PathBuf {
        self.dir.join("spec.json")
    }
    pub fn socket(&self) -> PathBuf {
        self.dir.join("sandbox.sock")
    }
    /// Where a terminal exec's console socket is bound while libcontainer sets it up.
    pub fn console_socket(&self) -> PathBuf {
        self.dir.join("console.sock")
    }
    pub fn pid_file(&self) -> PathBuf {
        self.dir.join("pid")
    }
    pub fn log(&self) -> PathBuf {
        self.dir.join("sandbox.log")
    }
    /// libcontainer's state root for this sandbox's containers.
    pub fn container_root(&self) -> PathBuf {
        self.dir.join("lc")
    }
    /// Where each container's status is persisted, so it outlives the sandbox process.
    pub fn status_dir(&self) -> PathBuf {
        self.dir.join("containers")
    }
    /// The pod's generated /etc files (hosts, hostname, resolv.conf).
    pub fn etc_dir(&self) -> PathBuf {
        self.dir.join("etc")
    }
    pub fn hosts(&self) -> PathBuf {
        self.etc_dir().join("hosts")
    }
    pub fn hostname(&self) -> PathBuf {
        self.etc_dir().join("hostname")
    }
    pub fn resolv_conf(&self) -> PathBuf {
        self.etc_dir().join("resolv.conf")
    }
    /// A file present once the sandbox has been shut down and cleaned up.
    pub fn stopped_marker(&self) -> PathBuf {
        self.dir.join("stopped")
    }
}

/// A container to create in the sandbox: an OCI bundle prepared by the caller.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    pub id: String,
    /// The OCI bundle: `config.json` and the root filesystem it names.
    pub bundle: PathBuf,
    /// Where stdout and stderr go, in the CRI log format; `None` discards them.
    pub log_path: Option<PathBuf>,
    /// Give the container a stdin pipe that attach requests can write to.
    #[serde(default)]
    pub stdin: bool,
    /// Close that stdin once the first attach that wrote to it has ended.
    #[serde(default)]
    pub stdin_once: bool,
}

/// A process to run in a container, waited for with a timeout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    pub container_id: String,
    pub args: Vec<String>,
    /// Zero means no timeout.
    pub timeout_ms: u64,
}

/// A process run in a container on the caller's stdio (see `Request::ExecStream`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamExecSpec {
    pub container_id: String,
    pub args: Vec<String>,
    /// Run it on a new terminal (made inside the container) instead of the passed descriptors.
    pub tty: bool,
}

/// What an exec produced.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ExecResult {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Lifecycle state of a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum State {
    Created,
    Running,
    Exited,
    Unknown,
}

/// The observed status of a container, persisted on every change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerStatus {
    pub id: String,
    pub state: State,
    /// PID of the container's init process in the sandbox's PID namespace (0 when none).
    pub pid: i32,
    /// Nanoseconds since the epoch; 0 when not yet.
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    /// `Completed`, `Error`, `OOMKilled` once exited.
    pub reason: String,
    pub message: String,
    pub log_path: Option<PathBuf>,
    /// The cgroup path the container runs in, from its OCI spec.
    pub cgroup_path: Option<String>,
}

/// The state of a whole sandbox as its process reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxState {
    pub id: String,
    pub pid: i32,
    /// PID of the process holding the pod's PID namespace, when the pod shares one.
    pub pid_ns_holder: Option<i32>,
    /// PID of the process holding the pod's user namespace, when it has one.
    #[serde(default)]
    pub userns_holder: Option<i32>,
    pub containers: Vec<ContainerStatus>,
}

/// Something that happened to a container, pushed to subscribers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    pub sandbox_id: String,
    pub status: ContainerStatus,
    /// Every container of the sandbox as of the event, the one it is about included (empty
    /// from a sandbox process of an older build).
    #[serde(default)]
    pub containers: Vec<ContainerStatus>,
    /// When the sandbox took these statuses, in nanoseconds since the Unix epoch (0 from a
    /// sandbox process of an older build).
    #[serde(default)]
    pub at: i64,
}

/// Nanoseconds since the Unix epoch, now.
pub fn now_ns() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}
