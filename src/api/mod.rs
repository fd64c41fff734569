//! The kubelet's side of the API server: the client (kube-rs over rustls with the ring
//! provider), the names the kubelet writes under, the objects its pods reference
//! ([`objects`]), their service account tokens ([`tokens`]) and the Services of their
//! environments ([`services`]).

pub mod events;
pub mod objects;
pub mod services;
pub mod tokens;

use std::path::Path;

use anyhow::Context;

/// The field manager named in the kubelet's writes.
pub const FIELD_MANAGER: &str = "nodelet";

/// Installs ring as the process-wide rustls provider (once; later calls are no-ops), so
/// every TLS client in the process uses one crypto provider.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client for the API server named by a kubeconfig file (its current context).
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<kube::Client> {
    install_crypto_provider();
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .with_context(|| format!("kubeconfig {}", path.display()))?;
    kube::Client::try_from(config).with_context(|| format!("client for {}", path.display()))
}
