//! Test helpers: building small OCI layouts and archives by hand (layers, configs, manifests,
//! indexes) and snapshotting a directory tree to compare before and after an operation.

use crate::digest::sha256_bytes;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

/// An uncompressed layer tar with the given regular files (parents created implicitly).
pub(crate) fn layer(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o755);
        h.set_size(data.len() as u64);
        h.set_mtime(0);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).unwrap();
    gz.finish().unwrap()
}

/// A descriptor as JSON.
pub(crate) fn desc(media_type: &str, data: &[u8]) -> Value {
    json!({"mediaType": media_type, "digest": sha256_bytes(data), "size": data.len()})
}

/// An OCI layout under construction.
#[derive(Default, Clone)]
pub(crate) struct Oci {
    pub blobs: BTreeMap<String, Vec<u8>>,
    pub entries: Vec<Value>,
}

/// What `Oci::image` made.
#[derive(Clone, Debug)]
pub(crate) struct Built {
    pub manifest: Value,
    pub config_digest: String,
    pub layer_digests: Vec<String>,
}

impl Oci {
    pub fn blob(&mut self, data: Vec<u8>) -> String {
        let d = sha256_bytes(&data);
        self.blobs.insert(d.clone(), data);
        d
    }

    /// An image of gzip layers for `arch`; `cmd` makes configs distinct. `diff_ids` overrides
    /// the config's diff_ids when given.
    pub fn image(
        &mut self,
        layers: &[Vec<u8>],
        arch: &str,
        cmd: &str,
        diff_ids: Option<Vec<String>>,
    ) -> Built {
        let diff_ids = diff_ids.unwrap_or_else(|| layers.iter().map(|l| sha256_bytes(l)).collect());
        let config = serde_json::to_vec(&json!({
            "architecture": arch, "os": "linux",
            "config": {"Cmd": [cmd], "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .unwrap();
        let config_desc = desc(crate::spec::media::OCI_CONFIG, &config);
        let config_digest = self.blob(config);
        let mut layer_descs = Vec::new();
        let mut layer_digests = Vec::new();
        for l in layers {
            let gz = gzip(l);
            layer_descs.push(desc("application/vnd.oci.image.layer.v1.tar+gzip", &gz));
            layer_digests.push(self.blob(gz));
        }
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": crate::spec::media::OCI_MANIFEST,
            "config": config_desc,
            "layers": layer_descs,
        }))
        .unwrap();
        let mut d = desc(crate::spec::media::OCI_MANIFEST, &manifest);
        d["platform"] = json!({"os": "linux", "architecture": arch});
        self.blob(manifest);
        Built {
            manifest: d,
            config_digest,
            layer_digests,
        }
    }

    /// An index blob of the given manifest descriptors; returns its descriptor.
    pub fn index(&mut self, manifests: Vec<Value>) -> Value {
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": crate::spec::media::OCI_INDEX,
            "manifests": manifests,
        }))
        .unwrap();
        let d = desc(crate::spec::media::OCI_INDEX, &index);
        self.blob(index);
        d
    }

    /// Adds an index.json entry naming `desc` (containerd's annotation) when `name` is given.
    pub fn entry(&mut self, mut desc: Value, name: Option<&str>) -> &mut Self {
        if let Some(name) = name {
            desc["annotations"] = json!({crate::spec::ANNOTATION_CONTAINERD_NAME: name});
        }
        self.entries.push(desc);
        self
    }

    pub fn write_dir(&self, dir: &Path) {
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        let index = json!({"schemaVersion": 2, "manifests": self.entries});
        std::fs::write(dir.join("index.json"), serde_json::to_vec(&index).unwrap()).unwrap();
        for (d, data) in &self.blobs {
            let hex = d.strip_prefix("sha256:").unwrap();
            std::fs::write(dir.join("blobs/sha256").join(hex), data).unwrap();
        }
    }

    /// Writes the layout as a tar archive at `path`.
    pub fn write_tar(&self, path: &Path) {
        let dir = tempfile::tempdir().unwrap();
        self.write_dir(dir.path());
        let mut b = tar::Builder::new(std::fs::File::create(path).unwrap());
        b.append_dir_all(".", dir.path()).unwrap();
        b.finish().unwrap();
    }
}

/// Every path under `root` with its size (for files), sorted: a store's visible state.
pub(crate) fn tree(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let m = entry.metadata().unwrap();
            let rel = entry
                .path()
                .strip_prefix(root)
                .unwrap()
                .display()
                .to_string();
            if m.is_dir() {
                out.push(format!("{rel}/"));
                stack.push(entry.path());
            } else {
                out.push(format!("{rel} {}", m.len()));
            }
        }
    }
    out.sort();
    out
}

pub(crate) fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Says that `test` cannot run on this machine because of `why`: a loud `SKIP (why): test` line
/// on stderr, and the test passes. Under CI (`CI` set to `true` or `1`) the test fails with that
/// line instead: CI never passes a test it did not run.
pub(crate) fn skip(why: &str, test: &str) {
    let line = format!("SKIP ({why}): {test}");
    if std::env::var("CI").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        panic!("{line}");
    }
    eprintln!("{line}");
}
