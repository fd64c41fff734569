//! Device nodes and the device cgroup rules that go with them.
//!
//! An unprivileged container starts from "deny everything" (libcontainer then allows its own
//! defaults: null, zero, full, tty, urandom, random, console, ptys, tun); each requested
//! device is created in the container and allowed with the requested permissions. A
//! privileged container gets every device node of the host (like containerd's
//! `WithHostDevices`) and access to all devices.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    LinuxDevice, LinuxDeviceBuilder, LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType,
};

use super::{invalid, oci_error};
use crate::{Result, cri};

/// Directories and files of the host's /dev that are never copied (containerd's list).
const SKIPPED_DIRS: &[&str] = &["pts", "shm", "fd", "mqueue", ".lxc", ".lxd-mounts", ".udev"];

/// The major number of a `dev_t`, as glibc's `major()` computes it.
pub(super) fn major(dev: u64) -> i64 {
    (((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)) as i64
}

/// The minor number of a `dev_t`, as glibc's `minor()` computes it.
pub(super) fn minor(dev: u64) -> i64 {
    (((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)) as i64
}

/// The device node at `host` (not following a final symlink), to be created at `container`.
/// `Ok(None)` if it is not a character or block device.
fn device_at(host: &Path, container: &Path, follow: bool) -> std::io::Result<Option<LinuxDevice>> {
    let meta = if follow {
        std::fs::metadata(host)?
    } else {
        std::fs::symlink_metadata(host)?
    };
    let ft = meta.file_type();
    let typ = if ft.is_char_device() {
        LinuxDeviceType::C
    } else if ft.is_block_device() {
        LinuxDeviceType::B
    } else {
        return Ok(None);
    };
    let dev = LinuxDeviceBuilder::default()
        .path(container.to_path_buf())
        .typ(typ)
        .major(major(meta.rdev()))
        .minor(minor(meta.rdev()))
        .file_mode(meta.mode() & 0o777)
        .uid(meta.uid())
        .gid(meta.gid())
        .build()
        .map_err(std::io::Error::other)?;
    Ok(Some(dev))
}

/// Every device node under `dir` (recursively, not following symlinks), mapped below
/// `container_dir`.
fn devices_under(
    dir: &Path,
    container_dir: &Path,
    out: &mut Vec<LinuxDevice>,
) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let name = e.file_name();
        let Ok(ft) = e.file_type() else { continue };
        let host = e.path();
        let container = container_dir.join(&name);
        if ft.is_dir() {
            if SKIPPED_DIRS.iter().any(|s| name == *s) {
                continue;
            }
            // A directory vanishing or unreadable under /dev is not the request's fault.
            let _ = devices_under(&host, &container, out);
        } else if name == "console" {
            continue;
        } else if let Ok(Some(d)) = device_at(&host, &container, false) {
            out.push(d);
        }
    }
    Ok(())
}

fn rule(allow: bool, dev: Option<&LinuxDevice>, access: &str) -> Result<LinuxDeviceCgroup> {
    let mut b = LinuxDeviceCgroupBuilder::default()
        .allow(allow)
        .access(access);
    if let Some(d) = dev {
        b = b.typ(d.typ()).major(d.major()).minor(d.minor());
    } else {
        b = b.typ(LinuxDeviceType::A);
    }
    b.build().map_err(oci_error("device cgroup rule"))
}

/// The requested device's permissions, checked: some of `r`, `w`, `m`; empty means all.
fn permissions(p: &str, host: &str) -> Result<String> {
    if p.is_empty() {
        return Ok("rwm".into());
    }
    if !p.chars().all(|c| matches!(c, 'r' | 'w' | 'm')) {
        return Err(invalid(format!(
            "device {host}: permissions {p:?} must be made of r, w and m"
        )));
    }
    Ok(p.to_string())
}

/// The devices to create in the container and the device cgroup rules.
pub(super) fn devices(
    requested: &[cri::Device],
    privileged: bool,
    host_dev: &Path,
) -> Result<(Vec<LinuxDevice>, Vec<LinuxDeviceCgroup>)> {
    let mut devices = Vec::new();
    let mut rules = vec![rule(privileged, None, "rwm")?];
    if privileged {
        devices_under(host_dev, Path::new("/dev"), &mut devices).map_err(|e| {
            crate::Error::internal(format!(
                "listing host devices in {}: {e}",
                host_dev.display()
            ))
        })?;
    }
    for d in requested {
        let host = d.host_path.as_str();
        let access = permissions(&d.permissions, host)?;
        if !host.starts_with('/') || host.contains('\0') {
            return Err(invalid(format!(
                "device host_path {host:?} must be an absolute path"
            )));
        }
        let container = if d.container_path.is_empty() {
            host
        } else {
            d.container_path.as_str()
        };
        if !container.starts_with('/')
            || container.contains('\0')
            || container.split('/').any(|c| c == "..")
        {
            return Err(invalid(format!(
                "device container_path {container:?} must be an absolute path without \"..\""
            )));
        }
        let meta = std::fs::metadata(host)
            .map_err(|e| invalid(format!("device host_path {host:?}: {e}")))?;
        let mut found = Vec::new();
        if meta.is_dir() {
            devices_under(Path::new(host), Path::new(container), &mut found)
                .map_err(|e| invalid(format!("device host_path {host:?}: {e}")))?;
        } else {
            let dev = device_at(Path::new(host), &PathBuf::from(container), true)
                .map_err(|e| invalid(format!("device host_path {host:?}: {e}")))?
                .ok_or_else(|| {
                    invalid(format!(
                        "device host_path {host:?} is not a character or block device"
                    ))
                })?;
            found.push(dev);
        }
        for dev in found {
            rules.push(rule(true, Some(&dev), &access)?);
            devices.retain(|d: &LinuxDevice| d.path() != dev.path());
            devices.push(dev);
        }
    }
    Ok((devices, rules))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn major_minor_like_glibc() {
        // makedev(1, 3) = /dev/null; makedev(259, 65536) exercises the high bits.
        let makedev = |ma: u64, mi: u64| {
            ((ma & 0xffff_f000) << 32)
                | ((ma & 0xfff) << 8)
                | ((mi & 0xffff_ff00) << 12)
                | (mi & 0xff)
        };
        for (ma, mi) in [(1u64, 3u64), (259, 65536), (4095, 255), (4096, 256), (0, 0)] {
            let dev = makedev(ma, mi);
            assert_eq!(
                (major(dev), minor(dev)),
                (ma as i64, mi as i64),
                "{ma}:{mi}"
            );
        }
    }

    fn req(host: &str, container: &str, perms: &str) -> cri::Device {
        cri::Device {
            host_path: host.into(),
            container_path: container.into(),
            permissions: perms.into(),
        }
    }

    #[test]
    fn requested_device_becomes_node_and_rule() {
        let (devs, rules) = devices(
            &[req("/dev/null", "/dev/mynull", "rw")],
            false,
            Path::new("/dev"),
        )
        .unwrap();
        assert_eq!(devs.len(), 1);
        let d = &devs[0];
        assert_eq!(d.path(), Path::new("/dev/mynull"));
        assert_eq!((d.typ(), d.major(), d.minor()), (LinuxDeviceType::C, 1, 3));
        assert_eq!(rules.len(), 2);
        assert!(!rules[0].allow() && rules[0].access().as_deref() == Some("rwm"));
        assert_eq!(rules[0].typ(), Some(LinuxDeviceType::A));
        assert!(rules[1].allow());
        assert_eq!((rules[1].major(), rules[1].minor()), (Some(1), Some(3)));
        assert_eq!(rules[1].access().as_deref(), Some("rw"));
    }

    #[test]
    fn bad_devices_are_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain");
        std::fs::write(&file, "x").unwrap();
        let file = file.to_str().unwrap();
        let cases = [
            (req("/nonexistent/dev", "/dev/x", "rwm"), "No such file"),
            (
                req(file, "/dev/x", "rwm"),
                "not a character or block device",
            ),
            (req("/dev/null", "/dev/x", "rwx"), "permissions \"rwx\""),
            (req("dev/null", "/dev/x", "r"), "must be an absolute path"),
            (req("/dev/null", "x", "r"), "container_path \"x\""),
            (req("/dev/null", "/dev/../x", "r"), "container_path"),
        ];
        for (d, msg) in cases {
            let err = devices(std::slice::from_ref(&d), false, Path::new("/dev")).unwrap_err();
            assert_eq!(err.code(), crate::Code::InvalidArgument, "{d:?}");
            assert!(err.message().contains(msg), "{d:?}: {err}");
        }
    }

    #[test]
    fn privileged_gets_host_devices_and_all_access() {
        let (devs, rules) = devices(&[], true, Path::new("/dev")).unwrap();
        assert!(
            devs.iter().any(|d| d.path() == Path::new("/dev/null")),
            "{devs:?}"
        );
        assert!(!devs.iter().any(|d| d.path().starts_with("/dev/pts")));
        assert!(!devs.iter().any(|d| d.path() == Path::new("/dev/console")));
        assert_eq!(rules.len(), 1);
        assert!(rules[0].allow() && rules[0].typ() == Some(LinuxDeviceType::A));
    }
}
