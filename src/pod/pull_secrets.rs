//! Registry credentials from a pod's `imagePullSecrets` (upstream's
//! `credentialprovider/secrets.MakeDockerKeyring` and `BasicDockerKeyring`, behaviour only):
//! `kubernetes.io/dockerconfigjson` (`.dockerconfigjson`: `{"auths": {...}}`) and
//! `kubernetes.io/dockercfg` (`.dockercfg`) secrets, each entry keyed by a registry location
//! (`host[:port][/path]`, a scheme and a `/v1/` or `/v2/` suffix ignored, `*` globs in host
//! labels). An image's credentials are those of every matching location, the most specific
//! first, else Docker Hub's for Docker Hub images; the kubelet tries each in turn.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use runtime::cri;
use serde::Deserialize;

/// Docker Hub's location as credentials name it.
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

#[derive(Debug, Default, Deserialize)]
struct Entry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
}

#[derive(Deserialize)]
struct ConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

/// The credentials by location key, and the keys most specific first.
#[derive(Debug, Default)]
pub struct Keyring {
    creds: BTreeMap<String, Vec<cri::AuthConfig>>,
}

/// `host[:port]` and path of a location or image (no scheme).
fn split(loc: &str) -> (&str, &str) {
    match loc.find('/') {
        Some(i) => (&loc[..i], &loc[i..]),
        None => (loc, ""),
    }
}

/// Upstream's glob of one host label (`filepath.Match` with `*` and `?`).
fn glob(pattern: &str, text: &str) -> bool {
    fn go(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], t) || (!t.is_empty() && go(p, &t[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &t[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &t[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), text.as_bytes())
}

/// Whether the credentials' location `key` matches the image repository `image` (upstream's
/// `URLsMatchStr`): same port, as many host labels each matching its glob, the key's path a
/// prefix of the image's.
fn matches(key: &str, image: &str) -> bool {
    let (kh, kp) = split(key);
    let (ih, ip) = split(image);
    let (khost, kport) = kh.split_once(':').unwrap_or((kh, ""));
    let (ihost, iport) = ih.split_once(':').unwrap_or((ih, ""));
    if kport != iport || !ip.starts_with(kp) {
        return false;
    }
    let kl: Vec<&str> = khost.split('.').collect();
    let il: Vec<&str> = ihost.split('.').collect();
    kl.len() == il.len() && kl.iter().zip(&il).all(|(k, i)| glob(k, i))
}

/// Whether `image` is on Docker Hub (upstream's `isDefaultRegistryMatch`).
fn is_docker_hub(image: &str) -> bool {
    let first = image.split('/').next().unwrap_or("");
    if first.is_empty() {
        return false;
    }
    !image.contains('/')
        || first == "docker.io"
        || first == DEFAULT_REGISTRY_HOST
        || !first.contains(['.', ':'])
}

/// The key a location is stored under: no scheme, `/v1/`/`/v2/` dropped, no trailing `/`.
fn location_key(loc: &str) -> String {
    let rest = loc
        .strip_prefix("https://")
        .or_else(|| loc.strip_prefix("http://"))
        .unwrap_or(loc);
    let (host, path) = split(rest);
    let path = path
        .strip_prefix("/v1/")
        .or_else(|| path.strip_prefix("/v2/"))
        .map(|p| format!("/{p}"))
        .unwrap_or_else(|| path.to_string());
    let path = path.trim_end_matches('/');
    format!("{host}{path}")
}

impl Keyring {
    /// The credentials of `secrets` (others' content ignored); a secret whose content does
    /// not parse is named in the second value.
    pub fn from_secrets(secrets: &[Secret]) -> (Keyring, Vec<String>) {
        let mut ring = Keyring::default();
        let mut bad = Vec::new();
        for s in secrets {
            let data = s.data.as_ref();
            let get = |k: &str| data.and_then(|d| d.get(k)).map(|b| b.0.as_slice());
            let entries: Result<BTreeMap<String, Entry>, String> = match s.type_.as_deref() {
                Some("kubernetes.io/dockerconfigjson") => match get(".dockerconfigjson") {
                    Some(b) if !b.is_empty() => serde_json::from_slice::<ConfigJson>(b)
                        .map(|c| c.auths)
                        .map_err(|e| e.to_string()),
                    _ => Ok(BTreeMap::new()),
                },
                Some("kubernetes.io/dockercfg") => match get(".dockercfg") {
                    Some(b) if !b.is_empty() => {
                        serde_json::from_slice(b).map_err(|e| e.to_string())
                    }
                    _ => Ok(BTreeMap::new()),
                },
                _ => Ok(BTreeMap::new()),
            };
            match entries {
                Ok(entries) => {
                    for (loc, e) in entries {
                        ring.add(&loc, e);
                    }
                }
                Err(e) => bad.push(format!("{}: {e}", s.metadata.name.as_deref().unwrap_or(""))),
            }
        }
        (ring, bad)
    }

    fn add(&mut self, loc: &str, e: Entry) {
        let mut auth = cri::AuthConfig {
            username: e.username,
            password: e.password,
            ..Default::default()
        };
        // `auth` is base64 `user:password`; upstream decodes it into the two.
        if !e.auth.is_empty() {
            use base64::Engine;
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(&e.auth)
                .ok()
                .and_then(|b| String::from_utf8(b).ok());
            match decoded.as_deref().and_then(|d| d.split_once(':')) {
                Some((u, p)) => {
                    auth.username = u.to_string();
                    auth.password = p.to_string();
                }
                None => auth.auth = e.auth,
            }
        }
        let mut key = location_key(loc);
        if key == DEFAULT_REGISTRY_HOST || key == "docker.io" {
            key = DEFAULT_REGISTRY_HOST.to_string();
        }
        self.creds.entry(key).or_default().push(auth);
    }

    /// The credentials to try for the image repository `image` (`host[:port]/path`, no tag),
    /// most specific location first; empty when none match.
    pub fn lookup(&self, image: &str) -> Vec<cri::AuthConfig> {
        // Reverse order: `quay.io/coreos` before `quay.io`.
        let found: Vec<cri::AuthConfig> = self
            .creds
            .iter()
            .rev()
            .filter(|(k, _)| matches(k, image))
            .flat_map(|(_, c)| c.iter().cloned())
            .collect();
        if !found.is_empty() {
            return found;
        }
        match self.creds.get(DEFAULT_REGISTRY_HOST) {
            Some(c) if is_docker_hub(image) => c.clone(),
            _ => Vec::new(),
        }
    }
}

/// The repository of an image reference, as credentials are matched against it: the tag or
/// digest dropped, Docker Hub's short names completed (`busybox` is
/// `docker.io/library/busybox`).
pub fn repository(image: &str) -> String {
    let without_digest = image.split('@').next().unwrap_or(image);
    // A tag is after the last `/`'s last `:`.
    let name = match without_digest.rfind(':') {
        Some(i) if !without_digest[i..].contains('/') => &without_digest[..i],
        _ => without_digest,
    };
    let first = name.split('/').next().unwrap_or("");
    let has_host = name.contains('/') && (first.contains(['.', ':']) || first == "localhost");
    if has_host {
        name.to_string()
    } else if name.contains('/') {
        format!("docker.io/{name}")
    } else {
        format!("docker.io/library/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secret(type_: &str, key: &str, content: serde_json::Value) -> Secret {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        serde_json::from_value(json!({"metadata": {"name": "s"}, "type": type_,
            "data": {key: b64.encode(content.to_string())}}))
        .expect("a secret")
    }

    fn users(creds: &[cri::AuthConfig]) -> Vec<(&str, &str)> {
        creds
            .iter()
            .map(|c| (c.username.as_str(), c.password.as_str()))
            .collect()
    }

    #[test]
    fn locations_match_as_upstream() {
        let (ring, bad) = Keyring::from_secrets(&[
            secret(
                "kubernetes.io/dockerconfigjson",
                ".dockerconfigjson",
                json!({"auths": {
                    "https://quay.io/v1/": {"username": "q", "password": "1"},
                    "quay.io/coreos": {"username": "coreos", "password": "2"},
                    "*.example.com:5000": {"auth": "YWxpY2U6czNjcmV0"},
                    "https://index.docker.io/v1/": {"username": "hub", "password": "3"}
                }}),
            ),
            secret(
                "kubernetes.io/dockercfg",
                ".dockercfg",
                json!({"127.0.0.1:5000": {"username": "local", "password": "4"}}),
            ),
            // Not a registry secret: ignored.
            secret(
                "Opaque",
                ".dockerconfigjson",
                json!({"auths": {"x.io": {}}}),
            ),
        ]);
        assert!(bad.is_empty(), "{bad:?}");
        assert_eq!(
            users(&ring.lookup("quay.io/coreos/etcd")),
            [("coreos", "2"), ("q", "1")]
        );
        assert_eq!(users(&ring.lookup("quay.io/other/app")), [("q", "1")]);
        assert_eq!(
            users(&ring.lookup("registry.example.com:5000/team/app")),
            [("alice", "s3cret")]
        );
        assert!(
            ring.lookup("registry.example.com/team/app").is_empty(),
            "port"
        );
        assert!(ring.lookup("a.b.example.com:5000/app").is_empty(), "labels");
        assert_eq!(
            users(&ring.lookup("127.0.0.1:5000/private/busybox")),
            [("local", "4")]
        );
        assert_eq!(
            users(&ring.lookup(&repository("busybox:1.36"))),
            [("hub", "3")]
        );
        assert!(ring.lookup("ghcr.io/x/y").is_empty());
        let (_, bad) = Keyring::from_secrets(&[secret(
            "kubernetes.io/dockercfg",
            ".dockercfg",
            json!(["not", "a", "map"]),
        )]);
        assert_eq!(bad.len(), 1);
    }

    #[test]
    fn repositories_of_references() {
        for (image, repo) in [
            ("busybox", "docker.io/library/busybox"),
            ("busybox:1.36", "docker.io/library/busybox"),
            ("team/app:v1", "docker.io/team/app"),
            (
                "127.0.0.1:5000/private/busybox:1",
                "127.0.0.1:5000/private/busybox",
            ),
            ("localhost/app", "localhost/app"),
            ("quay.io/coreos/etcd@sha256:abc", "quay.io/coreos/etcd"),
            ("registry:5000/app", "registry:5000/app"),
        ] {
            assert_eq!(repository(image), repo, "{image}");
        }
    }
}
