//! The configuration file as written ([`RawConfig`]: the v1beta1 field names, every field
//! optional) and its one conversion into [`KubeletConfig`], defaulting and checking each value.

use super::*;

/// The file as written: the `KubeletConfiguration` (v1beta1) fields nodelet reads, by their
/// names there, `None` when unset (or `null`). Anything else lands in `other`, to be warned
/// about. [`RawConfig::into_config`] applies the defaults and checks the values.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawConfig {
    static_pod_path: Option<Typed<String>>,
    #[serde(rename = "staticPodURL")]
    static_pod_url: Option<Typed<String>>,
    sync_frequency: Option<Typed<Duration>>,
    file_check_frequency: Option<Typed<Duration>>,
    http_check_frequency: Option<Typed<Duration>>,
    node_status_update_frequency: Option<Typed<Duration>>,
    node_status_report_frequency: Option<Typed<Duration>>,
    node_lease_duration_seconds: Option<Typed<i64>>,
    max_pods: Option<Typed<i64>>,
    pod_pids_limit: Option<Typed<i64>>,
    pod_logs_dir: Option<Typed<String>>,
    container_runtime_endpoint: Option<Typed<String>>,
    image_service_endpoint: Option<Typed<String>>,
    cgroup_root: Option<Typed<String>>,
    #[serde(rename = "cgroupsPerQOS")]
    cgroups_per_qos: Option<Typed<bool>>,
    cgroup_driver: Option<Typed<String>>,
    enforce_node_allocatable: Option<Typed<Vec<String>>>,
    #[serde(rename = "cpuCFSQuota")]
    cpu_cfs_quota: Option<Typed<bool>>,
    #[serde(rename = "imageGCHighThresholdPercent")]
    image_gc_high_threshold_percent: Option<Typed<i64>>,
    #[serde(rename = "imageGCLowThresholdPercent")]
    image_gc_low_threshold_percent: Option<Typed<i64>>,
    #[serde(rename = "imageMinimumGCAge")]
    image_minimum_gc_age: Option<Typed<Duration>>,
    #[serde(rename = "imageMaximumGCAge")]
    image_maximum_gc_age: Option<Typed<Duration>>,
    shutdown_grace_period: Option<Typed<Duration>>,
    shutdown_grace_period_critical_pods: Option<Typed<Duration>>,
    shutdown_grace_period_by_pod_priority: Option<Value>,
    nodelet_shutdown_on_sigterm: Option<Typed<bool>>,
    #[serde(rename = "clusterDNS")]
    cluster_dns: Option<IpList>,
    cluster_domain: Option<Typed<String>>,
    register_node: Option<Typed<bool>>,
    register_with_taints: Option<Value>,
    #[serde(rename = "providerID")]
    provider_id: Option<Typed<String>>,
    runtime_request_timeout: Option<Typed<Duration>>,
    rotate_certificates: Option<Typed<bool>>,
    eviction_hard: Option<Thresholds>,
    merge_default_eviction_settings: Option<Typed<bool>>,
    eviction_soft: Option<Thresholds>,
    eviction_soft_grace_period: Option<Thresholds>,
    eviction_max_pod_grace_period: Option<Typed<i64>>,
    eviction_minimum_reclaim: Option<Thresholds>,
    eviction_pressure_transition_period: Option<Typed<Duration>>,
    kube_reserved: Option<Quantities>,
    system_reserved: Option<Quantities>,
    #[serde(rename = "reservedSystemCPUs")]
    reserved_system_cpus: Option<Typed<String>>,
    serialize_image_pulls: Option<Typed<bool>>,
    max_parallel_image_pulls: Option<Typed<i64>>,
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<Typed<String>>,
    nodelet_pod_bridge: Option<Typed<String>>,
    nodelet_pod_masquerade: Option<Typed<bool>>,
    nodelet_insecure_registries: Option<Typed<Vec<String>>>,
    nodelet_image_preload_dir: Option<Typed<String>>,
    nodelet_registries_config: Option<Typed<String>>,
    nodelet_registry_hosts_dir: Option<Typed<String>>,
    #[serde(rename = "nodeletCDISpecDirs")]
    nodelet_cdi_spec_dirs: Option<Typed<Vec<String>>>,
    nodelet_testing: Option<Testing>,
    nodelet_network: Option<NetworkField>,
    /// The server's fields (taken before `other` sees the rest).
    #[serde(flatten)]
    server: server::RawServer,
    /// The container log rotation fields.
    #[serde(flatten)]
    container_logs: logs::RawContainerLogs,

    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

impl RawConfig {
    /// The effective configuration: upstream's defaults for what is unset, every value
    /// checked. Returns the warnings too (unknown fields, in the order of their paths).
    pub(super) fn into_config(self) -> Result<(KubeletConfig, Vec<String>), Error> {
        let d = KubeletConfig::default();
        let mut warnings: Vec<String> = self.other.keys().map(|k| unknown(k)).collect();
        let testing = testing(self.nodelet_testing, d.testing, &mut warnings)?;
        let network = network::network(self.nodelet_network.map(|n| n.0), &mut warnings)?;
        let server = self.server.into_config(&mut warnings)?;
        let container_logs = self.container_logs.into_config()?;
        let reserved = allocatable::reserved(
            self.kube_reserved,
            self.system_reserved,
            self.reserved_system_cpus,
        )?;
        let cgroups = cgroups::RawCgroups {
            root: self.cgroup_root,
            per_qos: self.cgroups_per_qos,
            driver: self.cgroup_driver,
            enforce_node_allocatable: self.enforce_node_allocatable,
            cpu_cfs_quota: self.cpu_cfs_quota,
        }
        .into_config()?;
        let image_gc = image_gc::RawImageGc {
            high: self.image_gc_high_threshold_percent,
            low: self.image_gc_low_threshold_percent,
            minimum_age: self.image_minimum_gc_age,
            maximum_age: self.image_maximum_gc_age,
        }
        .into_config()?;
        let shutdown = shutdown::RawShutdown {
            grace_period: self.shutdown_grace_period,
            grace_period_critical_pods: self.shutdown_grace_period_critical_pods,
            by_pod_priority: self.shutdown_grace_period_by_pod_priority,
            on_sigterm: self.nodelet_shutdown_on_sigterm,
        }
        .into_config()?;
        let registration = registration::RawRegistration {
            taints: self.register_with_taints,
            provider_id: self.provider_id,
        }
        .into_config()?;
        warnings.sort();

        let pod_pids_limit = pod_pids_limit(self.pod_pids_limit, d.pod_pids_limit)?;
        let pod_logs_dir = absolute_path("podLogsDir", self.pod_logs_dir, d.pod_logs_dir)?;
        let (eviction_hard, eviction) = eviction::RawEviction {
            hard: self.eviction_hard,
            merge_defaults: self.merge_default_eviction_settings,
            soft: self.eviction_soft,
            soft_grace_period: self.eviction_soft_grace_period,
            max_pod_grace_period: self.eviction_max_pod_grace_period,
            minimum_reclaim: self.eviction_minimum_reclaim,
            pressure_transition_period: self.eviction_pressure_transition_period,
        }
        .into_config()?;
        let pod_cidr = pod_cidr(self.pod_cidr, d.pod_cidr)?;
        let cdi_spec_dirs = cdi_spec_dirs(self.nodelet_cdi_spec_dirs, d.cdi_spec_dirs)?;
        let (serialize_image_pulls, max_parallel_image_pulls) =
            image_pulls(self.serialize_image_pulls, self.max_parallel_image_pulls)?;

        let cfg = KubeletConfig {
            static_pod_path: get(self.static_pod_path).map_or(d.static_pod_path, PathBuf::from),
            static_pod_url: get(self.static_pod_url).unwrap_or(d.static_pod_url),
            sync_frequency: positive("syncFrequency", self.sync_frequency, d.sync_frequency)?,
            file_check_frequency: positive(
                "fileCheckFrequency",
                self.file_check_frequency,
                d.file_check_frequency,
            )?,
            http_check_frequency: positive(
                "httpCheckFrequency",
                self.http_check_frequency,
                d.http_check_frequency,
            )?,
            node_status_update_frequency: positive(
                "nodeStatusUpdateFrequency",
                self.node_status_update_frequency,
                d.node_status_update_frequency,
            )?,
            node_status_report_frequency: positive(
                "nodeStatusReportFrequency",
                self.node_status_report_frequency,
                d.node_status_report_frequency,
            )?,
            node_lease_duration_seconds: at_least_one(
                "nodeLeaseDurationSeconds",
                self.node_lease_duration_seconds,
                d.node_lease_duration_seconds,
            )?,
            max_pods: at_least_one("maxPods", self.max_pods, d.max_pods)?,
            pod_pids_limit,
            pod_logs_dir,
            // The built-in runtime's own name stands for it (the default).
            container_runtime_endpoint: get(self.container_runtime_endpoint)
                .filter(|e| e != runtime::builtin::RUNTIME_NAME)
                .unwrap_or(d.container_runtime_endpoint),
            image_service_endpoint: get(self.image_service_endpoint)
                .unwrap_or(d.image_service_endpoint),
            cgroups,
            image_gc,
            shutdown,
            cluster_dns: self.cluster_dns.map_or(d.cluster_dns, |IpList(ips)| ips),
            cluster_domain: get(self.cluster_domain).unwrap_or(d.cluster_domain),
            register_node: get(self.register_node).unwrap_or(d.register_node),
            registration,
            rotate_certificates: get(self.rotate_certificates).unwrap_or(d.rotate_certificates),
            runtime_request_timeout: positive(
                "runtimeRequestTimeout",
                self.runtime_request_timeout,
                d.runtime_request_timeout,
            )?,
            eviction_hard,
            eviction,
            reserved,
            serialize_image_pulls,
            max_parallel_image_pulls,
            testing,
            server,
            container_logs,
            pod_cidr,
            pod_bridge: get(self.nodelet_pod_bridge).unwrap_or(d.pod_bridge),
            pod_masquerade: get(self.nodelet_pod_masquerade).unwrap_or(d.pod_masquerade),
            insecure_registries: get(self.nodelet_insecure_registries)
                .unwrap_or(d.insecure_registries),
            image_preload_dir: get(self.nodelet_image_preload_dir)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            registries_config: get(self.nodelet_registries_config)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            registry_hosts_dir: get(self.nodelet_registry_hosts_dir)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
            cdi_spec_dirs,
            network,
            // Set from flags.
            node_name: d.node_name,
            node_ips: d.node_ips,
            kubeconfig: d.kubeconfig,
            root_dir: d.root_dir,
            cert_dir: d.cert_dir,
            pod_infra_container_image: d.pod_infra_container_image,
        };
        Ok((cfg, warnings))
    }
}

/// `podPidsLimit`: -1 (unlimited) or at least 1.
fn pod_pids_limit(field: Option<Typed<i64>>, default: i64) -> Result<i64, Error> {
    match get(field) {
        None => Ok(default),
        Some(n) if n == -1 || n >= 1 => Ok(n),
        Some(_) => Err(invalid("podPidsLimit", "must be -1 (unlimited) or >= 1")),
    }
}

/// A field holding an absolute path.
fn absolute_path(
    k: &str,
    field: Option<Typed<String>>,
    default: PathBuf,
) -> Result<PathBuf, Error> {
    match get(field) {
        None => Ok(default),
        Some(s) if s.starts_with('/') => Ok(PathBuf::from(s)),
        Some(s) => Err(invalid(k, format!("{s:?} is not an absolute path"))),
    }
}

/// `podCIDR`: the pod CIDRs the built-in runtime can use (one subnet, or one of each family,
/// comma-separated).
fn pod_cidr(field: Option<Typed<String>>, default: String) -> Result<String, Error> {
    let Some(cidr) = get(field) else {
        return Ok(default);
    };
    runtime::builtin::parse_pod_cidrs(&cidr).map_err(|e| invalid("podCIDR", e.message()))?;
    Ok(cidr)
}

/// `nodeletCDISpecDirs`: absolute paths (an empty list reads no CDI spec).
fn cdi_spec_dirs(
    field: Option<Typed<Vec<String>>>,
    default: Vec<PathBuf>,
) -> Result<Vec<PathBuf>, Error> {
    let Some(dirs) = get(field) else {
        return Ok(default);
    };
    match dirs.iter().find(|d| !d.starts_with('/')) {
        Some(d) => Err(invalid(
            "nodeletCDISpecDirs",
            format!("{d:?} is not an absolute path"),
        )),
        None => Ok(dirs.into_iter().map(PathBuf::from).collect()),
    }
}

/// `serializeImagePulls` and `maxParallelImagePulls`. Upstream: unset, serializeImagePulls is
/// true unless maxParallelImagePulls asks for more than one pull at a time; set true, it
/// cannot.
fn image_pulls(
    serialize: Option<Typed<bool>>,
    max_parallel: Option<Typed<i64>>,
) -> Result<(bool, Option<u32>), Error> {
    let max_parallel = match get(max_parallel) {
        None => None,
        Some(n) if n < 1 => {
            return Err(invalid(
                "maxParallelImagePulls",
                format!("{n} must be a positive number"),
            ));
        }
        Some(n) => Some(int32("maxParallelImagePulls", n)?),
    };
    let many_pulls = max_parallel.is_some_and(|n| n > 1);
    let serialize = get(serialize).unwrap_or(!many_pulls);
    if serialize && many_pulls {
        return Err(invalid(
            "maxParallelImagePulls",
            "cannot be larger than 1 unless serializeImagePulls is false",
        ));
    }
    Ok((serialize, max_parallel))
}
