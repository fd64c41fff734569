//! The server's TLS: the serving certificate from `tlsCertFile`/`tlsPrivateKeyFile`, or a
//! self-signed one made at the first start in `<cert-dir>/kubelet.{crt,key}` (`--cert-dir`, default `<root>/pki`) for the node's
//! name and addresses (upstream's habit), kept for later starts; client certificates verified
//! against `authentication.x509.clientCAFile` when it is set (optional: a client without one
//! goes on to token or anonymous authentication); `tlsMinVersion` and `tlsCipherSuites` as far
//! as rustls has them; HTTP/2 and HTTP/1.1 by ALPN.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::ServerConfig;

/// Why the server's TLS could not be set up. Each message names the step (and the file); the
/// cause is the source, so a chain printed with `{:#}` reads `step: cause`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("certificate names")]
    CertificateNames(#[source] rcgen::Error),
    #[error("generating the serving key")]
    GenerateKey(#[source] rcgen::Error),
    #[error("signing the serving certificate")]
    SignCertificate(#[source] rcgen::Error),
    #[error("creating {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading {}", path.display())]
    ReadCertificates {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("parsing {}", path.display())]
    ParseCertificates {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("{}: no certificate in it", path.display())]
    NoCertificate { path: PathBuf },
    #[error("reading the private key {}", path.display())]
    ReadKey {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("tlsCipherSuites: {unknown:?} not offered by nodelet's TLS (rustls with ring)")]
    UnknownCipherSuites { unknown: Vec<String> },
    #[error("TLS versions")]
    Versions(#[source] rustls::Error),
    #[error("reading clientCAFile {}", path.display())]
    ReadClientCa {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("parsing clientCAFile {}", path.display())]
    ParseClientCa {
        path: PathBuf,
        #[source]
        source: pem::Error,
    },
    #[error("clientCAFile {}", path.display())]
    AddClientCa {
        path: PathBuf,
        #[source]
        source: rustls::Error,
    },
    #[error("clientCAFile {}", path.display())]
    ClientVerifier {
        path: PathBuf,
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    #[error("the serving certificate and key")]
    ServingCertificate(#[source] rustls::Error),
}

/// Where the self-signed serving certificate and key live.
pub fn self_signed_paths(cert_dir: &Path) -> (PathBuf, PathBuf) {
    (cert_dir.join("kubelet.crt"), cert_dir.join("kubelet.key"))
}

/// Makes the self-signed certificate unless it is there: for `node_name`, `localhost`, the
/// node's IPs and the loopback addresses.
pub fn ensure_self_signed(cert_dir: &Path, node_name: &str, ips: &[IpAddr]) -> Result<(), Error> {
    let (crt, key) = self_signed_paths(cert_dir);
    if crt.is_file() && key.is_file() {
        return Ok(());
    }
    let mut names: Vec<String> = vec![node_name.to_string(), "localhost".to_string()];
    names.dedup();
    let mut params = rcgen::CertificateParams::new(names).map_err(Error::CertificateNames)?;
    for ip in ips.iter().copied().chain([
        IpAddr::from([127, 0, 0, 1]),
        "::1".parse().unwrap_or(IpAddr::from([127, 0, 0, 1])),
    ]) {
        let san = rcgen::SanType::IpAddress(ip);
        if !params.subject_alt_names.contains(&san) {
            params.subject_alt_names.push(san);
        }
    }
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{node_name}@nodelet"));
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(365);
    let pair = rcgen::KeyPair::generate().map_err(Error::GenerateKey)?;
    let cert = params.self_signed(&pair).map_err(Error::SignCertificate)?;
    let dir = crt.parent().unwrap_or(cert_dir);
    std::fs::create_dir_all(dir).map_err(|source| Error::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let key_pem = pair.serialize_pem();
    crate::certificate::store::write_private_atomically(&key, key_pem.as_bytes()).map_err(
        |source| Error::Write {
            path: key.clone(),
            source,
        },
    )?;
    std::fs::write(&crt, cert.pem()).map_err(|source| Error::Write {
        path: crt.clone(),
        source,
    })?;
    tracing::info!(cert = %crt.display(), "made a self-signed serving certificate");
    Ok(())
}

/// The rustls configuration of the HTTPS server.
///
/// With `serving` (`serverTLSBootstrap`), the certificate is the slot's at each handshake
/// (none yet: the handshake is refused); else the configured files or the self-signed pair.
pub fn server_config(
    cfg: &ServerConfig,
    cert_dir: &Path,
    node_name: &str,
    ips: &[IpAddr],
    serving: Option<Arc<crate::certificate::ServingSlot>>,
) -> Result<rustls::ServerConfig, Error> {
    let provider = Arc::new(provider(cfg)?);
    let versions: &[&rustls::SupportedProtocolVersion] = if cfg.tls13_only {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(Error::Versions)?;
    let builder = match &cfg.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, provider)?),
    };
    let mut config = match serving {
        Some(slot) => builder.with_cert_resolver(slot),
        None => {
            let (certs, key) = serving_pair(cfg, cert_dir, node_name, ips)?;
            builder
                .with_single_cert(certs, key)
                .map_err(Error::ServingCertificate)?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The serving certificate chain and key: the configured files, or the self-signed pair
/// (made when it is not there yet).
fn serving_pair(
    cfg: &ServerConfig,
    cert_dir: &Path,
    node_name: &str,
    ips: &[IpAddr],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), Error> {
    let (crt, key) = match (&cfg.tls_cert_file, &cfg.tls_private_key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => {
            ensure_self_signed(cert_dir, node_name, ips)?;
            self_signed_paths(cert_dir)
        }
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&crt)
        .map_err(|source| Error::ReadCertificates {
            path: crt.clone(),
            source,
        })?
        .collect::<Result<_, _>>()
        .map_err(|source| Error::ParseCertificates {
            path: crt.clone(),
            source,
        })?;
    if certs.is_empty() {
        return Err(Error::NoCertificate { path: crt });
    }
    let key = PrivateKeyDer::from_pem_file(&key).map_err(|source| Error::ReadKey {
        path: key.clone(),
        source,
    })?;
    Ok((certs, key))
}

/// The crypto provider with the cipher suites `tlsCipherSuites` names (all when it is empty);
/// a name rustls does not have is refused.
fn provider(cfg: &ServerConfig) -> Result<rustls::crypto::CryptoProvider, Error> {
    let mut provider = rustls::crypto::ring::default_provider();
    if cfg.tls_cipher_suites.is_empty() {
        return Ok(provider);
    }
    provider.cipher_suites.retain(|s| {
        // TLS 1.3 suites are not configurable in Go either.
        s.version() == &rustls::version::TLS13
            || cfg
                .tls_cipher_suites
                .iter()
                .any(|n| Some(n.as_str()) == s.suite().as_str())
    });
    let unknown: Vec<String> = cfg
        .tls_cipher_suites
        .iter()
        .filter(|n| {
            !rustls::crypto::ring::ALL_CIPHER_SUITES
                .iter()
                .any(|s| s.suite().as_str() == Some(n.as_str()))
        })
        .cloned()
        .collect();
    if !unknown.is_empty() {
        return Err(Error::UnknownCipherSuites { unknown });
    }
    Ok(provider)
}

/// The verifier of client certificates against the CAs of `ca` (`clientCAFile`); a client
/// without a certificate is let through to the other authentications.
fn client_verifier(
    ca: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, Error> {
    let path = || ca.to_path_buf();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).map_err(|source| Error::ReadClientCa {
        path: path(),
        source,
    })? {
        let c = c.map_err(|source| Error::ParseClientCa {
            path: path(),
            source,
        })?;
        roots.add(c).map_err(|source| Error::AddClientCa {
            path: path(),
            source,
        })?;
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .allow_unauthenticated()
        .build()
        .map_err(|source| Error::ClientVerifier {
            path: path(),
            source,
        })
}

/// The user a verified client certificate names: its subject's CN, and its O values as groups
/// (as kube-apiserver and the kubelet read them).
pub fn user_of_certificate(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok())
        .map(str::to_string)
        .collect();
    Some((cn, groups))
}
