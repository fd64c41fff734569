//! What the Node object is built from, read from the machine once at start: CPUs, memory,
//! the root directory's filesystem, addresses and the identity files. Gathering is the only
//! I/O of the node module's pure core; [`super::build_node`] turns the facts into a `Node`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs, UdpSocket};
use std::path::Path;

use super::Error;
use crate::config::KubeletConfig;

pub use crate::version::{KUBERNETES_VERSION, goarch, kubelet_version};

/// The machine as the node reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// The node's name (`cfg.node_name`), also its `kubernetes.io/hostname` label.
    pub hostname: String,
    /// The InternalIP address.
    pub node_ip: IpAddr,
    /// The other family's address of a dual-stack `--node-ip`.
    pub secondary_node_ip: Option<IpAddr>,
    /// CPUs this process may run on (like Go's `runtime.NumCPU`).
    pub cpus: u32,
    /// `MemTotal` in bytes.
    pub memory_bytes: u64,
    /// `SwapTotal` in bytes (`nodeInfo.swap.capacity`), if known.
    pub swap_bytes: Option<u64>,
    /// Size in bytes of the filesystem holding the root directory.
    pub ephemeral_storage_bytes: u64,
    /// `maxPods`.
    pub max_pods: u32,
    /// Huge page size in bytes → pages reserved (`nr_hugepages`), per supported size.
    pub hugepages: BTreeMap<u64, u64>,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
    pub kernel_version: String,
    pub os_image: String,
    /// Always `linux`.
    pub operating_system: String,
    /// In Go's GOARCH names (`amd64`, `arm64`, ...).
    pub architecture: String,
    /// `<runtime name>://<runtime version>`.
    pub container_runtime_version: String,
    pub kubelet_version: String,
    /// The kubelet server's port, advertised in `daemonEndpoints` (the one bound).
    pub kubelet_port: u16,
}

impl NodeFacts {
    /// The node's addresses: the primary, then the other family's of a dual-stack node.
    pub fn node_ips(&self) -> Vec<IpAddr> {
        std::iter::once(self.node_ip)
            .chain(self.secondary_node_ip)
            .collect()
    }

    /// Reads the facts from this machine. Missing identity files give empty strings (as
    /// upstream reports them); unreadable CPU, memory or root filesystem are errors.
    pub fn gather(
        cfg: &KubeletConfig,
        runtime_name: &str,
        runtime_version: &str,
    ) -> Result<NodeFacts, Error> {
        let meminfo = std::fs::read_to_string("/proc/meminfo").map_err(Error::ReadMeminfo)?;
        let memory_bytes = meminfo_bytes(&meminfo, "MemTotal").ok_or(Error::NoMemTotal)?;
        let os_release = std::fs::read_to_string("/etc/os-release")
            .or_else(|_| std::fs::read_to_string("/usr/lib/os-release"))
            .unwrap_or_default();
        Ok(NodeFacts {
            hostname: cfg.node_name.clone(),
            node_ip: cfg
                .node_ips
                .first()
                .copied()
                .unwrap_or_else(|| host_ip(&cfg.node_name)),
            secondary_node_ip: cfg.node_ips.get(1).copied(),
            cpus: cpu_count()?,
            memory_bytes,
            swap_bytes: meminfo_bytes(&meminfo, "SwapTotal"),
            ephemeral_storage_bytes: fs_capacity(&cfg.root_dir)?,
            max_pods: cfg.max_pods,
            hugepages: hugepages(Path::new("/sys/kernel/mm/hugepages")),
            machine_id: read_trimmed("/etc/machine-id"),
            system_uuid: read_trimmed("/sys/class/dmi/id/product_uuid"),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
            kernel_version: read_trimmed("/proc/sys/kernel/osrelease"),
            os_image: pretty_name(&os_release),
            operating_system: "linux".to_string(),
            architecture: goarch(std::env::consts::ARCH).to_string(),
            container_runtime_version: format!("{runtime_name}://{runtime_version}"),
            kubelet_version: kubelet_version(),
            kubelet_port: cfg.server.port,
        })
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// CPUs in this process's affinity mask, as Go's `runtime.NumCPU` counts them.
fn cpu_count() -> Result<u32, Error> {
    use nix::sched::{CpuSet, sched_getaffinity};
    use nix::unistd::Pid;
    let set = sched_getaffinity(Pid::from_raw(0)).map_err(Error::CpuAffinity)?;
    let n = (0..CpuSet::count())
        .filter(|&i| set.is_set(i).unwrap_or(false))
        .count();
    if n == 0 {
        // An empty mask cannot happen for a running process; fall back to what std sees.
        return Ok(std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    }
    Ok(u32::try_from(n)?)
}

/// The huge page sizes under `dir` (`/sys/kernel/mm/hugepages`: `hugepages-2048kB/nr_hugepages`)
/// with their reserved page counts; none when it cannot be read.
pub fn hugepages(dir: &Path) -> BTreeMap<u64, u64> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let kb: u64 = name
                .strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()?;
            let pages = std::fs::read_to_string(e.path().join("nr_hugepages")).ok()?;
            Some((kb.checked_mul(1024)?, pages.trim().parse().ok()?))
        })
        .collect()
}

/// The `key` line (`MemTotal`, `SwapTotal`) of a `/proc/meminfo` text, in bytes.
pub fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    let rest = meminfo
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    let mut words = rest.split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// `PRETTY_NAME` of an os-release text (quotes removed); `Linux` when absent, as upstream.
pub fn pretty_name(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches(['"', '\'']).to_string())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "Linux".to_string())
}

/// Size of the filesystem holding `dir` (or its nearest existing ancestor, so the root
/// directory need not exist yet).
fn fs_capacity(dir: &Path) -> Result<u64, Error> {
    let mut path = dir;
    while !path.exists() {
        path = path.parent().unwrap_or(Path::new("/"));
    }
    let st = nix::sys::statvfs::statvfs(path).map_err(|source| Error::Statvfs {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(st.blocks().saturating_mul(st.fragment_size()))
}

/// The node's address when `--node-ip` is not given, as upstream looks for it: the first
/// non-loopback IPv4 address the node name resolves to, else the address of the interface
/// holding the default route, else 127.0.0.1.
fn host_ip(node_name: &str) -> IpAddr {
    let resolved = (node_name, 0u16)
        .to_socket_addrs()
        .ok()
        .into_iter()
        .flatten()
        .map(|a| a.ip())
        .find(|ip| ip.is_ipv4() && !ip.is_loopback() && !ip.is_unspecified());
    resolved
        .or_else(default_route_ip)
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// The source address the kernel picks for a packet to a public address: connecting a UDP
/// socket sends nothing, it only routes.
fn default_route_ip() -> Option<IpAddr> {
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).ok()?;
    socket.connect((Ipv4Addr::new(192, 0, 2, 1), 9)).ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo() {
        let text = "MemTotal:       16318428 kB\nMemFree:         1000 kB\nSwapTotal:  0 kB\n";
        assert_eq!(meminfo_bytes(text, "MemTotal"), Some(16318428 * 1024));
        assert_eq!(meminfo_bytes(text, "SwapTotal"), Some(0));
        assert_eq!(meminfo_bytes(text, "Mem"), None);
        assert_eq!(meminfo_bytes("MemFree: 1 kB\n", "MemTotal"), None);
        assert_eq!(meminfo_bytes("MemTotal: x kB\n", "MemTotal"), None);
    }

    #[test]
    fn hugepage_sizes() {
        let dir = tempfile::tempdir().unwrap();
        for (name, pages) in [("hugepages-2048kB", "3\n"), ("hugepages-1048576kB", "0\n")] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            std::fs::write(dir.path().join(name).join("nr_hugepages"), pages).unwrap();
        }
        std::fs::create_dir(dir.path().join("unrelated")).unwrap();
        assert_eq!(
            hugepages(dir.path()),
            BTreeMap::from([(2 * 1024 * 1024, 3), (1024 * 1024 * 1024, 0)])
        );
        assert!(hugepages(&dir.path().join("missing")).is_empty());
    }

    #[test]
    fn os_release() {
        let text = "NAME=\"Debian GNU/Linux\"\nPRETTY_NAME=\"Debian GNU/Linux 13 (trixie)\"\n";
        assert_eq!(pretty_name(text), "Debian GNU/Linux 13 (trixie)");
        assert_eq!(pretty_name("NAME=x\n"), "Linux");
    }

    #[test]
    fn arch_names() {
        assert_eq!(goarch("x86_64"), "amd64");
        assert_eq!(goarch("aarch64"), "arm64");
        assert_eq!(goarch("s390x"), "s390x");
        assert_eq!(goarch("riscv64"), "riscv64");
    }

    #[test]
    fn version_is_semver_with_nodelet_build() {
        let v = kubelet_version();
        assert!(v.starts_with("v1.37.0+nodelet."), "{v}");
    }

    #[test]
    fn gather_reads_this_machine() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = KubeletConfig {
            node_name: "node-a".into(),
            node_ips: vec!["10.1.2.3".parse().unwrap()],
            root_dir: dir.path().join("not/yet/created"),
            max_pods: 7,
            ..Default::default()
        };
        let f = NodeFacts::gather(&cfg, "nodelet", "0.1.0").unwrap();
        assert_eq!(f.hostname, "node-a");
        assert_eq!(f.node_ip, "10.1.2.3".parse::<IpAddr>().unwrap());
        assert!(f.cpus >= 1);
        // std's count also honours cgroup CPU quotas, so it can only be lower.
        assert!(f.cpus as usize >= std::thread::available_parallelism().unwrap().get());
        assert!(f.memory_bytes > 64 * 1024 * 1024);
        assert!(f.ephemeral_storage_bytes > 0);
        assert_eq!(f.max_pods, 7);
        assert_eq!(f.operating_system, "linux");
        assert_eq!(f.container_runtime_version, "nodelet://0.1.0");
        assert!(!f.kernel_version.is_empty());
        assert_eq!(f.boot_id.len(), 36, "{}", f.boot_id);
    }

    #[test]
    fn gather_without_node_ip_finds_one() {
        let cfg = KubeletConfig {
            node_name: "localhost".into(),
            node_ips: Vec::new(),
            root_dir: "/".into(),
            ..Default::default()
        };
        let f = NodeFacts::gather(&cfg, "r", "1").unwrap();
        // "localhost" resolves only to loopback, so this is the default-route address, or
        // 127.0.0.1 on a machine without one; never unspecified.
        assert!(f.node_ip.is_ipv4());
        assert!(!f.node_ip.is_unspecified());
    }
}
