//! Image references: parsing and normalising names the way containerd and docker do
//! (`busybox` → `docker.io/library/busybox:latest`), following the distribution grammar
//! `[domain[:port]/]path[:tag][@sha256:hex]`.

use crate::error::{Error, Result};
use std::fmt;

/// The registry that short names belong to.
pub(crate) const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_LEGACY: &str = "index.docker.io";
const OFFICIAL_PREFIX: &str = "library";
const DEFAULT_TAG: &str = "latest";
const MAX_NAME_LEN: usize = 255;
const MAX_TAG_LEN: usize = 128;

/// A parsed, normalised image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    /// Registry host with optional port, e.g. `docker.io` or `127.0.0.1:5000`.
    pub domain: String,
    /// Repository path inside the registry, e.g. `library/busybox`.
    pub path: String,
    /// Tag, if any. Normalisation adds `latest` when neither tag nor digest is given.
    pub tag: Option<String>,
    /// `sha256:<hex>` digest, if any.
    pub digest: Option<String>,
}

impl Reference {
    /// `domain/path`, without tag or digest.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.domain, self.path)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Why a part of a reference (its digest, tag, registry or repository path) is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum InvalidPart {
    #[error("digest {0:?} has no algorithm")]
    DigestWithoutAlgorithm(String),
    #[error("unsupported digest algorithm {0:?} (only sha256)")]
    DigestAlgorithm(String),
    #[error("digest {0:?} is not 64 lower-case hex characters")]
    DigestHex(String),
    #[error("tag {0:?} must start with a letter, digit or '_'")]
    TagStart(String),
    #[error("tag {0:?} is longer than 128 characters")]
    TagLength(String),
    #[error("tag {0:?} may only contain [A-Za-z0-9_.-]")]
    TagCharacters(String),
    #[error("domain {0:?} has an unclosed '['")]
    UnclosedBracket(String),
    #[error("domain {0:?} is not a valid IPv6 address")]
    Ipv6(String),
    #[error("domain {0:?} has junk after ']'")]
    AfterBracket(String),
    #[error("domain {0:?} has an invalid port")]
    Port(String),
    #[error("empty registry host")]
    EmptyHost,
    #[error("registry host {0:?} is not a valid host name")]
    Host(String),
    #[error("repository path {0:?} has an empty component")]
    EmptyComponent(String),
    #[error(
        "repository component {0:?} must start and end with [a-z0-9] and use only '.', '_', \
         '__' or '-' between them"
    )]
    ComponentStart(String),
    #[error("repository component {component:?} has invalid separator {separator:?}")]
    Separator {
        component: String,
        separator: String,
    },
    #[error("repository component {0:?} must end with [a-z0-9]")]
    ComponentEnd(String),
}

/// Normalises an image reference like containerd does: adds the `docker.io` domain and the
/// `library/` prefix to short names and the `latest` tag when there is neither tag nor digest.
/// `"busybox"` → `"docker.io/library/busybox:latest"`, `"foo/bar:1"` → `"docker.io/foo/bar:1"`,
/// `"127.0.0.1:5000/x"` → `"127.0.0.1:5000/x:latest"`; `@sha256:` digests are kept.
pub fn normalize_reference(s: &str) -> Result<String> {
    Ok(parse(s)?.to_string())
}

/// Parses and normalises a reference (see [`normalize_reference`]).
pub(crate) fn parse(s: &str) -> Result<Reference> {
    let invalid = |reason: &str| Error::InvalidReference {
        reference: s.to_string(),
        reason: reason.to_string(),
    };
    if s.is_empty() {
        return Err(invalid("empty reference"));
    }
    if s.trim() != s {
        return Err(invalid("leading or trailing whitespace"));
    }
    let (rest, digest) = match s.split_once('@') {
        Some((rest, digest)) => {
            check_digest(digest).map_err(|r| invalid(&r.to_string()))?;
            (rest, Some(digest.to_string()))
        }
        None => (s, None),
    };
    // A tag is what follows the last ':' after the last '/'.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => {
            let at = last_slash + i;
            (&rest[..at], Some(&rest[at + 1..]))
        }
        None => (rest, None),
    };
    if let Some(tag) = tag {
        check_tag(tag).map_err(|r| invalid(&r.to_string()))?;
    }
    if name.is_empty() {
        return Err(invalid("empty repository name"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid("repository name longer than 255 characters"));
    }
    let (domain, path) = split_domain(name);
    check_domain(&domain).map_err(|r| invalid(&r.to_string()))?;
    if path.chars().any(|c| c.is_ascii_uppercase()) {
        return Err(invalid("repository name must be lowercase"));
    }
    check_path(&path).map_err(|r| invalid(&r.to_string()))?;
    if s.len() == 64 && is_lower_hex(s) {
        return Err(invalid(
            "a 64-character hexadecimal string is an image id, not a repository name",
        ));
    }
    let tag = match (tag, &digest) {
        (Some(tag), _) => Some(tag.to_string()),
        (None, Some(_)) => None,
        (None, None) => Some(DEFAULT_TAG.to_string()),
    };
    Ok(Reference {
        domain,
        path,
        tag,
        digest,
    })
}

/// Splits `name` into domain and path the way docker does: the first component is a domain when
/// it contains '.' or ':', is `localhost`, or has upper-case letters.
fn split_domain(name: &str) -> (String, String) {
    let (mut domain, mut path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (first.to_string(), rest.to_string())
        }
        _ => (DOCKER_HUB.to_string(), name.to_string()),
    };
    if domain == DOCKER_HUB_LEGACY {
        domain = DOCKER_HUB.to_string();
    }
    if domain == DOCKER_HUB && !path.contains('/') {
        path = format!("{OFFICIAL_PREFIX}/{path}");
    }
    (domain, path)
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Checks `sha256:<64 lower-case hex>`, the only digest algorithm the store supports.
pub(crate) fn check_digest(digest: &str) -> Result<(), InvalidPart> {
    let Some((alg, hex)) = digest.split_once(':') else {
        return Err(InvalidPart::DigestWithoutAlgorithm(digest.to_string()));
    };
    if alg != "sha256" {
        return Err(InvalidPart::DigestAlgorithm(alg.to_string()));
    }
    if hex.len() != 64 || !is_lower_hex(hex) {
        return Err(InvalidPart::DigestHex(digest.to_string()));
    }
    Ok(())
}

fn check_tag(tag: &str) -> Result<(), InvalidPart> {
    let mut chars = tag.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    if !first_ok {
        return Err(InvalidPart::TagStart(tag.to_string()));
    }
    if tag.len() > MAX_TAG_LEN {
        return Err(InvalidPart::TagLength(tag.to_string()));
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        return Err(InvalidPart::TagCharacters(tag.to_string()));
    }
    Ok(())
}

fn check_domain(domain: &str) -> Result<(), InvalidPart> {
    let (host, port) = if let Some(inner) = domain.strip_prefix('[') {
        // [IPv6]:port
        let Some((v6, rest)) = inner.split_once(']') else {
            return Err(InvalidPart::UnclosedBracket(domain.to_string()));
        };
        if v6.is_empty() || !v6.chars().all(|c| c.is_ascii_hexdigit() || c == ':') {
            return Err(InvalidPart::Ipv6(domain.to_string()));
        }
        match rest {
            "" => return Ok(()),
            _ => match rest.strip_prefix(':') {
                Some(port) => (None, Some(port)),
                None => return Err(InvalidPart::AfterBracket(domain.to_string())),
            },
        }
    } else {
        match domain.split_once(':') {
            Some((host, port)) => (Some(host), Some(port)),
            None => (Some(domain), None),
        }
    };
    if let Some(port) = port {
        if port.is_empty() || !port.chars().all(|c| c.is_ascii_digit()) {
            return Err(InvalidPart::Port(domain.to_string()));
        }
    }
    if let Some(host) = host {
        if host.is_empty() {
            return Err(InvalidPart::EmptyHost);
        }
        for component in host.split('.') {
            let ok = !component.is_empty()
                && component
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !component.starts_with('-')
                && !component.ends_with('-');
            if !ok {
                return Err(InvalidPart::Host(host.to_string()));
            }
        }
    }
    Ok(())
}

/// Path components: `[a-z0-9]+` separated by `.`, `_`, `__` or any number of `-`.
fn check_path(path: &str) -> Result<(), InvalidPart> {
    for component in path.split('/') {
        if component.is_empty() {
            return Err(InvalidPart::EmptyComponent(path.to_string()));
        }
        let bytes = component.as_bytes();
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let mut i = 0;
        let mut need_alnum = true;
        while i < bytes.len() {
            let b = bytes[i];
            if alnum(b) {
                need_alnum = false;
                i += 1;
                continue;
            }
            if need_alnum {
                return Err(InvalidPart::ComponentStart(component.to_string()));
            }
            // A separator run.
            let start = i;
            while i < bytes.len() && !alnum(bytes[i]) {
                i += 1;
            }
            let sep = &component[start..i];
            let valid = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-');
            if !valid {
                return Err(InvalidPart::Separator {
                    component: component.to_string(),
                    separator: sep.to_string(),
                });
            }
            need_alnum = true;
        }
        if need_alnum {
            return Err(InvalidPart::ComponentEnd(component.to_string()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Kind;

    const D: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn normalisation_table() {
        let digest_ref = format!("busybox@{D}");
        let digest_norm = format!("docker.io/library/busybox@{D}");
        let both = format!("quay.io/a/b:v1@{D}");
        let cases: Vec<(&str, &str)> = vec![
            ("busybox", "docker.io/library/busybox:latest"),
            ("busybox:1.36", "docker.io/library/busybox:1.36"),
            ("library/busybox", "docker.io/library/busybox:latest"),
            ("foo/bar:1", "docker.io/foo/bar:1"),
            ("docker.io/busybox", "docker.io/library/busybox:latest"),
            ("index.docker.io/foo/bar", "docker.io/foo/bar:latest"),
            ("127.0.0.1:5000/x", "127.0.0.1:5000/x:latest"),
            ("localhost/x:y", "localhost/x:y"),
            (
                "localhost:5000/a/b/c:t-1.2_3",
                "localhost:5000/a/b/c:t-1.2_3",
            ),
            ("registry.k8s.io/pause:3.9", "registry.k8s.io/pause:3.9"),
            ("a__b/c-d.e/f---g", "docker.io/a__b/c-d.e/f---g:latest"),
            ("[::1]:5000/x", "[::1]:5000/x:latest"),
            (&digest_ref, &digest_norm),
            (&both, &both),
        ];
        for (input, want) in cases {
            let got = normalize_reference(input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(got, want, "normalising {input}");
        }
    }

    #[test]
    fn invalid_references_are_invalid_argument() {
        let long = "a".repeat(300);
        let hex64 = "a".repeat(64);
        for input in [
            "",
            " busybox",
            "Busybox",
            "docker.io/Foo/bar",
            "busybox:",
            "busybox:-x",
            "busybox@sha256:1234",
            "busybox@md5:e3b0c44298fc1c149afbf4c8996fb924",
            "a//b",
            "a/b/",
            "-a",
            "a-",
            "a..b",
            "a___b",
            "host:port/x",
            long.as_str(),
            hex64.as_str(),
            "x:y:z",
        ] {
            match normalize_reference(input) {
                Ok(n) => panic!("{input:?} should be invalid, got {n}"),
                Err(e) => {
                    assert_eq!(e.kind(), Kind::InvalidArgument, "{input:?}: {e}");
                    assert!(e.to_string().contains("invalid image reference"), "{e}");
                }
            }
        }
    }

    #[test]
    fn invalid_references_say_which_part_is_wrong() {
        for (input, reason) in [
            ("busybox@sha256", "digest \"sha256\" has no algorithm"),
            (
                "busybox@md5:00",
                "unsupported digest algorithm \"md5\" (only sha256)",
            ),
            (
                "busybox@sha256:12",
                "digest \"sha256:12\" is not 64 lower-case hex characters",
            ),
            (
                "busybox:-x",
                "tag \"-x\" must start with a letter, digit or '_'",
            ),
            ("busybox:a+b", "tag \"a+b\" may only contain [A-Za-z0-9_.-]"),
            ("[::1/x", "domain \"[::1\" has an unclosed '['"),
            ("[::1]x/y", "domain \"[::1]x\" has junk after ']'"),
            ("host:port/x", "domain \"host:port\" has an invalid port"),
            (":5000/x", "empty registry host"),
            (
                "a_b.io/x",
                "registry host \"a_b.io\" is not a valid host name",
            ),
            ("a//b", "repository path \"a//b\" has an empty component"),
            (
                "-a",
                "repository component \"-a\" must start and end with [a-z0-9] and use only \
                 '.', '_', '__' or '-' between them",
            ),
            (
                "a___b",
                "repository component \"a___b\" has invalid separator \"___\"",
            ),
            ("a-", "repository component \"a-\" must end with [a-z0-9]"),
        ] {
            let e = normalize_reference(input).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("invalid image reference {input:?}: {reason}")
            );
        }
    }

    #[test]
    fn parse_keeps_parts() {
        let r = parse(&format!("127.0.0.1:5000/ns/x:v2@{D}")).unwrap();
        assert_eq!(r.domain, "127.0.0.1:5000");
        assert_eq!(r.path, "ns/x");
        assert_eq!(r.tag.as_deref(), Some("v2"));
        assert_eq!(r.digest.as_deref(), Some(D));
        assert_eq!(r.name(), "127.0.0.1:5000/ns/x");
    }
}
