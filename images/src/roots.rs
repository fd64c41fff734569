#![allow(unsafe_code)] // one set_var, before any thread starts
//! Trust roots for a node that has none: a minimal OS image has no `/etc/ssl/certs`, and then
//! every TLS client (the registry client's included, which cannot even be built without roots)
//! fails. [`fallback_trust_roots`] writes the Mozilla roots built into the binary
//! (`webpki-root-certs`) to a file and points `SSL_CERT_FILE` at it, as Go's
//! `x509roots/fallback` gives static programs built-in roots. A node with roots of its own is
//! left alone.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::Engine;

/// The fallback roots' file name, in the dir given to [`fallback_trust_roots`].
pub const FALLBACK_ROOTS_FILE: &str = "fallback-ca-certificates.pem";

/// When the node has no CA certificates (the system's store, `SSL_CERT_FILE` and `SSL_CERT_DIR`
/// all empty), writes the built-in roots to `dir/fallback-ca-certificates.pem`, sets
/// `SSL_CERT_FILE` to it and returns its path; otherwise returns None and changes nothing.
///
/// It sets an environment variable: call it before any thread starts.
pub fn fallback_trust_roots(dir: &Path) -> std::io::Result<Option<PathBuf>> {
    if !rustls_native_certs::load_native_certs().certs.is_empty() {
        return Ok(None);
    }
    let pem = pem_bundle();
    let path = dir.join(FALLBACK_ROOTS_FILE);
    if std::fs::read(&path).ok().as_deref() != Some(pem.as_bytes()) {
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join(format!("{FALLBACK_ROOTS_FILE}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(pem.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
    }
    // SAFETY: the caller runs this before any other thread exists (see the doc).
    unsafe { std::env::set_var("SSL_CERT_FILE", &path) };
    Ok(Some(path))
}

/// The built-in roots as one PEM bundle.
fn pem_bundle() -> String {
    let engine = base64::engine::general_purpose::STANDARD;
    let mut out = String::new();
    for der in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = engine.encode(der.as_ref());
        for line in b64.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(line));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject;

    /// The bundle parses back into the same certificates, so rustls-native-certs reads it.
    #[test]
    fn the_bundle_is_pem_of_every_root() {
        let pem = pem_bundle();
        let parsed: Vec<_> = rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(parsed.len(), webpki_root_certs::TLS_SERVER_ROOT_CERTS.len());
        assert!(parsed.len() > 100, "{} roots", parsed.len());
        assert_eq!(
            parsed[0].as_ref(),
            webpki_root_certs::TLS_SERVER_ROOT_CERTS[0].as_ref()
        );
    }
}
