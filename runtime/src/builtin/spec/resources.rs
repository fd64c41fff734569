//! CRI container resources → OCI `linux.resources` (containerd's `WithResources`).
//!
//! Zero means "not set" for every CRI field. Not mapped:
//! * swap: `memory.swap` is never set (containerd sets it equal to the memory limit, or to
//!   `memory_swap_limit_in_bytes`, only when the host has a swap controller; without one the
//!   runtime would fail to write it);
//! * `oom_score_adj`, which is a process setting (see the process module);
//! * PIDs: CRI has no per-container PID limit.
//!
//! `unified` is passed through as is: it is applied on cgroup v2 and ignored by libcontainer on
//! v1. Values that cannot be represented (negative periods or shares, a hugepage limit above
//! `i64::MAX`) are left out rather than failing, since this also serves
//! `UpdateContainerResources`.

use oci_spec::runtime::{
    LinuxCpu, LinuxHugepageLimit, LinuxHugepageLimitBuilder, LinuxMemory, LinuxResources,
};

use crate::cri;

/// The OCI resources for a CRI container's resources.
pub fn linux_resources(r: &cri::LinuxContainerResources) -> LinuxResources {
    let mut cpu = LinuxCpu::default();
    let mut cpu_set = false;
    if let Ok(period) = u64::try_from(r.cpu_period) {
        if period != 0 {
            cpu.set_period(Some(period));
            cpu_set = true;
        }
    }
    if r.cpu_quota != 0 {
        cpu.set_quota(Some(r.cpu_quota));
        cpu_set = true;
    }
    if let Ok(shares) = u64::try_from(r.cpu_shares) {
        if shares != 0 {
            cpu.set_shares(Some(shares));
            cpu_set = true;
        }
    }
    if !r.cpuset_cpus.is_empty() {
        cpu.set_cpus(Some(r.cpuset_cpus.clone()));
        cpu_set = true;
    }
    if !r.cpuset_mems.is_empty() {
        cpu.set_mems(Some(r.cpuset_mems.clone()));
        cpu_set = true;
    }

    let mut memory = LinuxMemory::default();
    let memory_set = r.memory_limit_in_bytes != 0;
    if memory_set {
        memory.set_limit(Some(r.memory_limit_in_bytes));
    }

    let hugepages: Vec<LinuxHugepageLimit> = r
        .hugepage_limits
        .iter()
        .filter(|h| !h.page_size.is_empty())
        .filter_map(|h| {
            LinuxHugepageLimitBuilder::default()
                .page_size(h.page_size.clone())
                .limit(i64::try_from(h.limit).ok()?)
                .build()
                .ok()
        })
        .collect();

    let mut out = LinuxResources::default();
    out.set_cpu(cpu_set.then_some(cpu));
    out.set_memory(memory_set.then_some(memory));
    out.set_hugepage_limits((!hugepages.is_empty()).then_some(hugepages));
    out.set_unified((!r.unified.is_empty()).then(|| {
        r.unified
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_resources_set_nothing() {
        let got = linux_resources(&Default::default());
        assert_eq!(got, LinuxResources::default());
        assert!(got.cpu().is_none() && got.memory().is_none() && got.unified().is_none());
    }

    #[test]
    fn every_field_maps() {
        let r = cri::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: 50_000,
            cpu_shares: 512,
            memory_limit_in_bytes: 64 << 20,
            oom_score_adj: 100,
            cpuset_cpus: "0-1".into(),
            cpuset_mems: "0".into(),
            hugepage_limits: vec![
                cri::HugepageLimit {
                    page_size: "2MB".into(),
                    limit: 4 << 20,
                },
                cri::HugepageLimit {
                    page_size: "1GB".into(),
                    limit: u64::MAX,
                },
            ],
            unified: [("memory.high".to_string(), "1000000".to_string())].into(),
            memory_swap_limit_in_bytes: 128 << 20,
        };
        let got = linux_resources(&r);
        let cpu = got.cpu().clone().unwrap();
        assert_eq!(cpu.period(), Some(100_000));
        assert_eq!(cpu.quota(), Some(50_000));
        assert_eq!(cpu.shares(), Some(512));
        assert_eq!(cpu.cpus().as_deref(), Some("0-1"));
        assert_eq!(cpu.mems().as_deref(), Some("0"));
        let mem = got.memory().unwrap();
        assert_eq!(mem.limit(), Some(64 << 20));
        assert_eq!(mem.swap(), None);
        let huge = got.hugepage_limits().clone().unwrap();
        assert_eq!(huge.len(), 1, "the unrepresentable 1GB limit is left out");
        assert_eq!(
            (huge[0].page_size().as_str(), huge[0].limit()),
            ("2MB", 4 << 20)
        );
        assert_eq!(
            got.unified()
                .as_ref()
                .and_then(|u| u.get("memory.high"))
                .map(String::as_str),
            Some("1000000")
        );
    }

    #[test]
    fn negative_and_unlimited_values() {
        let r = cri::LinuxContainerResources {
            cpu_period: -1,
            cpu_quota: -1,
            cpu_shares: -2,
            ..Default::default()
        };
        let cpu = linux_resources(&r).cpu().clone().unwrap();
        assert_eq!(
            (cpu.period(), cpu.quota(), cpu.shares()),
            (None, Some(-1), None)
        );
    }
}
