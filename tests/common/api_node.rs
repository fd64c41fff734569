//! A node for the tests that drive the real binary (`nodelet run-node`) against the project's
//! test API server: a temp dir with the runtime's root, a static pod manifest directory, the pod
//! logs directory, a KubeletConfiguration naming them and the API server's kubeconfig; the
//! built-in runtime (busybox imported) or a private containerd (see [`super::containerd`]) with
//! the node's images pulled through CRI. Also the helpers those tests share: pod manifests,
//! a busybox container, polling, and the pod's containers and sandboxes in the runtime.
//!
//! Dropping an [`ApiNode`] shows the tail of the agent's log when the test failed and removes
//! what a killed agent left in the built-in runtime.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use runtime::{ImageService, RuntimeService, cri};

use super::containerd::{self, Containerd};
use super::{KillOnDrop, busybox_archive, config, import_busybox, nodelet_bin, root_or_skip};

/// The namespace of the tests' pods.
pub const NS: &str = "default";
/// The label the kubelet puts on every container and sandbox of a pod (upstream's).
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
/// The cgroup root of the tests' own runtime handles (they create no cgroup).
pub const UNUSED_CGROUP_ROOT: &str = "/nodelet-e2e-unused";

/// The kubelet server of the tests' nodes: on the loopback at any free port (the Node
/// advertises it), no healthz server, so that nodes running at once never collide.
pub const SERVER: &str = "address: 127.0.0.1\nport: 0\nhealthzPort: 0\n";

/// Which runtime the kubelet drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Builtin,
    Containerd,
}

/// What differs between the tests' nodes.
pub struct Setup {
    /// The node's name (`--hostname-override`, the pods' `nodeName`).
    pub name: &'static str,
    /// KubeletConfiguration lines added to the runtime endpoint, `staticPodPath`,
    /// `fileCheckFrequency: 1s`, `nodeStatusUpdateFrequency: 2s` and `podLogsDir`.
    pub config: &'static str,
    /// Whether the agent also serves its runtime over CRI, at [`ApiNode::cri_socket`].
    pub cri_listen: bool,
}

pub struct ApiNode {
    /// The private containerd when the node uses the remote backend (dropped before the temp
    /// dir).
    pub containerd: Option<Containerd>,
    _dir: tempfile::TempDir,
    pub name: &'static str,
    pub root: PathBuf,
    pub config: PathBuf,
    pub kubeconfig: PathBuf,
    pub manifests: PathBuf,
    pub logs: PathBuf,
    /// The kubelet's `cgroupRoot`, the test's own (removed when the node drops).
    pub cgroup_root: String,
    cri_listen: bool,
}

impl ApiNode {
    /// A node ready to start, or `None` (with a SKIP line) when this machine cannot run it.
    /// `kubeconfig` writes the API server's kubeconfig into the directory it is given and
    /// returns its path.
    pub async fn prepare(
        setup: &Setup,
        backend: Backend,
        test: &str,
        kubeconfig: impl FnOnce(&Path) -> PathBuf,
    ) -> Option<ApiNode> {
        Self::prepare_with_containerd_root(setup, backend, test, kubeconfig, None).await
    }

    /// As [`ApiNode::prepare`], a private containerd's root (its image filesystem) on a tmpfs
    /// of `containerd_root` (see [`Containerd::start_with_root`]).
    pub async fn prepare_with_containerd_root(
        setup: &Setup,
        backend: Backend,
        test: &str,
        kubeconfig: impl FnOnce(&Path) -> PathBuf,
        containerd_root: Option<&str>,
    ) -> Option<ApiNode> {
        if !root_or_skip(test) {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("nl")
            .tempdir()
            .expect("temp dir");
        let root = dir.path().join("root");
        let manifests = dir.path().join("manifests");
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&manifests).expect("manifests dir");
        let mut runtime_endpoint = String::new();
        let containerd = match backend {
            Backend::Builtin => {
                import_busybox(&root);
                None
            }
            Backend::Containerd => {
                let bin = match containerd::prerequisites() {
                    Ok(bin) => bin,
                    Err(why) => {
                        super::skip(&why, test);
                        return None;
                    }
                };
                let ctd =
                    Containerd::start_with_root(&bin, &busybox_archive(), containerd_root).await;
                if !ctd.has_pod_network() {
                    eprintln!("NOTE: {test}: containerd has no pod network; hostNetwork pods");
                }
                // The node's images, pulled through CRI from containerd's local registry (the
                // pods use `imagePullPolicy: Never`).
                let rt = runtime::remote::connect(&ctd.endpoint(), Duration::from_secs(20))
                    .await
                    .unwrap_or_else(|e| panic!("connect to containerd: {e}\n{}", ctd.log()));
                ctd.pull_all(&rt).await;
                runtime_endpoint = format!("containerRuntimeEndpoint: {}\n", ctd.endpoint());
                Some(ctd)
            }
        };
        let config = dir.path().join("config.yaml");
        let cgroup_root = super::kubelet_cgroup_root(dir.path());
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{runtime_endpoint}staticPodPath: {}\nfileCheckFrequency: 1s\nnodeStatusUpdateFrequency: 2s\npodLogsDir: {}\ncgroupRoot: {cgroup_root}\n{SERVER}{}{}",
                manifests.display(),
                logs.display(),
                super::test_node_defaults(setup.config),
                setup.config
            ),
        )
        .expect("writing the kubelet config");
        let kubeconfig = kubeconfig(dir.path());
        Some(ApiNode {
            containerd,
            _dir: dir,
            name: setup.name,
            root,
            config,
            kubeconfig,
            manifests,
            logs,
            cgroup_root,
            cri_listen: setup.cri_listen,
        })
    }

    /// Starts `nodelet run-node` with the API server (killed when dropped); its log goes to
    /// `<root>.log`, shown when a test fails.
    pub fn start(&self) -> KillOnDrop {
        self.start_with(Command::new(nodelet_bin()), "127.0.0.1")
    }

    /// [`ApiNode::start`] with `node_ip` (`--node-ip`: one address, or one of each family).
    pub fn start_with_node_ip(&self, node_ip: &str) -> KillOnDrop {
        self.start_with(Command::new(nodelet_bin()), node_ip)
    }

    /// [`ApiNode::start`] in the network namespace `netns` (`/run/netns/<netns>`, which the
    /// test made) with `node_ip`: its bridge, routes and node ports are that namespace's.
    pub fn start_in_netns(&self, netns: &str, node_ip: &str) -> KillOnDrop {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{netns}"))
            .arg("--")
            .arg(nodelet_bin());
        self.start_with(cmd, node_ip)
    }

    fn start_with(&self, mut cmd: Command, node_ip: &str) -> KillOnDrop {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.with_extension("log"))
            .expect("opening the nodelet log");
        cmd.arg("--root-dir")
            .arg(&self.root)
            .args([
                "run-node",
                "--hostname-override",
                self.name,
                "--node-ip",
                node_ip,
            ])
            .arg("--config")
            .arg(&self.config)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig);
        if self.cri_listen {
            cmd.arg("--cri-listen").arg(self.cri_socket());
        }
        KillOnDrop(
            cmd.stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start nodelet run-node"),
        )
    }

    /// The node's images, as its runtime lists them (through CRI).
    pub async fn images(&self) -> Vec<cri::Image> {
        let list = cri::ListImagesRequest { filter: None };
        let listed = match &self.containerd {
            None => {
                runtime::builtin::BuiltinRuntime::new(config(&self.root, UNUSED_CGROUP_ROOT))
                    .await
                    .expect("a runtime handle")
                    .list_images(list)
                    .await
            }
            Some(ctd) => {
                runtime::remote::connect(&ctd.endpoint(), Duration::from_secs(20))
                    .await
                    .unwrap_or_else(|e| panic!("connect to containerd: {e}\n{}", ctd.log()))
                    .list_images(list)
                    .await
            }
        };
        listed.expect("ListImages").images
    }

    /// Makes the image in the OCI archive `archive` (named `image`) available to the node:
    /// imported into the built-in runtime's store, or pushed to containerd's registry and
    /// pulled.
    pub async fn add_image(&self, archive: &Path, image: &str) {
        match &self.containerd {
            None => super::import_archive(&self.root, archive),
            Some(ctd) => {
                let rt = runtime::remote::connect(&ctd.endpoint(), Duration::from_secs(20))
                    .await
                    .unwrap_or_else(|e| panic!("connect to containerd: {e}\n{}", ctd.log()));
                ctd.add_image(&rt, archive, image).await;
            }
        }
    }

    /// Where the agent serves its runtime over CRI (with [`Setup::cri_listen`]).
    pub fn cri_socket(&self) -> PathBuf {
        self.root.with_extension("sock")
    }

    /// A pod bound to this node, its spec exactly `yaml_spec` (lines indented by two).
    pub fn plain_pod(&self, name: &str, yaml_spec: &str) -> Pod {
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {NS}\nspec:\n  nodeName: {}\n{yaml_spec}",
            self.name
        );
        serde_norway::from_str(&text).expect("a valid pod")
    }

    /// A pod bound to this node: on the pod network, or the host's on a containerd without
    /// one (see `common::containerd`).
    pub fn pod(&self, name: &str, yaml_spec: &str) -> Pod {
        self.plain_pod(name, &format!("{}{yaml_spec}", self.host_network()))
    }

    /// `  hostNetwork: true` for a pod spec where the runtime has no pod network (containerd
    /// without CNI).
    pub fn host_network(&self) -> &'static str {
        match &self.containerd {
            Some(ctd) if !ctd.has_pod_network() => "  hostNetwork: true\n",
            _ => "",
        }
    }

    /// Whether pods get a network of their own (always on the built-in runtime).
    pub fn has_pod_network(&self) -> bool {
        self.host_network().is_empty()
    }

    /// A fresh handle on the node's runtime: the built-in one over the same root, or the
    /// private containerd.
    pub async fn runtime(&self) -> Box<dyn RuntimeService> {
        match &self.containerd {
            None => Box::new(
                runtime::builtin::BuiltinRuntime::new(config(&self.root, UNUSED_CGROUP_ROOT))
                    .await
                    .expect("open the built-in runtime"),
            ),
            Some(ctd) => Box::new(
                runtime::remote::connect(&ctd.endpoint(), Duration::from_secs(20))
                    .await
                    .unwrap_or_else(|e| panic!("connect to containerd: {e}\n{}", ctd.log())),
            ),
        }
    }

    /// The pod's containers in the runtime: (id, container name, CRI state).
    pub async fn containers_of(&self, uid: &str) -> Vec<(String, String, i32)> {
        let filter = cri::ContainerFilter {
            label_selector: [(LABEL_POD_UID.to_string(), uid.to_string())].into(),
            ..Default::default()
        };
        self.runtime()
            .await
            .list_containers(cri::ListContainersRequest {
                filter: Some(filter),
            })
            .await
            .expect("ListContainers")
            .containers
            .into_iter()
            .map(|c| {
                let name = c.metadata.map(|m| m.name).unwrap_or_default();
                (c.id, name, c.state)
            })
            .collect()
    }

    /// The ids of the pod's sandboxes in the runtime.
    pub async fn sandboxes_of(&self, uid: &str) -> Vec<String> {
        let filter = cri::PodSandboxFilter {
            label_selector: [(LABEL_POD_UID.to_string(), uid.to_string())].into(),
            ..Default::default()
        };
        self.runtime()
            .await
            .list_pod_sandbox(cri::ListPodSandboxRequest {
                filter: Some(filter),
            })
            .await
            .expect("ListPodSandbox")
            .items
            .into_iter()
            .map(|s| s.id)
            .collect()
    }

    /// The directory under which the runtime mounts container rootfs (and anything else of
    /// its pods): the built-in runtime's state dir, or containerd's own dir.
    pub fn mounts_dir(&self) -> PathBuf {
        match &self.containerd {
            None => super::state_dir(&self.root),
            Some(ctd) => ctd.dir().to_path_buf(),
        }
    }

    /// `<podLogsDir>/<ns>_<name>_<uid>`.
    pub fn pod_log_dir(&self, name: &str, uid: &str) -> PathBuf {
        self.logs.join(format!("{NS}_{name}_{uid}"))
    }

    /// `<root>/pods/<uid>`.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root.join("pods").join(uid)
    }
}

impl Drop for ApiNode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.root.with_extension("log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(80).collect();
            eprintln!("--- nodelet log (last lines) ---");
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
        if self.containerd.is_none() {
            remove_builtin_pods(&self.root);
        }
        unmount_kubelet_mounts(&self.root.join("pods"));
        super::destroy_cgroup_tree(&self.cgroup_root);
    }
}

/// Unmounts what a (killed) kubelet left mounted in its pods dir for pods the test did not
/// delete (secret and memory tmpfs, subPath binds), deepest first, so removing the test's
/// root never goes through a mount.
fn unmount_kubelet_mounts(pods_dir: &Path) {
    let Ok(real) = pods_dir.canonicalize() else {
        return;
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut points = nodelet::util::mounts_under(&info, &real);
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for p in points {
        let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// Removes every pod a (killed) agent left in the built-in runtime under `root`, as a reset
/// node would: their sandbox processes, mounts, cgroups and pod addresses, so a failed test
/// leaves no mount or process behind. On a thread of its own, since the test's tokio runtime is
/// still running while its node drops.
fn remove_builtin_pods(root: &Path) {
    if !root.join("cri").exists() {
        return;
    }
    let root = root.to_path_buf();
    let done = std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        rt.block_on(async {
            let Ok(b) =
                runtime::builtin::BuiltinRuntime::new(config(&root, UNUSED_CGROUP_ROOT)).await
            else {
                return;
            };
            if let Ok(list) = b.list_pod_sandbox(Default::default()).await {
                for sb in list.items {
                    let req = cri::RemovePodSandboxRequest {
                        pod_sandbox_id: sb.id,
                    };
                    if let Err(e) = b.remove_pod_sandbox(req).await {
                        eprintln!("removing a pod the test left: {e}");
                    }
                }
            }
        });
    });
    let _ = done.join();
}

/// A container of a pod spec's `containers` (or `initContainers`) list: the project's busybox
/// (never pulled) running `sh -c script`.
pub fn busybox(name: &str, script: &str) -> String {
    format!(
        "  - name: {name}\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", {script:?}]\n"
    )
}

/// Polls `f` every 200 ms until it returns a value; panics after `secs` seconds.
pub async fn wait_for<T>(what: &str, secs: u64, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while tokio::time::Instant::now() < deadline {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("timed out after {secs}s waiting for {what}");
}
