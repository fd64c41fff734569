//! The kubelet server's part of the configuration: `address`, `port`, the TLS files and
//! settings, `authentication`, `authorization`, `healthzBindAddress`/`healthzPort`,
//! `readOnlyPort` and `enableSystemLogHandler`, with the v1beta1 defaults (anonymous requests
//! refused, webhook token authentication, webhook authorization).

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;
use serde::de::Deserializer;
use serde_json::Value;

use super::{Error, Shaped, Typed, get, invalid, unknown, wrong_type};

/// How the server authorizes requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthzMode {
    /// Every authenticated request is allowed.
    AlwaysAllow,
    /// SubjectAccessReview against the API server.
    Webhook,
}

/// The kubelet server's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// `address`: where the HTTPS server listens.
    pub address: IpAddr,
    /// `port`: its port (0: any free port, a nodelet extension for tests; the Node advertises
    /// the one bound).
    pub port: u16,
    /// `readOnlyPort`: a plain HTTP server, without authentication, of what only reads (health,
    /// pods, metrics, stats), as upstream's read-only port; 0 (the default) for none.
    pub read_only_port: u16,
    /// `healthzBindAddress` and `healthzPort` (0: no healthz server).
    pub healthz_address: IpAddr,
    pub healthz_port: u16,
    /// `tlsCertFile`/`tlsPrivateKeyFile`; unset: a self-signed certificate in the root dir.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_private_key_file: Option<PathBuf>,
    /// `serverTLSBootstrap`: without `tlsCertFile`, the serving certificate comes from a CSR
    /// (signer `kubernetes.io/kubelet-serving`) and is rotated; until it is issued the server
    /// refuses connections.
    pub tls_bootstrap: bool,
    /// `tlsMinVersion`: `VersionTLS12` (the default here: rustls speaks 1.2 and 1.3) or
    /// `VersionTLS13`.
    pub tls13_only: bool,
    /// `tlsCipherSuites`: IANA names of the TLS 1.2 suites allowed (empty: rustls's defaults).
    pub tls_cipher_suites: Vec<String>,
    /// `authentication.anonymous.enabled`.
    pub anonymous: bool,
    /// `authentication.webhook.enabled` and `cacheTTL`.
    pub token_webhook: bool,
    pub token_cache_ttl: Duration,
    /// `authentication.x509.clientCAFile`.
    pub client_ca_file: Option<PathBuf>,
    /// `authorization.mode` and the webhook's caches.
    pub authz_mode: AuthzMode,
    pub authz_allowed_ttl: Duration,
    pub authz_denied_ttl: Duration,
    /// `enableSystemLogHandler`: `/logs/` serves the node's log directory.
    pub system_log_handler: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            address: IpAddr::from([0, 0, 0, 0]),
            port: 10250,
            read_only_port: 0,
            healthz_address: IpAddr::from([127, 0, 0, 1]),
            healthz_port: 10248,
            tls_cert_file: None,
            tls_private_key_file: None,
            tls_bootstrap: false,
            tls13_only: false,
            tls_cipher_suites: Vec::new(),
            anonymous: false,
            token_webhook: true,
            token_cache_ttl: Duration::from_secs(120),
            client_ca_file: None,
            authz_mode: AuthzMode::Webhook,
            authz_allowed_ttl: Duration::from_secs(300),
            authz_denied_ttl: Duration::from_secs(30),
            system_log_handler: true,
        }
    }
}

impl ServerConfig {
    /// The settings of a kubelet started without a configuration file: the command line's
    /// legacy defaults (anonymous requests allowed, no token webhook, `AlwaysAllow`), as
    /// upstream's `applyLegacyDefaults`.
    pub fn legacy() -> Self {
        ServerConfig {
            anonymous: true,
            token_webhook: false,
            authz_mode: AuthzMode::AlwaysAllow,
            ..Default::default()
        }
    }
}

impl ServerConfig {
    /// For a kubelet embedded in another program (tests, benchmarks): the server on
    /// 127.0.0.1 at any free port, no healthz server, the legacy authentication defaults.
    pub fn loopback_any_port() -> Self {
        ServerConfig {
            address: IpAddr::from([127, 0, 0, 1]),
            port: 0,
            healthz_port: 0,
            ..Self::legacy()
        }
    }
}

/// The server's fields as written (see `RawConfig`).
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(super) struct RawServer {
    address: Option<Typed<IpAddr>>,
    port: Option<Typed<i64>>,
    read_only_port: Option<Typed<i64>>,
    healthz_bind_address: Option<Typed<IpAddr>>,
    healthz_port: Option<Typed<i64>>,
    tls_cert_file: Option<Typed<String>>,
    tls_private_key_file: Option<Typed<String>>,
    #[serde(rename = "serverTLSBootstrap")]
    server_tls_bootstrap: Option<Typed<bool>>,
    tls_min_version: Option<Typed<String>>,
    tls_cipher_suites: Option<Strings>,
    authentication: Option<Nested>,
    authorization: Option<Nested>,
    enable_system_log_handler: Option<Typed<bool>>,
}

/// A list of strings.
pub(super) struct Strings(Vec<String>);

impl<'de> Deserialize<'de> for Strings {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v: Vec<Typed<String>> = d.deserialize_any(Shaped::list("a list of strings"))?;
        Ok(Strings(v.into_iter().map(|Typed(s)| s).collect()))
    }
}

/// A nested mapping, read as JSON and checked field by field.
pub(super) struct Nested(serde_json::Map<String, Value>);

impl<'de> Deserialize<'de> for Nested {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Shaped::mapping("a mapping")).map(Nested)
    }
}

fn port(field: &str, v: Option<i64>, default: u16, zero_ok: bool) -> Result<u16, Error> {
    match v {
        None => Ok(default),
        Some(0) if zero_ok => Ok(0),
        Some(n) => u16::try_from(n)
            .ok()
            .filter(|p| *p > 0 || zero_ok)
            .ok_or_else(|| invalid(field, format!("{n} is not a valid port"))),
    }
}

/// Takes `path` (dotted) out of `map`; what is left is warned about.
fn take(map: &mut serde_json::Map<String, Value>, key: &str) -> Option<Value> {
    map.remove(key).filter(|v| !v.is_null())
}

fn bool_at(v: Option<Value>, field: &str) -> Result<Option<bool>, Error> {
    match v {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(b)),
        Some(other) => Err(invalid(field, wrong_type("true or false", other))),
    }
}

fn string_at(v: Option<Value>, field: &str) -> Result<Option<String>, Error> {
    match v {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(other) => Err(invalid(field, wrong_type("a string", other))),
    }
}

fn duration_at(v: Option<Value>, field: &str) -> Result<Option<Duration>, Error> {
    string_at(v, field)?
        .map(|s| super::parse_duration(&s).map_err(|e| invalid(field, e)))
        .transpose()
}

fn mapping_at(v: Option<Value>, field: &str) -> Result<serde_json::Map<String, Value>, Error> {
    match v {
        None => Ok(serde_json::Map::new()),
        Some(Value::Object(m)) => Ok(m),
        Some(other) => Err(invalid(field, wrong_type("a mapping", other))),
    }
}

fn leftovers(map: &serde_json::Map<String, Value>, prefix: &str, warnings: &mut Vec<String>) {
    warnings.extend(map.keys().map(|k| unknown(&format!("{prefix}.{k}"))));
}

impl RawServer {
    pub(super) fn into_config(self, warnings: &mut Vec<String>) -> Result<ServerConfig, Error> {
        let d = ServerConfig::default();
        let tls13_only = match get(self.tls_min_version).as_deref() {
            None | Some("") | Some("VersionTLS12") => false,
            Some("VersionTLS13") => true,
            Some(v @ ("VersionTLS10" | "VersionTLS11")) => {
                return Err(invalid(
                    "tlsMinVersion",
                    format!("{v} is not supported: rustls speaks TLS 1.2 and 1.3 only"),
                ));
            }
            Some(v) => return Err(invalid("tlsMinVersion", format!("unknown version {v:?}"))),
        };
        let mut c = ServerConfig {
            address: get(self.address).unwrap_or(d.address),
            port: port("port", get(self.port), d.port, true)?,
            read_only_port: port("readOnlyPort", get(self.read_only_port), 0, true)?,
            healthz_address: get(self.healthz_bind_address).unwrap_or(d.healthz_address),
            healthz_port: port("healthzPort", get(self.healthz_port), d.healthz_port, true)?,
            tls_cert_file: get(self.tls_cert_file).map(PathBuf::from),
            tls_private_key_file: get(self.tls_private_key_file).map(PathBuf::from),
            tls_bootstrap: get(self.server_tls_bootstrap).unwrap_or(d.tls_bootstrap),
            tls13_only,
            tls_cipher_suites: self
                .tls_cipher_suites
                .map(|Strings(s)| s)
                .unwrap_or_default(),
            system_log_handler: get(self.enable_system_log_handler).unwrap_or(d.system_log_handler),
            ..d
        };
        if c.tls_cert_file.is_some() != c.tls_private_key_file.is_some() {
            return Err(invalid(
                "tlsCertFile",
                "tlsCertFile and tlsPrivateKeyFile go together",
            ));
        }
        if let Some(Nested(mut authn)) = self.authentication {
            let mut anon = mapping_at(take(&mut authn, "anonymous"), "authentication.anonymous")?;
            if let Some(b) = bool_at(
                take(&mut anon, "enabled"),
                "authentication.anonymous.enabled",
            )? {
                c.anonymous = b;
            }
            leftovers(&anon, "authentication.anonymous", warnings);
            let mut hook = mapping_at(take(&mut authn, "webhook"), "authentication.webhook")?;
            if let Some(b) = bool_at(take(&mut hook, "enabled"), "authentication.webhook.enabled")?
            {
                c.token_webhook = b;
            }
            if let Some(t) = duration_at(
                take(&mut hook, "cacheTTL"),
                "authentication.webhook.cacheTTL",
            )? {
                c.token_cache_ttl = t;
            }
            leftovers(&hook, "authentication.webhook", warnings);
            let mut x509 = mapping_at(take(&mut authn, "x509"), "authentication.x509")?;
            c.client_ca_file = string_at(
                take(&mut x509, "clientCAFile"),
                "authentication.x509.clientCAFile",
            )?
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
            leftovers(&x509, "authentication.x509", warnings);
            leftovers(&authn, "authentication", warnings);
        }
        if let Some(Nested(mut authz)) = self.authorization {
            match string_at(take(&mut authz, "mode"), "authorization.mode")?.as_deref() {
                None | Some("Webhook") => {}
                Some("AlwaysAllow") => c.authz_mode = AuthzMode::AlwaysAllow,
                Some(m) => {
                    return Err(invalid(
                        "authorization.mode",
                        format!("{m:?} is not AlwaysAllow or Webhook"),
                    ));
                }
            }
            let mut hook = mapping_at(take(&mut authz, "webhook"), "authorization.webhook")?;
            if let Some(t) = duration_at(
                take(&mut hook, "cacheAuthorizedTTL"),
                "authorization.webhook.cacheAuthorizedTTL",
            )? {
                c.authz_allowed_ttl = t;
            }
            if let Some(t) = duration_at(
                take(&mut hook, "cacheUnauthorizedTTL"),
                "authorization.webhook.cacheUnauthorizedTTL",
            )? {
                c.authz_denied_ttl = t;
            }
            leftovers(&hook, "authorization.webhook", warnings);
            leftovers(&authz, "authorization", warnings);
        }
        Ok(c)
    }
}
