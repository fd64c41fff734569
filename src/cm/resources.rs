//! What the kubelet writes into its cgroups, computed as upstream's container manager does:
//! CPU shares from requests (`clamp(milli*1024/1000, 2, 262144)`), a CFS quota from limits
//! (period 100 ms, at least 1 ms), memory limits, and the pod PID limit. [`for_pod`] is
//! upstream's `ResourceConfigForPod`.

use k8s_openapi::api::core::v1::Pod;

use crate::admission::{pod_limits, pod_requests};

/// The CFS period (µs) quotas are written for (upstream's default `cpuCFSQuotaPeriod`).
pub const CFS_PERIOD_US: u64 = 100_000;
/// The fewest CPU shares a cgroup gets (BestEffort pods, `besteffort`).
pub const MIN_SHARES: u64 = 2;
/// The most CPU shares a cgroup gets.
pub const MAX_SHARES: u64 = 262_144;
/// The smallest CFS quota written (1 ms).
pub const MIN_QUOTA_US: i64 = 1000;

/// The values a cgroup gets; `None` leaves the cgroup's own. A quota or a memory limit of -1
/// removes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceConfig {
    pub cpu_shares: Option<u64>,
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub memory_limit: Option<i64>,
    pub pids_limit: Option<i64>,
}

/// What to write to a cgroup that holds `old` so that it holds `new`: `new`, with a CPU quota
/// or memory limit `new` no longer sets removed (-1) rather than left as it was.
pub fn replacing(old: &ResourceConfig, new: &ResourceConfig) -> ResourceConfig {
    let mut write = new.clone();
    if old.cpu_quota.is_some() && new.cpu_quota.is_none() {
        write.cpu_quota = Some(-1);
    }
    if old.memory_limit.is_some() && new.memory_limit.is_none() {
        write.memory_limit = Some(-1);
    }
    write
}

/// What a cgroup holding `old` takes first when it is to hold `new`, before its children are
/// resized: the larger of each limit (no limit being the largest), the new shares and period.
/// A parent's limit below a child's is refused (a CFS quota, on cgroup v1) or squeezes the
/// child's usage (memory), so the pod cgroup grows before its containers and shrinks after
/// them, as upstream orders a resize.
pub fn widest(old: &ResourceConfig, new: &ResourceConfig) -> ResourceConfig {
    fn larger(a: Option<i64>, b: Option<i64>) -> Option<i64> {
        match (a, b) {
            (Some(a), Some(b)) if a > 0 && b > 0 => Some(a.max(b)),
            _ => None,
        }
    }
    ResourceConfig {
        cpu_shares: new.cpu_shares,
        cpu_quota: larger(old.cpu_quota, new.cpu_quota),
        cpu_period: new.cpu_period,
        memory_limit: larger(old.memory_limit, new.memory_limit),
        pids_limit: larger(old.pids_limit, new.pids_limit),
    }
}

/// CPU shares for `milli` millicores requested (upstream `MilliCPUToShares`).
pub fn milli_cpu_to_shares(milli: i64) -> u64 {
    if milli <= 0 {
        return MIN_SHARES;
    }
    let shares = u64::try_from(milli.saturating_mul(1024) / 1000).unwrap_or(MAX_SHARES);
    shares.clamp(MIN_SHARES, MAX_SHARES)
}

/// The CFS quota for a limit of `milli` millicores over `period` µs (upstream
/// `MilliCPUToQuota`): 0 (none) without a limit, else at least 1 ms.
pub fn milli_cpu_to_quota(milli: i64, period: u64) -> i64 {
    if milli <= 0 {
        return 0;
    }
    let period = i64::try_from(period).unwrap_or(i64::MAX);
    (milli.saturating_mul(period) / 1000).max(MIN_QUOTA_US)
}

/// The pod cgroup's values by the pod's QoS class: a Guaranteed pod gets shares, quota and
/// memory limit; a Burstable one shares, and the quota (memory limit) only when every app
/// container has a CPU (memory) limit or the pod sets one; a BestEffort one the minimum
/// shares. Without `enforce_cpu_limits` (`cpuCFSQuota: false`) the quota is removed. A
/// `pids_limit` above 0 (`podPidsLimit`) caps the pod's processes.
pub fn for_pod(pod: &Pod, enforce_cpu_limits: bool, pids_limit: i64) -> ResourceConfig {
    let requests = pod_requests(pod);
    let limits = pod_limits(pod);
    let spec = pod.spec.as_ref();
    let pod_level = spec
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.limits.as_ref());
    let declared = |resource: &str| {
        pod_level.is_some_and(|l| l.contains_key(resource))
            || spec.is_some_and(|s| {
                s.containers.iter().all(|c| {
                    c.resources
                        .as_ref()
                        .and_then(|r| r.limits.as_ref())
                        .and_then(|l| l.get(resource))
                        .is_some_and(|q| !is_zero(&q.0))
                })
            })
    };
    let shares = milli_cpu_to_shares(requests.get("cpu"));
    let quota = milli_cpu_to_quota(limits.get("cpu"), CFS_PERIOD_US);
    let memory = limits.get("memory");
    let mut config = ResourceConfig::default();
    match crate::pod::qos_class(pod) {
        "Guaranteed" => {
            config.cpu_shares = Some(shares);
            config.cpu_quota = Some(quota);
            config.cpu_period = Some(CFS_PERIOD_US);
            config.memory_limit = Some(memory);
        }
        "Burstable" => {
            config.cpu_shares = Some(shares);
            if declared("cpu") {
                config.cpu_quota = Some(quota);
                config.cpu_period = Some(CFS_PERIOD_US);
            }
            if declared("memory") {
                config.memory_limit = Some(memory);
            }
        }
        _ => config.cpu_shares = Some(MIN_SHARES),
    }
    if !enforce_cpu_limits {
        config.cpu_quota = Some(-1);
    }
    if pids_limit > 0 {
        config.pids_limit = Some(pids_limit);
    }
    config
}

/// Whether a quantity is zero (or does not parse: the API server validated it).
fn is_zero(q: &str) -> bool {
    crate::util::quantity::parse_cpu_millis(q).is_ok_and(|m| m == 0)
        || crate::util::quantity::parse_bytes(q).is_ok_and(|b| b == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn container(
        name: &str,
        requests: serde_json::Value,
        limits: serde_json::Value,
    ) -> serde_json::Value {
        serde_json::json!({
            "name": name, "image": "busybox",
            "resources": {"requests": requests, "limits": limits},
        })
    }

    #[test]
    fn conversions_as_upstream() {
        assert_eq!(milli_cpu_to_shares(0), 2);
        assert_eq!(milli_cpu_to_shares(1), 2);
        assert_eq!(milli_cpu_to_shares(100), 102);
        assert_eq!(milli_cpu_to_shares(1000), 1024);
        assert_eq!(milli_cpu_to_shares(1_000_000), MAX_SHARES);
        assert_eq!(milli_cpu_to_quota(0, CFS_PERIOD_US), 0);
        assert_eq!(milli_cpu_to_quota(5, CFS_PERIOD_US), 1000);
        assert_eq!(milli_cpu_to_quota(250, CFS_PERIOD_US), 25_000);
        assert_eq!(milli_cpu_to_quota(2000, CFS_PERIOD_US), 200_000);
    }

    #[test]
    fn guaranteed_pod_gets_everything_with_overhead() {
        let p = pod(serde_json::json!({
            "containers": [
                container("a", serde_json::json!({"cpu": "250m", "memory": "64Mi"}),
                          serde_json::json!({"cpu": "250m", "memory": "64Mi"})),
                container("b", serde_json::json!({"cpu": "250m", "memory": "64Mi"}),
                          serde_json::json!({"cpu": "250m", "memory": "64Mi"})),
            ],
            "overhead": {"cpu": "100m", "memory": "16Mi"},
        }));
        let c = for_pod(&p, true, 1024);
        assert_eq!(c.cpu_shares, Some(614));
        assert_eq!(c.cpu_quota, Some(60_000));
        assert_eq!(c.cpu_period, Some(CFS_PERIOD_US));
        assert_eq!(c.memory_limit, Some(144 << 20));
        assert_eq!(c.pids_limit, Some(1024));
        let off = for_pod(&p, false, -1);
        assert_eq!((off.cpu_quota, off.pids_limit), (Some(-1), None));
    }

    #[test]
    fn burstable_pod_is_capped_only_where_every_container_is() {
        let p = pod(serde_json::json!({
            "containers": [
                container("a", serde_json::json!({"cpu": "100m"}),
                          serde_json::json!({"cpu": "200m", "memory": "32Mi"})),
                container("b", serde_json::json!({"cpu": "300m"}),
                          serde_json::json!({"cpu": "1"})),
            ],
        }));
        let c = for_pod(&p, true, -1);
        assert_eq!(c.cpu_shares, Some(409));
        assert_eq!(c.cpu_quota, Some(120_000));
        assert_eq!(c.memory_limit, None, "b has no memory limit");
        // An init container larger than the app containers sets the pod's limit.
        let p = pod(serde_json::json!({
            "initContainers": [container("i", serde_json::json!({}), serde_json::json!({"memory": "1Gi"}))],
            "containers": [container("a", serde_json::json!({"cpu": "100m"}), serde_json::json!({"memory": "32Mi"}))],
        }));
        assert_eq!(for_pod(&p, true, -1).memory_limit, Some(1 << 30));
    }

    #[test]
    fn best_effort_pod_gets_minimum_shares() {
        let p = pod(serde_json::json!({"containers": [{"name": "a", "image": "busybox"}]}));
        let c = for_pod(&p, true, -1);
        assert_eq!(
            c,
            ResourceConfig {
                cpu_shares: Some(MIN_SHARES),
                ..Default::default()
            }
        );
    }
}
