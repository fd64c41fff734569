//! A volume given to a pod's `fsGroup` (upstream's `SetVolumeOwnership`, behaviour only):
//! every file and directory under it owned by the group (links too, without following them),
//! files `| 0660` (`| 0440` read-only), directories also `| 0110` and setgid; links' modes are
//! left alone.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use super::PluginError;

fn masks(read_only: bool) -> (u32, u32) {
    let file = if read_only { 0o440 } else { 0o660 };
    (file, file | 0o110 | 0o2000)
}

/// Whether the volume's root already has the group and the bits (`OnRootMismatch`'s check).
pub fn root_matches(dir: &Path, group: u32, read_only: bool) -> bool {
    let (_, dir_bits) = masks(read_only);
    std::fs::metadata(dir).is_ok_and(|m| m.gid() == group && m.mode() & dir_bits == dir_bits)
}

/// Gives everything under `dir` (itself included) to `group`.
pub fn set_volume_ownership(dir: &Path, group: u32, read_only: bool) -> Result<(), PluginError> {
    let (file_bits, dir_bits) = masks(read_only);
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let fail = |source| PluginError::Own {
            path: path.clone(),
            group,
            source,
        };
        let meta = std::fs::symlink_metadata(&path).map_err(fail)?;
        std::os::unix::fs::lchown(&path, None, Some(group)).map_err(fail)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let bits = if meta.is_dir() { dir_bits } else { file_bits };
        let mode = meta.mode() & 0o7777 | bits;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).map_err(fail)?;
        if meta.is_dir() {
            for e in std::fs::read_dir(&path).map_err(fail)? {
                stack.push(e.map_err(fail)?.path());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn everything_is_the_groups() {
        let tmp = tempfile::tempdir().expect("tmp");
        let dir = tmp.path();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("0755");
        std::fs::create_dir(dir.join("sub")).expect("sub");
        std::fs::write(dir.join("sub/f"), "x").expect("f");
        std::fs::set_permissions(dir.join("sub/f"), std::fs::Permissions::from_mode(0o600))
            .expect("0600");
        std::os::unix::fs::symlink("/etc/passwd", dir.join("link")).expect("link");
        assert!(!root_matches(dir, 3000, false));
        set_volume_ownership(dir, 3000, false).expect("owned");
        let m = |p: &Path| std::fs::symlink_metadata(p).expect("metadata");
        assert_eq!((m(dir).gid(), m(dir).mode() & 0o7777), (3000, 0o2775));
        let sub = dir.join("sub");
        assert_eq!((m(&sub).gid(), m(&sub).mode() & 0o7777), (3000, 0o2775));
        let f = dir.join("sub/f");
        assert_eq!((m(&f).gid(), m(&f).mode() & 0o7777), (3000, 0o660));
        // The link is the group's; what it points to is untouched.
        assert_eq!(m(&dir.join("link")).gid(), 3000);
        assert_ne!(
            std::fs::metadata("/etc/passwd").expect("passwd").gid(),
            3000
        );
        assert!(root_matches(dir, 3000, false));
    }
}
