//! `nodelet cri serve` for the tests that reach the built-in runtime over its CRI socket: a
//! root dir with busybox imported, its socket, a cgroup root of its own, and the server process.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use runtime::remote::{self, RemoteRuntime};

use super::{assert_no_leaks, import_busybox, nodelet_bin, remove_cgroup_root};

/// A root dir, socket and cgroup root for `nodelet cri serve`.
pub struct CriNode {
    pub root: tempfile::TempDir,
    /// The servers' logs.
    pub logs: tempfile::TempDir,
    pub cgroup_root: String,
    pub socket: PathBuf,
    pub endpoint: String,
}

impl CriNode {
    /// A fresh root with busybox imported; `tag` names the cgroup root.
    pub fn new(tag: &str) -> CriNode {
        let root = tempfile::Builder::new().prefix("nl").tempdir().unwrap();
        import_busybox(root.path());
        let socket = root.path().join("cri.sock");
        CriNode {
            logs: tempfile::tempdir().unwrap(),
            cgroup_root: format!("/nodelet-e2e-{tag}-{}", std::process::id()),
            endpoint: format!("unix://{}", socket.display()),
            socket,
            root,
        }
    }

    /// Starts `nodelet cri serve` (with `extra` arguments, its stderr in `log`) and waits until
    /// it listens.
    pub async fn serve(&self, log: &str, extra: &[&str]) -> CriServe {
        let log = self.logs.path().join(log);
        let err = std::fs::File::create(&log).expect("server log");
        let child = Command::new(nodelet_bin())
            .arg("--root-dir")
            .arg(self.root.path())
            .args(["cri", "serve", "--listen", &self.endpoint])
            .args(["--cgroup-root", &self.cgroup_root])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawn nodelet cri serve");
        let mut server = CriServe { child, log };
        server.wait_listening(&self.socket).await;
        server
    }

    /// The remote backend on the socket.
    pub async fn connect(&self) -> RemoteRuntime {
        remote::connect(&self.endpoint, Duration::from_secs(30))
            .await
            .expect("connect")
    }

    /// With every server gone: removes the cgroup root and checks nothing is left.
    pub fn assert_all_gone(&self) {
        remove_cgroup_root(&self.cgroup_root);
        // A sandbox left behind: what the servers said about it, for the failure's report.
        let left = super::state_entries(self.root.path(), "sandboxes");
        if !left.is_empty() {
            let mut said = String::new();
            let mut logs: Vec<_> = std::fs::read_dir(self.logs.path())
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.path())
                .collect();
            logs.sort();
            for log in logs {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                for line in text
                    .lines()
                    .filter(|l| left.iter().any(|id| l.contains(&id[..12])))
                {
                    said.push_str(&format!("{}: {line}\n", log.display()));
                }
            }
            panic!("sandboxes left in the state dir: {left:?}; the servers said:\n{said}");
        }
        assert_no_leaks(self.root.path(), &self.cgroup_root);
    }
}

/// A `nodelet cri serve` child process, SIGKILLed when dropped.
pub struct CriServe {
    child: Child,
    log: PathBuf,
}

impl Drop for CriServe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl CriServe {
    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the socket accepts connections.
    async fn wait_listening(&mut self, socket: &Path) {
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("nodelet cri serve exited with {st}:\n{}", self.log());
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "not listening after 30s:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether the server still runs, else how it ended (for failure reports).
    pub fn state(&mut self) -> String {
        match self.child.try_wait() {
            Ok(None) => "still running".into(),
            Ok(Some(st)) => format!("exited: {st}"),
            Err(e) => format!("unknown: {e}"),
        }
    }

    /// SIGTERM, then waits for a clean exit.
    pub async fn terminate(mut self) {
        let pid = self.child.id().to_string();
        let st = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(st.success());
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "exit after SIGTERM: {st}\n{}", self.log());
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "no exit after SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
