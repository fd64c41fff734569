//! A sample device plugin (API v1beta1) for the tests: it advertises devices backed by real
//! character device nodes, registers with the kubelet and registers again whenever the
//! kubelet's socket is made anew (a restarted kubelet).
//!
//! ```text
//! sample_device_plugin --dir <device plugin dir> --resource example.com/dev \
//!     --socket sample.sock --device a=/tmp/x/dev-a --device b=/tmp/x/dev-b \
//!     [--unhealthy-file F] [--preferred] [--pre-start-log F]
//! ```
//! - `--unhealthy-file`: the IDs listed in it (one per line) are reported `Unhealthy`; it is
//!   read every 200 ms and each change is sent on `ListAndWatch`.
//! - `--preferred`: offers `GetPreferredAllocation`, preferring the highest IDs first (so a
//!   test can tell the preference was followed).
//! - `--pre-start-log`: asks for `PreStartContainer` and appends each call's IDs to the file.
//! - `--mount HOST:CONTAINER`: every allocation also mounts HOST (read-only) at CONTAINER.
//! - `--hang-allocate`: `Allocate` never answers (a plugin that hangs).
//! - `--garbage`: `ListAndWatch` also sends a device without an ID and one twice.
//! - `--api-version V`: registers asking for API version V (default `v1beta1`).
//!
//! `Allocate` gives each device node at `/dev/sample-<id>` (rw), the env
//! `SAMPLE_DEVICES=<ids>`, the annotation `example.com/sample-devices=<ids>` and, with
//! `--cdi-kind vendor/class`, the CDI device `vendor/class=<id>` per device.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use hyper_util::rt::TokioIo;
use nodelet::devices::api::v1beta1::device_plugin_server::{DevicePlugin, DevicePluginServer};
use nodelet::devices::api::v1beta1::registration_client::RegistrationClient;
use nodelet::devices::api::v1beta1::{
    AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, DeviceSpec, Empty,
    ListAndWatchResponse, Mount, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, RegisterRequest,
};
use tokio::sync::watch;
use tonic::transport::{Endpoint, Uri};
use tonic::{Request, Response, Status};

#[derive(Debug, Clone, Default)]
struct Args {
    dir: PathBuf,
    resource: String,
    socket: String,
    devices: Vec<(String, PathBuf)>,
    unhealthy_file: Option<PathBuf>,
    preferred: bool,
    pre_start_log: Option<PathBuf>,
    cdi_kind: Option<String>,
    mount: Option<(String, String)>,
    hang_allocate: bool,
    garbage: bool,
    api_version: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--dir" => a.dir = value()?.into(),
            "--resource" => a.resource = value()?,
            "--socket" => a.socket = value()?,
            "--device" => {
                let v = value()?;
                let (id, path) = v.split_once('=').ok_or("--device is ID=PATH")?;
                a.devices.push((id.to_string(), path.into()));
            }
            "--unhealthy-file" => a.unhealthy_file = Some(value()?.into()),
            "--preferred" => a.preferred = true,
            "--pre-start-log" => a.pre_start_log = Some(value()?.into()),
            "--cdi-kind" => a.cdi_kind = Some(value()?),
            "--mount" => {
                let v = value()?;
                let (host, container) = v.split_once(':').ok_or("--mount is HOST:CONTAINER")?;
                a.mount = Some((host.to_string(), container.to_string()));
            }
            "--hang-allocate" => a.hang_allocate = true,
            "--garbage" => a.garbage = true,
            "--api-version" => a.api_version = Some(value()?),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.dir.as_os_str().is_empty() || a.resource.is_empty() || a.socket.is_empty() {
        return Err("--dir, --resource and --socket are required".into());
    }
    Ok(a)
}

struct Plugin {
    args: Args,
    devices: watch::Receiver<Vec<Device>>,
}

fn read_devices(args: &Args) -> Vec<Device> {
    let unhealthy: Vec<String> = args
        .unhealthy_file
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    let mut devices: Vec<Device> = args
        .devices
        .iter()
        .map(|(id, _)| Device {
            id: id.clone(),
            health: if unhealthy.contains(id) {
                "Unhealthy".into()
            } else {
                "Healthy".into()
            },
            topology: None,
        })
        .collect();
    if args.garbage {
        let mut nameless = devices.first().cloned().unwrap_or_default();
        let twice = nameless.clone();
        nameless.id = String::new();
        devices.push(nameless);
        devices.push(twice);
    }
    devices
}

type DeviceStream = Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(self.options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.devices.clone();
        let stream = futures::stream::unfold((rx, true), |(mut rx, first)| async move {
            if !first && rx.changed().await.is_err() {
                return None;
            }
            let devices = rx.borrow_and_update().clone();
            Some((Ok(ListAndWatchResponse { devices }), (rx, false)))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let container_responses = req
            .into_inner()
            .container_requests
            .into_iter()
            .map(|r| {
                let size = usize::try_from(r.allocation_size).unwrap_or(0);
                let mut ids = r.must_include_device_i_ds.clone();
                let mut rest = r.available_device_i_ds.clone();
                rest.sort();
                rest.reverse();
                for id in rest {
                    if ids.len() >= size {
                        break;
                    }
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                ContainerPreferredAllocationResponse { device_i_ds: ids }
            })
            .collect();
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        if self.args.hang_allocate {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        let paths: HashMap<&String, &PathBuf> =
            self.args.devices.iter().map(|(i, p)| (i, p)).collect();
        let mut container_responses = Vec::new();
        for c in req.into_inner().container_requests {
            let mut devices = Vec::new();
            for id in &c.devices_ids {
                let host = paths
                    .get(id)
                    .ok_or_else(|| Status::invalid_argument(format!("unknown device {id}")))?;
                devices.push(DeviceSpec {
                    container_path: format!("/dev/sample-{id}"),
                    host_path: host.display().to_string(),
                    permissions: "rw".into(),
                });
            }
            let ids = c.devices_ids.join(",");
            let cdi_devices = self
                .args
                .cdi_kind
                .iter()
                .flat_map(|kind| {
                    c.devices_ids.iter().map(move |id| CdiDevice {
                        name: format!("{kind}={id}"),
                    })
                })
                .collect();
            let mounts = self
                .args
                .mount
                .iter()
                .map(|(host, container)| Mount {
                    container_path: container.clone(),
                    host_path: host.clone(),
                    read_only: true,
                })
                .collect();
            container_responses.push(ContainerAllocateResponse {
                envs: HashMap::from([("SAMPLE_DEVICES".to_string(), ids.clone())]),
                annotations: HashMap::from([("example.com/sample-devices".to_string(), ids)]),
                devices,
                mounts,
                cdi_devices,
            });
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        req: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        if let Some(log) = &self.args.pre_start_log {
            use std::io::Write;
            let line = req.into_inner().devices_ids.join(",");
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .map_err(|e| Status::internal(e.to_string()))?;
            writeln!(f, "{line}").map_err(|e| Status::internal(e.to_string()))?;
        }
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

impl Plugin {
    fn options(&self) -> DevicePluginOptions {
        DevicePluginOptions {
            pre_start_required: self.args.pre_start_log.is_some(),
            get_preferred_allocation_available: self.args.preferred,
        }
    }
}

/// Registers with the kubelet's socket in `dir`.
async fn register(dir: &Path, args: &Args, options: DevicePluginOptions) -> Result<(), String> {
    let socket = Arc::new(dir.join("kubelet.sock"));
    let connector = tower::service_fn(move |_: Uri| {
        let socket = socket.clone();
        async move {
            let io = tokio::net::UnixStream::connect(socket.as_path()).await?;
            Ok::<_, std::io::Error>(TokioIo::new(io))
        }
    });
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await
        .map_err(|e| format!("dialling the kubelet: {e}"))?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: args.api_version.clone().unwrap_or_else(|| "v1beta1".into()),
            endpoint: args.socket.clone(),
            resource_name: args.resource.clone(),
            options: Some(options),
        })
        .await
        .map_err(|e| format!("registering: {}", e.message()))?;
    Ok(())
}

/// What tells one socket file from the next made at the same path (an inode number may be
/// reused).
fn identity(path: &Path) -> Option<(u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.ino(), m.ctime(), m.ctime_nsec()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sample_device_plugin: {e}");
            std::process::exit(2);
        }
    };
    let (tx, rx) = watch::channel(read_devices(&args));
    let plugin = Plugin {
        args: args.clone(),
        devices: rx,
    };
    let options = plugin.options();
    let socket = args.dir.join(&args.socket);
    let _ = std::fs::remove_file(&socket);
    let listener = match tokio::net::UnixListener::bind(&socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("sample_device_plugin: binding {}: {e}", socket.display());
            std::process::exit(1);
        }
    };
    let incoming = futures::stream::unfold(listener, |l| async move {
        Some((l.accept().await.map(|(io, _)| io), l))
    });
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::new(plugin))
            .serve_with_incoming(incoming),
    );
    // Health from the file, and registration whenever the kubelet's socket is new.
    let kubelet_sock = args.dir.join("kubelet.sock");
    let mut registered_with: Option<(u64, i64, i64)> = None;
    loop {
        tx.send_if_modified(|d| {
            let now = read_devices(&args);
            let changed = *d != now;
            *d = now;
            changed
        });
        let ino = identity(&kubelet_sock);
        if ino.is_some() && ino != registered_with {
            match register(&args.dir, &args, options).await {
                Ok(()) => {
                    eprintln!("sample_device_plugin: registered {}", args.resource);
                    registered_with = ino;
                }
                Err(e) => eprintln!("sample_device_plugin: {e}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
