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
    let mount = format!("{}:/sample-mount", work.join("share").display());
    let args = [
        "--resource",
        RESOURCE,
        "--socket",
        "sample.sock",
        "--preferred",
        "--mount",
        &mount,
    ];
    let mut cmd = plugin_command(node, devices, &args);
    cmd.arg("--unhealthy-file")
        .arg(work.join("unhealthy"))
        .arg("--pre-start-log")
        .arg(work.join("pre-start.log"));
    spawn(cmd, &work.join("plugin.log"))
}

fn plugin_command(node: &ApiNode, devices: &[(String, PathBuf)], args: &[&str]) -> Command {
    let mut cmd = Command::new(plugin_bin());
    cmd.arg("--dir")
        .arg(node.root.join("device-plugins"))
        .args(args);
    for (id, path) in devices {
        cmd.arg("--device").arg(format!("{id}={}", path.display()));
    }
    cmd
}

fn spawn(mut cmd: Command, log: &Path) -> Plugin {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
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

/// The reason and message of a pod admission refused (its phase Failed).
async fn refused(pods: &Api<Pod>, name: &str) -> (String, String) {
    wait_for(&format!("pod {name} refused"), 60, async || {
        let (phase, reason, message) = phase_reason(&pods.get_opt(name).await.ok().flatten()?);
        (phase == "Failed").then_some((reason, message))
    })
    .await
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

const NODE: &str = "devices-node";

async fn device_plugin(backend: Backend, test: &str) {
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

    // On the built-in runtime a plugin may answer with CDI device names, which the runtime
    // resolves from the spec dirs it is configured with.
    let cdi_dir = work.join("cdi");
    if backend == Backend::Builtin {
        std::fs::create_dir_all(&cdi_dir).unwrap();
        let mut cfg = std::fs::OpenOptions::new()
            .append(true)
            .open(&node.config)
            .unwrap();
        use std::io::Write;
        writeln!(cfg, "nodeletCDISpecDirs: [{}]", cdi_dir.display()).unwrap();
    }
    let mut agent = node.start();
    let socket = node.root.join("device-plugins/kubelet.sock");
    wait_for("the registration socket", 60, async || {
        socket.exists().then_some(())
    })
    .await;
    // A plugin asking for another API version is refused with a reason it can print.
    let old_args = [
        "--resource",
        "example.com/old",
        "--socket",
        "old.sock",
        "--api-version",
        "v1alpha",
    ];
    let old = spawn(
        plugin_command(&node, &devices, &old_args),
        &work.join("old.log"),
    );
    let refusal = wait_for("the old plugin refused", 60, async || {
        let l = std::fs::read_to_string(work.join("old.log")).ok()?;
        l.contains("registering:").then_some(l)
    })
    .await;
    assert!(
        refusal.contains("requested API version \"v1alpha\" is not supported by kubelet"),
        "{refusal}"
    );
    drop(old);
    let mut plugin = start_plugin(&node, &devices, &work);
    wait_node_devices(&nodes, NODE, ("3", "3"), "three devices in the Node").await;
    let n = nodes.get(NODE).await.unwrap();
    let capacity = n.status.unwrap().capacity.unwrap();
    assert!(!capacity.contains_key("example.com/old"), "{capacity:?}");
    // An unhealthy device leaves allocatable, not capacity.
    std::fs::write(work.join("unhealthy"), "c\n").unwrap();
    wait_node_devices(&nodes, NODE, ("3", "2"), "device c unhealthy").await;

    // Two devices for one pod: the plugin prefers the highest IDs.
    std::fs::create_dir_all(work.join("share")).unwrap();
    std::fs::write(work.join("share/hello"), "from-the-plugin\n").unwrap();
    let script = "ls /dev/sample-*; echo devices=$SAMPLE_DEVICES; cat /sample-mount/hello; echo hello > /dev/sample-a && echo wrote; sleep 1000";
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
    assert!(log.contains("from-the-plugin"), "the plugin's mount: {log}");
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
    // The plugin's annotations and the record of the devices reach the container (CRI).
    let rt = node.runtime().await;
    let (id, _, _) = node.containers_of(&uid).await.into_iter().next().unwrap();
    let st = rt
        .container_status(runtime::cri::ContainerStatusRequest {
            container_id: id,
            verbose: false,
        })
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(
        st.annotations
            .get("example.com/sample-devices")
            .map(String::as_str),
        Some("b,a"),
        "{:?}",
        st.annotations
    );
    assert_eq!(
        st.annotations.get("io.nodelet.devices").map(String::as_str),
        Some(r#"{"example.com/sample":["b","a"]}"#)
    );

    if backend == Backend::Builtin {
        cdi_devices(&node, &nodes, &pods, &work, &cdi_dir).await;
    }

    // No device left: a pod asking for one is refused as upstream refuses it.
    let three = device_pod(&node, "three", 1, "sleep 1000");
    pods.create(&PostParams::default(), &three).await.unwrap();
    let (reason, message) = refused(&pods, "three").await;
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
        .filter(|d| d.resource_name == RESOURCE)
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
    // A killed agent leaves its socket: gone, the new one is seen when it is made.
    let _ = std::fs::remove_file(&socket);
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
    let (reason, message) = refused(&pods, "four").await;
    assert_eq!(reason, "UnexpectedAdmissionError");
    assert!(message.contains("Requested: 2, Available: 1"), "{message}");
    // A plugin whose Allocate hangs and whose device list has garbage in it: its bad entries
    // are skipped, and a pod waiting on it holds up nobody else.
    let hang_devices = make_devices(&work.join("hang-dev"));
    let hang_args = [
        "--resource",
        "example.com/hang",
        "--socket",
        "hang.sock",
        "--hang-allocate",
        "--garbage",
    ];
    let hang = spawn(
        plugin_command(&node, &hang_devices, &hang_args),
        &work.join("hang.log"),
    );
    wait_for("the hanging plugin's three devices", 60, async || {
        let n = nodes.get_opt(NODE).await.ok().flatten()?;
        let q = n.status?.capacity?.get("example.com/hang")?.0.clone();
        (q == "3").then_some(())
    })
    .await;
    let stuck = node.pod(
        "stuck",
        &format!(
            "  terminationGracePeriodSeconds: 1\n  containers:\n{}    resources: {{limits: {{example.com/hang: \"1\"}}}}\n",
            busybox("main", "sleep 1000")
        ),
    );
    pods.create(&PostParams::default(), &stuck).await.unwrap();
    let five = device_pod(&node, "five", 1, "echo devices=$SAMPLE_DEVICES; sleep 1000");
    pods.create(&PostParams::default(), &five).await.unwrap();
    let log = wait_for("pod five's device", 90, async || {
        let l = read_log(&node.logs, "five");
        l.contains("devices=").then_some(l)
    })
    .await;
    assert!(log.contains("devices=c"), "{log}");
    let p = pods.get("stuck").await.unwrap();
    assert_ne!(
        phase_reason(&p).0,
        "Running",
        "the hanging plugin's pod cannot run"
    );
    drop(hang);
    let p = pods.get("two").await.unwrap();
    let st = p.status.unwrap().container_statuses.unwrap();
    assert_eq!(st[0].restart_count, 0, "pod two was adopted, not restarted");
    assert!(st[0].state.as_ref().unwrap().running.is_some());

    // A corrupt checkpoint: set aside, the allocations rebuilt from the running containers.
    drop(agent);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // A killed agent leaves its socket: gone, the new one is seen when it is made.
    let _ = std::fs::remove_file(&socket);
    std::fs::write(&checkpoint, "{\"Data\": garbage").unwrap();
    agent = node.start();
    wait_for(
        "the registration socket after the corrupt checkpoint",
        60,
        async || socket.exists().then_some(()),
    )
    .await;
    let aside = std::fs::read_dir(node.root.join("device-plugins"))
        .unwrap()
        .flatten()
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .contains("kubelet_internal_checkpoint.corrupt-")
        });
    assert!(aside, "the corrupt checkpoint is set aside");
    let mut pr = pod_resources(&node.root).await;
    let held = wait_for("two and five hold their devices again", 60, async || {
        let list = pr.list(ListPodResourcesRequest {}).await.ok()?.into_inner();
        let mut held: Vec<(String, Vec<String>)> = list
            .pod_resources
            .iter()
            .filter(|p| p.name == "two" || p.name == "five")
            .filter_map(|p| {
                let d = p.containers.first()?.devices.first()?;
                let mut ids = d.device_ids.clone();
                ids.sort();
                Some((p.name.clone(), ids))
            })
            .collect();
        held.sort();
        (held.len() == 2).then_some(held)
    })
    .await;
    assert_eq!(
        held,
        vec![
            ("five".to_string(), vec!["c".to_string()]),
            ("two".to_string(), vec!["a".to_string(), "b".to_string()])
        ]
    );
    let six = device_pod(&node, "six", 1, "sleep 1000");
    pods.create(&PostParams::default(), &six).await.unwrap();
    let (reason, message) = refused(&pods, "six").await;
    assert_eq!(reason, "UnexpectedAdmissionError");
    assert!(message.contains("Requested: 1, Available: 0"), "{message}");
    let cp = std::fs::read_to_string(&checkpoint).unwrap();
    assert!(cp.contains(&uid), "a new checkpoint holds pod two: {cp}");

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

/// A plugin whose answer names a CDI device: the built-in runtime gives the container what the
/// CDI spec (written by the test) says, beside the plugin's own device node.
async fn cdi_devices(
    node: &ApiNode,
    nodes: &Api<Node>,
    pods: &Api<Pod>,
    work: &Path,
    cdi_dir: &Path,
) {
    let nodes_dir = work.join("cdi-dev");
    std::fs::create_dir_all(&nodes_dir).unwrap();
    let host = nodes_dir.join("null-like");
    nix::sys::stat::mknod(
        &host,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .expect("mknod");
    std::fs::write(
        cdi_dir.join("example.yaml"),
        format!(
            "cdiVersion: 0.6.0\nkind: example.com/cdi\ndevices:\n- name: d\n  containerEdits:\n    env: [CDI_D=from-the-spec]\n    deviceNodes:\n    - path: /dev/cdi-d\n      hostPath: {}\n",
            host.display()
        ),
    )
    .unwrap();
    let devices = make_devices(&work.join("cdi-plugin-dev"));
    let args = [
        "--resource",
        "example.com/cdi",
        "--socket",
        "cdi.sock",
        "--cdi-kind",
        "example.com/cdi",
    ];
    // The plugin's one device, "d": its answer names the CDI device example.com/cdi=d.
    let plugin = spawn(
        plugin_command(node, &[("d".to_string(), devices[0].1.clone())], &args),
        &work.join("cdi-plugin.log"),
    );
    wait_for("the CDI plugin's device in the Node", 60, async || {
        let n = nodes.get_opt(NODE).await.ok().flatten()?;
        let q = n.status?.allocatable?.get("example.com/cdi")?.0.clone();
        (q == "1").then_some(())
    })
    .await;
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}    resources: {{limits: {{example.com/cdi: \"1\"}}}}\n",
        busybox(
            "main",
            "echo cdi=$CDI_D; test -c /dev/cdi-d && echo > /dev/cdi-d && echo cdi-node-ok; test -c /dev/sample-d && echo plugin-node-ok; sleep 1000"
        )
    );
    pods.create(&PostParams::default(), &node.pod("cdi", &spec))
        .await
        .unwrap();
    let log = wait_for("pod cdi's devices in its log", 90, async || {
        let l = read_log(&node.logs, "cdi");
        l.contains("plugin-node-ok").then_some(l)
    })
    .await;
    assert!(log.contains("cdi=from-the-spec"), "{log}");
    assert!(log.contains("cdi-node-ok"), "{log}");
    drop(plugin);
}
