//! Mount plumbing for container rootfs: reading /proc/self/mountinfo, mounting an overlay
//! (falling back to /proc/self/fd paths when the option string would be too long or a path holds
//! characters overlay cannot take), and unmounting with a lazy detach when busy.

use crate::error::{Error, Result};
use nix::mount::{MntFlags, MsFlags};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Mount data must fit a page; leave room for the kernel's own additions.
const MAX_OPTIONS: usize = 4000;

/// Decodes the octal escapes (`\040` for space) mountinfo uses in paths.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..i + 4]
                .iter()
                .all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') as u32 * 64
                + (bytes[i + 2] - b'0') as u32 * 8
                + (bytes[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `(mount point, filesystem type)` of every mount, from mountinfo text.
pub(crate) fn parse_mountinfo(text: &str) -> Vec<(PathBuf, String)> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let mount_point = fields.get(4)?;
            let sep = fields.iter().position(|f| *f == "-")?;
            let fstype = fields.get(sep + 1)?;
            Some((PathBuf::from(unescape(mount_point)), fstype.to_string()))
        })
        .collect()
}

/// The mounts of this process's namespace.
pub(crate) fn mounts() -> Result<Vec<(PathBuf, String)>> {
    let path = Path::new("/proc/self/mountinfo");
    let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
    Ok(parse_mountinfo(&text))
}

/// Whether something is mounted at `path` (which should be canonical).
pub(crate) fn is_mountpoint(path: &Path) -> Result<bool> {
    Ok(mounts()?.iter().any(|(p, _)| p == path))
}

/// The mount points strictly below `dir` (compared by path components, so `/a/b2` is not
/// below `/a/b`) among `mounts`, deepest first, each once.
fn mount_points_below(mounts: &[(PathBuf, String)], dir: &Path) -> Vec<PathBuf> {
    let mut below: Vec<PathBuf> = mounts
        .iter()
        .map(|(p, _)| p)
        .filter(|p| p.starts_with(dir) && p.as_path() != dir)
        .cloned()
        .collect();
    below.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    below.dedup();
    below
}

/// Unmounts everything mounted below `dir` in this process's mount namespace (never `dir`
/// itself nor anything beside it), deepest first, detaching lazily what is busy: the container
/// rootfs (and whatever else) a runtime left in a state dir nobody will use again. Returns the
/// mount points it unmounted; Ok only once nothing is mounted below `dir` any more, so that the
/// caller may then delete the tree without reaching into a mounted filesystem. A `dir` that
/// does not exist has nothing below it.
pub fn unmount_below(dir: &Path) -> Result<Vec<PathBuf>> {
    let dir = match dir.canonicalize() {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io("resolving", dir, e)),
    };
    let below = mount_points_below(&mounts()?, &dir);
    for target in &below {
        unmount_all(target)?;
    }
    if let Some(left) = mount_points_below(&mounts()?, &dir).first() {
        return Err(Error::sys(
            "unmounting (still mounted)",
            left,
            nix::Error::EBUSY,
        ));
    }
    Ok(below)
}

fn usable_in_options(path: &Path) -> bool {
    let s = path.to_string_lossy();
    !s.contains([',', ':', '\\', '\n']) && !s.is_empty()
}

/// The option string of an overlay mount.
pub(crate) fn overlay_options(lower: &[PathBuf], upper: &Path, work: &Path) -> String {
    let lower: Vec<String> = lower.iter().map(|p| p.display().to_string()).collect();
    let mut options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.join(":"),
        upper.display(),
        work.display()
    );
    if Path::new("/sys/module/overlay/parameters/index").exists() {
        // Layers are shared between mounts; the inode index would tie them to one.
        options.push_str(",index=off");
    }
    if VOLATILE.load(Ordering::Relaxed) {
        // A container's writable layer is not promised to survive a crash of the node (its
        // container does not either): no sync of the upper dir ever, so neither an fsync in
        // the container nor the unmount waits for the node's other dirty data.
        options.push_str(",volatile");
    }
    options
}

/// Whether overlay takes `volatile` (Linux 5.10); cleared at the first mount that refuses it.
static VOLATILE: AtomicBool = AtomicBool::new(true);

/// Mounts an overlay at `target`: `lower` top layer first.
pub(crate) fn mount_overlay(
    lower: &[PathBuf],
    upper: &Path,
    work: &Path,
    target: &Path,
    force_fds: bool,
) -> Result<()> {
    let direct = overlay_options(lower, upper, work);
    let fits = direct.len() <= MAX_OPTIONS
        && lower.iter().all(|p| usable_in_options(p))
        && usable_in_options(upper)
        && usable_in_options(work);
    if fits && !force_fds {
        return mount(&direct, target);
    }
    // Refer to every directory through an fd of ours: /proc/self/fd/N is short and plain.
    let open = |p: &Path| File::open(p).map_err(|e| Error::io("opening layer dir", p, e));
    let lower_files = lower.iter().map(|p| open(p)).collect::<Result<Vec<_>>>()?;
    let upper_file = open(upper)?;
    let work_file = open(work)?;
    let fd_path = |f: &File| PathBuf::from(format!("/proc/self/fd/{}", f.as_raw_fd()));
    let lower_fds: Vec<PathBuf> = lower_files.iter().map(fd_path).collect();
    let options = overlay_options(&lower_fds, &fd_path(&upper_file), &fd_path(&work_file));
    if options.len() > MAX_OPTIONS {
        return Err(Error::sys(
            "mounting overlay (too many layers)",
            target,
            nix::Error::E2BIG,
        ));
    }
    mount(&options, target)
}

fn mount(options: &str, target: &Path) -> Result<()> {
    let attempt = |options: &str| {
        nix::mount::mount(
            Some("overlay"),
            target,
            Some("overlay"),
            MsFlags::empty(),
            Some(options),
        )
    };
    match attempt(options) {
        Err(nix::Error::EINVAL) if options.ends_with(",volatile") => {
            // A kernel older than 5.10: durable upper dirs it is.
            VOLATILE.store(false, Ordering::Relaxed);
            tracing::info!("overlayfs does not take `volatile`: container layers are synced");
            attempt(options.trim_end_matches(",volatile"))
        }
        other => other,
    }
    .map_err(|e| Error::sys("mounting overlay", target, e))
}

/// Unmounts everything stacked at `target`, detaching lazily when busy. Not mounted is fine.
pub(crate) fn unmount_all(target: &Path) -> Result<()> {
    for _ in 0..16 {
        if !is_mountpoint(target)? {
            return Ok(());
        }
        match nix::mount::umount2(target, MntFlags::empty()) {
            Ok(()) => {}
            Err(nix::Error::EBUSY) => {
                tracing::warn!(target = %target.display(), "rootfs busy; detaching lazily");
                nix::mount::umount2(target, MntFlags::MNT_DETACH)
                    .map_err(|e| Error::sys("detaching", target, e))?;
            }
            Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => return Ok(()),
            Err(e) => return Err(Error::sys("unmounting", target, e)),
        }
    }
    Err(Error::sys(
        "unmounting (still mounted)",
        target,
        nix::Error::EBUSY,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo_with_escapes() {
        let text = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw\n\
                    45 27 0:39 / /run/x rw,relatime shared:2 master:3 - overlay overlay rw,lowerdir=/a\n";
        let mounts = parse_mountinfo(text);
        assert_eq!(
            mounts[0],
            (PathBuf::from("/mnt/with space"), "ext3".to_string())
        );
        assert_eq!(mounts[1], (PathBuf::from("/run/x"), "overlay".to_string()));
    }

    #[test]
    fn mount_points_below_a_dir_are_found_deepest_first() {
        let text = "1 0 0:1 / / rw - ext4 /dev/root rw\n\
                    2 1 0:2 / /run/s/a rw - tmpfs tmpfs rw\n\
                    3 2 0:3 / /run/s/a/c/rootfs rw - overlay overlay rw\n\
                    4 1 0:4 / /run/s2/c/rootfs rw - overlay overlay rw\n\
                    5 1 0:5 / /run/s rw - tmpfs tmpfs rw\n\
                    6 3 0:6 / /run/s/a/c/rootfs rw - overlay overlay rw\n";
        assert_eq!(
            mount_points_below(&parse_mountinfo(text), Path::new("/run/s")),
            [
                PathBuf::from("/run/s/a/c/rootfs"),
                PathBuf::from("/run/s/a")
            ]
        );
    }

    #[test]
    fn unmounts_only_below_the_dir() {
        if !crate::testutil::is_root() {
            crate::testutil::skip("needs root", "unmounts_only_below_the_dir mounts tmpfs");
            return;
        }
        let base = tempfile::tempdir().unwrap();
        let base = base.path().canonicalize().unwrap();
        let (dir, beside) = (base.join("state"), base.join("state2"));
        let (inner, nested, other) = (
            dir.join("c/rootfs"),
            dir.join("c/rootfs/dev"),
            beside.join("m"),
        );
        let tmpfs = |at: &Path| {
            std::fs::create_dir_all(at).unwrap();
            nix::mount::mount(
                Some("tmpfs"),
                at,
                Some("tmpfs"),
                MsFlags::empty(),
                None::<&str>,
            )
            .unwrap();
        };
        tmpfs(&inner);
        tmpfs(&nested);
        tmpfs(&other);
        let unmounted = unmount_below(&dir);
        let (inner_mounted, other_mounted) = (
            is_mountpoint(&inner).unwrap(),
            is_mountpoint(&other).unwrap(),
        );
        // Nothing is left mounted in the temp dir, whatever the outcome.
        for at in [&nested, &inner, &other] {
            let _ = nix::mount::umount2(at, MntFlags::MNT_DETACH);
        }
        assert_eq!(unmounted.unwrap(), [nested, inner]);
        assert!(!inner_mounted);
        assert!(other_mounted, "a mount beside the dir stays");
        assert!(unmount_below(&dir).unwrap().is_empty());
        assert!(unmount_below(&base.join("missing")).unwrap().is_empty());
    }

    #[test]
    fn options_put_top_layer_first() {
        let o = overlay_options(
            &[PathBuf::from("/s/2/fs"), PathBuf::from("/s/1/fs")],
            Path::new("/c/k/upper"),
            Path::new("/c/k/work"),
        );
        assert!(
            o.starts_with("lowerdir=/s/2/fs:/s/1/fs,upperdir=/c/k/upper,workdir=/c/k/work"),
            "{o}"
        );
    }
}
