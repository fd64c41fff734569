//! Image garbage collection end to end (`nodelet run-node` against the project's test API
//! server), on the built-in runtime (the node's root dir on a small tmpfs of its own) and on a
//! private containerd (its root, the content store and snapshots, on one), so that the image
//! filesystem's usage is the test's to set:
//!
//! 1. With collection by usage off (`imageGCHighThresholdPercent: 100`), pods use `gc-b` and
//!    then `gc-a` and go; `gc-c` and the pinned image are never used; `busybox` is used by a
//!    pod that keeps running. The pinned image is `gc-pinned` (`nodelet images pin`) on the
//!    built-in runtime, the sandbox image `pause` on containerd (1.6 pins no other image; the
//!    agent keeps the runtime's sandbox image whether or not it says pinned).
//! 2. The agent restarts with thresholds set from the measured usage so that freeing must take
//!    one and a half images: the never used `gc-c` goes, then the least recently used `gc-b`;
//!    `gc-a`, the pinned image and the one in use stay (the order was kept across the restart).
//! 3. With thresholds no removal can reach, what may go goes (`gc-a`) and the Node gets
//!    upstream's `FreeDiskSpaceFailed` event, then (failing again) `ImageGCFailed`.
//!
//! Needs root; skips loudly otherwise.

mod apiserver;
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use apiserver::ApiServer;
use common::api_node::{ApiNode, Backend, NS, Setup, busybox, wait_for};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

const NODE: &str = "image-gc-node";
/// The images the test adds (with `gc-pinned` on the built-in runtime only).
const IMAGES: [&str; 3] = ["gc-a", "gc-b", "gc-c"];

const SETUP: Setup = Setup {
    name: NODE,
    config: "syncFrequency: 2s\nimageMinimumGCAge: 0s\nnodeletTesting: {imageGCPeriod: 1s}\n",
    cri_listen: false,
};

fn reference(name: &str) -> String {
    format!("docker.io/library/{name}:1")
}

/// An image `name`: busybox with 4 MiB of random bytes of its own (incompressible, so each
/// image's layer is that much on disk).
fn build_image(dir: &Path, name: &str) -> PathBuf {
    let blob = dir.join(format!("{name}.bin"));
    let mut bytes = vec![0u8; 4 << 20];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").expect("/dev/urandom"),
        &mut bytes,
    )
    .expect("random bytes");
    std::fs::write(&blob, bytes).expect("the random bytes");
    let out = dir.join(format!("{name}.tar"));
    let st = std::process::Command::new("bash")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/build-busybox-image.sh"))
        .arg(&out)
        .args(["--name", &reference(name), "--add"])
        .arg(format!("{}:/data/{name}", blob.display()))
        .status()
        .expect("running build-busybox-image.sh");
    assert!(st.success(), "building {name}");
    out
}

/// The node's images by name (the last part of the repository, no registry or tag), with
/// their sizes, as the node's runtime lists them.
async fn images(node: &ApiNode) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = node
        .images()
        .await
        .into_iter()
        .map(|i| {
            let tag = i.repo_tags.first().cloned().unwrap_or_default();
            let name = tag.rsplit('/').next().unwrap_or_default();
            (
                name.split(':').next().unwrap_or_default().to_string(),
                i.size,
            )
        })
        .collect();
    out.sort();
    out
}

async fn names(node: &ApiNode) -> Vec<String> {
    images(node).await.into_iter().map(|(n, _)| n).collect()
}

/// The image filesystem: the node's root dir, or containerd's.
fn image_fs(node: &ApiNode) -> PathBuf {
    match &node.containerd {
        None => node.root.clone(),
        Some(ctd) => ctd.dir().join("root"),
    }
}

/// Runs pod `name` (its container made from `image`) until it runs, lets the collector see it
/// in use for a few periods, then deletes it and waits until its containers are gone.
async fn use_image(node: &ApiNode, pods: &Api<Pod>, name: &str, image: &str) {
    let spec = format!(
        "  terminationGracePeriodSeconds: 1\n  containers:\n{}",
        busybox("app", "exec sleep 600")
            .replace("docker.io/library/busybox:latest", &reference(image))
    );
    let uid = pods
        .create(&PostParams::default(), &node.pod(name, &spec))
        .await
        .expect("creating the pod")
        .metadata
        .uid
        .expect("a uid");
    wait_for(&format!("{name} running"), 60, async || {
        let st = pods.get_opt(name).await.ok().flatten()?.status?;
        (st.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    pods.delete(name, &DeleteParams::default())
        .await
        .expect("deleting the pod");
    wait_for(&format!("{name}'s containers removed"), 60, async || {
        node.containers_of(&uid).await.is_empty().then_some(())
    })
    .await;
    // One more collection sees it unused.
    tokio::time::sleep(Duration::from_millis(1500)).await;
}

/// Writes the node's config: the test's lines and the thresholds.
fn set_thresholds(node: &ApiNode, base: &str, high: u64, low: u64) {
    std::fs::write(
        &node.config,
        format!("{base}imageGCHighThresholdPercent: {high}\nimageGCLowThresholdPercent: {low}\n"),
    )
    .expect("writing the config");
}

#[tokio::test(flavor = "multi_thread")]
async fn image_gc_by_usage_least_recently_used_first_builtin() {
    image_gc_by_usage(
        Backend::Builtin,
        "image_gc_by_usage_least_recently_used_first_builtin",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn image_gc_by_usage_least_recently_used_first_containerd() {
    image_gc_by_usage(
        Backend::Containerd,
        "image_gc_by_usage_least_recently_used_first_containerd",
    )
    .await;
}

async fn image_gc_by_usage(backend: Backend, test: &str) {
    let api = ApiServer::start().await;
    let mut tmpfs = common::Tmpfs(None);
    let Some(node) = ApiNode::prepare_with_containerd_root(
        &SETUP,
        backend,
        test,
        |dir| api.write_kubeconfig(dir),
        Some("96m"),
    )
    .await
    else {
        return;
    };
    let work = tempfile::tempdir().expect("a work dir");
    let archives: Vec<(&str, PathBuf)> = IMAGES
        .iter()
        .map(|n| (*n, build_image(work.path(), n)))
        .collect();
    let pinned = if node.containerd.is_none() {
        // The root on a tmpfs of its own (hiding what `prepare` imported), the images
        // imported anew, one pinned.
        tmpfs.mount(&node.root, "96m");
        common::import_busybox(&node.root);
        for (_, archive) in &archives {
            common::import_archive(&node.root, archive);
        }
        let archive = build_image(work.path(), "gc-pinned");
        common::import_archive(&node.root, &archive);
        let pin = std::process::Command::new(common::nodelet_bin())
            .arg("--root-dir")
            .arg(&node.root)
            .args(["images", "pin", &reference("gc-pinned")])
            .output()
            .expect("nodelet images pin");
        assert!(pin.status.success(), "{pin:?}");
        "gc-pinned"
    } else {
        // Pushed to containerd's registry and pulled; its root is on the tmpfs already.
        for (name, archive) in &archives {
            node.add_image(archive, &reference(name)).await;
        }
        "pause"
    };
    let sorted = |names: &[&str]| {
        let mut v: Vec<String> = names
            .iter()
            .chain(std::iter::once(&pinned))
            .map(|n| n.to_string())
            .collect();
        v.sort();
        v
    };
    let base = std::fs::read_to_string(&node.config)
        .expect("the config")
        .replace(common::TEST_IMAGE_GC, "");

    // 1. Collection by usage off; b then a used; busybox used throughout.
    set_thresholds(&node, &base, 100, 99);
    let pods: Api<Pod> = Api::namespaced(api.client(), NS);
    let keeper = format!("  containers:\n{}", busybox("app", "exec sleep 3600"));
    pods.create(&PostParams::default(), &node.pod("keeper", &keeper))
        .await
        .expect("creating the keeper");
    let agent = node.start();
    use_image(&node, &pods, "uses-b", "gc-b").await;
    use_image(&node, &pods, "uses-a", "gc-a").await;
    assert_eq!(
        names(&node).await,
        sorted(&["busybox", "gc-a", "gc-b", "gc-c"]),
        "nothing removed with collection by usage off"
    );
    let records = std::fs::read_to_string(node.root.join("image-gc.json")).expect("the records");
    assert_eq!(records.matches("first_detected").count(), 5, "{records}");
    drop(agent);

    // 2. Thresholds wanting one and a half images freed: c (never used), then b.
    let sizes = images(&node).await;
    let size = sizes.iter().find(|(n, _)| n == "gc-c").expect("gc-c").1;
    let (capacity, available) = common::fs_space(&image_fs(&node));
    let usage = 100 - available * 100 / capacity;
    let low = 100 - (available + size * 3 / 2) * 100 / capacity;
    assert!(low < usage, "usage {usage}%, low {low}%");
    set_thresholds(&node, &base, usage, low);
    let agent = node.start();
    let kept = sorted(&["busybox", "gc-a"]);
    wait_for("gc-c and gc-b removed", 30, async || {
        (names(&node).await == kept).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        names(&node).await,
        kept,
        "enough was freed: nothing more goes"
    );
    drop(agent);

    // 3. Thresholds nothing can reach: gc-a goes, the Node hears why, and again at the next
    // collection (nothing left to remove), which is ImageGCFailed.
    set_thresholds(&node, &base, 1, 0);
    let _agent = node.start();
    let events: Api<Event> = Api::namespaced(api.client(), "default");
    let found = wait_for("FreeDiskSpaceFailed and ImageGCFailed", 30, async || {
        let list = events.list(&ListParams::default()).await.ok()?.items;
        let on_node = |reason: &str| {
            list.iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.involved_object.kind.as_deref() == Some("Node")
                        && e.involved_object.name.as_deref() == Some(NODE)
                })
                .cloned()
        };
        Some((on_node("FreeDiskSpaceFailed")?, on_node("ImageGCFailed")?))
    })
    .await;
    let message = found.0.message.unwrap_or_default();
    assert!(
        message
            .starts_with("Failed to garbage collect required amount of images. Attempted to free ")
            && message.ends_with(" bytes eligible to free."),
        "{message}"
    );
    assert_eq!(found.0.type_.as_deref(), Some("Warning"));
    assert_eq!(names(&node).await, sorted(&["busybox"]));
}
