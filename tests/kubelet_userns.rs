//! `hostUsers: false` through the kubelet and the built-in runtime, driving the real binary in
//! standalone mode: the pod gets its own block of 65536 host IDs (recorded in its pod
//! directory), its container runs as root of a user namespace mapped onto them, its emptyDir
//! belongs to that root and what it writes there is the node root's (ID-mapped), a second pod
//! gets another block, and a pod's block is given back when the pod goes.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

fn manifest(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  hostUsers: false\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: main\n    image: docker.io/library/busybox:latest\n    imagePullPolicy: Never\n    command: [\"sh\", \"-c\", \"cat /proc/self/uid_map; stat -c %u:%g / /data; echo hi > /data/f; echo done; sleep 600\"]\n    volumeMounts:\n    - {{name: data, mountPath: /data}}\n  volumes:\n  - {{name: data, emptyDir: {{}}}}\n"
    )
}

async fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    for _ in 0..300 {
        if let Some(v) = f() {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

/// The log of pod `name`'s container, once it says "done".
fn finished_log(logs: &Path, name: &str) -> Option<String> {
    let prefix = format!("default_{name}-e2e-node_");
    let dir = std::fs::read_dir(logs)
        .ok()?
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))?
        .path();
    let (out, _) = log_output(&dir.join("main/0.log"));
    out.contains("done").then_some(out)
}

/// Every pod directory (`<root>/pods/<uid>`) with a user namespace record, and its host ID.
fn pod_dirs_with_userns(root: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root.join("pods"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(text) = std::fs::read_to_string(e.path().join("userns")) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&text).expect("userns record");
        let host = v["uidMappings"][0]["hostId"].as_u64().expect("hostId") as u32;
        assert_eq!(v["gidMappings"], v["uidMappings"], "{text}");
        out.push((e.path(), host));
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn host_users_false_gets_a_user_namespace() {
    if !root_or_skip("host_users_false_gets_a_user_namespace") {
        return;
    }
    let node = standalone::Standalone::new("");
    let (root, manifests, logs) = (&node.root, &node.manifests, &node.logs);
    std::fs::write(manifests.join("a.yaml"), manifest("ua")).unwrap();
    let agent = node.start();

    let out = wait_for("pod ua's output", || finished_log(logs, "ua")).await;
    let blocks = pod_dirs_with_userns(root);
    assert_eq!(blocks.len(), 1, "{blocks:?}");
    let (pod_dir, host) = blocks[0].clone();
    assert_eq!(host % 65536, 0);
    let lines: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines[0], ["0", &host.to_string(), "65536"], "{out}");
    // The rootfs and the emptyDir are the container root's...
    assert_eq!(lines[1], ["0:0"], "{out}");
    assert_eq!(lines[2], ["0:0"], "{out}");
    // ... and what it wrote is the node root's on the node, as without a user namespace.
    let written = pod_dir.join("volumes/kubernetes.io~empty-dir/data/f");
    let meta = std::fs::metadata(&written).expect("the file the pod wrote");
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.uid(), meta.gid()), (0, 0));

    // A second pod gets another block.
    std::fs::write(manifests.join("b.yaml"), manifest("ub")).unwrap();
    let out_b = wait_for("pod ub's output", || finished_log(logs, "ub")).await;
    let blocks = pod_dirs_with_userns(root);
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    let other = blocks
        .iter()
        .find(|b| b.0 != pod_dir)
        .expect("ub's block")
        .1;
    assert_ne!(other, host);
    let first: Vec<&str> = out_b
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(first, ["0", other.to_string().as_str(), "65536"], "{out_b}");

    // Gone, a pod gives its block back.
    std::fs::remove_file(manifests.join("a.yaml")).unwrap();
    wait_for("ua's block given back", || {
        (!pod_dir.join("userns").exists()).then_some(())
    })
    .await;
    std::fs::remove_file(manifests.join("b.yaml")).unwrap();
    wait_for("ub's block given back", || {
        pod_dirs_with_userns(root).is_empty().then_some(())
    })
    .await;
    // Their sandboxes and containers go with the next garbage collection.
    node.wait_all_removed().await;
    drop(agent);
    node.assert_all_gone().await;
}
