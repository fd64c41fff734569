//! The CRI streaming server: `Exec`, `Attach` and `PortForward` answer with a URL on this
//! server, and the client (kubectl through the kubelet, crictl) then connects there and speaks
//! the Kubernetes streaming protocols over WebSocket.
//!
//! Each request is parked in a [`cache`] under a random single-use token that expires after a
//! minute; the URL is `http://<addr>/exec/<token>` (`/attach/`, `/portforward/`). What the
//! server then runs goes through a [`Backend`], so no runtime detail reaches the protocol code:
//! - [`remotecommand`]: exec and attach over `v5.channel.k8s.io` / `v4.channel.k8s.io`;
//! - [`portforward`]: port-forward over `v4.channel.k8s.io` (ports in `?port=` parameters).

pub mod cache;
pub mod portforward;
pub mod remotecommand;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use crate::{Error, Result, cri};
use cache::{Cache, Pending};

/// A terminal's size, as the resize channel carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TermSize {
    #[serde(rename = "Width")]
    pub width: u16,
    #[serde(rename = "Height")]
    pub height: u16,
}

/// A byte stream both ways (a forwarded port's connection).
pub trait Duplex: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Duplex for T {}

/// The client's side of an exec or attach: each stream is present when the request asked for
/// it. With a terminal there is no stderr (it goes to stdout) and resizes arrive on `resize`.
pub struct StreamIo {
    pub stdin: Option<Box<dyn AsyncRead + Send + Unpin>>,
    pub stdout: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    pub stderr: Option<Box<dyn AsyncWrite + Send + Unpin>>,
    pub tty: bool,
    pub resize: mpsc::Receiver<TermSize>,
}

/// What the streaming server drives: a runtime's exec, attach and port-forward.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Runs `cmd` in a container on `io` and returns its exit code once it has exited and its
    /// output has been written out.
    async fn exec(&self, container_id: &str, cmd: Vec<String>, io: StreamIo) -> Result<i32>;

    /// Connects `io` to a running container's own stdio until the container exits or the
    /// client goes away.
    async fn attach(&self, container_id: &str, io: StreamIo) -> Result<()> {
        let _ = (container_id, io);
        Err(Error::unimplemented(
            "attach is not supported by this runtime",
        ))
    }

    /// A connection to `port` on the loopback address inside a pod's network namespace.
    async fn port_forward(&self, pod_sandbox_id: &str, port: u16) -> Result<Box<dyn Duplex>>;
}

/// How the streaming server is set up.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it listens; port 0 picks a free one (the URLs carry the real port).
    pub addr: SocketAddr,
    /// How long a URL stays valid before it is used (upstream: one minute).
    pub token_ttl: Duration,
    /// Most requests waiting for their client at once.
    pub max_in_flight: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            token_ttl: Duration::from_secs(60),
            max_in_flight: 1000,
        }
    }
}

/// A running streaming server; it stops when dropped.
pub struct Server {
    addr: SocketAddr,
    cache: Arc<Mutex<Cache>>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    cache: Arc<Mutex<Cache>>,
    backend: Arc<dyn Backend>,
}

impl Server {
    /// Binds `cfg.addr` and serves in a background task.
    pub async fn start(cfg: Config, backend: Arc<dyn Backend>) -> Result<Server> {
        let listener = tokio::net::TcpListener::bind(cfg.addr).await.map_err(|e| {
            Error::internal(format!("binding the streaming server to {}: {e}", cfg.addr))
        })?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::internal(format!("streaming server address: {e}")))?;
        let cache = Arc::new(Mutex::new(Cache::new(cfg.token_ttl, cfg.max_in_flight)));
        let shared = Arc::new(Shared {
            cache: cache.clone(),
            backend,
        });
        let app = Router::new()
            .route("/exec/{token}", get(exec))
            .route("/attach/{token}", get(attach))
            .route("/portforward/{token}", get(port_forward))
            .with_state(shared);
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!("streaming server: {e}");
            }
        });
        tracing::info!(%addr, "streaming server listening");
        Ok(Server { addr, cache, task })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn url(&self, kind: &str, pending: Pending) -> Result<String> {
        let token = cache::lock(&self.cache).insert(pending, Instant::now())?;
        Ok(format!("http://{}/{kind}/{token}", self.addr))
    }

    /// Validates an Exec request and returns the URL that runs it.
    pub fn get_exec(&self, req: cri::ExecRequest) -> Result<cri::ExecResponse> {
        if req.container_id.is_empty() {
            return Err(Error::invalid_argument("missing required container_id"));
        }
        if req.cmd.is_empty() {
            return Err(Error::invalid_argument("cmd must not be empty"));
        }
        check_streams(req.tty, req.stdin, req.stdout, req.stderr)?;
        let url = self.url("exec", Pending::Exec(req))?;
        Ok(cri::ExecResponse { url })
    }

    /// Validates an Attach request and returns the URL that serves it.
    pub fn get_attach(&self, req: cri::AttachRequest) -> Result<cri::AttachResponse> {
        if req.container_id.is_empty() {
            return Err(Error::invalid_argument("missing required container_id"));
        }
        check_streams(req.tty, req.stdin, req.stdout, req.stderr)?;
        let url = self.url("attach", Pending::Attach(req))?;
        Ok(cri::AttachResponse { url })
    }

    /// Validates a PortForward request and returns the URL that serves it.
    pub fn get_port_forward(
        &self,
        req: cri::PortForwardRequest,
    ) -> Result<cri::PortForwardResponse> {
        if req.pod_sandbox_id.is_empty() {
            return Err(Error::invalid_argument("missing required pod_sandbox_id"));
        }
        let url = self.url("portforward", Pending::PortForward(req))?;
        Ok(cri::PortForwardResponse { url })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The stream combinations upstream accepts.
fn check_streams(tty: bool, stdin: bool, stdout: bool, stderr: bool) -> Result<()> {
    if tty && stderr {
        return Err(Error::invalid_argument(
            "tty and stderr cannot both be true",
        ));
    }
    if !stdin && !stdout && !stderr {
        return Err(Error::invalid_argument(
            "one of stdin, stdout, or stderr must be set",
        ));
    }
    Ok(())
}

type Upgrade = std::result::Result<WebSocketUpgrade, WebSocketUpgradeRejection>;

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "unknown or expired token\n").into_response()
}

fn not_websocket(e: WebSocketUpgradeRejection) -> Response {
    (
        StatusCode::BAD_REQUEST,
        format!("this streaming server speaks WebSocket only: {e}\n"),
    )
        .into_response()
}

fn consume(shared: &Shared, token: &str) -> Option<Pending> {
    cache::lock(&shared.cache).consume(token, Instant::now())
}

async fn exec(
    State(shared): State<Arc<Shared>>,
    Path(token): Path<String>,
    ws: Upgrade,
) -> Response {
    let Some(Pending::Exec(req)) = consume(&shared, &token) else {
        return not_found();
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => return not_websocket(e),
    };
    let session = remotecommand::Session::Exec {
        container_id: req.container_id,
        cmd: req.cmd,
        streams: remotecommand::Streams {
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
            tty: req.tty,
        },
    };
    remotecommand::upgrade(ws, session, shared.backend.clone())
}

async fn attach(
    State(shared): State<Arc<Shared>>,
    Path(token): Path<String>,
    ws: Upgrade,
) -> Response {
    let Some(Pending::Attach(req)) = consume(&shared, &token) else {
        return not_found();
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => return not_websocket(e),
    };
    let session = remotecommand::Session::Attach {
        container_id: req.container_id,
        streams: remotecommand::Streams {
            stdin: req.stdin,
            stdout: req.stdout,
            stderr: req.stderr,
            tty: req.tty,
        },
    };
    remotecommand::upgrade(ws, session, shared.backend.clone())
}

async fn port_forward(
    State(shared): State<Arc<Shared>>,
    Path(token): Path<String>,
    RawQuery(query): RawQuery,
    ws: Upgrade,
) -> Response {
    let Some(Pending::PortForward(req)) = consume(&shared, &token) else {
        return not_found();
    };
    let ports = match portforward::query_ports(query.as_deref().unwrap_or("")) {
        Ok(p) => p,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => return not_websocket(e),
    };
    portforward::upgrade(ws, req.pod_sandbox_id, ports, shared.backend.clone())
}
