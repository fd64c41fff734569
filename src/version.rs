//! The versions and platform names the kubelet reports: the Kubernetes version it implements,
//! its `kubeletVersion`, and Go's name for the CPU architecture. A leaf.

/// The Kubernetes version nodelet implements (the API types it is built against: k8s-openapi's
/// `latest`, v1.37).
pub const KUBERNETES_VERSION: &str = "1.37.0";

/// The `kubeletVersion` the node reports: the Kubernetes version with nodelet's own version as
/// semver build metadata, e.g. `v1.37.0+nodelet.0.1.0` (like k3s's `v1.30.2+k3s1`), so version
/// checks that parse it as semver see 1.37.0.
pub fn kubelet_version() -> String {
    format!(
        "v{KUBERNETES_VERSION}+nodelet.{}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Rust's `std::env::consts::ARCH` in Go's GOARCH names.
pub fn goarch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64",
        "loongarch64" => "loong64",
        "mips64" => "mips64",
        other => other,
    }
}
