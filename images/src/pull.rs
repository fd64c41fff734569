//! Pulling from an OCI distribution registry with `oci-client`: Docker v2 schema 2 and OCI
//! manifests, manifest lists and indexes (resolved to the host platform), mirrors tried before
//! the registry itself, plain HTTP only for hosts configured as insecure and for loopback
//! registries that do not speak TLS. Blobs are streamed to the staging area, hashed on the way,
//! and committed like an import.

use crate::digest::{self, Hasher};
use crate::error::{Error, Result};
use crate::reference::{self, DOCKER_HUB, Reference};
use crate::spec::{self, Descriptor, Manifest, media};
use crate::stage::{Candidate, Layer, Stage};
use crate::store::Store;
use crate::types::{Image, RegistryAuth, RegistryConfig};
use futures::StreamExt;
use oci_client::Client;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use oci_client::errors::{DigestError, OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth as OciAuth;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// Layers downloaded at once.
const PARALLEL_DOWNLOADS: usize = 3;
/// How deep manifest lists may nest.
const MAX_DEPTH: usize = 4;

/// Installs the ring crypto provider for rustls once; another one installed first is fine.
pub(crate) fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// `host[:port]` without any scheme or trailing slash.
fn bare_host(s: &str) -> String {
    let s = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .unwrap_or(s);
    s.trim_end_matches('/').to_string()
}

/// One place to pull from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    /// A mirror (rewrites apply).
    Mirror(String),
    /// The host that stands for the registry itself (containerd's hosts.toml `server`).
    Server(String),
    /// The registry itself.
    Registry,
}

/// Where to pull `domain`'s images from, in order: its mirrors (or `*`'s, when it has no
/// entry of its own), then its server or the registry itself. Hosts that serve references
/// by digest only are skipped for a tag.
fn endpoints(domain: &str, by_digest: bool, config: &RegistryConfig) -> Vec<Endpoint> {
    let aliases: &[&str] = if domain == DOCKER_HUB {
        &[DOCKER_HUB, "index.docker.io", "registry-1.docker.io"]
    } else {
        &[]
    };
    let is_domain = |h: &str| {
        let h = bare_host(h);
        h == domain || aliases.contains(&h.as_str())
    };
    let usable = |h: &str| by_digest || !config.hosts.get(h).is_some_and(|c| c.by_digest_only);
    let mut out: Vec<Endpoint> = Vec::new();
    // `*` stands for every registry that has no entry of its own.
    let own = config.mirrors.keys().any(|h| is_domain(h));
    for (host, mirrors) in &config.mirrors {
        if is_domain(host) || (!own && host == "*") {
            for mirror in mirrors {
                let m = Endpoint::Mirror(bare_host(mirror));
                if !out.contains(&m) && bare_host(mirror) != domain && usable(mirror) {
                    out.push(m);
                }
            }
        }
    }
    let own_server = config.servers.iter().find(|(r, _)| is_domain(r));
    let server = own_server.or_else(|| (!own).then(|| config.servers.get_key_value("*")).flatten());
    match server {
        Some((_, host)) if bare_host(host) != domain => out.push(Endpoint::Server(bare_host(host))),
        _ => out.push(Endpoint::Registry),
    }
    out
}

/// The repository path to ask `domain`'s mirrors for: the first of the registry's rewrites
/// (or `*`'s, when it has no mirror entry of its own) whose pattern matches, else `path`.
fn rewritten(domain: &str, path: &str, config: &RegistryConfig) -> String {
    let own = config.mirrors.contains_key(domain);
    let rules = config
        .rewrites
        .get(domain)
        .or_else(|| (!own).then(|| config.rewrites.get("*")).flatten());
    for (pattern, replacement) in rules.into_iter().flatten() {
        // Patterns were checked when the config was read.
        let Ok(re) = regex::Regex::new(pattern) else {
            continue;
        };
        if re.is_match(path) {
            return re.replace(path, replacement.as_str()).into_owned();
        }
    }
    path.to_string()
}

/// The credentials for `endpoint` (host[:port]): the pull's own when it brings any, else the
/// registries config's for that host.
fn endpoint_auth(given: &RegistryAuth, endpoint: &str, config: &RegistryConfig) -> OciAuth {
    let configured = config.hosts.get(endpoint).and_then(|h| h.auth.as_ref());
    match configured {
        Some(a) if *given == RegistryAuth::default() => oci_auth(a),
        _ => oci_auth(given),
    }
}

/// The client for one endpoint: its plain-HTTP hosts (the configured ones, and the endpoint
/// itself when it is a plain-HTTP loopback registry) and, from the registries config, the
/// endpoint's own CAs and `insecure_skip_verify`.
fn client(
    config: &RegistryConfig,
    reference: &str,
    endpoint: &str,
    plain_loopback: bool,
) -> Result<Client> {
    let mut insecure: Vec<String> = config.insecure.iter().map(|h| bare_host(h)).collect();
    for mirrors in config.mirrors.values() {
        insecure.extend(
            mirrors
                .iter()
                .filter(|m| m.starts_with("http://"))
                .map(|m| bare_host(m)),
        );
    }
    if plain_loopback {
        insecure.push(endpoint.to_string());
    }
    let host = config.hosts.get(endpoint).cloned().unwrap_or_default();
    let client_config = ClientConfig {
        protocol: ClientProtocol::HttpsExcept(insecure),
        accept_invalid_certificates: host.insecure_skip_verify,
        extra_root_certificates: host
            .ca_pem
            .into_iter()
            .map(|data| Certificate {
                encoding: CertificateEncoding::Pem,
                data,
            })
            .collect(),
        // Indexes are resolved here, with variants.
        platform_resolver: None,
        connect_timeout: Some(Duration::from_secs(15)),
        read_timeout: Some(Duration::from_secs(120)),
        ..ClientConfig::default()
    };
    Client::try_from(client_config).map_err(|source| Error::Pull {
        reference: reference.to_string(),
        source,
    })
}

fn oci_auth(auth: &RegistryAuth) -> OciAuth {
    if let Some(token) = auth.registry_token.as_ref().filter(|t| !t.is_empty()) {
        return OciAuth::Bearer(token.clone());
    }
    if let Some(token) = auth.identity_token.as_ref().filter(|t| !t.is_empty()) {
        let user = auth
            .username
            .clone()
            .unwrap_or_else(|| "<token>".to_string());
        return OciAuth::Basic(user, token.clone());
    }
    match (&auth.username, &auth.password) {
        (Some(u), p) if !u.is_empty() => OciAuth::Basic(u.clone(), p.clone().unwrap_or_default()),
        _ => OciAuth::Anonymous,
    }
}

/// Sorts a registry failure into the store's error kinds.
fn classify(reference: &str, registry: &str, source: OciDistributionError) -> Error {
    let reference = reference.to_string();
    enum K {
        NotFound,
        Unavailable,
        Unauthorized,
        Other,
    }
    let kind = match &source {
        OciDistributionError::RequestError(_) | OciDistributionError::IoError(_) => K::Unavailable,
        OciDistributionError::ServerError { code, .. } => match code {
            404 => K::NotFound,
            401 | 403 => K::Unauthorized,
            429 | 500.. => K::Unavailable,
            _ => K::Other,
        },
        OciDistributionError::RegistryError { envelope, .. } => {
            let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
            if codes.iter().any(|c| {
                matches!(
                    c,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NotFound
                )
            }) {
                K::NotFound
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
            {
                K::Unauthorized
            } else if codes
                .iter()
                .any(|c| matches!(c, OciErrorCode::Toomanyrequests))
            {
                K::Unavailable
            } else {
                K::Other
            }
        }
        OciDistributionError::UnauthorizedError { .. }
        | OciDistributionError::AuthenticationFailure(_) => K::Unauthorized,
        OciDistributionError::ImageManifestNotFoundError(_) => K::NotFound,
        OciDistributionError::DigestError(DigestError::VerificationError { expected, actual }) => {
            return Error::DigestMismatch {
                what: format!("content of {reference} from {registry}"),
                expected: expected.clone(),
                actual: actual.clone(),
            };
        }
        _ => K::Other,
    };
    match kind {
        K::NotFound => Error::PullNotFound { reference, source },
        K::Unavailable => Error::RegistryUnavailable {
            reference,
            registry: registry.to_string(),
            source,
        },
        K::Unauthorized => Error::PullUnauthorized { reference, source },
        K::Other => Error::Pull { reference, source },
    }
}

/// One registry endpoint's view of the reference.
struct Fetch<'a> {
    client: &'a Client,
    oref: oci_client::Reference,
    auth: &'a OciAuth,
    reference: String,
    registry: String,
}

impl Fetch<'_> {
    fn err(&self, e: OciDistributionError) -> Error {
        classify(&self.reference, &self.registry, e)
    }

    fn invalid(&self, reason: impl Into<String>) -> Error {
        Error::InvalidManifest {
            reference: self.reference.clone(),
            reason: reason.into(),
        }
    }

    async fn manifest(&self, digest: Option<&str>) -> Result<(Vec<u8>, String)> {
        let oref = match digest {
            Some(d) => self.oref.clone_with_digest(d.to_string()),
            None => self.oref.clone(),
        };
        let (bytes, _) = self
            .client
            .pull_manifest_raw(&oref, self.auth, media::ACCEPTED_MANIFESTS)
            .await
            .map_err(|e| self.err(e))?;
        let actual = digest::sha256_bytes(&bytes);
        if let Some(d) = digest.or(oref.digest()) {
            digest::verify("manifest", d, None, &(actual.clone(), bytes.len() as u64))?;
        }
        Ok((bytes.to_vec(), actual))
    }

    /// Streams a blob to `dest`, checking digest and size.
    async fn blob(&self, desc: &Descriptor, size: u64, dest: PathBuf) -> Result<(String, PathBuf)> {
        let mut stream = self
            .client
            .pull_blob_stream(&self.oref, desc.digest.as_str())
            .await
            .map_err(|e| self.err(e))?;
        let mut file = tokio::fs::File::create(&dest)
            .await
            .map_err(|e| Error::io("creating blob", &dest, e))?;
        let mut hasher = Hasher::default();
        let mut received = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = match chunk {
                Ok(chunk) => chunk,
                // oci-client's own check at the end of the stream: ours below reports it.
                Err(e) if e.get_ref().is_some_and(|i| i.is::<DigestError>()) => break,
                Err(e) => return Err(self.err(OciDistributionError::IoError(e))),
            };
            hasher.update(&chunk);
            received += chunk.len() as u64;
            if received > size {
                // More than the descriptor promised: stop; verify reports the mismatch.
                break;
            }
            file.write_all(&chunk)
                .await
                .map_err(|e| Error::io("writing blob", &dest, e))?;
        }
        file.sync_all()
            .await
            .map_err(|e| Error::io("writing blob", &dest, e))?;
        digest::verify(
            &format!("blob {}", desc.digest),
            &desc.digest,
            Some(size),
            &hasher.finish(),
        )?;
        Ok((desc.digest.clone(), dest))
    }
}

impl Store {
    /// Pulls `reference` from its registry (or a configured mirror) and stores it.
    pub async fn pull(
        &self,
        reference: &str,
        auth: &RegistryAuth,
        config: &RegistryConfig,
    ) -> Result<Image> {
        let parsed = reference::parse(reference)?;
        install_crypto_provider();
        let normalized = parsed.to_string();
        let given = auth;
        let mut stage = Stage::new(&self.inner.paths, "pull")?;
        let endpoints = endpoints(&parsed.domain, parsed.digest.is_some(), config);
        let mut result = None;
        for (i, endpoint) in endpoints.iter().enumerate() {
            // Rewrites apply on mirrors only, never on the registry itself.
            let path = match endpoint {
                Endpoint::Mirror(_) => rewritten(&parsed.domain, &parsed.path, config),
                Endpoint::Server(_) | Endpoint::Registry => parsed.path.clone(),
            };
            let mut oref = match &parsed.digest {
                Some(d) => {
                    oci_client::Reference::with_digest(parsed.domain.clone(), path, d.clone())
                }
                None => oci_client::Reference::with_tag(
                    parsed.domain.clone(),
                    path,
                    parsed.tag.clone().unwrap_or_else(|| "latest".to_string()),
                ),
            };
            if let Endpoint::Mirror(host) | Endpoint::Server(host) = endpoint {
                oref.set_mirror_registry(host.clone());
            }
            let registry = oref.resolve_registry().to_string();
            // The registries config names the registry itself by the name pulls use
            // (`docker.io`) or by the host it resolves to (`index.docker.io`).
            let key = match endpoint {
                Endpoint::Registry if !config.hosts.contains_key(&registry) => {
                    parsed.domain.clone()
                }
                _ => registry.clone(),
            };
            let plain = crate::loopback::plain_loopback(config, &registry).await;
            let client = client(config, &normalized, &key, plain)?;
            let auth = endpoint_auth(given, &key, config);
            let fetch = Fetch {
                client: &client,
                registry,
                oref,
                auth: &auth,
                reference: normalized.clone(),
            };
            match fetch_image(&fetch, &parsed, &mut stage).await {
                Ok(candidate) => {
                    result = Some(candidate);
                    break;
                }
                Err(e) if i + 1 < endpoints.len() => {
                    tracing::warn!(mirror = fetch.registry, error = %e, "mirror failed; trying the next endpoint");
                }
                Err(e) => return Err(e),
            }
        }
        let Some(candidate) = result else {
            return Err(Error::InvalidManifest {
                reference: normalized,
                reason: "no registry endpoint to pull from".to_string(),
            });
        };
        let store = self.clone();
        let images = tokio::task::spawn_blocking(move || {
            let mut stage = stage;
            store.commit(&mut stage, vec![candidate])
        })
        .await
        .map_err(|source| Error::Task {
            op: "committing pulled image",
            source,
        })??;
        images
            .into_iter()
            .next()
            .ok_or_else(|| Error::InvalidManifest {
                reference: normalized,
                reason: "pull committed no image".to_string(),
            })
    }
}

/// Fetches manifest, config and layers into `stage`.
async fn fetch_image(
    fetch: &Fetch<'_>,
    parsed: &Reference,
    stage: &mut Stage,
) -> Result<Candidate> {
    let host = crate::platform::host();
    let (mut bytes, mut digest) = fetch.manifest(None).await?;
    let target_digest = digest.clone();
    let mut chain = BTreeSet::new();
    let mut depth = 0;
    let (config_desc, layer_descs) = loop {
        stage.add_bytes("manifest", &digest, None, &bytes)?;
        match spec::parse_manifest(&bytes, None).map_err(|r| fetch.invalid(r.to_string()))? {
            Manifest::Image { config, layers } => break (config, layers),
            Manifest::Index(children) => {
                depth += 1;
                if depth > MAX_DEPTH {
                    return Err(fetch.invalid("manifest lists nested too deeply"));
                }
                let child = crate::platform::select(&host, &children).ok_or_else(|| {
                    Error::NoMatchingPlatform {
                        reference: fetch.reference.clone(),
                        platform: host.to_string(),
                    }
                })?;
                chain.insert(digest.clone());
                let (child_bytes, child_digest) = fetch.manifest(Some(&child.digest)).await?;
                let size = child.size().map_err(|r| fetch.invalid(r.to_string()))?;
                digest::verify(
                    "manifest",
                    &child.digest,
                    Some(size),
                    &(child_digest.clone(), child_bytes.len() as u64),
                )?;
                bytes = child_bytes;
                digest = child_digest;
            }
        }
    };
    if !config_desc.media_type.is_empty()
        && config_desc.media_type != media::OCI_CONFIG
        && config_desc.media_type != media::DOCKER_CONFIG
    {
        return Err(fetch.invalid(format!(
            "not a container image (config media type {})",
            config_desc.media_type
        )));
    }
    digest::hex_of(&config_desc.digest, "config")?;
    let config_size = config_desc
        .size()
        .map_err(|r| fetch.invalid(r.to_string()))?;
    if config_size > crate::source::MAX_JSON {
        return Err(fetch.invalid("image config is too large"));
    }
    let config_path = stage.scratch("config");
    let (_, config_path) = fetch.blob(&config_desc, config_size, config_path).await?;
    stage.add_verified(&config_desc.digest, &config_path)?;
    let config_bytes = stage.read_blob(&config_desc.digest, crate::source::MAX_JSON)?;
    let config = spec::parse_config(&config_bytes).map_err(|r| fetch.invalid(r.to_string()))?;
    if config.rootfs.diff_ids.len() != layer_descs.len() {
        return Err(fetch.invalid(format!(
            "manifest has {} layers but its config {} diff_ids",
            layer_descs.len(),
            config.rootfs.diff_ids.len()
        )));
    }
    let mut layers = Vec::new();
    let mut downloads = Vec::new();
    for (desc, diff_id) in layer_descs.iter().zip(&config.rootfs.diff_ids) {
        digest::hex_of(&desc.digest, "layer")?;
        let size = desc.size().map_err(|r| fetch.invalid(r.to_string()))?;
        layers.push(Layer {
            digest: desc.digest.clone(),
            size,
            diff_id: diff_id.clone(),
        });
        let queued = downloads
            .iter()
            .any(|(d, _, _): &(Descriptor, u64, PathBuf)| d.digest == desc.digest);
        if !stage.has_blob(&desc.digest) && !queued {
            downloads.push((desc.clone(), size, stage.scratch("layer")));
        }
    }
    let done: Vec<Result<(String, PathBuf)>> = futures::stream::iter(downloads)
        .map(|(desc, size, path)| async move { fetch.blob(&desc, size, path).await })
        .buffer_unordered(PARALLEL_DOWNLOADS)
        .collect()
        .await;
    for item in done {
        let (d, path) = item?;
        stage.add_verified(&d, &path)?;
    }
    let mut blobs: BTreeSet<String> = layers.iter().map(|l| l.digest.clone()).collect();
    blobs.extend(chain);
    blobs.insert(digest.clone());
    blobs.insert(config_desc.digest.clone());
    let repo = parsed.name();
    let names = match (&parsed.tag, &parsed.digest) {
        (Some(tag), None) => vec![format!("{repo}:{tag}")],
        _ => Vec::new(),
    };
    Ok(Candidate {
        names,
        digest_repos: vec![repo],
        target_digest,
        manifest_digest: digest,
        config_digest: config_desc.digest.clone(),
        config_size,
        config,
        layers,
        blobs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::HostConfig;

    fn config() -> RegistryConfig {
        let mut c = RegistryConfig::default();
        c.mirrors.insert(
            "docker.io".into(),
            vec!["http://m1:5000".into(), "m2".into(), "digests".into()],
        );
        c.mirrors.insert("*".into(), vec!["any".into()]);
        c.mirrors.insert("own.example".into(), vec![]);
        c.servers.insert("docker.io".into(), "hub.example".into());
        c.servers.insert("*".into(), "default.example".into());
        c.hosts.insert(
            "digests".into(),
            HostConfig {
                by_digest_only: true,
                ..Default::default()
            },
        );
        c
    }

    #[test]
    fn mirrors_come_first_then_the_server_or_the_registry() {
        use Endpoint::*;
        let c = config();
        assert_eq!(
            endpoints("docker.io", false, &c),
            [
                Mirror("m1:5000".into()),
                Mirror("m2".into()),
                Server("hub.example".into())
            ]
        );
        // A host without `resolve` serves pulls by digest only.
        assert_eq!(
            endpoints("docker.io", true, &c),
            [
                Mirror("m1:5000".into()),
                Mirror("m2".into()),
                Mirror("digests".into()),
                Server("hub.example".into())
            ]
        );
        // `*` (and its server) for registries without an entry of their own.
        assert_eq!(
            endpoints("quay.io", false, &c),
            [Mirror("any".into()), Server("default.example".into())]
        );
        assert_eq!(endpoints("own.example", false, &c), [Registry]);
        assert_eq!(
            endpoints("quay.io", false, &RegistryConfig::default()),
            [Registry]
        );
    }
}
