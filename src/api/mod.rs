//! The kubelet's side of the API server: the client (kube-rs over rustls with the ring
//! provider), the names the kubelet writes under, the objects its pods reference
//! ([`objects`]), their service account tokens ([`tokens`]) and the Services of their
//! environments ([`services`]).

pub mod events;
pub mod objects;
mod reloadable;
pub mod request_metrics;
pub mod services;
pub mod tokens;

pub use reloadable::{Reloader, reloadable_client};

use std::path::{Path, PathBuf};

/// Why a client for the API server could not be made. Each message names what failed and
/// the cause is its source, so `{:#}` prints `reading kubeconfig /etc/kubeconfig: <cause>`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig file cannot be read or parsed.
    #[error("reading kubeconfig {}", path.display())]
    ReadKubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig's current context does not make a client configuration.
    #[error("kubeconfig {}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The client for the kubeconfig's server cannot be built.
    #[error("client for {}", path.display())]
    Client {
        path: PathBuf,
        #[source]
        source: Box<Error>,
    },
    /// The User-Agent is not a valid header value.
    #[error(transparent)]
    UserAgent(#[from] http::header::InvalidHeaderValue),
    /// kube-rs cannot build a client from the configuration (TLS, proxy, auth).
    #[error(transparent)]
    Build(#[from] kube::Error),
}

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
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, Error> {
    install_crypto_provider();
    let kubeconfig =
        kube::config::Kubeconfig::read_from(path).map_err(|source| Error::ReadKubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|source| Error::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })?;
    client_from_config(config).map_err(|e| Error::Client {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

/// A client for `config`, as [`client_from_kubeconfig`] makes it.
pub fn client_from_config(mut config: kube::Config) -> Result<kube::Client, Error> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_kubeconfig_that_cannot_be_read_is_named_before_its_cause() {
        let path = Path::new("/nonexistent/kubeconfig");
        let Err(e) = client_from_kubeconfig(path).await else {
            panic!("a client from a missing kubeconfig");
        };
        assert_eq!(e.to_string(), "reading kubeconfig /nonexistent/kubeconfig");
        // The cause is the source (the CLI prints it after the message, as `{:#}`), not
        // repeated in the message.
        let cause = std::error::Error::source(&e).map(ToString::to_string);
        assert!(cause.is_some_and(|c| !c.is_empty() && !c.contains("kubeconfig /")));
    }
}
