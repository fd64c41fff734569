//! Content digests: sha256 while reading or writing a stream, validation of `sha256:<hex>`
//! strings before they become file names, and comparing content against its descriptor.

use crate::error::{Error, Result};
use sha2::{Digest as _, Sha256};
use std::io::{self, Read, Write};
use std::path::Path;

/// Returns the hex part of a `sha256:<64 hex>` digest, or an InvalidArgument error naming `what`.
/// Every digest from outside passes through here before it is used in a path.
pub(crate) fn hex_of<'a>(digest: &'a str, what: &str) -> Result<&'a str> {
    crate::reference::check_digest(digest).map_err(|reason| Error::DigestMismatch {
        what: what.to_string(),
        expected: "a sha256 digest".to_string(),
        actual: reason.to_string(),
    })?;
    Ok(&digest["sha256:".len()..])
}

/// `sha256:<hex>` of a byte slice.
pub(crate) fn sha256_bytes(data: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(data)))
}

/// A running sha256 and byte count.
#[derive(Default, Clone)]
pub(crate) struct Hasher {
    sha: Sha256,
    len: u64,
}

impl Hasher {
    pub fn update(&mut self, data: &[u8]) {
        self.sha.update(data);
        self.len += data.len() as u64;
    }

    /// `(sha256:<hex>, bytes)`.
    pub fn finish(self) -> (String, u64) {
        (
            format!("sha256:{}", hex::encode(self.sha.finalize())),
            self.len,
        )
    }
}

/// A reader that hashes everything read through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Hasher,
}

impl<R: Read> HashingReader<R> {
    pub fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Hasher::default(),
        }
    }

    /// Reads the rest of the stream (e.g. tar padding), then returns `(digest, bytes read)`.
    pub fn drain_and_finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok(self.hasher.finish())
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

/// Copies `reader` into `writer`, returning the content's `(digest, size)`.
pub(crate) fn copy_hashed(
    reader: &mut impl Read,
    writer: &mut impl Write,
) -> io::Result<(String, u64)> {
    let mut hasher = Hasher::default();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        hasher.update(&buf[..n]);
        writer.write_all(&buf[..n])?;
    }
    Ok(hasher.finish())
}

/// `(digest, size)` of a file.
pub(crate) fn sha256_file(path: &Path) -> Result<(String, u64)> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io("reading blob", path, e))?;
    copy_hashed(&mut file, &mut io::sink()).map_err(|e| Error::io("hashing blob", path, e))
}

/// Checks content against its descriptor; `size` is skipped when the descriptor has none.
pub(crate) fn verify(
    what: &str,
    expected_digest: &str,
    expected_size: Option<u64>,
    actual: &(String, u64),
) -> Result<()> {
    if actual.0 != expected_digest {
        return Err(Error::DigestMismatch {
            what: what.to_string(),
            expected: expected_digest.to_string(),
            actual: actual.0.clone(),
        });
    }
    if let Some(size) = expected_size {
        if size != actual.1 {
            return Err(Error::DigestMismatch {
                what: format!("{what} size"),
                expected: format!("{size} bytes"),
                actual: format!("{} bytes", actual.1),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_and_verifies() {
        let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(sha256_bytes(b""), empty);
        let mut out = Vec::new();
        let got = copy_hashed(&mut &b"hello"[..], &mut out).unwrap();
        assert_eq!(out, b"hello");
        assert_eq!(got, (sha256_bytes(b"hello"), 5));
        verify("x", &sha256_bytes(b"hello"), Some(5), &got).unwrap();
        let err = verify("x", empty, Some(5), &got).unwrap_err();
        assert_eq!(err.kind(), crate::Kind::InvalidArgument);
        let err = verify("x", &sha256_bytes(b"hello"), Some(6), &got).unwrap_err();
        assert!(err.to_string().contains("size"), "{err}");
    }

    #[test]
    fn hex_of_rejects_paths() {
        assert!(hex_of("sha256:../../etc/passwd", "x").is_err());
        assert!(hex_of("sha512:ab", "x").is_err());
        let d = sha256_bytes(b"");
        assert_eq!(hex_of(&d, "x").unwrap().len(), 64);
    }
}
