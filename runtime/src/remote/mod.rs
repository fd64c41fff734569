//! The remote backend (feature `remote`): [`RemoteRuntime`] implements [`RuntimeService`] and
//! [`ImageService`] by calling a CRI v1 runtime (containerd, CRI-O, `nodelet cri serve`) over
//! its unix socket with tonic clients. It owns the connection (a tonic channel over a unix
//! socket connector, reconnecting by itself when the runtime restarts), the per-call deadlines,
//! the message size limits and the version negotiation done on [`connect`]; errors come back as
//! the runtime sent them (same code, same message).
//!
//! [`RuntimeService`]: crate::RuntimeService
//! [`ImageService`]: crate::ImageService

pub mod containerd;
mod service;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::cri::image_service_client::ImageServiceClient;
use crate::cri::runtime_service_client::RuntimeServiceClient;
use crate::endpoint::unix_socket_path;
use crate::{Code, Error, Result, cri};

/// The CRI API version this client speaks, as `Version` must report it.
pub const CRI_API_VERSION: &str = "v1";
/// The kubelet's API version sent in `VersionRequest.version`, as the kubelet sends it.
pub const KUBELET_API_VERSION: &str = "0.1.0";
/// Largest message sent or accepted, as the kubelet uses (16 MiB).
pub const MAX_MESSAGE_SIZE: usize = 16 << 20;
/// Deadline of `PullImage` unless configured otherwise.
pub const DEFAULT_PULL_IMAGE_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The longest `grpc-timeout` header value: 99999999 hours.
const MAX_GRPC_TIMEOUT: Duration = Duration::from_secs(99_999_999 * 3600);

/// How a [`RemoteRuntime`] calls its runtime.
#[derive(Debug, Clone)]
pub struct RemoteConfig {
    /// Deadline of each call but `PullImage`, `GetContainerEvents`'s stream and `ExecSync`;
    /// `StopContainer` and `CheckpointContainer` get their request's `timeout` seconds on top.
    /// `ExecSync` gets it on top of its own `timeout`, and no deadline when that is 0 (the
    /// command may run as long as it likes), as the kubelet does.
    pub request_timeout: Duration,
    /// Deadline of `PullImage`.
    pub pull_image_timeout: Duration,
    /// How long establishing a connection to the socket may take.
    pub connect_timeout: Duration,
    /// Largest request sent and response accepted, in bytes.
    pub max_message_size: usize,
}

impl RemoteConfig {
    /// `timeout` for connecting and for each call; `PullImage` gets at least
    /// [`DEFAULT_PULL_IMAGE_TIMEOUT`].
    pub fn new(timeout: Duration) -> Self {
        RemoteConfig {
            request_timeout: timeout,
            pull_image_timeout: timeout.max(DEFAULT_PULL_IMAGE_TIMEOUT),
            connect_timeout: timeout,
            max_message_size: MAX_MESSAGE_SIZE,
        }
    }
}

/// A CRI v1 runtime at the other end of a unix socket. Cheap to clone (clones share the
/// connection); every method may be called concurrently.
#[derive(Clone)]
pub struct RemoteRuntime {
    endpoint: Arc<str>,
    cfg: Arc<RemoteConfig>,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    version: cri::VersionResponse,
}

impl std::fmt::Debug for RemoteRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteRuntime")
            .field("endpoint", &self.endpoint)
            .field("runtime", &self.version.runtime_name)
            .field("runtime_version", &self.version.runtime_version)
            .finish()
    }
}

/// Connects to the CRI runtime at `endpoint` (`unix:///path` or a plain path) with `timeout`
/// for connecting and per call; see [`RemoteRuntime::connect_with`].
pub async fn connect(endpoint: &str, timeout: Duration) -> Result<RemoteRuntime> {
    RemoteRuntime::connect_with(endpoint, RemoteConfig::new(timeout)).await
}

impl RemoteRuntime {
    /// Same as [`connect`].
    pub async fn connect(endpoint: &str, timeout: Duration) -> Result<RemoteRuntime> {
        Self::connect_with(endpoint, RemoteConfig::new(timeout)).await
    }

    /// Connects to the CRI runtime at `endpoint` and negotiates the version: `Version` must
    /// answer with API version `v1`.
    ///
    /// Fails with `InvalidArgument` for an endpoint that is not a unix socket, `Unavailable`
    /// when nothing listens on the socket, and otherwise with the failure's own code and a
    /// message saying the runtime does not speak CRI v1 (`Unimplemented` when the socket serves
    /// gRPC without `runtime.v1.RuntimeService`). Once connected, the channel reconnects by
    /// itself: after the runtime restarts, the calls made while it is down fail with
    /// `Unavailable` and later ones go to the new process.
    pub async fn connect_with(endpoint: &str, cfg: RemoteConfig) -> Result<RemoteRuntime> {
        let path = unix_socket_path(endpoint)?;
        // Tell "nothing there" apart from "something there that is not a CRI runtime".
        match tokio::time::timeout(cfg.connect_timeout, tokio::net::UnixStream::connect(&path))
            .await
        {
            Ok(Ok(_probe)) => {}
            Ok(Err(e)) => {
                return Err(Error::unavailable(format!(
                    "cannot connect to the CRI runtime at {endpoint}: {e}"
                ))
                .with_source(e));
            }
            Err(_) => {
                return Err(Error::unavailable(format!(
                    "cannot connect to the CRI runtime at {endpoint}: no answer within {:?}",
                    cfg.connect_timeout
                )));
            }
        }
        let channel = channel(path, &cfg);
        let mut rt = RemoteRuntime {
            endpoint: endpoint.into(),
            runtime: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(cfg.max_message_size)
                .max_encoding_message_size(cfg.max_message_size),
            images: ImageServiceClient::new(channel)
                .max_decoding_message_size(cfg.max_message_size)
                .max_encoding_message_size(cfg.max_message_size),
            cfg: Arc::new(cfg),
            version: cri::VersionResponse::default(),
        };
        let req = cri::VersionRequest {
            version: KUBELET_API_VERSION.to_string(),
        };
        let deadline = Some(rt.cfg.request_timeout);
        let mut client = rt.runtime.clone();
        let req = request("Version", req, deadline, rt.cfg.max_message_size)?;
        let version = unary("Version", deadline, client.version(req))
            .await
            .map_err(|e| {
                let why = match e.code() {
                    Code::Unimplemented => {
                        "it does not implement runtime.v1.RuntimeService/Version".to_string()
                    }
                    Code::DeadlineExceeded => format!("it did not answer Version in time ({e})"),
                    _ => format!("Version failed ({e})"),
                };
                Error::new(
                    e.code(),
                    format!("runtime at {endpoint} does not speak CRI {CRI_API_VERSION}: {why}"),
                )
            })?;
        if version.runtime_api_version != CRI_API_VERSION {
            return Err(Error::failed_precondition(format!(
                "runtime at {endpoint} does not speak CRI {CRI_API_VERSION}: it reports API \
                 version {:?} ({} {})",
                version.runtime_api_version, version.runtime_name, version.runtime_version
            )));
        }
        tracing::info!(
            "connected to CRI runtime {} {} at {endpoint}",
            version.runtime_name,
            version.runtime_version
        );
        rt.version = version;
        Ok(rt)
    }

    /// The endpoint this runtime was connected with.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// What `Version` answered when connecting.
    pub fn version_info(&self) -> &cri::VersionResponse {
        &self.version
    }

    /// The configuration calls are made with.
    pub fn config(&self) -> &RemoteConfig {
        &self.cfg
    }

    /// `msg` as a request for `rpc` (see [`request`]).
    fn request<T: prost::Message>(
        &self,
        rpc: &str,
        msg: T,
        deadline: Option<Duration>,
    ) -> Result<tonic::Request<T>> {
        request(rpc, msg, deadline, self.cfg.max_message_size)
    }

    /// The deadline of a call whose request allows `secs` more seconds.
    fn deadline(&self, secs: i64) -> Option<Duration> {
        Some(crate::rpcs::deadline(self.cfg.request_timeout, secs))
    }
}

/// A lazily connecting channel to the socket at `path`: it dials on first use and again
/// whenever the connection was lost.
fn channel(path: PathBuf, cfg: &RemoteConfig) -> Channel {
    let path = Arc::new(path);
    let connector = tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move {
            let io = tokio::net::UnixStream::connect(path.as_path()).await?;
            Ok::<_, std::io::Error>(TokioIo::new(io))
        }
    });
    // The URI is never dialled (the connector ignores it); it only sets `:authority`.
    Endpoint::from_static("http://localhost")
        .connect_timeout(cfg.connect_timeout)
        .connect_with_connector_lazy(connector)
}

/// A request carrying `deadline` as its `grpc-timeout`, so the runtime knows it too. A
/// message larger than `max` bytes is refused here with `ResourceExhausted` (as grpc-go does):
/// sent anyway, it would only come back as an HTTP/2 protocol error.
fn request<T: prost::Message>(
    rpc: &str,
    msg: T,
    deadline: Option<Duration>,
    max: usize,
) -> Result<tonic::Request<T>> {
    let len = msg.encoded_len();
    if len > max {
        return Err(Error::resource_exhausted(format!(
            "{rpc}: the request is {len} bytes, more than the {max} bytes a CRI message may have"
        )));
    }
    let mut req = tonic::Request::new(msg);
    if let Some(d) = deadline {
        // gRPC timeouts have at most 8 digits (tonic panics beyond 99999999 hours).
        req.set_timeout(d.min(MAX_GRPC_TIMEOUT));
    }
    Ok(req)
}

/// Awaits a call, bounded by `deadline` on this side as well, and converts its status.
async fn unary<T>(
    rpc: &str,
    deadline: Option<Duration>,
    call: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T> {
    let result = match deadline {
        Some(d) => tokio::time::timeout(d, call)
            .await
            .map_err(|_| expired(rpc, d))?,
        None => call.await,
    };
    result
        .map(tonic::Response::into_inner)
        .map_err(|status| status_error(rpc, deadline, status))
}

fn expired(rpc: &str, deadline: Duration) -> Error {
    Error::deadline_exceeded(format!("{rpc} did not complete within {deadline:?}"))
}

/// A status as an [`Error`]. A status the runtime sent is kept as it is. One tonic made up on
/// this side (it then carries its cause) reports a transport failure: the deadline expiring
/// becomes `DeadlineExceeded` (tonic says `Cancelled`), a lost or refused connection
/// `Unavailable` (tonic says `Unknown` or `Internal` for most, and `Cancelled` for a request
/// handed to a connection that closed under it), so callers can tell them from the runtime's
/// own answers and retry.
fn status_error(rpc: &str, deadline: Option<Duration>, status: tonic::Status) -> Error {
    use std::error::Error as _;
    let Some(cause) = status.source() else {
        return Error::from(status);
    };
    let mut chain = Some(cause);
    while let Some(err) = chain {
        if err.downcast_ref::<tonic::TimeoutExpired>().is_some() {
            return match deadline {
                Some(d) => expired(rpc, d),
                None => Error::deadline_exceeded(format!("{rpc}: {}", status.message())),
            };
        }
        chain = err.source();
    }
    match status.code() {
        tonic::Code::Unknown
        | tonic::Code::Internal
        | tonic::Code::Unavailable
        | tonic::Code::Cancelled => Error::unavailable(format!(
            "{rpc}: connection to the CRI runtime failed: {}",
            status.message()
        )),
        _ => Error::from(status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made_here(code: tonic::Code, cause: std::io::Error) -> tonic::Status {
        let mut s = tonic::Status::new(code, "transport");
        s.set_source(Arc::new(cause));
        s
    }

    #[test]
    fn transport_failures_made_on_this_side_are_unavailable() {
        // A request handed to a connection that closed under it: hyper cancels it and tonic
        // says `Cancelled`; the runtime is gone, not the caller's deadline.
        for code in [
            tonic::Code::Cancelled,
            tonic::Code::Unknown,
            tonic::Code::Internal,
            tonic::Code::Unavailable,
        ] {
            let e = status_error("Status", None, made_here(code, std::io::Error::other("x")));
            assert_eq!(e.code(), Code::Unavailable, "{code:?}: {e}");
        }
        // The runtime's own answers keep their code.
        for code in [tonic::Code::Cancelled, tonic::Code::Unknown] {
            let said = tonic::Status::new(code, "said so");
            let want = Error::from(said.clone()).code();
            let e = status_error("Status", None, said);
            assert_eq!(e.code(), want, "{e}");
            assert_ne!(e.code(), Code::Unavailable, "{e}");
        }
    }
}
