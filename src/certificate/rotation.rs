//! Client certificate rotation (`rotateCertificates`, upstream's certificate manager): the
//! current certificate is renewed at a jittered 70-90% of its lifetime (NotAfter minus
//! NotBefore, as signers backdate NotBefore) with a new key and a CSR sent as the node
//! itself; the shared API client then reads the kubeconfig again, so the next requests use
//! the new certificate without a restart. A certificate that expired before it could be
//! renewed is bootstrapped again with the bootstrap kubeconfig, when there is one.

use std::path::PathBuf;
use std::time::Duration;

use super::bootstrap::{CLIENT_PREFIX, CsrKind, request_certificate};
use super::{CertStore, Error, Pair};
use crate::api::Reloader;

/// When the certificate valid from `not_before` to `not_after` (seconds since the epoch) is
/// renewed, for `jitter` in [0, 1): at 70% of its lifetime plus up to 20% more.
pub fn rotation_deadline(not_before: i64, not_after: i64, jitter: f64) -> i64 {
    let total = (not_after - not_before).max(0) as f64;
    not_before + (total * (0.7 + 0.2 * jitter.clamp(0.0, 1.0))).round() as i64
}

/// The rotation of one node's client certificate.
pub struct Rotation {
    pub store: CertStore,
    pub node_name: String,
    /// The client the node uses (authenticated by the current certificate).
    pub client: kube::Client,
    pub reloader: Reloader,
    /// Used again when the current certificate expired.
    pub bootstrap: Option<PathBuf>,
}

impl Rotation {
    /// The cert dir's client certificates for `node_name`.
    pub fn new(
        cert_dir: &std::path::Path,
        node_name: &str,
        client: kube::Client,
        reloader: Reloader,
        bootstrap: Option<PathBuf>,
    ) -> Rotation {
        Rotation {
            store: CertStore::new(cert_dir, CLIENT_PREFIX),
            node_name: node_name.to_string(),
            client,
            reloader,
            bootstrap,
        }
    }

    /// Renews the certificate whenever it is due, until the task is dropped.
    pub async fn run(self) {
        const RETRY_FIRST: Duration = Duration::from_secs(2);
        const RETRY_MAX: Duration = Duration::from_secs(300);
        let mut delay = RETRY_FIRST;
        loop {
            let pair = match self.store.current() {
                Ok(Some(p)) => p,
                Ok(None) => {
                    tracing::warn!(
                        "rotateCertificates: no client certificate in the cert dir (the \
                         kubeconfig's is not the cert dir's); it is not rotated"
                    );
                    return;
                }
                Err(e) => {
                    tracing::error!("certificate rotation: {e}");
                    tokio::time::sleep(RETRY_MAX).await;
                    continue;
                }
            };
            let deadline = rotation_deadline(pair.not_before, pair.not_after, fastrand::f64());
            let now = chrono::Utc::now().timestamp();
            if deadline > now {
                tracing::info!(
                    expires = pair.not_after,
                    "certificate rotation: the client certificate is renewed in {} s",
                    deadline - now
                );
                tokio::time::sleep(Duration::from_secs((deadline - now) as u64)).await;
            }
            match self.renew(&pair).await {
                Ok(p) => {
                    delay = RETRY_FIRST;
                    tracing::info!(
                        valid_until = p.not_after,
                        "certificate rotation: new client certificate in use"
                    );
                }
                Err(e) => {
                    tracing::error!("certificate rotation: {e}; trying again in {delay:?}");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_MAX);
                }
            }
        }
    }

    /// One renewal: as the node while `old` is valid, else with the bootstrap kubeconfig.
    async fn renew(&self, old: &Pair) -> Result<Pair, Error> {
        let now = chrono::Utc::now().timestamp();
        let (cert, key) = match (&self.bootstrap, old.valid_at(now)) {
            (Some(boot), false) => {
                tracing::warn!(
                    "certificate rotation: the client certificate expired; bootstrapping again"
                );
                let client = crate::api::client_from_kubeconfig(boot).await?;
                request_certificate(&client, &self.node_name, &CsrKind::Client).await?
            }
            _ => request_certificate(&self.client, &self.node_name, &CsrKind::Client).await?,
        };
        self.store.update(&cert, &key)?;
        self.reloader.reload().await?;
        self.store.current()?.ok_or_else(|| Error::Unusable {
            path: self.store.current_path(),
            why: "is gone right after it was written".to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewed_at_70_to_90_percent_of_the_lifetime() {
        assert_eq!(rotation_deadline(1000, 2000, 0.0), 1700);
        assert_eq!(rotation_deadline(1000, 2000, 0.5), 1800);
        assert_eq!(rotation_deadline(1000, 2000, 0.99), 1898);
        // Out-of-range jitter is clamped; a reversed validity renews at once.
        assert_eq!(rotation_deadline(1000, 2000, 7.0), 1900);
        assert_eq!(rotation_deadline(2000, 1000, 0.3), 2000);
    }
}
