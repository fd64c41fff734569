//! What the store does with state files it cannot read at open: the index (`images.json`) and
//! the rootfs records (`containers/<key>/rootfs.json`) are set aside in `root/corrupt/`, reported,
//! and the index is rebuilt from what is on disk, so that every image whose content is whole
//! stays usable and nothing a container uses is swept. Names come from the index's previous
//! generation (`images.json.prev`) where it knew the image; otherwise the image is known by id
//! only, until it is pulled or imported again.
//!
//! Content makes the rebuild possible: blobs are named by their digest, so manifests and configs
//! are found by parsing the small blobs; every snapshot dir carries a `diff_id` marker saying
//! which layer it holds (written when it is unpacked, and added at open to dirs that predate it).

use crate::digest;
use crate::index::{ImageRecord, State};
use crate::paths::Paths;
use crate::spec::{self, Manifest, media};
use crate::types::Image;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The file in a snapshot dir naming the layer's diff_id.
pub(crate) const MARKER: &str = "diff_id";

/// The largest blob read while looking for manifests and configs.
const MAX_SMALL_BLOB: u64 = 4 << 20;

/// Moves an unreadable state file to `root/corrupt/<what>.<unix time>` and says so. Returns
/// where it went (None when it could not be moved; it is then left in place).
pub(crate) fn set_aside(paths: &Paths, file: &Path, what: &str, reason: &str) -> Option<PathBuf> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let dir = paths.corrupt();
    let aside = dir.join(format!("{what}.{stamp}"));
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::rename(file, &aside)) {
        Ok(()) => {
            tracing::error!(file = %file.display(), moved_to = %aside.display(), "{what} is unreadable ({reason}); set aside");
            Some(aside)
        }
        Err(e) => {
            tracing::error!(file = %file.display(), error = %e, "{what} is unreadable ({reason}) and could not be set aside");
            None
        }
    }
}

/// Writes the diff_id marker of every indexed snapshot that lacks one (a store made before
/// markers existed), so that a later rebuild finds them.
pub(crate) fn mark_snapshots(paths: &Paths, state: &State) {
    for (diff_id, n) in &state.snapshots {
        let marker = paths.snapshot(*n).join(MARKER);
        if paths.snapshot(*n).is_dir() && !marker.exists() {
            if let Err(e) = std::fs::write(&marker, diff_id) {
                tracing::warn!(path = %marker.display(), error = %e, "writing a snapshot's diff_id marker");
            }
        }
    }
}

/// The snapshot dirs on disk: their numbers, and the diff_id of each that names one.
fn snapshots_on_disk(paths: &Paths) -> (BTreeMap<String, u64>, u64) {
    let mut by_diff_id = BTreeMap::new();
    let mut highest = 0;
    let Ok(entries) = std::fs::read_dir(paths.snapshots()) else {
        return (by_diff_id, highest);
    };
    let mut numbered: Vec<u64> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
        .collect();
    numbered.sort_unstable();
    for n in numbered {
        highest = highest.max(n);
        let Ok(text) = std::fs::read_to_string(paths.snapshot(n).join(MARKER)) else {
            continue;
        };
        let diff_id = text.trim();
        if digest::hex_of(diff_id, "diff_id").is_ok() && paths.snapshot_fs(n).is_dir() {
            by_diff_id.entry(diff_id.to_string()).or_insert(n);
        }
    }
    (by_diff_id, highest)
}

/// Every blob in the store, by digest, with its size.
fn blobs_on_disk(paths: &Paths) -> BTreeMap<String, u64> {
    let Ok(entries) = std::fs::read_dir(paths.blobs()) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let digest = format!("sha256:{name}");
            digest::hex_of(&digest, "blob").ok()?;
            Some((digest, e.metadata().ok()?.len()))
        })
        .collect()
}

/// A small blob's bytes, when they match its digest.
fn read_small(paths: &Paths, digest: &str, size: u64) -> Option<Vec<u8>> {
    if size > MAX_SMALL_BLOB {
        return None;
    }
    let data = std::fs::read(paths.blob(digest::hex_of(digest, "blob").ok()?)).ok()?;
    (digest::sha256_bytes(&data) == digest).then_some(data)
}

/// An index rebuilt from the blobs and snapshots on disk: an image for every manifest whose
/// config, layer blobs and layer snapshots are all present, named only by its id.
pub(crate) fn rebuild(paths: &Paths, version: u32) -> State {
    let (snapshots, highest) = snapshots_on_disk(paths);
    let blobs = blobs_on_disk(paths);
    let mut images: BTreeMap<String, ImageRecord> = BTreeMap::new();
    let mut indexes: Vec<(String, Vec<String>)> = Vec::new();
    for (digest, size) in &blobs {
        let Some(data) = read_small(paths, digest, *size) else {
            continue;
        };
        match spec::parse_manifest(&data, None) {
            Ok(Manifest::Index(children)) => {
                indexes.push((
                    digest.clone(),
                    children.into_iter().map(|c| c.digest).collect(),
                ));
            }
            Ok(Manifest::Image { config, layers }) => {
                let Some(record) = image(paths, &blobs, &snapshots, digest, &config, &layers)
                else {
                    continue;
                };
                match images.get_mut(&record.image.id) {
                    Some(existing) => existing.blobs.extend(record.blobs),
                    None => {
                        images.insert(record.image.id.clone(), record);
                    }
                }
            }
            Err(_) => {}
        }
    }
    // An index (or a chain of them) leading to a recovered manifest belongs to its image.
    loop {
        let mut grew = false;
        for (index, children) in &indexes {
            for record in images.values_mut() {
                if !record.blobs.contains(index)
                    && children.iter().any(|c| record.blobs.contains(c))
                {
                    record.blobs.insert(index.clone());
                    grew = true;
                }
            }
        }
        if !grew {
            break;
        }
    }
    // Names come back from the index's previous generation, where it is readable and knew the
    // image (a tag moved by the very last change may point at its old image).
    if let Ok(prev) = std::fs::read(paths.index_prev())
        .map_err(|e| e.to_string())
        .and_then(|d| serde_json::from_slice::<State>(&d).map_err(|e| e.to_string()))
    {
        for (id, old) in prev.images {
            if let Some(record) = images.get_mut(&id) {
                record.image.repo_tags = old.image.repo_tags;
                record.image.repo_digests = old.image.repo_digests;
                record
                    .blobs
                    .extend(old.blobs.into_iter().filter(|b| blobs.contains_key(b)));
            }
        }
    }
    // Only the snapshots some image needs are kept in the index; the rest go with the next
    // sweep.
    let needed: BTreeSet<&String> = images.values().flat_map(|r| &r.image.layers).collect();
    let snapshots = snapshots
        .iter()
        .filter(|(d, _)| needed.contains(d))
        .map(|(d, n)| (d.clone(), *n))
        .collect();
    State {
        version,
        images,
        snapshots,
        next_snapshot: highest + 1,
    }
}

/// The image a manifest blob describes, if all it needs is on disk.
fn image(
    paths: &Paths,
    blobs: &BTreeMap<String, u64>,
    snapshots: &BTreeMap<String, u64>,
    manifest: &str,
    config: &spec::Descriptor,
    layers: &[spec::Descriptor],
) -> Option<ImageRecord> {
    if !config.media_type.is_empty()
        && config.media_type != media::OCI_CONFIG
        && config.media_type != media::DOCKER_CONFIG
    {
        return None;
    }
    let config_size = *blobs.get(&config.digest)?;
    let config_file = spec::parse_config(&read_small(paths, &config.digest, config_size)?).ok()?;
    let diff_ids = &config_file.rootfs.diff_ids;
    if diff_ids.len() != layers.len() {
        return None;
    }
    let mut record_blobs = BTreeSet::from([manifest.to_string(), config.digest.clone()]);
    let mut size = config_size;
    for (layer, diff_id) in layers.iter().zip(diff_ids) {
        size += blobs.get(&layer.digest)?;
        snapshots.get(diff_id)?;
        record_blobs.insert(layer.digest.clone());
    }
    Some(ImageRecord {
        image: Image {
            id: config.digest.clone(),
            repo_tags: Vec::new(),
            repo_digests: Vec::new(),
            size,
            config: config_file.image_config(),
            manifest_digest: manifest.to_string(),
            layers: diff_ids.clone(),
            pinned: false,
        },
        blobs: record_blobs,
    })
}

#[cfg(test)]
mod tests;
