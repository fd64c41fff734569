//! The kubelet's own metrics, with upstream's names and labels, in one process-wide registry
//! (the Prometheus project's `prometheus-client`), served on `/metrics`; the probe counters on
//! `/metrics/probes`. [`Metrics`] observes every call of the [`runtime::Instrumented`] runtime
//! (`kubelet_runtime_operations_*`); [`startup::StartupTracker`] keeps what the pod startup
//! latency SLI needs; the API client counts its requests (`rest_client_*`, [`RestRequest`]).

pub mod startup;

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Operation {
    pub operation_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerType {
    pub container_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ContainerState {
    pub container_state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeName {
    pub node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub probe_type: String,
    pub result: String,
    pub container: String,
    pub pod: String,
    pub namespace: String,
    pub pod_uid: String,
}

/// `rest_client_requests_total`'s labels, as client-go's: the status code (`"200"`, or
/// `"<error>"` when no response came), the method (`GET`) and the API server's `host:port`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestRequest {
    pub code: String,
    pub method: String,
    pub host: String,
}

/// `rest_client_request_duration_seconds`'s labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RestVerbHost {
    pub verb: String,
    pub host: String,
}

/// Every metric the kubelet keeps.
pub struct Metrics {
    pub node_name: Family<NodeName, Gauge>,
    pub running_pods: Gauge,
    pub running_containers: Family<ContainerState, Gauge>,
    pub started_containers: Family<ContainerType, Counter>,
    pub started_containers_errors: Family<ContainerType, Counter>,
    pub pod_worker_duration: Family<Operation, Histogram>,
    pub pod_start_duration: Histogram,
    pub pod_start_sli_duration: Histogram,
    pub pod_start_total_duration: Histogram,
    pub pod_startup: startup::StartupTracker,
    pub pleg_relist_duration: Histogram,
    pub pleg_relist_interval: Histogram,
    pub pleg_last_seen: Gauge<f64, AtomicU64>,
    pub runtime_operations: Family<Operation, Counter>,
    pub runtime_operations_errors: Family<Operation, Counter>,
    pub runtime_operations_duration: Family<Operation, Histogram>,
    pub probe_total: Family<ProbeLabels, Counter>,
    pub rest_client_requests: Family<RestRequest, Counter>,
    pub rest_client_request_duration: Family<RestVerbHost, Histogram>,
}

fn seconds_buckets() -> impl Iterator<Item = f64> {
    // 5 ms .. ~82 s, as upstream's default-ish exponential buckets.
    exponential_buckets(0.005, 2.5, 12)
}

/// Upstream's buckets for the pod startup durations, in seconds.
const POD_STARTUP_BUCKETS: [f64; 25] = [
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
];

/// client-go's buckets for `rest_client_request_duration_seconds`.
const REST_LATENCY_BUCKETS: [f64; 12] = [
    0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0,
];

impl Metrics {
    fn new() -> Metrics {
        let h = || Histogram::new(seconds_buckets());
        Metrics {
            node_name: Family::default(),
            running_pods: Gauge::default(),
            running_containers: Family::default(),
            started_containers: Family::default(),
            started_containers_errors: Family::default(),
            pod_worker_duration: Family::new_with_constructor(|| Histogram::new(seconds_buckets())),
            pod_start_duration: Histogram::new(POD_STARTUP_BUCKETS),
            pod_start_sli_duration: Histogram::new(POD_STARTUP_BUCKETS),
            pod_start_total_duration: Histogram::new(POD_STARTUP_BUCKETS),
            pod_startup: startup::StartupTracker::default(),
            pleg_relist_duration: h(),
            pleg_relist_interval: h(),
            pleg_last_seen: Gauge::default(),
            runtime_operations: Family::default(),
            runtime_operations_errors: Family::default(),
            runtime_operations_duration: Family::new_with_constructor(|| {
                Histogram::new(seconds_buckets())
            }),
            probe_total: Family::default(),
            rest_client_requests: Family::default(),
            rest_client_request_duration: Family::new_with_constructor(|| {
                Histogram::new(REST_LATENCY_BUCKETS)
            }),
        }
    }

    /// The `/metrics` registry.
    fn registry(&self) -> Registry {
        let mut r = Registry::default();
        let k = r.sub_registry_with_prefix("kubelet");
        k.register(
            "node_name",
            "The node's name; the count is always 1",
            self.node_name.clone(),
        );
        k.register(
            "running_pods",
            "Number of pods that have a running pod sandbox",
            self.running_pods.clone(),
        );
        k.register(
            "running_containers",
            "Number of containers currently running",
            self.running_containers.clone(),
        );
        k.register(
            "started_containers",
            "Cumulative number of containers started",
            self.started_containers.clone(),
        );
        k.register(
            "started_containers_errors",
            "Cumulative number of errors when starting containers",
            self.started_containers_errors.clone(),
        );
        k.register(
            "pod_worker_duration_seconds",
            "Duration in seconds to sync a single pod, broken down by operation type",
            self.pod_worker_duration.clone(),
        );
        k.register(
            "pod_start_duration_seconds",
            "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
            self.pod_start_duration.clone(),
        );
        k.register(
            "pod_start_sli_duration_seconds",
            "Duration in seconds to start a pod, excluding time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch",
            self.pod_start_sli_duration.clone(),
        );
        k.register(
            "pod_start_total_duration_seconds",
            "Duration in seconds to start a pod since creation, including time to pull images and run init containers, measured from pod creation timestamp to when all its containers are reported as started and observed via watch",
            self.pod_start_total_duration.clone(),
        );
        k.register(
            "pleg_relist_duration_seconds",
            "Duration in seconds for relisting pods in PLEG",
            self.pleg_relist_duration.clone(),
        );
        k.register(
            "pleg_relist_interval_seconds",
            "Interval in seconds between relisting in PLEG",
            self.pleg_relist_interval.clone(),
        );
        k.register(
            "pleg_last_seen_seconds",
            "Timestamp in seconds when PLEG was last seen active",
            self.pleg_last_seen.clone(),
        );
        k.register(
            "runtime_operations",
            "Cumulative number of runtime operations by operation type",
            self.runtime_operations.clone(),
        );
        k.register(
            "runtime_operations_errors",
            "Cumulative number of runtime operation errors by operation type",
            self.runtime_operations_errors.clone(),
        );
        k.register(
            "runtime_operations_duration_seconds",
            "Duration in seconds of runtime operations, broken down by operation type",
            self.runtime_operations_duration.clone(),
        );
        let rest = r.sub_registry_with_prefix("rest_client");
        rest.register(
            "requests",
            "Number of HTTP requests, partitioned by status code, method, and host",
            self.rest_client_requests.clone(),
        );
        rest.register(
            "request_duration_seconds",
            "Request latency in seconds. Broken down by verb, and host",
            self.rest_client_request_duration.clone(),
        );
        r
    }

    /// The `/metrics/probes` registry.
    fn probes_registry(&self) -> Registry {
        let mut r = Registry::default();
        r.sub_registry_with_prefix("prober").register(
            "probe",
            "Cumulative number of a liveness, readiness or startup probe for a container by result",
            self.probe_total.clone(),
        );
        r
    }

    /// `/metrics` in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry());
        out
    }

    /// `/metrics/probes` in the Prometheus text format.
    pub fn encode_probes(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.probes_registry());
        out
    }

    /// Counts a container start (`container_type`: `container`, `init_container`).
    pub fn container_started(&self, container_type: &str, ok: bool) {
        let l = ContainerType {
            container_type: container_type.to_string(),
        };
        self.started_containers.get_or_create(&l).inc();
        if !ok {
            self.started_containers_errors.get_or_create(&l).inc();
        }
    }

    /// The API watch showed `pods` at `when`: each goes through the startup tracker, and a
    /// start it completes is observed in the SLI and total histograms.
    pub fn pods_observed_on_watch<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a k8s_openapi::api::core::v1::Pod>,
        when: std::time::SystemTime,
    ) {
        for pod in pods {
            let o = self.pod_startup.observed_on_watch(pod, when);
            self.pod_started(pod, o);
        }
    }

    /// The kubelet wrote `pod`'s status (the object the API server returned).
    pub fn pod_status_written(&self, pod: &k8s_openapi::api::core::v1::Pod) {
        let o = self
            .pod_startup
            .status_written(pod, std::time::SystemTime::now());
        self.pod_started(pod, o);
    }

    fn pod_started(&self, pod: &k8s_openapi::api::core::v1::Pod, o: Option<startup::Observation>) {
        let Some(o) = o else {
            return;
        };
        tracing::info!(pod = %crate::model::pod_full_name(pod),
            total = o.total.as_secs_f64(), sli = ?o.sli.map(|d| d.as_secs_f64()),
            "observed pod startup duration");
        self.pod_start_total_duration.observe(o.total.as_secs_f64());
        if let Some(sli) = o.sli {
            self.pod_start_sli_duration.observe(sli.as_secs_f64());
        }
    }

    /// Records one request of the API client (`code` None: no response).
    pub fn rest_request(&self, host: &str, method: &str, code: Option<u16>, took: Duration) {
        self.rest_client_requests
            .get_or_create(&RestRequest {
                code: code.map_or_else(|| "<error>".to_string(), |c| c.to_string()),
                method: method.to_string(),
                host: host.to_string(),
            })
            .inc();
        self.rest_client_request_duration
            .get_or_create(&RestVerbHost {
                verb: method.to_string(),
                host: host.to_string(),
            })
            .observe(took.as_secs_f64());
    }
}

/// Each call of a [`runtime::Instrumented`] runtime, counted and timed in
/// `kubelet_runtime_operations_*` under upstream's `operation_type`.
impl runtime::Observer for Metrics {
    fn observe(&self, operation: &'static str, took: Duration, ok: bool) {
        let l = Operation {
            operation_type: operation.to_string(),
        };
        self.runtime_operations.get_or_create(&l).inc();
        if !ok {
            self.runtime_operations_errors.get_or_create(&l).inc();
        }
        self.runtime_operations_duration
            .get_or_create(&l)
            .observe(took.as_secs_f64());
    }
}

/// The process's metrics.
pub fn get() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_registry_encodes_upstreams_names() {
        let m = super::get();
        m.container_started("container", true);
        let text = m.encode();
        assert!(
            text.contains("kubelet_started_containers_total{container_type=\"container\"}"),
            "{text}"
        );
        assert!(text.contains("# TYPE kubelet_running_pods gauge"), "{text}");
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn runtime_operations_are_observed_under_upstreams_names() {
        use runtime::Observer as _;
        let m = super::get();
        m.observe("run_podsandbox", std::time::Duration::from_millis(3), false);
        let text = m.encode();
        for name in [
            "kubelet_runtime_operations_total",
            "kubelet_runtime_operations_errors_total",
            "kubelet_runtime_operations_duration_seconds_count",
        ] {
            assert!(
                text.contains(&format!("{name}{{operation_type=\"run_podsandbox\"}}")),
                "{name}: {text}"
            );
        }
    }
}
