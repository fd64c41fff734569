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
                used_bytes: u64v(0),
                inodes_used: u64v(0),
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
                network: None,
                process: Some(cri::ProcessUsage {
                    timestamp: ts,
                    process_count: u64v(usage.pids),
                }),
                containers,
            }),
            windows: None,
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
