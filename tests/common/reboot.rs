//! What a node's reboot does to the built-in runtime's pods, for the tests that simulate one:
//! finding a pod's sandbox process and cgroup from /proc, killing the pod, and the state dir
//! coming back empty (tmpfs) or from an earlier boot (disk).

use std::path::Path;

use super::{pids_in_cgroups, process_gone, settle, state_dir};

/// The sandbox id a built-in runtime's sandbox process serves, from /proc (a runtime opened in
/// the test would watch the sandbox and act on its death as an agent does): its last argument
/// is its state dir, `<state dir>/sandboxes/<id>`.
pub fn sandbox_id_of_process(sandbox_pid: i32) -> String {
    let cmdline = std::fs::read(format!("/proc/{sandbox_pid}/cmdline")).expect("cmdline");
    String::from_utf8_lossy(&cmdline)
        .split('\0')
        .rfind(|a| !a.is_empty())
        .and_then(|dir| Path::new(dir).file_name())
        .map(|id| id.to_string_lossy().into_owned())
        .expect("a state dir as the last argument")
}

/// The pod cgroup of a built-in runtime's sandbox process: the one above its own
/// (`<pod>/sandbox`), as a path under a hierarchy's root.
pub fn pod_cgroup_of_sandbox(sandbox_pid: i32) -> String {
    let cgroups = std::fs::read_to_string(format!("/proc/{sandbox_pid}/cgroup")).unwrap();
    cgroups
        .lines()
        .find_map(|l| l.split_once(":pids:").map(|(_, p)| p.to_string()))
        .or_else(|| {
            cgroups
                .lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        })
        .and_then(|p| p.strip_suffix("/sandbox").map(str::to_string))
        .expect("the sandbox's cgroup")
}

/// How the state dir comes through a reboot.
#[derive(Clone, Copy, Debug)]
pub enum StateDirFs {
    /// On tmpfs (`/run` on a systemd host): it comes back empty.
    Tmpfs,
    /// On a disk: its files stay, written under another boot id.
    Disk,
}

/// What a reboot does to the built-in runtime on `root` once every process of its pods has
/// ended: the mounts under the state dir (and under `also`, e.g. the kubelet's pod volumes) go,
/// and the state dir comes back as `fs` brings it.
pub fn reboot_state_dir(root: &Path, also: Option<&Path>, fs: StateDirFs) {
    let state = state_dir(root);
    let mut prefixes = vec![format!("{}/", state.display())];
    if let Some(dir) = also {
        let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        prefixes.push(format!("{}/", dir.display()));
    }
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let mut mounts: Vec<&str> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| prefixes.iter().any(|p| m.starts_with(p.as_str())))
        .collect();
    assert!(
        mounts.iter().any(|m| m.starts_with(&prefixes[0])),
        "a container's rootfs is mounted in the state dir"
    );
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in mounts {
        nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH).expect("unmount");
    }
    match fs {
        StateDirFs::Tmpfs => std::fs::remove_dir_all(&state).expect("emptying the state dir"),
        StateDirFs::Disk => {
            let boot = state.join("boot_id");
            assert!(boot.is_file(), "the state dir names its boot");
            std::fs::write(boot, "00000000-0000-4000-8000-000000000000\n").unwrap();
        }
    }
}

/// Kills (SIGKILL) every process in a pod cgroup, and waits until they are gone.
pub async fn kill_pod_cgroup(pod_cgroup: &str) {
    let pids = pids_in_cgroups(pod_cgroup);
    assert!(!pids.is_empty(), "processes in {pod_cgroup}");
    for pid in &pids {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    settle(|| pids.iter().all(|p| process_gone(*p))).await;
}
