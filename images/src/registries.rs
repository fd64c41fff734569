//! The registries config file, in k3s's `registries.yaml` shape, read into a
//! [`RegistryConfig`]:
//!
//! ```yaml
//! mirrors:
//!   docker.io:                      # a registry, or "*" for every registry without an entry
//!     endpoint:                     # tried in order; the registry itself is tried last
//!       - http://127.0.0.1:5000     # http:// is plain HTTP; https:// or no scheme is TLS
//!       - https://mirror.example.com
//!     rewrite:                      # on mirror endpoints only, first matching pattern
//!       "^library/(.*)": "mirrored/$1"
//! configs:
//!   mirror.example.com:             # an endpoint's host[:port]
//!     auth: {username: u, password: p}   # or auth: base64(user:pass), or identity_token
//!     tls: {ca_file: /etc/ssl/mirror-ca.pem, insecure_skip_verify: false}
//! ```
//!
//! Client certificates (`cert_file`, `key_file`) are refused: the store's registry client
//! cannot present one. Every error names the file and the field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine;
use serde::Deserialize;

use crate::types::{HostConfig, RegistryAuth, RegistryConfig};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    mirrors: BTreeMap<String, Mirror>,
    #[serde(default)]
    configs: BTreeMap<String, Host>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Mirror {
    #[serde(default)]
    endpoint: Vec<String>,
    #[serde(default)]
    rewrite: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Host {
    auth: Option<Auth>,
    tls: Option<Tls>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Auth {
    username: Option<String>,
    password: Option<String>,
    /// base64 of `username:password`, as in a docker config.
    auth: Option<String>,
    identity_token: Option<String>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Tls {
    cert_file: Option<String>,
    key_file: Option<String>,
    ca_file: Option<String>,
    #[serde(default)]
    insecure_skip_verify: bool,
}

/// What is wrong with a registries config file.
#[derive(Debug, thiserror::Error)]
#[error("registries config {}: {reason}", path.display())]
pub struct ConfigError {
    pub path: PathBuf,
    pub reason: String,
}

/// Why an endpoint cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EndpointError {
    #[error("endpoint {0:?}: only http:// and https:// are supported")]
    Scheme(String),
    #[error("endpoint {0:?} has no host")]
    NoHost(String),
    #[error("endpoint {url:?}: a path (/{path}) is not supported; give the registry's root")]
    Path { url: String, path: String },
    #[error("{0:?}: a host is a URL (http:// or https://)")]
    NotAUrl(String),
}

/// An endpoint as written (`http://h:p`, `https://h`, `h:p`): its host[:port] and whether it is
/// plain HTTP. A path other than `/` or `/v2` is refused: the endpoint is a registry's root.
pub(crate) fn endpoint(url: &str) -> Result<(String, bool), EndpointError> {
    let (plain, rest) = if let Some(r) = url.strip_prefix("http://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("https://") {
        (false, r)
    } else if url.contains("://") {
        return Err(EndpointError::Scheme(url.to_string()));
    } else {
        (false, url)
    };
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    if host.is_empty() {
        return Err(EndpointError::NoHost(url.to_string()));
    }
    if !matches!(path.trim_end_matches('/'), "" | "v2") {
        return Err(EndpointError::Path {
            url: url.to_string(),
            path: path.to_string(),
        });
    }
    Ok((host.to_string(), plain))
}

impl RegistryConfig {
    /// Reads a registries config file (see the module's doc) into a config, with the hosts of
    /// `insecure` (the older `nodeletInsecureRegistries`) also allowed over plain HTTP.
    pub fn from_file(path: &Path, insecure: &[String]) -> Result<RegistryConfig, ConfigError> {
        let fail = |reason: String| ConfigError {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| fail(format!("reading: {e}")))?;
        let file: File = serde_norway::from_str(&text).map_err(|e| fail(e.to_string()))?;
        let mut config = RegistryConfig {
            insecure: insecure.to_vec(),
            ..Default::default()
        };
        for (registry, mirror) in file.mirrors {
            let mut endpoints = Vec::new();
            for url in &mirror.endpoint {
                let (host, plain) =
                    endpoint(url).map_err(|e| fail(format!("mirrors.{registry:?}: {e}")))?;
                if plain && !config.insecure.contains(&host) {
                    config.insecure.push(host.clone());
                }
                endpoints.push(host);
            }
            for pattern in mirror.rewrite.keys() {
                regex::Regex::new(pattern).map_err(|e| {
                    fail(format!(
                        "mirrors.{registry:?}.rewrite: pattern {pattern:?}: {e}"
                    ))
                })?;
            }
            if !mirror.rewrite.is_empty() {
                config
                    .rewrites
                    .insert(registry.clone(), mirror.rewrite.into_iter().collect());
            }
            config.mirrors.insert(registry, endpoints);
        }
        for (host, h) in file.configs {
            let at = |field: &str| format!("configs.{host:?}.{field}");
            let mut out = HostConfig::default();
            if let Some(a) = h.auth {
                let mut auth = RegistryAuth {
                    username: a.username.filter(|u| !u.is_empty()),
                    password: a.password,
                    identity_token: a.identity_token.filter(|t| !t.is_empty()),
                    registry_token: None,
                };
                if let Some(b64) = a.auth.filter(|s| !s.is_empty()) {
                    let decoded = base64::engine::general_purpose::STANDARD
                        .decode(b64.trim())
                        .ok()
                        .and_then(|b| String::from_utf8(b).ok())
                        .ok_or_else(|| {
                            fail(format!("{}: not base64 of user:password", at("auth.auth")))
                        })?;
                    let (user, pass) = decoded.split_once(':').ok_or_else(|| {
                        fail(format!("{}: not base64 of user:password", at("auth.auth")))
                    })?;
                    auth.username = Some(user.to_string());
                    auth.password = Some(pass.to_string());
                }
                out.auth = Some(auth);
            }
            if let Some(tls) = h.tls {
                if tls.cert_file.is_some() || tls.key_file.is_some() {
                    return Err(fail(format!(
                        "{}: client certificates are not supported: the built-in store's registry \
                         client cannot present one",
                        at("tls.cert_file")
                    )));
                }
                if let Some(ca) = tls.ca_file.filter(|c| !c.is_empty()) {
                    let pem = std::fs::read(&ca)
                        .map_err(|e| fail(format!("{}: reading {ca}: {e}", at("tls.ca_file"))))?;
                    if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                        return Err(fail(format!(
                            "{}: {ca} holds no PEM certificate",
                            at("tls.ca_file")
                        )));
                    }
                    out.ca_pem.push(pem);
                }
                out.insecure_skip_verify = tls.insecure_skip_verify;
            }
            let (host, _) = endpoint(&host).map_err(|e| fail(format!("configs: {e}")))?;
            config.hosts.insert(host, out);
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<RegistryConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registries.yaml");
        std::fs::write(&path, yaml).unwrap();
        RegistryConfig::from_file(&path, &["old.example:5000".to_string()])
    }

    #[test]
    fn mirrors_rewrites_and_configs_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(
            &ca,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let c = parse(&format!(
            "mirrors:\n  docker.io:\n    endpoint: [\"http://127.0.0.1:5000\", \"https://m.example/v2\", \"m2.example:443\"]\n    rewrite:\n      \"^library/(.*)\": \"mirrored/$1\"\n  \"*\":\n    endpoint: [\"https://any.example\"]\nconfigs:\n  m.example:\n    auth: {{auth: {}}}\n    tls: {{ca_file: {}, insecure_skip_verify: true}}\n",
            base64::engine::general_purpose::STANDARD.encode("alice:s3cret"),
            ca.display()
        ))
        .unwrap();
        assert_eq!(
            c.mirrors["docker.io"],
            ["127.0.0.1:5000", "m.example", "m2.example:443"]
        );
        assert_eq!(c.mirrors["*"], ["any.example"]);
        // Plain-HTTP endpoints join the insecure hosts given.
        assert_eq!(c.insecure, ["old.example:5000", "127.0.0.1:5000"]);
        assert_eq!(
            c.rewrites["docker.io"],
            [("^library/(.*)".to_string(), "mirrored/$1".to_string())]
        );
        let h = &c.hosts["m.example"];
        let auth = h.auth.as_ref().unwrap();
        assert_eq!(auth.username.as_deref(), Some("alice"));
        assert_eq!(auth.password.as_deref(), Some("s3cret"));
        assert!(h.insecure_skip_verify);
        assert_eq!(h.ca_pem.len(), 1);
        // Credentials never show in a debug print.
        assert!(!format!("{c:?}").contains("s3cret"));
    }

    #[test]
    fn the_example_in_deploy_reads() {
        let file =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/registries/registries.yaml");
        let c = RegistryConfig::from_file(&file, &[]).unwrap();
        assert_eq!(
            c.mirrors["docker.io"],
            ["127.0.0.1:5000", "mirror.example.com"]
        );
        assert_eq!(c.mirrors["*"], ["cache.example.com"]);
        assert!(c.hosts["mirror.example.com"].auth.is_some());
        assert!(!format!("{c:?}").contains("change-me"));
    }

    #[test]
    fn bad_files_are_refused_naming_the_field() {
        for (yaml, want) in [
            ("mirrors: [1]", "mirrors"),
            ("mirror: {}", "unknown field `mirror`"),
            (
                "mirrors:\n  docker.io:\n    endpoint: [\"ftp://x\"]",
                "only http:// and https://",
            ),
            (
                "mirrors:\n  docker.io:\n    endpoint: [\"https://x/proxy/docker\"]",
                "a path (/proxy/docker) is not supported",
            ),
            (
                "mirrors:\n  docker.io:\n    rewrite: {\"(\": \"x\"}",
                "mirrors.\"docker.io\".rewrite: pattern \"(\"",
            ),
            (
                "configs:\n  r.example:\n    tls: {cert_file: /c.pem, key_file: /k.pem}",
                "configs.\"r.example\".tls.cert_file: client certificates are not supported",
            ),
            (
                "configs:\n  r.example:\n    tls: {ca_file: /nonexistent/ca.pem}",
                "configs.\"r.example\".tls.ca_file: reading /nonexistent/ca.pem",
            ),
            (
                "configs:\n  r.example:\n    auth: {auth: \"!!\"}",
                "configs.\"r.example\".auth.auth: not base64",
            ),
        ] {
            let err = parse(yaml).unwrap_err().to_string();
            assert!(err.contains("registries.yaml"), "{err}");
            assert!(err.contains(want), "{yaml:?}: {err}");
        }
    }
}
