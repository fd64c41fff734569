//! ID-mapped mounts (Linux 5.12+): a clone of a directory tree that shows its files through a
//! user namespace's ID mapping. Files the node's root owns appear owned by the namespace's root
//! (host ID `mapping(0)`), and what that root writes through the mount lands on disk as the
//! node's root, so a pod in a user namespace sees its image and volumes as it would without one.
//!
//! The new mount API has no wrapper in nix or libc, so the three syscalls are called here.
#![allow(unsafe_code)]

use crate::error::{Error, Result};
use std::ffi::CString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| Error::sys("ID-mapping", path, nix::Error::EINVAL))
}

fn last_error() -> nix::Error {
    nix::Error::last()
}

/// A detached clone of the tree at `source` (its submounts too when `recursive`), ID-mapped
/// through the user namespace `userns`. Nothing is mounted until [`attach`].
pub fn clone_mapped(source: &Path, userns: BorrowedFd<'_>, recursive: bool) -> Result<OwnedFd> {
    let path = c_path(source)?;
    let mut flags = OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: a NUL-terminated path and plain flags; the returned fd is checked and owned.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, path.as_ptr(), flags) };
    if fd < 0 {
        return Err(Error::sys("cloning mount", source, last_error()));
    }
    // SAFETY: open_tree returned a new fd that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let mut at = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        at |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: an empty path on a valid fd, and a mount_attr of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            at,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(Error::sys("ID-mapping mount", source, last_error()));
    }
    Ok(tree)
}

/// Mounts a detached tree from [`clone_mapped`] at `target`, which must exist (a directory for a
/// directory, a file for a file).
pub fn attach(tree: OwnedFd, target: &Path) -> Result<()> {
    let path = c_path(target)?;
    // SAFETY: an empty source path on a valid fd and a NUL-terminated target path.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            path.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r < 0 {
        return Err(Error::sys(
            "attaching ID-mapped mount",
            target,
            last_error(),
        ));
    }
    Ok(())
}

/// Bind-mounts `source` at `target`, ID-mapped through `userns`.
pub fn bind_mapped(
    source: &Path,
    target: &Path,
    userns: BorrowedFd<'_>,
    recursive: bool,
) -> Result<()> {
    attach(clone_mapped(source, userns, recursive)?, target)
}

/// Detaches whatever is mounted at `target` (lazily; not mounted is fine).
pub fn detach(target: &Path) -> Result<()> {
    match nix::mount::umount2(target, nix::mount::MntFlags::MNT_DETACH) {
        Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(()),
        Err(e) => Err(Error::sys("detaching ID-mapped mount", target, e)),
    }
}
