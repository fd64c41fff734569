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

use super::resource::{node_cpu_seconds, node_working_set};

type Time = String;

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs: Option<Fs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rlimit: Option<Rlimit>,
}

#[derive(Serialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    pub time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_nano_cores: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_core_nano_seconds: Option<u64>,
}

#[derive(Serialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    pub time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub working_set_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub page_faults: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub major_page_faults: Option<u64>,
}

#[derive(Serialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Fs {
    pub time: Time,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub available_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub used_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_free: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inodes_used: Option<u64>,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStats {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_fs: Option<Fs>,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct Rlimit {
    pub time: Time,
    pub maxpid: Option<u64>,
    pub curproc: Option<u64>,
}

#[derive(Serialize, Default, Clone)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_errors: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_errors: Option<u64>,
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

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<Fs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logs: Option<Fs>,
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
            let memory = fs.capacity_bytes.is_some() && is_tmpfs(&path);
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
    let kb = |key: &str| -> Option<u64> {
        meminfo
            .lines()
            .find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))?
            .split_whitespace()
            .nth(1)?
            .parse::<u64>()
            .ok()
            .map(|k| k * 1024)
    };
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
            available_bytes: kb("MemAvailable"),
            usage_bytes: kb("MemTotal").zip(kb("MemFree")).map(|(t, f)| t - f),
            working_set_bytes: node_working_set(&meminfo),
            rss_bytes: kb("AnonPages"),
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

/// The summary: the node, then each pod the runtime runs with its containers.
pub async fn summary(
    src: &Sources<'_>,
    rt: &dyn RuntimeService,
    images: &dyn ImageService,
) -> Result<Summary, String> {
    let now = runtime::clock::now_ns();
    let mut node = node(src, now);
    let image_fs = images
        .image_fs_info(cri::ImageFsInfoRequest {})
        .await
        .ok()
        .and_then(|r| r.image_filesystems.into_iter().next());
    let image_fs_stats = image_fs.as_ref().map(|f| {
        let mount = f
            .fs_id
            .as_ref()
            .map(|i| i.mountpoint.clone())
            .unwrap_or_default();
        let mut fs = statvfs(Path::new(&mount), f.timestamp).unwrap_or_default();
        fs.time = time(f.timestamp);
        fs.used_bytes = v(&f.used_bytes);
        fs.inodes_used = v(&f.inodes_used);
        fs
    });
    node.runtime = Some(RuntimeStats {
        image_fs: image_fs_stats.clone(),
    });
    let sandboxes = rt
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest { filter: None })
        .await
        .map_err(|e| format!("ListPodSandboxStats: {e}"))?
        .stats;
    let containers = rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .map_err(|e| format!("ListContainers: {e}"))?
        .containers;
    let created: HashMap<&str, i64> = containers
        .iter()
        .map(|c| (c.id.as_str(), c.created_at))
        .collect();
    let sandbox_created: HashMap<String, i64> = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
        .await
        .map(|r| r.items.into_iter().map(|s| (s.id, s.created_at)).collect())
        .unwrap_or_default();
    let logs_fs = statvfs(src.pod_logs_dir, now);
    let mut pods = Vec::new();
    for s in &sandboxes {
        let Some(attrs) = &s.attributes else { continue };
        let meta = attrs.metadata.clone().unwrap_or_default();
        let Some(linux) = &s.linux else { continue };
        let pod_logs = src
            .pod_logs_dir
            .join(format!("{}_{}_{}", meta.namespace, meta.name, meta.uid));
        let mut ephemeral = (0u64, 0u64, true);
        let mut out = Vec::new();
        for c in &linux.containers {
            let Some(ca) = &c.attributes else { continue };
            let name = ca
                .metadata
                .as_ref()
                .map(|m| m.name.clone())
                .unwrap_or_default();
            let rootfs = c.writable_layer.as_ref().map(|w| {
                let mut fs = image_fs_stats.clone().unwrap_or_default();
                fs.time = time(w.timestamp);
                fs.used_bytes = v(&w.used_bytes);
                fs.inodes_used = v(&w.inodes_used);
                fs
            });
            let logs = du(&pod_logs.join(&name)).map(|(b, i)| {
                let mut fs = logs_fs.clone().unwrap_or_default();
                fs.time = time(now);
                fs.used_bytes = Some(b);
                fs.inodes_used = Some(i);
                fs
            });
            for part in [&rootfs, &logs] {
                match part.as_ref().and_then(|f| f.used_bytes.zip(f.inodes_used)) {
                    Some((b, i)) => {
                        ephemeral.0 += b;
                        ephemeral.1 += i;
                    }
                    None => ephemeral.2 = false,
                }
            }
            out.push(ContainerStats {
                start_time: created.get(ca.id.as_str()).map(|t| time(*t)),
                cpu: cpu(&format!("container/{}", ca.id), &c.cpu),
                memory: memory(&c.memory),
                name,
                rootfs,
                logs,
            });
        }
        let network = linux.network.as_ref().map(|n| {
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
        });
        let (volumes, vol_bytes, vol_inodes) = volumes(src.pods_dir, &meta.uid, now);
        ephemeral.0 += vol_bytes;
        ephemeral.1 += vol_inodes;
        pods.push(PodStats {
            pod_ref: PodRef {
                name: meta.name.clone(),
                namespace: meta.namespace.clone(),
                uid: meta.uid.clone(),
            },
            start_time: sandbox_created.get(&attrs.id).map(|t| time(*t)),
            containers: out,
            cpu: cpu(&format!("pod/{}", attrs.id), &linux.cpu),
            memory: memory(&linux.memory),
            network,
            volumes,
            // The containers' writable layers and logs, and the disk-backed emptyDirs.
            ephemeral_storage: ephemeral.2.then(|| Fs {
                time: time(now),
                used_bytes: Some(ephemeral.0),
                inodes_used: Some(ephemeral.1),
                ..logs_fs.clone().unwrap_or_default()
            }),
            process_stats: linux.process.as_ref().map(|p| ProcessStats {
                process_count: v(&p.process_count),
            }),
        });
    }
    Ok(Summary { node, pods })
}

#[cfg(test)]
mod tests {
    use super::*;

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
