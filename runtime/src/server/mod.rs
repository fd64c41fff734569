//! The CRI v1 gRPC server (feature `server`): exposes any `Arc<dyn RuntimeService>` and
//! `Arc<dyn ImageService>` as `runtime.v1.RuntimeService` and `runtime.v1.ImageService` on a
//! unix socket, for crictl, a kubelet, or a nodelet using the remote backend. It owns the
//! socket (stale-file removal, parent dir, mode 0660, removal on exit), the per-RPC deadlines,
//! the message size limits and the shutdown; what each RPC does is entirely the runtime's
//! (a request missing its config comes back as whatever the runtime says: `InvalidArgument`).

mod adapter;
mod authority;
mod conn;

/// Entry points for the fuzz targets (`tests/fuzz`), not part of the crate's API: thin
/// wrappers of internal types, with no behaviour of their own.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::authority::Broken;

    /// The HTTP/2 `:authority` rewriter every CRI connection's client bytes pass through.
    #[derive(Default)]
    pub struct AuthorityRewriter(super::authority::Rewriter);

    impl AuthorityRewriter {
        /// Feeds bytes read from the client; an error means the connection would be closed.
        pub fn feed(&mut self, bytes: &[u8]) -> Result<(), Broken> {
            self.0.feed(bytes)
        }

        /// Takes all the output so far (what the HTTP/2 server would read).
        pub fn take_output(&mut self) -> Vec<u8> {
            let mut out = Vec::new();
            let mut buf = [0u8; 4096];
            while self.0.has_output() {
                let n = self.0.drain_into(&mut buf);
                out.extend_from_slice(&buf[..n]);
            }
            out
        }
    }
}

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::watch;

use crate::cri::image_service_server::ImageServiceServer;
use crate::cri::runtime_service_server::RuntimeServiceServer;
use crate::{Error, ImageService, Result, RuntimeService};
use adapter::{ImageAdapter, RuntimeAdapter};
use conn::{CloseOnDrop, Tracker};

/// Deadline of every RPC but `PullImage` (the kubelet's default runtime request timeout).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2 * 60);
/// Deadline of `PullImage`.
pub const DEFAULT_PULL_IMAGE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Largest message accepted or sent, as containerd and the kubelet use (16 MiB).
pub const MAX_MESSAGE_SIZE: usize = 16 << 20;
/// Permissions of the socket: owner and group may call the runtime.
pub const SOCKET_MODE: u32 = 0o660;

/// How the server treats calls.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Deadline of each RPC except `PullImage`; `StopContainer`, `ExecSync` and
    /// `CheckpointContainer` get their request's own `timeout` seconds on top. A client's
    /// shorter `grpc-timeout` wins.
    pub request_timeout: Duration,
    /// Deadline of `PullImage`.
    pub pull_image_timeout: Duration,
    /// Largest request decoded and response encoded, in bytes.
    pub max_message_size: usize,
    /// After shutdown is requested, how long calls in flight may take before their
    /// connections are closed.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            pull_image_timeout: DEFAULT_PULL_IMAGE_TIMEOUT,
            max_message_size: MAX_MESSAGE_SIZE,
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Serves `runtime` and `images` on the unix socket `path` with the default [`ServerConfig`]
/// until `shutdown` completes. See [`serve_unix_with`].
pub async fn serve_unix(
    path: &Path,
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    serve_unix_with(path, runtime, images, ServerConfig::default(), shutdown).await
}

/// Serves `runtime` and `images` on the unix socket `path` until `shutdown` completes:
/// [`bind_unix`] then [`serve`].
pub async fn serve_unix_with(
    path: &Path,
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    serve(bind_unix(path)?, runtime, images, config, shutdown).await
}

/// A unix socket bound by [`bind_unix`], ready for [`serve`].
#[derive(Debug)]
pub struct BoundSocket {
    listener: UnixListener,
    path: PathBuf,
    /// Device and inode of the socket file, to remove only our own on exit.
    inode: Option<(u64, u64)>,
}

impl BoundSocket {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Binds the unix socket `path`: creates the parent directory, replaces a stale socket file
/// (one nobody listens on), and refuses a live socket (`AlreadyExists`: another server is
/// running) or a path that is not a socket. The socket gets mode [`SOCKET_MODE`]. Must be
/// called within a tokio runtime. Binding before building the runtime lets a second server
/// fail before it touches anything.
pub fn bind_unix(path: &Path) -> Result<BoundSocket> {
    let shown = path.display();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::internal(format!("creating {}: {e}", dir.display())))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(Error::already_exists(format!(
                    "{shown} is in use: another server is listening on it"
                )));
            }
            std::fs::remove_file(path)
                .map_err(|e| Error::internal(format!("removing stale socket {shown}: {e}")))?;
        }
        Ok(_) => {
            return Err(Error::already_exists(format!(
                "{shown} exists and is not a socket; not replacing it"
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::internal(format!("inspecting {shown}: {e}"))),
    }
    let listener =
        UnixListener::bind(path).map_err(|e| Error::internal(format!("binding {shown}: {e}")))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .map_err(|e| Error::internal(format!("setting the mode of {shown}: {e}")))?;
    Ok(BoundSocket {
        listener,
        path: path.to_path_buf(),
        inode: file_id(path),
    })
}

fn file_id(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).map(|m| (m.dev(), m.ino())).ok()
}

/// Serves `runtime` and `images` on `socket` until `shutdown` completes, then removes the
/// socket file (unless something else has replaced it meanwhile).
///
/// After `shutdown`, calls in flight get `config.shutdown_grace` to finish and event streams
/// end; then every connection is closed. Dropping the returned future instead stops serving at
/// once, closing every connection like a crash would (the socket file stays, stale).
pub async fn serve(
    socket: BoundSocket,
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let BoundSocket {
        listener,
        path,
        inode,
    } = socket;
    tracing::info!("serving CRI v1 on {}", path.display());
    let served = serve_listener(listener, runtime, images, config, shutdown).await;
    if inode.is_some() && file_id(&path) == inode {
        let _ = std::fs::remove_file(&path);
    }
    served
}

/// Serves on a listener until `shutdown` completes (see [`serve`]).
async fn serve_listener(
    listener: UnixListener,
    runtime: Arc<dyn RuntimeService>,
    images: Arc<dyn ImageService>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<()> {
    let cfg = Arc::new(config);
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_tx = Arc::new(stop_tx);
    let tracker = Tracker::default();
    let _close = CloseOnDrop(tracker.clone());

    let runtime = RuntimeServiceServer::new(RuntimeAdapter {
        inner: runtime,
        cfg: cfg.clone(),
        stopping: stop_rx.clone(),
    })
    .max_decoding_message_size(cfg.max_message_size)
    .max_encoding_message_size(cfg.max_message_size);
    let images = ImageServiceServer::new(ImageAdapter {
        inner: images,
        cfg: cfg.clone(),
    })
    .max_decoding_message_size(cfg.max_message_size)
    .max_encoding_message_size(cfg.max_message_size);

    let incoming = futures::stream::unfold((listener, tracker.clone()), |(l, t)| async move {
        let conn = match l.accept().await {
            Ok((io, _)) => Ok(t.track(io)),
            Err(e) => {
                // Typically EMFILE: back off instead of spinning on the accept loop.
                tracing::warn!("CRI server: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err(e)
            }
        };
        Some((conn, (l, t)))
    });
    let signal = {
        let stop_tx = stop_tx.clone();
        async move {
            shutdown.await;
            stop_tx.send_replace(true);
        }
    };
    let serve = tonic::transport::Server::builder()
        .add_service(runtime)
        .add_service(images)
        .serve_with_incoming_shutdown(incoming, signal);
    let mut stopping = stop_rx;
    let grace = cfg.shutdown_grace;
    let overdue = async move {
        let _ = stopping.wait_for(|stop| *stop).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        served = serve => served.map_err(|e| Error::internal(format!("serving CRI: {e}")))?,
        () = overdue => {
            tracing::warn!(
                "CRI server: {} connection(s) still busy {grace:?} after shutdown; closing them",
                tracker.open()
            );
        }
    }
    drop(stop_tx);
    Ok(())
}
