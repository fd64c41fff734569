//! Which pod goes first, and what its status says (upstream's ranking functions and
//! `evictionMessage`): under memory pressure, pods using more than they request first, then
//! by priority, then by how far their usage exceeds their request; under disk pressure the
//! same with ephemeral storage (inodes: by inodes used); under PID pressure by priority, then
//! by process count. Critical pods are never chosen.

use std::cmp::Ordering;
use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::thresholds::{Observations, Threshold, display_quantity};
use crate::config::SYSTEM_CRITICAL_PRIORITY;
use crate::server::summary::Summary;
use crate::util::quantity;

/// What one container uses, as its messages need it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerUsage {
    pub name: String,
    /// Memory working set.
    pub memory: Option<u64>,
    /// Writable layer and logs.
    pub storage: Option<u64>,
}

/// What one pod uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodUsage {
    pub memory: Option<u64>,
    /// Ephemeral storage: writable layers, logs and disk-backed emptyDirs.
    pub storage: Option<u64>,
    /// The containers' writable layers alone.
    pub rootfs: Option<u64>,
    pub inodes: Option<u64>,
    /// The inodes of the containers' writable layers alone.
    pub rootfs_inodes: Option<u64>,
    pub processes: Option<u64>,
    pub containers: Vec<ContainerUsage>,
    /// Each volume in the pod's directory by name: bytes used.
    pub volumes: HashMap<String, u64>,
}

/// Usage by pod UID.
pub type Usage = HashMap<String, PodUsage>;

/// The usage of each pod in a summary.
pub fn usage_of(summary: &Summary) -> Usage {
    summary
        .pods
        .iter()
        .map(|p| {
            let eph = p.ephemeral_storage.as_ref();
            let usage = PodUsage {
                memory: p.memory.as_ref().and_then(|m| m.working_set_bytes),
                storage: eph.and_then(|f| f.used_bytes),
                rootfs: p
                    .containers
                    .iter()
                    .filter_map(|c| c.rootfs.as_ref()?.used_bytes)
                    .reduce(|a, b| a + b),
                inodes: eph.and_then(|f| f.inodes_used),
                rootfs_inodes: p
                    .containers
                    .iter()
                    .filter_map(|c| c.rootfs.as_ref()?.inodes_used)
                    .reduce(|a, b| a + b),
                processes: p.process_stats.as_ref().and_then(|s| s.process_count),
                containers: p
                    .containers
                    .iter()
                    .map(|c| ContainerUsage {
                        name: c.name.clone(),
                        memory: c.memory.as_ref().and_then(|m| m.working_set_bytes),
                        storage: c
                            .rootfs
                            .as_ref()
                            .and_then(|r| r.used_bytes)
                            .zip(c.logs.as_ref().and_then(|l| l.used_bytes))
                            .map(|(r, l)| r + l),
                    })
                    .collect(),
                volumes: p
                    .volumes
                    .iter()
                    .filter_map(|v| Some((v.name.clone(), v.fs.used_bytes?)))
                    .collect(),
            };
            (p.pod_ref.uid.clone(), usage)
        })
        .collect()
}

/// Whether the pod is critical (upstream's `IsCriticalPod`): a static pod, or of a
/// system-critical priority. Such a pod is never evicted and is admitted under pressure.
pub fn is_critical(pod: &Pod) -> bool {
    !crate::model::is_api_pod(pod) || priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

/// A container's request of `resource` in bytes (0 when none).
fn request(c: &Container, resource: &str) -> i64 {
    c.resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get(resource))
        .and_then(|q| quantity::parse_bytes(&q.0).ok())
        .unwrap_or(0)
}

/// The pod's request of `resource` (upstream's `PodRequests`): its app containers and sidecars
/// together, or its largest init container if that is more.
pub fn pod_request(pod: &Pod, resource: &str) -> i64 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    let sidecars: i64 = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| crate::model::is_sidecar(c))
        .map(|c| request(c, resource))
        .sum();
    let apps: i64 = spec.containers.iter().map(|c| request(c, resource)).sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| !crate::model::is_sidecar(c))
        .map(|c| request(c, resource))
        .max()
        .unwrap_or(0);
    (apps + sidecars).max(init)
}

/// Which of a pod's disk usage counts under disk pressure (upstream's `fsStatsType`s): all of
/// it when the images share the root dir's filesystem; with a dedicated image filesystem, its
/// logs and local volumes under `nodefs` pressure and its writable layers under `imagefs`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskMeasure {
    Everything,
    LogsAndLocalVolumes,
    WritableLayers,
}

/// Orders `pods` for reclaiming `resource` (`memory`, `ephemeral-storage`, `inodes`, `pids`),
/// the first to evict first, disk usage measured as `disk` says. A pod without usage figures
/// sorts as using nothing.
pub fn rank(pods: &mut [Pod], resource: &str, usage: &Usage, disk: DiskMeasure) {
    // (total, writable layers') of bytes or inodes, as `disk` counts them.
    let measure = |total: Option<u64>, layers: Option<u64>| match disk {
        DiskMeasure::Everything => total,
        DiskMeasure::WritableLayers => layers,
        // The rest: the logs and disk-backed emptyDirs.
        DiskMeasure::LogsAndLocalVolumes => total.map(|t| t.saturating_sub(layers.unwrap_or(0))),
    };
    let used = |p: &Pod| -> i64 {
        let u = usage.get(crate::model::pod_uid(p));
        let v = match resource {
            "memory" => u.and_then(|u| u.memory),
            "ephemeral-storage" => u.and_then(|u| measure(u.storage, u.rootfs)),
            "inodes" => u.and_then(|u| measure(u.inodes, u.rootfs_inodes)),
            _ => u.and_then(|u| u.processes),
        };
        v.map_or(0, |v| i64::try_from(v).unwrap_or(i64::MAX))
    };
    let requested = |p: &Pod| match resource {
        "memory" | "ephemeral-storage" => pod_request(p, resource),
        _ => 0,
    };
    pods.sort_by(|a, b| {
        let by_priority = priority(a).cmp(&priority(b));
        if resource == "pids" {
            return by_priority.then_with(|| used(b).cmp(&used(a)));
        }
        let (ea, eb) = (used(a) - requested(a), used(b) - requested(b));
        // Over their request first.
        let over = match (ea > 0, eb > 0) {
            (true, false) => Ordering::Less,
            (false, true) => Ordering::Greater,
            _ => Ordering::Equal,
        };
        over.then(by_priority).then_with(|| eb.cmp(&ea))
    });
}

/// Upstream's eviction message: the resource, the threshold and what was available, and each
/// container using more of it than it requests.
pub fn message(
    resource: &str,
    pod: &Pod,
    usage: Option<&PodUsage>,
    thresholds: &[Threshold],
    observations: &Observations,
) -> String {
    let mut msg = format!("The node was low on resource: {resource}. ");
    if let Some((t, o)) = thresholds
        .iter()
        .filter(|t| t.signal.resource() == resource)
        .find_map(|t| Some((t, observations.get(&t.signal)?)))
    {
        msg.push_str(&format!(
            "Threshold quantity: {}, available: {}. ",
            display_quantity(t.signal, t.value.absolute(o.capacity)),
            display_quantity(t.signal, o.available)
        ));
    }
    let Some(usage) = usage else {
        return msg;
    };
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    for c in containers {
        let Some(u) = usage.containers.iter().find(|u| u.name == c.name) else {
            continue;
        };
        let used = match resource {
            "memory" => u.memory,
            "ephemeral-storage" => u.storage,
            _ => None,
        };
        let Some(used) = used.map(|v| i64::try_from(v).unwrap_or(i64::MAX)) else {
            continue;
        };
        let req = request(c, resource);
        if used > req {
            msg.push_str(&format!(
                "Container {} was using {}, request is {}, has larger consumption of {resource}. ",
                c.name,
                quantity::format_bytes(used),
                quantity::format_bytes(req)
            ));
        }
    }
    msg
}
