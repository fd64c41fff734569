//! `/metrics/resource`: what metrics-server scrapes for `kubectl top` (upstream's resource
//! metrics endpoint): the node's CPU and working set, and each container's and pod's from the
//! runtime's CRI stats, with the samples' timestamps, in the Prometheus text format.
//!
//! Written here rather than through the metrics registry: every sample carries the time its
//! stats were taken, which metrics-server reads, and the registry's encoder has no timestamps.

use std::collections::BTreeMap;
use std::fmt::Write;

use runtime::{RuntimeService, cri};

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
    let kb = |key: &str| -> Option<u64> {
        meminfo
            .lines()
            .find(|l| l.starts_with(key) && l[key.len()..].starts_with(':'))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    let used = kb("MemTotal")?.saturating_sub(kb("MemFree")?);
    Some(used.saturating_sub(kb("Inactive(file)").unwrap_or(0)) * 1024)
}

pub(super) fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// One metric family: HELP, TYPE and samples `(labels, value, timestamp ms)`.
pub(super) fn family(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: &[(String, f64, i64)],
) {
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
    let mut error = false;
    let now_ms = ms(runtime::clock::now_ns());
    let cpu = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| node_cpu_seconds(&s));
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| node_working_set(&s));
    error |= cpu.is_none() || mem.is_none();

    let containers = match rt
        .list_container_stats(cri::ListContainerStatsRequest { filter: None })
        .await
    {
        Ok(r) => r.stats,
        Err(e) => {
            tracing::debug!("/metrics/resource: ListContainerStats: {e}");
            error = true;
            Vec::new()
        }
    };
    let (mut c_cpu, mut c_mem) = (Vec::new(), Vec::new());
    // Per pod: CPU and working set summed over its containers.
    let mut pods: BTreeMap<(String, String), (f64, f64, i64)> = BTreeMap::new();
    for s in &containers {
        let Some(attrs) = &s.attributes else { continue };
        let label = |k: &str| attrs.labels.get(k).cloned().unwrap_or_default();
        let (pod, ns) = (
            label("io.kubernetes.pod.name"),
            label("io.kubernetes.pod.namespace"),
        );
        let name = attrs
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let labels = format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            escape(&name),
            escape(&ns),
            escape(&pod)
        );
        let entry = pods.entry((ns, pod)).or_insert((0.0, 0.0, 0));
        if let Some(c) = &s.cpu {
            if let Some(u) = &c.usage_core_nano_seconds {
                let v = u.value as f64 / 1e9;
                c_cpu.push((labels.clone(), v, ms(c.timestamp)));
                entry.0 += v;
                entry.2 = entry.2.max(ms(c.timestamp));
            }
        }
        if let Some(m) = &s.memory {
            if let Some(w) = &m.working_set_bytes {
                c_mem.push((labels, w.value as f64, ms(m.timestamp)));
                entry.1 += w.value as f64;
            }
        }
    }
    let mut out = String::new();
    family(
        &mut out,
        "container_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
        &c_cpu,
    );
    family(
        &mut out,
        "container_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the container in bytes",
        &c_mem,
    );
    family(
        &mut out,
        "node_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
        &cpu.map(|v| vec![(String::new(), v, now_ms)])
            .unwrap_or_default(),
    );
    family(
        &mut out,
        "node_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the node in bytes",
        &mem.map(|v| vec![(String::new(), v as f64, now_ms)])
            .unwrap_or_default(),
    );
    let pod_labels = |(ns, pod): &(String, String)| {
        format!("{{namespace=\"{}\",pod=\"{}\"}}", escape(ns), escape(pod))
    };
    let p_cpu: Vec<(String, f64, i64)> = pods
        .iter()
        .map(|(k, (c, _, ts))| (pod_labels(k), *c, *ts))
        .collect();
    let p_mem: Vec<(String, f64, i64)> = pods
        .iter()
        .map(|(k, (_, m, ts))| (pod_labels(k), *m, *ts))
        .collect();
    family(
        &mut out,
        "pod_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
        &p_cpu,
    );
    family(
        &mut out,
        "pod_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the pod in bytes",
        &p_mem,
    );
    let _ = writeln!(
        out,
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n# TYPE resource_scrape_error gauge\nresource_scrape_error {}",
        u8::from(error)
    );
    out
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
