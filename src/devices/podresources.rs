//! The pod-resources API (`v1.PodResourcesLister`) on `<root>/pod-resources/kubelet.sock`:
//! which devices each container of the node's pods holds, and every device the plugins
//! advertise. nodelet pins no CPUs and no memory (no static CPU or memory manager policy), so
//! `cpu_ids` and `memory` are empty, as upstream reports them under the `none` policies.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::DeviceManager;
use super::api::podresources::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use super::api::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, GetPodResourcesRequest, GetPodResourcesResponse, ListPodResourcesRequest,
    ListPodResourcesResponse, NumaNode, PodResources, TopologyInfo,
};

/// The directory under the root dir (upstream's).
pub const DIR: &str = "pod-resources";
/// The socket's name in it.
pub const SOCKET: &str = "kubelet.sock";

struct Lister {
    devices: DeviceManager,
    pods: watch::Receiver<Arc<Vec<Pod>>>,
}

fn topology(numa: Vec<i64>) -> Option<TopologyInfo> {
    (!numa.is_empty()).then(|| TopologyInfo {
        nodes: numa.into_iter().map(|id| NumaNode { id }).collect(),
    })
}

fn terminal(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
}

impl Lister {
    /// One pod's entry: its app containers and sidecars, each with its devices.
    fn pod_resources(&self, pod: &Pod) -> PodResources {
        let uid = crate::sources::pod_uid(pod);
        let held = self.devices.pod_devices(uid);
        let spec = pod.spec.as_ref();
        let sidecars = spec
            .and_then(|s| s.init_containers.as_ref())
            .into_iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let containers = sidecars
            .chain(spec.map(|s| s.containers.iter()).into_iter().flatten())
            .map(|c| ContainerResources {
                name: c.name.clone(),
                devices: held
                    .get(&c.name)
                    .into_iter()
                    .flatten()
                    .map(|(resource, ids)| ContainerDevices {
                        resource_name: resource.clone(),
                        device_ids: ids.clone(),
                        topology: topology(self.devices.numa_of(resource, ids)),
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        PodResources {
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            containers,
        }
    }

    fn active_pods(&self) -> Vec<Pod> {
        self.pods
            .borrow()
            .iter()
            .filter(|p| !terminal(p))
            .cloned()
            .collect()
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        let pod_resources = self
            .active_pods()
            .iter()
            .map(|p| self.pod_resources(p))
            .collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        let mut devices = Vec::new();
        for (resource, list) in self.devices.all_devices() {
            for (id, numa) in list {
                devices.push(ContainerDevices {
                    resource_name: resource.clone(),
                    device_ids: vec![id],
                    topology: topology(numa),
                });
            }
        }
        Ok(Response::new(AllocatableResourcesResponse {
            devices,
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        req: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        let req = req.into_inner();
        let pod = self.active_pods().into_iter().find(|p| {
            p.metadata.name.as_deref() == Some(req.pod_name.as_str())
                && p.metadata.namespace.as_deref() == Some(req.pod_namespace.as_str())
        });
        let Some(pod) = pod else {
            return Err(Status::not_found(format!(
                "pod {} in namespace {} not found",
                req.pod_name, req.pod_namespace
            )));
        };
        Ok(Response::new(GetPodResourcesResponse {
            pod_resources: Some(self.pod_resources(&pod)),
        }))
    }
}

/// The socket's path under `root_dir`.
pub fn socket_path(root_dir: &Path) -> PathBuf {
    root_dir.join(DIR).join(SOCKET)
}

/// Binds the socket (0600, in a 0700 directory; a stale one replaced) and returns the server,
/// which runs until `cancel` and then removes the socket.
pub fn serve(
    root_dir: &Path,
    devices: DeviceManager,
    pods: watch::Receiver<Arc<Vec<Pod>>>,
    cancel: CancellationToken,
) -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    let (socket, incoming) = super::socket::bind(
        &root_dir.join(DIR),
        SOCKET,
        0o700,
        Some(0o600),
        "pod resources API",
    )?;
    Ok(async move {
        let svc = PodResourcesListerServer::new(Lister { devices, pods });
        let served = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, async move { cancel.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!("pod resources server: {e}");
        }
        let _ = std::fs::remove_file(&socket);
    })
}
