//! nodelet's image store: imports OCI/docker archives and pulls from registries into
//! content-addressed blobs, unpacks each layer once into a shared snapshot, and mounts overlayfs
//! root filesystems for containers. It knows nothing of CRI or Kubernetes: its API takes its own
//! small types.
//!
//! Layout under the root: `blobs/sha256/<hex>` (verified content), `snapshots/<n>/fs` (one
//! unpacked layer each, with a `diff_id` marker), `containers/<key>/{upper,work,rootfs.json}`,
//! `tmp/` (staging), `images.json` (the index), `lock`, and `corrupt/` (state files that could
//! not be read, set aside at open; see `recover`).

mod archive;
mod digest;
mod error;
mod fsinfo;
mod hosts_dir;
pub mod idmap;
mod import;
mod index;
mod loopback;
mod mounts;
mod paths;
mod platform;
mod pull;
mod recover;
mod reference;
mod registries;
mod rootfs;
mod roots;
mod source;
mod spec;
mod stage;
mod store;
#[cfg(test)]
mod testutil;
mod types;
mod unpack;

pub use archive::{Archive, ArchiveBlob, ArchiveImage, ChildKind};
pub use error::{Error, Kind, Result};
pub use mounts::unmount_below;
pub use reference::normalize_reference;
pub use registries::ConfigError as RegistriesConfigError;
pub use rootfs::RootfsIdMap;
pub use roots::{FALLBACK_ROOTS_FILE, fallback_trust_roots};
pub use store::Store;
pub use types::{FsInfo, HostConfig, Image, ImageConfig, RegistryAuth, RegistryConfig};

/// Entry points for the fuzz targets (`tests/fuzz`), not part of the crate's API: thin
/// wrappers of internal functions, with no behaviour of their own.
#[doc(hidden)]
pub mod fuzzing {
    use std::path::Path;

    /// Unpacks the layer blob at `blob` (a tar, plain, gzip or zstd) into the existing, empty
    /// directory `dest` exactly as the store unpacks every layer; returns its diff_id.
    pub fn unpack_layer(blob: &Path, dest: &Path) -> crate::Result<String> {
        crate::unpack::unpack_layer(blob, "fuzz", dest)
    }
}
