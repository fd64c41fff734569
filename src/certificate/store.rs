//! The cert dir's client certificates, as upstream keeps them: each issued certificate with
//! its key in `<prefix>-<YYYY-MM-DD-HH-MM-SS>.pem` (mode 0600, written to a temporary file and
//! renamed), and `<prefix>-current.pem` a symbolic link to the one in use, replaced by a
//! rename so a reader never sees it half made.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use super::Error;

/// What is wrong with a PEM text that should hold a certificate and its key.
#[derive(Debug, thiserror::Error)]
pub enum PemError {
    #[error("holds no private key")]
    NoKey,
    #[error("holds no certificate ({detail})")]
    NoCertificate { detail: String },
    #[error("holds a certificate that does not parse ({detail})")]
    BadCertificate { detail: String },
    /// The certificate chain or key cannot be served (rustls refuses them).
    #[error("the {what} cannot be served: {detail}")]
    Unservable { what: &'static str, detail: String },
}

/// A certificate (with its chain) and its private key, both PEM, and its validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
    /// Seconds since the epoch.
    pub not_before: i64,
    pub not_after: i64,
}

impl Pair {
    /// Reads a PEM text holding a certificate chain (the leaf first) and a private key.
    pub fn parse(pem_text: &str) -> Result<Pair, PemError> {
        let mut certs = String::new();
        let mut key = String::new();
        for block in pem_blocks(pem_text) {
            if block.contains("-----BEGIN CERTIFICATE-----") {
                certs.push_str(block);
            } else if block.contains("PRIVATE KEY-----") && key.is_empty() {
                key.push_str(block);
            }
        }
        if key.is_empty() {
            return Err(PemError::NoKey);
        }
        let (not_before, not_after) = validity(&certs)?;
        Ok(Pair {
            cert_pem: certs,
            key_pem: key,
            not_before,
            not_after,
        })
    }

    /// Whether the certificate is valid at `now` (seconds since the epoch).
    pub fn valid_at(&self, now: i64) -> bool {
        self.not_before <= now && now < self.not_after
    }
}

/// The validity of the first certificate in `certs` (PEM).
pub fn validity(certs: &str) -> Result<(i64, i64), PemError> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(certs.as_bytes()).map_err(|e| {
        PemError::NoCertificate {
            detail: e.to_string(),
        }
    })?;
    let cert = pem.parse_x509().map_err(|e| PemError::BadCertificate {
        detail: e.to_string(),
    })?;
    let v = cert.validity();
    Ok((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// The PEM blocks of a text, each with its BEGIN and END lines and a final newline.
fn pem_blocks(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("-----BEGIN ") {
        let from = &rest[start..];
        let Some(end_at) = from.find("-----END ") else {
            break;
        };
        let after_end = &from[end_at..];
        let line_end = after_end.find('\n').map_or(after_end.len(), |i| i + 1);
        let len = end_at + line_end;
        out.push(&from[..len]);
        rest = &from[len..];
    }
    out
}

/// The cert dir's certificates of one kind (`kubelet-client`, `kubelet-server`).
#[derive(Debug, Clone)]
pub struct CertStore {
    dir: PathBuf,
    prefix: String,
}

impl CertStore {
    pub fn new(dir: &Path, prefix: &str) -> CertStore {
        CertStore {
            dir: dir.to_path_buf(),
            prefix: prefix.to_string(),
        }
    }

    /// `<dir>/<prefix>-current.pem`.
    pub fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    /// The certificate in use, if there is one; a file that is there but unusable (torn,
    /// truncated, not a certificate and key) is an error naming it.
    pub fn current(&self) -> Result<Option<Pair>, Error> {
        let path = self.current_path();
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(Error::Read { path, source }),
        };
        Pair::parse(&text).map(Some).map_err(|why| Error::Unusable {
            path,
            why: why.to_string(),
        })
    }

    /// Writes a new certificate and key as `<prefix>-<timestamp>.pem` and makes it current.
    /// Returns the new file's path.
    pub fn update(&self, cert_pem: &str, key_pem: &str) -> Result<PathBuf, Error> {
        std::fs::create_dir_all(&self.dir).map_err(|source| Error::Write {
            path: self.dir.clone(),
            source,
        })?;
        let stamp = chrono::Utc::now().format("%Y-%m-%d-%H-%M-%S");
        let mut file = self.dir.join(format!("{}-{stamp}.pem", self.prefix));
        // Two in the same second (a rotation right after a bootstrap): a suffix keeps both.
        let mut n = 1;
        while file.exists() {
            file = self.dir.join(format!("{}-{stamp}-{n}.pem", self.prefix));
            n += 1;
        }
        let mut body = cert_pem.to_string();
        if !body.ends_with('\n') {
            body.push('\n');
        }
        body.push_str(key_pem);
        write_private(&file, body.as_bytes())?;
        let link = self.current_path();
        let tmp = link.with_extension("pem.tmp");
        let _ = std::fs::remove_file(&tmp);
        let target = file.file_name().map(PathBuf::from).unwrap_or(file.clone());
        std::os::unix::fs::symlink(&target, &tmp).map_err(|source| Error::Write {
            path: tmp.clone(),
            source,
        })?;
        std::fs::rename(&tmp, &link).map_err(|source| Error::Write { path: link, source })?;
        Ok(file)
    }
}

/// Writes `data` to `path` with mode 0600, through a temporary file renamed over it.
pub fn write_private(path: &Path, data: &[u8]) -> Result<(), Error> {
    write_private_atomically(path, data).map_err(|source| Error::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// [`write_private`]'s I/O, for callers with errors of their own (the self-signed serving
/// certificate's key).
pub fn write_private_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
pub(crate) mod tests;
