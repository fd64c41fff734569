//! The settings of the kubelet's parts, each with upstream's defaults: the server, the
//! container log rotation, eviction and the node's registration.

use super::*;

#[test]
fn the_servers_fields_with_upstreams_defaults() {
    let (c, w) = ok("");
    assert!(w.is_empty());
    let s = &c.server;
    assert_eq!(
        (s.port, s.healthz_port, s.read_only_port),
        (10250, 10248, 0)
    );
    assert!(!s.anonymous && s.token_webhook);
    assert_eq!(s.authz_mode, AuthzMode::Webhook);
    assert_eq!(ok("readOnlyPort: 10255").0.server.read_only_port, 10255);
    assert_eq!(s.token_cache_ttl, Duration::from_secs(120));
    let (c, w) = ok(r#"
address: 127.0.0.1
port: 0
healthzPort: 0
tlsMinVersion: VersionTLS13
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false, cacheTTL: 10s}
  x509: {clientCAFile: /etc/ca.crt}
authorization:
  mode: AlwaysAllow
  webhook: {cacheAuthorizedTTL: 1m, cacheUnauthorizedTTL: 5s}
"#);
    assert!(w.is_empty(), "{w:?}");
    let s = &c.server;
    assert_eq!(s.address.to_string(), "127.0.0.1");
    assert_eq!((s.port, s.healthz_port), (0, 0));
    assert!(s.tls13_only && s.anonymous && !s.token_webhook);
    assert_eq!(s.token_cache_ttl, Duration::from_secs(10));
    assert_eq!(s.client_ca_file.as_deref(), Some(Path::new("/etc/ca.crt")));
    assert_eq!(s.authz_mode, AuthzMode::AlwaysAllow);
    assert_eq!(
        (s.authz_allowed_ttl, s.authz_denied_ttl),
        (Duration::from_secs(60), Duration::from_secs(5))
    );
    for (text, error) in [
        (
            "authorization: {mode: RBAC}",
            "authorization.mode: \"RBAC\" is not AlwaysAllow or Webhook",
        ),
        ("port: 70000", "port: 70000 is not a valid port"),
        (
            "tlsMinVersion: VersionTLS10",
            "tlsMinVersion: VersionTLS10 is not supported: rustls speaks TLS 1.2 and 1.3 only",
        ),
        (
            "authentication: {anonymous: {enabled: 3}}",
            "authentication.anonymous.enabled: must be true or false, not 3",
        ),
        (
            "tlsCertFile: /a.crt",
            "tlsCertFile: tlsCertFile and tlsPrivateKeyFile go together",
        ),
    ] {
        assert_eq!(err(&format!("{HEAD}{text}\n")), error);
    }
}

#[test]
fn container_log_rotation_settings() {
    let (cfg, warnings) = parse(&format!(
        "{HEAD}containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\ncontainerLogMaxWorkers: 2\ncontainerLogMonitorInterval: 5s\n"
    ))
    .expect("valid");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(
        cfg.container_logs,
        super::ContainerLogConfig {
            max_size: 1024 * 1024,
            max_files: 3,
            max_workers: 2,
            monitor_interval: Duration::from_secs(5),
        }
    );
    // Upstream's defaults.
    let (cfg, _) = parse(HEAD).expect("valid");
    assert_eq!(
        (
            cfg.container_logs.max_size,
            cfg.container_logs.max_files,
            cfg.container_logs.max_workers,
            cfg.container_logs.monitor_interval
        ),
        (10 * 1024 * 1024, 5, 1, Duration::from_secs(10))
    );
    for (text, error) in [
        (
            "containerLogMaxSize: 10MB",
            "containerLogMaxSize: \"10MB\" is not a positive quantity of bytes",
        ),
        (
            "containerLogMaxSize: '0'",
            "containerLogMaxSize: \"0\" is not a positive quantity of bytes",
        ),
        (
            "containerLogMaxFiles: 1",
            "containerLogMaxFiles: 1: must be greater than 1",
        ),
        (
            "containerLogMaxWorkers: 0",
            "containerLogMaxWorkers: 0: must be at least 1",
        ),
        (
            "containerLogMonitorInterval: 1s",
            "containerLogMonitorInterval: 1s: must be at least 3s",
        ),
    ] {
        assert_eq!(err(&format!("{HEAD}{text}\n")), error);
    }
}

#[test]
fn eviction_settings_with_merged_defaults() {
    let (c, warnings) = parse(
        "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n\
         evictionHard: {memory.available: 300Mi}\nmergeDefaultEvictionSettings: true\n\
         evictionSoft: {memory.available: 1Gi}\nevictionSoftGracePeriod: {memory.available: 1m30s}\n\
         evictionMaxPodGracePeriod: 20\nevictionMinimumReclaim: {memory.available: 0.5Gi}\n\
         evictionPressureTransitionPeriod: 30s\n",
    )
    .expect("parses");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(c.eviction_hard.len(), 4, "the other defaults merged in");
    assert_eq!(c.eviction_hard["memory.available"], "300Mi");
    assert_eq!(c.eviction_hard["nodefs.available"], "10%");
    assert_eq!(c.eviction.soft["memory.available"], "1Gi");
    assert_eq!(
        c.eviction.soft_grace_period["memory.available"],
        Duration::from_secs(90)
    );
    assert_eq!(c.eviction.max_pod_grace_period, 20);
    assert_eq!(c.eviction.minimum_reclaim["memory.available"], "0.5Gi");
    assert_eq!(
        c.eviction.pressure_transition_period,
        Duration::from_secs(30)
    );
    let d = KubeletConfig::default();
    assert_eq!(
        d.eviction.pressure_transition_period,
        Duration::from_secs(300)
    );
    assert!(d.eviction.soft.is_empty());
}

#[test]
fn registration_settings_and_the_runtime_timeout() {
    let (cfg, warnings) = ok("registerWithTaints:\n\
         - {key: dedicated, value: edge, effect: NoSchedule}\n\
         - {key: gpu, effect: NoExecute}\n\
         providerID: edge://site-7/a\nruntimeRequestTimeout: 30s\n\
         containerRuntimeEndpoint: nodelet\n");
    assert!(warnings.is_empty(), "{warnings:?}");
    let t = &cfg.registration.taints;
    assert_eq!(t.len(), 2);
    assert_eq!(
        (t[0].key.as_str(), t[0].value.as_str()),
        ("dedicated", "edge")
    );
    assert_eq!(
        (t[1].value.as_str(), t[1].effect.as_str()),
        ("", "NoExecute")
    );
    assert_eq!(cfg.registration.provider_id, "edge://site-7/a");
    assert_eq!(cfg.runtime_request_timeout, Duration::from_secs(30));
    // The built-in runtime's own name stands for it.
    assert_eq!(cfg.container_runtime_endpoint, "");
    assert_eq!(
        KubeletConfig::default().runtime_request_timeout,
        Duration::from_secs(120)
    );

    let e = err(&format!(
        "{HEAD}registerWithTaints: [{{key: a, effect: Never}}]\n"
    ));
    assert!(
        e.contains("registerWithTaints[0]") && e.contains("Never"),
        "{e}"
    );
    let e = err(&format!(
        "{HEAD}registerWithTaints: [{{key: 'a b', effect: NoSchedule}}]\n"
    ));
    assert!(e.contains("key \"a b\""), "{e}");
    let e = err(&format!("{HEAD}registerWithTaints: a=b:NoSchedule\n"));
    assert!(e.contains("a list of taints"), "{e}");
}

#[test]
fn node_labels_a_kubelet_may_set() {
    let l = parse_node_labels(
        "a=b, example.com/x=y,node.kubernetes.io/pool=edge,\
         topology.kubernetes.io/zone=z1,k=",
    )
    .unwrap();
    assert_eq!(l.len(), 5);
    assert_eq!(l["k"], "");
    for (bad, why) in [
        ("node-role.kubernetes.io/worker=", "unknown 'kubernetes.io'"),
        ("x.k8s.io/a=b", "unknown 'kubernetes.io' or 'k8s.io'"),
        ("a", "must be key=value"),
        ("-a=b", "key \"-a\""),
        ("a=b c", "value \"b c\""),
    ] {
        let e = parse_node_labels(bad).unwrap_err().to_string();
        assert!(e.contains(why), "{bad}: {e}");
    }
    assert_eq!(
        format_taint(&parse_taint("k=v:NoSchedule").unwrap()),
        "k=v:NoSchedule"
    );
    assert_eq!(
        format_taint(&parse_taint("k:NoExecute").unwrap()),
        "k:NoExecute"
    );
}
