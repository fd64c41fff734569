//! The kubelet's serving certificate with `serverTLSBootstrap` (upstream's kubelet-serving
//! certificate manager): a CSR with signer `kubernetes.io/kubelet-serving` sent as the node,
//! subject `CN=system:node:<node>, O=system:nodes`, SANs the node's addresses as the Node
//! reports them (host names and IPs; no CSR while it has none, as with an external cloud
//! provider that has not set them yet), usages digital signature and server auth; the issued
//! certificate goes to the cert dir (`kubelet-server-*.pem`) and into a [`ServingSlot`] the
//! HTTPS server reads at every handshake, and is renewed at 70-90% of its lifetime, or at once
//! when the node's addresses change so that it no longer names them all. Until one is issued,
//! the server has no certificate and refuses connections. A valid certificate left by the
//! previous start is served at once.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::NodeAddress;
use tokio::sync::watch;

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

/// The SANs a serving certificate for `addresses` names (upstream's template): the host
/// names (`Hostname`, `InternalDNS`, `ExternalDNS`) and the IPs (`InternalIP`, `ExternalIP`),
/// each once, in order; `None` when there are none.
pub fn template(addresses: &[NodeAddress]) -> Option<(Vec<String>, Vec<IpAddr>)> {
    let (mut names, mut ips) = (Vec::new(), Vec::new());
    for a in addresses {
        match a.type_.as_str() {
            "Hostname" | "InternalDNS" | "ExternalDNS" if !names.contains(&a.address) => {
                names.push(a.address.clone())
            }
            "InternalIP" | "ExternalIP" => {
                if let Ok(ip) = a.address.parse::<IpAddr>()
                    && !ips.contains(&ip)
                {
                    ips.push(ip);
                }
            }
            _ => {}
        }
    }
    (!names.is_empty() || !ips.is_empty()).then_some((names, ips))
}

/// Whether the leaf certificate of `cert_pem` names every one of `names` and `ips`.
pub fn satisfies(cert_pem: &str, names: &[String], ips: &[IpAddr]) -> bool {
    use x509_parser::extensions::GeneralName;
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()) else {
        return false;
    };
    let Ok(cert) = pem.parse_x509() else {
        return false;
    };
    let (mut dns, mut addrs) = (Vec::new(), Vec::new());
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                GeneralName::DNSName(d) => dns.push(d.to_string()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => addrs.extend(<[u8; 4]>::try_from(*b).ok().map(IpAddr::from)),
                    16 => addrs.extend(<[u8; 16]>::try_from(*b).ok().map(IpAddr::from)),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    names.iter().all(|n| dns.contains(n)) && ips.iter().all(|ip| addrs.contains(ip))
}

/// Gets and renews the serving certificate for the node's `addresses` (the latest the Node
/// reports), until the task is dropped or the addresses' sender is gone.
pub async fn run(
    slot: Arc<ServingSlot>,
    store: CertStore,
    client: kube::Client,
    node_name: String,
    mut addresses: watch::Receiver<Vec<NodeAddress>>,
) {
    const RETRY_FIRST: Duration = Duration::from_secs(2);
    const RETRY_MAX: Duration = Duration::from_secs(300);
    let mut delay = RETRY_FIRST;
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
        if let Some(pair) = &current
            && slot.get().is_none()
            && let Err(e) = slot.set(pair)
        {
            tracing::warn!("serving certificate: {e}; requesting a new one");
        }
        let wanted = template(&addresses.borrow_and_update());
        let Some((names, ips)) = wanted else {
            tracing::info!("serving certificate: waiting for the node's addresses");
            if addresses.changed().await.is_err() {
                return;
            }
            continue;
        };
        match &current {
            Some(pair) if satisfies(&pair.cert_pem, &names, &ips) => {
                let deadline = rotation_deadline(pair.not_before, pair.not_after, fastrand::f64());
                if deadline > now && slot.get().is_some() {
                    let wait = Duration::from_secs((deadline - now) as u64);
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        changed = addresses.changed() => {
                            if changed.is_err() {
                                return;
                            }
                            continue;
                        }
                    }
                }
            }
            Some(_) => tracing::info!(
                ?names,
                ?ips,
                "serving certificate: the node's addresses changed; requesting a new one"
            ),
            None => {}
        }
        let kind = CsrKind::Serving { names, ips };
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

    fn addr(type_: &str, address: &str) -> NodeAddress {
        NodeAddress {
            type_: type_.into(),
            address: address.into(),
        }
    }

    #[test]
    fn the_template_names_the_nodes_addresses_and_a_certificate_must_name_them_all() {
        assert_eq!(template(&[]), None);
        let addresses = [
            addr("InternalIP", "10.0.0.7"),
            addr("ExternalIP", "203.0.113.9"),
            addr("Hostname", "node-a"),
            addr("InternalDNS", "node-a"),
            addr("ExternalDNS", "node-a.example.com"),
            addr("InternalIP", "10.0.0.7"),
            addr("InternalIP", "not-an-ip"),
        ];
        let (names, ips) = template(&addresses).unwrap();
        assert_eq!(names, ["node-a", "node-a.example.com"]);
        let want: Vec<IpAddr> = vec!["10.0.0.7".parse().unwrap(), "203.0.113.9".parse().unwrap()];
        assert_eq!(ips, want);

        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["node-a".to_string()]).unwrap();
        p.subject_alt_names
            .push(rcgen::SanType::IpAddress("10.0.0.7".parse().unwrap()));
        let pem = p.self_signed(&key).unwrap().pem();
        let one_ip = [ips[0]];
        assert!(satisfies(&pem, &names[..1], &one_ip));
        assert!(!satisfies(&pem, &names, &one_ip), "a DNS name missing");
        assert!(!satisfies(&pem, &names[..1], &ips), "an IP missing");
        assert!(!satisfies("not a certificate", &[], &[]));
    }

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
