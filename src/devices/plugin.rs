//! One registered device plugin: a client of its `DevicePlugin` service on its socket, every
//! call under a deadline.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper_util::rt::TokioIo;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Uri};

use super::api::v1beta1::{
    AllocateRequest, ContainerAllocateRequest, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, Device, DevicePluginOptions, Empty,
    PreStartContainerRequest, PreferredAllocationRequest, device_plugin_client::DevicePluginClient,
};
use super::{CALL_TIMEOUT, DeviceError};

/// How long dialling a plugin's socket may take when it registers.
const DIAL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A plugin that could not be reached, or did not say its options.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("dialling the device plugin at {}: {source}", path.display())]
    Dial {
        path: PathBuf,
        source: tonic::transport::Error,
    },
    #[error("the device plugin at {}: GetDevicePluginOptions failed: {why}", path.display())]
    Options { path: PathBuf, why: String },
}

pub struct Plugin {
    resource: String,
    options: DevicePluginOptions,
    client: DevicePluginClient<Channel>,
    stop: CancellationToken,
}

impl Plugin {
    /// Dials the plugin's socket and asks for its options (each within 10 s), as upstream's
    /// `PluginConnected` does.
    pub async fn connect(resource: &str, socket: &Path) -> Result<Plugin, PluginError> {
        let path = Arc::new(socket.to_path_buf());
        let dial = path.clone();
        let connector = tower::service_fn(move |_: Uri| {
            let path = dial.clone();
            async move {
                let io = tokio::net::UnixStream::connect(path.as_path()).await?;
                Ok::<_, std::io::Error>(TokioIo::new(io))
            }
        });
        let channel = Endpoint::from_static("http://localhost")
            .connect_timeout(DIAL_TIMEOUT)
            .connect_with_connector(connector)
            .await
            .map_err(|source| PluginError::Dial {
                path: path.to_path_buf(),
                source,
            })?;
        let mut client = DevicePluginClient::new(channel);
        let options_err = |why: String| PluginError::Options {
            path: path.to_path_buf(),
            why,
        };
        let options =
            tokio::time::timeout(DIAL_TIMEOUT, client.get_device_plugin_options(Empty {}))
                .await
                .map_err(|_| options_err("timed out".into()))?
                .map_err(|e| options_err(e.message().to_string()))?
                .into_inner();
        Ok(Plugin {
            resource: resource.to_string(),
            options,
            client,
            stop: CancellationToken::new(),
        })
    }

    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// Whether the plugin offers `GetPreferredAllocation`.
    pub fn prefers(&self) -> bool {
        self.options.get_preferred_allocation_available
    }

    pub fn pre_start_required(&self) -> bool {
        self.options.pre_start_required
    }

    /// Stops following the plugin (a newer one of its resource registered, or the kubelet
    /// stops).
    pub fn stop(&self) {
        self.stop.cancel();
    }

    fn failed(&self, call: &'static str, why: impl std::fmt::Display) -> DeviceError {
        DeviceError::Plugin {
            resource: self.resource.clone(),
            call,
            why: why.to_string(),
        }
    }

    /// Runs `ListAndWatch`, handing each answer's devices to `update`, until the stream ends,
    /// fails or the plugin is stopped; returns why it ended.
    pub async fn list_and_watch(&self, update: impl Fn(Vec<Device>)) -> String {
        let mut client = self.client.clone();
        let stream = tokio::select! {
            s = client.list_and_watch(Empty {}) => s,
            () = self.stop.cancelled() => return "stopped".to_string(),
        };
        let mut stream = match stream {
            Ok(s) => s.into_inner(),
            Err(e) => return format!("ListAndWatch failed: {}", e.message()),
        };
        loop {
            let next = tokio::select! {
                m = stream.message() => m,
                () = self.stop.cancelled() => return "stopped".to_string(),
            };
            match next {
                Ok(Some(resp)) => update(resp.devices),
                Ok(None) => return "ListAndWatch ended".to_string(),
                Err(e) => return format!("ListAndWatch failed: {}", e.message()),
            }
        }
    }

    /// `GetPreferredAllocation` for one container: `size` of `available`, `must` included.
    pub async fn preferred(
        &self,
        available: &[String],
        must: &[String],
        size: usize,
    ) -> Result<Vec<String>, DeviceError> {
        const CALL: &str = "GetPreferredAllocation";
        let req = PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available.to_vec(),
                must_include_device_i_ds: must.to_vec(),
                allocation_size: i32::try_from(size).unwrap_or(i32::MAX),
            }],
        };
        let mut client = self.client.clone();
        let resp = tokio::time::timeout(CALL_TIMEOUT, client.get_preferred_allocation(req))
            .await
            .map_err(|_| self.failed(CALL, "timed out"))?
            .map_err(|e| self.failed(CALL, e.message()))?
            .into_inner();
        Ok(resp
            .container_responses
            .into_iter()
            .next()
            .map(|r| r.device_i_ds)
            .unwrap_or_default())
    }

    /// `Allocate` for one container's devices.
    pub async fn allocate(&self, ids: &[String]) -> Result<ContainerAllocateResponse, DeviceError> {
        const CALL: &str = "Allocate";
        let req = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: ids.to_vec(),
            }],
        };
        let mut client = self.client.clone();
        let resp = tokio::time::timeout(CALL_TIMEOUT, client.allocate(req))
            .await
            .map_err(|_| self.failed(CALL, "timed out"))?
            .map_err(|e| self.failed(CALL, e.message()))?
            .into_inner();
        let mut answers = resp.container_responses.into_iter();
        match (answers.next(), answers.next()) {
            (Some(one), None) => Ok(one),
            (None, _) => Err(self.failed(CALL, "the answer has no container response")),
            (Some(_), Some(_)) => Err(self.failed(
                CALL,
                "the answer has more container responses than containers asked",
            )),
        }
    }

    /// `PreStartContainer` for one container's devices (upstream's 30 s deadline).
    pub async fn pre_start(&self, ids: &[String]) -> Result<(), DeviceError> {
        const CALL: &str = "PreStartContainer";
        let req = PreStartContainerRequest {
            devices_ids: ids.to_vec(),
        };
        let mut client = self.client.clone();
        tokio::time::timeout(CALL_TIMEOUT, client.pre_start_container(req))
            .await
            .map_err(|_| self.failed(CALL, "timed out"))?
            .map_err(|e| self.failed(CALL, e.message()))?;
        Ok(())
    }
}
