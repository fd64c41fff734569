//! Unit tests for the configuration loader and the Go duration parser.

use std::net::IpAddr;
use std::time::Duration;

use super::*;

mod subsystems;

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn ok(body: &str) -> (KubeletConfig, Vec<String>) {
    match parse(&format!("{HEAD}{body}")) {
        Ok(r) => r,
        Err(e) => panic!("{body:?}: unexpected error {e}"),
    }
}

fn err(text: &str) -> String {
    match parse(text) {
        Ok(_) => panic!("{text:?}: expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn durations() {
    let ms = Duration::from_millis;
    let cases: &[(&str, Option<Duration>)] = &[
        ("0", Some(Duration::ZERO)),
        ("-0", Some(Duration::ZERO)),
        ("10s", Some(ms(10_000))),
        ("1m30s", Some(ms(90_000))),
        ("500ms", Some(ms(500))),
        ("2h", Some(ms(7_200_000))),
        ("1.5s", Some(ms(1500))),
        (".5m", Some(ms(30_000))),
        ("1h2m3s4ms", Some(ms(3_723_004))),
        ("+5s", Some(ms(5000))),
        ("3us", Some(Duration::from_nanos(3000))),
        ("3µs", Some(Duration::from_nanos(3000))),
        ("7ns", Some(Duration::from_nanos(7))),
        ("1.0000000001s", Some(ms(1000))),
        ("", None),
        ("abc", None),
        ("10", None),
        ("s", None),
        ("1.2.3s", None),
        ("5d", None),
        ("-5s", None),
        ("1m-5s", None),
        ("99999999999999999999h", None),
        // Found by fuzzing (tests/fuzz, config): the fraction overflowed the nanoseconds (a
        // panic with overflow checks, a wrapped tiny duration without).
        ("340282366920938463463374607431.999999999s", None),
        ("94522879700260684295381835.9999h", None),
    ];
    for (input, want) in cases {
        assert_eq!(parse_duration(input).ok(), *want, "{input:?}");
    }
    assert_eq!(
        parse_duration("-5s").unwrap_err().to_string(),
        "invalid duration \"-5s\": must not be negative"
    );
}

#[test]
fn defaults_match_upstream() {
    let (c, w) = ok("");
    assert!(w.is_empty());
    assert_eq!(c, KubeletConfig::default());
    assert_eq!(c.static_pod_path, PathBuf::new());
    assert_eq!(c.sync_frequency, Duration::from_secs(60));
    assert_eq!(c.file_check_frequency, Duration::from_secs(20));
    assert_eq!(c.http_check_frequency, Duration::from_secs(20));
    assert_eq!(c.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(300));
    assert_eq!(c.node_lease_duration_seconds, 40);
    assert_eq!(c.max_pods, 110);
    assert_eq!(c.pod_pids_limit, -1);
    assert_eq!(c.pod_logs_dir, PathBuf::from("/var/log/pods"));
    assert_eq!(c.cgroups.root, "/");
    assert!(c.cgroups.per_qos && c.register_node);
    assert_eq!(c.cgroups.enforce_node_allocatable, ["pods"]);
    assert_eq!(c.cgroups.driver, CgroupDriver::Cgroupfs);
    assert!(c.cgroups.cpu_cfs_quota);
    assert_eq!(c.eviction_hard.len(), 4);
    assert_eq!(c.eviction_hard["memory.available"], "100Mi");
    assert_eq!(
        c.testing.crash_loop_back_off_initial,
        Duration::from_secs(10)
    );
    assert_eq!(c.testing.crash_loop_back_off_max, Duration::from_secs(300));
    assert!(!c.node_name.is_empty());
    assert_eq!(c.node_name, c.node_name.to_lowercase());
}

#[test]
fn every_field_yaml() {
    let (c, w) = ok(r#"
staticPodPath: /etc/kubernetes/manifests
staticPodURL: http://127.0.0.1:8080/pods
syncFrequency: 30s
fileCheckFrequency: 5s
httpCheckFrequency: 1m
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 1m30s
nodeLeaseDurationSeconds: 20
maxPods: 50
podPidsLimit: 1024
podLogsDir: /tmp/pods
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
imageServiceEndpoint: unix:///run/img.sock
cgroupRoot: /nodelet
cgroupsPerQOS: false
cgroupDriver: systemd
enforceNodeAllocatable: []
cpuCFSQuota: false
clusterDNS: [10.96.0.10, "fd00::a"]
clusterDomain: cluster.local
registerNode: false
evictionHard:
  memory.available: 200Mi
  nodefs.available: "5%"
nodeletTesting:
  crashLoopBackOffInitial: 100ms
  crashLoopBackOffMax: 2s
podCIDR: 10.99.0.0/20
nodeletPodBridge: pods0
nodeletPodMasquerade: false
nodeletInsecureRegistries: ["127.0.0.1:5000", registry.local]
nodeletImagePreloadDir: /srv/images
nodeletRegistriesConfig: /etc/nodelet/registries.yaml
nodeletRegistryHostsDir: /etc/nodelet/certs.d
nodeletCDISpecDirs: [/etc/cdi, /srv/cdi]
"#);
    assert_eq!(c.image_preload_dir(), PathBuf::from("/srv/images"));
    assert_eq!(
        c.registries_config.as_deref(),
        Some(std::path::Path::new("/etc/nodelet/registries.yaml"))
    );
    assert_eq!(
        c.registry_hosts_dir.as_deref(),
        Some(std::path::Path::new("/etc/nodelet/certs.d"))
    );
    assert_eq!(
        KubeletConfig::default().image_preload_dir(),
        PathBuf::from("/var/lib/nodelet/images-preload")
    );
    assert_eq!(
        c.cdi_spec_dirs,
        [PathBuf::from("/etc/cdi"), PathBuf::from("/srv/cdi")]
    );
    assert_eq!(
        KubeletConfig::default().cdi_spec_dirs,
        [PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]
    );
    assert!(ok("nodeletCDISpecDirs: []").0.cdi_spec_dirs.is_empty());
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(
        c.insecure_registries,
        ["127.0.0.1:5000".to_string(), "registry.local".to_string()]
    );
    assert_eq!(c.pod_cidr, "10.99.0.0/20");
    assert_eq!(c.pod_bridge, "pods0");
    assert!(!c.pod_masquerade);
    assert_eq!(
        c.static_pod_path,
        PathBuf::from("/etc/kubernetes/manifests")
    );
    assert_eq!(c.static_pod_url, "http://127.0.0.1:8080/pods");
    assert_eq!(c.sync_frequency, Duration::from_secs(30));
    assert_eq!(c.file_check_frequency, Duration::from_secs(5));
    assert_eq!(c.http_check_frequency, Duration::from_secs(60));
    assert_eq!(c.node_status_update_frequency, Duration::from_secs(2));
    assert_eq!(c.node_status_report_frequency, Duration::from_secs(90));
    assert_eq!(c.node_lease_duration_seconds, 20);
    assert_eq!(c.max_pods, 50);
    assert_eq!(c.pod_pids_limit, 1024);
    assert_eq!(c.pod_logs_dir, PathBuf::from("/tmp/pods"));
    assert_eq!(
        c.container_runtime_endpoint,
        "unix:///run/containerd/containerd.sock"
    );
    assert_eq!(c.image_service_endpoint, "unix:///run/img.sock");
    assert_eq!(c.cgroups.root, "/nodelet");
    assert!(!c.cgroups.per_qos && !c.register_node);
    assert_eq!(c.cgroups.driver, CgroupDriver::Systemd);
    assert!(c.cgroups.enforce_node_allocatable.is_empty() && !c.cgroups.cpu_cfs_quota);
    let dns: Vec<IpAddr> = vec!["10.96.0.10".parse().unwrap(), "fd00::a".parse().unwrap()];
    assert_eq!(c.cluster_dns, dns);
    assert_eq!(c.cluster_domain, "cluster.local");
    assert_eq!(
        c.eviction_hard.len(),
        2,
        "a set evictionHard replaces the defaults"
    );
    assert_eq!(c.eviction_hard["nodefs.available"], "5%");
    assert_eq!(
        c.testing.crash_loop_back_off_initial,
        Duration::from_millis(100)
    );
    assert_eq!(c.testing.crash_loop_back_off_max, Duration::from_secs(2));
}

#[test]
fn json_and_unknown_fields_warn() {
    let text = r#"{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "maxPods": 7, "fooBar": 1, "authentication": {"anonymous": {"enabled": false}, "oidc": 1},
        "nodeletTesting": {"other": 1}}"#;
    let (c, w) = parse(text).unwrap();
    assert_eq!(c.max_pods, 7);
    assert_eq!(
        w,
        vec![
            "unknown field \"authentication.oidc\" ignored".to_string(),
            "unknown field \"fooBar\" ignored".to_string(),
            "unknown field \"nodeletTesting.other\" ignored".to_string(),
        ]
    );
}

#[test]
fn invalid_values_name_the_field() {
    let cases: &[(&str, &str)] = &[
        (
            "syncFrequency: abc",
            "syncFrequency: invalid duration \"abc\"",
        ),
        (
            "syncFrequency: 0s",
            "syncFrequency: must be greater than zero",
        ),
        (
            "fileCheckFrequency: 10",
            "fileCheckFrequency: must be a duration string",
        ),
        (
            "httpCheckFrequency: -1s",
            "httpCheckFrequency: invalid duration \"-1s\": must not be negative",
        ),
        (
            "nodeStatusUpdateFrequency: 1x",
            "nodeStatusUpdateFrequency: invalid duration",
        ),
        (
            "nodeStatusReportFrequency: ''",
            "nodeStatusReportFrequency: invalid duration",
        ),
        ("maxPods: 0", "maxPods: must be >= 1"),
        ("maxPods: many", "maxPods: must be an integer"),
        ("maxPods: 99999999999", "maxPods: 99999999999 is too large"),
        (
            "nodeLeaseDurationSeconds: 0",
            "nodeLeaseDurationSeconds: must be >= 1",
        ),
        (
            "podPidsLimit: 0",
            "podPidsLimit: must be -1 (unlimited) or >= 1",
        ),
        (
            "podLogsDir: logs",
            "podLogsDir: \"logs\" is not an absolute path",
        ),
        (
            "nodeletCDISpecDirs: [/etc/cdi, cdi]",
            "nodeletCDISpecDirs: \"cdi\" is not an absolute path",
        ),
        (
            "cgroupsPerQOS: yes please",
            "cgroupsPerQOS: must be true or false",
        ),
        (
            "clusterDNS: [10.0.0.1, nope]",
            "clusterDNS[1]: invalid IP address \"nope\"",
        ),
        ("clusterDNS: 10.0.0.1", "clusterDNS: must be a list"),
        ("staticPodPath: [a]", "staticPodPath: must be a string"),
        (
            "evictionHard: {memory.free: 1Gi}",
            "evictionHard.memory.free: unknown eviction signal",
        ),
        (
            "evictionHard: {nodefs.available: 120%}",
            "evictionHard.nodefs.available: invalid percentage",
        ),
        (
            "evictionHard: {memory.available: lots}",
            "evictionHard.memory.available: invalid quantity",
        ),
        (
            "evictionSoft: {memory.available: 1Gi}",
            "evictionSoft.memory.available: a soft eviction threshold needs a grace period",
        ),
        (
            "evictionSoftGracePeriod: {memory.free: 1m}",
            "evictionSoftGracePeriod.memory.free: unknown eviction signal",
        ),
        (
            "evictionMinimumReclaim: {nodefs.available: lots}",
            "evictionMinimumReclaim.nodefs.available: invalid quantity",
        ),
        (
            "evictionMaxPodGracePeriod: -1",
            "evictionMaxPodGracePeriod: must be >= 0",
        ),
        (
            "nodeletTesting: {crashLoopBackOffInitial: 1y}",
            "nodeletTesting.crashLoopBackOffInitial: invalid duration",
        ),
        (
            "nodeletTesting: {crashLoopBackOffInitial: 1m, crashLoopBackOffMax: 1s}",
            "nodeletTesting.crashLoopBackOffMax: must be >= crashLoopBackOffInitial",
        ),
    ];
    for (body, want) in cases {
        let got = err(&format!("{HEAD}{body}\n"));
        assert!(
            got.starts_with(want),
            "{body:?}: got {got:?}, want {want:?}"
        );
    }
}

#[test]
fn api_version_and_kind_are_checked() {
    let cases: &[(&str, &str)] = &[
        ("kind: KubeletConfiguration\n", "apiVersion: missing"),
        (
            "apiVersion: v1\nkind: KubeletConfiguration\n",
            "apiVersion: \"v1\" is not",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\n",
            "kind: missing",
        ),
        (
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: Pod\n",
            "kind: \"Pod\" is not",
        ),
        ("- a\n- b\n", "the configuration must be a mapping"),
        ("a: [\n", "parsing"),
    ];
    for (text, want) in cases {
        let got = err(text);
        assert!(
            got.starts_with(want),
            "{text:?}: got {got:?}, want {want:?}"
        );
    }
}

#[test]
fn load_reads_files_and_names_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubelet.yaml");
    std::fs::write(&path, format!("{HEAD}maxPods: 3\nbogus: true\n")).unwrap();
    let (c, w) = load(&path).unwrap();
    assert_eq!(c.max_pods, 3);
    assert_eq!(w.len(), 1);

    std::fs::write(&path, "{ not yaml").unwrap();
    let e = load(&path).unwrap_err().to_string();
    assert!(e.starts_with(&format!("parsing {}", path.display())), "{e}");

    let e = load(&dir.path().join("missing.yaml"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("reading "), "{e}");
}

#[test]
fn a_bad_pod_cidr_says_why() {
    let e = err(&format!("{HEAD}podCIDR: 10.99.0.1/16\n"));
    assert!(e.contains("podCIDR"), "{e}");
    assert!(e.contains("host bits"), "{e}");
    let e = err(&format!("{HEAD}podCIDR: 10.99.0.0/16,10.98.0.0/16\n"));
    assert!(e.contains("two of one family"), "{e}");
    // Dual stack: one of each family.
    let (c, _) = ok("podCIDR: 10.99.0.0/16,fd00:99::/64\n");
    assert_eq!(c.pod_cidr, "10.99.0.0/16,fd00:99::/64");
}

#[test]
fn image_pulls() {
    let (c, _) = ok("");
    assert!(c.serialize_image_pulls);
    assert_eq!(c.max_parallel_image_pulls, None);

    let (c, _) = ok("serializeImagePulls: false\n");
    assert!(!c.serialize_image_pulls);
    assert_eq!(c.max_parallel_image_pulls, None, "no limit");

    let (c, _) = ok("serializeImagePulls: false\nmaxParallelImagePulls: 5\n");
    assert!(!c.serialize_image_pulls);
    assert_eq!(c.max_parallel_image_pulls, Some(5));

    // Upstream's default: unset, serializeImagePulls follows maxParallelImagePulls.
    let (c, _) = ok("maxParallelImagePulls: 3\n");
    assert!(!c.serialize_image_pulls);
    assert_eq!(c.max_parallel_image_pulls, Some(3));
    let (c, _) = ok("maxParallelImagePulls: 1\n");
    assert!(c.serialize_image_pulls);
    assert_eq!(c.max_parallel_image_pulls, Some(1));
    let (c, _) = ok("serializeImagePulls: true\nmaxParallelImagePulls: 1\n");
    assert!(c.serialize_image_pulls);

    let cases: &[(&str, &str)] = &[
        (
            "serializeImagePulls: true\nmaxParallelImagePulls: 2",
            "maxParallelImagePulls: cannot be larger than 1 unless serializeImagePulls is false",
        ),
        (
            "maxParallelImagePulls: 0",
            "maxParallelImagePulls: 0 must be a positive number",
        ),
        (
            "serializeImagePulls: false\nmaxParallelImagePulls: -3",
            "maxParallelImagePulls: -3 must be a positive number",
        ),
        (
            "serializeImagePulls: false\nmaxParallelImagePulls: 3000000000",
            "maxParallelImagePulls: 3000000000 is too large",
        ),
        (
            "maxParallelImagePulls: \"2\"",
            "maxParallelImagePulls: must be an integer, not \"2\"",
        ),
        (
            "serializeImagePulls: 1",
            "serializeImagePulls: must be true or false, not 1",
        ),
    ];
    for (body, want) in cases {
        let got = err(&format!("{HEAD}{body}\n"));
        assert_eq!(&got, want, "{body:?}");
    }
}

#[test]
fn wrong_types_name_the_field() {
    let cases: &[(&str, &str)] = &[
        ("maxPods: [1]", "maxPods: must be an integer, not [1]"),
        ("maxPods: 1.5", "maxPods: must be an integer, not 1.5"),
        (
            "registerNode: \"true\"",
            "registerNode: must be true or false, not \"true\"",
        ),
        (
            "cgroupRoot: {a: 1}",
            "cgroupRoot: must be a string, not {\"a\":1}",
        ),
        (
            "syncFrequency: 10",
            "syncFrequency: must be a duration string like \"10s\", not 10",
        ),
        (
            "clusterDNS: {a: 1}",
            "clusterDNS: must be a list of IP addresses, not a mapping",
        ),
        (
            "nodeletCDISpecDirs: /etc/cdi",
            "nodeletCDISpecDirs: must be a list of strings, not \"/etc/cdi\"",
        ),
        (
            "clusterDNS: [10.0.0.1, [1]]",
            "clusterDNS[1]: must be a string, not [1]",
        ),
        (
            "evictionHard: [memory.available]",
            "evictionHard: must be a mapping of signal to threshold, not a list",
        ),
        (
            "evictionHard: {memory.available: 5}",
            "evictionHard.memory.available: must be a string, not 5",
        ),
        (
            "nodeletTesting: 5s",
            "nodeletTesting: must be a mapping, not \"5s\"",
        ),
        (
            "nodeletTesting: {crashLoopBackOffMax: true}",
            "nodeletTesting.crashLoopBackOffMax: must be a duration string like \"10s\", not true",
        ),
        (
            "nodeletTesting: {crashLoopBackOffMax: 0s}",
            "nodeletTesting.crashLoopBackOffMax: must be greater than zero",
        ),
    ];
    for (body, want) in cases {
        let got = err(&format!("{HEAD}{body}\n"));
        assert_eq!(&got, want, "{body:?}");
    }
}

#[test]
fn null_leaves_a_field_unset() {
    let (c, w) = ok("maxPods: null\ncgroupRoot: ~\nclusterDNS: null\nnodeletTesting: null\n");
    assert!(w.is_empty(), "{w:?}");
    assert_eq!(c, KubeletConfig::default());
}

#[test]
fn unknown_nested_fields_are_warned_by_path() {
    let (c, w) = ok(r#"
zzz: 1
nodeletTesting:
  crashLoopBackOffMax: 20s
  fastForward: true
  aNested: {deeper: 1}
authentication: {anonymous: {enabled: false, extra: 1}}
"#);
    assert_eq!(c.testing.crash_loop_back_off_max, Duration::from_secs(20));
    assert_eq!(
        w,
        vec![
            "unknown field \"authentication.anonymous.extra\" ignored".to_string(),
            "unknown field \"nodeletTesting.aNested\" ignored".to_string(),
            "unknown field \"nodeletTesting.fastForward\" ignored".to_string(),
            "unknown field \"zzz\" ignored".to_string(),
        ]
    );
}
