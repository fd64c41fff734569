//! Table tests of [`super`] (`pod::spec`).

use super::*;
use serde_json::json;

/// The sandbox config of `p`, whose identity is read from it.
fn sandbox(p: &Pod, opts: &SandboxOptions) -> Result<cri::PodSandboxConfig> {
    sandbox_config(p, &PodRef::of(p), opts)
}

pub(crate) fn pod(spec: serde_json::Value) -> Pod {
    let v = json!({
        "metadata": {"name": "web", "namespace": "prod", "uid": "u-1", "labels": {"app": "web"}, "annotations": {"a": "b"}},
        "spec": spec,
    });
    serde_json::from_value(v).expect("valid pod")
}

fn ns(c: &cri::PodSandboxConfig) -> (i32, i32, i32) {
    let o = c
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .cloned()
        .unwrap_or_default();
    (o.network, o.pid, o.ipc)
}

#[test]
fn sandbox_basics() {
    let p = pod(
        json!({"containers": [{"name": "app", "image": "nginx", "ports": [
            {"containerPort": 80, "hostPort": 8080},
            {"containerPort": 53, "hostPort": 5353, "protocol": "UDP"},
            {"containerPort": 9000}
        ]}]}),
    );
    let opts = SandboxOptions {
        attempt: 2,
        cgroup_parent: "/kubepods/pod-u-1".into(),
        ..Default::default()
    };
    let c = sandbox(&p, &opts).expect("config");
    let m = c.metadata.clone().expect("metadata");
    assert_eq!(
        (
            m.name.as_str(),
            m.namespace.as_str(),
            m.uid.as_str(),
            m.attempt
        ),
        ("web", "prod", "u-1", 2)
    );
    assert_eq!(c.hostname, "web");
    assert_eq!(c.log_directory, "/var/log/pods/prod_web_u-1");
    assert_eq!(c.labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(c.labels.get(LABEL_POD_UID).map(String::as_str), Some("u-1"));
    assert_eq!(c.annotations.get("a").map(String::as_str), Some("b"));
    assert_eq!(c.port_mappings.len(), 2);
    assert_eq!(c.port_mappings[1].protocol, cri::Protocol::Udp as i32);
    assert_eq!(c.port_mappings[0].host_port, 8080);
    assert_eq!(
        c.linux.as_ref().map(|l| l.cgroup_parent.as_str()),
        Some("/kubepods/pod-u-1")
    );
    assert_eq!(c.dns_config, None, "no cluster DNS: host resolv.conf");
    let (n, p_, i) = ns(&c);
    assert_eq!(
        (n, p_, i),
        (
            cri::NamespaceMode::Pod as i32,
            cri::NamespaceMode::Container as i32,
            cri::NamespaceMode::Pod as i32
        )
    );
}

#[test]
fn namespaces_table() {
    use cri::NamespaceMode::{Container as C, Node as N, Pod as P};
    let cases = [
        (json!({"hostNetwork": true}), (N, C, P)),
        (json!({"hostPID": true}), (P, N, P)),
        (json!({"hostIPC": true}), (P, C, N)),
        (json!({"shareProcessNamespace": true}), (P, P, P)),
        (json!({}), (P, C, P)),
    ];
    for (extra, (n, p, i)) in cases {
        let mut spec = json!({"containers": [{"name": "a", "image": "x"}]});
        for (k, v) in extra.as_object().cloned().unwrap_or_default() {
            spec[k] = v;
        }
        let c = sandbox(&pod(spec.clone()), &SandboxOptions::default()).expect("config");
        assert_eq!(ns(&c), (n as i32, p as i32, i as i32), "{spec}");
        if spec.get("hostNetwork").is_some() {
            assert_eq!(c.hostname, "");
        }
    }
}

#[test]
fn hostname_truncated() {
    let long = format!("{}-abc", "a".repeat(62));
    let mut p = pod(json!({"containers": []}));
    p.metadata.name = Some(long);
    assert_eq!(hostname(&p, &PodRef::of(&p)), "a".repeat(62));
    let p = pod(json!({"hostname": "db-0", "containers": []}));
    assert_eq!(hostname(&p, &PodRef::of(&p)), "db-0");
}

#[test]
fn dns_table() {
    let cluster = SandboxOptions {
        cluster_dns: vec!["10.0.0.10".into()],
        ..Default::default()
    };
    let c = sandbox(&pod(json!({"containers": []})), &cluster).expect("config");
    let dns = c.dns_config.expect("cluster dns");
    assert_eq!(dns.servers, ["10.0.0.10"]);
    assert_eq!(
        dns.searches,
        [
            "prod.svc.cluster.local",
            "svc.cluster.local",
            "cluster.local"
        ]
    );
    assert_eq!(dns.options, ["ndots:5"]);
    // hostNetwork + ClusterFirst: host resolv.conf; ClusterFirstWithHostNet: cluster DNS.
    let c = sandbox(
        &pod(json!({"hostNetwork": true, "containers": []})),
        &cluster,
    )
    .expect("config");
    assert_eq!(c.dns_config, None);
    let p =
        pod(json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet", "containers": []}));
    assert!(sandbox(&p, &cluster).expect("config").dns_config.is_some());
    let p = pod(json!({"dnsPolicy": "Default", "containers": []}));
    assert_eq!(sandbox(&p, &cluster).expect("config").dns_config, None);
    let p = pod(
        json!({"dnsPolicy": "None", "dnsConfig": {"nameservers": ["1.1.1.1"], "searches": ["x.y"],
        "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]}, "containers": []}),
    );
    let dns = sandbox(&p, &cluster)
        .expect("config")
        .dns_config
        .expect("dns");
    assert_eq!(
        (dns.servers, dns.searches, dns.options),
        (
            vec!["1.1.1.1".to_string()],
            vec!["x.y".to_string()],
            vec!["ndots:2".to_string(), "edns0".to_string()]
        )
    );
    let p =
        pod(json!({"dnsConfig": {"options": [{"name": "ndots", "value": "1"}]}, "containers": []}));
    let dns = sandbox(&p, &cluster)
        .expect("config")
        .dns_config
        .expect("dns");
    assert_eq!(dns.options, ["ndots:1"]);
}

#[test]
fn pod_security() {
    let p = pod(json!({
        "securityContext": {"runAsUser": 1000, "runAsGroup": 3000, "supplementalGroups": [5], "fsGroup": 2000,
            "sysctls": [{"name": "net.core.somaxconn", "value": "1024"}], "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [{"name": "i", "image": "x", "securityContext": {"privileged": true}}],
        "containers": [{"name": "a", "image": "x"}]
    }));
    let c = sandbox(&p, &SandboxOptions::default()).expect("config");
    let l = c.linux.expect("linux");
    assert_eq!(
        l.sysctls.get("net.core.somaxconn").map(String::as_str),
        Some("1024")
    );
    let sc = l.security_context.expect("sc");
    assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 1000 }));
    assert_eq!(sc.run_as_group, Some(cri::Int64Value { value: 3000 }));
    assert_eq!(sc.supplemental_groups, [5, 2000]);
    assert!(sc.privileged);
    let seccomp = sc.seccomp.expect("seccomp");
    assert_eq!(
        seccomp.profile_type,
        cri::security_profile::ProfileType::RuntimeDefault as i32
    );
    let p = pod(
        json!({"securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "../x"}}, "containers": []}),
    );
    let err = sandbox(&p, &SandboxOptions::default()).expect_err("escape");
    assert_eq!(err.code(), runtime::Code::InvalidArgument);
    let p = pod(
        json!({"securityContext": {"seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}}, "containers": []}),
    );
    let c = sandbox(&p, &SandboxOptions::default()).expect("config");
    let s = c
        .linux
        .and_then(|l| l.security_context)
        .and_then(|s| s.seccomp)
        .expect("seccomp");
    assert_eq!(s.localhost_ref, "/var/lib/nodelet/seccomp/p.json");
}

#[test]
fn missing_identity_is_invalid() {
    let mut p = pod(json!({"containers": []}));
    p.metadata.uid = None;
    assert_eq!(
        sandbox(&p, &SandboxOptions::default())
            .expect_err("no uid")
            .code(),
        runtime::Code::InvalidArgument
    );
    p.spec = None;
    assert!(sandbox(&p, &SandboxOptions::default()).is_err());
}

#[test]
fn qos_table() {
    let res = |r: serde_json::Value| {
        pod(json!({"containers": [{"name": "a", "image": "x", "resources": r}]}))
    };
    let cases = [
        (json!({}), "BestEffort"),
        (
            json!({"limits": {"cpu": "1", "memory": "1Gi"}}),
            "Guaranteed",
        ),
        (
            json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1000m", "memory": "1Gi"}}),
            "Guaranteed",
        ),
        (json!({"requests": {"cpu": "500m"}}), "Burstable"),
        (
            json!({"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
            "Burstable",
        ),
        (json!({"limits": {"cpu": "1"}}), "Burstable"),
        (json!({"requests": {"cpu": "0"}}), "BestEffort"),
        (json!({"requests": {"cpu": "bogus"}}), "Burstable"),
    ];
    for (r, want) in cases {
        assert_eq!(qos_class(&res(r.clone())), want, "{r}");
    }
    let mixed = pod(json!({"containers": [
        {"name": "a", "image": "x", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
        {"name": "b", "image": "x"}
    ]}));
    assert_eq!(qos_class(&mixed), "Burstable");
}
