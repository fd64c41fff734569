//! Node-pressure eviction (upstream's `pkg/kubelet/eviction`). Every monitoring period (10 s)
//! the [`EvictionManager`] observes the node's signals ([`signals`]: the memory working set of
//! the root and `kubepods` cgroups, the filesystems of the root dir and of the runtime's
//! images, the node's process count), compares them with the configured hard and soft
//! thresholds ([`thresholds`]: grace periods, minimum reclaim, the pressure transition period)
//! and publishes the pressure conditions ([`EvictionState`]: the Node's MemoryPressure,
//! DiskPressure and PIDPressure, and admission's refusals). Under pressure it reclaims what
//! the node holds first (dead containers and unused images for disk), then evicts at most one
//! pod per period, ranked as upstream ([`rank`]); critical pods (static pods and
//! system-critical priorities) are never evicted. Before that, each period, pods over their
//! local storage limits (an emptyDir's `sizeLimit`, `ephemeral-storage` limits) are evicted
//! ([`local_storage`]). An evicted pod ends Failed with reason `Evicted` and upstream's
//! message.

pub mod local_storage;
mod manager;
pub mod rank;
pub mod signals;
pub mod thresholds;

use std::sync::Mutex;

pub use manager::{EvictionManager, EvictionParts};
pub use thresholds::{Threshold, ThresholdValue};

use crate::util::lock;

/// What an evicted pod's status says (upstream's `Evicted`).
pub const REASON: &str = "Evicted";

/// What the status of a pod the kubelet evicted says (upstream's eviction `PodStatusFunc`):
/// Failed, `Evicted`, the message, and for node pressure the `DisruptionTarget` condition.
pub fn evicted_status(
    status: &mut k8s_openapi::api::core::v1::PodStatus,
    message: &str,
    disruption: bool,
) {
    status.phase = Some(crate::model::Phase::Failed.as_str().into());
    status.reason = Some(REASON.into());
    status.message = Some(message.into());
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    if disruption && !conditions.iter().any(|c| c.type_ == "DisruptionTarget") {
        conditions.push(k8s_openapi::api::core::v1::PodCondition {
            type_: "DisruptionTarget".into(),
            status: "True".into(),
            reason: Some("TerminationByKubelet".into()),
            message: Some(message.into()),
            last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::now(),
            )),
            ..Default::default()
        });
    }
}

/// An eviction signal (upstream's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    AllocatableMemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    ContainerFsAvailable,
    ContainerFsInodesFree,
    PidAvailable,
}

impl Signal {
    pub const ALL: [Signal; 9] = [
        Signal::MemoryAvailable,
        Signal::AllocatableMemoryAvailable,
        Signal::NodeFsAvailable,
        Signal::NodeFsInodesFree,
        Signal::ImageFsAvailable,
        Signal::ImageFsInodesFree,
        Signal::ContainerFsAvailable,
        Signal::ContainerFsInodesFree,
        Signal::PidAvailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::AllocatableMemoryAvailable => "allocatableMemory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::ContainerFsAvailable => "containerfs.available",
            Signal::ContainerFsInodesFree => "containerfs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    pub fn parse(s: &str) -> Option<Signal> {
        Signal::ALL.into_iter().find(|sig| sig.as_str() == s)
    }

    /// The resource the signal starves (upstream's `signalToResource`): the name evicted pods'
    /// messages and the `EvictionThresholdMet` event give.
    pub fn resource(self) -> &'static str {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => "memory",
            Signal::NodeFsAvailable | Signal::ImageFsAvailable | Signal::ContainerFsAvailable => {
                "ephemeral-storage"
            }
            Signal::NodeFsInodesFree
            | Signal::ImageFsInodesFree
            | Signal::ContainerFsInodesFree => "inodes",
            Signal::PidAvailable => "pids",
        }
    }

    /// Whether the signal measures the root dir's filesystem (`nodefs.*`).
    pub fn on_node_fs(self) -> bool {
        matches!(self, Signal::NodeFsAvailable | Signal::NodeFsInodesFree)
    }

    /// The node condition the signal's pressure sets.
    pub fn pressure(self) -> Pressure {
        match self {
            Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable => Pressure::Memory,
            Signal::PidAvailable => Pressure::Pid,
            _ => Pressure::Disk,
        }
    }

    /// Whether the signal measures bytes (memory, filesystem space) rather than a count.
    pub fn is_bytes(self) -> bool {
        matches!(self.resource(), "memory" | "ephemeral-storage")
    }
}

/// A pressure condition of the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pressure {
    Memory,
    Disk,
    Pid,
}

impl Pressure {
    /// The Node condition's type.
    pub fn as_str(self) -> &'static str {
        match self {
            Pressure::Memory => "MemoryPressure",
            Pressure::Disk => "DiskPressure",
            Pressure::Pid => "PIDPressure",
        }
    }
}

/// The pressure conditions the eviction manager last published: read by the Node's status and
/// by admission.
#[derive(Debug, Default)]
pub struct EvictionState {
    conditions: Mutex<Vec<Pressure>>,
}

impl EvictionState {
    pub fn set(&self, mut conditions: Vec<Pressure>) {
        conditions.sort();
        conditions.dedup();
        *lock(&self.conditions) = conditions;
    }

    pub fn conditions(&self) -> Vec<Pressure> {
        lock(&self.conditions).clone()
    }

    pub fn has(&self, p: Pressure) -> bool {
        lock(&self.conditions).contains(&p)
    }

    /// Upstream's eviction admission: under pressure, only critical pods are admitted, and
    /// under memory pressure alone, pods that are not BestEffort too (or BestEffort ones
    /// tolerating the memory-pressure taint). The refusal's message names the conditions;
    /// `None`: admitted.
    pub fn refusal(&self, pod: &k8s_openapi::api::core::v1::Pod) -> Option<String> {
        let conditions = self.conditions();
        if conditions.is_empty() || rank::is_critical(pod) {
            return None;
        }
        if conditions == [Pressure::Memory] {
            let best_effort = crate::cm::Qos::of(pod) == crate::cm::Qos::BestEffort;
            if !best_effort || tolerates_memory_pressure(pod) {
                return None;
            }
        }
        let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
        Some(format!("The node had condition: [{}]. ", names.join(" ")))
    }
}

/// Whether the pod tolerates `node.kubernetes.io/memory-pressure:NoSchedule`.
fn tolerates_memory_pressure(pod: &k8s_openapi::api::core::v1::Pod) -> bool {
    const KEY: &str = "node.kubernetes.io/memory-pressure";
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                let effect_ok = t
                    .effect
                    .as_deref()
                    .is_none_or(|e| e.is_empty() || e == "NoSchedule");
                let op = t.operator.as_deref().unwrap_or("Equal");
                let key_ok = match t.key.as_deref() {
                    None | Some("") => op == "Exists",
                    Some(k) => k == KEY,
                };
                let value_ok = op == "Exists" || t.value.as_deref().unwrap_or("").is_empty();
                effect_ok && key_ok && value_ok
            })
        })
}

#[cfg(test)]
mod tests;
