//! Local storage isolation (upstream's `localStorageEviction`): a pod whose emptyDir holds more
//! than its `sizeLimit`, whose ephemeral storage exceeds the sum of its containers'
//! `ephemeral-storage` limits, or with a container whose writable layer and logs exceed its own
//! limit, is evicted, with upstream's messages, checked in that order.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::rank::PodUsage;
use crate::util::quantity;

const EPHEMERAL_STORAGE: &str = "ephemeral-storage";

/// Whether the pod sets any limit this module checks (only such pods are measured).
pub fn has_limits(pod: &Pod) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let size_limit = spec.volumes.iter().flatten().any(|v| {
        v.empty_dir
            .as_ref()
            .and_then(|e| e.size_limit.as_ref())
            .is_some_and(|q| bytes(q) > 0)
    });
    size_limit || spec.containers.iter().any(|c| limit(c).is_some())
}

fn bytes(q: &Quantity) -> i64 {
    quantity::parse_bytes(&q.0).unwrap_or(0)
}

fn limit(c: &k8s_openapi::api::core::v1::Container) -> Option<&Quantity> {
    c.resources
        .as_ref()?
        .limits
        .as_ref()?
        .get(EPHEMERAL_STORAGE)
}

/// A quantity as upstream prints it: binary amounts with their largest exact suffix, others as
/// written.
fn display(q: &Quantity) -> String {
    let binary = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
        .iter()
        .any(|s| q.0.ends_with(s));
    if binary {
        quantity::format_bytes(bytes(q))
    } else {
        q.0.clone()
    }
}

/// Why the pod must be evicted for its local storage, if it must.
pub fn violation(pod: &Pod, usage: &PodUsage) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    for v in spec.volumes.iter().flatten() {
        let Some(limit) = v.empty_dir.as_ref().and_then(|e| e.size_limit.as_ref()) else {
            continue;
        };
        let used = usage.volumes.get(&v.name).copied();
        if bytes(limit) > 0 && used.is_some_and(|u| u128::from(u) > bytes(limit) as u128) {
            return Some(format!(
                "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
                v.name,
                display(limit)
            ));
        }
    }
    let limits: Vec<&Quantity> = spec.containers.iter().filter_map(limit).collect();
    if !limits.is_empty() {
        let total: i64 = limits.iter().map(|q| bytes(q)).sum();
        if usage
            .storage
            .is_some_and(|u| u128::from(u) > total.max(0) as u128)
        {
            return Some(format!(
                "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
                quantity::format_bytes(total)
            ));
        }
    }
    for c in &spec.containers {
        let Some(limit) = limit(c) else { continue };
        let used = usage
            .containers
            .iter()
            .find(|u| u.name == c.name)
            .and_then(|u| u.storage);
        if used.is_some_and(|u| u128::from(u) > bytes(limit).max(0) as u128) {
            return Some(format!(
                "Container {} exceeded its local ephemeral storage limit {:?}. ",
                c.name,
                display(limit)
            ));
        }
    }
    None
}
