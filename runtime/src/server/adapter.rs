//! The tonic service implementations behind the CRI server: each generated CRI v1 gRPC method
//! calls the same method of an `Arc<dyn RuntimeService>` / `Arc<dyn ImageService>` under a
//! deadline, and turns a `runtime::Error` into a `tonic::Status` (same code, same message). A
//! runtime that panics gives `Internal` for that call, never a dead connection or server.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::ServerConfig;
use crate::cri::image_service_server::ImageService as GrpcImageService;
use crate::cri::runtime_service_server::RuntimeService as GrpcRuntimeService;
use crate::{ImageService, Result, RuntimeService, cri};

/// Serves `runtime.v1.RuntimeService` from a [`RuntimeService`].
pub(super) struct RuntimeAdapter {
    pub(super) inner: Arc<dyn RuntimeService>,
    pub(super) cfg: Arc<ServerConfig>,
    /// Turns true when the server stops; event streams end then, so that the graceful
    /// shutdown does not wait for them forever.
    pub(super) stopping: watch::Receiver<bool>,
}

/// Serves `runtime.v1.ImageService` from an [`ImageService`].
pub(super) struct ImageAdapter {
    pub(super) inner: Arc<dyn ImageService>,
    pub(super) cfg: Arc<ServerConfig>,
}

/// Runs one RPC of the runtime: `Ok` becomes the response, an `Err` its status, a panic
/// `Internal` and running past `deadline` `DeadlineExceeded` (the runtime's future is dropped,
/// which the trait contract allows).
pub(super) async fn call<T>(
    rpc: &'static str,
    deadline: Duration,
    fut: impl Future<Output = Result<T>> + Send,
) -> std::result::Result<Response<T>, Status> {
    match tokio::time::timeout(deadline, AssertUnwindSafe(fut).catch_unwind()).await {
        Ok(Ok(Ok(resp))) => Ok(Response::new(resp)),
        Ok(Ok(Err(err))) => {
            tracing::debug!(rpc, "CRI call failed: {err}");
            Err(err.into())
        }
        Ok(Err(_panic)) => {
            tracing::error!(rpc, "the runtime panicked serving a CRI call");
            Err(Status::internal(format!("{rpc}: the runtime panicked")))
        }
        Err(_elapsed) => {
            tracing::warn!(rpc, ?deadline, "CRI call ran past its deadline");
            Err(Status::deadline_exceeded(format!(
                "{rpc} did not complete within {deadline:?}"
            )))
        }
    }
}

/// `base` plus a request's own timeout in seconds (`StopContainer`'s grace period,
/// `ExecSync`'s command timeout), so the server never cuts short what the caller allowed.
pub(super) fn extended(base: Duration, secs: i64) -> Duration {
    base.saturating_add(Duration::from_secs(u64::try_from(secs).unwrap_or(0)))
}

/// ExecSync's deadline: none (`Duration::MAX`, which `tokio::time::timeout` treats as no
/// timer) for a command without a timeout, else [`extended`].
pub(super) fn exec_sync_deadline(base: Duration, timeout: i64) -> Duration {
    if timeout > 0 {
        extended(base, timeout)
    } else {
        Duration::MAX
    }
}

/// The events stream as sent to the client.
type Events =
    Pin<Box<dyn Stream<Item = std::result::Result<cri::ContainerEventResponse, Status>> + Send>>;

/// Implements the generated trait: one line per unary RPC (`method => CriName(Request ->
/// Response)`, optionally `+ field` to extend the deadline by a request's timeout in
/// seconds), then the hand-written items.
macro_rules! runtime_rpcs {
    (
        $( $method:ident => $rpc:ident($req:ident -> $resp:ident) $(+ $grace:ident)?; )*
        { $($extra:tt)* }
    ) => {
        #[tonic::async_trait]
        impl GrpcRuntimeService for RuntimeAdapter {
            $(
                async fn $method(
                    &self,
                    request: Request<cri::$req>,
                ) -> std::result::Result<Response<cri::$resp>, Status> {
                    let req = request.into_inner();
                    let deadline = extended(self.cfg.request_timeout, 0 $(+ req.$grace)?);
                    call(stringify!($rpc), deadline, self.inner.$method(req)).await
                }
            )*
            $($extra)*
        }
    };
}

runtime_rpcs! {
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
        type GetContainerEventsStream = Events;

        /// A command without a timeout runs until it ends, as CRI says; one with a timeout
        /// gets the request timeout on top of its own.
        async fn exec_sync(
            &self,
            request: Request<cri::ExecSyncRequest>,
        ) -> std::result::Result<Response<cri::ExecSyncResponse>, Status> {
            let req = request.into_inner();
            let deadline = exec_sync_deadline(self.cfg.request_timeout, req.timeout);
            call("ExecSync", deadline, self.inner.exec_sync(req)).await
        }

        /// The runtime's stream, passed through: an `Err` item becomes the stream's final
        /// status. The deadline covers opening the stream only; the stream itself lasts until
        /// the client goes away, the runtime ends it, or the server stops.
        async fn get_container_events(
            &self,
            request: Request<cri::GetEventsRequest>,
        ) -> std::result::Result<Response<Events>, Status> {
            let events = call(
                "GetContainerEvents",
                self.cfg.request_timeout,
                self.inner.get_container_events(request.into_inner()),
            )
            .await?
            .into_inner();
            let mut stopping = self.stopping.clone();
            let stopped = async move {
                // An error means the server is gone: stop as well.
                let _ = stopping.wait_for(|stop| *stop).await;
            };
            let stream = AssertUnwindSafe(events)
                .catch_unwind()
                .map(|item| match item {
                    Ok(event) => event.map_err(Status::from),
                    Err(_panic) => {
                        tracing::error!("the runtime's event stream panicked");
                        Err(Status::internal("GetContainerEvents: the runtime panicked"))
                    }
                })
                .take_until(stopped);
            Ok(Response::new(Box::pin(stream)))
        }
    }
}

#[tonic::async_trait]
impl GrpcImageService for ImageAdapter {
    async fn list_images(
        &self,
        request: Request<cri::ListImagesRequest>,
    ) -> std::result::Result<Response<cri::ListImagesResponse>, Status> {
        let req = request.into_inner();
        call(
            "ListImages",
            self.cfg.request_timeout,
            self.inner.list_images(req),
        )
        .await
    }

    async fn image_status(
        &self,
        request: Request<cri::ImageStatusRequest>,
    ) -> std::result::Result<Response<cri::ImageStatusResponse>, Status> {
        let req = request.into_inner();
        call(
            "ImageStatus",
            self.cfg.request_timeout,
            self.inner.image_status(req),
        )
        .await
    }

    async fn pull_image(
        &self,
        request: Request<cri::PullImageRequest>,
    ) -> std::result::Result<Response<cri::PullImageResponse>, Status> {
        let req = request.into_inner();
        call(
            "PullImage",
            self.cfg.pull_image_timeout,
            self.inner.pull_image(req),
        )
        .await
    }

    async fn remove_image(
        &self,
        request: Request<cri::RemoveImageRequest>,
    ) -> std::result::Result<Response<cri::RemoveImageResponse>, Status> {
        let req = request.into_inner();
        call(
            "RemoveImage",
            self.cfg.request_timeout,
            self.inner.remove_image(req),
        )
        .await
    }

    async fn image_fs_info(
        &self,
        request: Request<cri::ImageFsInfoRequest>,
    ) -> std::result::Result<Response<cri::ImageFsInfoResponse>, Status> {
        let req = request.into_inner();
        call(
            "ImageFsInfo",
            self.cfg.request_timeout,
            self.inner.image_fs_info(req),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

    #[tokio::test]
    async fn call_maps_results_errors_panics_and_deadlines() {
        let ok = call("T", Duration::from_secs(1), async { Ok(7) }).await;
        assert_eq!(ok.unwrap().into_inner(), 7);

        let err = call("T", Duration::from_secs(1), async {
            Err::<(), _>(Error::not_found("container \"x\""))
        })
        .await
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound);
        assert_eq!(err.message(), "container \"x\"");

        let panicked = call("Boom", Duration::from_secs(1), async {
            if std::hint::black_box(true) {
                panic!("runtime bug");
            }
            Ok(())
        })
        .await
        .unwrap_err();
        assert_eq!(panicked.code(), tonic::Code::Internal);
        assert!(panicked.message().contains("Boom"), "{panicked:?}");

        let slow = call("Slow", Duration::from_millis(50), async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(())
        })
        .await
        .unwrap_err();
        assert_eq!(slow.code(), tonic::Code::DeadlineExceeded);
        assert!(slow.message().contains("Slow"), "{slow:?}");
    }

    #[tokio::test]
    async fn exec_sync_without_a_timeout_has_no_deadline() {
        let base = Duration::from_millis(20);
        assert_eq!(exec_sync_deadline(base, 0), Duration::MAX);
        assert_eq!(exec_sync_deadline(base, -1), Duration::MAX);
        assert_eq!(exec_sync_deadline(base, 2), Duration::from_millis(2020));
        // Longer than the request timeout, and still answered.
        let long = call("ExecSync", exec_sync_deadline(base, 0), async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            Ok(1)
        })
        .await;
        assert_eq!(long.unwrap().into_inner(), 1);
    }

    #[test]
    fn request_timeouts_extend_the_deadline() {
        let base = Duration::from_secs(120);
        assert_eq!(extended(base, 0), base);
        assert_eq!(extended(base, 30), Duration::from_secs(150));
        assert_eq!(extended(base, -5), base);
        assert_eq!(
            extended(base, i64::MAX),
            Duration::from_secs(120 + i64::MAX as u64)
        );
    }
}
