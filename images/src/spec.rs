//! The JSON documents of OCI and Docker images that the store reads: descriptors, manifests,
//! indexes/manifest lists and image configs, parsed leniently (unknown fields ignored) and
//! checked for the parts the store relies on.

use crate::reference::InvalidPart;
use crate::types::ImageConfig;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Why a descriptor, manifest or image config cannot be used. The caller says which document
/// it was in its own error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DocumentError {
    #[error("descriptor {0} has negative size")]
    NegativeSize(String),
    #[error("manifest is not valid JSON: {0}")]
    ManifestJson(#[source] serde_json::Error),
    #[error("docker schema 1 manifests are not supported")]
    Schema1,
    #[error("unsupported manifest schemaVersion {0}")]
    SchemaVersion(i64),
    #[error("unsupported manifest media type {0:?}")]
    MediaType(String),
    #[error("index has no \"manifests\"")]
    NoManifests,
    #[error("image manifest has no \"config\"")]
    NoConfig,
    #[error("image config is not valid: {0}")]
    ConfigJson(#[source] serde_json::Error),
    #[error("image config rootfs type is {0:?}, not \"layers\"")]
    RootfsType(String),
    #[error("image config diff_id: {0}")]
    DiffId(#[source] InvalidPart),
}

/// Media types the store understands.
pub(crate) mod media {
    pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
    pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
    pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
    pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
    pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
    pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
    pub const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";
    pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
    pub const DOCKER_SCHEMA1: &str = "application/vnd.docker.distribution.manifest.v1+json";
    pub const DOCKER_SCHEMA1_SIGNED: &str =
        "application/vnd.docker.distribution.manifest.v1+prettyjws";

    /// Manifest types asked for from registries, image manifests and indexes alike.
    pub const ACCEPTED_MANIFESTS: &[&str] =
        &[OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST];
}

/// Annotation keys that name an image in an OCI layout's index.json.
pub(crate) const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";
pub(crate) const ANNOTATION_CONTAINERD_NAME: &str = "io.containerd.image.name";

/// A content descriptor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urls: Option<Vec<String>>,
}

impl Descriptor {
    /// The size, which must not be negative.
    pub fn size(&self) -> Result<u64, DocumentError> {
        u64::try_from(self.size).map_err(|_| DocumentError::NegativeSize(self.digest.clone()))
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }
}

/// A platform in an index entry.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Platform {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawManifest {
    #[serde(default)]
    schema_version: i64,
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    config: Option<Descriptor>,
    #[serde(default)]
    layers: Option<Vec<Descriptor>>,
    #[serde(default)]
    manifests: Option<Vec<Descriptor>>,
}

/// A parsed manifest document: either an index of manifests or one image manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Manifest {
    Index(Vec<Descriptor>),
    Image {
        config: Descriptor,
        layers: Vec<Descriptor>,
    },
}

/// Parses a manifest or index. `declared` is the media type from the descriptor or HTTP header.
pub(crate) fn parse_manifest(
    bytes: &[u8],
    declared: Option<&str>,
) -> Result<Manifest, DocumentError> {
    let raw: RawManifest = serde_json::from_slice(bytes).map_err(DocumentError::ManifestJson)?;
    let media_type = raw
        .media_type
        .as_deref()
        .or(declared)
        .filter(|m| !m.is_empty());
    if matches!(
        media_type,
        Some(media::DOCKER_SCHEMA1) | Some(media::DOCKER_SCHEMA1_SIGNED)
    ) || raw.schema_version == 1
    {
        return Err(DocumentError::Schema1);
    }
    if raw.schema_version != 2 {
        return Err(DocumentError::SchemaVersion(raw.schema_version));
    }
    let is_index = match media_type {
        Some(media::OCI_INDEX) | Some(media::DOCKER_LIST) => true,
        Some(media::OCI_MANIFEST) | Some(media::DOCKER_MANIFEST) => false,
        Some(other) => return Err(DocumentError::MediaType(other.to_string())),
        None => raw.manifests.is_some() && raw.config.is_none(),
    };
    if is_index {
        let manifests = raw.manifests.ok_or(DocumentError::NoManifests)?;
        return Ok(Manifest::Index(manifests));
    }
    let config = raw.config.ok_or(DocumentError::NoConfig)?;
    Ok(Manifest::Image {
        config,
        layers: raw.layers.unwrap_or_default(),
    })
}

/// An image config blob.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct ConfigFile {
    #[serde(default)]
    pub architecture: Option<String>,
    #[serde(default)]
    pub os: Option<String>,
    #[serde(default)]
    pub config: Option<RunConfig>,
    pub rootfs: RootFs,
}

/// The `rootfs` of an image config.
#[derive(Debug, Clone, Default, Deserialize)]
pub(crate) struct RootFs {
    #[serde(default, rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// The `config` of an image config: what to run.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub(crate) struct RunConfig {
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub stop_signal: Option<String>,
    #[serde(default)]
    pub volumes: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(default)]
    pub exposed_ports: Option<BTreeMap<String, serde_json::Value>>,
}

/// Parses a config blob and checks its rootfs.
pub(crate) fn parse_config(bytes: &[u8]) -> Result<ConfigFile, DocumentError> {
    let config: ConfigFile = serde_json::from_slice(bytes).map_err(DocumentError::ConfigJson)?;
    if config.rootfs.kind != "layers" {
        return Err(DocumentError::RootfsType(config.rootfs.kind));
    }
    for diff_id in &config.rootfs.diff_ids {
        crate::reference::check_digest(diff_id).map_err(DocumentError::DiffId)?;
    }
    Ok(config)
}

impl ConfigFile {
    /// The runtime parts of the config in the crate's own type.
    pub fn image_config(&self) -> ImageConfig {
        let Some(c) = &self.config else {
            return ImageConfig::default();
        };
        let non_empty = |s: &Option<String>| s.clone().filter(|s| !s.is_empty());
        ImageConfig {
            user: non_empty(&c.user),
            env: c.env.clone().unwrap_or_default(),
            entrypoint: c.entrypoint.clone().unwrap_or_default(),
            cmd: c.cmd.clone().unwrap_or_default(),
            working_dir: non_empty(&c.working_dir),
            labels: c.labels.clone().unwrap_or_default(),
            stop_signal: non_empty(&c.stop_signal),
            volumes: c.volumes.iter().flat_map(|v| v.keys().cloned()).collect(),
            exposed_ports: c
                .exposed_ports
                .iter()
                .flat_map(|v| v.keys().cloned())
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_manifests_and_indexes() {
        let m = br#"{"schemaVersion":2,"mediaType":"application/vnd.docker.distribution.manifest.v2+json",
            "config":{"mediaType":"x","digest":"sha256:aa","size":3},"layers":[{"mediaType":"y","digest":"sha256:bb","size":4}]}"#;
        match parse_manifest(m, None).unwrap() {
            Manifest::Image { config, layers } => {
                assert_eq!(config.size, 3);
                assert_eq!(layers.len(), 1);
            }
            other => panic!("{other:?}"),
        }
        let i = br#"{"schemaVersion":2,"manifests":[{"digest":"sha256:aa","size":1,"platform":{"os":"linux","architecture":"arm64","variant":"v8"}}]}"#;
        match parse_manifest(i, None).unwrap() {
            Manifest::Index(entries) => {
                assert_eq!(entries[0].platform.as_ref().unwrap().architecture, "arm64")
            }
            other => panic!("{other:?}"),
        }
        let s1 = br#"{"schemaVersion":1,"fsLayers":[]}"#;
        assert_eq!(
            parse_manifest(s1, None).unwrap_err().to_string(),
            "docker schema 1 manifests are not supported"
        );
        assert!(parse_manifest(b"{", None).is_err());
        let odd =
            br#"{"schemaVersion":2,"mediaType":"text/plain","config":{"digest":"x","size":1}}"#;
        assert_eq!(
            parse_manifest(odd, None).unwrap_err().to_string(),
            "unsupported manifest media type \"text/plain\""
        );
    }

    #[test]
    fn config_maps_to_image_config() {
        let c = br#"{"architecture":"amd64","os":"linux","config":{"User":"1000:1000","Env":["A=b"],
            "Entrypoint":null,"Cmd":["sh"],"WorkingDir":"","Labels":{"k":"v"},"StopSignal":"SIGQUIT",
            "Volumes":{"/data":{}},"ExposedPorts":{"80/tcp":{}}},"rootfs":{"type":"layers","diff_ids":[]}}"#;
        let cfg = parse_config(c).unwrap().image_config();
        assert_eq!(cfg.user.as_deref(), Some("1000:1000"));
        assert_eq!(cfg.env, vec!["A=b"]);
        assert!(cfg.entrypoint.is_empty());
        assert_eq!(cfg.cmd, vec!["sh"]);
        assert_eq!(cfg.working_dir, None);
        assert_eq!(cfg.labels.get("k").map(String::as_str), Some("v"));
        assert_eq!(cfg.stop_signal.as_deref(), Some("SIGQUIT"));
        assert_eq!(cfg.volumes, vec!["/data"]);
        assert_eq!(cfg.exposed_ports, vec!["80/tcp"]);
        let bad = br#"{"rootfs":{"type":"layers","diff_ids":["sha256:zz"]}}"#;
        assert!(parse_config(bad).is_err());
    }

    #[test]
    fn unusable_documents_say_why() {
        let negative = Descriptor {
            digest: "sha256:aa".into(),
            size: -1,
            ..Descriptor::default()
        };
        let manifest = |json: &str| {
            parse_manifest(json.as_bytes(), None)
                .unwrap_err()
                .to_string()
        };
        let config = |json: &str| parse_config(json.as_bytes()).unwrap_err().to_string();
        for (got, want) in [
            (
                negative.size().unwrap_err().to_string(),
                "descriptor sha256:aa has negative size",
            ),
            (manifest("{}"), "unsupported manifest schemaVersion 0"),
            (
                manifest(&format!(
                    r#"{{"schemaVersion":2,"mediaType":"{}"}}"#,
                    media::OCI_INDEX
                )),
                r#"index has no "manifests""#,
            ),
            (
                manifest(&format!(
                    r#"{{"schemaVersion":2,"mediaType":"{}"}}"#,
                    media::OCI_MANIFEST
                )),
                r#"image manifest has no "config""#,
            ),
            (
                config(r#"{"rootfs":{"type":"other","diff_ids":[]}}"#),
                r#"image config rootfs type is "other", not "layers""#,
            ),
            (
                config(r#"{"rootfs":{"type":"layers","diff_ids":["sha256:zz"]}}"#),
                r#"image config diff_id: digest "sha256:zz" is not 64 lower-case hex characters"#,
            ),
        ] {
            assert_eq!(got, want);
        }
        assert!(manifest("{").starts_with("manifest is not valid JSON: "));
        assert!(config("[").starts_with("image config is not valid: "));
    }
}
