//! The kubelet's command line: pflag's forms, the refusals, and what each flag sets.

use super::*;
use serde_json::json;

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

fn flags_layer(f: &KubeletFlags) -> Vec<(String, Value)> {
    f.layers
        .flags
        .iter()
        .map(|(p, v)| (p.join("."), v.clone()))
        .collect()
}

#[test]
fn pflag_forms() {
    let f = parse(&args(
        "--config=/c.yaml --config-dir /d --kubeconfig /k --v=4 --register-node=false \
         --anonymous-auth --max-pods 50 --node_labels=a=b",
    ))
    .unwrap();
    assert_eq!(f.layers.file, Some(PathBuf::from("/c.yaml")));
    assert_eq!(f.layers.drop_in_dir, Some(PathBuf::from("/d")));
    assert_eq!(f.kubeconfig, Some(PathBuf::from("/k")));
    assert_eq!(f.verbosity, Some(4));
    assert_eq!(f.node_labels, BTreeMap::from([("a".into(), "b".into())]));
    assert_eq!(
        flags_layer(&f),
        vec![
            ("registerNode".to_string(), json!(false)),
            ("authentication.anonymous.enabled".to_string(), json!(true)),
            ("maxPods".to_string(), json!(50)),
        ]
    );
    // Each configuration flag is deprecated upstream: a warning each.
    assert_eq!(f.warnings.len(), 3, "{:?}", f.warnings);
    assert!(
        f.warnings[1].contains("--anonymous-auth"),
        "{:?}",
        f.warnings
    );

    let f = parse(&args(
        "--rotate-certificates --rotate-server-certificates=true",
    ))
    .unwrap();
    assert_eq!(
        flags_layer(&f),
        vec![
            ("rotateCertificates".to_string(), json!(true)),
            ("serverTLSBootstrap".to_string(), json!(true)),
        ]
    );

    assert_eq!(parse(&args("-v 3")).unwrap().verbosity, Some(3));
    assert_eq!(parse(&args("-v=5")).unwrap().verbosity, Some(5));
    assert!(parse(&args("-h")).unwrap().help);
    assert!(parse(&args("--version")).unwrap().version);
    assert!(!parse(&args("--version=false")).unwrap().version);
}

#[test]
fn map_list_threshold_and_taint_flags() {
    let f = parse(&args(
        "--eviction-hard=memory.available<100Mi,nodefs.available<10% \
         --kube-reserved=cpu=100m,memory=1Gi --cluster-dns=10.0.0.10,10.0.0.11 \
         --register-with-taints=a=b:NoSchedule,c:NoExecute --eviction-soft-grace-period=memory.available=1m",
    ))
    .unwrap();
    assert_eq!(
        flags_layer(&f),
        vec![
            (
                "evictionHard".to_string(),
                json!({"memory.available": "100Mi", "nodefs.available": "10%"})
            ),
            (
                "kubeReserved".to_string(),
                json!({"cpu": "100m", "memory": "1Gi"})
            ),
            ("clusterDNS".to_string(), json!(["10.0.0.10", "10.0.0.11"])),
            (
                "registerWithTaints".to_string(),
                json!([
                    {"key": "a", "value": "b", "effect": "NoSchedule"},
                    {"key": "c", "value": "", "effect": "NoExecute"},
                ])
            ),
            (
                "evictionSoftGracePeriod".to_string(),
                json!({"memory.available": "1m"})
            ),
        ]
    );
}

#[test]
fn refusals_name_the_flag() {
    let cases: &[(&str, &str)] = &[
        ("--no-such-flag=1", "unknown flag: --no-such-flag"),
        ("-config=/x", "unknown shorthand flag: \"-config=/x\""),
        ("--network-plugin=cni", "flag --network-plugin was removed"),
        ("--container-runtime=remote", "removed in v1.27"),
        (
            "--feature-gates=A=true",
            "flag --feature-gates is not supported by nodelet",
        ),
        ("--max-pods", "flag needs an argument: --max-pods"),
        (
            "--max-pods=many",
            "invalid argument \"many\" for --max-pods",
        ),
        (
            "--sync-frequency=soon",
            "invalid argument \"soon\" for --sync-frequency",
        ),
        ("--register-node=maybe", "must be true or false"),
        ("--eviction-hard=memory.available", "is not key<value"),
        ("--register-with-taints=a=b", "invalid argument"),
        (
            "--register-with-taints=a=b:Sometimes",
            "effect \"Sometimes\"",
        ),
        (
            "--node-labels=node-role.kubernetes.io/master=",
            "unknown 'kubernetes.io'",
        ),
        ("--node-ip=10.0.0.1,10.0.0.2", "one IPv4 and one IPv6"),
        ("--node-ip=0.0.0.0", "unspecified"),
        (
            "--cloud-provider=aws",
            "in-tree cloud providers were removed",
        ),
        ("positional", "does not take any arguments"),
        ("-- extra", "does not take any arguments, got \"extra\""),
    ];
    for (arg, want) in cases {
        let e = parse(&args(arg)).unwrap_err().to_string();
        assert!(e.contains(want), "{arg}: {e}");
    }
}

#[test]
fn local_flags() {
    let f = parse(&args(
        "--node-ip=10.0.0.1,fd00::1 --hostname-override=Node-A --cert-dir=/pki \
         --cloud-provider=external --pod-infra-container-image=registry.k8s.io/pause:3.10 \
         --bootstrap-kubeconfig=/b --root-dir=/r --cri-listen=unix:///c.sock",
    ))
    .unwrap();
    assert_eq!(
        f.node_ips,
        vec![
            "10.0.0.1".parse::<IpAddr>().unwrap(),
            "fd00::1".parse().unwrap()
        ]
    );
    assert_eq!(f.hostname_override.as_deref(), Some("node-a"));
    assert_eq!(f.cert_dir, Some(PathBuf::from("/pki")));
    assert!(f.external_cloud_provider);
    assert_eq!(
        f.pod_infra_container_image.as_deref(),
        Some("registry.k8s.io/pause:3.10")
    );
    assert!(
        f.warnings[0].contains("--pod-infra-container-image"),
        "{:?}",
        f.warnings
    );
    assert_eq!(f.bootstrap_kubeconfig, Some(PathBuf::from("/b")));
    assert_eq!(f.root_dir, Some(PathBuf::from("/r")));
    assert_eq!(f.cri_listen.as_deref(), Some("unix:///c.sock"));
}

#[test]
fn which_flags_take_a_value() {
    assert!(takes_value("config"));
    assert!(takes_value("max_pods"));
    assert!(!takes_value("anonymous-auth"));
    assert!(!takes_value("nothing-like-this"));
}

#[test]
fn usage_lists_what_is_taken_and_not_what_is_refused() {
    let u = usage();
    assert!(u.contains("--config-dir string"), "{u}");
    assert!(u.contains("-v, --v int"), "{u}");
    assert!(u.contains("--eviction-hard mapStringString"), "{u}");
    assert!(!u.contains("--network-plugin"), "{u}");
    assert!(!u.contains("--feature-gates"), "{u}");
}

#[test]
fn run_nodes_node_ip_takes_one_address_or_one_of_each_family() {
    use super::parse_node_ips;
    assert_eq!(
        parse_node_ips("10.0.0.5,fd00::5").unwrap(),
        vec![
            "10.0.0.5".parse::<std::net::IpAddr>().unwrap(),
            "fd00::5".parse().unwrap()
        ]
    );
    assert_eq!(parse_node_ips("::1").unwrap().len(), 1);
    let e = parse_node_ips("10.0.0.5,10.0.0.6").unwrap_err().to_string();
    assert!(
        e.contains("--node-ip \"10.0.0.5,10.0.0.6\"") && e.contains("one IPv4 and one IPv6"),
        "{e}"
    );
    assert!(parse_node_ips("node-a").is_err());
}
