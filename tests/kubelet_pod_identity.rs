//! A pod's names as its containers see them, through the real binary on both runtimes: the
//! `/etc/hosts` the kubelet writes (the pod's FQDN line from `hostname`/`subdomain`, the
//! `hostAliases` section; a hostNetwork pod's copy of the node's file), `setHostnameAsFQDN`
//! in the kernel's hostname, and the `MissingClusterDNS` event of a ClusterFirst pod on a
//! kubelet without clusterDNS.

mod apiserver;
mod common;

use std::path::Path;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, Setup, busybox, wait_for};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::PostParams;

const NODE: &str = "identity-node";

fn read_log(logs: &Path, pod: &str) -> String {
    let Ok(dirs) = std::fs::read_dir(logs) else {
        return String::new();
    };
    for d in dirs.flatten() {
        let name = d.file_name().to_string_lossy().to_string();
        if name.starts_with(&format!("default_{pod}_")) {
            return std::fs::read_to_string(d.path().join("main").join("0.log"))
                .unwrap_or_default();
        }
    }
    String::new()
}

/// The log's lines without the CRI prefix (`<time> stdout F `).
fn lines(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| l.splitn(4, ' ').nth(3))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_identity_builtin() {
    pod_identity(Backend::Builtin, "pod_identity_builtin").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn pod_identity_containerd() {
    pod_identity(Backend::Containerd, "pod_identity_containerd").await;
}

async fn pod_identity(backend: Backend, test: &str) {
    let setup = Setup {
        name: NODE,
        config: "syncFrequency: 5s\nclusterDomain: cluster.local\n",
        cri_listen: false,
    };
    let api = ApiServer::start().await;
    let Some(node) = ApiNode::prepare(&setup, backend, test, |d| api.write_kubeconfig(d)).await
    else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(api.client(), "default");
    let _agent = node.start();
    let script = "cat /etc/hosts; echo hostname=$(hostname); echo done; sleep 1000";
    let aliases = "  hostAliases:\n  - ip: 10.9.9.9\n    hostnames: [db.local, cache.local]\n";

    // On the node's network: the node's file under upstream's header, then the aliases.
    let host = node.plain_pod(
        "host",
        &format!(
            "  hostNetwork: true\n{aliases}  terminationGracePeriodSeconds: 1\n  containers:\n{}",
            busybox("main", script)
        ),
    );
    pods.create(&PostParams::default(), &host).await.unwrap();
    if node.has_pod_network() {
        // Its own network: the managed file with the pod's FQDN line, the kernel's hostname
        // the FQDN (setHostnameAsFQDN).
        let own = node.plain_pod(
            "web-0",
            &format!(
                "  hostname: web-0\n  subdomain: web\n  setHostnameAsFQDN: true\n{aliases}  terminationGracePeriodSeconds: 1\n  containers:\n{}",
                busybox("main", script)
            ),
        );
        pods.create(&PostParams::default(), &own).await.unwrap();
        let log = wait_for("web-0's hosts file", 90, async || {
            let l = read_log(&node.logs, "web-0");
            l.contains("done").then_some(lines(&l))
        })
        .await;
        let ip = wait_for("web-0's pod IP", 60, async || {
            pods.get("web-0").await.ok()?.status?.pod_ip
        })
        .await;
        let fqdn = "web-0.web.default.svc.cluster.local";
        let want = [
            "# Kubernetes-managed hosts file.".to_string(),
            "127.0.0.1\tlocalhost".to_string(),
            "::1\tlocalhost ip6-localhost ip6-loopback".to_string(),
            "fe00::0\tip6-localnet".to_string(),
            "fe00::0\tip6-mcastprefix".to_string(),
            "fe00::1\tip6-allnodes".to_string(),
            "fe00::2\tip6-allrouters".to_string(),
            format!("{ip}\t{fqdn}\tweb-0"),
            String::new(),
            "# Entries added by HostAliases.".to_string(),
            "10.9.9.9\tdb.local\tcache.local".to_string(),
            format!("hostname={fqdn}"),
            "done".to_string(),
        ];
        assert_eq!(log, want);
    }
    let log = wait_for("the hostNetwork pod's hosts file", 90, async || {
        let l = read_log(&node.logs, "host");
        l.contains("done").then_some(lines(&l))
    })
    .await;
    assert_eq!(log[0], "# Kubernetes-managed hosts file (host network).");
    let node_file: Vec<String> = std::fs::read_to_string("/etc/hosts")
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(log[1..=node_file.len()], node_file[..]);
    let tail: Vec<&str> = log[node_file.len() + 1..]
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(
        tail[..3],
        [
            "",
            "# Entries added by HostAliases.",
            "10.9.9.9\tdb.local\tcache.local"
        ]
    );

    // The test node has no clusterDNS: a ClusterFirst pod is told, and gets the node's DNS.
    if node.has_pod_network() {
        let events: Api<Event> = Api::namespaced(api.client(), "default");
        let ev = wait_for("a MissingClusterDNS event", 60, async || {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("MissingClusterDNS"))
        })
        .await;
        assert_eq!(ev.type_.as_deref(), Some("Warning"));
        let msg = ev.message.unwrap_or_default();
        assert!(
            msg.contains("kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy."),
            "{msg}"
        );
    }
}
