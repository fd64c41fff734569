//! The effective configuration written back as a `KubeletConfiguration` (v1beta1 names, Go
//! durations): what `/configz` serves, as upstream's `{"kubeletconfig": ...}`. Reading it back
//! with [`super::parse`] gives the same configuration (tested).

use serde_json::{Value, json};

use super::{AuthzMode, KubeletConfig};
use crate::util::go_duration as d;

impl KubeletConfig {
    /// The file's fields of this configuration (not those the flags set: node name, node IP,
    /// kubeconfig, root dir).
    pub fn to_v1beta1(&self) -> Value {
        let s = &self.server;
        let path = |p: &Option<std::path::PathBuf>| match p {
            Some(p) => Value::from(p.to_string_lossy().into_owned()),
            None => Value::Null,
        };
        let taints: Vec<Value> = self
            .registration
            .taints
            .iter()
            .map(|t| json!({"key": t.key, "value": t.value, "effect": t.effect}))
            .collect();
        let mut v = json!({
            "apiVersion": super::API_VERSION,
            "kind": super::KIND,
            "staticPodPath": self.static_pod_path.to_string_lossy(),
            "staticPodURL": self.static_pod_url,
            "syncFrequency": d(self.sync_frequency),
            "fileCheckFrequency": d(self.file_check_frequency),
            "httpCheckFrequency": d(self.http_check_frequency),
            "nodeStatusUpdateFrequency": d(self.node_status_update_frequency),
            "nodeStatusReportFrequency": d(self.node_status_report_frequency),
            "nodeLeaseDurationSeconds": self.node_lease_duration_seconds,
            "maxPods": self.max_pods,
            "podPidsLimit": self.pod_pids_limit,
            "podLogsDir": self.pod_logs_dir.to_string_lossy(),
            "containerRuntimeEndpoint": self.container_runtime_endpoint,
            "imageServiceEndpoint": self.image_service_endpoint,
            "cgroupRoot": self.cgroups.root,
            "cgroupsPerQOS": self.cgroups.per_qos,
            "clusterDNS": self.cluster_dns.iter().map(|ip| ip.to_string()).collect::<Vec<_>>(),
            "clusterDomain": self.cluster_domain,
            "registerNode": self.register_node,
            "evictionHard": self.eviction_hard,
            "serializeImagePulls": self.serialize_image_pulls,
            "maxParallelImagePulls": self.max_parallel_image_pulls,
            "podCIDR": self.pod_cidr,
            "nodeletPodBridge": self.pod_bridge,
            "nodeletPodMasquerade": self.pod_masquerade,
            "address": s.address.to_string(),
            "port": s.port,
            "readOnlyPort": s.read_only_port,
            "healthzBindAddress": s.healthz_address.to_string(),
            "healthzPort": s.healthz_port,
            "tlsCertFile": path(&s.tls_cert_file),
            "tlsPrivateKeyFile": path(&s.tls_private_key_file),
            "tlsMinVersion": if s.tls13_only { "VersionTLS13" } else { "VersionTLS12" },
            "tlsCipherSuites": s.tls_cipher_suites,
            "authentication": {
                "anonymous": {"enabled": s.anonymous},
                "webhook": {"enabled": s.token_webhook, "cacheTTL": d(s.token_cache_ttl)},
                "x509": {"clientCAFile": path(&s.client_ca_file)},
            },
            "authorization": {
                "mode": match s.authz_mode {
                    AuthzMode::AlwaysAllow => "AlwaysAllow",
                    AuthzMode::Webhook => "Webhook",
                },
                "webhook": {
                    "cacheAuthorizedTTL": d(s.authz_allowed_ttl),
                    "cacheUnauthorizedTTL": d(s.authz_denied_ttl),
                },
            },
            "enableSystemLogHandler": s.system_log_handler,
            "nodeletTesting": {
                "crashLoopBackOffInitial": d(self.testing.crash_loop_back_off_initial),
                "crashLoopBackOffMax": d(self.testing.crash_loop_back_off_max),
            },
        });
        let logs = &self.container_logs;
        if let Some(m) = v.as_object_mut() {
            let cg = &self.cgroups;
            m.insert("cgroupDriver".into(), cg.driver.as_str().into());
            m.insert(
                "enforceNodeAllocatable".into(),
                cg.enforce_node_allocatable.clone().into(),
            );
            m.insert("cpuCFSQuota".into(), cg.cpu_cfs_quota.into());
            if let Some(t) = m.get_mut("nodeletTesting").and_then(Value::as_object_mut) {
                t.insert(
                    "imageGCPeriod".into(),
                    d(self.testing.image_gc_period).into(),
                );
                t.insert(
                    "evictionMonitoringPeriod".into(),
                    d(self.testing.eviction_monitoring_period).into(),
                );
            }
            let ev = &self.eviction;
            m.insert("evictionSoft".into(), json!(ev.soft));
            let grace: serde_json::Map<String, Value> = ev
                .soft_grace_period
                .iter()
                .map(|(k, v)| (k.clone(), d(*v).into()))
                .collect();
            m.insert("evictionSoftGracePeriod".into(), grace.into());
            m.insert(
                "evictionMaxPodGracePeriod".into(),
                ev.max_pod_grace_period.into(),
            );
            m.insert("evictionMinimumReclaim".into(), json!(ev.minimum_reclaim));
            m.insert(
                "evictionPressureTransitionPeriod".into(),
                d(ev.pressure_transition_period).into(),
            );
            let sd = &self.shutdown;
            m.insert("shutdownGracePeriod".into(), d(sd.grace_period).into());
            m.insert(
                "shutdownGracePeriodCriticalPods".into(),
                d(sd.grace_period_critical_pods).into(),
            );
            let by: Vec<Value> = sd
                .by_pod_priority
                .iter()
                .map(|g| json!({"priority": g.priority, "shutdownGracePeriodSeconds": g.grace.as_secs()}))
                .collect();
            m.insert("shutdownGracePeriodByPodPriority".into(), by.into());
            m.insert("nodeletShutdownOnSigterm".into(), sd.on_sigterm.into());
            let gc = &self.image_gc;
            m.insert(
                "imageGCHighThresholdPercent".into(),
                gc.high_threshold_percent.into(),
            );
            m.insert(
                "imageGCLowThresholdPercent".into(),
                gc.low_threshold_percent.into(),
            );
            m.insert("imageMinimumGCAge".into(), d(gc.minimum_age).into());
            m.insert(
                "imageMaximumGCAge".into(),
                d(gc.maximum_age.unwrap_or_default()).into(),
            );
            m.insert(
                "containerLogMaxSize".into(),
                logs.max_size.to_string().into(),
            );
            m.insert("containerLogMaxFiles".into(), logs.max_files.into());
            m.insert("containerLogMaxWorkers".into(), logs.max_workers.into());
            m.insert(
                "containerLogMonitorInterval".into(),
                d(logs.monitor_interval).into(),
            );
        }
        v["nodeletInsecureRegistries"] = json!(self.insecure_registries);
        if let Some(dir) = &self.image_preload_dir {
            v["nodeletImagePreloadDir"] = json!(dir);
        }
        if let Some(file) = &self.registries_config {
            v["nodeletRegistriesConfig"] = json!(file);
        }
        if let Some(dir) = &self.registry_hosts_dir {
            v["nodeletRegistryHostsDir"] = json!(dir);
        }
        v["nodeletCDISpecDirs"] = json!(self.cdi_spec_dirs);
        v["nodeletNetwork"] = json!({
            "mode": "bridge",
            "routes": self.network.routes.as_str(),
            "clusterCIDRs": self.network.cluster_cidrs,
            "vxlan": {"vni": self.network.vxlan.vni, "port": self.network.vxlan.port},
        });
        if let crate::config::network::Mode::Cni(c) = &self.network.mode {
            let bins: Vec<String> = c.bin_dirs.iter().map(|d| d.display().to_string()).collect();
            v["nodeletNetwork"]["mode"] = json!("cni");
            v["nodeletNetwork"]["cniConfDir"] = json!(c.conf_dir);
            v["nodeletNetwork"]["cniBinDir"] = json!(bins.join(","));
            v["nodeletNetwork"]["cniCacheDir"] = json!(c.cache_dir);
        }
        let r = &self.reserved;
        v["kubeReserved"] = reservations(&r.kube);
        v["systemReserved"] = reservations(&r.system);
        v["reservedSystemCPUs"] = r.system_cpus.clone().into();
        v["registerWithTaints"] = Value::Array(taints);
        v["providerID"] = self.registration.provider_id.clone().into();
        v["runtimeRequestTimeout"] = d(self.runtime_request_timeout).into();
        v["rotateCertificates"] = self.rotate_certificates.into();
        v["serverTLSBootstrap"] = s.tls_bootstrap.into();
        v
    }
}

/// A reservation mapping in quantities: cpu in millicores, the others in bytes.
fn reservations(r: &std::collections::BTreeMap<String, i64>) -> Value {
    let quantity = |k: &str, v: i64| match k {
        "cpu" => format!("{v}m"),
        _ => v.to_string(),
    };
    r.iter()
        .map(|(k, &v)| (k.clone(), Value::from(quantity(k, v))))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

#[cfg(test)]
mod tests {
    use super::super::{ServerConfig, parse};
    use super::*;

    #[test]
    fn the_written_configuration_reads_back_the_same() {
        let mut cfg = KubeletConfig::default();
        let (read, warnings) = parse(&cfg.to_v1beta1().to_string()).expect("reads back");
        assert!(warnings.is_empty(), "{warnings:?}");
        // The flags' fields are not in the file.
        let flags = |c: &mut KubeletConfig| {
            c.node_name = String::new();
            c.root_dir = std::path::PathBuf::new();
        };
        let mut read = read;
        flags(&mut read);
        flags(&mut cfg);
        assert_eq!(read, cfg);

        let mut cfg = KubeletConfig {
            static_pod_path: "/etc/nodelet/manifests".into(),
            sync_frequency: std::time::Duration::from_millis(1500),
            cluster_dns: vec!["10.96.0.10".parse().expect("ip")],
            cluster_domain: "cluster.local".into(),
            max_parallel_image_pulls: Some(3),
            serialize_image_pulls: false,
            server: ServerConfig {
                port: 0,
                client_ca_file: Some("/etc/ca.crt".into()),
                tls_cipher_suites: vec!["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256".into()],
                tls13_only: true,
                tls_bootstrap: true,
                ..ServerConfig::loopback_any_port()
            },
            container_logs: super::super::ContainerLogConfig {
                max_size: 1536,
                max_files: 3,
                max_workers: 2,
                monitor_interval: std::time::Duration::from_secs(4),
            },
            reserved: super::super::Reserved {
                kube: [("memory".into(), 512 << 20)].into(),
                system: [("cpu".into(), 2000), ("ephemeral-storage".into(), 1 << 30)].into(),
                system_cpus: "2-3".into(),
            },
            registration: super::super::Registration {
                taints: vec![super::super::TaintSpec {
                    key: "dedicated".into(),
                    value: "edge".into(),
                    effect: "NoSchedule".into(),
                }],
                provider_id: "edge://site-7/node-a".into(),
                ..Default::default()
            },
            runtime_request_timeout: std::time::Duration::from_secs(30),
            rotate_certificates: true,
            cdi_spec_dirs: vec!["/srv/cdi".into()],
            network: crate::config::network::NetworkSettings {
                mode: crate::config::network::Mode::Cni(crate::config::network::Cni {
                    conf_dir: "/srv/cni/net.d".into(),
                    bin_dirs: vec!["/srv/cni/bin".into(), "/usr/lib/cni".into()],
                    cache_dir: "/srv/cni/cache".into(),
                }),
                routes: crate::config::network::Routes::Vxlan,
                vxlan: crate::config::network::Vxlan { vni: 9, port: 4789 },
                cluster_cidrs: vec!["10.244.0.0/16".into()],
            },
            ..Default::default()
        };
        let (mut read, warnings) = parse(&cfg.to_v1beta1().to_string()).expect("reads back");
        assert!(warnings.is_empty(), "{warnings:?}");
        flags(&mut read);
        flags(&mut cfg);
        assert_eq!(read, cfg);
    }
}
