//! Device plugins end to end, on both runtimes: the project's sample plugin
//! (`examples/sample_device_plugin.rs`) advertises devices backed by real character device
//! nodes the test makes; the real binary runs against the test API server.
//! - The Node's capacity and allocatable follow the plugin's devices and their health.
//! - A pod asking for two gets two: their device nodes (writable), the plugin's env, the
//!   plugin's preferred choice and its PreStartContainer call.
//! - A pod asking for more than is free is refused with upstream's reason and message.
//! - The pod-resources API lists the allocation and the allocatable devices.
//! - After an agent restart the allocation survives (checkpoint), the plugin registers again
//!   on the new socket, and the held devices are still not given to another pod.
//! - A plugin that goes away has its allocatable drop to 0 while the pod keeps running.

mod apiserver;
mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, Setup, busybox, wait_for};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;
use nodelet::devices::api::podresources::pod_resources_lister_client::PodResourcesListerClient;
use nodelet::devices::api::podresources::{
    AllocatableResourcesRequest, GetPodResourcesRequest, ListPodResourcesRequest,
};

const RESOURCE: &str = "example.com/sample";

struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn plugin_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("examples/sample_device_plugin"))
        .expect("target dir");
    assert!(
        bin.is_file(),
        "{} is missing: `cargo test` builds it with the tests; alone, run `cargo build --example sample_device_plugin` first",
        bin.display()
    );
    bin
}

/// Three character devices like /dev/null (1:3) under `dir`.
fn make_devices(dir: &Path) -> Vec<(String, PathBuf)> {
    std::fs::create_dir_all(dir).unwrap();
    ["a", "b", "c"]
        .iter()
        .map(|id| {
            let path = dir.join(format!("dev-{id}"));
            nix::sys::stat::mknod(
                &path,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o666),
                nix::sys::stat::makedev(1, 3),
            )
            .expect("mknod");
            (id.to_string(), path)
        })
        .collect()
}

fn start_plugin(node: &ApiNode, devices: &[(String, PathBuf)], work: &Path) -> Plugin {
    let mut cmd = Command::new(plugin_bin());
    cmd.arg("--dir")
        .arg(node.root.join("device-plugins"))
        .args([
            "--resource",
            RESOURCE,
            "--socket",
            "sample.sock",
            "--preferred",
        ])
        .arg("--unhealthy-file")
        .arg(work.join("unhealthy"))
        .arg("--pre-start-log")
        .arg(work.join("pre-start.log"));
    for (id, path) in devices {
        cmd.arg("--device").arg(format!("{id}={}", path.display()));
    }
    let log = std::fs::File::create(work.join("plugin.log")).unwrap();
    Plugin(
        cmd.stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the sample device plugin"),
    )
}

/// The Node's (capacity, allocatable) of the sample resource.
async fn node_devices(nodes: &Api<Node>, name: &str) -> Option<(String, String)> {
    let n = nodes.get_opt(name).await.ok().flatten()?;
    let st = n.status?;
    let cap = st.capacity?.get(RESOURCE)?.0.clone();
    let alloc = st.allocatable?.get(RESOURCE)?.0.clone();
    Some((cap, alloc))
}

async fn wait_node_devices(nodes: &Api<Node>, name: &str, want: (&str, &str), what: &str) {
    wait_for(what, 60, async || {
        let got = node_devices(nodes, name).await?;
        (got.0 == want.0 && got.1 == want.1).then_some(())
    })
    .await;
}

fn device_pod(node: &ApiNode, name: &str, count: u32, script: &str) -> Pod {
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}    resources: {{limits: {{{RESOURCE}: \"{count}\"}}}}\n",
        busybox("main", script)
    );
    node.pod(name, &spec)
}

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

async fn pod_resources(root: &Path) -> PodResourcesListerClient<tonic::transport::Channel> {
    let socket = std::sync::Arc::new(nodelet::devices::podresources::socket_path(root));
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let socket = socket.clone();
        async move {
            let io = tokio::net::UnixStream::connect(socket.as_path()).await?;
            Ok::<_, std::io::Error>(TokioIo::new(io))
        }
    });
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await
        .expect("connect to the pod-resources socket");
    PodResourcesListerClient::new(channel)
}

fn phase_reason(p: &Pod) -> (String, String, String) {
    let st = p.status.clone().unwrap_or_default();
    (
        st.phase.unwrap_or_default(),
        st.reason.unwrap_or_default(),
        st.message.unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn device_plugin_builtin() {
    device_plugin(Backend::Builtin, "device_plugin_builtin").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn device_plugin_containerd() {
    device_plugin(Backend::Containerd, "device_plugin_containerd").await;
}

async fn device_plugin(backend: Backend, test: &str) {
    const NODE: &str = "devices-node";
    let setup = Setup {
        name: NODE,
        config: "syncFrequency: 5s\n",
        cri_listen: false,
    };
    let api = ApiServer::start().await;
    let Some(node) = ApiNode::prepare(&setup, backend, test, |d| api.write_kubeconfig(d)).await
    else {
        return;
    };
    let work = node.root.with_extension("devices");
    let devices = make_devices(&work.join("dev"));
    std::fs::write(work.join("unhealthy"), "").unwrap();
    let client = api.client();
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    let mut agent = node.start();
    let socket = node.root.join("device-plugins/kubelet.sock");
    wait_for("the registration socket", 60, async || {
        socket.exists().then_some(())
    })
    .await;
    let mut plugin = start_plugin(&node, &devices, &work);
    wait_node_devices(&nodes, NODE, ("3", "3"), "three devices in the Node").await;
    // An unhealthy device leaves allocatable, not capacity.
    std::fs::write(work.join("unhealthy"), "c\n").unwrap();
    wait_node_devices(&nodes, NODE, ("3", "2"), "device c unhealthy").await;

    // Two devices for one pod: the plugin prefers the highest IDs.
    let script = "ls /dev/sample-*; echo devices=$SAMPLE_DEVICES; echo hello > /dev/sample-a && echo wrote; sleep 1000";
    let two = device_pod(&node, "two", 2, script);
    pods.create(&PostParams::default(), &two).await.unwrap();
    let log = wait_for("pod two's devices in its log", 90, async || {
        let l = read_log(&node.logs, "two");
        l.contains("wrote").then_some(l)
    })
    .await;
    assert!(
        log.contains("/dev/sample-a") && log.contains("/dev/sample-b"),
        "{log}"
    );
    assert!(!log.contains("/dev/sample-c"), "{log}");
    assert!(
        log.contains("devices=b,a"),
        "the preferred allocation: {log}"
    );
    let pre = std::fs::read_to_string(work.join("pre-start.log")).unwrap_or_default();
    assert!(
        pre.lines().any(|l| l == "b,a"),
        "PreStartContainer: {pre:?}"
    );
    let running = wait_for("pod two Running", 60, async || {
        let p = pods.get_opt("two").await.ok().flatten()?;
        (phase_reason(&p).0 == "Running").then_some(p)
    })
    .await;
    let uid = running.metadata.uid.clone().unwrap();

    // No device left: a pod asking for one is refused as upstream refuses it.
    let three = device_pod(&node, "three", 1, "sleep 1000");
    pods.create(&PostParams::default(), &three).await.unwrap();
    let (phase, reason, message) = wait_for("pod three refused", 60, async || {
        let p = pods.get_opt("three").await.ok().flatten()?;
        let pr = phase_reason(&p);
        (pr.0 == "Failed").then_some(pr)
    })
    .await;
    assert_eq!(phase, "Failed");
    assert_eq!(reason, "UnexpectedAdmissionError");
    assert_eq!(
        message,
        "Pod was rejected: Allocate failed due to requested number of devices unavailable for example.com/sample. Requested: 1, Available: 0, which is unexpected"
    );

    // The pod-resources API.
    let mut pr = pod_resources(&node.root).await;
    let list = pr
        .list(ListPodResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let entry = list
        .pod_resources
        .iter()
        .find(|p| p.name == "two" && p.namespace == "default")
        .unwrap_or_else(|| panic!("pod two listed: {list:?}"));
    let devs = &entry.containers[0].devices;
    assert_eq!(devs.len(), 1, "{entry:?}");
    assert_eq!(devs[0].resource_name, RESOURCE);
    let mut ids = devs[0].device_ids.clone();
    ids.sort();
    assert_eq!(ids, vec!["a", "b"]);
    let got = pr
        .get(GetPodResourcesRequest {
            pod_name: "two".into(),
            pod_namespace: "default".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.pod_resources.unwrap().containers[0].devices.len(), 1);
    let alloc = pr
        .get_allocatable_resources(AllocatableResourcesRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut all: Vec<String> = alloc
        .devices
        .iter()
        .flat_map(|d| d.device_ids.clone())
        .collect();
    all.sort();
    assert_eq!(all, vec!["a", "b", "c"]);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(nodelet::devices::podresources::socket_path(&node.root))
            .unwrap()
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let checkpoint = node.root.join("device-plugins/kubelet_internal_checkpoint");
    let cp = std::fs::read_to_string(&checkpoint).unwrap();
    assert!(cp.contains(&uid), "the checkpoint holds pod two: {cp}");

    // The agent restarts: the checkpoint keeps pod two's devices, the plugin registers again.
    drop(agent);
    tokio::time::sleep(Duration::from_millis(500)).await;
    agent = node.start();
    wait_for("the registration socket again", 60, async || {
        socket.exists().then_some(())
    })
    .await;
    let plugin_log = work.join("plugin.log");
    wait_for("the plugin registered twice", 60, async || {
        let l = std::fs::read_to_string(&plugin_log).ok()?;
        (l.matches("registered").count() >= 2).then_some(())
    })
    .await;
    std::fs::write(work.join("unhealthy"), "").unwrap();
    wait_node_devices(&nodes, NODE, ("3", "3"), "device c healthy again").await;
    // a and b are still held: one pod asking for two is refused, one asking for one gets c.
    let four = device_pod(&node, "four", 2, "sleep 1000");
    pods.create(&PostParams::default(), &four).await.unwrap();
    let (_, reason, message) = wait_for("pod four refused", 60, async || {
        let p = pods.get_opt("four").await.ok().flatten()?;
        let pr = phase_reason(&p);
        (pr.0 == "Failed").then_some(pr)
    })
    .await;
    assert_eq!(reason, "UnexpectedAdmissionError");
    assert!(message.contains("Requested: 2, Available: 1"), "{message}");
    let five = device_pod(&node, "five", 1, "echo devices=$SAMPLE_DEVICES; sleep 1000");
    pods.create(&PostParams::default(), &five).await.unwrap();
    let log = wait_for("pod five's device", 90, async || {
        let l = read_log(&node.logs, "five");
        l.contains("devices=").then_some(l)
    })
    .await;
    assert!(log.contains("devices=c"), "{log}");
    let p = pods.get("two").await.unwrap();
    let st = p.status.unwrap().container_statuses.unwrap();
    assert_eq!(st[0].restart_count, 0, "pod two was adopted, not restarted");
    assert!(st[0].state.as_ref().unwrap().running.is_some());

    // The plugin goes: allocatable drops to 0, capacity stays, pods keep running.
    drop(plugin);
    wait_node_devices(&nodes, NODE, ("3", "0"), "allocatable 0 without the plugin").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = pods.get("two").await.unwrap();
    assert_eq!(phase_reason(&p).0, "Running");
    plugin = start_plugin(&node, &devices, &work);
    wait_node_devices(&nodes, NODE, ("3", "3"), "the plugin back").await;
    drop(plugin);
    drop(agent);
}
