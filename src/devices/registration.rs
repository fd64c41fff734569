//! The registration service on `<root>/device-plugins/kubelet.sock`: a plugin's `Register`
//! is checked (API version, an extended resource name, a socket in the directory), then the
//! kubelet dials the plugin before answering, as upstream does.

use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::api::v1beta1::registration_server::{Registration, RegistrationServer};
use super::api::v1beta1::{Empty, RegisterRequest};
use super::{DeviceManager, KUBELET_SOCKET, VERSION};

struct Registrar {
    manager: DeviceManager,
}

/// Why `Register` refuses a request, if it does (upstream's messages where it has them).
pub fn refusal(req: &RegisterRequest) -> Option<String> {
    if req.version != VERSION {
        return Some(format!(
            "requested API version {:?} is not supported by kubelet. Supported version is {VERSION:?}",
            req.version
        ));
    }
    if !is_extended_resource_name(&req.resource_name) {
        return Some(format!(
            "the ResourceName {:?} is invalid: a device plugin's resource is a domain-qualified \
             name outside kubernetes.io (e.g. example.com/dongle)",
            req.resource_name
        ));
    }
    let e = &req.endpoint;
    if e.is_empty() || e.contains('/') || e == KUBELET_SOCKET || e == "." || e == ".." {
        return Some(format!(
            "the endpoint {e:?} is invalid: it names the plugin's socket in the device plugin \
             directory (a file name, not {KUBELET_SOCKET:?})"
        ));
    }
    None
}

/// An extended resource name: `<DNS subdomain>/<name>` outside `kubernetes.io/`, whose
/// `requests.` form is a qualified name (upstream's `IsExtendedResourceName`).
pub fn is_extended_resource_name(name: &str) -> bool {
    let Some((prefix, base)) = name.split_once('/') else {
        return false;
    };
    if name.contains("kubernetes.io/") || name.starts_with("requests.") {
        return false;
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let prefix_ok = prefix.len() <= 253 && prefix.split('.').all(label_ok);
    let base_ok = !base.is_empty()
        && base.len() <= 63
        && base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && base.as_bytes()[0].is_ascii_alphanumeric()
        && base.as_bytes()[base.len() - 1].is_ascii_alphanumeric();
    prefix_ok && base_ok
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(&self, req: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let req = req.into_inner();
        if let Some(why) = refusal(&req) {
            tracing::warn!(resource = %req.resource_name, "device plugin registration refused: {why}");
            return Err(Status::invalid_argument(why));
        }
        let resource = req.resource_name.clone();
        self.manager.add_plugin(req).await.map_err(|e| {
            tracing::warn!(%resource, "device plugin registration failed: {e}");
            Status::unavailable(e.to_string())
        })?;
        Ok(Response::new(Empty {}))
    }
}

/// Binds `<dir>/kubelet.sock` (a stale one replaced) and returns the server, which runs until
/// `cancel` and then removes the socket and stops following the plugins.
pub fn serve(
    manager: DeviceManager,
    cancel: CancellationToken,
) -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    let what = "device plugin registration";
    let (socket, incoming) = super::socket::bind(manager.dir(), KUBELET_SOCKET, 0o750, None, what)?;
    Ok(async move {
        let svc = RegistrationServer::new(Registrar {
            manager: manager.clone(),
        });
        let stop = cancel.clone();
        let served = tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming_shutdown(incoming, async move { stop.cancelled().await })
            .await;
        if let Err(e) = served {
            tracing::error!("device plugin registration server: {e}");
        }
        manager.stop_plugins();
        let _ = std::fs::remove_file(&socket);
    })
}
