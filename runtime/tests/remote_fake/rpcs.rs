//! Every RPC of both CRI services by name, callable with a default (or id-only) request, so
//! the tests can go over all of them.

use runtime::{ImageService, Result, RuntimeService, cri};

/// The CRI names of every RPC of `RuntimeService` and `ImageService`.
pub const ALL_RPCS: [&str; 34] = [
    "Version",
    "RunPodSandbox",
    "StopPodSandbox",
    "RemovePodSandbox",
    "PodSandboxStatus",
    "ListPodSandbox",
    "CreateContainer",
    "StartContainer",
    "StopContainer",
    "RemoveContainer",
    "ListContainers",
    "ContainerStatus",
    "UpdateContainerResources",
    "ReopenContainerLog",
    "ExecSync",
    "Exec",
    "Attach",
    "PortForward",
    "ContainerStats",
    "ListContainerStats",
    "PodSandboxStats",
    "ListPodSandboxStats",
    "UpdateRuntimeConfig",
    "Status",
    "CheckpointContainer",
    "GetContainerEvents",
    "ListMetricDescriptors",
    "ListPodSandboxMetrics",
    "RuntimeConfig",
    "ListImages",
    "ImageStatus",
    "PullImage",
    "RemoveImage",
    "ImageFsInfo",
];

/// Calls `rpc` with a default request.
pub async fn call<R: RuntimeService + ImageService>(rt: &R, rpc: &str) -> Result<()> {
    call_with_id(rt, rpc, "").await
}

/// Calls `rpc` with a default request whose container or sandbox id is `id`.
pub async fn call_with_id<R: RuntimeService + ImageService>(
    rt: &R,
    rpc: &str,
    id: &str,
) -> Result<()> {
    let c = id.to_string();
    let s = id.to_string();
    match rpc {
        "Version" => rt.version(Default::default()).await.map(drop),
        "RunPodSandbox" => rt.run_pod_sandbox(Default::default()).await.map(drop),
        "StopPodSandbox" => rt
            .stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: s })
            .await
            .map(drop),
        "RemovePodSandbox" => rt
            .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: s })
            .await
            .map(drop),
        "PodSandboxStatus" => rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: s,
                verbose: false,
            })
            .await
            .map(drop),
        "ListPodSandbox" => rt.list_pod_sandbox(Default::default()).await.map(drop),
        "CreateContainer" => rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: s,
                ..Default::default()
            })
            .await
            .map(drop),
        "StartContainer" => rt
            .start_container(cri::StartContainerRequest { container_id: c })
            .await
            .map(drop),
        "StopContainer" => rt
            .stop_container(cri::StopContainerRequest {
                container_id: c,
                timeout: 0,
            })
            .await
            .map(drop),
        "RemoveContainer" => rt
            .remove_container(cri::RemoveContainerRequest { container_id: c })
            .await
            .map(drop),
        "ListContainers" => rt.list_containers(Default::default()).await.map(drop),
        "ContainerStatus" => rt
            .container_status(cri::ContainerStatusRequest {
                container_id: c,
                verbose: false,
            })
            .await
            .map(drop),
        "UpdateContainerResources" => rt
            .update_container_resources(cri::UpdateContainerResourcesRequest {
                container_id: c,
                ..Default::default()
            })
            .await
            .map(drop),
        "ReopenContainerLog" => rt
            .reopen_container_log(cri::ReopenContainerLogRequest { container_id: c })
            .await
            .map(drop),
        "ExecSync" => rt
            .exec_sync(cri::ExecSyncRequest {
                container_id: c,
                cmd: vec!["true".into()],
                timeout: 1,
            })
            .await
            .map(drop),
        "Exec" => rt
            .exec(cri::ExecRequest {
                container_id: c,
                ..Default::default()
            })
            .await
            .map(drop),
        "Attach" => rt
            .attach(cri::AttachRequest {
                container_id: c,
                ..Default::default()
            })
            .await
            .map(drop),
        "PortForward" => rt
            .port_forward(cri::PortForwardRequest {
                pod_sandbox_id: s,
                port: vec![],
            })
            .await
            .map(drop),
        "ContainerStats" => rt
            .container_stats(cri::ContainerStatsRequest { container_id: c })
            .await
            .map(drop),
        "ListContainerStats" => rt.list_container_stats(Default::default()).await.map(drop),
        "PodSandboxStats" => rt
            .pod_sandbox_stats(cri::PodSandboxStatsRequest { pod_sandbox_id: s })
            .await
            .map(drop),
        "ListPodSandboxStats" => rt
            .list_pod_sandbox_stats(Default::default())
            .await
            .map(drop),
        "UpdateRuntimeConfig" => rt.update_runtime_config(Default::default()).await.map(drop),
        "Status" => rt.status(Default::default()).await.map(drop),
        "CheckpointContainer" => rt
            .checkpoint_container(cri::CheckpointContainerRequest {
                container_id: c,
                ..Default::default()
            })
            .await
            .map(drop),
        "GetContainerEvents" => rt.get_container_events(Default::default()).await.map(drop),
        "ListMetricDescriptors" => rt
            .list_metric_descriptors(Default::default())
            .await
            .map(drop),
        "ListPodSandboxMetrics" => rt
            .list_pod_sandbox_metrics(Default::default())
            .await
            .map(drop),
        "RuntimeConfig" => rt.runtime_config(Default::default()).await.map(drop),
        "ListImages" => rt.list_images(Default::default()).await.map(drop),
        "ImageStatus" => rt.image_status(Default::default()).await.map(drop),
        "PullImage" => rt.pull_image(Default::default()).await.map(drop),
        "RemoveImage" => rt.remove_image(Default::default()).await.map(drop),
        "ImageFsInfo" => rt.image_fs_info(Default::default()).await.map(drop),
        other => panic!("unknown RPC {other}"),
    }
}
