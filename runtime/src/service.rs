//! The runtime seam: CRI v1 as two Rust traits.
//!
//! [`RuntimeService`] and [`ImageService`] have exactly one method per RPC of
//! the CRI v1 `RuntimeService` and `ImageService` gRPC services (as shipped in
//! `k8s-cri` 0.11), named after the RPC in snake_case. Each method takes the
//! CRI request message by value and returns the CRI response message, so an
//! implementation can be exposed as a CRI gRPC server, or backed by a remote
//! CRI runtime, by pure plumbing.
//!
//! # Contract common to all methods
//!
//! * **Thread safety.** Implementations are `Send + Sync`, and every method
//!   may be called concurrently with any other method, including itself on
//!   the same object (e.g. two `stop_container` for one id). Implementations
//!   must serialise internally whatever needs serialising.
//! * **Errors** use [`Error`] codes the way CRI runtimes use gRPC
//!   codes: `NotFound` for unknown ids where the RPC is not idempotent,
//!   `InvalidArgument` for malformed requests (missing config/metadata, empty
//!   ids), `FailedPrecondition` for objects in the wrong state, `Unimplemented`
//!   for unsupported optional RPCs.
//! * **Ids.** Sandbox and container ids are opaque strings chosen by the
//!   runtime; callers must not derive meaning from them.
//! * **Timestamps** in responses are nanoseconds since the Unix epoch.
//! * **Cancellation.** Dropping a returned future may abandon the operation at
//!   an await point; the runtime must stay consistent (the kubelet retries).

use crate::cri;
use crate::error::{Error, Result};

/// The stream returned by [`RuntimeService::get_container_events`].
///
/// It yields one item per container lifecycle event; an `Err` item reports a
/// failure of the event source, after which the stream may end.
pub type EventStream = futures::stream::BoxStream<'static, Result<cri::ContainerEventResponse>>;

/// Pod sandbox and container lifecycle, streaming, stats and runtime status:
/// the CRI v1 `runtime.v1.RuntimeService`.
///
/// See the [module documentation](self) for the contract shared by all
/// methods. The optional RPCs (`checkpoint_container`,
/// `get_container_events`, `list_metric_descriptors`,
/// `list_pod_sandbox_metrics`) have default bodies returning
/// `Unimplemented`; all other methods must be implemented.
#[async_trait::async_trait]
pub trait RuntimeService: Send + Sync {
    /// `Version`: the runtime name, runtime version and the CRI API version it
    /// speaks (`"v1"`). `req.version` is the kubelet's API version. Must not
    /// fail while the runtime is serving.
    async fn version(&self, req: cri::VersionRequest) -> Result<cri::VersionResponse>;

    /// `RunPodSandbox`: creates and starts a pod-level sandbox (namespaces,
    /// network) from `req.config` with the optional `req.runtime_handler`.
    ///
    /// On success the sandbox is in the `SANDBOX_READY` state and the returned
    /// id is usable with every other sandbox call. On failure no sandbox is
    /// left behind. A missing `config` or `config.metadata` is
    /// `InvalidArgument`.
    async fn run_pod_sandbox(
        &self,
        req: cri::RunPodSandboxRequest,
    ) -> Result<cri::RunPodSandboxResponse>;

    /// `StopPodSandbox`: stops every process of the sandbox and reclaims its
    /// network resources (IP addresses). Running containers in the sandbox are
    /// forcibly terminated. The sandbox becomes `SANDBOX_NOTREADY`.
    ///
    /// Idempotent: succeeds if the sandbox is already stopped, and succeeds if
    /// the sandbox does not exist (already removed). The kubelet calls it at
    /// least once before `remove_pod_sandbox` and may call it many times.
    async fn stop_pod_sandbox(
        &self,
        req: cri::StopPodSandboxRequest,
    ) -> Result<cri::StopPodSandboxResponse>;

    /// `RemovePodSandbox`: removes the sandbox; running containers in it are
    /// forcibly terminated, and all its containers are removed.
    ///
    /// Idempotent: succeeds if the sandbox has already been removed or never
    /// existed.
    async fn remove_pod_sandbox(
        &self,
        req: cri::RemovePodSandboxRequest,
    ) -> Result<cri::RemovePodSandboxResponse>;

    /// `PodSandboxStatus`: the status of the sandbox (state, creation time,
    /// network status, labels, annotations). `NotFound` if the sandbox does not
    /// exist. With `req.verbose`, `info` may carry runtime-specific details.
    async fn pod_sandbox_status(
        &self,
        req: cri::PodSandboxStatusRequest,
    ) -> Result<cri::PodSandboxStatusResponse>;

    /// `ListPodSandbox`: the sandboxes matching `req.filter`. Every set field
    /// of the filter must match (`id`, `state`, and every `label_selector`
    /// entry equal to a label); no filter lists every sandbox.
    async fn list_pod_sandbox(
        &self,
        req: cri::ListPodSandboxRequest,
    ) -> Result<cri::ListPodSandboxResponse>;

    /// `CreateContainer`: creates (but does not start) a container in sandbox
    /// `req.pod_sandbox_id` from `req.config`; `req.sandbox_config` is the
    /// config the sandbox was created with.
    ///
    /// On success the container is `CONTAINER_CREATED`. `NotFound` if the
    /// sandbox does not exist; `InvalidArgument` if `config` or
    /// `config.metadata` is missing.
    async fn create_container(
        &self,
        req: cri::CreateContainerRequest,
    ) -> Result<cri::CreateContainerResponse>;

    /// `StartContainer`: starts a `CONTAINER_CREATED` container, which becomes
    /// `CONTAINER_RUNNING`. `NotFound` for an unknown id; an error (typically
    /// `FailedPrecondition`) for a container in any other state.
    async fn start_container(
        &self,
        req: cri::StartContainerRequest,
    ) -> Result<cri::StartContainerResponse>;

    /// `StopContainer`: stops a running container, giving it `req.timeout`
    /// seconds of grace before killing it forcibly. The container becomes
    /// `CONTAINER_EXITED` with its exit code and finish time recorded.
    ///
    /// Idempotent: succeeds if the container is already stopped, and succeeds
    /// if it does not exist.
    async fn stop_container(
        &self,
        req: cri::StopContainerRequest,
    ) -> Result<cri::StopContainerResponse>;

    /// `RemoveContainer`: removes the container, forcibly killing it first if
    /// it is running.
    ///
    /// Idempotent: succeeds if the container has already been removed or
    /// never existed.
    async fn remove_container(
        &self,
        req: cri::RemoveContainerRequest,
    ) -> Result<cri::RemoveContainerResponse>;

    /// `ListContainers`: the containers matching `req.filter`. Every set field
    /// must match (`id`, `state`, `pod_sandbox_id`, every `label_selector`
    /// entry); no filter lists every container.
    async fn list_containers(
        &self,
        req: cri::ListContainersRequest,
    ) -> Result<cri::ListContainersResponse>;

    /// `ContainerStatus`: the status of the container (state, timestamps, exit
    /// code, reason, image, log path, resources). `NotFound` if the container
    /// does not exist.
    async fn container_status(
        &self,
        req: cri::ContainerStatusRequest,
    ) -> Result<cri::ContainerStatusResponse>;

    /// `UpdateContainerResources`: updates the resources of the container
    /// synchronously. If the runtime cannot apply the update
    /// transactionally, it returns an error. `NotFound` for an unknown id.
    async fn update_container_resources(
        &self,
        req: cri::UpdateContainerResourcesRequest,
    ) -> Result<cri::UpdateContainerResourcesResponse>;

    /// `ReopenContainerLog`: asks the runtime to reopen the container's
    /// stdout/stderr log file, typically after the kubelet rotated it. If the
    /// container is not running the runtime may either create a new log file
    /// and succeed, or fail; once it fails it must not create a new log file.
    async fn reopen_container_log(
        &self,
        req: cri::ReopenContainerLogRequest,
    ) -> Result<cri::ReopenContainerLogResponse>;

    /// `ExecSync`: runs `req.cmd` in the container synchronously and returns
    /// its stdout, stderr and exit code. A non-zero exit code of the command is
    /// a successful call; `req.timeout` (seconds, 0 = none) expiring is
    /// `DeadlineExceeded`.
    async fn exec_sync(&self, req: cri::ExecSyncRequest) -> Result<cri::ExecSyncResponse>;

    /// `Exec`: prepares a streaming endpoint to execute a command in the
    /// container and returns its URL.
    async fn exec(&self, req: cri::ExecRequest) -> Result<cri::ExecResponse>;

    /// `Attach`: prepares a streaming endpoint to attach to a running
    /// container and returns its URL.
    async fn attach(&self, req: cri::AttachRequest) -> Result<cri::AttachResponse>;

    /// `PortForward`: prepares a streaming endpoint to forward ports of a pod
    /// sandbox and returns its URL.
    async fn port_forward(&self, req: cri::PortForwardRequest) -> Result<cri::PortForwardResponse>;

    /// `ContainerStats`: resource usage of one container. `NotFound` if the
    /// container does not exist.
    async fn container_stats(
        &self,
        req: cri::ContainerStatsRequest,
    ) -> Result<cri::ContainerStatsResponse>;

    /// `ListContainerStats`: resource usage of the running containers matching
    /// `req.filter` (`id`, `pod_sandbox_id`, `label_selector`).
    async fn list_container_stats(
        &self,
        req: cri::ListContainerStatsRequest,
    ) -> Result<cri::ListContainerStatsResponse>;

    /// `PodSandboxStats`: resource usage of one pod sandbox. `NotFound` if the
    /// sandbox does not exist.
    async fn pod_sandbox_stats(
        &self,
        req: cri::PodSandboxStatsRequest,
    ) -> Result<cri::PodSandboxStatsResponse>;

    /// `ListPodSandboxStats`: resource usage of the sandboxes matching
    /// `req.filter` (`id`, `label_selector`).
    async fn list_pod_sandbox_stats(
        &self,
        req: cri::ListPodSandboxStatsRequest,
    ) -> Result<cri::ListPodSandboxStatsResponse>;

    /// `UpdateRuntimeConfig`: updates the runtime configuration from the
    /// kubelet (currently the node's pod CIDR).
    async fn update_runtime_config(
        &self,
        req: cri::UpdateRuntimeConfigRequest,
    ) -> Result<cri::UpdateRuntimeConfigResponse>;

    /// `Status`: the runtime's conditions. A healthy runtime reports the
    /// `RuntimeReady` and `NetworkReady` conditions with status `true`; the
    /// kubelet marks the node not ready otherwise. With `req.verbose`, `info`
    /// may carry runtime-specific details.
    async fn status(&self, req: cri::StatusRequest) -> Result<cri::StatusResponse>;

    /// `CheckpointContainer` (optional): checkpoints the container to
    /// `req.location`. Defaults to `Unimplemented`.
    async fn checkpoint_container(
        &self,
        req: cri::CheckpointContainerRequest,
    ) -> Result<cri::CheckpointContainerResponse> {
        let _ = req;
        Err(Error::unimplemented("CheckpointContainer is not supported"))
    }

    /// `GetContainerEvents` (optional, server-streaming): a stream of
    /// container lifecycle events (created, started, stopped, deleted), each
    /// with the current sandbox and container statuses. The stream carries
    /// events that happen after the call. Defaults to `Unimplemented`, in
    /// which case the kubelet falls back to polling (generic PLEG).
    async fn get_container_events(&self, req: cri::GetEventsRequest) -> Result<EventStream> {
        let _ = req;
        Err(Error::unimplemented("GetContainerEvents is not supported"))
    }

    /// `ListMetricDescriptors` (optional): descriptors of the metrics returned
    /// by `list_pod_sandbox_metrics`; static for the runtime's lifetime.
    /// Defaults to `Unimplemented`.
    async fn list_metric_descriptors(
        &self,
        req: cri::ListMetricDescriptorsRequest,
    ) -> Result<cri::ListMetricDescriptorsResponse> {
        let _ = req;
        Err(Error::unimplemented(
            "ListMetricDescriptors is not supported",
        ))
    }

    /// `ListPodSandboxMetrics` (optional): pod sandbox metrics as described by
    /// `list_metric_descriptors`. Defaults to `Unimplemented`.
    async fn list_pod_sandbox_metrics(
        &self,
        req: cri::ListPodSandboxMetricsRequest,
    ) -> Result<cri::ListPodSandboxMetricsResponse> {
        let _ = req;
        Err(Error::unimplemented(
            "ListPodSandboxMetrics is not supported",
        ))
    }

    /// `RuntimeConfig`: configuration the kubelet must adopt from the runtime
    /// (the Linux cgroup driver). The kubelet reads it once at startup, so the
    /// answer must not change while the node is up.
    async fn runtime_config(
        &self,
        req: cri::RuntimeConfigRequest,
    ) -> Result<cri::RuntimeConfigResponse>;
}

/// Image management: the CRI v1 `runtime.v1.ImageService`.
///
/// All methods may be called concurrently. Images are referred to by
/// [`cri::ImageSpec::image`], which may be a tag reference, a digest
/// reference or an image id.
#[async_trait::async_trait]
pub trait ImageService: Send + Sync {
    /// `ListImages`: the images present, restricted to those matching
    /// `req.filter.image` when set.
    async fn list_images(&self, req: cri::ListImagesRequest) -> Result<cri::ListImagesResponse>;

    /// `ImageStatus`: the image named by `req.image`. An image that is not
    /// present is *not* an error: the response has `image: None`.
    async fn image_status(&self, req: cri::ImageStatusRequest) -> Result<cri::ImageStatusResponse>;

    /// `PullImage`: pulls `req.image` with the optional credentials in
    /// `req.auth`, and returns the image reference (id or digest) that
    /// identifies exactly what was pulled. Pulling an image that is already
    /// present succeeds.
    async fn pull_image(&self, req: cri::PullImageRequest) -> Result<cri::PullImageResponse>;

    /// `RemoveImage`: removes `req.image`.
    ///
    /// Idempotent: succeeds if the image has already been removed or never
    /// existed.
    async fn remove_image(&self, req: cri::RemoveImageRequest) -> Result<cri::RemoveImageResponse>;

    /// `ImageFsInfo`: usage of the filesystem(s) used to store images (and,
    /// when split, container writable layers).
    async fn image_fs_info(&self, req: cri::ImageFsInfoRequest)
    -> Result<cri::ImageFsInfoResponse>;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The traits must stay object safe: the kubelet holds them as
    /// `Arc<dyn RuntimeService>` / `Arc<dyn ImageService>`.
    #[test]
    fn traits_are_object_safe() {
        fn check(_: Option<&dyn RuntimeService>, _: Option<&dyn ImageService>) {}
        check(None, None);
    }
}
