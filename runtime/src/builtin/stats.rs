//! Stats RPCs: ContainerStats, ListContainerStats, PodSandboxStats, ListPodSandboxStats, read
//! from the containers' and pods' cgroups.

use super::BuiltinRuntime;
use super::store::ContainerRecord;
use crate::{Result, cri};

fn u64v(value: u64) -> Option<cri::UInt64Value> {
    Some(cri::UInt64Value { value })
}

fn cpu_memory(usage: &sandbox::cgroup::Usage, ts: i64) -> (cri::CpuUsage, cri::MemoryUsage) {
    (
        cri::CpuUsage {
            timestamp: ts,
            usage_core_nano_seconds: u64v(usage.cpu_usage_ns),
            usage_nano_cores: None,
        },
        cri::MemoryUsage {
            timestamp: ts,
            working_set_bytes: u64v(usage.memory_working_set_bytes),
            available_bytes: None,
            usage_bytes: u64v(usage.memory_usage_bytes),
            rss_bytes: u64v(usage.memory_rss_bytes),
            page_faults: None,
            major_page_faults: None,
        },
    )
}

impl BuiltinRuntime {
    fn stats_of(&self, rec: &ContainerRecord, cgroup: Option<&str>) -> cri::ContainerStats {
        let ts = sandbox::now_ns();
        let usage = cgroup
            .and_then(|p| sandbox::cgroup::stats(p).ok())
            .unwrap_or_default();
        let (cpu, memory) = cpu_memory(&usage, ts);
        let layer = match self.inner.images.rootfs_usage(&rec.id) {
            Ok(u) => Some(u),
            Err(e) => {
                tracing::debug!(container = %rec.id, "writable layer usage: {e}");
                None
            }
        };
        cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: rec.id.clone(),
                metadata: rec.config.metadata.clone(),
                labels: rec.config.labels.clone(),
                annotations: rec.config.annotations.clone(),
            }),
            cpu: Some(cpu),
            memory: Some(memory),
            writable_layer: Some(cri::FilesystemUsage {
                timestamp: ts,
                fs_id: Some(cri::FilesystemIdentifier {
                    mountpoint: self.inner.images.root().to_string_lossy().into_owned(),
                }),
                // Unknown (not zero) when the layer cannot be read.
                used_bytes: layer.and_then(|(b, _)| u64v(b)),
                inodes_used: layer.and_then(|(_, i)| u64v(i)),
            }),
            swap: None,
        }
    }

    pub(super) async fn container_stats(&self, id: &str) -> Result<cri::ContainerStats> {
        let rec = self.inner.records.need_container(id)?;
        let st = self.status_of(&rec).await;
        Ok(self.stats_of(&rec, st.as_ref().and_then(|s| s.cgroup_path.as_deref())))
    }

    pub(super) async fn list_container_stats(
        &self,
        filter: Option<cri::ContainerStatsFilter>,
    ) -> Result<Vec<cri::ContainerStats>> {
        let f = filter.unwrap_or_default();
        let (recs, statuses) = self
            .matching(&f.id, &f.pod_sandbox_id, &f.label_selector)
            .await;
        Ok(recs
            .iter()
            .filter_map(|r| {
                let st = statuses.get(&r.id)?;
                (st.state == sandbox::State::Running)
                    .then(|| self.stats_of(r, st.cgroup_path.as_deref()))
            })
            .collect())
    }

    pub(super) async fn sandbox_stats(&self, id: &str) -> Result<cri::PodSandboxStats> {
        let rec = self.inner.records.need_sandbox(id)?;
        let ts = sandbox::now_ns();
        let usage = sandbox::cgroup::stats(&rec.cgroup_parent).unwrap_or_default();
        let (cpu, memory) = cpu_memory(&usage, ts);
        let containers = self
            .list_container_stats(Some(cri::ContainerStatsFilter {
                pod_sandbox_id: rec.id.clone(),
                ..Default::default()
            }))
            .await?;
        Ok(cri::PodSandboxStats {
            attributes: Some(cri::PodSandboxAttributes {
                id: rec.id.clone(),
                metadata: rec.config.metadata.clone(),
                labels: rec.config.labels.clone(),
                annotations: rec.config.annotations.clone(),
            }),
            linux: Some(cri::LinuxPodSandboxStats {
                cpu: Some(cpu),
                memory: Some(memory),
                network: self.network_usage(&rec.id, ts),
                process: Some(cri::ProcessUsage {
                    timestamp: ts,
                    process_count: u64v(usage.pids),
                }),
                containers,
            }),
            windows: None,
        })
    }

    /// The counters of the interfaces in the sandbox's network namespace (its process's
    /// `/proc/<pid>/net/dev`, loopback left out), the pod's own `eth0` the default one; `None`
    /// when its process is gone.
    fn network_usage(&self, id: &str, ts: i64) -> Option<cri::NetworkUsage> {
        let pid = self.client(id).pid()?;
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
        let interfaces = parse_net_dev(&text);
        let default_interface = interfaces
            .iter()
            .find(|i| i.name == sandbox::net::POD_INTERFACE)
            .or_else(|| interfaces.first())
            .cloned();
        Some(cri::NetworkUsage {
            timestamp: ts,
            default_interface,
            interfaces,
        })
    }

    pub(super) async fn list_sandbox_stats(
        &self,
        filter: Option<cri::PodSandboxStatsFilter>,
    ) -> Result<Vec<cri::PodSandboxStats>> {
        let f = filter.unwrap_or_default();
        let mut out = Vec::new();
        for rec in self.inner.records.all_sandboxes() {
            if rec.stopped
                || (!f.id.is_empty() && !rec.id.starts_with(&f.id))
                || !super::pod::labels_match(&rec.config.labels, &f.label_selector)
            {
                continue;
            }
            out.push(self.sandbox_stats(&rec.id).await?);
        }
        Ok(out)
    }
}

/// The interfaces of a `/proc/<pid>/net/dev` but loopback: name, then received bytes, packets,
/// errors, drops, ... and transmitted bytes, packets, errors (the 1st, 3rd, 9th and 11th
/// numbers).
fn parse_net_dev(text: &str) -> Vec<cri::NetworkInterfaceUsage> {
    text.lines()
        .filter_map(|l| {
            let (name, counters) = l.split_once(':')?;
            let name = name.trim();
            let v: Vec<u64> = counters
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (name != "lo" && v.len() >= 16).then(|| cri::NetworkInterfaceUsage {
                name: name.to_string(),
                rx_bytes: u64v(v[0]),
                rx_errors: u64v(v[2]),
                tx_bytes: u64v(v[8]),
                tx_errors: u64v(v[10]),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_counters_from_net_dev() {
        let text = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0\n  eth0:    5000      40    2    0    0     0          0         0     3000      30    1    0    0     0       0          0\n";
        let v = parse_net_dev(text);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].name, "eth0");
        let n = |x: &Option<cri::UInt64Value>| x.as_ref().map(|v| v.value);
        assert_eq!(
            (
                n(&v[0].rx_bytes),
                n(&v[0].rx_errors),
                n(&v[0].tx_bytes),
                n(&v[0].tx_errors)
            ),
            (Some(5000), Some(2), Some(3000), Some(1))
        );
    }
}
