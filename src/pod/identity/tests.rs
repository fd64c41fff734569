use super::*;

fn pod(yaml: &str) -> Pod {
    serde_norway::from_str(yaml).unwrap()
}

fn alias(ip: &str, names: &[&str]) -> HostAlias {
    HostAlias {
        ip: ip.into(),
        hostnames: Some(names.iter().map(|s| s.to_string()).collect()),
    }
}

#[test]
fn the_managed_hosts_file_is_upstreams() {
    let text = managed_hosts(
        &["10.88.0.5".into(), "fd00::5".into()],
        "web-0",
        Some("web.default.svc.cluster.local"),
        &[alias("10.1.2.3", &["foo.local", "bar.local"])],
    );
    assert_eq!(
        text,
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n10.88.0.5\tweb-0.web.default.svc.cluster.local\tweb-0\nfd00::5\tweb-0.web.default.svc.cluster.local\tweb-0\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"
    );
    let plain = managed_hosts(&["10.88.0.5".into()], "p", None, &[]);
    assert!(
        plain.ends_with("fe00::2\tip6-allrouters\n10.88.0.5\tp\n"),
        "{plain}"
    );
    let host = node_hosts("127.0.0.1 localhost\n", &[alias("1.2.3.4", &["x"])]);
    assert_eq!(
        host,
        "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n\n# Entries added by HostAliases.\n1.2.3.4\tx\n"
    );
}

#[test]
fn domain_and_the_kernels_hostname() {
    let p = pod(
        "metadata: {name: web-0, namespace: shop}\nspec:\n  subdomain: web\n  setHostnameAsFQDN: true\n  containers: []\n",
    );
    let who = PodRef::of(&p);
    let d = domain(&p, &who, "cluster.local.").unwrap();
    assert_eq!(d, "web.shop.svc.cluster.local");
    assert_eq!(
        kernel_hostname(&p, "web-0", Some(&d)).unwrap(),
        "web-0.web.shop.svc.cluster.local"
    );
    let long = "a".repeat(40);
    let e = kernel_hostname(&p, &long, Some(&d)).unwrap_err();
    assert_eq!(
        e.message(),
        format!(
            "failed to construct FQDN from pod hostname and cluster domain, FQDN {long}.{d} is \
             too long (64 characters is the max, 67 characters requested)"
        )
    );
    // Without setHostnameAsFQDN the hostname stays short; without a subdomain, no domain.
    let q = pod("metadata: {name: q}\nspec: {containers: []}\n");
    assert_eq!(kernel_hostname(&q, "q", Some(&d)).unwrap(), "q");
    assert_eq!(domain(&q, &PodRef::of(&q), "cluster.local"), None);
}

#[test]
fn resolv_conf_limits_with_upstreams_warnings() {
    let mut cfg = cri::DnsConfig {
        servers: ["1.1.1.1", "2.2.2.2", "3.3.3.3", "4.4.4.4"]
            .map(String::from)
            .to_vec(),
        searches: (0..40).map(|i| format!("s{i}.example")).collect(),
        options: vec![],
    };
    let w = fit_dns_limits(&mut cfg);
    assert_eq!(cfg.servers.len(), 3);
    assert_eq!(cfg.searches.len(), 32);
    assert_eq!(
        w[0],
        "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: 1.1.1.1 2.2.2.2 3.3.3.3"
    );
    assert!(w[1].starts_with("Search Line limits were exceeded, some search paths have been omitted, the applied search line is: s0.example s1.example"), "{}", w[1]);
    // A path longer than 253 characters goes; the line is cut to 2048 characters.
    let mut cfg = cri::DnsConfig {
        searches: vec!["x".repeat(254), "ok".into()],
        ..Default::default()
    };
    assert_eq!(fit_dns_limits(&mut cfg).len(), 1);
    assert_eq!(cfg.searches, vec!["ok"]);
    let mut cfg = cri::DnsConfig {
        searches: (0..10).map(|i| format!("{i}{}", "y".repeat(249))).collect(),
        ..Default::default()
    };
    fit_dns_limits(&mut cfg);
    assert!(cfg.searches.join(" ").len() <= 2048);
    assert_eq!(cfg.searches.len(), 8);
    let mut fine = cri::DnsConfig {
        servers: vec!["10.96.0.10".into()],
        searches: vec!["default.svc.cluster.local".into()],
        options: vec![],
    };
    assert!(fit_dns_limits(&mut fine).is_empty());
}

#[test]
fn missing_cluster_dns_only_for_cluster_first_pods() {
    let p = pod("metadata: {name: p, namespace: ns, uid: u1}\nspec: {containers: []}\n");
    let who = PodRef::of(&p);
    assert_eq!(
        missing_cluster_dns(&p, &who, &[]).unwrap(),
        "pod: \"p_ns(u1)\". kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy."
    );
    assert!(missing_cluster_dns(&p, &who, &["10.96.0.10".into()]).is_none());
    let host = pod("metadata: {name: h}\nspec: {hostNetwork: true, containers: []}\n");
    assert!(missing_cluster_dns(&host, &PodRef::of(&host), &[]).is_none());
    let default = pod("metadata: {name: d}\nspec: {dnsPolicy: Default, containers: []}\n");
    assert!(missing_cluster_dns(&default, &PodRef::of(&default), &[]).is_none());
}

#[test]
fn the_hosts_mount_is_written_for_a_pod_with_an_address() {
    let dir = tempfile::tempdir().unwrap();
    let p = pod(
        "metadata: {name: p, namespace: ns, uid: u1}\nspec:\n  hostAliases: [{ip: 10.9.9.9, hostnames: [db]}]\n  containers: []\n",
    );
    let who = PodRef::of(&p);
    std::fs::create_dir_all(dir.path().join("u1")).unwrap();
    assert!(
        hosts_mount(dir.path(), &p, &who, "p", "cluster.local", &[])
            .unwrap()
            .is_none()
    );
    let m = hosts_mount(
        dir.path(),
        &p,
        &who,
        "p",
        "cluster.local",
        &["10.88.0.7".into()],
    )
    .unwrap()
    .unwrap();
    assert_eq!(m.container_path, "/etc/hosts");
    let text = std::fs::read_to_string(&m.host_path).unwrap();
    assert!(text.contains("10.88.0.7\tp\n"), "{text}");
    assert!(text.ends_with("10.9.9.9\tdb\n"), "{text}");
    let mode = std::fs::metadata(&m.host_path)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);
}
