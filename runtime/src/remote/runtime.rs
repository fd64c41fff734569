//! [`RuntimeService`] for [`RemoteRuntime`]: each method is the same RPC on the runtime's
//! `runtime.v1.RuntimeService`, under the deadline described on [`super::RemoteConfig`].

use futures::StreamExt;

use super::{RemoteRuntime, status_error, unary};
use crate::{EventStream, Result, RuntimeService, cri};

/// Implements the trait: one line per unary RPC (`method => CriName(Request -> Response)`,
/// optionally `+ field` to extend the deadline by a request's timeout in seconds), then the
/// hand-written methods.
macro_rules! remote_rpcs {
    (
        $( $method:ident => $rpc:ident($req:ident -> $resp:ident) $(+ $grace:ident)?; )*
        { $($extra:tt)* }
    ) => {
        #[async_trait::async_trait]
        impl RuntimeService for RemoteRuntime {
            $(
                async fn $method(&self, req: cri::$req) -> Result<cri::$resp> {
                    let deadline = self.deadline(0 $(+ req.$grace)?);
                    let req = self.request(stringify!($rpc), req, deadline)?;
                    unary(stringify!($rpc), deadline, self.runtime.clone().$method(req)).await
                }
            )*
            $($extra)*
        }
    };
}

remote_rpcs! {
    version => Version(VersionRequest -> VersionResponse);
    run_pod_sandbox => RunPodSandbox(RunPodSandboxRequest -> RunPodSandboxResponse);
    stop_pod_sandbox => StopPodSandbox(StopPodSandboxRequest -> StopPodSandboxResponse);
    remove_pod_sandbox => RemovePodSandbox(RemovePodSandboxRequest -> RemovePodSandboxResponse);
    pod_sandbox_status => PodSandboxStatus(PodSandboxStatusRequest -> PodSandboxStatusResponse);
    list_pod_sandbox => ListPodSandbox(ListPodSandboxRequest -> ListPodSandboxResponse);
    create_container => CreateContainer(CreateContainerRequest -> CreateContainerResponse);
    start_container => StartContainer(StartContainerRequest -> StartContainerResponse);
    stop_container => StopContainer(StopContainerRequest -> StopContainerResponse) + timeout;
    remove_container => RemoveContainer(RemoveContainerRequest -> RemoveContainerResponse);
    list_containers => ListContainers(ListContainersRequest -> ListContainersResponse);
    container_status => ContainerStatus(ContainerStatusRequest -> ContainerStatusResponse);
    update_container_resources => UpdateContainerResources(
        UpdateContainerResourcesRequest -> UpdateContainerResourcesResponse);
    reopen_container_log => ReopenContainerLog(
        ReopenContainerLogRequest -> ReopenContainerLogResponse);
    exec => Exec(ExecRequest -> ExecResponse);
    attach => Attach(AttachRequest -> AttachResponse);
    port_forward => PortForward(PortForwardRequest -> PortForwardResponse);
    container_stats => ContainerStats(ContainerStatsRequest -> ContainerStatsResponse);
    list_container_stats => ListContainerStats(
        ListContainerStatsRequest -> ListContainerStatsResponse);
    pod_sandbox_stats => PodSandboxStats(PodSandboxStatsRequest -> PodSandboxStatsResponse);
    list_pod_sandbox_stats => ListPodSandboxStats(
        ListPodSandboxStatsRequest -> ListPodSandboxStatsResponse);
    update_runtime_config => UpdateRuntimeConfig(
        UpdateRuntimeConfigRequest -> UpdateRuntimeConfigResponse);
    status => Status(StatusRequest -> StatusResponse);
    checkpoint_container => CheckpointContainer(
        CheckpointContainerRequest -> CheckpointContainerResponse) + timeout;
    list_metric_descriptors => ListMetricDescriptors(
        ListMetricDescriptorsRequest -> ListMetricDescriptorsResponse);
    list_pod_sandbox_metrics => ListPodSandboxMetrics(
        ListPodSandboxMetricsRequest -> ListPodSandboxMetricsResponse);
    runtime_config => RuntimeConfig(RuntimeConfigRequest -> RuntimeConfigResponse);
    {
        /// No deadline when the command has none (`timeout` 0), else the request timeout on
        /// top of the command's.
        async fn exec_sync(&self, req: cri::ExecSyncRequest) -> Result<cri::ExecSyncResponse> {
            let deadline = if req.timeout > 0 { self.deadline(req.timeout) } else { None };
            let req = self.request("ExecSync", req, deadline)?;
            unary("ExecSync", deadline, self.runtime.clone().exec_sync(req)).await
        }

        /// The runtime's event stream; opening it is bounded by the request timeout, the
        /// stream itself is not. It ends when the runtime ends it or the connection is lost
        /// (with an `Unavailable` or the runtime's status as its last item).
        async fn get_container_events(&self, req: cri::GetEventsRequest) -> Result<EventStream> {
            let rpc = "GetContainerEvents";
            let req = self.request(rpc, req, None)?;
            let mut client = self.runtime.clone();
            let stream = unary(rpc, self.deadline(0), client.get_container_events(req)).await?;
            Ok(stream.map(|item| item.map_err(|s| status_error(rpc, None, s))).boxed())
        }
    }
}
