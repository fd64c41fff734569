//! `/metrics/resource`: what metrics-server scrapes for `kubectl top` (upstream's resource
//! metrics endpoint): the node's CPU and working set, and each container's and pod's from the
//! runtime's CRI stats, with the samples' timestamps, in the Prometheus text format.
//!
//! Written here rather than through the metrics registry: every sample carries the time its
//! stats were taken, which metrics-server reads, and the registry's encoder has no timestamps.

use std::collections::BTreeMap;
use std::fmt::Write;

use runtime::{RuntimeService, cri};

use super::container_name;

/// The node's CPU time in seconds (`/proc/stat`: every state but idle and iowait).
pub fn node_cpu_seconds(stat: &str) -> Option<f64> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let busy: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|i| v.get(*i)).sum();
    // USER_HZ is 100 on Linux.
    Some(busy as f64 / 100.0)
}

/// The node's working set in bytes (`/proc/meminfo`): used memory less inactive file pages,
/// as cAdvisor counts the root container's.
pub fn node_working_set(meminfo: &str) -> Option<u64> {
    let kb = |key: &str| meminfo_kb(meminfo, key);
    let used = kb("MemTotal")?.saturating_sub(kb("MemFree")?);
    Some(used.saturating_sub(kb("Inactive(file)").unwrap_or(0)) * 1024)
}

/// The figure of `key` in `/proc/meminfo`'s text, in kB.
pub(super) fn meminfo_kb(meminfo: &str, key: &str) -> Option<u64> {
    meminfo
        .lines()
        .find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

pub(super) fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample: its labels (`{k="v",...}`, or empty), its value and its time in ms.
pub(super) type Sample = (String, f64, i64);

/// One metric family: HELP, TYPE and samples.
pub(super) fn family(out: &mut String, name: &str, kind: &str, help: &str, samples: &[Sample]) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value, ts) in samples {
        let _ = writeln!(out, "{name}{labels} {value} {ts}");
    }
}

pub(super) fn ms(ns: i64) -> i64 {
    ns / 1_000_000
}

/// The text of `/metrics/resource`.
pub async fn render(rt: &dyn RuntimeService) -> String {
    let now_ms = ms(runtime::clock::now_ns());
    let cpu = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| node_cpu_seconds(&s));
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| node_working_set(&s));
    let listed = match rt
        .list_container_stats(cri::ListContainerStatsRequest { filter: None })
        .await
    {
        Ok(r) => Some(r.stats),
        Err(e) => {
            tracing::debug!("/metrics/resource: ListContainerStats: {e}");
            None
        }
    };
    let error = cpu.is_none() || mem.is_none() || listed.is_none();
    let mut usage = Usage::default();
    for s in listed.iter().flatten() {
        usage.add(s);
    }
    let node = |v: Option<f64>| {
        v.map(|v| vec![(String::new(), v, now_ms)])
            .unwrap_or_default()
    };
    let (pod_cpu, pod_memory) = usage.pod_samples();
    let families = [
        (
            "container_cpu_usage_seconds_total",
            "counter",
            "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
            usage.container_cpu,
        ),
        (
            "container_memory_working_set_bytes",
            "gauge",
            "[STABLE] Current working set of the container in bytes",
            usage.container_memory,
        ),
        (
            "node_cpu_usage_seconds_total",
            "counter",
            "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
            node(cpu),
        ),
        (
            "node_memory_working_set_bytes",
            "gauge",
            "[STABLE] Current working set of the node in bytes",
            node(mem.map(|m| m as f64)),
        ),
        (
            "pod_cpu_usage_seconds_total",
            "counter",
            "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
            pod_cpu,
        ),
        (
            "pod_memory_working_set_bytes",
            "gauge",
            "[STABLE] Current working set of the pod in bytes",
            pod_memory,
        ),
    ];
    let mut out = String::new();
    for (name, kind, help, samples) in &families {
        family(&mut out, name, kind, help, samples);
    }
    let _ = writeln!(
        out,
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE resource_scrape_error gauge\nresource_scrape_error {}",
        u8::from(error)
    );
    out
}

/// The containers' CPU and working set samples, and their pods' sums.
#[derive(Default)]
struct Usage {
    container_cpu: Vec<Sample>,
    container_memory: Vec<Sample>,
    /// Per pod (namespace, name): CPU seconds and working set bytes summed over its
    /// containers, and the time of its latest CPU sample.
    pods: BTreeMap<(String, String), (f64, f64, i64)>,
}

impl Usage {
    /// Adds a container's samples, and counts them in its pod's.
    fn add(&mut self, s: &cri::ContainerStats) {
        let Some(attrs) = &s.attributes else { return };
        let label = |k: &str| attrs.labels.get(k).cloned().unwrap_or_default();
        let (pod, ns) = (
            label("io.kubernetes.pod.name"),
            label("io.kubernetes.pod.namespace"),
        );
        let labels = format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            escape(&container_name(attrs.metadata.as_ref())),
            escape(&ns),
            escape(&pod)
        );
        let entry = self.pods.entry((ns, pod)).or_insert((0.0, 0.0, 0));
        if let Some(c) = &s.cpu {
            if let Some(u) = &c.usage_core_nano_seconds {
                let v = u.value as f64 / 1e9;
                self.container_cpu
                    .push((labels.clone(), v, ms(c.timestamp)));
                entry.0 += v;
                entry.2 = entry.2.max(ms(c.timestamp));
            }
        }
        if let Some(m) = &s.memory {
            if let Some(w) = &m.working_set_bytes {
                self.container_memory
                    .push((labels, w.value as f64, ms(m.timestamp)));
                entry.1 += w.value as f64;
            }
        }
    }

    /// The pods' CPU and working set samples.
    fn pod_samples(&self) -> (Vec<Sample>, Vec<Sample>) {
        let pod_labels = |(ns, pod): &(String, String)| {
            format!("{{namespace=\"{}\",pod=\"{}\"}}", escape(ns), escape(pod))
        };
        self.pods
            .iter()
            .map(|(k, (cpu, mem, ts))| {
                let labels = pod_labels(k);
                ((labels.clone(), *cpu, *ts), (labels, *mem, *ts))
            })
            .unzip()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_figures_from_proc() {
        let stat = "cpu  100 20 30 4000 50 6 7 8 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        assert_eq!(
            node_cpu_seconds(stat),
            Some((100 + 20 + 30 + 6 + 7 + 8) as f64 / 100.0)
        );
        let meminfo = "MemTotal:       1000 kB\nMemFree:         200 kB\nInactive(file):  300 kB\n";
        assert_eq!(node_working_set(meminfo), Some(500 * 1024));
    }
}
