//! The CRI streaming server: `Exec`, `Attach` and `PortForward` answer with a URL on this
//! server, and the client (kubectl through the kubelet, crictl) then connects there and speaks
//! the Kubernetes streaming protocols over WebSocket.
//!
//! Each request is parked in a [`cache`] under a random single-use token that expires after a
//! minute; the URL is `http://<addr>/exec/<token>` (`/attach/`, `/portforward/`). What the
//! server then runs goes through a [`Backend`], so no runtime detail reaches the protocol code:
//! - [`remotecommand`]: exec and attach over `v5.channel.k8s.io` / `v4.channel.k8s.io`;
//! - [`portforward`]: port-forward over `v4.channel.k8s.io` (ports in `?port=` parameters);
//! - [`spdy`]: both over SPDY/3.1 (`v4.channel.k8s.io`, `portforward.k8s.io`), which kubectl
//!   through an API server and older clients use.

pub mod cache;
pub mod portforward;
pub mod remotecommand;
pub mod spdy;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ws::WebSocketUpgrade;
use axum::extract::{FromRequestParts, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::ListenerExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use cache::{Cache, Pending};
use runtime_types::{Error, Result, cri};

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
            .route("/exec/{token}", get(exec).post(exec))
            .route("/attach/{token}", get(attach).post(attach))
            .route("/portforward/{token}", get(port_forward).post(port_forward))
            .with_state(shared);
        let task = tokio::spawn(async move {
            // A stream's small writes (a keystroke's echo) go out at once, not after the
            // client's delayed ACK.
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
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

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "unknown or expired token\n").into_response()
}

fn consume(shared: &Shared, token: &str) -> Option<Pending> {
    cache::lock(&shared.cache).consume(token, Instant::now())
}

/// How the client wants to talk: WebSocket, SPDY/3.1, or neither.
enum Transport {
    WebSocket(WebSocketUpgrade),
    Spdy(Request),
}

/// The transport a request upgrades to, or the refusal to send.
async fn transport(req: Request, spdy_protocol: &str) -> std::result::Result<Transport, Response> {
    let upgrade = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    if upgrade.eq_ignore_ascii_case("websocket") {
        let (mut parts, _) = req.into_parts();
        return WebSocketUpgrade::from_request_parts(&mut parts, &())
            .await
            .map(Transport::WebSocket)
            .map_err(IntoResponse::into_response);
    }
    if upgrade.eq_ignore_ascii_case(spdy::UPGRADE) {
        let offered = req
            .headers()
            .get_all(spdy::PROTOCOL_HEADER)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|p| p.trim() == spdy_protocol);
        if !offered {
            return Err((
                StatusCode::FORBIDDEN,
                [(spdy::PROTOCOL_HEADER, spdy_protocol)],
                format!(
                    "unable to upgrade: no common protocol; the server supports {spdy_protocol}\n"
                ),
            )
                .into_response());
        }
        return Ok(Transport::Spdy(req));
    }
    Err((
        StatusCode::BAD_REQUEST,
        "this streaming server needs an upgrade to WebSocket or SPDY/3.1\n",
    )
        .into_response())
}

/// Answers 101 and runs `serve` on the upgraded SPDY connection.
fn spdy_upgrade<F, Fut>(mut req: Request, protocol: &'static str, serve: F) -> Response
where
    F: FnOnce(hyper_util::rt::TokioIo<hyper::upgrade::Upgraded>) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => serve(hyper_util::rt::TokioIo::new(upgraded)).await,
            Err(e) => tracing::debug!("spdy upgrade failed: {e}"),
        }
    });
    (
        StatusCode::SWITCHING_PROTOCOLS,
        [
            (header::CONNECTION, "Upgrade"),
            (header::UPGRADE, spdy::UPGRADE),
            (
                header::HeaderName::from_static("x-stream-protocol-version"),
                protocol,
            ),
        ],
    )
        .into_response()
}

fn remotecommand_session(req: Pending) -> Option<remotecommand::Session> {
    let streams = |stdin, stdout, stderr, tty| remotecommand::Streams {
        stdin,
        stdout,
        stderr,
        tty,
    };
    match req {
        Pending::Exec(r) => Some(remotecommand::Session::Exec {
            container_id: r.container_id,
            cmd: r.cmd,
            streams: streams(r.stdin, r.stdout, r.stderr, r.tty),
        }),
        Pending::Attach(r) => Some(remotecommand::Session::Attach {
            container_id: r.container_id,
            streams: streams(r.stdin, r.stdout, r.stderr, r.tty),
        }),
        Pending::PortForward(_) => None,
    }
}

async fn serve_remotecommand(
    shared: Arc<Shared>,
    pending: Option<Pending>,
    req: Request,
) -> Response {
    let Some(session) = pending.and_then(remotecommand_session) else {
        return not_found();
    };
    let backend = shared.backend.clone();
    match transport(req, spdy::remotecommand::PROTOCOL).await {
        Ok(Transport::WebSocket(ws)) => remotecommand::upgrade(ws, session, backend),
        Ok(Transport::Spdy(req)) => spdy_upgrade(req, spdy::remotecommand::PROTOCOL, move |io| {
            spdy::remotecommand::serve(io, session, backend)
        }),
        Err(refusal) => refusal,
    }
}

async fn exec(
    State(shared): State<Arc<Shared>>,
    Path(token): Path<String>,
    req: Request,
) -> Response {
    let pending = consume(&shared, &token).filter(|p| matches!(p, Pending::Exec(_)));
    serve_remotecommand(shared, pending, req).await
}

async fn attach(
    State(shared): State<Arc<Shared>>,
    Path(token): Path<String>,
    req: Request,
) -> Response {
    let pending = consume(&shared, &token).filter(|p| matches!(p, Pending::Attach(_)));
    serve_remotecommand(shared, pending, req).await
}

async fn port_forward(
    State(shared): State<Arc<Shared>>,
    Path(token): Path<String>,
    req: Request,
) -> Response {
    let Some(Pending::PortForward(pf)) = consume(&shared, &token) else {
        return not_found();
    };
    let backend = shared.backend.clone();
    let query = req.uri().query().unwrap_or("").to_string();
    match transport(req, spdy::portforward::PROTOCOL).await {
        Ok(Transport::WebSocket(ws)) => match portforward::query_ports(&query) {
            Ok(ports) => portforward::upgrade(ws, pf.pod_sandbox_id, ports, backend),
            Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
        },
        Ok(Transport::Spdy(req)) => spdy_upgrade(req, spdy::portforward::PROTOCOL, move |io| {
            spdy::portforward::serve(io, pf.pod_sandbox_id, backend)
        }),
        Err(refusal) => refusal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A backend that must never be reached.
    struct Unreachable;

    #[async_trait::async_trait]
    impl Backend for Unreachable {
        async fn exec(&self, _: &str, _: Vec<String>, _: StreamIo) -> Result<i32> {
            panic!("exec reached the backend")
        }
        async fn port_forward(&self, _: &str, _: u16) -> Result<Box<dyn Duplex>> {
            panic!("port_forward reached the backend")
        }
    }

    async fn server(ttl: Duration) -> Server {
        let cfg = Config {
            token_ttl: ttl,
            ..Config::default()
        };
        Server::start(cfg, Arc::new(Unreachable)).await.unwrap()
    }

    /// The status code of a plain HTTP/1.1 GET (no upgrade) of `url`.
    async fn get(url: &str) -> u16 {
        let rest = url.strip_prefix("http://").unwrap();
        let (host, path) = rest.split_once('/').unwrap();
        let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
        let req = format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).await.unwrap();
        resp.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    fn exec_req() -> cri::ExecRequest {
        cri::ExecRequest {
            container_id: "c".into(),
            cmd: vec!["true".into()],
            stdout: true,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn urls_are_single_use_and_need_an_upgrade() {
        let s = server(Duration::from_secs(60)).await;
        let url = s.get_exec(exec_req()).unwrap().url;
        assert!(
            url.starts_with(&format!("http://{}/exec/", s.addr())),
            "{url}"
        );
        assert_eq!(get(&url).await, 400, "no upgrade asked for");
        assert_eq!(get(&url).await, 404, "the token was used");
        // A token is only good on its own kind of path.
        let url = s.get_exec(exec_req()).unwrap().url;
        assert_eq!(get(&url.replace("/exec/", "/portforward/")).await, 404);
    }

    #[tokio::test]
    async fn expired_urls_are_not_found() {
        let s = server(Duration::from_millis(1)).await;
        let url = s.get_exec(exec_req()).unwrap().url;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(get(&url).await, 404);
    }

    #[tokio::test]
    async fn requests_are_validated_like_upstream() {
        let s = server(Duration::from_secs(60)).await;
        let bad = |f: fn(&mut cri::ExecRequest)| {
            let mut r = exec_req();
            f(&mut r);
            s.get_exec(r).unwrap_err().code()
        };
        assert_eq!(bad(|r| r.cmd.clear()), runtime_types::Code::InvalidArgument);
        assert_eq!(
            bad(|r| r.container_id.clear()),
            runtime_types::Code::InvalidArgument
        );
        assert_eq!(
            bad(|r| r.stdout = false),
            runtime_types::Code::InvalidArgument
        );
        assert_eq!(
            bad(|r| {
                r.tty = true;
                r.stderr = true
            }),
            runtime_types::Code::InvalidArgument
        );
        let err = s
            .get_port_forward(cri::PortForwardRequest::default())
            .unwrap_err();
        assert_eq!(err.code(), runtime_types::Code::InvalidArgument);
    }
}
