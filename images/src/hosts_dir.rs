//! containerd's registry hosts dir (`config_path`, the `certs.d` layout) read into a
//! [`RegistryConfig`]: one dir per registry (`docker.io`, `registry.local:5000`; `_default` for
//! every registry without a dir of its own), each with a `hosts.toml`:
//!
//! ```toml
//! server = "https://registry-1.docker.io"   # what stands for the registry itself, tried last
//! ca = "ca.pem"                              # (and skip_verify, capabilities) for the server
//!
//! [host."http://127.0.0.1:5000"]             # mirrors, tried in the file's order
//!   capabilities = ["pull", "resolve"]      # without "pull": not used; without "resolve":
//!                                            # only for references by digest
//!   ca = ["/etc/ssl/mirror-ca.pem"]         # a path or a list; relative to the registry's dir
//!   skip_verify = false
//! ```
//!
//! As in containerd, the dir holds no credentials. Client certificates (`client`), extra
//! headers (`header`) and `override_path` are refused: the store's registry client can send
//! neither a certificate nor extra headers, and an endpoint is a registry's root. Every error
//! names the file and the field.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::registries::{ConfigError, EndpointError};
use crate::types::{HostConfig, RegistryConfig};

/// The dir standing for every registry without a dir of its own.
const DEFAULT_DIR: &str = "_default";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostsFile {
    server: Option<String>,
    #[serde(flatten)]
    settings: Settings,
    #[serde(default)]
    host: toml::Table,
}

/// What a host (or the server) may set.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    capabilities: Option<Vec<String>>,
    ca: Option<Paths>,
    skip_verify: Option<bool>,
    client: Option<toml::Value>,
    header: Option<toml::Value>,
    override_path: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Paths {
    One(String),
    Many(Vec<String>),
}

/// A host URL (a scheme is required here): its host[:port] and whether it is plain HTTP.
fn url_host(url: &str) -> Result<(String, bool), EndpointError> {
    if !url.contains("://") {
        return Err(EndpointError::NotAUrl(url.to_string()));
    }
    crate::registries::endpoint(url)
}

/// Why a host's settings cannot be used; `field` is the table's prefix (`host."…".`).
#[derive(Debug, thiserror::Error)]
enum HostError {
    #[error("{field}{what}: {why}")]
    Unsupported {
        field: String,
        what: &'static str,
        why: &'static str,
    },
    #[error("{field}capabilities: unknown capability {cap:?} (pull, resolve, push)")]
    Capability { field: String, cap: String },
    #[error("{field}ca: reading {}: {source}", path.display())]
    ReadCa {
        field: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{field}ca: {} holds no PEM certificate", path.display())]
    NotPem { field: String, path: PathBuf },
}

impl Settings {
    /// The endpoint settings, refusing what the store cannot do. `field` names the table for
    /// errors; relative CA paths are taken from `dir`.
    fn host_config(&self, dir: &Path, field: &str) -> Result<(HostConfig, bool), HostError> {
        let unsupported = |what, why| HostError::Unsupported {
            field: field.to_string(),
            what,
            why,
        };
        if self.client.is_some() {
            return Err(unsupported(
                "client",
                "client certificates are not supported: the built-in store's registry client \
                 cannot present one",
            ));
        }
        if self.header.is_some() {
            return Err(unsupported(
                "header",
                "extra headers are not supported: the built-in store's registry client cannot \
                 send them",
            ));
        }
        if self.override_path == Some(true) {
            return Err(unsupported(
                "override_path",
                "not supported: a host is a registry's root",
            ));
        }
        let caps = self
            .capabilities
            .clone()
            .unwrap_or_else(|| vec!["pull".into(), "resolve".into(), "push".into()]);
        for c in &caps {
            if !matches!(c.as_str(), "pull" | "resolve" | "push") {
                return Err(HostError::Capability {
                    field: field.to_string(),
                    cap: c.clone(),
                });
            }
        }
        let pull = caps.iter().any(|c| c == "pull");
        let mut out = HostConfig {
            insecure_skip_verify: self.skip_verify.unwrap_or(false),
            by_digest_only: !caps.iter().any(|c| c == "resolve"),
            ..Default::default()
        };
        let cas = match &self.ca {
            None => Vec::new(),
            Some(Paths::One(p)) => vec![p.clone()],
            Some(Paths::Many(ps)) => ps.clone(),
        };
        for ca in cas {
            let path = dir.join(&ca);
            let pem = match std::fs::read(&path) {
                Ok(pem) => pem,
                Err(source) => {
                    return Err(HostError::ReadCa {
                        field: field.to_string(),
                        path,
                        source,
                    });
                }
            };
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(HostError::NotPem {
                    field: field.to_string(),
                    path,
                });
            }
            out.ca_pem.push(pem);
        }
        Ok((out, pull))
    }
}

impl RegistryConfig {
    /// Reads a registry hosts dir (see the module's doc) into a config, with the hosts of
    /// `insecure` (the older `nodeletInsecureRegistries`) also allowed over plain HTTP. A dir
    /// without a `hosts.toml` is skipped.
    pub fn from_hosts_dir(dir: &Path, insecure: &[String]) -> Result<RegistryConfig, ConfigError> {
        let fail = |path: PathBuf, reason: String| ConfigError { path, reason };
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| fail(dir.to_path_buf(), format!("reading the hosts dir: {e}")))?
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut config = RegistryConfig {
            insecure: insecure.to_vec(),
            ..Default::default()
        };
        for name in names {
            let registry_dir = dir.join(&name);
            let file = registry_dir.join("hosts.toml");
            let text = match std::fs::read_to_string(&file) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(fail(file, format!("reading: {e}"))),
            };
            let registry = if name == DEFAULT_DIR {
                "*".to_string()
            } else {
                name.clone()
            };
            let parsed: HostsFile =
                toml::from_str(&text).map_err(|e| fail(file.clone(), e.to_string()))?;
            let mut mirrors = Vec::new();
            for (url, value) in &parsed.host {
                let field = format!("host.{url:?}.");
                let settings: Settings = value
                    .clone()
                    .try_into()
                    .map_err(|e| fail(file.clone(), format!("{field} {e}")))?;
                let (host, plain) =
                    url_host(url).map_err(|e| fail(file.clone(), format!("host: {e}")))?;
                let (host_config, pull) = settings
                    .host_config(&registry_dir, &field)
                    .map_err(|e| fail(file.clone(), e.to_string()))?;
                if !pull {
                    continue;
                }
                if plain && !config.insecure.contains(&host) {
                    config.insecure.push(host.clone());
                }
                config.hosts.insert(host.clone(), host_config);
                mirrors.push(host);
            }
            if let Some(server) = &parsed.server {
                let (host, plain) =
                    url_host(server).map_err(|e| fail(file.clone(), format!("server: {e}")))?;
                let (host_config, _) = parsed
                    .settings
                    .host_config(&registry_dir, "")
                    .map_err(|e| fail(file.clone(), e.to_string()))?;
                if plain && !config.insecure.contains(&host) {
                    config.insecure.push(host.clone());
                }
                config.hosts.insert(host.clone(), host_config);
                config.servers.insert(registry.clone(), host);
            } else if parsed.settings.ca.is_some()
                || parsed.settings.skip_verify.is_some()
                || parsed.settings.client.is_some()
                || parsed.settings.header.is_some()
            {
                // Settings for the registry itself, under its own name.
                let (host_config, _) = parsed
                    .settings
                    .host_config(&registry_dir, "")
                    .map_err(|e| fail(file.clone(), e.to_string()))?;
                config.hosts.insert(registry.clone(), host_config);
            }
            config.mirrors.insert(registry, mirrors);
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEM: &str = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";

    fn hosts(dir: &Path, registry: &str, toml: &str) {
        let d = dir.join(registry);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("hosts.toml"), toml).unwrap();
    }

    #[test]
    fn hosts_keep_the_files_order_and_the_server_replaces_the_registry() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("docker.io")).unwrap();
        std::fs::write(dir.path().join("docker.io/ca.pem"), PEM).unwrap();
        hosts(
            dir.path(),
            "docker.io",
            "server = \"https://registry-1.docker.io\"\n\n\
             [host.\"https://z.example\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"ca.pem\"\n\n\
             [host.\"http://127.0.0.1:5000\"]\n  capabilities = [\"pull\"]\n\n\
             [host.\"https://push.example\"]\n  capabilities = [\"push\"]\n\n\
             [host.\"https://a.example\"]\n  skip_verify = true\n",
        );
        hosts(
            dir.path(),
            "_default",
            "server = \"http://127.0.0.1:6000\"\n",
        );
        // A dir without hosts.toml is no registry entry.
        std::fs::create_dir_all(dir.path().join("empty.example")).unwrap();
        let c = RegistryConfig::from_hosts_dir(dir.path(), &["old.example".into()]).unwrap();
        assert_eq!(
            c.mirrors["docker.io"],
            ["z.example", "127.0.0.1:5000", "a.example"]
        );
        assert!(!c.mirrors.contains_key("empty.example"));
        assert_eq!(c.mirrors["*"], Vec::<String>::new());
        assert_eq!(c.servers["docker.io"], "registry-1.docker.io");
        assert_eq!(c.servers["*"], "127.0.0.1:6000");
        assert_eq!(
            c.insecure,
            // `_default` sorts first.
            ["old.example", "127.0.0.1:6000", "127.0.0.1:5000"]
        );
        assert_eq!(c.hosts["z.example"].ca_pem.len(), 1);
        assert!(c.hosts["127.0.0.1:5000"].by_digest_only);
        assert!(!c.hosts["z.example"].by_digest_only);
        assert!(c.hosts["a.example"].insecure_skip_verify);
        assert!(!c.hosts.contains_key("push.example"));
    }

    #[test]
    fn the_example_in_deploy_reads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/registries/certs.d");
        let c = RegistryConfig::from_hosts_dir(&dir, &[]).unwrap();
        assert_eq!(
            c.mirrors["docker.io"],
            ["127.0.0.1:5000", "mirror.example.com"]
        );
        assert_eq!(c.servers["docker.io"], "registry-1.docker.io");
        assert_eq!(c.mirrors["*"], ["cache.example.com"]);
    }

    #[test]
    fn bad_files_are_refused_naming_the_file_and_field() {
        for (toml, want) in [
            ("server = 1", "invalid type"),
            ("servr = \"https://x\"", "unknown field `servr`"),
            (
                "server = \"x.example\"",
                "server: \"x.example\": a host is a URL",
            ),
            (
                "[host.\"https://m/proxy\"]\n",
                "a path (/proxy) is not supported",
            ),
            (
                "[host.\"https://m\"]\n  client = \"/c.pem\"\n",
                "host.\"https://m\".client: client certificates are not supported",
            ),
            (
                "[host.\"https://m\"]\n  header = {X-A = \"b\"}\n",
                "host.\"https://m\".header: extra headers are not supported",
            ),
            (
                "[host.\"https://m\"]\n  override_path = true\n",
                "override_path: not supported",
            ),
            (
                "[host.\"https://m\"]\n  capabilities = [\"fetch\"]\n",
                "unknown capability \"fetch\"",
            ),
            (
                "[host.\"https://m\"]\n  ca = \"nope.pem\"\n",
                "host.\"https://m\".ca: reading",
            ),
        ] {
            let dir = tempfile::tempdir().unwrap();
            hosts(dir.path(), "r.example", toml);
            let err = RegistryConfig::from_hosts_dir(dir.path(), &[])
                .unwrap_err()
                .to_string();
            assert!(err.contains("r.example/hosts.toml"), "{err}");
            assert!(err.contains(want), "{toml:?}: {err}");
        }
        let err = RegistryConfig::from_hosts_dir(Path::new("/nonexistent/certs.d"), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("/nonexistent/certs.d"), "{err}");
    }
}
