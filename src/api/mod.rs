//! The kubelet's side of the API server: the client (kube-rs over rustls with the ring
//! provider), the names the kubelet writes under, the objects its pods reference
//! ([`objects`]), their service account tokens ([`tokens`]) and the Services of their
//! environments ([`services`]).

pub mod events;
pub mod objects;
pub mod request_metrics;
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

/// The User-Agent of the kubelet's requests, as upstream's kubelet names itself:
/// `kubelet/<version> (linux/<arch>) nodelet`.
pub fn user_agent() -> String {
    format!(
        "kubelet/{} (linux/{}) nodelet",
        crate::version::kubelet_version(),
        crate::version::goarch(std::env::consts::ARCH)
    )
}

/// A client for the API server named by a kubeconfig file (its current context), sending
/// [`user_agent`], its requests counted in `rest_client_*` ([`request_metrics`]).
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<kube::Client> {
    install_crypto_provider();
    let kubeconfig = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .with_context(|| format!("kubeconfig {}", path.display()))?;
    client_from_config(config).with_context(|| format!("client for {}", path.display()))
}

/// A client for `config`, as [`client_from_kubeconfig`] makes it.
pub fn client_from_config(mut config: kube::Config) -> anyhow::Result<kube::Client> {
    install_crypto_provider();
    let host = config
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .unwrap_or_default();
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_str(&user_agent())?,
    ));
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&request_metrics::RequestMetricsLayer::new(host))
        .build())
}
