//! The CRI method list, written once: [`for_each_cri_rpc!`] hands every RPC of the CRI v1
//! `RuntimeService` and `ImageService` to a macro of its caller, which turns the list into an
//! implementation. The remote client (`remote/service.rs`), the gRPC server adapter
//! (`server/adapter.rs`) and the instrumentation ([`crate::instrument`]) are expanded from it,
//! so a unary RPC added here is sent, served and observed with no other edit. Written out by
//! hand stay the traits in [`crate::service`], which carry the contract, and the
//! implementations with real bodies (the built-in runtime, the fake).

/// Calls `$callback! { { ... } RuntimeService { ... } ImageService { ... } }` with every CRI
/// RPC, each once.
///
/// # Use
///
/// `for_each_cri_rpc!(callback)` or `for_each_cri_rpc!(callback { tokens })`: the callback, a
/// `macro_rules!` defined before the call, receives first the `{ tokens }` (empty when none
/// were given; the server adapter and the remote client pass their hand-written methods this
/// way, since an `#[async_trait]` impl must be written by one expansion), then the two
/// services:
///
/// ```text
/// { tokens }
/// RuntimeService {
///     unary { ENTRY within DEADLINE; ... }
///     by_hand { ENTRY; ... }
///     streaming { ENTRY; ... }
/// }
/// ImageService {
///     unary { ENTRY within DEADLINE; ... }
/// }
/// ```
///
/// # An entry
///
/// `method => Rpc(Request -> Response) as "operation"`, where
///
/// * `method` is the Rust method: the same name in [`RuntimeService`] / [`ImageService`], in
///   the generated tonic client (`RuntimeServiceClient`, `ImageServiceClient`) and in the
///   generated server traits;
/// * `Rpc` is the CRI RPC's name (`runtime.v1.RuntimeService/Rpc`), used in errors and logs;
/// * `Request` and `Response` name the request and response messages in [`crate::cri`]; for
///   a `streaming` entry `Response` is the type of one item of the stream ([`EventStream`] in
///   the trait);
/// * `"operation"` is the `operation_type` label upstream's instrumented runtime records the
///   call under (`kubelet_runtime_operations_total{operation_type="run_podsandbox"}`): not
///   derived from `method`, because upstream's names are not (`run_podsandbox`,
///   `update_container`).
///
/// # The sections
///
/// * `unary`: one request, one response, the same code for every RPC: the remote client sends
///   it, the server adapter calls the trait, both under the entry's deadline. `within base`
///   names the field of the caller's config (`remote::RemoteConfig`, `server::ServerConfig`:
///   both have `request_timeout` and `pull_image_timeout`) that bounds the call, and `within
///   base + field` adds the request's own `field`, in seconds, on top (`StopContainer`'s grace
///   period, `CheckpointContainer`'s timeout), so that neither side cuts short what the
///   caller allowed. `rpcs::deadline` computes it.
/// * `by_hand`: unary, but the remote client and the server adapter write it by hand (with
///   their `{ tokens }`): `ExecSync`, whose deadline is none when the command has none.
/// * `streaming`: server-streaming, written by hand there too: `GetContainerEvents`.
///
/// The instrumentation forwards every entry of every section.
///
/// [`RuntimeService`]: crate::RuntimeService
/// [`ImageService`]: crate::ImageService
/// [`EventStream`]: crate::EventStream
macro_rules! for_each_cri_rpc {
    ($callback:ident) => {
        $crate::rpcs::for_each_cri_rpc! { $callback {} }
    };
    ($callback:ident { $($tokens:tt)* }) => {
        $callback! {
            { $($tokens)* }
            RuntimeService {
                unary {
                    version => Version(VersionRequest -> VersionResponse)
                        as "version" within request_timeout;
                    run_pod_sandbox => RunPodSandbox(RunPodSandboxRequest -> RunPodSandboxResponse)
                        as "run_podsandbox" within request_timeout;
                    stop_pod_sandbox => StopPodSandbox(
                        StopPodSandboxRequest -> StopPodSandboxResponse)
                        as "stop_podsandbox" within request_timeout;
                    remove_pod_sandbox => RemovePodSandbox(
                        RemovePodSandboxRequest -> RemovePodSandboxResponse)
                        as "remove_podsandbox" within request_timeout;
                    pod_sandbox_status => PodSandboxStatus(
                        PodSandboxStatusRequest -> PodSandboxStatusResponse)
                        as "podsandbox_status" within request_timeout;
                    list_pod_sandbox => ListPodSandbox(
                        ListPodSandboxRequest -> ListPodSandboxResponse)
                        as "list_podsandbox" within request_timeout;
                    create_container => CreateContainer(
                        CreateContainerRequest -> CreateContainerResponse)
                        as "create_container" within request_timeout;
                    start_container => StartContainer(
                        StartContainerRequest -> StartContainerResponse)
                        as "start_container" within request_timeout;
                    stop_container => StopContainer(StopContainerRequest -> StopContainerResponse)
                        as "stop_container" within request_timeout + timeout;
                    remove_container => RemoveContainer(
                        RemoveContainerRequest -> RemoveContainerResponse)
                        as "remove_container" within request_timeout;
                    list_containers => ListContainers(
                        ListContainersRequest -> ListContainersResponse)
                        as "list_containers" within request_timeout;
                    container_status => ContainerStatus(
                        ContainerStatusRequest -> ContainerStatusResponse)
                        as "container_status" within request_timeout;
                    update_container_resources => UpdateContainerResources(
                        UpdateContainerResourcesRequest -> UpdateContainerResourcesResponse)
                        as "update_container" within request_timeout;
                    reopen_container_log => ReopenContainerLog(
                        ReopenContainerLogRequest -> ReopenContainerLogResponse)
                        as "reopen_container_log" within request_timeout;
                    exec => Exec(ExecRequest -> ExecResponse)
                        as "exec" within request_timeout;
                    attach => Attach(AttachRequest -> AttachResponse)
                        as "attach" within request_timeout;
                    port_forward => PortForward(PortForwardRequest -> PortForwardResponse)
                        as "port_forward" within request_timeout;
                    container_stats => ContainerStats(
                        ContainerStatsRequest -> ContainerStatsResponse)
                        as "container_stats" within request_timeout;
                    list_container_stats => ListContainerStats(
                        ListContainerStatsRequest -> ListContainerStatsResponse)
                        as "list_container_stats" within request_timeout;
                    pod_sandbox_stats => PodSandboxStats(
                        PodSandboxStatsRequest -> PodSandboxStatsResponse)
                        as "podsandbox_stats" within request_timeout;
                    list_pod_sandbox_stats => ListPodSandboxStats(
                        ListPodSandboxStatsRequest -> ListPodSandboxStatsResponse)
                        as "list_podsandbox_stats" within request_timeout;
                    update_runtime_config => UpdateRuntimeConfig(
                        UpdateRuntimeConfigRequest -> UpdateRuntimeConfigResponse)
                        as "update_runtime_config" within request_timeout;
                    status => Status(StatusRequest -> StatusResponse)
                        as "status" within request_timeout;
                    checkpoint_container => CheckpointContainer(
                        CheckpointContainerRequest -> CheckpointContainerResponse)
                        as "checkpoint_container" within request_timeout + timeout;
                    list_metric_descriptors => ListMetricDescriptors(
                        ListMetricDescriptorsRequest -> ListMetricDescriptorsResponse)
                        as "list_metric_descriptors" within request_timeout;
                    list_pod_sandbox_metrics => ListPodSandboxMetrics(
                        ListPodSandboxMetricsRequest -> ListPodSandboxMetricsResponse)
                        as "list_podsandbox_metrics" within request_timeout;
                    runtime_config => RuntimeConfig(RuntimeConfigRequest -> RuntimeConfigResponse)
                        as "runtime_config" within request_timeout;
                }
                by_hand {
                    exec_sync => ExecSync(ExecSyncRequest -> ExecSyncResponse) as "exec_sync";
                }
                streaming {
                    get_container_events => GetContainerEvents(
                        GetEventsRequest -> ContainerEventResponse)
                        as "get_container_events";
                }
            }
            ImageService {
                unary {
                    list_images => ListImages(ListImagesRequest -> ListImagesResponse)
                        as "list_images" within request_timeout;
                    image_status => ImageStatus(ImageStatusRequest -> ImageStatusResponse)
                        as "image_status" within request_timeout;
                    pull_image => PullImage(PullImageRequest -> PullImageResponse)
                        as "pull_image" within pull_image_timeout;
                    remove_image => RemoveImage(RemoveImageRequest -> RemoveImageResponse)
                        as "remove_image" within request_timeout;
                    image_fs_info => ImageFsInfo(ImageFsInfoRequest -> ImageFsInfoResponse)
                        as "image_fs_info" within request_timeout;
                }
            }
        }
    };
}

pub(crate) use for_each_cri_rpc;

/// The deadline of a `unary` entry `within base + field`: `base` plus the request's `secs`
/// (`base` alone for a negative count), so that neither side cuts short what the caller
/// allowed. Also `ExecSync`'s, when its command has a timeout.
#[cfg(any(feature = "server", feature = "remote"))]
pub(crate) fn deadline(base: std::time::Duration, secs: i64) -> std::time::Duration {
    base.saturating_add(std::time::Duration::from_secs(
        u64::try_from(secs).unwrap_or(0),
    ))
}

#[cfg(all(test, any(feature = "server", feature = "remote")))]
mod tests {
    use std::time::Duration;

    use super::deadline;

    #[test]
    fn a_requests_timeout_extends_the_deadline() {
        let base = Duration::from_secs(120);
        assert_eq!(deadline(base, 0), base);
        assert_eq!(deadline(base, 30), Duration::from_secs(150));
        assert_eq!(deadline(base, -5), base);
        assert_eq!(
            deadline(base, i64::MAX),
            Duration::from_secs(120 + i64::MAX as u64)
        );
    }
}
