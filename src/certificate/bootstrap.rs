//! TLS bootstrap, as upstream's kubelet does it (`LoadClientCert`): when the kubeconfig is
//! missing or its client certificate has expired, the cert dir's current certificate is used
//! if it is still valid; else a new ECDSA P-256 key and a `CertificateSigningRequest`
//! (signer `kubernetes.io/kube-apiserver-client-kubelet`, subject `CN=system:node:<node>,
//! O=system:nodes`, no SANs, usages digital signature and client auth) are sent with the
//! bootstrap kubeconfig's credentials, the CSR is watched until it is issued (a log line while
//! it waits), and the certificate goes to the cert dir with a kubeconfig that names it. A
//! denied or failed CSR is an error naming its reason; the agent tries again after a back-off.
//! Nothing logged holds a key or a token.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use kube::config::Kubeconfig;
use serde_json::json;

use super::store::{CertStore, Pair, validity, write_private};
use super::{Error, SIGNER_CLIENT_KUBELET};

/// The cert dir's client certificates: `kubelet-client-*.pem`.
pub const CLIENT_PREFIX: &str = "kubelet-client";

/// How often a pending CSR is reported in the log.
const PENDING_LOG_EVERY: Duration = Duration::from_secs(30);
/// The back-off after a failed attempt: doubled up to the maximum.
const RETRY_FIRST: Duration = Duration::from_secs(2);
const RETRY_MAX: Duration = Duration::from_secs(300);

/// Makes sure `kubeconfig` holds usable credentials, bootstrapping a client certificate with
/// `bootstrap` (a kubeconfig with a bootstrap token) when it does not. Returns once the
/// kubeconfig is written; a refused CSR is retried, so this waits until one is issued.
pub async fn load_or_bootstrap(
    kubeconfig: &Path,
    bootstrap: &Path,
    cert_dir: &Path,
    node_name: &str,
) -> Result<(), Error> {
    if let Some(why) = unusable(kubeconfig) {
        tracing::info!(kubeconfig = %kubeconfig.display(), "TLS bootstrap: {why}");
    } else {
        return Ok(());
    }
    let boot = read_bootstrap(bootstrap)?;
    let store = CertStore::new(cert_dir, CLIENT_PREFIX);
    let now = chrono::Utc::now().timestamp();
    match store.current() {
        Ok(Some(pair)) if pair.valid_at(now) => {
            tracing::info!(
                cert = %store.current_path().display(),
                "TLS bootstrap: the cert dir's client certificate is still valid; using it"
            );
            return write_kubeconfig(kubeconfig, &boot, bootstrap, &store.current_path());
        }
        Ok(Some(_)) => tracing::info!("TLS bootstrap: the current client certificate expired"),
        Ok(None) => {}
        Err(e) => tracing::warn!("TLS bootstrap: {e}; bootstrapping again"),
    }
    let client = crate::api::client_from_kubeconfig(bootstrap).await?;
    let mut delay = RETRY_FIRST;
    loop {
        match request_certificate(&client, node_name, &CsrKind::Client).await {
            Ok((cert, key)) => {
                let file = store.update(&cert, &key)?;
                tracing::info!(cert = %file.display(), "TLS bootstrap: client certificate issued");
                return write_kubeconfig(kubeconfig, &boot, bootstrap, &store.current_path());
            }
            Err(e) => {
                tracing::error!("TLS bootstrap: {e}; trying again in {delay:?}");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Why `kubeconfig` cannot be used as it is (missing, unreadable, its client certificate
/// expired or unreadable); `None`: usable. As upstream, a kubeconfig with no client
/// certificate (a token, say) is usable.
fn unusable(kubeconfig: &Path) -> Option<String> {
    if !kubeconfig.exists() {
        return Some("the kubeconfig does not exist".to_string());
    }
    let kc = match Kubeconfig::read_from(kubeconfig) {
        Ok(kc) => kc,
        Err(e) => return Some(format!("the kubeconfig cannot be read: {e}")),
    };
    let user = current_user(&kc)?;
    let pem = if let Some(data) = &user.client_certificate_data {
        use base64::Engine;
        match base64::engine::general_purpose::STANDARD.decode(data.trim()) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(_) => return Some("its client-certificate-data is not base64".to_string()),
        }
    } else if let Some(file) = &user.client_certificate {
        let path = relative_to(kubeconfig, file);
        match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => return Some(format!("its client certificate {}: {e}", path.display())),
        }
    } else {
        return None;
    };
    let now = chrono::Utc::now().timestamp();
    match validity(&pem) {
        Ok((from, until)) if from <= now && now < until => None,
        Ok(_) => Some("its client certificate is not valid now".to_string()),
        Err(why) => Some(format!("its client certificate {why}")),
    }
}

fn current_user(kc: &Kubeconfig) -> Option<kube::config::AuthInfo> {
    let ctx = kc
        .contexts
        .iter()
        .find(|c| Some(&c.name) == kc.current_context.as_ref())?;
    let user = ctx.context.as_ref()?.user.clone()?;
    kc.auth_infos
        .iter()
        .find(|a| a.name == user)?
        .auth_info
        .clone()
}

/// A path in a kubeconfig, relative to the kubeconfig's directory unless absolute.
fn relative_to(kubeconfig: &Path, file: &str) -> PathBuf {
    let p = Path::new(file);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        kubeconfig.parent().unwrap_or(Path::new(".")).join(p)
    }
}

fn read_bootstrap(path: &Path) -> Result<kube::config::Cluster, Error> {
    let bad = |why: String| Error::BootstrapKubeconfig {
        path: path.to_path_buf(),
        why,
    };
    let kc = Kubeconfig::read_from(path).map_err(|e| bad(e.to_string()))?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| Some(&c.name) == kc.current_context.as_ref())
        .and_then(|c| c.context.clone())
        .ok_or_else(|| bad("no current context".to_string()))?;
    kc.clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| bad(format!("no cluster {:?}", ctx.cluster)))
}

/// Writes the kubeconfig the kubelet then uses: the bootstrap kubeconfig's cluster (its CA
/// file made absolute) and the cert dir's current certificate and key (`cert`), 0600,
/// atomically.
pub fn write_kubeconfig(
    path: &Path,
    cluster: &kube::config::Cluster,
    bootstrap: &Path,
    cert: &Path,
) -> Result<(), Error> {
    let mut c = serde_json::Map::new();
    if let Some(server) = &cluster.server {
        c.insert("server".into(), json!(server));
    }
    if let Some(data) = &cluster.certificate_authority_data {
        c.insert("certificate-authority-data".into(), json!(data));
    }
    if let Some(file) = &cluster.certificate_authority {
        let abs = relative_to(bootstrap, file);
        c.insert("certificate-authority".into(), json!(abs.to_string_lossy()));
    }
    if cluster.insecure_skip_tls_verify == Some(true) {
        c.insert("insecure-skip-tls-verify".into(), json!(true));
    }
    if let Some(name) = &cluster.tls_server_name {
        c.insert("tls-server-name".into(), json!(name));
    }
    let cert = cert.to_string_lossy();
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": c}],
        "contexts": [{"name": "default-context", "context": {
            "cluster": "default-cluster", "namespace": "default", "user": "default-auth"}}],
        "current-context": "default-context",
        "users": [{"name": "default-auth", "user": {
            "client-certificate": cert, "client-key": cert}}],
    });
    let text = serde_norway::to_string(&doc).map_err(|e| Error::Write {
        path: path.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| Error::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    write_private(path, text.as_bytes())
}

/// Which certificate a CSR asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsrKind {
    /// The node's client certificate: no SANs, client auth.
    Client,
    /// The kubelet's serving certificate: the node's names and addresses, server auth.
    Serving {
        names: Vec<String>,
        ips: Vec<std::net::IpAddr>,
    },
}

/// One attempt: a new key, a CSR for it, the certificate once issued (PEM) and the key (PEM).
pub async fn request_certificate(
    client: &kube::Client,
    node_name: &str,
    kind: &CsrKind,
) -> Result<(String, String), Error> {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let mut params = rcgen::CertificateParams::default();
    let (signer, usage) = match kind {
        CsrKind::Client => (SIGNER_CLIENT_KUBELET, "client auth"),
        CsrKind::Serving { names, ips } => {
            for n in names {
                params
                    .subject_alt_names
                    .push(rcgen::SanType::DnsName(n.clone().try_into()?));
            }
            for ip in ips {
                params
                    .subject_alt_names
                    .push(rcgen::SanType::IpAddress(*ip));
            }
            (super::SIGNER_KUBELET_SERVING, "server auth")
        }
    };
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, "system:nodes");
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("system:node:{node_name}"),
    );
    let request = params.serialize_request(&key)?.pem()?;
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some("node-csr-".to_string()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(request.into_bytes()),
            signer_name: signer.to_string(),
            usages: Some(vec!["digital signature".to_string(), usage.to_string()]),
            ..Default::default()
        },
        status: None,
    };
    let created = api
        .create(&PostParams::default(), &csr)
        .await
        .map_err(|source| Error::Request {
            what: "creating the certificate signing request",
            source,
        })?;
    let name = created.metadata.name.clone().unwrap_or_default();
    tracing::info!(csr = %name, "TLS bootstrap: certificate signing request sent; waiting for it to be issued");
    let cert = wait_issued(&api, created).await?;
    let pair = Pair::parse(&format!("{cert}{}", key.serialize_pem())).map_err(|why| {
        Error::BadCertificate {
            name: name.clone(),
            why: why.to_string(),
        }
    })?;
    if !same_key(&pair.cert_pem, &key) {
        return Err(Error::BadCertificate {
            name,
            why: "is for another key".to_string(),
        });
    }
    Ok((pair.cert_pem, pair.key_pem))
}

/// Whether the certificate's public key is `key`'s.
fn same_key(cert_pem: &str, key: &rcgen::KeyPair) -> bool {
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()) else {
        return false;
    };
    let Ok(cert) = pem.parse_x509() else {
        return false;
    };
    use rcgen::PublicKeyData;
    cert.public_key().raw == key.subject_public_key_info().as_slice()
}

/// What a CSR says: issued (the certificate, PEM), refused, or still pending (`None`).
fn outcome(csr: &CertificateSigningRequest) -> Option<Result<String, Error>> {
    let name = csr.metadata.name.clone().unwrap_or_default();
    let status = csr.status.as_ref()?;
    for c in status.conditions.iter().flatten() {
        if (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True" {
            return Some(Err(Error::Refused {
                name,
                condition: c.type_.to_lowercase(),
                reason: c.reason.clone().unwrap_or_default(),
                message: c.message.clone().unwrap_or_default(),
            }));
        }
    }
    let cert = status.certificate.as_ref()?;
    if cert.0.is_empty() {
        return None;
    }
    Some(
        String::from_utf8(cert.0.clone()).map_err(|_| Error::BadCertificate {
            name,
            why: "is not PEM text".to_string(),
        }),
    )
}

/// Watches the CSR until it is issued or refused, logging while it is pending.
async fn wait_issued(
    api: &Api<CertificateSigningRequest>,
    created: CertificateSigningRequest,
) -> Result<String, Error> {
    let name = created.metadata.name.clone().unwrap_or_default();
    let mut last = created;
    let mut report = tokio::time::interval(PENDING_LOG_EVERY);
    report.tick().await;
    loop {
        if let Some(done) = outcome(&last) {
            return done;
        }
        let rv = last.metadata.resource_version.clone().unwrap_or_default();
        let wp = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(290);
        let mut stream = match api.watch(&wp, &rv).await {
            Ok(s) => s.boxed(),
            Err(source) => {
                return Err(Error::Request {
                    what: "watching the certificate signing request",
                    source,
                });
            }
        };
        loop {
            tokio::select! {
                ev = stream.next() => match ev {
                    Some(Ok(WatchEvent::Added(o) | WatchEvent::Modified(o))) => {
                        last = o;
                        if let Some(done) = outcome(&last) {
                            return done;
                        }
                    }
                    Some(Ok(WatchEvent::Deleted(_))) => {
                        return Err(Error::Refused {
                            name,
                            condition: "deleted".to_string(),
                            reason: "Deleted".to_string(),
                            message: "deleted before it was issued".to_string(),
                        });
                    }
                    Some(Ok(WatchEvent::Bookmark(_))) => {}
                    // An expired resourceVersion or a broken stream: read it again.
                    Some(Ok(WatchEvent::Error(_)) | Err(_)) | None => break,
                },
                _ = report.tick() => {
                    tracing::info!(csr = %name, "TLS bootstrap: waiting for the certificate signing request to be approved and issued");
                }
            }
        }
        last = api.get(&name).await.map_err(|source| Error::Request {
            what: "reading the certificate signing request",
            source,
        })?;
    }
}

#[cfg(test)]
mod tests;
