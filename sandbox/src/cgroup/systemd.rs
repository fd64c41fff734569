//! The systemd cgroup driver's side of a pod: its delegated scope, asked of systemd through
//! libcgroups' own D-Bus client.

use std::path::{Path, PathBuf};

use libcgroups::common::{CgroupConfig, CgroupManager, create_cgroup_manager};
use nix::unistd::Pid;

use crate::{Error, Kind, Result};

/// Asks systemd (over the system bus) for the transient scope `<prefix>-<name>.scope` in
/// `slice`, delegated (the cgroups below it are its owner's), holding `pid`, as runc and
/// youki do for their containers under the systemd cgroup driver, then moves `pid` on to the
/// scope's child `leaf`. cgroup v2 only.
///
/// The move comes first, before any controller is enabled in the scope: with `pid` still in
/// it, enabling a threaded controller (cpu, pids) would make the scope a thread root, and
/// no process could then join a domain child of it (EOPNOTSUPP).
pub fn join_systemd_scope(
    slice: &str,
    prefix: &str,
    name: &str,
    leaf: &str,
    pid: Pid,
) -> Result<()> {
    let scope = systemd_scope_path(slice, prefix, name)?;
    // On v1 libcgroups would quietly make a v1 cgroup named after the whole spec.
    if !super::unified() {
        return Err(Error::new(
            Kind::FailedPrecondition,
            "the systemd cgroup driver needs the unified cgroup hierarchy (cgroup v2)",
        ));
    }
    let spec = format!("{slice}:{prefix}:{name}");
    let m = create_cgroup_manager(CgroupConfig {
        cgroup_path: PathBuf::from(&spec),
        systemd_cgroup: true,
        container_name: name.to_string(),
    })
    .map_err(|e| Error::new(Kind::Internal, format!("systemd scope {spec}: {e}")))?;
    m.add_task(pid).map_err(|e| {
        Error::new(
            Kind::Internal,
            format!("starting the systemd scope {prefix}-{name}.scope in {slice}: {e}"),
        )
    })?;
    let dir = Path::new(CGROUP_ROOT)
        .join(scope.trim_start_matches('/'))
        .join(leaf);
    match std::fs::create_dir(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io("creating", &dir, e)),
    }
    let procs = dir.join("cgroup.procs");
    std::fs::write(&procs, pid.as_raw().to_string()).map_err(|e| Error::io("writing", &procs, e))
}

/// Where the cgroup filesystem is mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The cgroupfs path of the scope [`join_systemd_scope`] makes: the slice expanded as systemd
/// does (`a-b.slice` is `/a.slice/a-b.slice`), then `<prefix>-<name>.scope`. A name that is
/// not a slice systemd would accept is an error.
pub fn systemd_scope_path(slice: &str, prefix: &str, name: &str) -> Result<String> {
    let bad = |why: &str| {
        Error::new(
            Kind::InvalidArgument,
            format!("{slice:?} is not a systemd slice name: {why}"),
        )
    };
    let stem = slice
        .strip_suffix(".slice")
        .ok_or_else(|| bad("it must end in .slice"))?;
    if stem.contains('/') {
        return Err(bad("it names a slice, not a path"));
    }
    if stem == "-" {
        return Ok(format!("/{prefix}-{name}.scope"));
    }
    if stem.is_empty() || stem.starts_with('-') || stem.ends_with('-') || stem.contains("--") {
        return Err(bad("empty parts"));
    }
    if !stem
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':' | '\\'))
    {
        return Err(bad("characters systemd does not allow in a unit name"));
    }
    let mut path = String::new();
    let mut prefix_so_far = String::new();
    for part in stem.split('-') {
        if !prefix_so_far.is_empty() {
            prefix_so_far.push('-');
        }
        prefix_so_far.push_str(part);
        path.push('/');
        path.push_str(&prefix_so_far);
        path.push_str(".slice");
    }
    Ok(format!("{path}/{prefix}-{name}.scope"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_scopes_under_expanded_slices() {
        assert_eq!(
            systemd_scope_path("kubepods-burstable-pod12_34.slice", "nodelet", "abc").unwrap(),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice/nodelet-abc.scope"
        );
        assert_eq!(
            systemd_scope_path("system.slice", "nodelet", "x").unwrap(),
            "/system.slice/nodelet-x.scope"
        );
        assert_eq!(
            systemd_scope_path("-.slice", "nodelet", "x").unwrap(),
            "/nodelet-x.scope"
        );
        for bad in [
            "/kubepods.slice",
            "kubepods",
            "a--b.slice",
            "-a.slice",
            "a b.slice",
        ] {
            let e = systemd_scope_path(bad, "nodelet", "x").unwrap_err();
            assert!(
                e.to_string().contains("not a systemd slice name"),
                "{bad}: {e}"
            );
        }
    }
}
