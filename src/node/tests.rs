//! Tests of [`super::build_node`], capacity and allocatable.

use super::*;
use serde_json::json;

pub(crate) fn facts() -> NodeFacts {
    NodeFacts {
        hostname: "node-a".into(),
        node_ip: "10.0.0.7".parse().unwrap(),
        secondary_node_ip: None,
        cpus: 4,
        memory_bytes: 16_318_428 * 1024,
        swap_bytes: Some(2 * 1024 * 1024 * 1024),
        ephemeral_storage_bytes: 100 * 1024 * 1024 * 1024,
        max_pods: 110,
        hugepages: BTreeMap::new(),
        machine_id: "mid".into(),
        system_uuid: "uuid".into(),
        boot_id: "boot".into(),
        kernel_version: "6.1.0".into(),
        os_image: "Debian GNU/Linux 13 (trixie)".into(),
        operating_system: "linux".into(),
        architecture: "amd64".into(),
        container_runtime_version: "nodelet://0.1.0".into(),
        kubelet_version: "v1.37.0+nodelet.0.1.0".into(),
        kubelet_port: 10250,
    }
}

#[test]
fn node_from_fixed_facts() {
    let node = build_node(&facts(), &KubeletConfig::default());
    let got = serde_json::to_value(&node).unwrap();
    let want = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "node-a",
            "labels": {
                "kubernetes.io/hostname": "node-a",
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
            },
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "status": {
            "capacity": {
                "cpu": "4",
                "memory": "16318428Ki",
                "ephemeral-storage": "100Gi",
                "pods": "110",
            },
            "allocatable": {
                "cpu": "4",
                // 100Mi reserved for memory.available.
                "memory": "16216028Ki",
                // 10% (nodefs.available) of 100Gi.
                "ephemeral-storage": "90Gi",
                "pods": "110",
            },
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.7"},
                {"type": "Hostname", "address": "node-a"},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "boot",
                "containerRuntimeVersion": "nodelet://0.1.0",
                "kernelVersion": "6.1.0",
                "kubeProxyVersion": "",
                "kubeletVersion": "v1.37.0+nodelet.0.1.0",
                "machineID": "mid",
                "operatingSystem": "linux",
                "osImage": "Debian GNU/Linux 13 (trixie)",
                "systemUUID": "uuid",
                "swap": {"capacity": 2147483648_i64},
            },
        },
    });
    assert_eq!(got, want, "{}", serde_json::to_string_pretty(&got).unwrap());
}

#[test]
fn quantities_in_canonical_form() {
    let cases = [
        (Amount::Millicores(4000), "4"),
        (Amount::Millicores(1500), "1500m"),
        (Amount::Bytes(0), "0"),
        (Amount::Bytes(1000), "1000"),
        (Amount::Bytes(1024), "1Ki"),
        (Amount::Bytes(1536 * 1024 * 1024), "1536Mi"),
        (Amount::Bytes(2 * 1024 * 1024 * 1024), "2Gi"),
        (Amount::Bytes(16_710_070_273), "16710070273"),
        (Amount::Count(110), "110"),
    ];
    for (amount, want) in cases {
        assert_eq!(amount.to_quantity().0, want, "{amount:?}");
    }
}

#[test]
fn allocatable_minus_hard_eviction() {
    let gi = 1024 * 1024 * 1024;
    let cap = BTreeMap::from([
        ("cpu".to_string(), Amount::Millicores(2000)),
        ("memory".to_string(), Amount::Bytes(4 * gi)),
        ("ephemeral-storage".to_string(), Amount::Bytes(10 * gi)),
        ("pods".to_string(), Amount::Count(110)),
    ]);
    let ev = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    // (thresholds, memory, ephemeral-storage)
    let cases = [
        (ev(&[]), 4 * gi, 10 * gi),
        (
            ev(&[("memory.available", "100Mi")]),
            4 * gi - 100 * 1024 * 1024,
            10 * gi,
        ),
        (ev(&[("memory.available", "25%")]), 3 * gi, 10 * gi),
        (ev(&[("nodefs.available", "1Gi")]), 4 * gi, 9 * gi),
        (
            ev(&[("nodefs.available", "50%"), ("memory.available", "1G")]),
            4 * gi - 1_000_000_000,
            5 * gi,
        ),
        // More than there is: zero, never negative.
        (ev(&[("memory.available", "8Gi")]), 0, 10 * gi),
        // Other signals reserve nothing.
        (
            ev(&[("imagefs.available", "15%"), ("nodefs.inodesFree", "5%")]),
            4 * gi,
            10 * gi,
        ),
        // Unparsable: nothing reserved.
        (ev(&[("memory.available", "lots")]), 4 * gi, 10 * gi),
    ];
    for (thresholds, memory, storage) in cases {
        let a = allocatable(&cap, &thresholds, &Reserved::default());
        assert_eq!(a["memory"], Amount::Bytes(memory), "{thresholds:?}");
        assert_eq!(
            a["ephemeral-storage"],
            Amount::Bytes(storage),
            "{thresholds:?}"
        );
        assert_eq!(a["cpu"], Amount::Millicores(2000));
        assert_eq!(a["pods"], Amount::Count(110));
    }
}

#[test]
fn max_pods_and_eviction_come_from_the_config() {
    let mut f = facts();
    f.max_pods = 7;
    let cfg = KubeletConfig {
        eviction_hard: BTreeMap::new(),
        ..Default::default()
    };
    let status = build_node(&f, &cfg).status.unwrap();
    let alloc = status.allocatable.unwrap();
    assert_eq!(alloc["pods"].0, "7");
    assert_eq!(alloc["memory"].0, "16318428Ki");
    assert_eq!(alloc["ephemeral-storage"].0, "100Gi");
}

#[test]
fn hugepages_in_capacity_and_out_of_allocatable_memory() {
    let mut f = facts();
    f.hugepages = BTreeMap::from([(2 * 1024 * 1024, 512), (1024 * 1024 * 1024, 0)]);
    let status = build_node(&f, &KubeletConfig::default()).status.unwrap();
    let cap = status.capacity.unwrap();
    assert_eq!(cap["hugepages-2Mi"].0, "1Gi");
    assert_eq!(cap["hugepages-1Gi"].0, "0");
    assert_eq!(cap["memory"].0, "16318428Ki");
    let alloc = status.allocatable.unwrap();
    assert_eq!(alloc["hugepages-2Mi"].0, "1Gi");
    // 16318428Ki - 100Mi (eviction) - 1Gi (huge pages).
    assert_eq!(alloc["memory"].0, "15167452Ki");
}

#[test]
fn heartbeat_timeouts() {
    let s = std::time::Duration::from_secs;
    let cfg = |update: std::time::Duration, lease: u32| KubeletConfig {
        node_status_update_frequency: update,
        node_lease_duration_seconds: lease,
        ..Default::default()
    };
    // (update frequency, lease duration, timeout)
    let cases = [
        (s(10), 40, s(10)),
        (s(60), 40, s(40)),
        (std::time::Duration::from_millis(200), 40, s(1)),
        (s(10), 1, s(1)),
    ];
    for (update, lease, want) in cases {
        assert_eq!(
            heartbeat_timeout(&cfg(update, lease)),
            want,
            "{update:?} {lease}"
        );
    }
}

#[tokio::test]
async fn an_unanswered_request_is_an_error() {
    let r: Result<(), kube::Error> =
        within(std::time::Duration::from_millis(10), std::future::pending()).await;
    assert!(matches!(r, Err(kube::Error::Service(_))), "{r:?}");
    let r = within(std::time::Duration::from_secs(5), async { Ok(7) }).await;
    assert_eq!(r.unwrap(), 7);
}

#[test]
fn allocatable_minus_kube_and_system_reserved_and_hard_eviction() {
    let f = facts();
    let cfg = KubeletConfig {
        eviction_hard: BTreeMap::from([("memory.available".into(), "100Mi".into())]),
        reserved: Reserved {
            kube: BTreeMap::from([("cpu".into(), 500), ("memory".into(), 1 << 30)]),
            system: BTreeMap::from([("cpu".into(), 250), ("ephemeral-storage".into(), 1 << 30)]),
            system_cpus: String::new(),
        },
        ..Default::default()
    };
    check_reservations(&f, &cfg).expect("within capacity");
    let status = build_node(&f, &cfg).status.unwrap();
    let (cap, alloc) = (status.capacity.unwrap(), status.allocatable.unwrap());
    assert_eq!(
        (cap["cpu"].0.as_str(), alloc["cpu"].0.as_str()),
        ("4", "3250m")
    );
    // 16318428Ki - 1Gi - 100Mi.
    let memory = 16_318_428 - (1 << 20) - 100 * 1024;
    assert_eq!(alloc["memory"].0, format!("{memory}Ki"));
    assert_eq!(alloc["ephemeral-storage"].0, "99Gi");
    assert_eq!(alloc["pods"], cap["pods"]);
}

#[test]
fn reservations_over_capacity_are_refused_as_upstream_words_it() {
    let f = facts();
    let cfg = KubeletConfig {
        reserved: Reserved {
            kube: BTreeMap::from([("cpu".into(), 3000), ("memory".into(), 16 << 30)]),
            system: BTreeMap::from([("cpu".into(), 2000)]),
            system_cpus: String::new(),
        },
        ..Default::default()
    };
    let err = check_reservations(&f, &cfg).expect_err("over capacity");
    assert_eq!(
        err.to_string(),
        "invalid Node Allocatable configuration. Resource \"cpu\" has a reservation of 5 but \
         capacity of 4. Expected capacity >= reservation. Resource \"memory\" has a reservation \
         of 16484Mi but capacity of 16318428Ki. Expected capacity >= reservation."
    );
}

#[test]
fn registration_labels_taints_provider_and_dual_stack() {
    let mut f = facts();
    f.secondary_node_ip = Some("fd00::7".parse().unwrap());
    let cfg = KubeletConfig {
        node_ips: vec![f.node_ip, "fd00::7".parse().unwrap()],
        registration: crate::config::Registration {
            taints: vec![crate::config::parse_taint("dedicated=edge:NoSchedule").unwrap()],
            provider_id: "edge://site/a".into(),
            labels: [
                ("pool".to_string(), "edge".to_string()),
                ("kubernetes.io/hostname".to_string(), "override".to_string()),
            ]
            .into(),
            external_cloud_provider: true,
        },
        ..Default::default()
    };
    let node = serde_json::to_value(build_node(&f, &cfg)).unwrap();
    assert_eq!(node["metadata"]["labels"]["pool"], "edge");
    // As upstream, the flag's labels are applied over the defaults.
    assert_eq!(
        node["metadata"]["labels"]["kubernetes.io/hostname"],
        "override"
    );
    assert_eq!(
        node["metadata"]["annotations"][ANNOTATION_PROVIDED_NODE_IP],
        "10.0.0.7,fd00::7"
    );
    assert_eq!(
        node["spec"],
        json!({
            "providerID": "edge://site/a",
            "taints": [
                {"key": "dedicated", "value": "edge", "effect": "NoSchedule"},
                {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true",
                 "effect": "NoSchedule"},
            ],
        })
    );
    assert_eq!(
        node["status"]["addresses"],
        json!([
            {"type": "InternalIP", "address": "10.0.0.7"},
            {"type": "InternalIP", "address": "fd00::7"},
            {"type": "Hostname", "address": "node-a"},
        ])
    );
    // The cloud controller's addresses win once it set them; without --node-ip, the node
    // reports none until then (upstream's NodeAddress setter).
    let cloud = vec![NodeAddress {
        type_: "ExternalIP".into(),
        address: "203.0.113.9".into(),
    }];
    let own = build_node(&f, &cfg).status.unwrap().addresses;
    assert_eq!(
        reported_addresses(&cfg, own.clone(), Some(&cloud)),
        Some(cloud.clone())
    );
    assert_eq!(reported_addresses(&cfg, own.clone(), Some(&[])), own);
    let no_ip = KubeletConfig {
        node_ips: Vec::new(),
        ..cfg.clone()
    };
    let unset = serde_json::to_value(build_node(&f, &no_ip)).unwrap();
    assert!(unset["status"].get("addresses").is_none(), "{unset}");
    assert_eq!(reported_addresses(&no_ip, own.clone(), None), None);
    // Without an external cloud provider, the node's own always.
    let in_tree = KubeletConfig::default();
    assert_eq!(reported_addresses(&in_tree, own.clone(), Some(&cloud)), own);
    // Nothing of it by default: no spec at all.
    let plain = serde_json::to_value(build_node(&facts(), &KubeletConfig::default())).unwrap();
    assert!(plain.get("spec").is_none(), "{plain}");
}
