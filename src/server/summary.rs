//! `/stats/summary`: the Summary API (`stats/v1alpha1`) as upstream's kubelet serves it, for the
//! node and every pod and container, from the host (`/proc`, `statvfs`) and the runtime's CRI
//! stats (ListPodSandboxStats with its containers, ImageFsInfo).
//!
//! Rates (`usageNanoCores`) need two samples: each CPU counter's last sample is kept, and a
//! rate is written from the second scrape on. Only what is known is written: a field without a
//! source (the first scrape's rate) is left out, never zero. Volumes are the pod directory's
//! (emptyDirs and the written ones); PVCs and hostPaths are not measured.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use runtime::{ImageService, RuntimeService, cri};
use serde::Serialize;

use super::container_name;
use super::resource::{meminfo_kb, node_cpu_seconds, node_working_set};

type Time = String;

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

/// Declares Summary API objects whose every field is left out of the JSON while it is
/// unknown (an `Option` that is `None`; a `String` always counts as known): the module's rule,
/// only what is known is written, never a null or a zero.
macro_rules! objects {
    ($(
        $(#[$meta:meta])*
        pub struct $name:ident {
            $($(#[$field_meta:meta])* pub $field:ident: $ty:ty,)*
        }
    )*) => {$(
        $(#[$meta])*
        pub struct $name {
            $(
                $(#[$field_meta])*
                #[serde(skip_serializing_if = "Known::unknown")]
                pub $field: $ty,
            )*
        }
    )*};
}

/// Whether a field of an [`objects!`] struct has a value to write.
trait Known {
    fn unknown(&self) -> bool;
}

impl<T> Known for Option<T> {
    fn unknown(&self) -> bool {
        self.is_none()
    }
}

impl Known for String {
    fn unknown(&self) -> bool {
        false
    }
}

objects! {
    #[derive(Serialize, Default)]
    #[serde(rename_all = "camelCase")]
    pub struct NodeStats {
        pub node_name: String,
        pub start_time: Option<Time>,
        pub cpu: Option<Cpu>,
        pub memory: Option<Memory>,
        pub fs: Option<Fs>,
        pub runtime: Option<RuntimeStats>,
        pub rlimit: Option<Rlimit>,
    }

    #[derive(Serialize, Default, Clone)]
    #[serde(rename_all = "camelCase")]
    pub struct Cpu {
        pub time: Time,
        pub usage_nano_cores: Option<u64>,
        pub usage_core_nano_seconds: Option<u64>,
    }

    #[derive(Serialize, Default, Clone)]
    #[serde(rename_all = "camelCase")]
    pub struct Memory {
        pub time: Time,
        pub available_bytes: Option<u64>,
        pub usage_bytes: Option<u64>,
        pub working_set_bytes: Option<u64>,
        pub rss_bytes: Option<u64>,
        pub page_faults: Option<u64>,
        pub major_page_faults: Option<u64>,
    }

    #[derive(Serialize, Default, Clone)]
    #[serde(rename_all = "camelCase")]
    pub struct Fs {
        pub time: Time,
        pub available_bytes: Option<u64>,
        pub capacity_bytes: Option<u64>,
        pub used_bytes: Option<u64>,
        pub inodes_free: Option<u64>,
        pub inodes: Option<u64>,
        pub inodes_used: Option<u64>,
    }

    #[derive(Serialize, Default)]
    #[serde(rename_all = "camelCase")]
    pub struct RuntimeStats {
        pub image_fs: Option<Fs>,
    }

    #[derive(Serialize, Default, Clone)]
    #[serde(rename_all = "camelCase")]
    pub struct Interface {
        pub name: String,
        pub rx_bytes: Option<u64>,
        pub rx_errors: Option<u64>,
        pub tx_bytes: Option<u64>,
        pub tx_errors: Option<u64>,
    }

    #[derive(Serialize, Default)]
    #[serde(rename_all = "camelCase")]
    pub struct ContainerStats {
        pub name: String,
        pub start_time: Option<Time>,
        pub cpu: Option<Cpu>,
        pub memory: Option<Memory>,
        pub rootfs: Option<Fs>,
        pub logs: Option<Fs>,
    }
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Rlimit {
    pub time: Time,
    pub maxpid: Option<u64>,
    pub curproc: Option<u64>,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    pub time: Time,
    #[serde(flatten)]
    pub default: Interface,
    pub interfaces: Vec<Interface>,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodRef,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    pub containers: Vec<ContainerStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network: Option<Network>,
    #[serde(rename = "volume", skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<VolumeStats>,
    #[serde(rename = "ephemeral-storage", skip_serializing_if = "Option::is_none")]
    pub ephemeral_storage: Option<Fs>,
    /// Upstream spells this one (and its field) in snake case.
    #[serde(rename = "process_stats", skip_serializing_if = "Option::is_none")]
    pub process_stats: Option<ProcessStats>,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStats {
    pub name: String,
    #[serde(flatten)]
    pub fs: Fs,
}

#[derive(Serialize, Default)]
pub struct ProcessStats {
    pub process_count: Option<u64>,
}

/// The last CPU sample of each counter (node, pods, containers): (time ns, usage ns).
static LAST_CPU: Mutex<Option<HashMap<String, (i64, u64)>>> = Mutex::new(None);

/// Nano-cores between the last sample of `key` and this one, which becomes the last.
fn rate(key: &str, ts: i64, usage: u64) -> Option<u64> {
    let mut guard = LAST_CPU.lock().unwrap_or_else(|e| e.into_inner());
    let last = guard.get_or_insert_with(HashMap::new);
    let prev = last.insert(key.to_string(), (ts, usage));
    let (pts, pusage) = prev?;
    let dt = ts.checked_sub(pts).filter(|d| *d > 0)?;
    let du = usage.checked_sub(pusage)?;
    Some((du as f64 * 1e9 / dt as f64) as u64)
}

fn time(ns: i64) -> Time {
    chrono::DateTime::from_timestamp(ns / 1_000_000_000, (ns % 1_000_000_000) as u32)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_default()
}

fn v(x: &Option<cri::UInt64Value>) -> Option<u64> {
    x.as_ref().map(|v| v.value)
}

fn cpu(key: &str, c: &Option<cri::CpuUsage>) -> Option<Cpu> {
    let c = c.as_ref()?;
    let usage = v(&c.usage_core_nano_seconds);
    Some(Cpu {
        time: time(c.timestamp),
        usage_nano_cores: usage.and_then(|u| rate(key, c.timestamp, u)),
        usage_core_nano_seconds: usage,
    })
}

fn memory(m: &Option<cri::MemoryUsage>) -> Option<Memory> {
    let m = m.as_ref()?;
    Some(Memory {
        time: time(m.timestamp),
        available_bytes: v(&m.available_bytes),
        usage_bytes: v(&m.usage_bytes),
        working_set_bytes: v(&m.working_set_bytes),
        rss_bytes: v(&m.rss_bytes),
        page_faults: v(&m.page_faults),
        major_page_faults: v(&m.major_page_faults),
    })
}

/// The filesystem holding `path`: capacity, available and used bytes, inodes.
fn statvfs(path: &Path, ts: i64) -> Option<Fs> {
    let s = rustix::fs::statvfs(path).ok()?;
    let block = s.f_frsize;
    Some(Fs {
        time: time(ts),
        available_bytes: Some(s.f_bavail * block),
        capacity_bytes: Some(s.f_blocks * block),
        used_bytes: Some(s.f_blocks.saturating_sub(s.f_bfree) * block),
        inodes_free: Some(s.f_ffree),
        inodes: Some(s.f_files),
        inodes_used: Some(s.f_files.saturating_sub(s.f_ffree)),
    })
}

/// Disk usage and inodes of what is under `dir` (not following links; hard links once).
fn du(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = std::collections::HashSet::new();
    let (mut bytes, mut inodes) = (0, 0);
    let mut dirs = vec![dir.to_path_buf()];
    let mut first = true;
    while let Some(d) = dirs.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(_) if !first => continue,
            Err(_) => return None,
        };
        first = false;
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            if m.is_dir() {
                dirs.push(e.path());
            }
            if seen.insert((m.dev(), m.ino())) {
                bytes += m.blocks() * 512;
                inodes += 1;
            }
        }
    }
    Some((bytes, inodes))
}

/// The pod's volumes the kubelet keeps in its directory (`<pods dir>/<uid>/volumes/
/// kubernetes.io~<plugin>/<name>`: emptyDirs and the written configMap, secret, downwardAPI
/// and projected ones), measured; and the bytes and inodes of the disk-backed emptyDirs, which
/// count in the pod's ephemeral storage.
fn volumes(pods_dir: &Path, uid: &str, now: i64) -> (Vec<VolumeStats>, u64, u64) {
    let mut out = Vec::new();
    let (mut bytes, mut inodes) = (0, 0);
    let base = pods_dir.join(uid).join("volumes");
    for plugin in std::fs::read_dir(&base).into_iter().flatten().flatten() {
        let empty_dir = plugin.file_name() == "kubernetes.io~empty-dir";
        for vol in std::fs::read_dir(plugin.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let path = vol.path();
            let Some((b, i)) = du(&path) else { continue };
            let mut fs = statvfs(&path, now).unwrap_or_default();
            // A memory-backed emptyDir is a tmpfs mounted on its directory (a disk one may
            // sit on a tmpfs root and still counts as disk).
            let memory = fs.capacity_bytes.is_some() && is_mount_point(&path) && is_tmpfs(&path);
            if empty_dir && !memory {
                bytes += b;
                inodes += i;
            }
            fs.time = time(now);
            fs.used_bytes = Some(b);
            fs.inodes_used = Some(i);
            out.push(VolumeStats {
                name: vol.file_name().to_string_lossy().into_owned(),
                fs,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    (out, bytes, inodes)
}

/// Whether something is mounted on `path` (its device differs from its parent's).
fn is_mount_point(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let parent = path.parent().unwrap_or(path);
    match (std::fs::metadata(path), std::fs::metadata(parent)) {
        (Ok(p), Ok(q)) => p.dev() != q.dev(),
        _ => false,
    }
}

/// Whether `path` is on a tmpfs (a memory-backed volume).
fn is_tmpfs(path: &Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    rustix::fs::statfs(path).is_ok_and(|s| s.f_type == TMPFS_MAGIC)
}

/// What the summary reads besides the runtime.
pub struct Sources<'a> {
    pub node_name: &'a str,
    pub root_dir: &'a Path,
    pub pod_logs_dir: &'a Path,
    /// `<root dir>/pods`, where the pods' volumes are.
    pub pods_dir: &'a Path,
}

/// The node's own figures, from `/proc` and the root dir's filesystem.
fn node(src: &Sources<'_>, now: i64) -> NodeStats {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let stat = read("/proc/stat");
    let meminfo = read("/proc/meminfo").unwrap_or_default();
    let bytes = |key: &str| meminfo_kb(&meminfo, key).map(|k| k * 1024);
    let vmstat = read("/proc/vmstat").unwrap_or_default();
    let counter = |key: &str| {
        vmstat
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
    };
    let boot = stat.as_deref().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<i64>().ok())
    });
    let usage = stat
        .as_deref()
        .and_then(node_cpu_seconds)
        .map(|s| (s * 1e9) as u64);
    let procs = std::fs::read_dir("/proc").ok().map(|d| {
        d.flatten()
            .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
            .count() as u64
    });
    NodeStats {
        node_name: src.node_name.to_string(),
        start_time: boot.map(|b| time(b * 1_000_000_000)),
        cpu: Some(Cpu {
            time: time(now),
            usage_nano_cores: usage.and_then(|u| rate("node", now, u)),
            usage_core_nano_seconds: usage,
        }),
        memory: Some(Memory {
            time: time(now),
            available_bytes: bytes("MemAvailable"),
            usage_bytes: bytes("MemTotal").zip(bytes("MemFree")).map(|(t, f)| t - f),
            working_set_bytes: node_working_set(&meminfo),
            rss_bytes: bytes("AnonPages"),
            page_faults: counter("pgfault"),
            major_page_faults: counter("pgmajfault"),
        }),
        fs: statvfs(src.root_dir, now),
        runtime: None,
        rlimit: Some(Rlimit {
            time: time(now),
            maxpid: read("/proc/sys/kernel/pid_max").and_then(|s| s.trim().parse().ok()),
            curproc: procs,
        }),
    }
}

/// Why there is no summary: the runtime could not list what it runs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ListPodSandboxStats: {0}")]
    ListPodSandboxStats(#[source] runtime::Error),
    #[error("ListContainers: {0}")]
    ListContainers(#[source] runtime::Error),
}

/// The summary: the node, then each pod the runtime runs with its containers.
pub async fn summary(
    src: &Sources<'_>,
    rt: &dyn RuntimeService,
    images: &dyn ImageService,
) -> Result<Summary, Error> {
    let now = runtime::clock::now_ns();
    let mut node = node(src, now);
    let image_fs = image_fs(images).await;
    node.runtime = Some(RuntimeStats {
        image_fs: image_fs.clone(),
    });
    let sandboxes = sandbox_stats(rt).await?;
    let containers = rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .map_err(Error::ListContainers)?
        .containers;
    let sandboxes_created = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .map(|r| r.items.into_iter().map(|s| (s.id, s.created_at)).collect())
        .unwrap_or_default();
    let scrape = Scrape {
        src,
        now,
        containers_created: containers
            .into_iter()
            .map(|c| (c.id, c.created_at))
            .collect(),
        sandboxes_created,
        image_fs,
        logs_fs: statvfs(src.pod_logs_dir, now),
    };
    let pods = sandboxes.iter().filter_map(|s| scrape.pod(s)).collect();
    Ok(Summary { node, pods })
}

/// Every sandbox's stats. When the runtime cannot list them all (containerd 1.6 fails the
/// whole list when one sandbox's metrics cannot be decoded, as for a pod being torn down), each
/// ready sandbox is asked on its own; the list's error stands only if one of those fails too.
async fn sandbox_stats(rt: &dyn RuntimeService) -> Result<Vec<cri::PodSandboxStats>, Error> {
    let listed = rt
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest { filter: None })
        .await;
    let e = match listed {
        Ok(r) => return Ok(r.stats),
        Err(e) => e,
    };
    let ready = cri::ListPodSandboxRequest {
        filter: Some(cri::PodSandboxFilter {
            state: Some(cri::PodSandboxStateValue {
                state: cri::PodSandboxState::SandboxReady as i32,
            }),
            ..Default::default()
        }),
    };
    let Ok(ready) = rt.list_pod_sandbox(ready).await else {
        return Err(Error::ListPodSandboxStats(e));
    };
    let mut stats = Vec::new();
    for pod in ready.items {
        let req = cri::PodSandboxStatsRequest {
            pod_sandbox_id: pod.id,
        };
        match rt.pod_sandbox_stats(req).await {
            Ok(r) => stats.extend(r.stats),
            Err(_) => return Err(Error::ListPodSandboxStats(e)),
        }
    }
    tracing::debug!("ListPodSandboxStats: {e}; each ready pod's stats read on their own");
    Ok(stats)
}

/// The image filesystem's figures: the runtime's usage on the filesystem's own.
async fn image_fs(images: &dyn ImageService) -> Option<Fs> {
    let f = images
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .ok()?
        .image_filesystems
        .into_iter()
        .next()?;
    let mount = f
        .fs_id
        .as_ref()
        .map(|i| i.mountpoint.clone())
        .unwrap_or_default();
    let mut fs = statvfs(Path::new(&mount), f.timestamp).unwrap_or_default();
    fs.time = time(f.timestamp);
    fs.used_bytes = v(&f.used_bytes);
    fs.inodes_used = v(&f.inodes_used);
    Some(fs)
}

/// What one summary reads the pods' stats against.
struct Scrape<'a> {
    src: &'a Sources<'a>,
    now: i64,
    /// When each container and sandbox was made, by id.
    containers_created: HashMap<String, i64>,
    sandboxes_created: HashMap<String, i64>,
    /// The filesystems of the images (the writable layers) and of the logs.
    image_fs: Option<Fs>,
    logs_fs: Option<Fs>,
}

impl Scrape<'_> {
    /// A pod's stats from its sandbox's, with its containers and volumes.
    fn pod(&self, s: &cri::PodSandboxStats) -> Option<PodStats> {
        let attrs = s.attributes.as_ref()?;
        let meta = attrs.metadata.clone().unwrap_or_default();
        let linux = s.linux.as_ref()?;
        let pod_logs = self
            .src
            .pod_logs_dir
            .join(format!("{}_{}_{}", meta.namespace, meta.name, meta.uid));
        let containers: Vec<ContainerStats> = linux
            .containers
            .iter()
            .filter_map(|c| self.container(&pod_logs, c))
            .collect();
        // The containers' writable layers and logs, when each is known.
        let layers_and_logs = containers
            .iter()
            .flat_map(|c| [&c.rootfs, &c.logs])
            .try_fold((0u64, 0u64), |(bytes, inodes), part| {
                let fs = part.as_ref()?;
                let (b, i) = fs.used_bytes.zip(fs.inodes_used)?;
                Some((bytes + b, inodes + i))
            });
        let (volumes, vol_bytes, vol_inodes) = volumes(self.src.pods_dir, &meta.uid, self.now);
        Some(PodStats {
            pod_ref: PodRef {
                name: meta.name.clone(),
                namespace: meta.namespace.clone(),
                uid: meta.uid.clone(),
            },
            start_time: self.sandboxes_created.get(&attrs.id).map(|t| time(*t)),
            containers,
            cpu: cpu(&format!("pod/{}", attrs.id), &linux.cpu),
            memory: memory(&linux.memory),
            network: linux.network.as_ref().map(network),
            volumes,
            // The containers' writable layers and logs, and the disk-backed emptyDirs.
            ephemeral_storage: layers_and_logs.map(|(bytes, inodes)| Fs {
                time: time(self.now),
                used_bytes: Some(bytes + vol_bytes),
                inodes_used: Some(inodes + vol_inodes),
                ..self.logs_fs.clone().unwrap_or_default()
            }),
            process_stats: linux.process.as_ref().map(|p| ProcessStats {
                process_count: v(&p.process_count),
            }),
        })
    }

    /// A container's stats, its logs measured in `pod_logs`.
    fn container(&self, pod_logs: &Path, c: &cri::ContainerStats) -> Option<ContainerStats> {
        let ca = c.attributes.as_ref()?;
        let name = container_name(ca.metadata.as_ref());
        let rootfs = c.writable_layer.as_ref().map(|w| {
            let mut fs = self.image_fs.clone().unwrap_or_default();
            fs.time = time(w.timestamp);
            fs.used_bytes = v(&w.used_bytes);
            fs.inodes_used = v(&w.inodes_used);
            fs
        });
        let logs = du(&pod_logs.join(&name)).map(|(b, i)| {
            let mut fs = self.logs_fs.clone().unwrap_or_default();
            fs.time = time(self.now);
            fs.used_bytes = Some(b);
            fs.inodes_used = Some(i);
            fs
        });
        Some(ContainerStats {
            start_time: self.containers_created.get(&ca.id).map(|t| time(*t)),
            cpu: cpu(&format!("container/{}", ca.id), &c.cpu),
            memory: memory(&c.memory),
            name,
            rootfs,
            logs,
        })
    }
}

/// A pod's network figures, its default interface's at the top.
fn network(n: &cri::NetworkUsage) -> Network {
    let iface = |i: &cri::NetworkInterfaceUsage| Interface {
        name: i.name.clone(),
        rx_bytes: v(&i.rx_bytes),
        rx_errors: v(&i.rx_errors),
        tx_bytes: v(&i.tx_bytes),
        tx_errors: v(&i.tx_errors),
    };
    Network {
        time: time(n.timestamp),
        default: n.default_interface.as_ref().map(iface).unwrap_or_default(),
        interfaces: n.interfaces.iter().map(iface).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn run_pod(rt: &runtime::fake::FakeRuntime, name: &str) -> String {
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: name.into(),
                namespace: "ns".into(),
                attempt: 0,
            }),
            ..Default::default()
        };
        rt.run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .pod_sandbox_id
    }

    #[tokio::test]
    async fn a_failed_stats_list_falls_back_to_each_ready_pod() {
        let rt = runtime::fake::FakeRuntime::new();
        let ready = run_pod(&rt, "ready").await;
        let stopped = run_pod(&rt, "stopped").await;
        rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: stopped,
        })
        .await
        .unwrap();
        let all = sandbox_stats(&rt).await.unwrap();
        assert_eq!(all.len(), 2);
        // The list fails (a sandbox being torn down): the ready pod's stats, on their own.
        rt.inject_error(
            "ListPodSandboxStats",
            runtime::Error::new(runtime::Code::Unknown, "failed to decode"),
        );
        let got = sandbox_stats(&rt).await.unwrap();
        let ids: Vec<&str> = got
            .iter()
            .filter_map(|s| s.attributes.as_ref().map(|a| a.id.as_str()))
            .collect();
        assert_eq!(ids, [ready.as_str()]);
        // A ready pod's own stats fail too: no stats, the list's error.
        rt.inject_error(
            "ListPodSandboxStats",
            runtime::Error::new(runtime::Code::Unknown, "failed to decode"),
        );
        rt.inject_error(
            "PodSandboxStats",
            runtime::Error::new(runtime::Code::Unknown, "gone"),
        );
        let err = sandbox_stats(&rt).await.unwrap_err();
        assert!(err.to_string().contains("failed to decode"), "{err}");
    }

    #[test]
    fn cpu_rates_come_from_two_samples() {
        assert_eq!(rate("test/a", 1_000_000_000, 5_000_000_000), None);
        // Half a core over two seconds.
        assert_eq!(
            rate("test/a", 3_000_000_000, 6_000_000_000),
            Some(500_000_000)
        );
        // A counter that went back (a restarted container) has no rate.
        assert_eq!(rate("test/a", 4_000_000_000, 1_000), None);
    }
}
