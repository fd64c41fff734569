//! An image archive or layout read for another content store (containerd's, for the preload
//! dir of a node whose runtime is remote): the same formats and checks as
//! [`Store::import`](crate::Store::import), but instead of committing the images, it hands out
//! each image's blobs in the order another store takes them (children before the documents that
//! refer to them) with what refers to what, and the verified files to copy them from. Everything
//! is staged under a scratch dir removed when the [`Archive`] is dropped.

use crate::error::{Error, Result};
use crate::paths::Paths;
use crate::spec::{self, Manifest, media};
use crate::stage::Stage;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// What a blob is to the document that refers to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildKind {
    /// A manifest of an index.
    Manifest,
    /// The config of a manifest.
    Config,
    /// A layer of a manifest.
    Layer,
}

/// One blob of an archived image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveBlob {
    pub digest: String,
    pub size: u64,
    pub media_type: String,
    /// The blobs this one refers to that the archive holds, in the document's order.
    pub children: Vec<(ChildKind, String)>,
}

/// One image of an archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveImage {
    /// The image id (its config digest).
    pub id: String,
    /// Its names (`repo:tag`, normalised).
    pub names: Vec<String>,
    /// `repo@digest` for each name's repository.
    pub repo_digests: Vec<String>,
    /// What the names point at: the top-level index or manifest.
    pub target: ArchiveBlob,
    /// Every blob of the image, children first, the target last.
    pub blobs: Vec<ArchiveBlob>,
}

/// The images of one archive and their staged, verified blobs.
#[derive(Debug)]
pub struct Archive {
    stage: Stage,
    images: Vec<ArchiveImage>,
}

impl Archive {
    /// Reads `path` (an OCI layout, an OCI archive or a `docker save` tar, plain, gzip or zstd),
    /// staging under `scratch` (created when missing). Multi-platform indexes keep the host's
    /// manifest only; every blob is checked against its descriptor.
    pub fn read(path: &Path, scratch: &Path) -> Result<Archive> {
        let paths = Paths {
            root: scratch.to_path_buf(),
        };
        let tmp = paths.tmp();
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io("creating scratch dir", &tmp, e))?;
        // What an import cut short by a crash left (its process is gone).
        paths.clean_stale_staging();
        let mut stage = Stage::new(&paths, "archive")?;
        let extract = stage.scratch("archive");
        let src = crate::source::Source::open(path, &extract)?;
        let candidates = crate::import::read_source(&src, &mut stage)?;
        let mut images = Vec::new();
        for c in candidates {
            let record = c.record();
            let target = describe(&stage, &c.target_digest, None, &c.blobs)?;
            let mut blobs = Vec::new();
            let mut seen = BTreeSet::new();
            walk(&stage, &target, &c.blobs, &mut blobs, &mut seen)?;
            images.push(ArchiveImage {
                id: record.image.id,
                names: record.image.repo_tags,
                repo_digests: record.image.repo_digests,
                target,
                blobs,
            });
        }
        Ok(Archive { stage, images })
    }

    /// The images read.
    pub fn images(&self) -> &[ArchiveImage] {
        &self.images
    }

    /// The verified file holding a blob of one of the images.
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        self.stage.blob_path(digest)
    }
}

/// A staged blob's descriptor and children. `declared` is the media type its parent gave it;
/// for a top-level document the document's own `mediaType`, else what its shape says.
fn describe(
    stage: &Stage,
    digest: &str,
    declared: Option<&str>,
    held: &BTreeSet<String>,
) -> Result<ArchiveBlob> {
    let path = stage.blob_path(digest)?;
    let size = std::fs::metadata(&path)
        .map_err(|e| Error::io("reading blob", &path, e))?
        .len();
    let bytes = stage.read_blob(digest, crate::source::MAX_JSON)?;
    let own: Option<String> = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v.get("mediaType")?.as_str().map(str::to_string))
        .filter(|m| !m.is_empty());
    let parsed = spec::parse_manifest(&bytes, declared)
        .map_err(|r| Error::invalid_image(Path::new(digest), r.to_string()))?;
    let (fallback, children) = match parsed {
        Manifest::Index(entries) => (
            media::OCI_INDEX,
            entries
                .into_iter()
                .filter(|e| held.contains(&e.digest))
                .map(|e| (ChildKind::Manifest, e.digest))
                .collect(),
        ),
        Manifest::Image { config, layers } => (
            media::OCI_MANIFEST,
            std::iter::once((ChildKind::Config, config.digest))
                .chain(layers.into_iter().map(|l| (ChildKind::Layer, l.digest)))
                .collect(),
        ),
    };
    let media_type = declared
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .or(own)
        .unwrap_or_else(|| fallback.to_string());
    Ok(ArchiveBlob {
        digest: digest.to_string(),
        size,
        media_type,
        children,
    })
}

/// Appends `doc`'s children (recursively, children first) and then `doc` to `out`.
fn walk(
    stage: &Stage,
    doc: &ArchiveBlob,
    held: &BTreeSet<String>,
    out: &mut Vec<ArchiveBlob>,
    seen: &mut BTreeSet<String>,
) -> Result<()> {
    let bytes = stage.read_blob(&doc.digest, crate::source::MAX_JSON)?;
    let parsed = spec::parse_manifest(&bytes, Some(&doc.media_type))
        .map_err(|r| Error::invalid_image(Path::new(&doc.digest), r.to_string()))?;
    match parsed {
        Manifest::Index(entries) => {
            for e in entries.iter().filter(|e| held.contains(&e.digest)) {
                let child = describe(stage, &e.digest, Some(&e.media_type), held)?;
                walk(stage, &child, held, out, seen)?;
            }
        }
        Manifest::Image { config, layers } => {
            for d in std::iter::once(&config).chain(&layers) {
                if !seen.insert(d.digest.clone()) {
                    continue;
                }
                let path = stage.blob_path(&d.digest)?;
                let size = std::fs::metadata(&path)
                    .map_err(|e| Error::io("reading blob", &path, e))?
                    .len();
                let media_type = if d.media_type.is_empty() {
                    if d.digest == config.digest {
                        media::OCI_CONFIG.to_string()
                    } else {
                        "application/vnd.oci.image.layer.v1.tar".to_string()
                    }
                } else {
                    d.media_type.clone()
                };
                out.push(ArchiveBlob {
                    digest: d.digest.clone(),
                    size,
                    media_type,
                    children: Vec::new(),
                });
            }
        }
    }
    if seen.insert(doc.digest.clone()) {
        out.push(doc.clone());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::host;
    use crate::testutil::{Oci, layer};

    #[test]
    fn an_archive_lists_its_blobs_children_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut oci = Oci::default();
        let built = oci.image(
            &[layer(&[("bin/sh", b"#!")])],
            host().architecture,
            "sh",
            None,
        );
        oci.entry(
            built.manifest.clone(),
            Some("docker.io/library/busybox:latest"),
        );
        let tar = dir.path().join("img.tar");
        oci.write_tar(&tar);
        let scratch = dir.path().join("scratch");
        let archive = Archive::read(&tar, &scratch).unwrap();
        let [img] = archive.images() else {
            panic!("one image expected: {:?}", archive.images());
        };
        assert_eq!(img.id, built.config_digest);
        assert_eq!(img.names, ["docker.io/library/busybox:latest"]);
        let manifest = built.manifest["digest"].as_str().unwrap();
        assert_eq!(img.target.digest, manifest);
        assert_eq!(img.target.media_type, media::OCI_MANIFEST);
        assert_eq!(
            img.repo_digests,
            [format!("docker.io/library/busybox@{manifest}")]
        );
        let order: Vec<&str> = img.blobs.iter().map(|b| b.digest.as_str()).collect();
        assert_eq!(order.last(), Some(&manifest));
        assert_eq!(order[0], built.config_digest);
        assert_eq!(
            img.target.children[0],
            (ChildKind::Config, built.config_digest.clone())
        );
        for b in &img.blobs {
            let data = std::fs::read(archive.blob_path(&b.digest).unwrap()).unwrap();
            assert_eq!(data.len() as u64, b.size);
            assert_eq!(crate::digest::sha256_bytes(&data), b.digest);
        }
        let staged = std::fs::read_dir(scratch.join("tmp")).unwrap().count();
        assert_eq!(staged, 1);
        drop(archive);
        assert_eq!(std::fs::read_dir(scratch.join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn an_index_keeps_the_hosts_manifest_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut oci = Oci::default();
        let here = oci.image(&[layer(&[("a", b"1")])], host().architecture, "a", None);
        let other = oci.image(&[layer(&[("b", b"2")])], "s390x-none", "b", None);
        let index = oci.index(vec![here.manifest.clone(), other.manifest.clone()]);
        oci.entry(index.clone(), Some("registry.local/multi:v1"));
        oci.write_dir(&dir.path().join("layout"));
        let archive = Archive::read(&dir.path().join("layout"), &dir.path().join("s")).unwrap();
        let [img] = archive.images() else {
            panic!("one image expected: {:?}", archive.images());
        };
        assert_eq!(img.target.digest, index["digest"].as_str().unwrap());
        assert_eq!(img.target.media_type, media::OCI_INDEX);
        let here_digest = here.manifest["digest"].as_str().unwrap().to_string();
        assert_eq!(
            img.target.children,
            [(ChildKind::Manifest, here_digest.clone())]
        );
        let order: Vec<&str> = img.blobs.iter().map(|b| b.digest.as_str()).collect();
        assert_eq!(
            order,
            [
                here.config_digest.as_str(),
                here.layer_digests[0].as_str(),
                here_digest.as_str(),
                img.target.digest.as_str()
            ]
        );
        assert_eq!(img.blobs[2].media_type, media::OCI_MANIFEST);
        assert_eq!(img.blobs[2].children.len(), 2);
    }

    #[test]
    fn a_broken_archive_is_refused_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let tar = dir.path().join("broken.tar");
        std::fs::write(&tar, b"not a tar at all").unwrap();
        let scratch = dir.path().join("scratch");
        // A staging dir left by an import whose process is gone goes too.
        let stale = scratch.join("tmp").join(format!("{}-0-archive", i32::MAX));
        std::fs::create_dir_all(stale.join("blobs")).unwrap();
        let err = Archive::read(&tar, &scratch).unwrap_err();
        assert!(err.to_string().contains("broken.tar"), "{err}");
        assert_eq!(std::fs::read_dir(scratch.join("tmp")).unwrap().count(), 0);
    }
}
