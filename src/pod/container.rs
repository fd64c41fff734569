//! Pod container → CRI `ContainerConfig` (upstream `generateContainerConfig`).
//!
//! Command and args (Kubernetes `command` replaces the image entrypoint and `args` its cmd,
//! both with `$(VAR)` references expanded from the container's env), the environment
//! ([`super::env`]), volume mounts (of the
//! volumes set up before the sandbox by [`crate::volumes::plugins`] and [`crate::volumes`]; configMap,
//! secret, downwardAPI and projected ones always read-only),
//! the log path `<name>/<restart count>.log`, labels, annotations
//! (spec hash, restart count, termination message path and policy), Linux resources (CPU
//! shares/quota, memory limit, OOM score by QoS), the security context (pod settings overridden
//! by the container's) and the termination message file with its mount
//! ([`super::termination::prepare_mount`]). Besides that file, this module only makes the
//! directories a `subPath` (or a `subPathExpr`, expanded from the container's environment)
//! lacks in its volume ([`crate::volumes::plugins::sub_path`], which refuses a `subPath` leading out of
//! its volume through a symbolic link).

use std::collections::HashMap;
use std::path::{Component, Path};

use k8s_openapi::api::core::v1::{Container, Pod};
use runtime::cri;
use runtime::{Error, Result};

use super::spec::{
    all_containers, container_resources, namespace_options, pod_spec, qos_class, seccomp_profile,
};
use super::termination;
use super::{
    ANNOTATION_CONTAINER_HASH, ANNOTATION_RESTART_COUNT, ANNOTATION_TERMINATION_MESSAGE_PATH,
    LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID, container_hash,
};
use crate::model::PodRef;
use crate::util::{expand, expand_all};
use crate::volumes::plugins as volumes;

pub use super::options::ContainerOptions;

/// The CRI mounts of `c`: each binds what the sync set the volume up as (`opts.volumes`).
fn mounts(
    pod: &Pod,
    who: &PodRef,
    c: &Container,
    opts: &ContainerOptions,
    vars: &HashMap<String, String>,
) -> Result<Vec<cri::Mount>> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let privileged = c
        .security_context
        .as_ref()
        .and_then(|s| s.privileged)
        .unwrap_or(false);
    let mut out = Vec::new();
    for (i, m) in c.volume_mounts.iter().flatten().enumerate() {
        let field = format!("spec.containers[{}].volumeMounts[{i}]", c.name);
        let v = volumes
            .and_then(|vs| vs.iter().find(|v| v.name == m.name))
            .ok_or_else(|| {
                Error::invalid_argument(format!("{field}.name: no volume {:?}", m.name))
            })?;
        let mounted = opts.volumes.get(&v.name).ok_or_else(|| {
            let why = volumes::not_set_up(v);
            Error::unimplemented(format!("spec.volumes[{}]: {why}", v.name))
        })?;
        let mut host_path = mounted.path.clone();
        let expanded = match m.sub_path_expr.as_deref().filter(|s| !s.is_empty()) {
            Some(expr) => Some(
                expand_all(expr, vars)
                    .map_err(|e| Error::invalid_argument(format!("{field}.subPathExpr: {e}")))?,
            ),
            None => None,
        };
        if let Some(sub) = expanded
            .as_deref()
            .or(m.sub_path.as_deref())
            .filter(|s| !s.is_empty())
        {
            let p = Path::new(sub);
            if p.components()
                .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
            {
                return Err(Error::invalid_argument(format!(
                    "{field}.subPath: {sub:?} must be a relative path without '..'"
                )));
            }
            let target = volumes::sub_path_target(&opts.pods_dir, &who.uid, &v.name, &c.name, i);
            volumes::sub_path(&host_path, p)
                .and_then(|fd| volumes::bind_sub_path(&fd, &target))
                .map_err(|e| Error::invalid_argument(format!("{field}.subPath: {e}")))?;
            host_path = target;
        }
        if !m.mount_path.starts_with('/') {
            return Err(Error::invalid_argument(format!(
                "{field}.mountPath: must be absolute"
            )));
        }
        let propagation = match m.mount_propagation.as_deref() {
            None | Some("None") => cri::MountPropagation::PropagationPrivate,
            Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") if privileged => cri::MountPropagation::PropagationBidirectional,
            Some("Bidirectional") => {
                return Err(Error::invalid_argument(format!(
                    "{field}.mountPropagation: Bidirectional needs a privileged container"
                )));
            }
            Some(other) => {
                return Err(Error::invalid_argument(format!(
                    "{field}.mountPropagation: unknown {other:?}"
                )));
            }
        };
        // As upstream: in the pod's user namespace every mount is ID-mapped through it.
        let userns = opts.sandbox.user_namespace.as_ref();
        out.push(cri::Mount {
            container_path: m.mount_path.clone(),
            host_path: host_path.to_string_lossy().into_owned(),
            // The volumes the kubelet writes are read-only in every container (upstream's
            // mustMountRO), as is a claim the pod asks for read-only.
            readonly: m.read_only.unwrap_or(false) || mounted.read_only,
            propagation: propagation as i32,
            uid_mappings: userns.map(|u| u.uids.clone()).unwrap_or_default(),
            gid_mappings: userns.map(|u| u.gids.clone()).unwrap_or_default(),
            ..Default::default()
        });
    }
    Ok(out)
}

/// OOM score adjustment by QoS (upstream `GetContainerOOMScoreAdjust`).
fn oom_score_adj(qos: &str, mem_request: i64, capacity: i64) -> i64 {
    match qos {
        "Guaranteed" => -997,
        "BestEffort" => 1000,
        _ => {
            if capacity <= 0 {
                return 999;
            }
            let adj = 1000 - (1000 * i128::from(mem_request) / i128::from(capacity)) as i64;
            adj.clamp(3, 999)
        }
    }
}

/// The container `name` of `pod` (an init or an app container).
pub fn find<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    all_containers(pod.spec.as_ref()?).find(|c| c.name == name)
}

/// The CRI Linux resources of the container `c` of `pod`: CPU shares and CFS quota, memory
/// limit, OOM score adjustment (what it is created with, and what a resize updates).
pub fn linux_resources(
    pod: &Pod,
    c: &Container,
    opts: &ContainerOptions,
) -> Result<cri::LinuxContainerResources> {
    let r = container_resources(c)?;
    let shares = r.cpu_request.map_or(2, |m| (m * 1024 / 1000).max(2));
    let (cpu_period, cpu_quota) = match r.cpu_limit {
        Some(m) if m > 0 => (100_000, (m * 100_000 / 1000).max(1000)),
        _ => (0, 0),
    };
    Ok(cri::LinuxContainerResources {
        cpu_shares: shares,
        cpu_period,
        cpu_quota,
        memory_limit_in_bytes: r.mem_limit.unwrap_or(0),
        oom_score_adj: oom_score_adj(
            qos_class(pod),
            r.mem_request.unwrap_or(0),
            opts.node_memory_bytes,
        ),
        ..Default::default()
    })
}

fn security(
    pod: &Pod,
    c: &Container,
    opts: &ContainerOptions,
) -> Result<cri::LinuxContainerSecurityContext> {
    let spec = pod_spec(pod)?;
    let psc = spec.security_context.clone().unwrap_or_default();
    let sc = c.security_context.clone().unwrap_or_default();
    let field = format!("spec.containers[{}].securityContext", c.name);
    let run_as_user = sc.run_as_user.or(psc.run_as_user);
    if sc.run_as_non_root.or(psc.run_as_non_root) == Some(true) && run_as_user == Some(0) {
        return Err(Error::invalid_argument(format!(
            "{field}: runAsUser 0 breaks runAsNonRoot"
        )));
    }
    let privileged = sc.privileged.unwrap_or(false);
    let mut supplemental_groups = psc.supplemental_groups.clone().unwrap_or_default();
    if let Some(fs) = psc.fs_group {
        supplemental_groups.push(fs);
    }
    let caps = sc.capabilities.as_ref();
    let seccomp = if privileged {
        None
    } else {
        let p = sc.seccomp_profile.as_ref().or(psc.seccomp_profile.as_ref());
        Some(seccomp_profile(
            p,
            &opts.sandbox,
            &format!("{field}.seccompProfile"),
        )?)
    };
    Ok(cri::LinuxContainerSecurityContext {
        capabilities: caps.map(|c| cri::Capability {
            add_capabilities: c.add.clone().unwrap_or_default(),
            drop_capabilities: c.drop.clone().unwrap_or_default(),
            ..Default::default()
        }),
        privileged,
        namespace_options: Some(namespace_options(
            spec,
            opts.sandbox.user_namespace.as_ref(),
        )),
        run_as_user: run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: sc
            .run_as_group
            .or(psc.run_as_group)
            .map(|value| cri::Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups,
        no_new_privs: !privileged && sc.allow_privilege_escalation == Some(false),
        seccomp,
        ..Default::default()
    })
}

/// The CRI config to create `container` of `pod` for its `restart_count`-th restart.
pub fn container_config(
    pod: &Pod,
    who: &PodRef,
    container: &Container,
    restart_count: u32,
    opts: &ContainerOptions,
) -> Result<cri::ContainerConfig> {
    let spec = pod_spec(pod)?;
    if !all_containers(spec).any(|c| c.name == container.name) {
        return Err(Error::invalid_argument(format!(
            "container {:?} is not in the pod spec",
            container.name
        )));
    }
    // The stop signal: the container's own (lifecycle.stopSignal), else the image's STOPSIGNAL,
    // else SIGTERM (the runtime's part). CRI v1 as this kubelet speaks it has no field for the
    // first: the built-in runtime takes it as an annotation, other runtimes cannot, and a pod
    // asking for it there is refused rather than stopped with another signal than asked.
    let stop_signal = container
        .lifecycle
        .as_ref()
        .and_then(|l| l.stop_signal.clone());
    if let Some(sig) = &stop_signal {
        if !opts.stop_signal_annotation {
            return Err(Error::invalid_argument(format!(
                "lifecycle.stopSignal {sig:?} is not supported with this container runtime: \
                 the container runtime API this kubelet speaks cannot carry it (the built-in \
                 runtime can); remove it to use the image's STOPSIGNAL"
            )));
        }
    }
    let image = container
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "spec.containers[{}].image is required",
                container.name
            ))
        })?;
    let env = super::env::envs(pod, who, container, opts)?;
    let vars: HashMap<String, String> = env.iter().cloned().collect();
    let expand_all =
        |v: &Option<Vec<String>>| v.iter().flatten().map(|s| expand(s, &vars)).collect();
    let labels = HashMap::from([
        (LABEL_CONTAINER_NAME.to_string(), container.name.clone()),
        (LABEL_POD_NAME.to_string(), who.name.clone()),
        (LABEL_POD_NAMESPACE.to_string(), who.namespace.clone()),
        (LABEL_POD_UID.to_string(), who.uid.clone()),
    ]);
    let termination_path = termination::message_path(container).unwrap_or_default();
    let termination_policy = container
        .termination_message_policy
        .clone()
        .unwrap_or_else(|| "File".into());
    // What the container's device plugins answered: their annotations under the kubelet's
    // own, their envs before the container's (whose own win), their mounts before its
    // volumes', their device nodes and CDI devices (upstream's GetResources).
    let devices = opts
        .devices
        .get(&container.name)
        .cloned()
        .unwrap_or_default();
    let mut annotations: HashMap<String, String> = devices.annotations.into_iter().collect();
    annotations.extend([
        (
            ANNOTATION_CONTAINER_HASH.to_string(),
            container_hash(container),
        ),
        (
            ANNOTATION_RESTART_COUNT.to_string(),
            restart_count.to_string(),
        ),
        (
            ANNOTATION_TERMINATION_MESSAGE_PATH.to_string(),
            termination_path.to_string(),
        ),
        (
            termination::ANNOTATION_TERMINATION_MESSAGE_POLICY.to_string(),
            termination_policy,
        ),
    ]);
    if let Some(sig) = stop_signal {
        annotations.insert(runtime::builtin::ANNOTATION_STOP_SIGNAL.to_string(), sig);
    }
    let volume_mounts = mounts(pod, who, container, opts, &vars)?;
    let mut mounts = devices.mounts;
    mounts.extend(volume_mounts);
    let linux = cri::LinuxContainerConfig {
        resources: Some(linux_resources(pod, container, opts)?),
        security_context: Some(security(pod, container, opts)?),
    };
    // The hosts file the kubelet writes for the pod, unless the container mounts its own.
    if !mounts
        .iter()
        .any(|m| m.container_path == super::identity::ETC_HOSTS)
    {
        let hostname = super::spec::hostname(pod, who);
        let userns = opts.sandbox.user_namespace.as_ref();
        mounts.extend(
            super::identity::hosts_mount(
                &opts.pods_dir,
                pod,
                who,
                &hostname,
                &opts.sandbox.cluster_domain,
                &opts.pod_ips,
            )?
            .map(|m| cri::Mount {
                // As the volumes: ID-mapped through the pod's user namespace.
                uid_mappings: userns.map(|u| u.uids.clone()).unwrap_or_default(),
                gid_mappings: userns.map(|u| u.gids.clone()).unwrap_or_default(),
                ..m
            }),
        );
    }
    // Last, once nothing else can fail: the termination message file on the host.
    mounts.extend(termination::prepare_mount(
        &opts.pods_dir,
        &who.uid,
        container,
        restart_count,
    )?);
    Ok(cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: container.name.clone(),
            attempt: restart_count,
        }),
        image: Some(cri::ImageSpec {
            image: image.clone(),
            user_specified_image: image,
            ..Default::default()
        }),
        command: expand_all(&container.command),
        args: expand_all(&container.args),
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: devices
            .envs
            .into_iter()
            .chain(env)
            .map(|(key, value)| cri::KeyValue { key, value })
            .collect(),
        devices: devices.devices,
        cdi_devices: devices
            .cdi_devices
            .into_iter()
            .map(|name| cri::CdiDevice { name })
            .collect(),
        mounts,
        labels,
        annotations,
        log_path: format!("{}/{restart_count}.log", container.name),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(linux),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests;
