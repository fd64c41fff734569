//! The input of an import as a directory tree: an OCI layout directory is used in place; an
//! archive (tar, optionally gzip- or zstd-compressed) is extracted into the staging area first. Files are
//! then looked up by relative path, never leaving the tree (symlinks included).

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Component, Path, PathBuf};

/// Largest JSON document (index, manifest, config) read into memory.
pub(crate) const MAX_JSON: u64 = 32 << 20;

/// An import input laid out as a directory.
#[derive(Debug)]
pub(crate) struct Source {
    /// What the user gave us, for error messages.
    pub origin: PathBuf,
    /// The directory holding the layout (canonical).
    root: PathBuf,
    /// Whether `root` is our own extraction (files may then be moved rather than copied).
    pub extracted: bool,
}

impl Source {
    /// Opens `path`: a directory as is, a file as a (gzip or zstd) tar extracted into
    /// `scratch`.
    pub fn open(path: &Path, scratch: &Path) -> Result<Source> {
        let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => Error::invalid_image(path, "no such file or directory"),
            _ => Error::io("opening import source", path, e),
        })?;
        let (dir, extracted) = if meta.is_dir() {
            (path.to_path_buf(), false)
        } else {
            extract(path, scratch)?;
            (scratch.to_path_buf(), true)
        };
        let root = dir
            .canonicalize()
            .map_err(|e| Error::io("resolving import source", &dir, e))?;
        Ok(Source {
            origin: path.to_path_buf(),
            root,
            extracted,
        })
    }

    /// Whether a relative path exists in the tree.
    pub fn exists(&self, rel: &str) -> bool {
        self.resolve(rel).is_ok()
    }

    /// The absolute path of `rel`, which must stay inside the tree after resolving symlinks.
    pub fn resolve(&self, rel: &str) -> Result<PathBuf> {
        let clean = clean_relative(rel)
            .ok_or_else(|| Error::invalid_image(&self.origin, format!("unsafe path {rel:?}")))?;
        let joined = self.root.join(clean);
        let real = joined.canonicalize().map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => {
                Error::invalid_image(&self.origin, format!("{rel} is missing"))
            }
            _ => Error::io("resolving", &joined, e),
        })?;
        if !real.starts_with(&self.root) {
            return Err(Error::invalid_image(
                &self.origin,
                format!("{rel} points outside the image"),
            ));
        }
        Ok(real)
    }

    /// Reads a (JSON) file of at most [`MAX_JSON`] bytes.
    pub fn read(&self, rel: &str) -> Result<Vec<u8>> {
        let path = self.resolve(rel)?;
        let file = File::open(&path).map_err(|e| Error::io("reading", &path, e))?;
        let mut data = Vec::new();
        file.take(MAX_JSON + 1)
            .read_to_end(&mut data)
            .map_err(|e| Error::io("reading", &path, e))?;
        if data.len() as u64 > MAX_JSON {
            return Err(Error::invalid_image(
                &self.origin,
                format!("{rel} is larger than {MAX_JSON} bytes"),
            ));
        }
        Ok(data)
    }
}

/// `a/./b` → `a/b`; None for empty paths, absolute paths and `..`.
fn clean_relative(rel: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for component in Path::new(rel).components() {
        match component {
            Component::Normal(c) => out.push(c),
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// Extracts a tar (plain, gzip or zstd) of regular files, directories and in-tree symlinks into `dest`.
fn extract(archive: &Path, dest: &Path) -> Result<()> {
    let corrupt = |source: io::Error| Error::CorruptArchive {
        path: archive.to_path_buf(),
        source,
    };
    let file = File::open(archive).map_err(|e| Error::io("opening archive", archive, e))?;
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let head = reader.fill_buf().map_err(corrupt)?;
    if head.is_empty() {
        return Err(Error::invalid_image(archive, "archive is empty"));
    }
    let stream: Box<dyn Read> = if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(reader))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(reader).map_err(corrupt)?)
    } else {
        Box::new(reader)
    };
    std::fs::create_dir_all(dest).map_err(|e| Error::io("creating", dest, e))?;
    let mut tar = tar::Archive::new(stream);
    let mut count = 0usize;
    for entry in tar.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        let raw = entry.path().map_err(corrupt)?.into_owned();
        let raw_str = raw.to_string_lossy().into_owned();
        let kind = entry.header().entry_type();
        let Some(rel) = clean_relative(&raw_str) else {
            if matches!(raw_str.as_str(), "." | "./" | "/") {
                continue;
            }
            return Err(Error::invalid_image(
                archive,
                format!("archive entry {raw_str:?} is not a safe relative path"),
            ));
        };
        let target = dest.join(&rel);
        ensure_parents(dest, &rel, archive)?;
        match kind {
            tar::EntryType::Directory => {
                if !target.is_dir() {
                    std::fs::create_dir(&target).map_err(|e| Error::io("creating", &target, e))?;
                }
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let mut out =
                    File::create(&target).map_err(|e| Error::io("creating", &target, e))?;
                let expected = entry.header().size().map_err(corrupt)?;
                let written = copy_entry(&mut entry, &mut out, &target).map_err(|e| match e {
                    CopyError::Read(e) => corrupt(e),
                    CopyError::Write(e) => e,
                })?;
                if written != expected {
                    return Err(corrupt(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("{raw_str} is truncated ({written} of {expected} bytes)"),
                    )));
                }
            }
            tar::EntryType::Symlink => {
                let link = entry
                    .link_name()
                    .map_err(corrupt)?
                    .ok_or_else(|| Error::invalid_image(archive, "symlink without target"))?;
                // Resolved (and confined) on use by Source::resolve.
                std::os::unix::fs::symlink(&link, &target)
                    .map_err(|e| Error::io("creating symlink", &target, e))?;
            }
            tar::EntryType::Link => {
                let link = entry
                    .link_name()
                    .map_err(corrupt)?
                    .ok_or_else(|| Error::invalid_image(archive, "hard link without target"))?;
                let link = clean_relative(&link.to_string_lossy()).ok_or_else(|| {
                    Error::invalid_image(archive, format!("unsafe hard link in {raw_str:?}"))
                })?;
                let from = dest.join(link);
                if std::fs::symlink_metadata(&from)
                    .map(|m| m.is_file())
                    .unwrap_or(false)
                {
                    std::fs::hard_link(&from, &target)
                        .map_err(|e| Error::io("creating hard link", &target, e))?;
                } else {
                    return Err(Error::invalid_image(
                        archive,
                        format!("hard link {raw_str:?} to a missing file"),
                    ));
                }
            }
            // PAX headers and the like carry nothing an image layout needs.
            _ => continue,
        }
        count += 1;
    }
    if count == 0 {
        return Err(Error::invalid_image(archive, "archive has no entries"));
    }
    Ok(())
}

/// Creates the parents of `rel` under `dest`, refusing to go through symlinks.
fn ensure_parents(dest: &Path, rel: &Path, archive: &Path) -> Result<()> {
    let mut dir = dest.to_path_buf();
    let Some(parent) = rel.parent() else {
        return Ok(());
    };
    for component in parent.components() {
        dir.push(component);
        match std::fs::symlink_metadata(&dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::invalid_image(
                    archive,
                    format!(
                        "archive entry {} goes through a non-directory",
                        rel.display()
                    ),
                ));
            }
            Err(_) => std::fs::create_dir(&dir).map_err(|e| Error::io("creating", &dir, e))?,
        }
    }
    Ok(())
}

enum CopyError {
    Read(io::Error),
    Write(Error),
}

fn copy_entry(reader: &mut impl Read, out: &mut File, path: &Path) -> Result<u64, CopyError> {
    use std::io::Write;
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0u64;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        out.write_all(&buf[..n])
            .map_err(|e| CopyError::Write(Error::io("writing", path, e)))?;
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_stays_inside() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("blobs")).unwrap();
        std::fs::write(root.join("blobs/a"), b"a").unwrap();
        std::fs::write(dir.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink("../secret", root.join("out")).unwrap();
        std::os::unix::fs::symlink("blobs/a", root.join("in")).unwrap();
        let src = Source::open(&root, &dir.path().join("unused")).unwrap();
        assert_eq!(src.read("in").unwrap(), b"a");
        assert_eq!(src.read("./blobs/a").unwrap(), b"a");
        assert!(src.read("out").is_err());
        assert!(src.read("../secret").is_err());
        assert!(src.read("/etc/passwd").is_err());
        assert!(!src.exists("nope"));
    }

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn archives_plain_gzip_and_zstd_are_extracted_and_a_truncated_one_is_corrupt() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let tar = tar_of(&[("index.json", b"{}"), ("blobs/sha256/x", b"x")]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).unwrap();
        let zst = zstd::stream::encode_all(&tar[..], 3).unwrap();
        for (name, data) in [
            ("a.tar", tar.clone()),
            ("a.tar.gz", gz.finish().unwrap()),
            ("a.tar.zst", zst.clone()),
        ] {
            let archive = dir.path().join(name);
            std::fs::write(&archive, data).unwrap();
            let scratch = dir.path().join(format!("x-{name}"));
            let src = Source::open(&archive, &scratch).unwrap();
            assert!(src.extracted);
            assert_eq!(src.read("index.json").unwrap(), b"{}", "{name}");
            assert_eq!(src.read("blobs/sha256/x").unwrap(), b"x", "{name}");
        }
        let cut = dir.path().join("cut.tar.zst");
        std::fs::write(&cut, &zst[..zst.len() / 2]).unwrap();
        let err = Source::open(&cut, &dir.path().join("x-cut")).unwrap_err();
        assert!(err.to_string().contains("cut.tar.zst"), "{err}");
    }
}
