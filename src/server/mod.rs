//! The kubelet's HTTPS server (upstream `pkg/kubelet/server`): on `address`:`port` (10250),
//! TLS with HTTP/2 and HTTP/1.1, every request authenticated and authorized ([`auth`]) before
//! its handler; and the plain HTTP healthz server on `healthzBindAddress`:`healthzPort`.
//!
//! Served: `/healthz`, `/pods`, `/runningpods/`, `/configz`,
//! `/containerLogs/{ns}/{pod}/{container}`, `/exec`, `/attach`, `/portForward` proxied to the
//! runtime's streaming server, `/run` and `/logs/` ([`stream`]), `/metrics*` and
//! `/stats/summary` ([`scrape`]). The other endpoints of the upstream kubelet (the other
//! `/stats/*` paths, `/checkpoint`, `/debug`) answer 501 with the reason until they are built:
//! never an empty or made-up answer. With `readOnlyPort`, a plain HTTP server serves what only
//! reads ([`read_routes`]).

pub mod auth;
pub mod cadvisor;
pub mod logs;
pub mod resource;
mod scrape;
mod stream;
pub mod summary;
pub mod tls;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use runtime::{RuntimeService, cri};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::config::ServerConfig;
use crate::status_manager::StatusManager;
use auth::{Auth, Refused};

/// What the server reads.
pub struct ServerDeps {
    pub cfg: ServerConfig,
    pub node_name: String,
    pub node_ips: Vec<IpAddr>,
    pub root_dir: PathBuf,
    /// Where the self-signed serving certificate is kept (`--cert-dir`).
    pub cert_dir: PathBuf,
    /// With `serverTLSBootstrap`: the certificate a CSR got, read at every handshake.
    pub serving: Option<Arc<crate::certificate::ServingSlot>>,
    pub pod_logs_dir: PathBuf,
    pub client: Option<kube::Client>,
    pub rt: Arc<dyn RuntimeService>,
    pub images: Arc<dyn runtime::ImageService>,
    /// The pods the kubelet runs (from its sources).
    pub pods: watch::Receiver<Arc<Vec<Pod>>>,
    pub status: Arc<StatusManager>,
    /// What `/logs/` serves (`/var/log`).
    pub system_log_dir: PathBuf,
    /// The effective configuration as a `KubeletConfiguration`, for `/configz`.
    pub configz: serde_json::Value,
    /// The kubelet's health: `Err(why)` when the sync loop or the PLEG is not healthy.
    pub health: Arc<dyn Fn() -> Result<(), Unhealthy> + Send + Sync>,
}

/// The ports bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub port: u16,
    pub healthz_port: Option<u16>,
}

struct Ctx {
    deps: ServerDeps,
    auth: Auth,
}

/// The verified client certificate's user of a connection.
#[derive(Clone, Default)]
struct Peer(Option<(String, Vec<String>)>);

/// Why the servers could not start. Each message names what failed; the cause is the source,
/// so a chain printed with `{:#}` reads `what: cause`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration asks for the API server's reviews on a node without one.
    #[error(transparent)]
    Auth(#[from] auth::NeedsApiServer),
    #[error(transparent)]
    Tls(#[from] tls::Error),
    /// `serverTLSBootstrap` on a node without an API server to send the CSR to.
    #[error(
        "serverTLSBootstrap needs an API server (--kubeconfig) to get the serving certificate from"
    )]
    TlsBootstrapStandalone,
    /// A port could not be bound; `server` names which server's.
    #[error("binding the {server} on {addr}")]
    Bind {
        server: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// A bound listener's address could not be read.
    #[error(transparent)]
    LocalAddr(std::io::Error),
}

/// Why the kubelet is not healthy, as `/healthz` reports it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unhealthy(pub String);

/// Binds the servers and spawns them into `tasks`; stops with `cancel`.
pub async fn start(
    deps: ServerDeps,
    tasks: &mut JoinSet<()>,
    cancel: CancellationToken,
) -> Result<Bound, Error> {
    let auth = Auth::new(
        deps.cfg.clone(),
        deps.node_name.clone(),
        deps.client.clone(),
    );
    auth.check()?;
    let tls = tls::server_config(
        &deps.cfg,
        &deps.cert_dir,
        &deps.node_name,
        &deps.node_ips,
        deps.serving.clone(),
    )?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let addr = SocketAddr::new(deps.cfg.address, deps.cfg.port);
    let listener = bind("kubelet server", addr).await?;
    let port = listener.local_addr().map_err(Error::LocalAddr)?.port();
    let healthz = bind_unless_off(
        "healthz server",
        deps.cfg.healthz_address,
        deps.cfg.healthz_port,
    )
    .await?;
    let healthz_port = match &healthz {
        Some(l) => Some(l.local_addr().map_err(Error::LocalAddr)?.port()),
        None => None,
    };
    let read_only = bind_unless_off(
        "read-only kubelet server",
        deps.cfg.address,
        deps.cfg.read_only_port,
    )
    .await?;
    let ctx = Arc::new(Ctx { deps, auth });
    tracing::info!(%addr, port, "kubelet server listening");
    if let Some(l) = read_only {
        // Upstream's read-only server: plain HTTP, no authentication or authorization, and
        // only what reads (health, pods, metrics, stats); never logs, exec, attach,
        // port-forward, run or the configuration.
        tracing::warn!(addr = ?l.local_addr().ok(), "serving the unauthenticated read-only port (readOnlyPort)");
        serve_plain(tasks, l, read_only_router(ctx.clone()), cancel.clone());
    }
    let router = router(ctx.clone());
    tasks.spawn(serve_tls(listener, acceptor, router, cancel.clone()));
    if let Some(l) = healthz {
        let app = axum::Router::new()
            .route("/healthz", get(healthz_handler))
            .with_state(ctx);
        serve_plain(tasks, l, app, cancel.clone());
    }
    Ok(Bound { port, healthz_port })
}

/// Binds `addr` for the `server` named.
async fn bind(server: &'static str, addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr).await.map_err(|source| Error::Bind {
        server,
        addr,
        source,
    })
}

/// Binds `ip`:`port` for the `server` named, unless `port` is 0: that server is off.
async fn bind_unless_off(
    server: &'static str,
    ip: IpAddr,
    port: u16,
) -> Result<Option<TcpListener>, Error> {
    if port == 0 {
        return Ok(None);
    }
    bind(server, SocketAddr::new(ip, port)).await.map(Some)
}

/// For the fuzz targets (tests/fuzz): the kubelet API's router over `deps`, without TLS or
/// listening, so arbitrary requests can be handed to it. Not part of nodelet's API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// The router `start` serves, its authentication and authorization from `deps.cfg`.
    pub fn router(deps: ServerDeps) -> Result<axum::Router, Error> {
        let auth = Auth::new(
            deps.cfg.clone(),
            deps.node_name.clone(),
            deps.client.clone(),
        );
        auth.check()?;
        Ok(super::router(Arc::new(Ctx { deps, auth })))
    }
}

/// Serves `app` over plain HTTP on `listener` until `cancel`.
fn serve_plain(
    tasks: &mut JoinSet<()>,
    listener: TcpListener,
    app: axum::Router,
    cancel: CancellationToken,
) {
    tasks.spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { cancel.cancelled().await })
            .await;
    });
}

/// What only reads: health, pods, metrics and the Summary API. Upstream's read-only port
/// serves exactly these; the main server serves them among the rest.
fn read_routes() -> axum::Router<Arc<Ctx>> {
    axum::Router::new()
        .route("/healthz", get(healthz_handler))
        .route("/pods", get(pods_handler))
        .route("/pods/", get(pods_handler))
        .route("/metrics", get(scrape::metrics_handler))
        .route("/metrics/probes", get(scrape::probe_metrics_handler))
        .route("/metrics/resource", get(scrape::resource_metrics_handler))
        .route("/metrics/cadvisor", get(scrape::cadvisor_metrics_handler))
        .route("/stats/summary", get(scrape::summary_handler))
}

/// The read-only server's routes.
fn read_only_router(ctx: Arc<Ctx>) -> axum::Router {
    read_routes().fallback(read_only_fallback).with_state(ctx)
}

async fn read_only_fallback(uri: axum::http::Uri) -> Response {
    text(
        StatusCode::NOT_FOUND,
        format!("{}: not served on the read-only port", uri.path()),
    )
}

fn router(ctx: Arc<Ctx>) -> axum::Router {
    read_routes()
        .route("/runningpods/", get(running_pods_handler))
        .route("/configz", get(configz_handler))
        .route(
            "/containerLogs/{ns}/{pod}/{container}",
            get(logs::container_logs_handler),
        )
        .route(
            "/exec/{ns}/{pod}/{container}",
            get(stream::exec_attach_handler).post(stream::exec_attach_handler),
        )
        .route(
            "/attach/{ns}/{pod}/{container}",
            get(stream::exec_attach_handler).post(stream::exec_attach_handler),
        )
        .route(
            "/portForward/{ns}/{pod}",
            get(stream::port_forward_handler).post(stream::port_forward_handler),
        )
        .route(
            "/run/{ns}/{pod}/{container}",
            axum::routing::post(stream::run_handler),
        )
        .route("/logs", get(stream::system_logs_handler))
        .route("/logs/", get(stream::system_logs_handler))
        .route("/logs/{*path}", get(stream::system_logs_handler))
        .fallback(fallback)
        .layer(axum::middleware::from_fn_with_state(
            ctx.clone(),
            authn_authz,
        ))
        .with_state(ctx)
}

async fn serve_tls(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    router: axum::Router,
    cancel: CancellationToken,
) {
    let mut conns = JoinSet::new();
    loop {
        let (tcp, _) = tokio::select! {
            _ = cancel.cancelled() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("kubelet server: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // Small writes (an exec's output, a log line) go out at once, as upstream's Go server
        // sends them, not after the client's delayed ACK.
        let _ = tcp.set_nodelay(true);
        let (acceptor, router) = (acceptor.clone(), router.clone());
        conns.spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(t)) => t,
                    Ok(Err(e)) => {
                        tracing::debug!("kubelet server: TLS handshake: {e}");
                        return;
                    }
                    Err(_) => return,
                };
            let peer = Peer(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|c| c.first())
                    .and_then(|c| tls::user_of_certificate(c)),
            );
            let svc = tower::ServiceExt::map_request(
                router,
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(peer.clone());
                    req
                },
            );
            let svc = hyper_util::service::TowerToHyperService::new(svc);
            let _ =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(tls), svc)
                    .await;
        });
    }
    conns.shutdown().await;
}

fn text(code: StatusCode, body: impl Into<String>) -> Response {
    let mut body: String = body.into();
    if !body.ends_with('\n') {
        body.push('\n');
    }
    (
        code,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

/// Authenticates and authorizes every request before its handler.
async fn authn_authz(State(ctx): State<Arc<Ctx>>, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<Peer>().cloned().unwrap_or_default();
    let authorization = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let user = match ctx
        .auth
        .authenticate(peer.0.as_ref(), authorization.as_deref())
        .await
    {
        Ok(u) => u,
        Err(r) => return refused(r),
    };
    let attrs = auth::attributes(req.method(), req.uri().path());
    if let Err(r) = ctx.auth.authorize(&user, &attrs).await {
        return refused(r);
    }
    next.run(req).await
}

fn refused(r: Refused) -> Response {
    match r {
        Refused::Unauthorized => text(StatusCode::UNAUTHORIZED, "Unauthorized"),
        Refused::Forbidden(why) => text(StatusCode::FORBIDDEN, why),
        Refused::Error(why) => {
            tracing::warn!("kubelet server: {why}");
            text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("Internal Server Error: {why}"),
            )
        }
    }
}

async fn healthz_handler(State(ctx): State<Arc<Ctx>>) -> Response {
    match (ctx.deps.health)() {
        Ok(()) => text(StatusCode::OK, "ok"),
        Err(why) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("[+]ping ok\n[+]log ok\n[-]syncloop failed: {why}\nhealthz check failed"),
        ),
    }
}

/// The endpoints upstream serves that nodelet does not yet: 501 with the reason; 404 otherwise.
async fn fallback(method: Method, uri: axum::http::Uri) -> Response {
    let path = uri.path();
    let not_yet = ["/stats", "/checkpoint/", "/debug/"];
    if let Some(p) = not_yet.iter().find(|p| path.starts_with(*p)) {
        return text(
            StatusCode::NOT_IMPLEMENTED,
            format!(
                "{method} {}: not implemented by nodelet yet",
                p.trim_end_matches('/')
            ),
        );
    }
    text(StatusCode::NOT_FOUND, "404 page not found")
}

fn json(v: &impl serde::Serialize) -> Response {
    match serde_json::to_vec(v) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// `/configz`: the effective configuration, as upstream wraps it.
async fn configz_handler(State(ctx): State<Arc<Ctx>>) -> Response {
    json(&serde_json::json!({"kubeletconfig": ctx.deps.configz}))
}

/// `/pods`: the pods the kubelet runs, with the statuses it computed.
async fn pods_handler(State(ctx): State<Arc<Ctx>>) -> Response {
    let pods = ctx.deps.pods.borrow().clone();
    let items: Vec<serde_json::Value> = pods
        .iter()
        .map(|p| {
            let mut p = p.clone();
            if let Some(st) = p
                .metadata
                .uid
                .as_deref()
                .and_then(|u| ctx.deps.status.status(u))
            {
                p.status = Some(st);
            }
            let mut v = serde_json::to_value(&p).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("kind".into(), "Pod".into());
                o.insert("apiVersion".into(), "v1".into());
            }
            v
        })
        .collect();
    json(
        &serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}),
    )
}

/// `/runningpods/`: the pods with running containers as the runtime reports them (names,
/// namespaces, UIDs, container names and images only, as upstream).
async fn running_pods_handler(State(ctx): State<Arc<Ctx>>) -> Response {
    let listed = ctx
        .deps
        .rt
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                state: Some(cri::ContainerStateValue {
                    state: cri::ContainerState::ContainerRunning as i32,
                }),
                ..Default::default()
            }),
        })
        .await;
    let containers = match listed {
        Ok(l) => l.containers,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let mut pods: std::collections::BTreeMap<String, Pod> = Default::default();
    for c in containers {
        let label = |k: &str| c.labels.get(k).cloned().unwrap_or_default();
        let uid = label(crate::pod::LABEL_POD_UID);
        if uid.is_empty() {
            continue;
        }
        let pod = pods.entry(uid.clone()).or_insert_with(|| Pod {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(label("io.kubernetes.pod.name")),
                namespace: Some(label("io.kubernetes.pod.namespace")),
                uid: Some(uid),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: None,
        });
        if let Some(spec) = pod.spec.as_mut() {
            spec.containers.push(Container {
                name: container_name(c.metadata.as_ref()),
                image: c.image.as_ref().map(|i| i.image.clone()),
                ..Default::default()
            });
        }
    }
    let items: Vec<&Pod> = pods.values().collect();
    json(
        &serde_json::json!({"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}),
    )
}

/// A container's name from its CRI metadata (empty without it).
fn container_name(meta: Option<&cri::ContainerMetadata>) -> String {
    meta.map(|m| m.name.clone()).unwrap_or_default()
}

/// The pod `ns/name` among the kubelet's.
fn find_pod(ctx: &Ctx, ns: &str, name: &str) -> Option<Pod> {
    ctx.deps
        .pods
        .borrow()
        .iter()
        .find(|p| {
            p.metadata.namespace.as_deref() == Some(ns) && p.metadata.name.as_deref() == Some(name)
        })
        .cloned()
}

/// The instances of a container of the pod `uid`, newest first.
async fn instances_of(
    rt: &dyn RuntimeService,
    uid: &str,
    name: &str,
) -> runtime::Result<Vec<cri::ContainerStatus>> {
    let listed = rt
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: [(crate::pod::LABEL_POD_UID.to_string(), uid.to_string())].into(),
                ..Default::default()
            }),
        })
        .await?;
    let mut out = Vec::new();
    for c in listed.containers {
        if c.metadata.as_ref().is_none_or(|m| m.name != name) {
            continue;
        }
        match rt
            .container_status(cri::ContainerStatusRequest {
                container_id: c.id,
                verbose: false,
            })
            .await
        {
            Ok(r) => out.extend(r.status),
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e),
        }
    }
    out.sort_by_key(|c| {
        std::cmp::Reverse((c.metadata.as_ref().map_or(0, |m| m.attempt), c.created_at))
    });
    Ok(out)
}
