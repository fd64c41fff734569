//! The host platform in OCI terms (`linux/amd64`, `linux/arm64/v8`, ...) and picking the
//! matching entry of a multi-arch index.

use crate::spec::{Descriptor, Platform};
use std::fmt;

/// An OS/architecture/variant triple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPlatform {
    pub os: &'static str,
    pub architecture: &'static str,
    pub variant: Option<&'static str>,
}

impl fmt::Display for HostPlatform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// The platform this process runs on.
pub(crate) fn host() -> HostPlatform {
    let (architecture, variant) = match std::env::consts::ARCH {
        "x86_64" => ("amd64", None),
        "aarch64" => ("arm64", Some("v8")),
        "arm" => ("arm", Some("v7")),
        "x86" => ("386", None),
        "powerpc64" if cfg!(target_endian = "little") => ("ppc64le", None),
        "mips64" if cfg!(target_endian = "little") => ("mips64le", None),
        "loongarch64" => ("loong64", None),
        other => (other, None),
    };
    HostPlatform {
        os: "linux",
        architecture,
        variant,
    }
}

/// How well `platform` fits `host`: None when it cannot run, higher is better.
fn score(host: &HostPlatform, platform: &Platform) -> Option<u8> {
    if platform.os != host.os || platform.architecture != host.architecture {
        return None;
    }
    let variant = platform.variant.as_deref().filter(|v| !v.is_empty());
    match (host.variant, variant) {
        (_, None) => Some(2),
        (Some(h), Some(v)) if h == v => Some(3),
        // Older 32-bit ARM variants run on newer ones (v5/v6 on v7).
        (Some(h), Some(v)) if host.architecture == "arm" && v < h => Some(1),
        // amd64 "v1" is the baseline; higher micro-architecture levels may need CPU features
        // this host lacks, so they are not picked.
        (None, Some("v1")) => Some(2),
        _ => None,
    }
}

/// Picks the index entry for `host`: the best-scoring one, the first among equals.
pub(crate) fn select<'a>(host: &HostPlatform, entries: &'a [Descriptor]) -> Option<&'a Descriptor> {
    let mut best: Option<(u8, &Descriptor)> = None;
    for entry in entries {
        let Some(platform) = &entry.platform else {
            continue;
        };
        if let Some(s) = score(host, platform) {
            if best.is_none_or(|(b, _)| s > b) {
                best = Some((s, entry));
            }
        }
    }
    best.map(|(_, d)| d)
}

/// Whether an entry with this (optional) platform can run on the host; entries without one can.
pub(crate) fn runs_on(host: &HostPlatform, platform: Option<&Platform>) -> bool {
    platform.is_none_or(|p| score(host, p).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(digest: &str, os: &str, arch: &str, variant: Option<&str>) -> Descriptor {
        Descriptor {
            digest: digest.to_string(),
            platform: Some(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: variant.map(str::to_string),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn selects_host_platform() {
        let h = host();
        let other = if h.architecture == "arm64" {
            "amd64"
        } else {
            "arm64"
        };
        let entries = vec![
            entry("a", "linux", other, None),
            entry("b", "windows", h.architecture, None),
            entry("c", "linux", h.architecture, h.variant),
            entry("d", "linux", h.architecture, h.variant),
        ];
        assert_eq!(select(&h, &entries).map(|d| d.digest.as_str()), Some("c"));
        assert_eq!(select(&h, &entries[..2]), None);
    }

    #[test]
    fn arm_variants() {
        let arm64 = HostPlatform {
            os: "linux",
            architecture: "arm64",
            variant: Some("v8"),
        };
        let entries = vec![
            entry("none", "linux", "arm64", None),
            entry("v8", "linux", "arm64", Some("v8")),
        ];
        assert_eq!(select(&arm64, &entries).unwrap().digest, "v8");
        let armv7 = HostPlatform {
            os: "linux",
            architecture: "arm",
            variant: Some("v7"),
        };
        let entries = vec![
            entry("v6", "linux", "arm", Some("v6")),
            entry("v8", "linux", "arm", Some("v8")),
        ];
        assert_eq!(select(&armv7, &entries).unwrap().digest, "v6");
        let amd64 = HostPlatform {
            os: "linux",
            architecture: "amd64",
            variant: None,
        };
        assert!(select(&amd64, &[entry("v3", "linux", "amd64", Some("v3"))]).is_none());
        assert!(runs_on(&amd64, None));
    }
}
