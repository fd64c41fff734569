//! Tests of [`FakeRuntime`] through the CRI traits.

mod lifecycle;
mod queries;

use super::*;
use crate::cri::{ContainerState as CS, PodSandboxState as PS};
use crate::{Code, ImageService, RuntimeService};

pub(super) fn sandbox_config(name: &str, labels: &[(&str, &str)]) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.to_string(),
            uid: format!("uid-{name}"),
            namespace: "default".to_string(),
            attempt: 0,
        }),
        log_directory: format!("/var/log/pods/default_{name}"),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

pub(super) fn container_config(name: &str, labels: &[(&str, &str)]) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: "busybox".to_string(),
            ..Default::default()
        }),
        log_path: format!("{name}/0.log"),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    }
}

pub(super) async fn run_sandbox(rt: &FakeRuntime, name: &str, labels: &[(&str, &str)]) -> String {
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(sandbox_config(name, labels)),
        runtime_handler: String::new(),
    })
    .await
    .expect("run sandbox")
    .pod_sandbox_id
}

pub(super) async fn create(
    rt: &FakeRuntime,
    sandbox: &str,
    name: &str,
    labels: &[(&str, &str)],
) -> String {
    rt.create_container(cri::CreateContainerRequest {
        pod_sandbox_id: sandbox.to_string(),
        config: Some(container_config(name, labels)),
        sandbox_config: Some(sandbox_config("ignored", &[])),
    })
    .await
    .expect("create container")
    .container_id
}

pub(super) async fn start(rt: &FakeRuntime, id: &str) -> Result<cri::StartContainerResponse> {
    rt.start_container(cri::StartContainerRequest {
        container_id: id.to_string(),
    })
    .await
}

pub(super) async fn status(rt: &FakeRuntime, id: &str) -> Result<cri::ContainerStatus> {
    let resp = rt
        .container_status(cri::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: false,
        })
        .await?;
    resp.status.ok_or_else(|| Error::internal("no status"))
}

pub(super) async fn list(rt: &FakeRuntime, filter: cri::ContainerFilter) -> Vec<String> {
    rt.list_containers(cri::ListContainersRequest {
        filter: Some(filter),
    })
    .await
    .expect("list containers")
    .containers
    .into_iter()
    .map(|c| c.id)
    .collect()
}

pub(super) async fn list_sandboxes(rt: &FakeRuntime, filter: cri::PodSandboxFilter) -> Vec<String> {
    rt.list_pod_sandbox(cri::ListPodSandboxRequest {
        filter: Some(filter),
    })
    .await
    .expect("list sandboxes")
    .items
    .into_iter()
    .map(|s| s.id)
    .collect()
}

pub(super) fn is_hex_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}
