//! The server's TLS: the serving certificate from `tlsCertFile`/`tlsPrivateKeyFile`, or a
//! self-signed one made at the first start in `<root>/pki/kubelet.{crt,key}` for the node's
//! name and addresses (upstream's habit), kept for later starts; client certificates verified
//! against `authentication.x509.clientCAFile` when it is set (optional: a client without one
//! goes on to token or anonymous authentication); `tlsMinVersion` and `tlsCipherSuites` as far
//! as rustls has them; HTTP/2 and HTTP/1.1 by ALPN.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::ServerConfig;

/// Where the self-signed serving certificate and key live.
pub fn self_signed_paths(root_dir: &Path) -> (PathBuf, PathBuf) {
    let pki = root_dir.join("pki");
    (pki.join("kubelet.crt"), pki.join("kubelet.key"))
}

/// Makes the self-signed certificate unless it is there: for `node_name`, `localhost`, the
/// node's IPs and the loopback addresses.
pub fn ensure_self_signed(root_dir: &Path, node_name: &str, ips: &[IpAddr]) -> Result<()> {
    let (crt, key) = self_signed_paths(root_dir);
    if crt.is_file() && key.is_file() {
        return Ok(());
    }
    let mut names: Vec<String> = vec![node_name.to_string(), "localhost".to_string()];
    names.dedup();
    let mut params = rcgen::CertificateParams::new(names).context("certificate names")?;
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
    let pair = rcgen::KeyPair::generate().context("generating the serving key")?;
    let cert = params
        .self_signed(&pair)
        .context("signing the serving certificate")?;
    let dir = crt.parent().unwrap_or(root_dir);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_private(&key, pair.serialize_pem().as_bytes())?;
    std::fs::write(&crt, cert.pem()).with_context(|| format!("writing {}", crt.display()))?;
    tracing::info!(cert = %crt.display(), "made a self-signed serving certificate");
    Ok(())
}

fn write_private(path: &Path, data: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(data)
        .with_context(|| format!("writing {}", path.display()))
}

/// The rustls configuration of the HTTPS server.
pub fn server_config(
    cfg: &ServerConfig,
    root_dir: &Path,
    node_name: &str,
    ips: &[IpAddr],
) -> Result<rustls::ServerConfig> {
    let (crt, key) = match (&cfg.tls_cert_file, &cfg.tls_private_key_file) {
        (Some(c), Some(k)) => (c.clone(), k.clone()),
        _ => {
            ensure_self_signed(root_dir, node_name, ips)?;
            self_signed_paths(root_dir)
        }
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&crt)
        .with_context(|| format!("reading {}", crt.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing {}", crt.display()))?;
    if certs.is_empty() {
        bail!("{}: no certificate in it", crt.display());
    }
    let key = PrivateKeyDer::from_pem_file(&key)
        .with_context(|| format!("reading the private key {}", key.display()))?;

    let mut provider = rustls::crypto::ring::default_provider();
    if !cfg.tls_cipher_suites.is_empty() {
        provider.cipher_suites.retain(|s| {
            // TLS 1.3 suites are not configurable in Go either.
            s.version() == &rustls::version::TLS13
                || cfg
                    .tls_cipher_suites
                    .iter()
                    .any(|n| Some(n.as_str()) == s.suite().as_str())
        });
        let unknown: Vec<&String> = cfg
            .tls_cipher_suites
            .iter()
            .filter(|n| {
                !rustls::crypto::ring::ALL_CIPHER_SUITES
                    .iter()
                    .any(|s| s.suite().as_str() == Some(n.as_str()))
            })
            .collect();
        if !unknown.is_empty() {
            bail!("tlsCipherSuites: {unknown:?} not offered by nodelet's TLS (rustls with ring)");
        }
    }
    let provider = Arc::new(provider);
    let versions: &[&rustls::SupportedProtocolVersion] = if cfg.tls13_only {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .context("TLS versions")?;
    let builder = match &cfg.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)
                .with_context(|| format!("reading clientCAFile {}", ca.display()))?
            {
                let c = c.with_context(|| format!("parsing clientCAFile {}", ca.display()))?;
                roots
                    .add(c)
                    .map_err(|e| anyhow!("clientCAFile {}: {e}", ca.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()
            .map_err(|e| anyhow!("clientCAFile {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("the serving certificate and key")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
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
