//! Content staged by one import or pull before it is committed to the store: verified blobs,
//! unpacked (and diff_id-checked) layer snapshots, and the images they make up. Everything lives
//! in a staging dir under `root/tmp`, removed when the stage is dropped, so a refused input leaves
//! nothing behind.

use crate::digest;
use crate::error::{Error, Result};
use crate::index::ImageRecord;
use crate::paths::{Paths, Staging};
use crate::spec::ConfigFile;
use crate::types::Image;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

/// One layer of a candidate image: its blob and the diff_id the config promises.
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    pub digest: String,
    pub size: u64,
    pub diff_id: String,
}

/// An image ready to be committed once its blobs are staged.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    /// Normalised names (`repo:tag`).
    pub names: Vec<String>,
    /// Further repositories (`domain/path`) to record repo digests for (a pull by digest).
    pub digest_repos: Vec<String>,
    /// What the names point at: the top-level manifest or index digest (for repo digests).
    pub target_digest: String,
    pub manifest_digest: String,
    pub config_digest: String,
    pub config_size: u64,
    pub config: ConfigFile,
    pub layers: Vec<Layer>,
    /// Every blob of the image (indexes on the way, manifest, config, layers).
    pub blobs: BTreeSet<String>,
}

impl Candidate {
    /// The image record this candidate becomes.
    pub fn record(&self) -> ImageRecord {
        let mut repo_digests = Vec::new();
        let repos = self
            .names
            .iter()
            .filter_map(|n| crate::reference::parse(n).ok().map(|r| r.name()))
            .chain(self.digest_repos.iter().cloned());
        for repo in repos {
            let d = format!("{repo}@{}", self.target_digest);
            if !repo_digests.contains(&d) {
                repo_digests.push(d);
            }
        }
        ImageRecord {
            image: Image {
                id: self.config_digest.clone(),
                repo_tags: self.names.clone(),
                repo_digests,
                size: self.config_size + self.layers.iter().map(|l| l.size).sum::<u64>(),
                config: self.config.image_config(),
                manifest_digest: self.manifest_digest.clone(),
                layers: self.layers.iter().map(|l| l.diff_id.clone()).collect(),
                pinned: false,
            },
            blobs: self.blobs.clone(),
        }
    }
}

/// Blobs and snapshots staged for one operation.
#[derive(Debug)]
pub(crate) struct Stage {
    pub paths: Paths,
    pub staging: Staging,
    /// digest → verified file in the staging dir.
    blobs: BTreeMap<String, PathBuf>,
    /// diff_id → staged snapshot dir (holding `fs`).
    pub snapshots: BTreeMap<String, PathBuf>,
    counter: u64,
}

impl Stage {
    pub fn new(paths: &Paths, purpose: &str) -> Result<Stage> {
        let staging = Staging::new(paths, purpose)?;
        for sub in ["blobs", "snapshots"] {
            let dir = staging.dir.join(sub);
            std::fs::create_dir(&dir).map_err(|e| Error::io("creating staging dir", &dir, e))?;
        }
        Ok(Stage {
            paths: paths.clone(),
            staging,
            blobs: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            counter: 0,
        })
    }

    /// A fresh scratch path inside the staging dir.
    pub fn scratch(&mut self, name: &str) -> PathBuf {
        self.counter += 1;
        self.staging.dir.join(format!("{}-{name}", self.counter))
    }

    /// Whether the blob is staged or already in the store.
    pub fn has_blob(&self, digest: &str) -> bool {
        self.blobs.contains_key(digest) || self.store_blob(digest).is_some_and(|p| p.exists())
    }

    fn store_blob(&self, digest: &str) -> Option<PathBuf> {
        let hex = digest::hex_of(digest, "blob").ok()?;
        Some(self.paths.blob(hex))
    }

    /// Where to read a blob: staged, else in the store.
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        if let Some(p) = self.blobs.get(digest) {
            return Ok(p.clone());
        }
        let hex = digest::hex_of(digest, "blob")?;
        Ok(self.paths.blob(hex))
    }

    fn staged_path(&self, digest: &str) -> Result<PathBuf> {
        let hex = digest::hex_of(digest, "blob")?;
        Ok(self.staging.dir.join("blobs").join(hex))
    }

    /// Stages in-memory content after checking it against its descriptor.
    pub fn add_bytes(
        &mut self,
        what: &str,
        digest: &str,
        size: Option<u64>,
        data: &[u8],
    ) -> Result<()> {
        let actual = (digest::sha256_bytes(data), data.len() as u64);
        digest::verify(what, digest, size, &actual)?;
        if self.has_blob(digest) {
            return Ok(());
        }
        let path = self.staged_path(digest)?;
        std::fs::write(&path, data).map_err(|e| Error::io("staging blob", &path, e))?;
        self.blobs.insert(digest.to_string(), path);
        Ok(())
    }

    /// Stages the file at `src`, hashing it; when `expected` is given the content must match.
    /// With `take`, the file is moved (it must be on the store's filesystem), else copied.
    /// Returns the content's `(digest, size)`.
    pub fn add_file(
        &mut self,
        what: &str,
        src: &Path,
        expected: Option<(&str, Option<u64>)>,
        take: bool,
    ) -> Result<(String, u64)> {
        let (actual, from) = if take {
            (digest::sha256_file(src)?, src.to_path_buf())
        } else {
            let tmp = self.scratch("copy");
            let mut input = std::fs::File::open(src).map_err(|e| Error::io("reading", src, e))?;
            let mut out =
                std::fs::File::create(&tmp).map_err(|e| Error::io("staging blob", &tmp, e))?;
            let actual = digest::copy_hashed(&mut input, &mut out)
                .map_err(|e| Error::io("staging blob", &tmp, e))?;
            (actual, tmp)
        };
        if let Some((digest, size)) = expected {
            digest::verify(what, digest, size, &actual)?;
        }
        let digest = actual.0.clone();
        if self.has_blob(&digest) {
            return Ok(actual);
        }
        let dest = self.staged_path(&digest)?;
        std::fs::rename(&from, &dest).map_err(|e| Error::io("staging blob", &dest, e))?;
        self.blobs.insert(digest, dest);
        Ok(actual)
    }

    /// Registers a file whose content was verified while it was written (a download).
    pub fn add_verified(&mut self, digest: &str, file: &Path) -> Result<()> {
        let dest = self.staged_path(digest)?;
        std::fs::rename(file, &dest).map_err(|e| Error::io("staging blob", &dest, e))?;
        self.blobs.insert(digest.to_string(), dest);
        Ok(())
    }

    /// Reads a staged or stored blob of at most `max` bytes, checking it against `digest`.
    pub fn read_blob(&self, digest: &str, max: u64) -> Result<Vec<u8>> {
        let path = self.blob_path(digest)?;
        let file = std::fs::File::open(&path).map_err(|e| Error::io("reading blob", &path, e))?;
        let mut data = Vec::new();
        file.take(max)
            .read_to_end(&mut data)
            .map_err(|e| Error::io("reading blob", &path, e))?;
        digest::verify(
            digest,
            digest,
            None,
            &(digest::sha256_bytes(&data), data.len() as u64),
        )?;
        Ok(data)
    }

    /// Unpacks the candidate's layers that are neither in `existing` snapshots nor staged yet,
    /// checking each diff_id against the config.
    pub fn unpack_missing(
        &mut self,
        candidate: &Candidate,
        existing: &BTreeSet<String>,
    ) -> Result<()> {
        for layer in &candidate.layers {
            if existing.contains(&layer.diff_id) || self.snapshots.contains_key(&layer.diff_id) {
                continue;
            }
            self.unpack(layer)?;
        }
        Ok(())
    }

    /// Unpacks one layer into a staged snapshot dir.
    pub fn unpack(&mut self, layer: &Layer) -> Result<PathBuf> {
        let blob = self.blob_path(&layer.digest)?;
        let dir = self
            .staging
            .dir
            .join("snapshots")
            .join(format!("{}", self.snapshots.len()));
        let fs = dir.join("fs");
        std::fs::create_dir_all(&fs).map_err(|e| Error::io("creating snapshot", &fs, e))?;
        let diff_id = crate::unpack::unpack_layer(&blob, &layer.digest, &fs)?;
        if diff_id != layer.diff_id {
            return Err(Error::DigestMismatch {
                what: format!("diff_id of layer {}", layer.digest),
                expected: layer.diff_id.clone(),
                actual: diff_id,
            });
        }
        let marker = dir.join(crate::recover::MARKER);
        std::fs::write(&marker, &layer.diff_id)
            .map_err(|e| Error::io("marking snapshot", &marker, e))?;
        self.snapshots.insert(layer.diff_id.clone(), dir.clone());
        Ok(dir)
    }

    /// Moves staged blobs the store lacks into it.
    pub fn commit_blobs(&self) -> Result<()> {
        for (digest, path) in &self.blobs {
            let hex = digest::hex_of(digest, "blob")?;
            let dest = self.paths.blob(hex);
            if dest.exists() {
                continue;
            }
            std::fs::rename(path, &dest).map_err(|e| Error::io("committing blob", &dest, e))?;
        }
        Ok(())
    }
}
