//! The real plugins of Debian's containernetworking-plugins (in /usr/lib/cni; 1.1.1 speaks up to
//! CNI 1.0.0): bridge with host-local, then portmap, in a network namespace of the test's own.
//!
//! Needs root. Without it, or without the plugins, the test says so and passes, unless `CI=true`:
//! then it fails.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use runtime_cni::{Attachment, Cni, Settings, load};

const PLUGINS: &str = "/usr/lib/cni";
const BRIDGE: &str = "nlcnit0";
const NETWORK: &str = "nlcnitest";

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let uids = status.lines().find(|l| l.starts_with("Uid:"))?.to_string();
            Some(uids.split_whitespace().nth(2)? == "0")
        })
        .unwrap_or(false)
}

/// Whether the test can run; panics when it cannot but must (`CI=true`).
fn can_run() -> bool {
    let missing = if !is_root() {
        Some("not root".to_string())
    } else if !Path::new(PLUGINS).join("bridge").exists() {
        Some(format!("no {PLUGINS}/bridge"))
    } else {
        None
    };
    match missing {
        None => true,
        Some(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("CI=true, and the Debian CNI plugins test cannot run: {why}")
        }
        Some(why) => {
            eprintln!("skipping the Debian CNI plugins test: {why}");
            false
        }
    }
}

fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(args)
        .output()
        .expect("running ip (iproute2)")
}

/// A network namespace, deleted when dropped.
struct Netns(String);

impl Netns {
    fn new(name: String) -> Self {
        let out = ip(&["netns", "add", &name]);
        assert!(
            out.status.success(),
            "ip netns add {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Netns(name)
    }

    fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.0)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.0]);
    }
}

/// A host link the plugins make, deleted when dropped.
struct Link(&'static str);

impl Drop for Link {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", self.0]);
    }
}

#[tokio::test]
async fn bridge_host_local_and_portmap() {
    if !can_run() {
        return;
    }
    let pid = std::process::id();
    let netns = Netns::new(format!("nlcnitest-{pid}"));
    let _bridge = Link(BRIDGE);
    let dir = tempfile::tempdir().unwrap();
    let conf_dir = dir.path().join("net.d");
    let data_dir = dir.path().join("ipam");
    std::fs::create_dir(&conf_dir).unwrap();
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "subnet": "10.222.0.0/24",
                    "dataDir": data_dir,
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "portmap", "capabilities": {"portMappings": true}}
        ]
    });
    std::fs::write(
        conf_dir.join("10-nlcnitest.conflist"),
        serde_json::to_vec_pretty(&conflist).unwrap(),
    )
    .unwrap();
    let loaded = load(&conf_dir).unwrap();
    assert!(loaded.skipped.is_empty(), "{:?}", loaded.skipped);
    let net = loaded.network.expect("the conflist loads");
    assert_eq!(net.cni_version, "1.0.0");

    let cni = Cni::new(Settings {
        conf_dir: conf_dir.clone(),
        bin_dirs: vec![PathBuf::from(PLUGINS)],
        cache_dir: dir.path().join("cache"),
        timeout: Duration::from_secs(60),
    });
    let version = cni.version("bridge").await.unwrap();
    assert!(
        version.supported_versions.iter().any(|v| v == "1.0.0"),
        "{version:?}"
    );

    let att = Attachment {
        container_id: format!("nlcnitest-{pid}"),
        netns: netns.path(),
        ifname: "eth0".to_string(),
        args: vec![("K8S_POD_NAME".to_string(), "nlcnitest".to_string())],
        capability_args: serde_json::Map::new(),
    };
    let result = cni.add(&net, &att).await.unwrap();
    let ip4 = result
        .ips
        .iter()
        .find(|ip| ip.address.0.is_ipv4())
        .expect("an IPv4 address");
    let (IpAddr::V4(addr), prefix) = ip4.address else {
        unreachable!()
    };
    assert_eq!(prefix, 24);
    assert_eq!(addr.octets()[..3], [10, 222, 0], "{addr}");
    assert_eq!(ip4.gateway, Some("10.222.0.1".parse().unwrap()));
    let eth0 = &result.interfaces[ip4.interface.expect("the address's interface")];
    assert_eq!(eth0.name, "eth0");
    assert_eq!(
        eth0.sandbox.as_deref(),
        Some(netns.path().to_str().unwrap())
    );

    let shown = ip(&["-n", &netns.0, "addr", "show", "eth0"]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains(&format!("inet {addr}/24")), "{shown}");
    let lease = data_dir.join(NETWORK).join(addr.to_string());
    assert!(lease.exists(), "host-local's lease {}", lease.display());
    assert_eq!(cni.cached().len(), 1);

    cni.check(&net, &att).await.unwrap();

    cni.del(&net, &att).await.unwrap();
    assert!(!lease.exists(), "the lease is released");
    assert!(cni.cached().is_empty());
    let shown = ip(&["-n", &netns.0, "link", "show", "eth0"]);
    assert!(!shown.status.success(), "eth0 is gone");
    // A second DEL (nothing cached, nothing there) succeeds too.
    cni.del(&net, &att).await.unwrap();
}
