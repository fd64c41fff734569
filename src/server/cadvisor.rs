//! `/metrics/cadvisor`: the containers' usage as cAdvisor names it, from the runtime's CRI
//! stats (ListPodSandboxStats with its containers; upstream's kubelet reads cAdvisor, which
//! reads the cgroups the runtime made: the same figures). Per container, labelled `container`,
//! `id` (the CRI container id), `image`, `name` (empty: no Docker names with CRI runtimes),
//! `namespace` and `pod`: CPU time, memory working set, RSS and usage, the writable layer's
//! bytes and inodes. Per pod, on its sandbox (`container=""`, `id` the sandbox's), the network
//! interfaces' received and transmitted bytes and errors, labelled `interface`.
//!
//! Only what the runtime reports is written: a figure it does not know (the writable layer of
//! a container whose layer it cannot read) has no sample, never a zero.

use std::collections::HashMap;

use runtime::{RuntimeService, cri};

use super::container_name;
use super::resource::{Sample, escape, family, ms};

/// The container families: name, type and help, in the order they are written.
const CONTAINER_FAMILIES: [(&str, &str, &str); 6] = [
    (
        "container_cpu_usage_seconds_total",
        "counter",
        "Cumulative cpu time consumed in seconds.",
    ),
    (
        "container_memory_working_set_bytes",
        "gauge",
        "Current working set in bytes.",
    ),
    ("container_memory_rss", "gauge", "Size of RSS in bytes."),
    (
        "container_memory_usage_bytes",
        "gauge",
        "Current memory usage in bytes, including all memory regardless of when it was accessed",
    ),
    (
        "container_fs_usage_bytes",
        "gauge",
        "Number of bytes that are consumed by the container on this filesystem.",
    ),
    (
        "container_fs_inodes_used",
        "gauge",
        "Number of inodes used by the container's writable layer.",
    ),
];

/// The network families (counters): name and help, as an interface's received and
/// transmitted bytes and errors.
const NETWORK_FAMILIES: [(&str, &str); 4] = [
    (
        "container_network_receive_bytes_total",
        "Cumulative count of bytes received",
    ),
    (
        "container_network_receive_errors_total",
        "Cumulative count of errors encountered while receiving",
    ),
    (
        "container_network_transmit_bytes_total",
        "Cumulative count of bytes transmitted",
    ),
    (
        "container_network_transmit_errors_total",
        "Cumulative count of errors encountered while transmitting",
    ),
];

/// The text of `/metrics/cadvisor`.
pub async fn render(rt: &dyn RuntimeService) -> String {
    let pods = match rt
        .list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest { filter: None })
        .await
    {
        Ok(r) => r.stats,
        Err(e) => {
            tracing::debug!("/metrics/cadvisor: ListPodSandboxStats: {e}");
            Vec::new()
        }
    };
    let images: HashMap<String, String> = rt
        .list_containers(cri::ListContainersRequest { filter: None })
        .await
        .map(|r| {
            r.containers
                .into_iter()
                .map(|c| (c.id, c.image.map(|i| i.image).unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let mut samples = Samples::default();
    for pod in &pods {
        samples.add_pod(pod, &images);
    }
    let mut out = String::new();
    for ((name, kind, help), samples) in CONTAINER_FAMILIES.iter().zip(&samples.container) {
        family(&mut out, name, kind, help, samples);
    }
    for ((name, help), samples) in NETWORK_FAMILIES.iter().zip(&samples.network) {
        family(&mut out, name, "counter", help, samples);
    }
    out
}

/// The samples of each family, in the order of [`CONTAINER_FAMILIES`] and
/// [`NETWORK_FAMILIES`].
#[derive(Default)]
struct Samples {
    container: [Vec<Sample>; 6],
    network: [Vec<Sample>; 4],
}

impl Samples {
    /// A pod's samples: its containers' (their images from `images`, by container id), then
    /// its network interfaces'.
    fn add_pod(&mut self, pod: &cri::PodSandboxStats, images: &HashMap<String, String>) {
        let Some(attrs) = &pod.attributes else {
            return;
        };
        let meta = attrs.metadata.clone().unwrap_or_default();
        let Some(linux) = &pod.linux else { return };
        for c in &linux.containers {
            let Some(ca) = &c.attributes else { continue };
            let labels = format!(
                "{{container=\"{}\",id=\"{}\",image=\"{}\",name=\"\",namespace=\"{}\",pod=\"{}\"}}",
                escape(&container_name(ca.metadata.as_ref())),
                escape(&ca.id),
                escape(images.get(&ca.id).map_or("", String::as_str)),
                escape(&meta.namespace),
                escape(&meta.name),
            );
            self.add_container(&labels, c);
        }
        let Some(n) = &linux.network else { return };
        for i in &n.interfaces {
            let labels = format!(
                "{{container=\"\",id=\"{}\",image=\"\",interface=\"{}\",name=\"\",namespace=\"{}\",pod=\"{}\"}}",
                escape(&attrs.id),
                escape(&i.name),
                escape(&meta.namespace),
                escape(&meta.name),
            );
            let values = [&i.rx_bytes, &i.rx_errors, &i.tx_bytes, &i.tx_errors];
            for (k, v) in values.into_iter().enumerate() {
                if let Some(v) = v {
                    self.network[k].push((labels.clone(), v.value as f64, ms(n.timestamp)));
                }
            }
        }
    }

    /// A container's samples, what the runtime knows of them.
    fn add_container(&mut self, labels: &str, c: &cri::ContainerStats) {
        let mut add = |i: usize, v: Option<&cri::UInt64Value>, scale: f64, ts: i64| {
            if let Some(v) = v {
                self.container[i].push((labels.to_string(), v.value as f64 * scale, ms(ts)));
            }
        };
        if let Some(cpu) = &c.cpu {
            add(0, cpu.usage_core_nano_seconds.as_ref(), 1e-9, cpu.timestamp);
        }
        if let Some(m) = &c.memory {
            add(1, m.working_set_bytes.as_ref(), 1.0, m.timestamp);
            add(2, m.rss_bytes.as_ref(), 1.0, m.timestamp);
            add(3, m.usage_bytes.as_ref(), 1.0, m.timestamp);
        }
        if let Some(w) = &c.writable_layer {
            add(4, w.used_bytes.as_ref(), 1.0, w.timestamp);
            add(5, w.inodes_used.as_ref(), 1.0, w.timestamp);
        }
    }
}
