//! Where the built-in runtime keeps what: the root dir (`images/`, `cri/`) and the state dir
//! (`sandboxes/`, `containers/`; see the module's doc above), made and opened up at start, and
//! the state dirs older nodelets kept under the root dir.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::Config;
use crate::{Error, Result};

/// The state dir of the runtime whose (canonical) root dir is `root_dir`, when none is
/// configured: `/run/nodelet/state/<16 hex digits of the root dir's SHA-256>`, one per root dir,
/// on the tmpfs a systemd host mounts at `/run`. Its `root` file names the root dir.
pub fn default_state_dir(root_dir: &Path) -> PathBuf {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(root_dir.as_os_str().as_encoded_bytes());
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    Path::new(STATE_DIRS).join(hex)
}

/// Where the default state dirs are, one per root dir.
const STATE_DIRS: &str = "/run/nodelet/state";

/// Makes the root dir and the state dir with what they hold, resolves both into `cfg` (the
/// root dir canonical, the state dir set) and returns the state dir.
pub(super) fn prepare(cfg: &mut Config) -> Result<PathBuf> {
    std::fs::create_dir_all(&cfg.root_dir)
        .map_err(|e| Error::internal(format!("creating {}: {e}", cfg.root_dir.display())))?;
    // Sandbox processes and sockets are addressed by path: make it absolute once.
    cfg.root_dir = cfg
        .root_dir
        .canonicalize()
        .map_err(|e| Error::internal(format!("resolving {}: {e}", cfg.root_dir.display())))?;
    let state_dir = match cfg.state_dir.take() {
        Some(d) => d,
        None => default_state_dir(&cfg.root_dir),
    };
    std::fs::create_dir_all(&state_dir)
        .map_err(|e| Error::internal(format!("creating {}: {e}", state_dir.display())))?;
    let state_dir = state_dir
        .canonicalize()
        .map_err(|e| Error::internal(format!("resolving {}: {e}", state_dir.display())))?;
    // Which root dir the state dir serves, for whoever finds it (an admin, a clean-up).
    let named = state_dir.join("root");
    if std::fs::read(&named).ok().as_deref() != Some(cfg.root_dir.as_os_str().as_encoded_bytes()) {
        std::fs::write(&named, cfg.root_dir.as_os_str().as_encoded_bytes())
            .map_err(|e| Error::internal(format!("writing {}: {e}", named.display())))?;
    }
    cfg.state_dir = Some(state_dir.clone());
    forget_earlier_boot(&state_dir);
    let mut made = vec![cfg.root_dir.join("cri")];
    for dir in ["sandboxes", "containers"] {
        made.push(state_dir.join(dir));
    }
    for d in &made {
        std::fs::create_dir_all(d)
            .map_err(|e| Error::internal(format!("creating {}: {e}", d.display())))?;
    }
    // Containers in a pod user namespace are the host's unprivileged IDs while libcontainer
    // sets them up: they must be able to pass through the state dir to their rootfs and the
    // pod's /etc files, and through the root dir to the image store (search only, as
    // containerd's 0711 root dir allows; nothing is listed or read through them).
    let mut searched = vec![cfg.root_dir.clone()];
    // The state dir, and the default's parents nodelet made.
    searched.extend(
        state_dir
            .ancestors()
            .take_while(|a| *a == state_dir || a.starts_with("/run/nodelet/"))
            .map(Path::to_path_buf),
    );
    searched.extend(made[1..].iter().cloned());
    for d in searched {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(&d)
            .map_err(|e| Error::internal(format!("reading {}: {e}", d.display())))?;
        let mode = meta.permissions().mode();
        if mode & 0o011 != 0o011 {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode | 0o011))
                .map_err(|e| Error::internal(format!("opening up {}: {e}", d.display())))?;
        }
    }
    Ok(state_dir)
}

/// The sandboxes and containers whose state dirs an older nodelet made under the root dir
/// (`<root>/sandboxes/<id>`, `<root>/containers/<id>`): they keep them there, where their
/// processes and mounts are, until they are removed.
#[derive(Default)]
pub(super) struct Legacy {
    pub sandboxes: std::collections::HashSet<String>,
    pub containers: std::collections::HashSet<String>,
}

impl Legacy {
    pub fn find(root_dir: &Path) -> Legacy {
        let listed = |dir: &str| -> std::collections::HashSet<String> {
            std::fs::read_dir(root_dir.join(dir))
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| e.file_name().into_string().ok())
                        .collect()
                })
                .unwrap_or_default()
        };
        let found = Legacy {
            sandboxes: listed("sandboxes"),
            containers: listed("containers"),
        };
        // Once all of them are gone, so are the old dirs.
        for (dir, ids) in [
            ("sandboxes", &found.sandboxes),
            ("containers", &found.containers),
        ] {
            if ids.is_empty() {
                let _ = std::fs::remove_dir(root_dir.join(dir));
            }
        }
        found
    }
}

/// Where the kernel tells this boot apart from the others.
const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

/// A state dir that outlives a reboot (`/run` or the configured dir is not a tmpfs) holds,
/// after one, what the earlier boot's processes left: sockets, pid files, the statuses of
/// containers that no longer exist. Its `boot_id` file says which boot wrote it; under another
/// boot its sandboxes and bundles are emptied, as a reboot empties a tmpfs, so that their pods
/// are settled as lost (`BuiltinRuntime::settle_lost`). Unreadable boot ids leave it as it is.
pub(super) fn forget_earlier_boot(state_dir: &Path) {
    let Ok(boot) = std::fs::read_to_string(BOOT_ID) else {
        return;
    };
    let boot = boot.trim();
    let file = state_dir.join("boot_id");
    match std::fs::read_to_string(&file) {
        Ok(written) if written.trim() == boot => return,
        Ok(written) => {
            tracing::warn!(
                "the state dir {} is from an earlier boot ({}): emptying it, as a reboot empties /run",
                state_dir.display(),
                written.trim()
            );
            for sub in ["sandboxes", "containers"] {
                let dir = state_dir.join(sub);
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => tracing::error!("emptying {}: {e}", dir.display()),
                }
            }
        }
        Err(_) => {}
    }
    if let Err(e) = std::fs::write(&file, boot) {
        tracing::warn!("writing {}: {e}", file.display());
    }
}

/// Removes the state dirs beside `state_dir` (under the default's parent) whose root dir is
/// gone: what runtimes on since-deleted root dirs (a test's, a node reset by hand) left. One
/// goes when it holds only what a runtime makes there and each sandbox in it was shut down
/// with nothing serving it any more: first whatever is still mounted in it (the rootfs of
/// containers whose agent stopped before unmounting them: nothing would ever unmount them
/// otherwise), then its sandboxes' dirs and its containers' bundles. One holding a sandbox
/// that may still run is left alone, its mounts with it.
pub(super) fn sweep_stale(state_dir: &Path) {
    let Some(parent) = state_dir.parent() else {
        return;
    };
    if parent != Path::new(STATE_DIRS) {
        return;
    }
    for entry in std::fs::read_dir(parent).into_iter().flatten().flatten() {
        let dir = entry.path();
        let Ok(root) = std::fs::read(dir.join("root")) else {
            continue;
        };
        let root = Path::new(std::ffi::OsStr::from_bytes(&root));
        if dir == state_dir || root.as_os_str().is_empty() || root.exists() {
            continue;
        }
        if !only_made(&dir) || !sandboxes_shut_down(&dir) {
            continue;
        }
        match images::unmount_below(&dir) {
            Ok(unmounted) => {
                for m in unmounted {
                    tracing::info!(
                        "unmounted {} in the state dir of the gone root dir {}",
                        m.display(),
                        root.display()
                    );
                }
            }
            Err(e) => {
                tracing::warn!("leaving the state dir {}: {e}", dir.display());
                continue;
            }
        }
        if remove_stale(&dir) {
            tracing::info!(
                "removed the state dir {} of the gone root dir {}",
                dir.display(),
                root.display()
            );
        }
    }
}

/// What a runtime makes in its state dir; a dir holding anything else is not a state dir's.
const MADE: [&str; 4] = ["sandboxes", "containers", "boot_id", "root"];

/// Whether the state dir `dir` holds only what a runtime makes there.
fn only_made(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|d| {
        d.flatten().all(|e| {
            MADE.iter()
                .any(|m| e.file_name() == std::ffi::OsStr::new(m))
        })
    })
}

/// Whether every sandbox in the state dir `dir` was shut down (its stopped marker written) and
/// no process serves it any more: then none of its containers runs either. A sandbox dir
/// without the marker may be one being set up, or one whose process died with its containers
/// still running (reaped only by an agent that knows its cgroups).
fn sandboxes_shut_down(dir: &Path) -> bool {
    let Ok(sandboxes) = std::fs::read_dir(dir.join("sandboxes")) else {
        return true;
    };
    sandboxes.flatten().all(|e| {
        let client = sandbox::Client::new(e.path());
        client.is_stopped() && !client.served()
    })
}

/// Removes the state dir `dir`, in which nothing is mounted any more (each entry of its
/// `sandboxes` and `containers` whole, then what else a runtime made there); whether it is
/// gone.
fn remove_stale(dir: &Path) -> bool {
    let gone = |r: std::io::Result<()>| match r {
        Ok(()) => true,
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    };
    for sub in ["sandboxes", "containers"] {
        for entry in std::fs::read_dir(dir.join(sub))
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!("removing {}: {e}", entry.path().display());
            }
        }
    }
    gone(std::fs::remove_dir(dir.join("sandboxes")))
        && gone(std::fs::remove_dir(dir.join("containers")))
        && gone(std::fs::remove_file(dir.join("boot_id")))
        && std::fs::remove_file(dir.join("root")).is_ok()
        && std::fs::remove_dir(dir).is_ok()
}
