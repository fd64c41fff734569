//! The systemd cgroup driver's side of a pod: its delegated scope, asked of systemd over
//! D-Bus (zbus, the binary's one D-Bus library), on cgroup v1 and v2.

use std::path::Path;
use std::time::{Duration, Instant};

use nix::unistd::Pid;
use zbus::zvariant::{OwnedObjectPath, Value};

use crate::{Error, Kind, Result};

/// How long systemd may take to move a process into the scope it was asked for.
const SCOPE_WAIT: Duration = Duration::from_secs(10);

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1"
)]
trait Systemd1Manager {
    fn start_transient_unit(
        &self,
        name: &str,
        mode: &str,
        properties: &[(&str, Value<'_>)],
        aux: &[(&str, &[(&str, Value<'_>)])],
    ) -> zbus::Result<OwnedObjectPath>;
}

/// Asks systemd (over the system bus) for the transient scope `<prefix>-<name>.scope` in
/// `slice`, delegated (the cgroups below it are its owner's), holding `pid`, as runc and
/// youki do for their containers under the systemd cgroup driver, and waits until `pid` is
/// in it. On v2 it then moves `pid` on to the scope's child `leaf` (on v1 the caller's
/// [`super::join`] does, in every hierarchy).
///
/// The move comes first on v2, before any controller is enabled in the scope: with `pid`
/// still in it, enabling a threaded controller (cpu, pids) would make the scope a thread
/// root, and no process could then join a domain child of it (EOPNOTSUPP).
///
/// The D-Bus call runs on a current-thread runtime made and dropped here, so the process is
/// single-threaded again afterwards, as libcontainer needs.
pub fn join_systemd_scope(
    slice: &str,
    prefix: &str,
    name: &str,
    leaf: &str,
    pid: Pid,
) -> Result<()> {
    let scope = systemd_scope_path(slice, prefix, name)?;
    let unit = format!("{prefix}-{name}.scope");
    if !systemd_booted() {
        return Err(Error::new(
            Kind::FailedPrecondition,
            "the systemd cgroup driver: systemd is not this machine's init system",
        ));
    }
    let failed = |e: &dyn std::fmt::Display| {
        Error::new(
            Kind::Internal,
            format!("starting the systemd scope {unit} in {slice}: {e}"),
        )
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(&e))?;
    let properties = scope_properties(slice, name, pid);
    rt.block_on(async {
        let conn = zbus::Connection::system().await?;
        let manager = Systemd1ManagerProxy::new(&conn).await?;
        let values: Vec<(&str, Value<'_>)> =
            properties.iter().map(|(k, v)| (*k, v.clone())).collect();
        manager
            .start_transient_unit(&unit, "replace", &values, &[])
            .await
    })
    .map_err(|e| failed(&e))?;
    drop(rt);
    wait_in_cgroup(pid, &scope)?;
    if !super::unified() {
        return Ok(());
    }
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

/// The properties of a pod's scope: in `slice`, delegated, holding `pid`, its resources
/// accounted (the kubelet's slice above it sets their limits), and no default dependencies
/// (a pod is not stopped with the units that started it).
fn scope_properties(slice: &str, name: &str, pid: Pid) -> Vec<(&'static str, Value<'static>)> {
    let pid = u32::try_from(pid.as_raw()).unwrap_or_default();
    vec![
        (
            "Description",
            Value::from(format!("nodelet pod sandbox {name}")),
        ),
        ("Slice", Value::from(slice.to_string())),
        ("Delegate", Value::from(true)),
        ("PIDs", Value::from(vec![pid])),
        ("DefaultDependencies", Value::from(false)),
        ("MemoryAccounting", Value::from(true)),
        ("CPUAccounting", Value::from(true)),
        ("IOAccounting", Value::from(true)),
        ("TasksAccounting", Value::from(true)),
    ]
}

/// Waits until `/proc/<pid>/cgroup` places `pid` in `scope` (systemd moves it while it
/// starts the unit): in the unified hierarchy on v2, in systemd's own (`name=systemd`) on v1.
fn wait_in_cgroup(pid: Pid, scope: &str) -> Result<()> {
    let file = format!("/proc/{pid}/cgroup");
    let deadline = Instant::now() + SCOPE_WAIT;
    loop {
        let text = std::fs::read_to_string(&file).map_err(|e| Error::io("reading", &file, e))?;
        if in_cgroup(&text, scope) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::new(
                Kind::DeadlineExceeded,
                format!(
                    "systemd did not move the process into {scope} within {SCOPE_WAIT:?} \
                     ({file}: {})",
                    text.trim().replace('\n', "; ")
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether `/proc/<pid>/cgroup`'s `text` has the process in `path` in the unified or
/// systemd's hierarchy.
fn in_cgroup(text: &str, path: &str) -> bool {
    text.lines().any(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, p) = (f.next(), f.next(), f.next());
        matches!(controllers, Some("" | "name=systemd")) && p == Some(path)
    })
}

/// Whether systemd booted this machine (its own test, `sd_booted`).
pub fn systemd_booted() -> bool {
    Path::new("/run/systemd/system").is_dir()
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
    fn the_scope_is_found_in_the_unified_or_systemds_hierarchy() {
        let scope = "/kubepods.slice/kubepods-pod1.slice/nodelet-x.scope";
        let v2 = format!("0::{scope}\n");
        assert!(in_cgroup(&v2, scope));
        assert!(!in_cgroup("0::/system.slice/nodelet.service\n", scope));
        let v1 = format!("5:memory:/user.slice\n2:cpu,cpuacct:/\n1:name=systemd:{scope}\n0::/\n");
        assert!(in_cgroup(&v1, scope));
        // Not when only a controller's hierarchy has it.
        assert!(!in_cgroup(
            &format!("5:memory:{scope}\n1:name=systemd:/\n"),
            scope
        ));
    }

    #[test]
    fn a_scope_is_delegated_and_holds_the_sandbox() {
        let props = scope_properties("kubepods-pod1.slice", "abc", Pid::from_raw(42));
        let get = |k: &str| {
            props
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no {k}"))
        };
        assert_eq!(get("Slice"), Value::from("kubepods-pod1.slice"));
        assert_eq!(get("Delegate"), Value::from(true));
        assert_eq!(get("PIDs"), Value::from(vec![42u32]));
        assert_eq!(get("DefaultDependencies"), Value::from(false));
    }

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
