//! Unpacking one layer (a tar, plain or gzip/zstd compressed) into a snapshot directory that
//! overlayfs can use as a lowerdir: whiteouts become 0:0 character devices, opaque markers become
//! the `trusted.overlay.opaque` xattr, and files keep their owners, modes, xattrs and mtimes.
//! Entries that would land outside the directory are refused. Returns the layer's diff_id (the
//! sha256 of the uncompressed tar) so the caller can check it against the image config.

use crate::digest::HashingReader;
use crate::error::{Error, Result};
use nix::sys::stat::{Mode, SFlag, UtimensatFlags, makedev, mknod, utimensat};
use nix::sys::time::TimeSpec;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use tar::EntryType;

const WHITEOUT_PREFIX: &str = ".wh.";
const OPAQUE_MARKER: &str = ".wh..wh..opq";
const OPAQUE_XATTR: &str = "trusted.overlay.opaque";
const PAX_XATTR_PREFIX: &str = "SCHILY.xattr.";

/// The compression of a layer blob, detected from its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compression {
    None,
    Gzip,
    Zstd,
}

/// A layer compression the store recognises but cannot unpack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UnsupportedCompression {
    #[error("bzip2 layers are not supported")]
    Bzip2,
    #[error("xz layers are not supported")]
    Xz,
}

/// Detects the compression of a blob from its magic bytes.
pub(crate) fn detect_compression(head: &[u8]) -> Result<Compression, UnsupportedCompression> {
    match head {
        [0x1f, 0x8b, ..] => Ok(Compression::Gzip),
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Ok(Compression::Zstd),
        [b'B', b'Z', b'h', ..] => Err(UnsupportedCompression::Bzip2),
        [0xfd, b'7', b'z', b'X', b'Z', 0x00, ..] => Err(UnsupportedCompression::Xz),
        _ => Ok(Compression::None),
    }
}

/// Opens a layer blob as a stream of uncompressed tar bytes.
pub(crate) fn open_decompressed(blob: &Path, layer: &str) -> Result<Box<dyn Read>> {
    let file = File::open(blob).map_err(|e| Error::io("opening layer", blob, e))?;
    let mut reader = BufReader::with_capacity(256 * 1024, file);
    let head =
        std::io::BufRead::fill_buf(&mut reader).map_err(|e| Error::io("reading layer", blob, e))?;
    let compression = detect_compression(head).map_err(|reason| Error::UnsafeLayerEntry {
        layer: layer.to_string(),
        entry: String::new(),
        reason: reason.to_string(),
    })?;
    Ok(match compression {
        Compression::None => Box::new(reader),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(reader)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(reader).map_err(
            |source| Error::CorruptLayer {
                layer: layer.to_string(),
                source,
            },
        )?),
    })
}

/// Unpacks the layer blob at `blob` into the existing, empty directory `dest` and returns its
/// diff_id. `layer` names the layer in errors.
pub(crate) fn unpack_layer(blob: &Path, layer: &str, dest: &Path) -> Result<String> {
    let reader = open_decompressed(blob, layer)?;
    unpack_stream(reader, layer, dest)
}

/// Unpacks an uncompressed tar stream into `dest`; returns the stream's sha256.
pub(crate) fn unpack_stream(reader: impl Read, layer: &str, dest: &Path) -> Result<String> {
    let corrupt = |source: io::Error| Error::CorruptLayer {
        layer: layer.to_string(),
        source,
    };
    let mut unpacker = Unpacker {
        layer,
        dest,
        is_root: nix::unistd::geteuid().is_root(),
        dir_times: Vec::new(),
    };
    let mut archive = tar::Archive::new(HashingReader::new(reader));
    for entry in archive.entries().map_err(corrupt)? {
        let mut entry = entry.map_err(corrupt)?;
        unpacker.entry(&mut entry)?;
    }
    unpacker.finish()?;
    let (diff_id, _) = archive.into_inner().drain_and_finish().map_err(corrupt)?;
    Ok(diff_id)
}

/// Metadata of one entry, with PAX overrides applied.
struct Meta {
    uid: u64,
    gid: u64,
    mode: u32,
    mtime: i64,
    xattrs: Vec<(String, Vec<u8>)>,
}

struct Unpacker<'a> {
    layer: &'a str,
    dest: &'a Path,
    is_root: bool,
    /// Directories whose mtime is set at the end (their children change it).
    dir_times: Vec<(PathBuf, i64)>,
}

impl Unpacker<'_> {
    fn unsafe_entry(&self, entry: &Path, reason: impl Into<String>) -> Error {
        Error::UnsafeLayerEntry {
            layer: self.layer.to_string(),
            entry: entry.display().to_string(),
            reason: reason.into(),
        }
    }

    fn corrupt(&self, source: io::Error) -> Error {
        Error::CorruptLayer {
            layer: self.layer.to_string(),
            source,
        }
    }

    fn entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<()> {
        let kind = entry.header().entry_type();
        if matches!(
            kind,
            EntryType::XGlobalHeader
                | EntryType::XHeader
                | EntryType::GNULongName
                | EntryType::GNULongLink
        ) {
            return Ok(());
        }
        let raw_path = entry.path().map_err(|e| self.corrupt(e))?.into_owned();
        let Some(rel) =
            clean_path(&raw_path).map_err(|r| self.unsafe_entry(&raw_path, r.to_string()))?
        else {
            // The layer's root directory itself.
            if kind == EntryType::Directory {
                let meta = self.meta(entry)?;
                self.apply_meta(self.dest, &meta, false)?;
                self.dir_times.push((self.dest.to_path_buf(), meta.mtime));
            }
            return Ok(());
        };
        let parent = self.prepare_parent(&rel, &raw_path)?;
        let name = rel.file_name().unwrap_or(OsStr::new(""));
        let name_str = name.to_string_lossy();
        if let Some(whited) = name_str.strip_prefix(WHITEOUT_PREFIX) {
            return self.whiteout(&parent, &name_str, whited, &raw_path);
        }
        let path = parent.join(name);
        match kind {
            EntryType::Directory => {
                let meta = self.meta(entry)?;
                match std::fs::symlink_metadata(&path) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        remove_any(&path)?;
                        mkdir(&path)?;
                    }
                    Err(_) => mkdir(&path)?,
                }
                self.apply_meta(&path, &meta, false)?;
                self.dir_times.push((path, meta.mtime));
            }
            EntryType::Regular | EntryType::Continuous => {
                let meta = self.meta(entry)?;
                remove_any(&path)?;
                let mut file = File::options()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .map_err(|e| Error::io("creating file", &path, e))?;
                self.copy_data(entry, &mut file, &path)?;
                drop(file);
                self.apply_meta(&path, &meta, false)?;
                set_mtime(&path, meta.mtime)?;
            }
            EntryType::Symlink => {
                let meta = self.meta(entry)?;
                let target = entry
                    .link_name()
                    .map_err(|e| self.corrupt(e))?
                    .ok_or_else(|| self.unsafe_entry(&raw_path, "symlink without a target"))?
                    .into_owned();
                remove_any(&path)?;
                std::os::unix::fs::symlink(&target, &path)
                    .map_err(|e| Error::io("creating symlink", &path, e))?;
                self.apply_meta(&path, &meta, true)?;
                set_mtime(&path, meta.mtime)?;
            }
            EntryType::Link => {
                let raw_target = entry
                    .link_name()
                    .map_err(|e| self.corrupt(e))?
                    .ok_or_else(|| self.unsafe_entry(&raw_path, "hard link without a target"))?
                    .into_owned();
                let target_rel = clean_path(&raw_target)
                    .map_err(|r| self.unsafe_entry(&raw_path, format!("hard link target: {r}")))?
                    .ok_or_else(|| self.unsafe_entry(&raw_path, "hard link to the root"))?;
                let target = self.existing_path(&target_rel, &raw_path)?;
                if target == path {
                    return Ok(());
                }
                remove_any(&path)?;
                std::fs::hard_link(&target, &path)
                    .map_err(|e| Error::io("creating hard link", &path, e))?;
            }
            EntryType::Char | EntryType::Block | EntryType::Fifo => {
                let meta = self.meta(entry)?;
                if kind != EntryType::Fifo && !self.is_root {
                    tracing::warn!(layer = self.layer, path = %path.display(), "skipping device node: not root");
                    return Ok(());
                }
                let header = entry.header();
                let major = header.device_major().ok().flatten().unwrap_or(0);
                let minor = header.device_minor().ok().flatten().unwrap_or(0);
                let sflag = match kind {
                    EntryType::Char => SFlag::S_IFCHR,
                    EntryType::Block => SFlag::S_IFBLK,
                    _ => SFlag::S_IFIFO,
                };
                remove_any(&path)?;
                mknod(
                    &path,
                    sflag,
                    Mode::from_bits_truncate(meta.mode & 0o777),
                    makedev(major.into(), minor.into()),
                )
                .map_err(|e| Error::sys("creating device node", &path, e))?;
                self.apply_meta(&path, &meta, false)?;
                set_mtime(&path, meta.mtime)?;
            }
            EntryType::GNUSparse => {
                return Err(self.unsafe_entry(&raw_path, "sparse files are not supported"));
            }
            other => {
                tracing::warn!(layer = self.layer, entry = %raw_path.display(), kind = ?other, "skipping unsupported tar entry");
            }
        }
        Ok(())
    }

    /// Turns `.wh.<name>` into an overlay whiteout and `.wh..wh..opq` into an opaque dir.
    fn whiteout(&self, parent: &Path, name: &str, whited: &str, raw: &Path) -> Result<()> {
        if name == OPAQUE_MARKER {
            return xattr::set(parent, OPAQUE_XATTR, b"y")
                .map_err(|e| Error::io("marking directory opaque", parent, e));
        }
        if whited.starts_with(WHITEOUT_PREFIX) {
            // Other .wh..wh. names are aufs metadata: nothing to do.
            return Ok(());
        }
        if whited.is_empty() || whited == "." || whited == ".." {
            return Err(self.unsafe_entry(raw, "whiteout of an invalid name"));
        }
        let path = parent.join(whited);
        remove_any(&path)?;
        mknod(&path, SFlag::S_IFCHR, Mode::empty(), makedev(0, 0))
            .map_err(|e| Error::sys("creating whiteout", &path, e))
    }

    /// Creates missing parents of `rel` (as root-owned 0755 dirs) and refuses to go through
    /// symlinks or non-directories. Returns the absolute parent directory.
    fn prepare_parent(&self, rel: &Path, raw: &Path) -> Result<PathBuf> {
        let mut dir = self.dest.to_path_buf();
        let Some(parent) = rel.parent() else {
            return Ok(dir);
        };
        for component in parent.components() {
            dir.push(component);
            match std::fs::symlink_metadata(&dir) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(self.unsafe_entry(raw, "path goes through a symlink"));
                }
                Ok(_) => {
                    return Err(self.unsafe_entry(raw, "a parent is not a directory"));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => mkdir(&dir)?,
                Err(e) => return Err(Error::io("inspecting", &dir, e)),
            }
        }
        Ok(dir)
    }

    /// The absolute path of an entry already unpacked in this layer, reached without symlinks.
    fn existing_path(&self, rel: &Path, raw: &Path) -> Result<PathBuf> {
        let mut path = self.dest.to_path_buf();
        let count = rel.components().count();
        for (i, component) in rel.components().enumerate() {
            path.push(component);
            let meta = std::fs::symlink_metadata(&path)
                .map_err(|_| self.unsafe_entry(raw, "hard link target is not in this layer"))?;
            let last = i + 1 == count;
            if !last && !meta.is_dir() {
                return Err(self.unsafe_entry(raw, "hard link target goes through a symlink"));
            }
            if last && meta.is_dir() {
                return Err(self.unsafe_entry(raw, "hard link to a directory"));
            }
        }
        Ok(path)
    }

    fn meta<R: Read>(&self, entry: &mut tar::Entry<'_, R>) -> Result<Meta> {
        let header = entry.header();
        // Like Go's archive/tar, an empty numeric field reads as 0.
        let mut meta = Meta {
            uid: header.uid().unwrap_or(0),
            gid: header.gid().unwrap_or(0),
            mode: header.mode().map_err(|e| self.corrupt(e))?,
            mtime: header.mtime().unwrap_or(0) as i64,
            xattrs: Vec::new(),
        };
        if let Some(extensions) = entry.pax_extensions().map_err(|e| self.corrupt(e))? {
            for ext in extensions {
                let ext = ext.map_err(|e| self.corrupt(e))?;
                let Ok(key) = ext.key() else { continue };
                let value = ext.value_bytes();
                let number = || std::str::from_utf8(value).ok().map(str::trim);
                match key {
                    "uid" => meta.uid = number().and_then(|v| v.parse().ok()).unwrap_or(meta.uid),
                    "gid" => meta.gid = number().and_then(|v| v.parse().ok()).unwrap_or(meta.gid),
                    "mtime" => {
                        let secs = number().and_then(|v| v.split('.').next()?.parse::<i64>().ok());
                        meta.mtime = secs.unwrap_or(meta.mtime);
                    }
                    _ => {
                        if let Some(name) = key.strip_prefix(PAX_XATTR_PREFIX) {
                            meta.xattrs.push((name.to_string(), value.to_vec()));
                        }
                    }
                }
            }
        }
        Ok(meta)
    }

    /// Owner, then mode (chown clears setuid), then xattrs.
    fn apply_meta(&self, path: &Path, meta: &Meta, symlink: bool) -> Result<()> {
        if self.is_root {
            let uid = u32::try_from(meta.uid).ok();
            let gid = u32::try_from(meta.gid).ok();
            std::os::unix::fs::lchown(path, uid, gid).map_err(|e| Error::io("chown", path, e))?;
        }
        if !symlink {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(meta.mode & 0o7777))
                .map_err(|e| Error::io("chmod", path, e))?;
        }
        for (name, value) in &meta.xattrs {
            if name.starts_with("trusted.overlay.") {
                // Only the unpacker decides what overlayfs sees as opaque or redirected.
                continue;
            }
            if let Err(e) = xattr::set(path, name, value) {
                let unsupported =
                    matches!(e.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::EPERM));
                if symlink || unsupported {
                    tracing::warn!(path = %path.display(), xattr = name, error = %e, "skipping xattr");
                } else {
                    return Err(Error::io("setting xattr", path, e));
                }
            }
        }
        Ok(())
    }

    /// Copies an entry's data, telling read (corrupt layer) from write (local I/O) failures.
    fn copy_data(&self, reader: &mut impl Read, file: &mut File, path: &Path) -> Result<()> {
        let mut buf = vec![0u8; 128 * 1024];
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.corrupt(e)),
            };
            file.write_all(&buf[..n])
                .map_err(|e| Error::io("writing file", path, e))?;
        }
    }

    /// Sets directory mtimes, deepest first.
    fn finish(&mut self) -> Result<()> {
        for (path, mtime) in self.dir_times.iter().rev() {
            match set_mtime(path, *mtime) {
                // A later entry replaced the directory.
                Err(Error::Sys {
                    source: nix::Error::ENOENT,
                    ..
                }) => {}
                other => other?,
            }
        }
        Ok(())
    }
}

/// Why a tar path cannot be made relative and clean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum UncleanPath {
    #[error("path contains '..'")]
    ParentDir,
    #[error("path has a prefix")]
    Prefix,
}

/// Makes a tar path relative and clean: `./a//b` → `a/b`, `/a` → `a`; `..` is refused. None is
/// the root itself.
fn clean_path(path: &Path) -> Result<Option<PathBuf>, UncleanPath> {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(c) => out.push(c),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => return Err(UncleanPath::ParentDir),
            Component::Prefix(_) => return Err(UncleanPath::Prefix),
        }
    }
    Ok(if out.as_os_str().is_empty() {
        None
    } else {
        Some(out)
    })
}

fn mkdir(path: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(path)
        .map_err(|e| Error::io("creating directory", path, e))
}

/// Removes whatever is at `path` (a later entry replaces an earlier one of the same name).
fn remove_any(path: &Path) -> Result<()> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    result.map_err(|e| Error::io("removing", path, e))
}

fn set_mtime(path: &Path, mtime: i64) -> Result<()> {
    let ts = TimeSpec::new(mtime, 0);
    utimensat(None, path, &ts, &ts, UtimensatFlags::NoFollowSymlink)
        .map_err(|e| Error::sys("setting mtime", path, e))
}

#[cfg(test)]
mod tests;
