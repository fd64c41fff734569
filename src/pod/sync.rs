//! Executing [`PodActions`] through the CRI traits: the one part of `pod` that does I/O.
//!
//! [`runtime_pod_status`] gathers what the runtime knows about a pod (its sandboxes and
//! containers, found by the `io.kubernetes.pod.uid` label); [`sync_pod`] carries out the
//! actions computed from it like upstream's `SyncPod`: stop the pod or single containers, run a
//! new sandbox, then pull images as `imagePullPolicy` says and create and start the next init
//! container or the app containers, recording restarts in the CrashLoopBackOff state. Failures
//! to start a container do not stop the others; they come back as waiting reasons for
//! [`super::status::StatusContext::waiting`].

use std::collections::HashMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Container, Pod};
use runtime::{Error, ImageService, Result, RuntimeService, cri};

use super::actions::{PodActions, RunState, RuntimePodStatus};
use super::backoff::{self, Backoff};
use super::container::{ContainerOptions, container_config};
use super::spec::{SandboxOptions, pod_spec, sandbox_config};
use super::{LABEL_POD_UID, pod_identity};

/// What the runtime knows about one pod.
#[derive(Debug, Clone, Default)]
pub struct RuntimeSnapshot {
    /// The digest [`super::compute_pod_actions`] works on.
    pub status: RuntimePodStatus,
    /// CRI statuses of the pod's sandboxes, newest first.
    pub sandboxes: Vec<cri::PodSandboxStatus>,
    /// CRI statuses of all the pod's containers.
    pub containers: Vec<cri::ContainerStatus>,
}

/// Lists the sandboxes and containers labelled with `pod_uid` and reads their statuses.
/// Objects that vanish between the list and the status call are skipped.
pub async fn runtime_pod_status(rt: &dyn RuntimeService, pod_uid: &str) -> Result<RuntimeSnapshot> {
    let selector: HashMap<String, String> =
        [(LABEL_POD_UID.to_string(), pod_uid.to_string())].into();
    let listed = rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: selector.clone(),
                ..Default::default()
            }),
        })
        .await?;
    let mut sandboxes = Vec::new();
    for sb in listed.items {
        match rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: sb.id,
                verbose: false,
            })
            .await
        {
            Ok(r) => sandboxes.extend(r.status),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let listed = rt
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: selector,
                ..Default::default()
            }),
        })
        .await?;
    let mut containers = Vec::new();
    for c in listed.containers {
        match rt
            .container_status(cri::ContainerStatusRequest {
                container_id: c.id,
                verbose: false,
            })
            .await
        {
            Ok(r) => containers.extend(r.status),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    Ok(RuntimeSnapshot {
        status: RuntimePodStatus::from_cri(&sandboxes, &containers),
        sandboxes,
        containers,
    })
}

/// The outcome of one [`sync_pod`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncResult {
    /// The sandbox the containers run in, if any.
    pub sandbox_id: Option<String>,
    /// Containers created and started, by name.
    pub started: Vec<String>,
    /// Containers that could not be started: name → (reason, message), e.g. `ErrImagePull`.
    pub waiting: HashMap<String, (String, String)>,
    /// Failures of kill or sandbox steps (the next sync retries).
    pub errors: Vec<String>,
}

/// The effective pull policy: the container's, else `Always` for `:latest` or untagged images
/// and `IfNotPresent` otherwise (API defaulting).
pub fn pull_policy(c: &Container) -> &str {
    if let Some(p) = c.image_pull_policy.as_deref().filter(|p| !p.is_empty()) {
        return p;
    }
    let image = c.image.as_deref().unwrap_or("");
    let last = image.rsplit('/').next().unwrap_or(image);
    if image.contains('@') || last.split_once(':').is_some_and(|(_, tag)| tag != "latest") {
        "IfNotPresent"
    } else {
        "Always"
    }
}

async fn ensure_image(
    images: &dyn ImageService,
    c: &Container,
    sandbox: &cri::PodSandboxConfig,
) -> std::result::Result<String, (String, String)> {
    let image = c.image.clone().unwrap_or_default();
    let spec = cri::ImageSpec {
        image: image.clone(),
        ..Default::default()
    };
    let policy = pull_policy(c);
    if policy != "Always" {
        let present = images
            .image_status(cri::ImageStatusRequest {
                image: Some(spec.clone()),
                verbose: false,
            })
            .await
            .map_err(|e| ("ErrImageInspect".to_string(), e.to_string()))?;
        if let Some(img) = present.image {
            return Ok(img.id);
        }
        if policy == "Never" {
            return Err((
                "ErrImageNeverPull".into(),
                format!("image {image:?} is not present with pull policy of Never"),
            ));
        }
    }
    images
        .pull_image(cri::PullImageRequest {
            image: Some(spec),
            auth: None,
            sandbox_config: Some(sandbox.clone()),
        })
        .await
        .map(|r| r.image_ref)
        .map_err(|e| ("ErrImagePull".to_string(), e.to_string()))
}

/// Carries out `actions` (computed from `snapshot`) for `pod`.
/// Stops every running or created container of the pod, giving each `grace_secs`, then its
/// sandboxes. Returns what failed; a failure does not stop the rest.
pub async fn kill_pod(
    rt: &dyn RuntimeService,
    status: &RuntimePodStatus,
    grace_secs: i64,
) -> Vec<String> {
    let mut errors = Vec::new();
    for c in status
        .containers
        .iter()
        .filter(|c| matches!(c.state, RunState::Running | RunState::Created))
    {
        let req = cri::StopContainerRequest {
            container_id: c.id.clone(),
            timeout: grace_secs,
        };
        if let Err(e) = rt.stop_container(req).await {
            errors.push(format!("stopping container {}: {e}", c.name));
        }
    }
    for sb in &status.sandboxes {
        let req = cri::StopPodSandboxRequest {
            pod_sandbox_id: sb.id.clone(),
        };
        if let Err(e) = rt.stop_pod_sandbox(req).await {
            errors.push(format!("stopping sandbox {}: {e}", sb.id));
        }
    }
    errors
}

// Every argument is a distinct input of one sync step; bundling them would only rename them.
#[allow(clippy::too_many_arguments)]
pub async fn sync_pod(
    rt: &dyn RuntimeService,
    images: &dyn ImageService,
    pod: &Pod,
    snapshot: &RuntimeSnapshot,
    actions: &PodActions,
    backoff: &mut Backoff,
    opts: &ContainerOptions,
    now: SystemTime,
) -> Result<SyncResult> {
    let spec = pod_spec(pod)?;
    let uid = pod_identity(pod).0.to_string();
    let grace = spec.termination_grace_period_seconds.unwrap_or(30);
    let mut res = SyncResult::default();
    let stop = |id: String| {
        rt.stop_container(cri::StopContainerRequest {
            container_id: id,
            timeout: grace,
        })
    };

    if actions.kill_pod {
        res.errors
            .extend(kill_pod(rt, &snapshot.status, grace).await);
    }
    for (id, reason) in &actions.kill_containers {
        if let Err(e) = stop(id.clone()).await {
            res.errors
                .push(format!("stopping container {id} ({reason}): {e}"));
        }
    }

    let mut sb_opts: SandboxOptions = opts.sandbox.clone();
    let mut opts = opts.clone();
    let sandbox_id = if actions.create_sandbox {
        sb_opts.attempt = actions.sandbox_attempt;
        let config = sandbox_config(pod, &sb_opts)?;
        let id = rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await?
            .pod_sandbox_id;
        let st = rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: id.clone(),
                verbose: false,
            })
            .await?;
        if let Some(net) = st
            .status
            .and_then(|s| s.network)
            .filter(|n| !n.ip.is_empty())
        {
            opts.pod_ips = std::iter::once(net.ip)
                .chain(net.additional_ips.into_iter().map(|p| p.ip))
                .collect();
        }
        id
    } else if let Some(id) = &actions.sandbox_id {
        let current = snapshot.status.sandboxes.iter().find(|s| &s.id == id);
        sb_opts.attempt = current.map_or(0, |s| s.attempt);
        if let Some(ip) = current.map(|s| s.ip.clone()).filter(|ip| !ip.is_empty()) {
            opts.pod_ips = vec![ip];
        }
        id.clone()
    } else {
        return Ok(res);
    };
    res.sandbox_id = Some(sandbox_id.clone());
    let sandbox = sandbox_config(pod, &sb_opts)?;

    let names = actions
        .start_init
        .iter()
        .chain(actions.start_containers.iter());
    for name in names {
        let container = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .find(|c| &c.name == name)
            .ok_or_else(|| {
                Error::invalid_argument(format!("container {name:?} is not in the pod spec"))
            })?;
        let previous = snapshot.status.latest(name);
        let restart_count = previous.map_or(0, |p| p.attempt + 1);
        let image_ref = match ensure_image(images, container, &sandbox).await {
            Ok(r) => r,
            Err(w) => {
                res.waiting.insert(name.clone(), w);
                continue;
            }
        };
        let mut config = match container_config(pod, container, restart_count, &opts) {
            Ok(c) => c,
            Err(e) => {
                res.waiting.insert(
                    name.clone(),
                    ("CreateContainerConfigError".into(), e.to_string()),
                );
                continue;
            }
        };
        if let Some(img) = config.image.as_mut().filter(|_| !image_ref.is_empty()) {
            img.image = image_ref;
        }
        if previous.is_some_and(|p| p.state == RunState::Exited) {
            backoff.record_restart(&backoff::key(&uid, name), now);
        }
        let created = rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.clone(),
                config: Some(config),
                sandbox_config: Some(sandbox.clone()),
            })
            .await;
        let id = match created {
            Ok(r) => r.container_id,
            Err(e) => {
                res.waiting
                    .insert(name.clone(), ("CreateContainerError".into(), e.to_string()));
                continue;
            }
        };
        match rt
            .start_container(cri::StartContainerRequest { container_id: id })
            .await
        {
            Ok(_) => res.started.push(name.clone()),
            Err(e) => {
                res.waiting
                    .insert(name.clone(), ("RunContainerError".into(), e.to_string()));
            }
        }
    }
    Ok(res)
}

#[cfg(test)]
#[path = "sync_tests.rs"]
mod tests;
