//! A standalone node for the tests that drive the real binary (`nodelet run-node`): a temp dir
//! with the runtime's root (busybox imported), a static pod manifest directory, the pod logs
//! directory and a KubeletConfiguration naming them.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use runtime::builtin::BuiltinRuntime;
use runtime::{RuntimeService, cri};

use super::{KillOnDrop, assert_no_leaks, config, import_busybox, nodelet_bin};

/// A standalone node has no API server for webhook authentication and authorization (the
/// kubelet refuses to start with them, as upstream).
pub const STANDALONE_AUTH: &str =
    "authentication: {webhook: {enabled: false}}\nauthorization: {mode: AlwaysAllow}\n";

pub struct Standalone {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
    pub manifests: PathBuf,
    pub logs: PathBuf,
    pub config_file: PathBuf,
    /// The kubelet's `cgroupRoot`, the test's own (removed when the node drops).
    pub cgroup_root: String,
}

impl Drop for Standalone {
    fn drop(&mut self) {
        super::destroy_cgroup_tree(&self.cgroup_root);
    }
}

/// The cgroup root the tests' own runtime handles use (they create no cgroup).
const UNUSED_CGROUP_ROOT: &str = "/nodelet-e2e-unused";

impl Standalone {
    /// The directories, with `extra` (YAML lines) added to the kubelet's configuration.
    pub fn new(extra: &str) -> Standalone {
        let dir = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
        let root = dir.path().join("root");
        let manifests = dir.path().join("manifests");
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&manifests).unwrap();
        import_busybox(&root);
        let config_file = dir.path().join("config.yaml");
        let cgroup_root = super::kubelet_cgroup_root(dir.path());
        std::fs::write(
            &config_file,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPath: {}\nfileCheckFrequency: 1s\nsyncFrequency: 2s\npodLogsDir: {}\ncgroupRoot: {cgroup_root}\n{}{STANDALONE_AUTH}{}{extra}",
                manifests.display(),
                logs.display(),
                super::api_node::SERVER,
                super::test_node_defaults(extra),
            ),
        )
        .unwrap();
        Standalone {
            dir,
            root,
            manifests,
            logs,
            config_file,
            cgroup_root,
        }
    }

    /// Starts `nodelet run-node` on the node (killed when dropped).
    pub fn start(&self) -> KillOnDrop {
        self.start_with(&[])
    }

    /// Starts `nodelet run-node` on the node with more arguments (killed when dropped).
    pub fn start_with(&self, args: &[&str]) -> KillOnDrop {
        KillOnDrop(self.command(args).spawn().expect("start nodelet run-node"))
    }

    /// The `nodelet run-node` command of the node, with more arguments (output discarded).
    pub fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(nodelet_bin());
        cmd.arg("--root-dir")
            .arg(&self.root)
            .args(["run-node", "--hostname-override", "e2e-node", "--config"])
            .arg(&self.config_file)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cmd
    }

    /// A handle on the node's runtime, opened afresh from its root dir.
    pub async fn runtime(&self) -> BuiltinRuntime {
        BuiltinRuntime::new(config(&self.root, UNUSED_CGROUP_ROOT))
            .await
            .expect("open runtime")
    }

    /// Waits (the agent running, at most 30 s) until the kubelet's garbage collection has
    /// removed every sandbox of the pods no source wants any more, and its housekeeping their
    /// pod cgroups (a pass every few seconds, after the sandboxes).
    pub async fn wait_all_removed(&self) {
        for _ in 0..300 {
            // Opened afresh each time: a handle sees the root as it was when opened.
            let left = self
                .runtime()
                .await
                .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
                .await
                .unwrap();
            if left.items.is_empty() && super::pod_cgroups_left(&self.cgroup_root).is_empty() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!(
            "sandboxes or pod cgroups left 30 s after their pods were removed: {:?}",
            super::pod_cgroups_left(&self.cgroup_root)
        );
    }

    /// Checks (with the agent stopped) that the kubelet left no sandbox, mount or process.
    pub async fn assert_all_gone(&self) {
        let sandboxes = self
            .runtime()
            .await
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
            .await
            .unwrap();
        assert!(sandboxes.items.is_empty(), "no sandbox left");
        assert_no_leaks(&self.root, UNUSED_CGROUP_ROOT);
        let left = super::pod_cgroups_left(&self.cgroup_root);
        assert!(left.is_empty(), "pod cgroups left: {left:?}");
    }
}
