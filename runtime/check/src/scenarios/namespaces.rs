//! The pod's namespaces beyond the network: the node's PID and IPC namespaces (hostPID,
//! hostIPC), one PID namespace for the whole pod (shareProcessNamespace), and by default a PID
//! namespace per container and an IPC namespace per pod.

use runtime::cri;

use crate::ctx::{Ctx, Pod};
use crate::outcome::{Step, Stop, ensure, ensure_eq};

const NODE: i32 = cri::NamespaceMode::Node as i32;
const POD: i32 = cri::NamespaceMode::Pod as i32;
const CONTAINER: i32 = cri::NamespaceMode::Container as i32;

/// This process's namespace of `kind` (`pid`, `ipc`), e.g. `pid:[4026531836]`.
fn own_ns(kind: &str) -> Step<String> {
    std::fs::read_link(format!("/proc/self/ns/{kind}"))
        .map(|p| p.to_string_lossy().into_owned())
        .map_err(|e| Stop::Skip(format!("cannot read this process's {kind} namespace: {e}")))
}

/// [`Ctx::pod_config`]`(name)` with the PID and IPC namespace modes given, as the kubelet
/// sends them.
fn pod_config(c: &Ctx<'_>, name: &str, pid: i32, ipc: i32) -> cri::PodSandboxConfig {
    let mut cfg = c.pod_config(name);
    let linux = cfg.linux.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    let ns = sc.namespace_options.get_or_insert_with(Default::default);
    ns.pid = pid;
    ns.ipc = ipc;
    cfg
}

/// Runs `cmd` in `pod` as container `name` with the pod's namespace modes (the kubelet repeats
/// them on each container).
async fn run(c: &Ctx<'_>, pod: &Pod, name: &str, cmd: &[&str]) -> Step<String> {
    let mut cfg = c.container_config(name, cmd);
    let pod_ns = pod
        .1
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.clone());
    cfg.linux = Some(cri::LinuxContainerConfig {
        security_context: Some(cri::LinuxContainerSecurityContext {
            namespace_options: pod_ns,
            ..Default::default()
        }),
        ..Default::default()
    });
    c.run_with(pod, cfg).await
}

/// The command lines of the processes `id` sees, one per line.
async fn processes(c: &Ctx<'_>, id: &str) -> Step<String> {
    let script = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done";
    let r = c.exec(id, &["sh", "-c", script]).await?;
    ensure_eq!(r.code, 0, "listing processes (stderr {:?})", r.err);
    Ok(r.out)
}

pub async fn host_pid_and_ipc_namespaces(c: &Ctx<'_>) -> Step {
    let (pid, ipc) = (own_ns("pid")?, own_ns("ipc")?);
    let pod = c.run_pod(pod_config(c, "hostpid", NODE, NODE)).await?;
    let a = run(c, &pod, "a", &["sleep", "600"]).await?;
    let r = c
        .exec(
            &a,
            &[
                "sh",
                "-c",
                "readlink /proc/self/ns/pid; readlink /proc/self/ns/ipc",
            ],
        )
        .await?;
    ensure_eq!(
        r.out,
        format!("{pid}\n{ipc}\n"),
        "a hostPID and hostIPC container's namespaces"
    );
    // The node's processes are in sight: this one among them.
    let me = std::process::id();
    let r = c.exec(&a, &["test", "-d", &format!("/proc/{me}")]).await?;
    ensure_eq!(
        r.code,
        0,
        "the check's own process {me} seen from a hostPID container"
    );
    Ok(())
}

pub async fn pod_pid_namespace_shared(c: &Ctx<'_>) -> Step {
    let host_pid = own_ns("pid")?;
    let pod = c.run_pod(pod_config(c, "sharedpid", POD, POD)).await?;
    let a = run(c, &pod, "a", &["sleep", "601"]).await?;
    let b = run(c, &pod, "b", &["sleep", "602"]).await?;
    let ns = "readlink /proc/self/ns/pid; readlink /proc/self/ns/ipc";
    let ra = c.exec(&a, &["sh", "-c", ns]).await?;
    let rb = c.exec(&b, &["sh", "-c", ns]).await?;
    ensure_eq!(
        ra.out,
        rb.out,
        "one pod's containers' PID and IPC namespaces"
    );
    ensure!(
        !ra.out.contains(&host_pid),
        "a pod's PID namespace is the node's: {}",
        ra.out
    );
    let seen = processes(c, &b).await?;
    ensure!(
        seen.lines().any(|l| l.trim() == "sleep 601"),
        "container b does not see container a's process in the pod's PID namespace:\n{seen}"
    );
    Ok(())
}

pub async fn private_pid_namespaces(c: &Ctx<'_>) -> Step {
    let (host_pid, host_ipc) = (own_ns("pid")?, own_ns("ipc")?);
    let pod = c.run_pod(pod_config(c, "ownpid", CONTAINER, POD)).await?;
    let a = run(c, &pod, "a", &["sleep", "601"]).await?;
    let b = run(c, &pod, "b", &["sleep", "602"]).await?;
    // Each container's own command is its PID 1, and the other's is out of sight.
    let init = c
        .exec(&b, &["sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline"])
        .await?;
    ensure_eq!(init.out.trim(), "sleep 602", "PID 1 of container b");
    let seen = processes(c, &b).await?;
    ensure!(
        !seen.lines().any(|l| l.trim() == "sleep 601"),
        "container b sees container a's process:\n{seen}"
    );
    let ns = "readlink /proc/self/ns/pid; readlink /proc/self/ns/ipc";
    let ra = c.exec(&a, &["sh", "-c", ns]).await?;
    let rb = c.exec(&b, &["sh", "-c", ns]).await?;
    let (a_pid, a_ipc) = ra.out.split_once('\n').unwrap_or_default();
    let (b_pid, b_ipc) = rb.out.split_once('\n').unwrap_or_default();
    ensure!(
        a_pid != b_pid && a_pid != host_pid,
        "the containers' PID namespaces: {a_pid} and {b_pid} (the node's {host_pid})"
    );
    ensure!(
        a_ipc == b_ipc && a_ipc.trim() != host_ipc,
        "the pod's IPC namespace: {a_ipc} and {b_ipc} (the node's {host_ipc})"
    );
    Ok(())
}

pub async fn target_pid_namespace(c: &Ctx<'_>) -> Step {
    let pod = c.pod("target").await?;
    let a = c.run(&pod, "a", &["sleep", "601"]).await?;
    // A debugging container (kubectl debug --target) in container a's PID namespace.
    let mut cfg = c.container_config("debug", &["sleep", "602"]);
    cfg.linux = Some(cri::LinuxContainerConfig {
        security_context: Some(cri::LinuxContainerSecurityContext {
            namespace_options: Some(cri::NamespaceOption {
                network: pod_network_mode(&pod),
                ipc: POD,
                pid: cri::NamespaceMode::Target as i32,
                target_id: a.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let debug = c.run_with(&pod, cfg).await?;
    let init = c
        .exec(&debug, &["sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline"])
        .await?;
    ensure_eq!(
        init.out.trim(),
        "sleep 601",
        "PID 1 as the targeting container sees it: the target's command"
    );
    let ns = "readlink /proc/self/ns/pid";
    let ra = c.exec(&a, &["sh", "-c", ns]).await?;
    let rd = c.exec(&debug, &["sh", "-c", ns]).await?;
    ensure_eq!(rd.out, ra.out, "the targeting container's PID namespace");
    Ok(())
}

/// The pod's network mode as its config says (NODE on the hostNetwork fallback).
fn pod_network_mode(pod: &Pod) -> i32 {
    pod.1
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref())
        .map(|n| n.network)
        .unwrap_or(POD)
}

pub async fn pod_user_namespace(c: &Ctx<'_>) -> Step {
    // The kubelet gives a user-namespaced pod its own network, IPC and PID namespaces.
    c.needs_pod_network()?;
    // 65536 IDs from 2^30, where no node's own users live.
    let (host, length) = (1u32 << 30, 65_536u32);
    let map = || {
        vec![cri::IdMapping {
            host_id: host,
            container_id: 0,
            length,
        }]
    };
    let userns = cri::UserNamespace {
        mode: POD,
        uids: map(),
        gids: map(),
    };
    let mut cfg = c.own_network_pod("userns");
    let linux = cfg.linux.get_or_insert_with(Default::default);
    let sc = linux.security_context.get_or_insert_with(Default::default);
    sc.namespace_options = Some(cri::NamespaceOption {
        network: POD,
        ipc: POD,
        pid: CONTAINER,
        userns_options: Some(userns.clone()),
        ..Default::default()
    });
    let pod = c.run_pod(cfg).await?;
    let mut ccfg = c.container_config("c", &["sleep", "600"]);
    ccfg.linux = Some(cri::LinuxContainerConfig {
        security_context: Some(cri::LinuxContainerSecurityContext {
            namespace_options: Some(cri::NamespaceOption {
                network: POD,
                ipc: POD,
                pid: CONTAINER,
                userns_options: Some(userns),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = c.run_with(&pod, ccfg).await?;
    let r = c
        .exec(
            &id,
            &[
                "sh",
                "-c",
                "cat /proc/self/uid_map /proc/self/gid_map; id -u",
            ],
        )
        .await?;
    let fields: Vec<Vec<&str>> = r
        .out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let want_map = vec!["0".to_string(), host.to_string(), length.to_string()];
    let got: Vec<Vec<String>> = fields
        .iter()
        .map(|f| f.iter().map(|s| s.to_string()).collect())
        .collect();
    ensure_eq!(
        got,
        vec![want_map.clone(), want_map, vec!["0".to_string()]],
        "the container's UID and GID maps, and its user (stderr {:?})",
        r.err
    );
    let own = own_ns("user")?;
    let r = c.exec(&id, &["readlink", "/proc/self/ns/user"]).await?;
    ensure!(
        r.out.trim() != own,
        "the container is in the node's user namespace {own}"
    );
    Ok(())
}
