//! The container's Linux namespaces.
//!
//! The pod's network, IPC and UTS namespaces are held by the sandbox process and joined by
//! path; a node-mode namespace is simply not listed, so the container stays in the host's (the
//! sandbox process is itself in the host's then, unlike containerd's pause container which is
//! always joined). Mount is always new; cgroup is new on cgroup v2 for unprivileged
//! containers, like containerd (on v1 it would hide nothing and break tools that expect host
//! paths).

use std::path::PathBuf;

use oci_spec::runtime::{LinuxNamespace, LinuxNamespaceBuilder, LinuxNamespaceType};

use super::{SpecInput, invalid, oci_error, sandbox_security_context};
use crate::{Result, cri};

/// A CRI `NamespaceMode` as an enum, rejecting unknown values.
fn mode(value: i32, what: &str) -> Result<cri::NamespaceMode> {
    cri::NamespaceMode::try_from(value)
        .map_err(|_| invalid(format!("{what}: unknown namespace mode {value}")))
}

fn ns(typ: LinuxNamespaceType, path: Option<String>) -> Result<LinuxNamespace> {
    let b = LinuxNamespaceBuilder::default().typ(typ);
    let b = match path {
        Some(p) => b.path(PathBuf::from(p)),
        None => b,
    };
    b.build().map_err(oci_error("namespace"))
}

fn proc_ns(pid: i32, name: &str, what: &str) -> Result<Option<String>> {
    if pid <= 0 {
        return Err(invalid(format!(
            "{what}: invalid process id {pid} to join the namespace of"
        )));
    }
    Ok(Some(format!("/proc/{pid}/ns/{name}")))
}

/// The namespaces of the container described by `input`.
///
/// Network and IPC come from the sandbox's namespace options (those namespaces exist or not
/// already, whatever the container asks); the PID mode comes from the container's options
/// (where `TARGET` lives), else the sandbox's, else `CONTAINER`.
pub(super) fn namespaces(
    input: &SpecInput,
    sc: &cri::LinuxContainerSecurityContext,
    cgroup_v2: bool,
) -> Result<Vec<LinuxNamespace>> {
    let pod_opts =
        sandbox_security_context(input.sandbox).and_then(|s| s.namespace_options.as_ref());
    let ctr_opts = sc.namespace_options.as_ref();
    // The pod's user namespace (RunPodSandbox checked its options): containers join it; a
    // container may repeat the pod's mode, not ask for another.
    let userns_mode = |opts: Option<&cri::NamespaceOption>, who: &str| match opts
        .and_then(|o| o.userns_options.as_ref())
    {
        Some(u) => mode(u.mode, &format!("{who} user namespace")),
        None => Ok(cri::NamespaceMode::Node),
    };
    let pod_userns = userns_mode(pod_opts, "pod")?;
    let ctr_userns = userns_mode(ctr_opts, "container")?;
    if ctr_opts.and_then(|o| o.userns_options.as_ref()).is_some() && ctr_userns != pod_userns {
        return Err(invalid(format!(
            "container user namespace mode {} differs from the pod's {}",
            ctr_userns.as_str_name(),
            pod_userns.as_str_name()
        )));
    }
    let pod = pod_opts.cloned().unwrap_or_default();
    let network = mode(pod.network, "network namespace")?;
    let ipc = mode(pod.ipc, "IPC namespace")?;
    let pid = match ctr_opts.or(pod_opts) {
        Some(o) => mode(o.pid, "PID namespace")?,
        None => cri::NamespaceMode::Container,
    };

    // The pod's network, UTS and IPC namespaces, by a process's /proc entry: the sandbox
    // process's, or with a pod user namespace its holder's (a container inside that namespace
    // may not look at the sandbox process, which is outside it).
    let pod_ns_pid = match (pod_userns, input.userns_holder) {
        (cri::NamespaceMode::Pod, Some(holder)) => holder,
        _ => input.sandbox_pid,
    };
    let mut out = vec![ns(LinuxNamespaceType::Mount, None)?];
    if pod_userns == cri::NamespaceMode::Pod {
        let holder = input.userns_holder.ok_or_else(|| {
            invalid("user namespace mode POD: the pod sandbox has no user namespace")
        })?;
        out.push(ns(
            LinuxNamespaceType::User,
            proc_ns(holder, "user", "user namespace")?,
        )?);
    }
    match network {
        cri::NamespaceMode::Node => {}
        cri::NamespaceMode::Pod => {
            out.push(ns(
                LinuxNamespaceType::Network,
                proc_ns(pod_ns_pid, "net", "network namespace")?,
            )?);
            // UTS follows the network namespace, as in Kubernetes.
            out.push(ns(
                LinuxNamespaceType::Uts,
                proc_ns(pod_ns_pid, "uts", "UTS namespace")?,
            )?);
        }
        m => {
            return Err(invalid(format!(
                "network namespace mode {}: only POD and NODE are supported",
                m.as_str_name()
            )));
        }
    }
    match ipc {
        cri::NamespaceMode::Node => {}
        cri::NamespaceMode::Pod => out.push(ns(
            LinuxNamespaceType::Ipc,
            proc_ns(pod_ns_pid, "ipc", "IPC namespace")?,
        )?),
        m => {
            return Err(invalid(format!(
                "IPC namespace mode {}: only POD and NODE are supported",
                m.as_str_name()
            )));
        }
    }
    match pid {
        cri::NamespaceMode::Node => {}
        cri::NamespaceMode::Container => out.push(ns(LinuxNamespaceType::Pid, None)?),
        cri::NamespaceMode::Pod => {
            let holder = input.pid_ns_holder.ok_or_else(|| {
                invalid("PID namespace mode POD: the pod sandbox has no shared PID namespace")
            })?;
            out.push(ns(
                LinuxNamespaceType::Pid,
                proc_ns(holder, "pid", "PID namespace")?,
            )?);
        }
        cri::NamespaceMode::Target => {
            let target_id = ctr_opts.map(|o| o.target_id.as_str()).unwrap_or_default();
            let target = input.target_pid.ok_or_else(|| {
                invalid(format!(
                    "PID namespace mode TARGET: target container {target_id:?} has no running \
                     process"
                ))
            })?;
            out.push(ns(
                LinuxNamespaceType::Pid,
                proc_ns(target, "pid", "PID namespace of the target")?,
            )?);
        }
    }
    if cgroup_v2 && !sc.privileged {
        out.push(ns(LinuxNamespaceType::Cgroup, None)?);
    }
    Ok(out)
}
