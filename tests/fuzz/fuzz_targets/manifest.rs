//! A static pod manifest through the kubelet's real path for one: the file source's scan of
//! `staticPodPath` (decode as YAML/JSON, validate, apply the static pod defaults, validate
//! again), then, for a pod it accepts, what the kubelet does with it next: admission onto a
//! node, the CRI sandbox config and each container's CRI config. Any file gives pods or
//! errors, never a panic.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use libfuzzer_sys::fuzz_target;
use nodelet::model::PodRef;
use nodelet::pod::container::{ContainerOptions, container_config};
use nodelet::pod::spec::{SandboxOptions, qos_class, sandbox_config};
use nodelet::sources::file::FileSource;

struct Fixture {
    _dir: tempfile::TempDir,
    manifest: PathBuf,
    source: std::sync::Mutex<FileSource>,
    node: Node,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let manifest = dir.path().join("pod.yaml");
        let source = FileSource::new(dir.path(), "fuzz-node", Duration::from_secs(20));
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "fuzz-node", "labels": {"kubernetes.io/os": "linux"}},
            "status": {
                "capacity": {"cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "20Gi"},
                "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "110", "ephemeral-storage": "20Gi"}
            }
        }))
        .expect("node");
        Fixture {
            _dir: dir,
            manifest,
            source: std::sync::Mutex::new(source),
            node,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let f = fixture();
    std::fs::write(&f.manifest, data).expect("writing the manifest");
    let scan = f.source.lock().expect("source").scan();
    for pod in &scan.pods {
        let _ = nodelet::admission::admit(pod, &[], &f.node);
        let _ = qos_class(pod);
        let who = PodRef::of(pod);
        let _ = sandbox_config(pod, &who, &SandboxOptions::default());
        let opts = ContainerOptions::default();
        let spec = pod.spec.as_ref().expect("a validated pod has a spec");
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers);
        for (i, c) in containers.enumerate() {
            let _ = container_config(pod, &who, c, i as u32, &opts);
        }
    }
});
