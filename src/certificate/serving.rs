//! The kubelet's serving certificate with `serverTLSBootstrap` (upstream's kubelet-serving
//! certificate manager): a CSR with signer `kubernetes.io/kubelet-serving` sent as the node,
//! subject `CN=system:node:<node>, O=system:nodes`, SANs the node's host name and addresses,
//! usages digital signature and server auth; the issued certificate goes to the cert dir
//! (`kubelet-server-*.pem`) and into a [`ServingSlot`] the HTTPS server reads at every
//! handshake, and is renewed at 70-90% of its lifetime. Until one is issued, the server has
//! no certificate and refuses connections. A valid certificate left by the previous start is
//! served at once.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

use super::bootstrap::{CsrKind, request_certificate};
use super::rotation::rotation_deadline;
use super::store::PemError;
use super::{CertStore, Error, Pair};

/// The cert dir's serving certificates: `kubelet-server-*.pem`.
pub const SERVER_PREFIX: &str = "kubelet-server";

/// The serving certificate the HTTPS server presents; empty until one is issued.
#[derive(Debug, Default)]
pub struct ServingSlot {
    current: RwLock<Option<Arc<CertifiedKey>>>,
}

impl ServingSlot {
    pub fn get(&self) -> Option<Arc<CertifiedKey>> {
        match self.current.read() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Serves `pair` from the next handshake on.
    pub fn set(&self, pair: &Pair) -> Result<(), PemError> {
        let key = certified_key(pair)?;
        match self.current.write() {
            Ok(mut c) => *c = Some(Arc::new(key)),
            Err(p) => *p.into_inner() = Some(Arc::new(key)),
        }
        Ok(())
    }
}

impl rustls::server::ResolvesServerCert for ServingSlot {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let key = self.get();
        if key.is_none() {
            tracing::warn!(
                "TLS handshake refused: no serving certificate available for the kubelet"
            );
        }
        key
    }
}

fn certified_key(pair: &Pair) -> Result<CertifiedKey, PemError> {
    let unservable = |what| {
        move |e: &dyn std::fmt::Display| PemError::Unservable {
            what,
            detail: e.to_string(),
        }
    };
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(pair.cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| unservable("serving certificate")(&e))?;
    let key = PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes())
        .map_err(|e| unservable("serving key")(&e))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| unservable("serving key")(&e))?;
    Ok(CertifiedKey::new(certs, signing))
}

/// Gets and renews the serving certificate, until the task is dropped.
pub async fn run(
    slot: Arc<ServingSlot>,
    store: CertStore,
    client: kube::Client,
    node_name: String,
    names: Vec<String>,
    ips: Vec<IpAddr>,
) {
    const RETRY_FIRST: Duration = Duration::from_secs(2);
    const RETRY_MAX: Duration = Duration::from_secs(300);
    let mut delay = RETRY_FIRST;
    let kind = CsrKind::Serving { names, ips };
    loop {
        let now = chrono::Utc::now().timestamp();
        let current = match store.current() {
            Ok(Some(p)) if p.valid_at(now) => Some(p),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!("serving certificate: {e}; requesting a new one");
                None
            }
        };
        if let Some(pair) = &current {
            if slot.get().is_none() {
                if let Err(e) = slot.set(pair) {
                    tracing::warn!("serving certificate: {e}; requesting a new one");
                }
            }
            let deadline = rotation_deadline(pair.not_before, pair.not_after, fastrand::f64());
            if deadline > now && slot.get().is_some() {
                tokio::time::sleep(Duration::from_secs((deadline - now) as u64)).await;
            }
        }
        match obtain(&slot, &store, &client, &node_name, &kind).await {
            Ok(p) => {
                delay = RETRY_FIRST;
                tracing::info!(
                    valid_until = p.not_after,
                    "serving certificate issued and in use"
                );
            }
            Err(e) => {
                tracing::error!("serving certificate: {e}; trying again in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RETRY_MAX);
            }
        }
    }
}

/// One serving certificate requested, written to the cert dir and put in the slot.
async fn obtain(
    slot: &ServingSlot,
    store: &CertStore,
    client: &kube::Client,
    node_name: &str,
    kind: &CsrKind,
) -> Result<Pair, Error> {
    let (cert, key) = request_certificate(client, node_name, kind).await?;
    store.update(&cert, &key)?;
    let path = store.current_path();
    let pair = store.current()?.ok_or_else(|| Error::Unusable {
        path: path.clone(),
        why: "is gone right after it was written".to_string(),
    })?;
    slot.set(&pair).map_err(|e| Error::Unusable {
        path,
        why: e.to_string(),
    })?;
    Ok(pair)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certificate::store::tests::cert;

    #[test]
    fn the_slot_serves_nothing_until_a_certificate_is_set() {
        let slot = ServingSlot::default();
        assert!(slot.get().is_none());
        let (c, k) = cert(-60, 3600);
        let pair = Pair::parse(&format!("{c}{k}")).unwrap();
        slot.set(&pair).unwrap();
        let served = slot.get().unwrap();
        assert_eq!(served.cert.len(), 1);
        let broken = Pair {
            key_pem: "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".into(),
            ..pair
        };
        let err = slot.set(&broken).unwrap_err().to_string();
        assert!(err.contains("the serving key cannot be served"), "{err}");
        assert!(slot.get().is_some(), "a bad pair leaves the served one");
    }
}
