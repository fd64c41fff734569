//! Writes a set of files into a volume directory so that a reader never sees a half-written set
//! (upstream's `AtomicWriter`, `pkg/volume/util/atomic_writer.go`, behaviour only).
//!
//! The layout, as upstream's and what tools that know it expect:
//!
//! ```text
//! <dir>/..2026_12_02_03_04_05.123456789/   the current data (mode 0755), one per write
//! <dir>/..data -> ..2026_12_02_03_04_05.123456789
//! <dir>/<key>  -> ..data/<key>           one link per top-level name of the payload
//! ```
//!
//! A write that changes something makes a new timestamped directory, fills it, points a new
//! `..data_tmp` link at it and renames that over `..data` (the one atomic step), then adds the
//! links of new top-level names, removes those of names gone and removes the old directory. A
//! payload equal to what is there (same paths, contents and modes) writes nothing (the links
//! are still made when missing). A container that bound the volume sees each update at once;
//! one that bound a file of it through a `subPath` keeps the file it bound.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// The link naming the current data directory.
pub const DATA_DIR: &str = "..data";
/// The link made next to [`DATA_DIR`] then renamed over it.
const DATA_DIR_TMP: &str = "..data_tmp";
/// What an `fsGroup` adds to a written volume (upstream's `SetVolumeOwnership` of a read-only
/// volume): files `0440`, directories `0440 | 0110` and setgid, all owned by the group.
const GROUP_FILE_BITS: u32 = 0o440;
const GROUP_DIR_BITS: u32 = 0o2550;
/// Upstream's limits on a path and on each of its names.
const MAX_PATH_LENGTH: usize = 4096;
const MAX_FILE_NAME_LENGTH: usize = 255;

/// Why a payload was refused or could not be written (upstream's messages for the refusals).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    // A payload path refused by upstream's `validatePath` ([`validate_path`]), by its rule.
    #[error("invalid path: must not be empty: \"\"")]
    EmptyPath,
    #[error("invalid path: must be relative path: {0}")]
    AbsolutePath(String),
    #[error("invalid path: must be less than or equal to {MAX_PATH_LENGTH} characters")]
    PathTooLong,
    #[error("invalid path: must not contain '..': {0}")]
    ParentName(String),
    #[error(
        "invalid path: filenames must be less than or equal to {MAX_FILE_NAME_LENGTH} characters"
    )]
    NameTooLong,
    #[error("invalid path: must not start with '..': {0}")]
    DotDotPrefix(String),
    /// A path naming nothing but the volume directory (`.`, `./`).
    #[error("invalid path: {0:?} names the volume itself")]
    VolumeItself(String),
    /// A file mode that is not permission bits.
    #[error("invalid mode {mode:#o} for {path}: must be between 0 and 0777")]
    InvalidMode { path: String, mode: u32 },
    /// `file` is a file of the payload and a directory of its `path`.
    #[error("invalid payload: {file} is a file and a directory of {path}")]
    FileAndDirectory { file: String, path: String },
    /// Every data directory name tried was taken.
    #[error("no free data directory name in {}", .0.display())]
    NoFreeName(PathBuf),
    /// A file operation in the volume directory failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: FileOp,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The new `..data_tmp` link could not replace [`DATA_DIR`].
    #[error("renaming {} to {DATA_DIR}: {source}", tmp.display())]
    Swap {
        tmp: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What a [`WriteError::Io`] was doing, as its message says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileOp {
    Read,
    Create,
    SetMode,
    Write,
    Remove,
    Link,
    Own,
}

impl std::fmt::Display for FileOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileOp::Read => "reading",
            FileOp::Create => "creating",
            FileOp::SetMode => "setting the mode of",
            FileOp::Write => "writing",
            FileOp::Remove => "removing",
            FileOp::Link => "linking",
            FileOp::Own => "owning",
        })
    }
}

/// The [`WriteError::Io`] of `op` on `path`, for `map_err`.
fn io_error(op: FileOp, path: &Path) -> impl Fn(io::Error) -> WriteError + Copy + '_ {
    move |source| WriteError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// One file of a payload: its content and permission bits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// Files by their path relative to the volume directory.
pub type Payload = BTreeMap<String, FileProjection>;

/// Upstream's `validatePath`: a relative, non-empty path without a `..` name, not starting
/// with `..`, within the length limits.
pub fn validate_path(p: &str) -> Result<(), WriteError> {
    if p.is_empty() {
        return Err(WriteError::EmptyPath);
    }
    if p.starts_with('/') {
        return Err(WriteError::AbsolutePath(p.to_string()));
    }
    if p.len() > MAX_PATH_LENGTH {
        return Err(WriteError::PathTooLong);
    }
    let items: Vec<&str> = p.split('/').collect();
    for item in &items {
        if *item == ".." {
            return Err(WriteError::ParentName(p.to_string()));
        }
        if item.len() > MAX_FILE_NAME_LENGTH {
            return Err(WriteError::NameTooLong);
        }
    }
    if items[0].starts_with("..") && items[0].len() > 2 {
        return Err(WriteError::DotDotPrefix(p.to_string()));
    }
    Ok(())
}

/// The path with `.` names and repeated or trailing slashes dropped (Go's `filepath.Clean` of
/// a relative path without `..`).
fn clean(p: &str) -> String {
    let names: Vec<&str> = p
        .split('/')
        .filter(|n| !n.is_empty() && *n != ".")
        .collect();
    names.join("/")
}

/// The payload validated, with cleaned paths; paths that would be both a file and a directory
/// are refused.
fn validate_payload(payload: &Payload) -> Result<Payload, WriteError> {
    let mut out = Payload::new();
    for (path, file) in payload {
        validate_path(path)?;
        if file.mode > 0o777 {
            return Err(WriteError::InvalidMode {
                path: path.clone(),
                mode: file.mode,
            });
        }
        let c = clean(path);
        if c.is_empty() {
            return Err(WriteError::VolumeItself(path.clone()));
        }
        out.insert(c, file.clone());
    }
    for path in out.keys() {
        let mut prefix = String::new();
        for name in path.split('/') {
            if !prefix.is_empty() && out.contains_key(&prefix) {
                return Err(WriteError::FileAndDirectory {
                    file: prefix,
                    path: path.clone(),
                });
            }
            if !prefix.is_empty() {
                prefix.push('/');
            }
            prefix.push_str(name);
        }
    }
    Ok(out)
}

fn first_name(p: &str) -> &str {
    p.split('/').next().unwrap_or(p)
}

/// The files under `dir` (relative paths) with their contents and modes; following no link.
fn read_tree(dir: &Path) -> Result<Payload, WriteError> {
    let mut out = Payload::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let here = dir.join(&rel);
        let entries = std::fs::read_dir(&here).map_err(io_error(FileOp::Read, &here))?;
        for entry in entries {
            let entry = entry.map_err(io_error(FileOp::Read, &here))?;
            let path = rel.join(entry.file_name());
            let full = dir.join(&path);
            let meta = entry.metadata().map_err(io_error(FileOp::Read, &full))?;
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                let data = std::fs::read(&full).map_err(io_error(FileOp::Read, &full))?;
                out.insert(
                    path.to_string_lossy().into_owned(),
                    FileProjection {
                        data,
                        mode: meta.permissions().mode() & 0o7777,
                    },
                );
            }
        }
    }
    Ok(out)
}

/// A new, empty data directory's name: `..<UTC time>.<nanoseconds and a random number>`.
fn new_data_dir(dir: &Path, group: Option<u32>) -> Result<String, WriteError> {
    let now = chrono::Utc::now();
    for _ in 0..100 {
        let name = format!(
            "{}{:09}{:04}",
            now.format("..%Y_%m_%d_%H_%M_%S."),
            now.timestamp_subsec_nanos(),
            fastrand::u16(..10000)
        );
        match DirBuilder::new().mode(0o700).create(dir.join(&name)) {
            Ok(()) => {
                // Group and others must be able to walk it, whatever the umask.
                own_dir(&dir.join(&name), 0o755, group)?;
                return Ok(name);
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error(FileOp::Create, &dir.join(&name))(e)),
        }
    }
    Err(WriteError::NoFreeName(dir.to_path_buf()))
}

/// Sets a directory's mode (with the group's bits, and the group as its owner, when given).
fn own_dir(path: &Path, mode: u32, group: Option<u32>) -> Result<(), WriteError> {
    let fail = io_error(FileOp::SetMode, path);
    if let Some(g) = group {
        std::os::unix::fs::chown(path, None, Some(g)).map_err(fail)?;
    }
    let mode = mode | group.map_or(0, |_| GROUP_DIR_BITS);
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(fail)
}

/// Writes each file of `payload` under `data` (made directories 0755, files with their mode
/// whatever the umask; owned by `group` when given).
fn write_files(data: &Path, payload: &Payload, group: Option<u32>) -> Result<(), WriteError> {
    for (path, file) in payload {
        let full = data.join(path);
        // Each directory between `data` and the file, made as needed.
        let mut at = data.to_path_buf();
        let names: Vec<&str> = path.split('/').collect();
        for name in &names[..names.len().saturating_sub(1)] {
            at.push(name);
            match DirBuilder::new().mode(0o755).create(&at) {
                Ok(()) => own_dir(&at, 0o755, group)?,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io_error(FileOp::Create, &at)(e)),
            }
        }
        let fail = io_error(FileOp::Write, &full);
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(file.mode)
            .open(&full)
            .map_err(fail)?;
        f.write_all(&file.data).map_err(fail)?;
        if let Some(g) = group {
            std::os::unix::fs::fchown(&f, None, Some(g)).map_err(fail)?;
        }
        f.set_permissions(std::fs::Permissions::from_mode(file.mode))
            .map_err(fail)?;
    }
    Ok(())
}

/// Writes `payload` into the volume directory `dir` (which must exist) as described in the
/// module docs. Returns whether a new data directory was written.
pub fn write(dir: &Path, payload: &Payload) -> Result<bool, WriteError> {
    write_owned(dir, payload, None)
}

/// [`write`], the volume owned by the pod's `fsGroup` when given: the volume directory, the
/// data and every file its group's (files `| 0440`, directories `| 02550`), as upstream's
/// `SetVolumeOwnership` leaves a read-only volume, done before the swap.
pub fn write_owned(dir: &Path, payload: &Payload, group: Option<u32>) -> Result<bool, WriteError> {
    let mut payload = validate_payload(payload)?;
    if group.is_some() {
        for f in payload.values_mut() {
            f.mode |= GROUP_FILE_BITS;
        }
    }
    if let Some(g) = group {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(dir).map_err(io_error(FileOp::Read, dir))?;
        let want = meta.mode() & 0o7777 | GROUP_DIR_BITS;
        if meta.gid() != g || meta.mode() & 0o7777 != want {
            own_dir(dir, meta.mode() & 0o7777, group)?;
        }
    }
    let data_link = dir.join(DATA_DIR);
    let old = match std::fs::read_link(&data_link) {
        Ok(target) => Some(target),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_error(FileOp::Read, &data_link)(e)),
    };
    // Only a link to a name in this directory is ours to replace and remove.
    let old = old.filter(|t| {
        let mut c = t.components();
        matches!((c.next(), c.next()), (Some(Component::Normal(_)), None))
    });
    let old_files = match &old {
        Some(t) if dir.join(t).is_dir() => Some(read_tree(&dir.join(t))?),
        _ => None,
    };
    let new_names: BTreeSet<&str> = payload.keys().map(|p| first_name(p)).collect();
    let old_names: BTreeSet<String> = old_files
        .iter()
        .flat_map(|f| f.keys())
        .map(|p| first_name(p).to_string())
        .collect();
    let written = old_files.as_ref() != Some(&payload);
    if written {
        let name = new_data_dir(dir, group)?;
        let data = dir.join(&name);
        if let Err(e) = write_files(&data, &payload, group) {
            let _ = std::fs::remove_dir_all(&data);
            return Err(e);
        }
        let tmp = dir.join(DATA_DIR_TMP);
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error(FileOp::Remove, &tmp)(e)),
        }
        std::os::unix::fs::symlink(&name, &tmp).map_err(io_error(FileOp::Link, &tmp))?;
        if let Some(g) = group {
            std::os::unix::fs::lchown(&tmp, None, Some(g)).map_err(io_error(FileOp::Own, &tmp))?;
        }
        std::fs::rename(&tmp, &data_link).map_err(|source| WriteError::Swap {
            tmp: tmp.clone(),
            source,
        })?;
    }
    for name in &new_names {
        let visible = dir.join(name);
        match std::fs::symlink_metadata(&visible) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::os::unix::fs::symlink(Path::new(DATA_DIR).join(name), &visible)
                    .map_err(io_error(FileOp::Link, &visible))?;
                if let Some(g) = group {
                    std::os::unix::fs::lchown(&visible, None, Some(g))
                        .map_err(io_error(FileOp::Own, &visible))?;
                }
            }
            Err(e) => return Err(io_error(FileOp::Read, &visible)(e)),
        }
    }
    if written {
        for gone in old_names.iter().filter(|n| !new_names.contains(n.as_str())) {
            let visible = dir.join(gone);
            if std::fs::symlink_metadata(&visible).is_ok_and(|m| m.file_type().is_symlink()) {
                std::fs::remove_file(&visible).map_err(io_error(FileOp::Remove, &visible))?;
            }
        }
        if let Some(t) = &old {
            let old_dir = dir.join(t);
            if old_dir.is_dir() {
                std::fs::remove_dir_all(&old_dir).map_err(io_error(FileOp::Remove, &old_dir))?;
            }
        }
    }
    Ok(written)
}

#[cfg(test)]
mod tests;
