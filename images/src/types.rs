//! The small, self-contained types of the store's API: images, their runtime config, filesystem
//! usage, and how to reach registries. Nothing here knows of CRI or Kubernetes.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// An image in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// `sha256:<hex of the config blob>`.
    pub id: String,
    /// Normalised names pointing at this image, e.g. `docker.io/library/busybox:latest`.
    pub repo_tags: Vec<String>,
    /// `name@sha256:<digest>` for each repository this image came from. For pulled images the
    /// digest is the one the tag resolved to (an index's digest for multi-arch images).
    pub repo_digests: Vec<String>,
    /// Sum of the compressed layer sizes and the config size.
    pub size: u64,
    /// The runtime configuration from the image config.
    pub config: ImageConfig,
    /// Digest of the platform-specific image manifest.
    pub manifest_digest: String,
    /// The layers' diff_ids (sha256 of the uncompressed tars), bottom first.
    pub layers: Vec<String>,
    /// Kept from garbage collection ([`crate::Store::set_pinned`]); an import or pull of the
    /// same image keeps it.
    #[serde(default)]
    pub pinned: bool,
}

/// The parts of an image config a runtime needs to start a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    pub user: Option<String>,
    pub env: Vec<String>,
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    pub working_dir: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub stop_signal: Option<String>,
    pub volumes: Vec<String>,
    /// e.g. `80/tcp`.
    pub exposed_ports: Vec<String>,
}

/// Disk usage of the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsInfo {
    /// The store root.
    pub mountpoint: PathBuf,
    /// Bytes allocated on disk by everything under the root (hard links counted once).
    pub used_bytes: u64,
    /// Inodes under the root (hard links counted once).
    pub inodes_used: u64,
}

/// Credentials for a registry. `Default` is anonymous access.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryAuth {
    pub username: Option<String>,
    pub password: Option<String>,
    /// An OAuth refresh token, sent to the token service as a password.
    pub identity_token: Option<String>,
    /// A bearer token sent to the registry as is.
    pub registry_token: Option<String>,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |s: &Option<String>| s.as_ref().map(|_| "<redacted>");
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .field("password", &redacted(&self.password))
            .field("identity_token", &redacted(&self.identity_token))
            .field("registry_token", &redacted(&self.registry_token))
            .finish()
    }
}

/// How to reach registries (read from a registries config file by
/// [`RegistryConfig::from_file`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryConfig {
    /// Registry hosts (`host` or `host:port`) that may be reached over plain HTTP.
    pub insecure: Vec<String>,
    /// Registry host (e.g. `docker.io`, or `*` for every registry without an entry) → mirror
    /// hosts tried, in order, before it.
    #[serde(default)]
    pub mirrors: BTreeMap<String, Vec<String>>,
    /// Registry host (or `*`) → (regex, replacement) pairs applied to the repository path on
    /// its mirrors (never on the registry itself): the first pattern that matches.
    #[serde(default)]
    pub rewrites: BTreeMap<String, Vec<(String, String)>>,
    /// Endpoint host[:port] → credentials and TLS settings.
    #[serde(default)]
    pub hosts: BTreeMap<String, HostConfig>,
    /// Registry host (or `*`) → the host that stands for the registry itself, tried after its
    /// mirrors (containerd's hosts.toml `server`).
    #[serde(default)]
    pub servers: BTreeMap<String, String>,
}

/// Credentials and TLS settings for one registry endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostConfig {
    /// Used when the pull itself brings no credentials.
    pub auth: Option<RegistryAuth>,
    /// PEM files of CAs trusted for this endpoint, besides the node's own roots.
    pub ca_pem: Vec<Vec<u8>>,
    /// Accept any certificate (as k3s's `insecure_skip_verify`).
    pub insecure_skip_verify: bool,
    /// Only for references by digest (a hosts.toml host without the `resolve` capability).
    #[serde(default)]
    pub by_digest_only: bool,
}
