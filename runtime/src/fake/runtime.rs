//! [`RuntimeService`] for [`FakeRuntime`]; the semantics are documented on
//! the `fake` module.

use futures::StreamExt;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;

use super::query::{running, sandbox_stats};
use super::{FakeContainer, FakeRuntime, FakeSandbox, now_ns};
use crate::cri::{self, ContainerEventType as Ev};
use crate::error::{Error, Result};
use crate::service::{EventStream, RuntimeService};

/// Exit code of a container killed by `SIGKILL`.
const KILLED_EXIT_CODE: i32 = 137;
/// Base of the fake streaming server URLs.
const STREAM_URL: &str = "http://127.0.0.1:10010";

#[async_trait::async_trait]
impl RuntimeService for FakeRuntime {
    async fn version(&self, _req: cri::VersionRequest) -> Result<cri::VersionResponse> {
        let _st = self.begin("Version")?;
        Ok(cri::VersionResponse {
            version: "0.1.0".to_string(),
            runtime_name: super::FAKE_RUNTIME_NAME.to_string(),
            runtime_version: super::FAKE_RUNTIME_VERSION.to_string(),
            runtime_api_version: "v1".to_string(),
        })
    }

    async fn run_pod_sandbox(
        &self,
        req: cri::RunPodSandboxRequest,
    ) -> Result<cri::RunPodSandboxResponse> {
        let mut st = self.begin("RunPodSandbox")?;
        let config = req
            .config
            .ok_or_else(|| Error::invalid_argument("pod sandbox config is required"))?;
        let metadata = config
            .metadata
            .clone()
            .ok_or_else(|| Error::invalid_argument("pod sandbox metadata is required"))?;
        let id = st.new_id();
        let mut network = cri::PodSandboxNetworkStatus::default();
        if !FakeSandbox::host_network(&config) {
            let n = st.next_seq();
            network.ip = format!("10.88.{}.{}", (n >> 8) & 0xff, n & 0xff);
        }
        let sandbox = FakeSandbox {
            id: id.clone(),
            metadata,
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            config,
            state: cri::PodSandboxState::SandboxReady,
            created_at: now_ns(),
            runtime_handler: req.runtime_handler,
            network,
        };
        st.sandboxes.push(sandbox);
        self.emit(&st, &id, &id, Ev::ContainerCreatedEvent);
        self.emit(&st, &id, &id, Ev::ContainerStartedEvent);
        Ok(cri::RunPodSandboxResponse { pod_sandbox_id: id })
    }

    async fn stop_pod_sandbox(
        &self,
        req: cri::StopPodSandboxRequest,
    ) -> Result<cri::StopPodSandboxResponse> {
        let mut st = self.begin("StopPodSandbox")?;
        let Some(i) = st.find_sandbox(&req.pod_sandbox_id)? else {
            return Ok(cri::StopPodSandboxResponse {});
        };
        let now = now_ns();
        let sid = st.sandboxes[i].id.clone();
        let mut killed = Vec::new();
        for c in st.containers.iter_mut().filter(|c| c.pod_sandbox_id == sid) {
            if c.is_running() {
                c.exit(now, KILLED_EXIT_CODE, "Error");
                killed.push(c.id.clone());
            }
        }
        let sb = &mut st.sandboxes[i];
        let was_ready = sb.is_ready();
        sb.state = cri::PodSandboxState::SandboxNotready;
        sb.network = cri::PodSandboxNetworkStatus::default();
        for cid in &killed {
            self.emit(&st, &sid, cid, Ev::ContainerStoppedEvent);
        }
        if was_ready {
            self.emit(&st, &sid, &sid, Ev::ContainerStoppedEvent);
        }
        Ok(cri::StopPodSandboxResponse {})
    }

    async fn remove_pod_sandbox(
        &self,
        req: cri::RemovePodSandboxRequest,
    ) -> Result<cri::RemovePodSandboxResponse> {
        let mut st = self.begin("RemovePodSandbox")?;
        let Some(i) = st.find_sandbox(&req.pod_sandbox_id)? else {
            return Ok(cri::RemovePodSandboxResponse {});
        };
        let sid = st.sandboxes[i].id.clone();
        let (gone, kept): (Vec<FakeContainer>, Vec<FakeContainer>) =
            std::mem::take(&mut st.containers)
                .into_iter()
                .partition(|c| c.pod_sandbox_id == sid);
        st.containers = kept;
        for c in &gone {
            self.emit(&st, &sid, &c.id, Ev::ContainerDeletedEvent);
        }
        let mut sandbox = st.sandboxes.remove(i);
        sandbox.state = cri::PodSandboxState::SandboxNotready;
        self.emit_for(&st, &sandbox, &sid, Ev::ContainerDeletedEvent);
        Ok(cri::RemovePodSandboxResponse {})
    }

    async fn pod_sandbox_status(
        &self,
        req: cri::PodSandboxStatusRequest,
    ) -> Result<cri::PodSandboxStatusResponse> {
        let st = self.begin("PodSandboxStatus")?;
        let sb = st.sandbox(&req.pod_sandbox_id)?;
        Ok(cri::PodSandboxStatusResponse {
            status: Some(sb.status()),
            info: Default::default(),
            containers_statuses: Vec::new(),
            timestamp: now_ns(),
        })
    }

    async fn list_pod_sandbox(
        &self,
        req: cri::ListPodSandboxRequest,
    ) -> Result<cri::ListPodSandboxResponse> {
        let st = self.begin("ListPodSandbox")?;
        let filter = req.filter.unwrap_or_default();
        let items = st
            .select_sandboxes(&filter)
            .into_iter()
            .map(FakeSandbox::to_cri)
            .collect();
        Ok(cri::ListPodSandboxResponse { items })
    }

    async fn create_container(
        &self,
        req: cri::CreateContainerRequest,
    ) -> Result<cri::CreateContainerResponse> {
        let mut st = self.begin("CreateContainer")?;
        let config = req
            .config
            .ok_or_else(|| Error::invalid_argument("container config is required"))?;
        let metadata = config
            .metadata
            .clone()
            .ok_or_else(|| Error::invalid_argument("container metadata is required"))?;
        let sb = st.sandbox(&req.pod_sandbox_id)?;
        if !sb.is_ready() {
            return Err(Error::failed_precondition(format!(
                "pod sandbox {:?} is not ready",
                sb.id
            )));
        }
        let sid = sb.id.clone();
        let log_path = if config.log_path.is_empty() || sb.config.log_directory.is_empty() {
            config.log_path.clone()
        } else {
            let dir = std::path::Path::new(&sb.config.log_directory);
            dir.join(&config.log_path).to_string_lossy().into_owned()
        };
        let image = config.image.clone().unwrap_or_default();
        let image_ref = super::images::find(&st.images, &image.image)
            .map_or_else(|| image.image.clone(), |i| i.id.clone());
        let id = st.new_id();
        let container = FakeContainer {
            id: id.clone(),
            pod_sandbox_id: sid.clone(),
            metadata,
            image,
            image_ref,
            state: cri::ContainerState::ContainerCreated,
            created_at: now_ns(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            log_path,
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            resources: config.linux.as_ref().map(|l| cri::ContainerResources {
                linux: l.resources.clone(),
                windows: None,
            }),
            config,
        };
        st.containers.push(container);
        self.emit(&st, &sid, &id, Ev::ContainerCreatedEvent);
        Ok(cri::CreateContainerResponse { container_id: id })
    }

    async fn start_container(
        &self,
        req: cri::StartContainerRequest,
    ) -> Result<cri::StartContainerResponse> {
        let mut st = self.begin("StartContainer")?;
        let c = st.container(&req.container_id)?;
        if c.state != cri::ContainerState::ContainerCreated {
            return Err(Error::failed_precondition(format!(
                "container {:?} is in state {}, not CONTAINER_CREATED",
                c.id,
                c.state.as_str_name()
            )));
        }
        let (cid, sid) = (c.id.clone(), c.pod_sandbox_id.clone());
        if !st.sandbox(&sid)?.is_ready() {
            return Err(Error::failed_precondition(format!(
                "pod sandbox {sid:?} of container {cid:?} is not ready"
            )));
        }
        let c = st.container_mut(&cid)?;
        c.state = cri::ContainerState::ContainerRunning;
        c.started_at = now_ns();
        self.emit(&st, &sid, &cid, Ev::ContainerStartedEvent);
        Ok(cri::StartContainerResponse {})
    }

    async fn stop_container(
        &self,
        req: cri::StopContainerRequest,
    ) -> Result<cri::StopContainerResponse> {
        let began = tokio::time::Instant::now();
        let delay = {
            let st = self.begin("StopContainer")?;
            let running = st
                .find_container(&req.container_id)?
                .is_some_and(|i| st.containers[i].is_running());
            if running {
                st.stop_delay
            } else {
                Duration::ZERO
            }
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let mut st = self.lock();
        let Some(i) = st.find_container(&req.container_id)? else {
            return Ok(cri::StopContainerResponse {});
        };
        if st.containers[i].is_running() {
            let id = st.containers[i].id.clone();
            st.stops.push((id, began, tokio::time::Instant::now()));
        }
        let c = &mut st.containers[i];
        if c.is_running() {
            c.exit(now_ns(), 0, "Completed");
            let (cid, sid) = (c.id.clone(), c.pod_sandbox_id.clone());
            self.emit(&st, &sid, &cid, Ev::ContainerStoppedEvent);
        }
        Ok(cri::StopContainerResponse {})
    }

    async fn remove_container(
        &self,
        req: cri::RemoveContainerRequest,
    ) -> Result<cri::RemoveContainerResponse> {
        let mut st = self.begin("RemoveContainer")?;
        if let Some(i) = st.find_container(&req.container_id)? {
            let c = st.containers.remove(i);
            self.emit(&st, &c.pod_sandbox_id, &c.id, Ev::ContainerDeletedEvent);
        }
        Ok(cri::RemoveContainerResponse {})
    }

    async fn list_containers(
        &self,
        req: cri::ListContainersRequest,
    ) -> Result<cri::ListContainersResponse> {
        self.gate("ListContainers").await;
        let st = self.begin("ListContainers")?;
        let filter = req.filter.unwrap_or_default();
        let containers = st
            .select_containers(filter)
            .into_iter()
            .map(FakeContainer::to_cri)
            .collect();
        Ok(cri::ListContainersResponse { containers })
    }

    async fn container_status(
        &self,
        req: cri::ContainerStatusRequest,
    ) -> Result<cri::ContainerStatusResponse> {
        let st = self.begin("ContainerStatus")?;
        let c = st.container(&req.container_id)?;
        Ok(cri::ContainerStatusResponse {
            status: Some(c.status()),
            info: Default::default(),
        })
    }

    async fn update_container_resources(
        &self,
        req: cri::UpdateContainerResourcesRequest,
    ) -> Result<cri::UpdateContainerResourcesResponse> {
        let mut st = self.begin("UpdateContainerResources")?;
        let c = st.container_mut(&req.container_id)?;
        c.resources = Some(cri::ContainerResources {
            linux: req.linux,
            windows: req.windows,
        });
        Ok(cri::UpdateContainerResourcesResponse {})
    }

    async fn reopen_container_log(
        &self,
        req: cri::ReopenContainerLogRequest,
    ) -> Result<cri::ReopenContainerLogResponse> {
        let st = self.begin("ReopenContainerLog")?;
        running(st.container(&req.container_id)?)?;
        Ok(cri::ReopenContainerLogResponse {})
    }

    async fn exec_sync(&self, req: cri::ExecSyncRequest) -> Result<cri::ExecSyncResponse> {
        let st = self.begin("ExecSync")?;
        running(st.container(&req.container_id)?)?;
        Ok(st.exec_sync.clone())
    }

    async fn exec(&self, req: cri::ExecRequest) -> Result<cri::ExecResponse> {
        let st = self.begin("Exec")?;
        let c = running(st.container(&req.container_id)?)?;
        Ok(cri::ExecResponse {
            url: format!("{STREAM_URL}/exec/{}", c.id),
        })
    }

    async fn attach(&self, req: cri::AttachRequest) -> Result<cri::AttachResponse> {
        let st = self.begin("Attach")?;
        let c = running(st.container(&req.container_id)?)?;
        Ok(cri::AttachResponse {
            url: format!("{STREAM_URL}/attach/{}", c.id),
        })
    }

    async fn port_forward(&self, req: cri::PortForwardRequest) -> Result<cri::PortForwardResponse> {
        let st = self.begin("PortForward")?;
        let sb = st.sandbox(&req.pod_sandbox_id)?;
        Ok(cri::PortForwardResponse {
            url: format!("{STREAM_URL}/portforward/{}", sb.id),
        })
    }

    async fn container_stats(
        &self,
        req: cri::ContainerStatsRequest,
    ) -> Result<cri::ContainerStatsResponse> {
        let st = self.begin("ContainerStats")?;
        let c = st.container(&req.container_id)?;
        Ok(cri::ContainerStatsResponse {
            stats: Some(c.stats(now_ns())),
        })
    }

    async fn list_container_stats(
        &self,
        req: cri::ListContainerStatsRequest,
    ) -> Result<cri::ListContainerStatsResponse> {
        let st = self.begin("ListContainerStats")?;
        let f = req.filter.unwrap_or_default();
        let filter = cri::ContainerFilter {
            id: f.id,
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerRunning as i32,
            }),
            pod_sandbox_id: f.pod_sandbox_id,
            label_selector: f.label_selector,
        };
        let now = now_ns();
        let stats = st
            .select_containers(filter)
            .into_iter()
            .map(|c| c.stats(now))
            .collect();
        Ok(cri::ListContainerStatsResponse { stats })
    }

    async fn pod_sandbox_stats(
        &self,
        req: cri::PodSandboxStatsRequest,
    ) -> Result<cri::PodSandboxStatsResponse> {
        let st = self.begin("PodSandboxStats")?;
        let sb = st.sandbox(&req.pod_sandbox_id)?;
        Ok(cri::PodSandboxStatsResponse {
            stats: Some(sandbox_stats(&st, sb)),
        })
    }

    async fn list_pod_sandbox_stats(
        &self,
        req: cri::ListPodSandboxStatsRequest,
    ) -> Result<cri::ListPodSandboxStatsResponse> {
        let st = self.begin("ListPodSandboxStats")?;
        let f = req.filter.unwrap_or_default();
        let filter = cri::PodSandboxFilter {
            id: f.id,
            state: None,
            label_selector: f.label_selector,
        };
        let stats = st
            .select_sandboxes(&filter)
            .into_iter()
            .map(|s| sandbox_stats(&st, s))
            .collect();
        Ok(cri::ListPodSandboxStatsResponse { stats })
    }

    async fn update_runtime_config(
        &self,
        req: cri::UpdateRuntimeConfigRequest,
    ) -> Result<cri::UpdateRuntimeConfigResponse> {
        let mut st = self.begin("UpdateRuntimeConfig")?;
        if let Some(net) = req.runtime_config.and_then(|c| c.network_config) {
            st.pod_cidr = Some(net.pod_cidr);
        }
        Ok(cri::UpdateRuntimeConfigResponse {})
    }

    async fn status(&self, req: cri::StatusRequest) -> Result<cri::StatusResponse> {
        let st = self.begin("Status")?;
        Ok(cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: st.conditions.clone(),
            }),
            runtime_handlers: st.handlers.clone(),
            info: if req.verbose {
                st.status_info.clone()
            } else {
                Default::default()
            },
            ..Default::default()
        })
    }

    async fn checkpoint_container(
        &self,
        req: cri::CheckpointContainerRequest,
    ) -> Result<cri::CheckpointContainerResponse> {
        let st = self.begin("CheckpointContainer")?;
        st.container(&req.container_id)?;
        Ok(cri::CheckpointContainerResponse {})
    }

    async fn get_container_events(&self, _req: cri::GetEventsRequest) -> Result<EventStream> {
        let _st = self.begin("GetContainerEvents")?;
        let rx = self.subscribe();
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(event) => return Some((Ok(event), rx)),
                    // A slow subscriber skips what it missed, like a real
                    // runtime dropping events for a congested watcher.
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => return None,
                }
            }
        });
        Ok(stream.boxed())
    }

    async fn list_metric_descriptors(
        &self,
        _req: cri::ListMetricDescriptorsRequest,
    ) -> Result<cri::ListMetricDescriptorsResponse> {
        let _st = self.begin("ListMetricDescriptors")?;
        Ok(cri::ListMetricDescriptorsResponse::default())
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _req: cri::ListPodSandboxMetricsRequest,
    ) -> Result<cri::ListPodSandboxMetricsResponse> {
        let _st = self.begin("ListPodSandboxMetrics")?;
        Ok(cri::ListPodSandboxMetricsResponse::default())
    }

    async fn runtime_config(
        &self,
        _req: cri::RuntimeConfigRequest,
    ) -> Result<cri::RuntimeConfigResponse> {
        let _st = self.begin("RuntimeConfig")?;
        Ok(cri::RuntimeConfigResponse {
            linux: Some(cri::LinuxRuntimeConfiguration {
                cgroup_driver: cri::CgroupDriver::Cgroupfs as i32,
            }),
        })
    }
}
