//! The kubelet's client certificate (upstream's `pkg/kubelet/certificate`): TLS bootstrap
//! ([`bootstrap`]: a key, a `CertificateSigningRequest` sent with the bootstrap kubeconfig's
//! credentials, the issued certificate written to the cert dir and a kubeconfig that uses
//! it) and the cert dir itself ([`store`]: `kubelet-client-<timestamp>.pem` files and the
//! `kubelet-client-current.pem` link, written 0600 and atomically).

pub mod bootstrap;
pub mod rotation;
pub mod serving;
pub mod store;

pub use bootstrap::{load_or_bootstrap, write_kubeconfig};
pub use rotation::Rotation;
pub use serving::ServingSlot;
pub use store::{CertStore, Pair};

use std::path::PathBuf;

/// The signer of kubelet serving certificates.
pub const SIGNER_KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";
/// The signer of kubelet client certificates.
pub const SIGNER_CLIENT_KUBELET: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// Why a certificate could not be had or kept.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file that should hold a certificate and its key does not (torn, truncated, foreign).
    #[error("{}: {why}", path.display())]
    Unusable { path: PathBuf, why: String },
    /// The bootstrap kubeconfig cannot be used.
    #[error("bootstrap kubeconfig {}: {why}", path.display())]
    BootstrapKubeconfig { path: PathBuf, why: String },
    #[error(transparent)]
    Api(#[from] crate::api::Error),
    /// The request to the API server failed.
    #[error("{what}: {source}")]
    Request {
        what: &'static str,
        source: kube::Error,
    },
    /// The key or the request could not be made.
    #[error("making the certificate request: {0}")]
    Generate(#[from] rcgen::Error),
    /// The CSR was denied or failed: its condition's reason and message.
    #[error("certificate signing request {name} was {condition}: {reason}: {message}")]
    Refused {
        name: String,
        condition: String,
        reason: String,
        message: String,
    },
    /// The certificate the API server issued cannot be used.
    #[error("certificate signing request {name}: the issued certificate {why}")]
    BadCertificate { name: String, why: String },
}
