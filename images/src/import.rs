//! Reading an import source into candidate images: an OCI layout (index.json, blobs/sha256/...;
//! multi-arch indexes resolve to the host platform; names from the `io.containerd.image.name` or
//! full-reference `org.opencontainers.image.ref.name` annotations) or a `docker save` archive
//! (manifest.json with RepoTags; a docker manifest is synthesised). Every blob is checked against
//! its descriptor as it is staged.

use crate::digest;
use crate::error::{Error, Result};
use crate::platform::{self, HostPlatform};
use crate::source::{MAX_JSON, Source};
use crate::spec::{
    self, ANNOTATION_CONTAINERD_NAME, ANNOTATION_REF_NAME, Descriptor, Manifest, media,
};
use crate::stage::{Candidate, Layer, Stage};
use crate::unpack::{Compression, UnsupportedCompression, detect_compression};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

/// How deep indexes may nest inside index.json.
const MAX_DEPTH: usize = 4;

/// Reads the images of `src`, staging their blobs in `stage`.
pub(crate) fn read_source(src: &Source, stage: &mut Stage) -> Result<Vec<Candidate>> {
    let has_index = src.exists("index.json");
    let has_docker = src.exists("manifest.json");
    if has_index && (src.exists("oci-layout") || !has_docker) {
        read_oci(src, stage)
    } else if has_docker {
        read_docker(src, stage)
    } else {
        Err(Error::invalid_image(
            &src.origin,
            "neither an OCI layout (index.json) nor a docker archive (manifest.json)",
        ))
    }
}

fn read_oci(src: &Source, stage: &mut Stage) -> Result<Vec<Candidate>> {
    if src.exists("oci-layout") {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct LayoutFile {
            image_layout_version: String,
        }
        let layout: LayoutFile = serde_json::from_slice(&src.read("oci-layout")?)
            .map_err(|e| Error::invalid_image(&src.origin, format!("oci-layout: {e}")))?;
        if !layout.image_layout_version.starts_with("1.") {
            return Err(Error::invalid_image(
                &src.origin,
                format!(
                    "unsupported imageLayoutVersion {}",
                    layout.image_layout_version
                ),
            ));
        }
    }
    let index = src.read("index.json")?;
    let entries = match spec::parse_manifest(&index, Some(media::OCI_INDEX)) {
        Ok(Manifest::Index(entries)) => entries,
        Ok(Manifest::Image { .. }) => {
            return Err(Error::invalid_image(
                &src.origin,
                "index.json is not an index",
            ));
        }
        Err(reason) => {
            return Err(Error::invalid_image(
                &src.origin,
                format!("index.json: {reason}"),
            ));
        }
    };
    let host = platform::host();
    let mut out: Vec<Candidate> = Vec::new();
    let mut skipped = 0;
    for entry in &entries {
        if !platform::runs_on(&host, entry.platform.as_ref()) {
            skipped += 1;
            continue;
        }
        let mut reader = OciReader {
            src,
            stage: &mut *stage,
            host: &host,
        };
        let Some(mut candidate) = reader.resolve(entry, BTreeSet::new(), 0)? else {
            skipped += 1;
            continue;
        };
        candidate.target_digest = entry.digest.clone();
        candidate.names = names_of(entry);
        match out
            .iter_mut()
            .find(|c| c.manifest_digest == candidate.manifest_digest)
        {
            Some(existing) => {
                for name in candidate.names {
                    if !existing.names.contains(&name) {
                        existing.names.push(name);
                    }
                }
            }
            None => out.push(candidate),
        }
    }
    if out.is_empty() {
        if skipped > 0 {
            return Err(Error::NoMatchingPlatform {
                reference: src.origin.display().to_string(),
                platform: host.to_string(),
            });
        }
        return Err(Error::invalid_image(
            &src.origin,
            "index.json lists no images",
        ));
    }
    Ok(out)
}

/// The names an index.json entry gives its image.
fn names_of(entry: &Descriptor) -> Vec<String> {
    let mut names = Vec::new();
    let mut add = |raw: &str| match crate::reference::normalize_reference(raw) {
        Ok(n) if !names.contains(&n) => names.push(n),
        Ok(_) => {}
        Err(e) => tracing::warn!(name = raw, error = %e, "ignoring unusable image name"),
    };
    if let Some(name) = entry.annotation(ANNOTATION_CONTAINERD_NAME) {
        add(name);
    }
    if let Some(name) = entry.annotation(ANNOTATION_REF_NAME) {
        // A bare tag ("latest", "1.0") names nothing by itself.
        if name.contains(['/', ':', '@']) {
            add(name);
        }
    }
    names
}

struct OciReader<'a> {
    src: &'a Source,
    stage: &'a mut Stage,
    host: &'a HostPlatform,
}

impl OciReader<'_> {
    fn invalid(&self, reason: impl Into<String>) -> Error {
        Error::invalid_image(&self.src.origin, reason)
    }

    /// Follows `desc` down to the image manifest for the host (None when an index has none).
    fn resolve(
        &mut self,
        desc: &Descriptor,
        mut chain: BTreeSet<String>,
        depth: usize,
    ) -> Result<Option<Candidate>> {
        if depth > MAX_DEPTH {
            return Err(self.invalid("indexes nested too deeply"));
        }
        let bytes = self.json_blob(desc, "manifest")?;
        match spec::parse_manifest(&bytes, Some(&desc.media_type)) {
            Err(reason) => Err(self.invalid(format!("manifest {}: {reason}", desc.digest))),
            Ok(Manifest::Index(children)) => {
                let Some(child) = platform::select(self.host, &children) else {
                    return Ok(None);
                };
                let child = child.clone();
                chain.insert(desc.digest.clone());
                self.resolve(&child, chain, depth + 1)
            }
            Ok(Manifest::Image { config, layers }) => {
                let mut candidate = self.image(desc, &config, &layers)?;
                candidate.blobs.extend(chain);
                Ok(Some(candidate))
            }
        }
    }

    fn image(
        &mut self,
        manifest: &Descriptor,
        config: &Descriptor,
        layers: &[Descriptor],
    ) -> Result<Candidate> {
        if !config.media_type.is_empty()
            && config.media_type != media::OCI_CONFIG
            && config.media_type != media::DOCKER_CONFIG
        {
            return Err(self.invalid(format!(
                "{} is not a container image (config media type {})",
                manifest.digest, config.media_type
            )));
        }
        let config_bytes = self.json_blob(config, "config")?;
        let config_file = spec::parse_config(&config_bytes)
            .map_err(|r| self.invalid(format!("config {}: {r}", config.digest)))?;
        let arch = config_file.architecture.as_deref().unwrap_or_default();
        let os = config_file.os.as_deref().unwrap_or_default();
        if (!arch.is_empty() && arch != self.host.architecture)
            || (!os.is_empty() && os != self.host.os)
        {
            tracing::warn!(manifest = %manifest.digest, os, arch, host = %self.host, "importing an image built for another platform");
        }
        if config_file.rootfs.diff_ids.len() != layers.len() {
            return Err(self.invalid(format!(
                "manifest {} has {} layers but its config {} diff_ids",
                manifest.digest,
                layers.len(),
                config_file.rootfs.diff_ids.len()
            )));
        }
        let mut staged = Vec::new();
        for (desc, diff_id) in layers.iter().zip(&config_file.rootfs.diff_ids) {
            let hex = digest::hex_of(&desc.digest, "layer digest")?;
            let size = desc.size().map_err(|r| self.invalid(r.to_string()))?;
            if !self.stage.has_blob(&desc.digest) {
                let path = self.src.resolve(&format!("blobs/sha256/{hex}"))?;
                let what = format!("layer {}", desc.digest);
                let take = self.src.extracted;
                self.stage
                    .add_file(&what, &path, Some((&desc.digest, Some(size))), take)?;
            }
            staged.push(Layer {
                digest: desc.digest.clone(),
                size,
                diff_id: diff_id.clone(),
            });
        }
        let mut blobs: BTreeSet<String> = staged.iter().map(|l| l.digest.clone()).collect();
        blobs.insert(manifest.digest.clone());
        blobs.insert(config.digest.clone());
        Ok(Candidate {
            names: Vec::new(),
            digest_repos: Vec::new(),
            target_digest: manifest.digest.clone(),
            manifest_digest: manifest.digest.clone(),
            config_digest: config.digest.clone(),
            config_size: config.size().map_err(|r| self.invalid(r.to_string()))?,
            config: config_file,
            layers: staged,
            blobs,
        })
    }

    /// Reads, verifies and stages a small JSON blob.
    fn json_blob(&mut self, desc: &Descriptor, what: &str) -> Result<Vec<u8>> {
        let hex = digest::hex_of(&desc.digest, what)?;
        let size = desc.size().map_err(|r| self.invalid(r.to_string()))?;
        if size > MAX_JSON {
            return Err(self.invalid(format!(
                "{what} {} is too large ({size} bytes)",
                desc.digest
            )));
        }
        let data = self.src.read(&format!("blobs/sha256/{hex}"))?;
        self.stage.add_bytes(
            &format!("{what} {}", desc.digest),
            &desc.digest,
            Some(size),
            &data,
        )?;
        Ok(data)
    }
}

/// One image of a docker archive's manifest.json.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerEntry {
    config: String,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
    #[serde(default)]
    layers: Vec<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DockerManifest<'a> {
    schema_version: u32,
    media_type: &'a str,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

fn read_docker(src: &Source, stage: &mut Stage) -> Result<Vec<Candidate>> {
    let entries: Vec<DockerEntry> = serde_json::from_slice(&src.read("manifest.json")?)
        .map_err(|e| Error::invalid_image(&src.origin, format!("manifest.json: {e}")))?;
    if entries.is_empty() {
        return Err(Error::invalid_image(
            &src.origin,
            "manifest.json lists no images",
        ));
    }
    // Resolve every layer path first: archives may share one layer file between images
    // (through symlinks), and staging moves files out of the extracted tree.
    let mut resolved: Vec<Vec<PathBuf>> = Vec::new();
    for entry in &entries {
        let paths = entry
            .layers
            .iter()
            .map(|l| src.resolve(l))
            .collect::<Result<Vec<_>>>()?;
        resolved.push(paths);
    }
    let mut reader = DockerReader {
        src,
        stage,
        done: BTreeMap::new(),
    };
    entries
        .iter()
        .zip(resolved)
        .map(|(entry, layer_paths)| reader.image(entry, &layer_paths))
        .collect()
}

/// A layer file of a docker archive as staged: its digest, size and media type.
type StagedLayer = (String, u64, &'static str);

struct DockerReader<'a> {
    src: &'a Source,
    stage: &'a mut Stage,
    /// The layer files staged so far, by resolved path: images may share them.
    done: BTreeMap<PathBuf, StagedLayer>,
}

impl DockerReader<'_> {
    fn invalid(&self, reason: String) -> Error {
        Error::invalid_image(&self.src.origin, reason)
    }

    /// Stages the image of `entry`, whose layer files are at `layer_paths`, with a docker
    /// manifest made for it.
    fn image(&mut self, entry: &DockerEntry, layer_paths: &[PathBuf]) -> Result<Candidate> {
        let (config_bytes, config_digest) = self.config(entry)?;
        let config = spec::parse_config(&config_bytes)
            .map_err(|r| self.invalid(format!("{}: {r}", entry.config)))?;
        if config.rootfs.diff_ids.len() != layer_paths.len() {
            return Err(self.invalid(format!(
                "{} lists {} layers but its config {} diff_ids",
                entry.config,
                layer_paths.len(),
                config.rootfs.diff_ids.len()
            )));
        }
        let mut layers = Vec::new();
        let mut descriptors = Vec::new();
        for ((path, rel), diff_id) in layer_paths
            .iter()
            .zip(&entry.layers)
            .zip(&config.rootfs.diff_ids)
        {
            let (layer_digest, size, media_type) = self.layer(path, rel, diff_id)?;
            descriptors.push(Descriptor {
                media_type: media_type.to_string(),
                digest: layer_digest.clone(),
                size: size as i64,
                ..Default::default()
            });
            layers.push(Layer {
                digest: layer_digest,
                size,
                diff_id: diff_id.clone(),
            });
        }
        let config_descriptor = Descriptor {
            media_type: media::DOCKER_CONFIG.to_string(),
            digest: config_digest.clone(),
            size: config_bytes.len() as i64,
            ..Default::default()
        };
        let manifest_digest = self.manifest(config_descriptor, descriptors)?;
        let mut blobs: BTreeSet<String> = layers.iter().map(|l| l.digest.clone()).collect();
        blobs.insert(config_digest.clone());
        blobs.insert(manifest_digest.clone());
        Ok(Candidate {
            names: repo_tag_names(entry),
            digest_repos: Vec::new(),
            target_digest: manifest_digest.clone(),
            manifest_digest,
            config_digest,
            config_size: config_bytes.len() as u64,
            config,
            layers,
            blobs,
        })
    }

    /// Reads and stages the config of `entry`, checked against the digest its file name
    /// carries (as docker names it) when it does; its bytes and digest.
    fn config(&mut self, entry: &DockerEntry) -> Result<(Vec<u8>, String)> {
        let config_bytes = self.src.read(&entry.config)?;
        let config_digest = digest::sha256_bytes(&config_bytes);
        let stem = entry.config.rsplit('/').next().unwrap_or_default();
        let stem = stem.strip_suffix(".json").unwrap_or(stem);
        if stem.len() == 64 && stem.bytes().all(|b| b.is_ascii_hexdigit()) {
            digest::verify(
                &format!("config {}", entry.config),
                &format!("sha256:{stem}"),
                None,
                &(config_digest.clone(), 0),
            )?;
        }
        self.stage
            .add_bytes("config", &config_digest, None, &config_bytes)?;
        Ok((config_bytes, config_digest))
    }

    /// Stages the layer file at `path` (`rel` in the archive) once, checking an uncompressed
    /// one against `diff_id`.
    fn layer(&mut self, path: &Path, rel: &str, diff_id: &str) -> Result<StagedLayer> {
        if let Some(d) = self.done.get(path) {
            return Ok(d.clone());
        }
        let media_type = layer_media_type(path).map_err(|r| self.invalid(format!("{rel}: {r}")))?;
        let (d, size) =
            self.stage
                .add_file(&format!("layer {rel}"), path, None, self.src.extracted)?;
        // An uncompressed layer's digest is its diff_id.
        if media_type == media::DOCKER_LAYER_TAR && d != diff_id {
            return Err(Error::DigestMismatch {
                what: format!("diff_id of layer {rel}"),
                expected: diff_id.to_string(),
                actual: d,
            });
        }
        self.done
            .insert(path.to_path_buf(), (d.clone(), size, media_type));
        Ok((d, size, media_type))
    }

    /// Makes and stages the docker manifest of an image of `config` and `layers`; its digest.
    fn manifest(&mut self, config: Descriptor, layers: Vec<Descriptor>) -> Result<String> {
        let manifest = DockerManifest {
            schema_version: 2,
            media_type: media::DOCKER_MANIFEST,
            config,
            layers,
        };
        let manifest_bytes = serde_json::to_vec(&manifest)
            .map_err(|e| self.invalid(format!("building manifest: {e}")))?;
        let manifest_digest = digest::sha256_bytes(&manifest_bytes);
        self.stage
            .add_bytes("manifest", &manifest_digest, None, &manifest_bytes)?;
        Ok(manifest_digest)
    }
}

/// The names the RepoTags of `entry` give its image.
fn repo_tag_names(entry: &DockerEntry) -> Vec<String> {
    let mut names = Vec::new();
    for tag in entry.repo_tags.iter().flatten() {
        match crate::reference::normalize_reference(tag) {
            Ok(n) if !names.contains(&n) => names.push(n),
            Ok(_) => {}
            Err(e) => tracing::warn!(tag, error = %e, "ignoring unusable RepoTag"),
        }
    }
    names
}

/// Why the media type of a layer file cannot be told.
#[derive(Debug, thiserror::Error)]
enum LayerTypeError {
    /// The file could not be opened or read.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// It is compressed in a way the store cannot unpack.
    #[error(transparent)]
    Compression(#[from] UnsupportedCompression),
}

/// The docker media type of a layer file, from its first bytes.
fn layer_media_type(path: &Path) -> Result<&'static str, LayerTypeError> {
    let mut head = [0u8; 8];
    let mut file = std::fs::File::open(path)?;
    let n = file.read(&mut head)?;
    Ok(match detect_compression(&head[..n])? {
        Compression::None => media::DOCKER_LAYER_TAR,
        Compression::Gzip => media::DOCKER_LAYER_GZIP,
        Compression::Zstd => "application/vnd.oci.image.layer.v1.tar+zstd",
    })
}
