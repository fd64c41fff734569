//! The CRI traits implemented for [`BuiltinRuntime`]: each RPC delegates to the module that
//! owns it (pod, container, stats, image).

use futures::StreamExt;
use tokio_stream::wrappers::BroadcastStream;

use super::BuiltinRuntime;
use crate::{EventStream, ImageService, Result, RuntimeService, cri};

/// The runtime's name as Version and the node's status report it.
pub const RUNTIME_NAME: &str = "nodelet";

#[async_trait::async_trait]
impl RuntimeService for BuiltinRuntime {
    async fn version(&self, _req: cri::VersionRequest) -> Result<cri::VersionResponse> {
        Ok(cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: RUNTIME_NAME.into(),
            runtime_version: env!("CARGO_PKG_VERSION").into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn run_pod_sandbox(
        &self,
        req: cri::RunPodSandboxRequest,
    ) -> Result<cri::RunPodSandboxResponse> {
        let pod_sandbox_id = self.run_sandbox(req).await?;
        Ok(cri::RunPodSandboxResponse { pod_sandbox_id })
    }

    async fn stop_pod_sandbox(
        &self,
        req: cri::StopPodSandboxRequest,
    ) -> Result<cri::StopPodSandboxResponse> {
        self.stop_sandbox(&req.pod_sandbox_id).await?;
        Ok(cri::StopPodSandboxResponse {})
    }

    async fn remove_pod_sandbox(
        &self,
        req: cri::RemovePodSandboxRequest,
    ) -> Result<cri::RemovePodSandboxResponse> {
        self.remove_sandbox(&req.pod_sandbox_id).await?;
        Ok(cri::RemovePodSandboxResponse {})
    }

    async fn pod_sandbox_status(
        &self,
        req: cri::PodSandboxStatusRequest,
    ) -> Result<cri::PodSandboxStatusResponse> {
        self.sandbox_status(&req.pod_sandbox_id, req.verbose).await
    }

    async fn list_pod_sandbox(
        &self,
        req: cri::ListPodSandboxRequest,
    ) -> Result<cri::ListPodSandboxResponse> {
        Ok(cri::ListPodSandboxResponse {
            items: self.list_sandboxes(req.filter).await?,
        })
    }

    async fn create_container(
        &self,
        req: cri::CreateContainerRequest,
    ) -> Result<cri::CreateContainerResponse> {
        // The sandbox process publishes the created container's event (see `watch_sandbox`).
        let container_id = self.create(req).await?;
        Ok(cri::CreateContainerResponse { container_id })
    }

    async fn start_container(
        &self,
        req: cri::StartContainerRequest,
    ) -> Result<cri::StartContainerResponse> {
        self.start(&req.container_id).await?;
        Ok(cri::StartContainerResponse {})
    }

    async fn stop_container(
        &self,
        req: cri::StopContainerRequest,
    ) -> Result<cri::StopContainerResponse> {
        self.stop(&req.container_id, req.timeout).await?;
        Ok(cri::StopContainerResponse {})
    }

    async fn remove_container(
        &self,
        req: cri::RemoveContainerRequest,
    ) -> Result<cri::RemoveContainerResponse> {
        self.remove(&req.container_id).await?;
        Ok(cri::RemoveContainerResponse {})
    }

    async fn list_containers(
        &self,
        req: cri::ListContainersRequest,
    ) -> Result<cri::ListContainersResponse> {
        Ok(cri::ListContainersResponse {
            containers: self.list(req.filter).await?,
        })
    }

    async fn container_status(
        &self,
        req: cri::ContainerStatusRequest,
    ) -> Result<cri::ContainerStatusResponse> {
        self.status(&req.container_id, req.verbose).await
    }

    async fn update_container_resources(
        &self,
        req: cri::UpdateContainerResourcesRequest,
    ) -> Result<cri::UpdateContainerResourcesResponse> {
        self.update_resources(&req.container_id, req.linux).await?;
        Ok(cri::UpdateContainerResourcesResponse {})
    }

    async fn reopen_container_log(
        &self,
        req: cri::ReopenContainerLogRequest,
    ) -> Result<cri::ReopenContainerLogResponse> {
        self.reopen_log(&req.container_id).await?;
        Ok(cri::ReopenContainerLogResponse {})
    }

    async fn exec_sync(&self, req: cri::ExecSyncRequest) -> Result<cri::ExecSyncResponse> {
        self.exec_sync(req).await
    }

    async fn exec(&self, req: cri::ExecRequest) -> Result<cri::ExecResponse> {
        self.exec_url(req).await
    }

    async fn attach(&self, req: cri::AttachRequest) -> Result<cri::AttachResponse> {
        self.attach_url(req).await
    }

    async fn port_forward(&self, req: cri::PortForwardRequest) -> Result<cri::PortForwardResponse> {
        self.port_forward_url(req).await
    }

    async fn container_stats(
        &self,
        req: cri::ContainerStatsRequest,
    ) -> Result<cri::ContainerStatsResponse> {
        Ok(cri::ContainerStatsResponse {
            stats: Some(self.container_stats(&req.container_id).await?),
        })
    }

    async fn list_container_stats(
        &self,
        req: cri::ListContainerStatsRequest,
    ) -> Result<cri::ListContainerStatsResponse> {
        Ok(cri::ListContainerStatsResponse {
            stats: self.list_container_stats(req.filter).await?,
        })
    }

    async fn pod_sandbox_stats(
        &self,
        req: cri::PodSandboxStatsRequest,
    ) -> Result<cri::PodSandboxStatsResponse> {
        Ok(cri::PodSandboxStatsResponse {
            stats: Some(self.sandbox_stats(&req.pod_sandbox_id).await?),
        })
    }

    async fn list_pod_sandbox_stats(
        &self,
        req: cri::ListPodSandboxStatsRequest,
    ) -> Result<cri::ListPodSandboxStatsResponse> {
        Ok(cri::ListPodSandboxStatsResponse {
            stats: self.list_sandbox_stats(req.filter).await?,
        })
    }

    async fn update_runtime_config(
        &self,
        req: cri::UpdateRuntimeConfigRequest,
    ) -> Result<cri::UpdateRuntimeConfigResponse> {
        // The Node's pod CIDR (from the kubelet) is where new pods get addresses from; pods
        // keep theirs (see `network.rs`).
        let asked = req
            .runtime_config
            .and_then(|c| c.network_config)
            .map(|n| n.pod_cidr)
            .unwrap_or_default();
        if self.inner.cni.is_some() && !asked.is_empty() {
            // The CNI config names its own ranges (its IPAM's), as with containerd when its
            // config is not a template.
            tracing::debug!("pod CIDR {asked}: the CNI config's IPAM gives the addresses");
        }
        if let Some(net) = &self.inner.network {
            if net.use_pod_cidr(&asked)? && net.is_set_up() {
                let rt = self.clone();
                tokio::task::spawn_blocking(move || match &rt.inner.network {
                    Some(net) => net.ensure_all(),
                    None => Ok(()),
                })
                .await
                .map_err(|e| crate::Error::internal(e.to_string()))?
                .map_err(|e| {
                    crate::Error::internal(format!("setting up the pod CIDR {asked}: {e}"))
                })?;
            }
        }
        Ok(cri::UpdateRuntimeConfigResponse {})
    }

    async fn status(&self, _req: cri::StatusRequest) -> Result<cri::StatusResponse> {
        let cond = |t: &str| cri::RuntimeCondition {
            r#type: t.into(),
            status: true,
            reason: String::new(),
            message: String::new(),
        };
        let mut network = cond("NetworkReady");
        if let Some(net) = &self.inner.network {
            // Checked (and mended) on every call: someone may have deleted the bridge or
            // flushed the ruleset.
            let problem = self.ensure_network().await.err();
            if let Some(message) = problem {
                network.status = false;
                network.reason = "NetworkPluginNotReady".into();
                network.message = format!(
                    "the pod network on bridge {} is not ready: {message}",
                    net.cfg.bridge
                );
            }
        }
        if let Some(cni) = &self.inner.cni {
            // The config is read again when the conf dir changed; its plugins' STATUS asked.
            if let Err(message) = cni.ready().await {
                network.status = false;
                network.reason = "NetworkPluginNotReady".into();
                network.message = format!("Network plugin returns error: {message}");
            }
        }
        Ok(cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![cond("RuntimeReady"), network],
            }),
            info: Default::default(),
            // The default handler (and its alias "nodelet"): recursive read-only mounts
            // (`mount_setattr`), user namespaces with ID-mapped rootfs and volumes;
            // supplemental groups policies.
            runtime_handlers: ["", "nodelet"]
                .into_iter()
                .map(|name| cri::RuntimeHandler {
                    name: name.to_string(),
                    features: Some(cri::RuntimeHandlerFeatures {
                        recursive_read_only_mounts: true,
                        user_namespaces: true,
                    }),
                })
                .collect(),
            features: Some(cri::RuntimeFeatures {
                supplemental_groups_policy: true,
            }),
        })
    }

    async fn get_container_events(&self, _req: cri::GetEventsRequest) -> Result<EventStream> {
        let rx = self.inner.events.subscribe();
        Ok(BroadcastStream::new(rx)
            .filter_map(|ev| async move { ev.ok().map(Ok) })
            .boxed())
    }

    async fn runtime_config(
        &self,
        _req: cri::RuntimeConfigRequest,
    ) -> Result<cri::RuntimeConfigResponse> {
        Ok(cri::RuntimeConfigResponse {
            linux: Some(cri::LinuxRuntimeConfiguration {
                cgroup_driver: if self.inner.cfg.systemd_cgroup {
                    cri::CgroupDriver::Systemd as i32
                } else {
                    cri::CgroupDriver::Cgroupfs as i32
                },
            }),
        })
    }
}

#[async_trait::async_trait]
impl ImageService for BuiltinRuntime {
    async fn list_images(&self, req: cri::ListImagesRequest) -> Result<cri::ListImagesResponse> {
        Ok(cri::ListImagesResponse {
            images: self.list_images(req.filter)?,
        })
    }

    async fn image_status(&self, req: cri::ImageStatusRequest) -> Result<cri::ImageStatusResponse> {
        BuiltinRuntime::image_status(self, req)
    }

    async fn pull_image(&self, req: cri::PullImageRequest) -> Result<cri::PullImageResponse> {
        Ok(cri::PullImageResponse {
            image_ref: self.pull(req).await?,
        })
    }

    async fn remove_image(&self, req: cri::RemoveImageRequest) -> Result<cri::RemoveImageResponse> {
        BuiltinRuntime::remove_image(self, req).await?;
        Ok(cri::RemoveImageResponse {})
    }

    async fn image_fs_info(
        &self,
        _req: cri::ImageFsInfoRequest,
    ) -> Result<cri::ImageFsInfoResponse> {
        self.image_fs()
    }
}
