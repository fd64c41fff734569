//! A CNI network of a test's own for the built-in runtime in CNI mode: its conf, bin, cache and
//! host-local dirs, its bridge (removed when dropped), Debian's plugins linked into its bin dir
//! beside the test's own shell-script plugins.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

/// Debian's plugins.
pub const PLUGINS: &str = "/usr/lib/cni";

/// A CNI network of the test's own: its bridge, subnet, dirs.
pub struct TestNet {
    pub dir: tempfile::TempDir,
    pub bridge: String,
    /// The subnet's first three octets (a /24).
    pub prefix: [u8; 3],
}

impl TestNet {
    pub fn new(bridge: &str, prefix: [u8; 3]) -> TestNet {
        let dir = tempfile::Builder::new().prefix("nlcni").tempdir().unwrap();
        for d in ["conf", "bin", "cache", "host-local"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        // The plugins the configs use: Debian's, and the test's scripts beside them.
        for p in ["bridge", "host-local", "portmap", "loopback"] {
            std::os::unix::fs::symlink(Path::new(PLUGINS).join(p), dir.path().join("bin").join(p))
                .unwrap();
        }
        TestNet {
            dir,
            bridge: bridge.to_string(),
            prefix,
        }
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    pub fn gateway(&self) -> Ipv4Addr {
        let [a, b, c] = self.prefix;
        Ipv4Addr::new(a, b, c, 1)
    }

    /// The bridge plugin with host-local on the test's subnet, then `more` plugins.
    pub fn conflist(&self, name: &str, version: &str, more: &[serde_json::Value]) -> String {
        let [a, b, c] = self.prefix;
        let mut plugins = vec![serde_json::json!({
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": format!("{a}.{b}.{c}.0/24")}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": self.path("host-local"),
            },
        })];
        plugins.extend(more.iter().cloned());
        serde_json::json!({"cniVersion": version, "name": name, "plugins": plugins}).to_string()
    }

    /// [`TestNet::conflist`] for a dual-stack network: host-local gives each pod an address
    /// of the test's IPv4 /24 and of `fd00:<a>:<c>::/64`, and portmap maps hostPorts on both.
    pub fn conflist_dual(&self, name: &str) -> String {
        let [a, b, c] = self.prefix;
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": true,
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [
                            [{"subnet": format!("{a}.{b}.{c}.0/24")}],
                            [{"subnet": self.v6_subnet()}],
                        ],
                        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}],
                        "dataDir": self.path("host-local"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        })
        .to_string()
    }

    /// The IPv6 subnet of [`TestNet::conflist_dual`].
    pub fn v6_subnet(&self) -> String {
        let [a, _, c] = self.prefix;
        format!("fd00:{a}:{c}::/64")
    }

    pub fn write_conf(&self, file: &str, text: &str) {
        std::fs::write(self.path("conf").join(file), text).unwrap();
    }

    /// A plugin of the test's: a shell script in the bin dir.
    pub fn script(&self, name: &str, body: &str) {
        use std::os::unix::fs::PermissionsExt;
        let path = self.path("bin").join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    /// The `cri serve` arguments for this network.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--network".into(),
            "cni".into(),
            "--cni-conf-dir".into(),
            self.path("conf").display().to_string(),
            "--cni-bin-dir".into(),
            self.path("bin").display().to_string(),
            "--cni-cache-dir".into(),
            self.path("cache").display().to_string(),
        ]
    }

    /// The addresses host-local has given out (its files named by address).
    pub fn leases(&self, network: &str) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(self.path("host-local").join(network))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
            .collect();
        out.sort();
        out
    }

    /// libcni's cache entries.
    pub fn cached(&self) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(self.path("cache/results"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        out.sort();
        out
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.bridge])
            .stderr(std::process::Stdio::null())
            .status();
        // Lets a hanging test plugin end.
        let _ = std::fs::write(self.path("release"), b"");
    }
}

/// Whether Debian's plugins are there; a test without them skips loudly, and fails under CI.
pub fn plugins_or_skip(test: &str) -> bool {
    if Path::new(PLUGINS).join("bridge").exists() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{PLUGINS} has no plugins: scripts/setup.sh installs containernetworking-plugins"
    );
    eprintln!("SKIP {test}: no CNI plugins in {PLUGINS}");
    false
}

impl TestNet {
    /// The KubeletConfiguration lines putting the built-in runtime on this network.
    pub fn kubelet_config(&self) -> String {
        format!(
            "nodeletNetwork:\n  mode: cni\n  cniConfDir: {}\n  cniBinDir: {}\n  cniCacheDir: {}\n",
            self.path("conf").display(),
            self.path("bin").display(),
            self.path("cache").display()
        )
    }
}
