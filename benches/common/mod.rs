//! Helpers both benchmarks use: the machine's load, the root check, and cleaning up what a
//! run left behind (mounts, cgroups).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};

/// The load average (1, 5, 15 minutes) as /proc/loadavg gives it.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// True when this process runs as root.
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .is_some_and(|l| l.split_whitespace().nth(2) == Some("0"))
    })
}

/// Lazily unmounts whatever is still mounted under `dir`, deepest first.
pub fn unmount_under(dir: &Path) -> Result<()> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .map(PathBuf::from)
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for p in points {
        eprintln!("cleanup: unmounting leftover {}", p.display());
        let st = Command::new("umount")
            .arg("-l")
            .arg(&p)
            .status()
            .with_context(|| format!("running umount -l {}", p.display()))?;
        ensure!(st.success(), "umount -l {} failed ({st})", p.display());
    }
    Ok(())
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// Removes `cgroup` (absolute, cgroupfs style) and every cgroup below it, in every hierarchy
/// mounted under /sys/fs/cgroup (or in the unified hierarchy mounted there).
pub fn remove_cgroup(cgroup: &str) -> Result<()> {
    let rel = cgroup.trim_start_matches('/');
    ensure!(!rel.is_empty(), "refusing to remove the root cgroup");
    let base = Path::new("/sys/fs/cgroup");
    let mut dirs = vec![base.join(rel)];
    let hierarchies =
        std::fs::read_dir(base).with_context(|| format!("listing {}", base.display()))?;
    for h in hierarchies.flatten() {
        if h.file_type().is_ok_and(|t| t.is_dir()) {
            dirs.push(h.path().join(rel));
        }
    }
    let mut first = None;
    for dir in dirs.iter().filter(|d| d.is_dir()) {
        if let Err(e) = remove_cgroup_dir(dir) {
            first.get_or_insert(e);
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

pub fn remove_cgroup_dir(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_dir(&entry.path())?;
        }
    }
    std::fs::remove_dir(dir).with_context(|| format!("removing cgroup {}", dir.display()))
}
