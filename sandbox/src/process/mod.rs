//! The sandbox process: one per pod, the nodelet binary re-executed before any thread exists.
//! It holds the pod's namespaces, parents the pod's containers (as child subreaper), copies their
//! output into CRI log files, records their exit status on disk, and answers the request protocol
//! on its unix socket. It is synchronous and single-threaded, as libcontainer requires; it never
//! runs inside the agent's tokio process, and it outlives the agent.

mod containers;
mod exec;
mod ns;
pub use ns::set_sysctls;
mod payload;
mod server;
mod streams;
mod wire;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;

use nix::unistd::{ForkResult, fork, getpid, pipe, setsid};

use crate::spec::{Layout, NamespaceMode, Spec};
use crate::{Error, Kind, Result, cgroup, files};

/// Name of the cgroup (below the pod's) that the sandbox process itself lives in.
pub const SANDBOX_CGROUP: &str = "sandbox";
/// The prefix of a pod's systemd scope (`nodelet-<sandbox id>.scope`).
pub const SCOPE_PREFIX: &str = "nodelet";

/// The sandbox process's `oom_score_adj` (upstream's `PodInfraOOMAdj`).
pub const SANDBOX_OOM_SCORE_ADJ: i32 = -998;

/// Entry point of the sandbox process for the state directory `state_dir` (which holds
/// `spec.json`). Forks: the parent reports `ok <pid>` or `err <message>` on stdout once the
/// sandbox is serving (or failed), then exits; the child serves until shut down.
/// Returns the exit code for the parent; the child never returns.
pub fn main(state_dir: &Path) -> i32 {
    let layout = Layout::new(state_dir);
    let (r, w) = match pipe() {
        Ok(p) => p,
        Err(e) => {
            println!("err creating a pipe: {e}");
            return 1;
        }
    };
    // SAFETY: main is called before the process has started any thread.
    #[allow(unsafe_code)]
    let forked = unsafe { fork() };
    match forked {
        Err(e) => {
            println!("err fork: {e}");
            1
        }
        Ok(ForkResult::Parent { child }) => {
            drop(w);
            let mut msg = String::new();
            let _ = std::io::Read::read_to_string(&mut std::fs::File::from(r), &mut msg);
            if msg.is_empty() {
                msg = "err the sandbox process died during set-up (see sandbox.log)".into();
            }
            // The child serves on, re-parented to init (or a subreaper) once we exit; it is
            // reaped only if it failed during set-up.
            if !msg.starts_with("ok ") {
                let _ = nix::sys::wait::waitpid(child, None);
            }
            let ok = msg.starts_with("ok ");
            print!("{msg}");
            let _ = std::io::stdout().flush();
            if ok { 0 } else { 1 }
        }
        Ok(ForkResult::Child) => {
            drop(r);
            let mut ready = std::fs::File::from(w);
            // The answered shutdown request's connection closes with the process (see `serve`).
            let mut _shutdown_conn = None;
            let code = match setup(&layout) {
                Ok(mut server) => {
                    let _ = writeln!(ready, "ok {}", getpid());
                    drop(ready);
                    detach_stdio();
                    _shutdown_conn = Some(server.serve());
                    0
                }
                Err(e) => {
                    tracing::error!("sandbox set-up failed: {e}");
                    // The kind goes first, so that the launcher can tell a bad spec (e.g. a
                    // sysctl the kernel does not have) from a failure (see `client::launch`).
                    let _ = writeln!(ready, "err {:?} {e}", e.kind());
                    1
                }
            };
            std::process::exit(code);
        }
    }
}

/// Points stdout at stderr (the sandbox log) so the launcher's pipe closes, and stdin at /dev/null.
fn detach_stdio() {
    let _ = nix::unistd::dup2(2, 1);
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
    }
}

fn setup(layout: &Layout) -> Result<server::Server> {
    setsid().map_err(|e| Error::new(Kind::Internal, format!("setsid: {e}")))?;
    let text = std::fs::read(layout.spec()).map_err(|e| Error::io("reading", layout.spec(), e))?;
    let spec: Spec = serde_json::from_slice(&text)?;
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| Error::new(Kind::Internal, format!("becoming child subreaper: {e}")))?;
    if let Some(slice) = &spec.systemd_slice {
        cgroup::join_systemd_scope(slice, SCOPE_PREFIX, &spec.id, SANDBOX_CGROUP, getpid())?;
    }
    if !spec.cgroup_parent.is_empty() {
        cgroup::join_self(&sandbox_cgroup(&spec))?;
    }
    // The pod's infrastructure is the last of its processes the OOM killer takes (upstream
    // gives its pause container the same), whatever the agent that launched it has; where
    // the kernel refuses (no CAP_SYS_RESOURCE) it keeps the agent's.
    let _ = std::fs::write(
        "/proc/self/oom_score_adj",
        SANDBOX_OOM_SCORE_ADJ.to_string(),
    );
    let mut helpers = ns::enter_pod_namespaces(&spec)?;
    if spec.namespaces.pid == NamespaceMode::Pod {
        helpers.pid_ns_holder = Some(ns::start_pid_namespace_holder(helpers.userns_holder)?);
    }
    files::write_pod_files(layout, &spec)?;
    for dir in [layout.container_root(), layout.status_dir()] {
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
    }
    let server = server::Server::bind(layout.clone(), spec, helpers)?;
    std::fs::write(layout.pid_file(), getpid().to_string())
        .map_err(|e| Error::io("writing", layout.pid_file(), e))?;
    Ok(server)
}

/// The cgroup the sandbox process itself runs in.
pub fn sandbox_cgroup(spec: &Spec) -> String {
    format!(
        "{}/{SANDBOX_CGROUP}",
        spec.cgroup_parent.trim_end_matches('/')
    )
}

/// Leaves the pod cgroup for the root one and removes the sandbox's cgroups.
fn release_cgroups(spec: &Spec) {
    if spec.cgroup_parent.is_empty() {
        return;
    }
    if let Err(e) = cgroup::join_self("/") {
        tracing::warn!("leaving the pod cgroup: {e}");
    }
    if let Err(e) = cgroup::remove(&sandbox_cgroup(spec)) {
        tracing::warn!("{e}");
    }
    if spec.owns_cgroup_parent {
        if let Err(e) = cgroup::remove(&spec.cgroup_parent) {
            tracing::warn!("{e}");
        }
    }
}

/// Persists a container's status under a sandbox's state dir (errors are logged).
pub(crate) fn persist(layout: &Layout, status: &crate::spec::ContainerStatus) {
    containers::persist(layout, status)
}

/// Container statuses persisted under a sandbox's state dir.
pub fn read_persisted(layout: &Layout) -> Vec<crate::spec::ContainerStatus> {
    containers::read_persisted(layout).into_values().collect()
}

/// What is left of a pod whose sandbox process died without shutting down: the helpers in the
/// sandbox's own cgroup (namespace holders, the node-port proxy) and every container and exec in
/// the containers' cgroups are killed (nobody else may reap or confine them now), the
/// containers' cgroups removed, and the containers that were created or running recorded as
/// exited, killed, as the sandbox would have recorded them. Returns those statuses.
///
/// Only the cgroups the sandbox made are touched: the pod cgroup above them may be the caller's.
pub fn reap_dead(
    layout: &Layout,
    cgroup_parent: &str,
) -> Result<Vec<crate::spec::ContainerStatus>> {
    use crate::spec::State;
    const WAIT: std::time::Duration = std::time::Duration::from_secs(10);
    let parent = cgroup_parent.trim_end_matches('/');
    let mut failures = Vec::new();
    if !parent.is_empty() {
        let own = format!("{parent}/{SANDBOX_CGROUP}");
        if let Err(e) = cgroup::kill_tree(&own, WAIT) {
            failures.push(e.to_string());
        }
    }
    let mut ended = Vec::new();
    for (_, mut status) in containers::read_persisted(layout) {
        if let Some(path) = status.cgroup_path.clone() {
            match cgroup::kill_tree(&path, WAIT).and_then(|_| cgroup::remove(&path)) {
                Ok(()) => {}
                Err(e) => failures.push(e.to_string()),
            }
        }
        if matches!(status.state, State::Created | State::Running) {
            status.state = State::Exited;
            status.exit_code = 128 + nix::sys::signal::Signal::SIGKILL as i32;
            status.finished_at = crate::spec::now_ns();
            status.reason = "Error".into();
            status.message = "the pod's sandbox process died; the container was killed".into();
            containers::persist(layout, &status);
            ended.push(status);
        }
    }
    if failures.is_empty() {
        Ok(ended)
    } else {
        Err(Error::new(Kind::Internal, failures.join("; ")))
    }
}
