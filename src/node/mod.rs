//! The kubelet's Node: registration, status and the node Lease (upstream's
//! `kubelet_node_status.go`, `nodestatus/setters.go` and `nodelease`).
//!
//! The core is pure and table-tested: [`NodeFacts`] are read from the machine once
//! ([`facts`]), [`build_node`] turns them into the Node the kubelet registers,
//! [`conditions`] derives the node conditions from a [`Health`] report and the previous
//! conditions, [`status`] decides when a status write is due and runs the
//! [`NodeStatusManager`], [`lease`] keeps `kube-node-lease/<node>` renewed, and
//! [`runtime_state`] turns the runtime's `Status` answers into Ready problems; [`agent`]
//! runs all of it for the kubelet. This module
//! never touches pods: admission (`crate::admission`) only reads the Node it publishes.

pub mod agent;
pub mod conditions;
pub mod facts;
pub mod lease;
pub mod routes;
pub mod runtime_state;
pub mod status;

pub use agent::{HealthFn, NodeAgent};
pub use conditions::{Health, node_conditions, pleg_unhealthy};
pub use facts::{NodeFacts, kubelet_version};
pub use lease::{LeaseController, NODE_LEASE_NAMESPACE, build_lease};
pub use runtime_state::RuntimeState;
pub use status::{HealthCheck, NodeStatusManager, should_write, status_changed};

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    DaemonEndpoint, Node, NodeAddress, NodeDaemonEndpoints, NodeSpec, NodeStatus, NodeSwapStatus,
    NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::config::{KubeletConfig, Reserved};
use crate::util::quantity;

/// Why the node's facts could not be read from the machine ([`NodeFacts::gather`]). Each
/// message names what failed and the cause is its source, so `{:#}` prints
/// `reading /proc/meminfo: <cause>`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading /proc/meminfo")]
    ReadMeminfo(#[source] std::io::Error),
    #[error("no MemTotal in /proc/meminfo")]
    NoMemTotal,
    /// The CPU affinity mask cannot be read.
    #[error("sched_getaffinity")]
    CpuAffinity(#[source] nix::Error),
    /// More CPUs than a `u32` counts.
    #[error(transparent)]
    CpuCount(#[from] std::num::TryFromIntError),
    /// The filesystem holding the root directory cannot be measured.
    #[error("statvfs {}", path.display())]
    Statvfs {
        path: std::path::PathBuf,
        #[source]
        source: nix::Error,
    },
    /// The reservations and hard eviction thresholds exceed the capacity (upstream's
    /// `validateNodeAllocatable`): each resource over, as upstream words it.
    #[error("invalid Node Allocatable configuration. {}", .0.join(" "))]
    Reservations(Vec<String>),
}

/// How long one heartbeat request (a status write or a Lease renewal, and the reads before
/// them) may take: upstream gives its heartbeat client the shorter of
/// `nodeStatusUpdateFrequency` and the Lease duration; nodelet never less than a second.
pub fn heartbeat_timeout(cfg: &KubeletConfig) -> std::time::Duration {
    let lease = std::time::Duration::from_secs(u64::from(cfg.node_lease_duration_seconds));
    cfg.node_status_update_frequency
        .min(lease)
        .max(std::time::Duration::from_secs(1))
}

/// `fut` limited to `limit`; running out is a `Service` error like any unanswered request.
pub(crate) async fn within<T>(
    limit: std::time::Duration,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => Err(kube::Error::Service(
            format!("no answer within {limit:?}").into(),
        )),
    }
}

/// `kubernetes.io/hostname`.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// `kubernetes.io/os`.
pub const LABEL_OS: &str = "kubernetes.io/os";
/// `kubernetes.io/arch`.
pub const LABEL_ARCH: &str = "kubernetes.io/arch";
/// The deprecated `beta.kubernetes.io/os`, still set by upstream.
pub const LABEL_OS_BETA: &str = "beta.kubernetes.io/os";
/// The deprecated `beta.kubernetes.io/arch`, still set by upstream.
pub const LABEL_ARCH_BETA: &str = "beta.kubernetes.io/arch";
/// Tells the attach/detach controller that it, not the kubelet, attaches volumes here.
pub const ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";

/// The Node nodelet registers: metadata (name, default labels, the attach/detach annotation)
/// and the status that follows from the facts alone (capacity, allocatable, addresses,
/// nodeInfo, daemon endpoints). Conditions and images are added by [`status`].
/// With `--node-labels` (over the default ones, as upstream), `registerWithTaints` (and the
/// uninitialized taint of `--cloud-provider=external`, with the node IP given in an annotation
/// for the cloud controller), and `providerID`.
pub fn build_node(facts: &NodeFacts, cfg: &KubeletConfig) -> Node {
    let reg = &cfg.registration;
    let mut labels = default_labels(facts);
    labels.extend(reg.labels.clone());
    let mut annotations = BTreeMap::from([(
        ANNOTATION_CONTROLLER_MANAGED_ATTACH_DETACH.to_string(),
        "true".to_string(),
    )]);
    let mut taints: Vec<Taint> = reg
        .taints
        .iter()
        .map(|t| Taint {
            key: t.key.clone(),
            value: Some(t.value.clone()).filter(|v| !v.is_empty()),
            effect: t.effect.clone(),
            time_added: None,
        })
        .collect();
    if reg.external_cloud_provider {
        taints.push(Taint {
            key: crate::config::TAINT_EXTERNAL_CLOUD_PROVIDER.to_string(),
            value: Some("true".to_string()),
            effect: "NoSchedule".to_string(),
            time_added: None,
        });
        if !cfg.node_ips.is_empty() {
            let ips: Vec<String> = cfg.node_ips.iter().map(|ip| ip.to_string()).collect();
            annotations.insert(ANNOTATION_PROVIDED_NODE_IP.to_string(), ips.join(","));
        }
    }
    let spec = (!taints.is_empty() || !reg.provider_id.is_empty()).then(|| NodeSpec {
        taints: Some(taints).filter(|t| !t.is_empty()),
        provider_id: Some(reg.provider_id.clone()).filter(|p| !p.is_empty()),
        ..Default::default()
    });
    Node {
        metadata: ObjectMeta {
            name: Some(facts.hostname.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec,
        status: Some({
            let mut status = facts_status(facts, cfg);
            status.addresses = reported_addresses(cfg, status.addresses.take(), None);
            status
        }),
    }
}

/// The addresses to report (upstream's `NodeAddress` setter): the node's own (`own`), except
/// with `--cloud-provider=external`, where the cloud controller's win once the Node has any
/// (`current`), and without `--node-ip` none are reported until it sets them.
pub fn reported_addresses(
    cfg: &KubeletConfig,
    own: Option<Vec<NodeAddress>>,
    current: Option<&[NodeAddress]>,
) -> Option<Vec<NodeAddress>> {
    if !cfg.registration.external_cloud_provider {
        return own;
    }
    match current {
        Some(set) if !set.is_empty() => Some(set.to_vec()),
        _ if cfg.node_ips.is_empty() => None,
        _ => own,
    }
}

/// The node IPs given with `--node-ip` to a node whose addresses an external cloud provider
/// sets (upstream's `alpha.kubernetes.io/provided-node-ip`).
pub const ANNOTATION_PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";

/// The labels the kubelet owns on its Node.
pub fn default_labels(facts: &NodeFacts) -> BTreeMap<String, String> {
    [
        (LABEL_HOSTNAME, facts.hostname.as_str()),
        (LABEL_OS, facts.operating_system.as_str()),
        (LABEL_ARCH, facts.architecture.as_str()),
        (LABEL_OS_BETA, facts.operating_system.as_str()),
        (LABEL_ARCH_BETA, facts.architecture.as_str()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The node's own addresses: each IP an `InternalIP`, then its name as `Hostname`.
pub fn own_addresses(hostname: &str, ips: &[std::net::IpAddr]) -> Vec<NodeAddress> {
    ips.iter()
        .map(|ip| NodeAddress {
            type_: "InternalIP".to_string(),
            address: ip.to_string(),
        })
        .chain([NodeAddress {
            type_: "Hostname".to_string(),
            address: hostname.to_string(),
        }])
        .collect()
}

fn facts_status(facts: &NodeFacts, cfg: &KubeletConfig) -> NodeStatus {
    let capacity = capacity(facts);
    let allocatable = allocatable(&capacity, &cfg.eviction_hard, &cfg.reserved);
    NodeStatus {
        capacity: Some(to_quantities(&capacity)),
        allocatable: Some(to_quantities(&allocatable)),
        addresses: Some(own_addresses(&facts.hostname, &facts.node_ips())),
        daemon_endpoints: Some(NodeDaemonEndpoints {
            kubelet_endpoint: Some(DaemonEndpoint {
                port: i32::from(facts.kubelet_port),
            }),
        }),
        node_info: Some(NodeSystemInfo {
            architecture: facts.architecture.clone(),
            boot_id: facts.boot_id.clone(),
            container_runtime_version: facts.container_runtime_version.clone(),
            kernel_version: facts.kernel_version.clone(),
            kubelet_version: facts.kubelet_version.clone(),
            machine_id: facts.machine_id.clone(),
            operating_system: facts.operating_system.clone(),
            os_image: facts.os_image.clone(),
            system_uuid: facts.system_uuid.clone(),
            swap: facts.swap_bytes.map(|b| NodeSwapStatus {
                capacity: Some(i64::try_from(b).unwrap_or(i64::MAX)),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A resource amount: CPU in millicores, everything else in units (bytes, pods).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    Millicores(i64),
    Bytes(i64),
    Count(i64),
}

impl Amount {
    /// The amount in its base unit.
    pub fn value(self) -> i64 {
        match self {
            Amount::Millicores(v) | Amount::Bytes(v) | Amount::Count(v) => v,
        }
    }

    fn with_value(self, v: i64) -> Amount {
        match self {
            Amount::Millicores(_) => Amount::Millicores(v),
            Amount::Bytes(_) => Amount::Bytes(v),
            Amount::Count(_) => Amount::Count(v),
        }
    }

    /// The canonical text upstream's `resource.Quantity` gives: CPU as cores or `m`, bytes
    /// with the largest exact binary suffix (`16318428Ki`), counts as plain integers.
    pub fn to_quantity(self) -> Quantity {
        Quantity(match self {
            Amount::Millicores(m) if m % 1000 == 0 => (m / 1000).to_string(),
            Amount::Millicores(m) => format!("{m}m"),
            Amount::Bytes(b) => crate::util::quantity::format_bytes(b),
            Amount::Count(n) => n.to_string(),
        })
    }
}

/// The node's capacity: cpu, memory, ephemeral-storage, pods, and `hugepages-<size>` per
/// huge page size (the bytes of the pages reserved).
pub fn capacity(facts: &NodeFacts) -> BTreeMap<String, Amount> {
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut out = BTreeMap::from([
        (
            "cpu".to_string(),
            Amount::Millicores(i64::from(facts.cpus) * 1000),
        ),
        (
            "memory".to_string(),
            Amount::Bytes(clamp(facts.memory_bytes)),
        ),
        (
            "ephemeral-storage".to_string(),
            Amount::Bytes(clamp(facts.ephemeral_storage_bytes)),
        ),
        ("pods".to_string(), Amount::Count(i64::from(facts.max_pods))),
    ]);
    for (&size, &pages) in &facts.hugepages {
        out.insert(
            format!(
                "{HUGEPAGES_PREFIX}{}",
                crate::util::quantity::format_bytes(clamp(size))
            ),
            Amount::Bytes(clamp(size.saturating_mul(pages))),
        );
    }
    out
}

/// The prefix of huge page resources (`hugepages-2Mi`).
pub const HUGEPAGES_PREFIX: &str = "hugepages-";

/// Allocatable = capacity minus what is reserved of it ([`reservation`]: `kubeReserved`,
/// `systemReserved` and the hard eviction thresholds), and the reserved huge pages from
/// memory; never below zero.
pub fn allocatable(
    capacity: &BTreeMap<String, Amount>,
    eviction_hard: &BTreeMap<String, String>,
    reserved: &Reserved,
) -> BTreeMap<String, Amount> {
    let mut out = capacity.clone();
    for (resource, held) in reservation(capacity, eviction_hard, reserved) {
        if let Some(cap) = capacity.get(&resource) {
            out.insert(resource, cap.with_value((cap.value() - held).max(0)));
        }
    }
    let huge: i64 = capacity
        .iter()
        .filter(|(k, _)| k.starts_with(HUGEPAGES_PREFIX))
        .map(|(_, v)| v.value())
        .fold(0, i64::saturating_add);
    if let Some(mem) = out.get_mut("memory") {
        *mem = mem.with_value((mem.value() - huge).max(0));
    }
    out
}

/// What is reserved of each resource, as upstream's `GetNodeAllocatableReservation`:
/// `kubeReserved` plus `systemReserved`, plus the hard eviction threshold of its signal
/// (`memory.available` of memory, `nodefs.available` of ephemeral-storage: a quantity, or a
/// percentage of the capacity). A threshold that does not parse reserves nothing (the config
/// loader has checked them). Resources nothing reserves are left out.
pub fn reservation(
    capacity: &BTreeMap<String, Amount>,
    eviction_hard: &BTreeMap<String, String>,
    reserved: &Reserved,
) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for (resource, signal) in [
        ("cpu", None),
        ("memory", Some("memory.available")),
        ("ephemeral-storage", Some("nodefs.available")),
    ] {
        let threshold = signal
            .and_then(|s| eviction_hard.get(s))
            .zip(capacity.get(resource))
            .and_then(|(t, cap)| threshold_bytes(t, cap.value()))
            .unwrap_or(0);
        let held = reserved.total(resource).saturating_add(threshold);
        if held > 0 {
            out.insert(resource.to_string(), held);
        }
    }
    out
}

/// Refuses a node whose reservations exceed its capacity, as upstream's container manager
/// does at start.
pub fn check_reservations(facts: &NodeFacts, cfg: &KubeletConfig) -> Result<(), Error> {
    let capacity = capacity(facts);
    let over: Vec<String> = reservation(&capacity, &cfg.eviction_hard, &cfg.reserved)
        .into_iter()
        .filter_map(|(resource, held)| {
            let cap = capacity.get(&resource)?;
            (held > cap.value()).then(|| {
                format!(
                    "Resource {resource:?} has a reservation of {} but capacity of {}. \
                     Expected capacity >= reservation.",
                    cap.with_value(held).to_quantity().0,
                    cap.to_quantity().0
                )
            })
        })
        .collect();
    if over.is_empty() {
        Ok(())
    } else {
        Err(Error::Reservations(over))
    }
}

/// A threshold (`100Mi`, `10%`) in bytes of `capacity`.
fn threshold_bytes(threshold: &str, capacity: i64) -> Option<i64> {
    if let Some(pct) = threshold.trim().strip_suffix('%') {
        let pct: f64 = pct.trim().parse().ok()?;
        if !(0.0..=100.0).contains(&pct) {
            return None;
        }
        // Upstream multiplies in float64 and truncates.
        return Some((capacity as f64 * pct / 100.0) as i64);
    }
    quantity::parse_bytes(threshold).ok().filter(|v| *v >= 0)
}

fn to_quantities(m: &BTreeMap<String, Amount>) -> BTreeMap<String, Quantity> {
    m.iter()
        .map(|(k, v)| (k.clone(), v.to_quantity()))
        .collect()
}

#[cfg(test)]
mod tests;
