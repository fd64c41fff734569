//! A small in-process Kubernetes API server for the end-to-end tests, on 127.0.0.1, JSON only:
//! - pods, nodes, leases, events, configmaps, secrets, serviceaccounts, services (cluster IPs
//!   allocated), persistentvolumes, persistentvolumeclaims and certificatesigningrequests, with
//!   kube-apiserver's semantics for resourceVersions, conflicts, the status subresource,
//!   patches, selectors, pagination, watches (bookmarks, streaming lists, 410 after
//!   compaction), graceful pod deletion, pods' `binding` and `resize` (only containers' cpu and
//!   memory, the QoS class kept) (`store.rs`, `watch.rs`, `patch.rs`, `select.rs`);
//! - TokenReview and SubjectAccessReview answered from what a test sets and the service
//!   account tokens issued by TokenRequest (`serviceaccounts/<name>/token`, `tokens.rs`);
//! - `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward` proxied to the pod's kubelet
//!   with a client certificate (`proxy.rs`);
//! - CertificateSigningRequests with their `status` and `approval` subresources (`csr.rs`), an
//!   approver the test controls and the cluster CA's signer for the kubelet signers
//!   (`signer.rs`);
//! - over plain HTTP ([`ApiServer::start`]) with no authentication, every request an admin; or
//!   over HTTPS ([`ApiServer::start_tls`], `tls.rs`) with a fresh cluster CA, client
//!   certificate and bootstrap token authentication and a small authorizer: admins and nodes
//!   do everything, bootstrappers create and read their own CSRs (`auth.rs`).
//!
//! Include it from a test file with `mod apiserver;`.
#![allow(dead_code)]

mod auth;
mod csr;
mod discovery;
mod patch;
mod proxy;
mod select;
mod signer;
mod store;
mod tls;
mod tokens;
mod watch;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

#[allow(unused_imports)]
pub use signer::CsrPolicy;
use store::{ApiError, DeleteOptions, Part, Store};
#[allow(unused_imports)]
pub use store::{RESOURCES, Resource};
#[allow(unused_imports)]
pub use tokens::{DEFAULT_AUDIENCE, IssuedToken, claims};

/// How often a watch with `allowWatchBookmarks=true` gets a BOOKMARK.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(1);

/// One request answered: its method, path, status code, User-Agent and user (HTTPS mode;
/// empty over plain HTTP and when not authenticated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answered {
    pub method: String,
    pub path: String,
    pub code: u16,
    pub user_agent: String,
    pub user: String,
}

struct App {
    store: Mutex<Store>,
    requests: Mutex<Vec<String>>,
    /// Every request answered, recorded when its answer's head is ready to go.
    answered: Mutex<Vec<Answered>>,
    addr: SocketAddr,
    reviews: Mutex<Reviews>,
    /// How `pods/log`, `pods/exec`, ... reach kubelets.
    kubelet_client: Mutex<Option<proxy::KubeletClient>>,
    /// The service account tokens issued, oldest first.
    issued: Mutex<Vec<IssuedToken>>,
    /// The longest lifetime a token gets (`--service-account-max-token-expiration`).
    max_token_expiration: Mutex<Option<i64>>,
    /// The cluster CA (both modes: it signs CertificateSigningRequests).
    ca: tls::Authority,
    /// HTTPS mode's TLS and credentials.
    tls: Option<tls::Serving>,
    /// The CSR approver's and signer's settings, and a nudge when they change.
    csr: Mutex<signer::Settings>,
    csr_wake: tokio::sync::Notify,
}

/// What TokenReview and SubjectAccessReview answer: the tokens known (with their user and
/// groups) and the (user, verb, subresource) of `nodes` allowed; everything else is refused.
#[derive(Default)]
struct Reviews {
    tokens: HashMap<String, (String, Vec<String>)>,
    allowed: Vec<(String, String, String)>,
}

impl App {
    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The running accept loop: a signal to stop it and its task.
struct Serving {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

pub struct ApiServer {
    app: Arc<App>,
    serving: Mutex<Option<Serving>>,
    /// Listeners beside the main one ([`ApiServer::listen_also`]).
    also: Mutex<Vec<Serving>>,
    /// The CSR approver and signer (`signer.rs`).
    controller: JoinHandle<()>,
}

impl ApiServer {
    /// Proxies `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward` to kubelets with this
    /// client certificate, trusting `trusted` as their serving certificates.
    pub fn set_kubelet_client(
        &self,
        chain: Vec<rustls::pki_types::CertificateDer<'static>>,
        key: rustls::pki_types::PrivateKeyDer<'static>,
        trusted: Vec<rustls::pki_types::CertificateDer<'static>>,
    ) {
        *self
            .app
            .kubelet_client
            .lock()
            .unwrap_or_else(|e| e.into_inner()) =
            Some(proxy::KubeletClient::new(chain, key, trusted));
    }

    /// TokenReview authenticates `token` as `user` in `groups`.
    pub fn add_token(&self, token: &str, user: &str, groups: &[&str]) {
        self.app
            .reviews
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tokens
            .insert(
                token.to_string(),
                (
                    user.to_string(),
                    groups.iter().map(|g| g.to_string()).collect(),
                ),
            );
    }

    /// SubjectAccessReview allows `user` to `verb` the `nodes/<subresource>` (`allow`) or no
    /// longer (`!allow`).
    pub fn set_allowed(&self, user: &str, verb: &str, subresource: &str, allow: bool) {
        let mut r = self.app.reviews.lock().unwrap_or_else(|e| e.into_inner());
        let key = (user.to_string(), verb.to_string(), subresource.to_string());
        r.allowed.retain(|k| k != &key);
        if allow {
            r.allowed.push(key);
        }
    }

    /// Caps the lifetime of the tokens issued from now on at `secs` seconds, as
    /// kube-apiserver's `--service-account-max-token-expiration` does (the answer's
    /// `spec.expirationSeconds` says the lifetime given).
    pub fn set_max_token_expiration(&self, secs: i64) {
        *self
            .app
            .max_token_expiration
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(secs);
    }

    /// The service account tokens issued so far, oldest first.
    pub fn issued_tokens(&self) -> Vec<IssuedToken> {
        self.app
            .issued
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Starts serving plain HTTP on 127.0.0.1 on a free port, without authentication.
    pub async fn start() -> ApiServer {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding 127.0.0.1:0");
        ApiServer::launch(listener, tls::Authority::new(), None)
    }

    fn launch(listener: TcpListener, ca: tls::Authority, tls: Option<tls::Serving>) -> ApiServer {
        let addr = listener
            .local_addr()
            .expect("local address of the listener");
        let mut store = Store::new();
        let (changes, watched) = tokio::sync::mpsc::unbounded_channel();
        store.watchers.push(changes);
        let app = Arc::new(App {
            store: Mutex::new(store),
            requests: Mutex::new(Vec::new()),
            answered: Mutex::new(Vec::new()),
            addr,
            reviews: Mutex::new(Reviews::default()),
            kubelet_client: Mutex::new(None),
            issued: Mutex::new(Vec::new()),
            max_token_expiration: Mutex::new(None),
            ca,
            tls,
            csr: Mutex::new(signer::Settings::default()),
            csr_wake: tokio::sync::Notify::new(),
        });
        let controller = tokio::spawn(signer::run(app.clone(), watched));
        let server = ApiServer {
            app,
            serving: Mutex::new(None),
            also: Mutex::new(Vec::new()),
            controller,
        };
        server.serve(listener);
        server
    }

    fn serve(&self, listener: TcpListener) {
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, self.app.clone(), stopped));
        *self.serving.lock().unwrap_or_else(|e| e.into_inner()) = Some(Serving { stop, task });
    }

    /// Serves the same objects on `listener` too (bound by the caller, e.g. in a network
    /// namespace of the test's, for agents running there); until the server drops. Its
    /// kubeconfig is [`ApiServer::kubeconfig_at`].
    pub fn listen_also(&self, listener: std::net::TcpListener) {
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let listener = TcpListener::from_std(listener).expect("a tokio listener");
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, self.app.clone(), stopped));
        self.also
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Serving { stop, task });
    }

    /// [`ApiServer::write_kubeconfig`] for a cluster at `addr` (one of
    /// [`ApiServer::listen_also`]'s), in plain HTTP.
    pub fn kubeconfig_at(&self, dir: &Path, addr: std::net::SocketAddr) -> PathBuf {
        assert!(self.app.tls.is_none(), "plain HTTP only");
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            tls::kubeconfig(&format!("http://{addr}"), None, " {}"),
        )
        .expect("writing the kubeconfig");
        path
    }

    /// `http://127.0.0.1:PORT`, or `https://...` in HTTPS mode.
    pub fn url(&self) -> String {
        let scheme = if self.app.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.app.addr)
    }

    /// Writes `kubeconfig` into `dir` (a cluster at `url()`, namespace `default`; no
    /// credentials over plain HTTP, the CA and the admin's client certificate in HTTPS mode)
    /// and returns its path.
    pub fn write_kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = match &self.app.tls {
            None => tls::kubeconfig(&self.url(), None, " {}"),
            Some(t) => tls::kubeconfig(
                &self.url(),
                Some(&self.app.ca.pem),
                &tls::cert_user(&t.admin),
            ),
        };
        std::fs::write(&path, text).expect("writing the kubeconfig");
        path
    }

    /// A kube client for this server (default namespace `default`): in HTTPS mode the
    /// admin's (CN=admin, O=system:masters), trusting the CA.
    pub fn client(&self) -> kube::Client {
        nodelet::api::install_crypto_provider();
        if self.app.tls.is_some() {
            return self.tls_client();
        }
        let uri = self.url().parse().expect("server url is a valid URI");
        kube::Client::try_from(kube::Config::new(uri)).expect("kube client for the test API server")
    }

    /// Stops listening and drops every open connection (watch streams end); state is kept.
    pub async fn stop(&self) {
        let serving = self
            .serving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(Serving { stop, task }) = serving {
            let _ = stop.send(());
            let _ = task.await;
        }
    }

    /// Listens again on the same port, with the same objects and resourceVersions.
    pub async fn restart(&self) {
        if self
            .serving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            return;
        }
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.app.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    eprintln!("apiserver: rebinding {}: {e}; retrying", self.app.addr);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("rebinding {}: {e}", self.app.addr),
            }
        };
        self.serve(listener);
    }

    /// Forgets the watch history: a watch from any older resourceVersion now gets 410 Expired.
    pub fn compact(&self) {
        self.app.store().compact();
    }

    /// Every request seen, as "METHOD path?query".
    pub fn requests(&self) -> Vec<String> {
        self.app
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Every request answered so far, in order (a watch when its stream began).
    pub fn answered(&self) -> Vec<Answered> {
        self.app
            .answered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The stored object at an API path (`/api/v1/namespaces/default/pods/web`), if any.
    pub fn get(&self, path: &str) -> Option<Value> {
        let t = parse_target(path).ok()?;
        self.app
            .store()
            .get(t.res, t.ns.as_deref().unwrap_or(""), t.name.as_deref()?)
            .ok()
    }

    /// The current (latest written) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.app.store().rv
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.controller.abort();
        for s in self
            .also
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            s.task.abort();
        }
        if let Some(s) = self
            .serving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            s.task.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, app: Arc<App>, mut stopped: oneshot::Receiver<()>) {
    let acceptor = app.tls.as_ref().map(|t| t.acceptor.clone());
    let router = Router::new().fallback(entry).with_state(app);
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                // As a real API server (Go sets it on every TCP connection): without it a watch
                // event written behind another small write waits for the client's delayed ACK
                // (40 ms on Linux).
                let _ = stream.set_nodelay(true);
                let (router, acceptor) = (router.clone(), acceptor.clone());
                conns.spawn(async move {
                    let Some(acceptor) = acceptor else {
                        return serve_connection(stream, router, tls::PeerCert::default()).await;
                    };
                    let Ok(stream) = acceptor.accept(stream).await else { return };
                    let peer = stream.get_ref().1.peer_certificates()
                        .and_then(|c| c.first()).map(|c| c.clone().into_owned());
                    serve_connection(stream, router, tls::PeerCert(peer)).await;
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    conns.shutdown().await;
}

/// HTTP/1.1 (with upgrades) on one connection; each request carries the connection's peer
/// certificate.
async fn serve_connection<I>(io: I, router: Router, peer: tls::PeerCert)
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    use tower::ServiceExt;
    let router = router.map_request(move |mut req: axum::http::Request<hyper::body::Incoming>| {
        req.extensions_mut().insert(peer.clone());
        req
    });
    let service = hyper_util::service::TowerToHyperService::new(router);
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(io), service)
        .with_upgrades()
        .await;
}

/// What a resource path names.
struct Target {
    res: &'static Resource,
    ns: Option<String>,
    name: Option<String>,
    status: bool,
    binding: bool,
    token: bool,
    /// A CertificateSigningRequest's `approval`.
    approval: bool,
    /// A pod's `resize`.
    resize: bool,
}

impl Target {
    fn part(&self) -> Part {
        match (self.status, self.approval, self.resize) {
            (true, _, _) => Part::Status,
            (_, true, _) => Part::Approval,
            (_, _, true) => Part::Resize,
            _ => Part::Main,
        }
    }
}

fn parse_target(path: &str) -> Result<Target, ApiError> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::path_not_found()),
    };
    let (ns, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(ns.to_string()), rest),
        _ => (None, rest),
    };
    let (plural, name, sub) = match rest {
        [p] => (*p, None, None),
        [p, n] => (*p, Some(n.to_string()), None),
        [p, n, s] => (*p, Some(n.to_string()), Some(*s)),
        _ => return Err(ApiError::path_not_found()),
    };
    let res = store::find_resource(group, version, plural).ok_or_else(ApiError::path_not_found)?;
    if (!res.namespaced && ns.is_some()) || (res.namespaced && name.is_some() && ns.is_none()) {
        return Err(ApiError::path_not_found());
    }
    let pod = res.kind == "Pod" && res.group.is_empty();
    let (mut status, mut binding, mut token, mut approval, mut resize) =
        (false, false, false, false, false);
    match sub {
        None => {}
        Some("status") if res.has_status => status = true,
        Some("binding") if pod => binding = true,
        Some("resize") if pod => resize = true,
        Some("token") if res.kind == "ServiceAccount" => token = true,
        Some("approval") if res.kind == "CertificateSigningRequest" => approval = true,
        Some(_) => return Err(ApiError::path_not_found()),
    }
    Ok(Target {
        res,
        ns,
        name,
        status,
        binding,
        token,
        approval,
        resize,
    })
}

fn respond(code: u16, body: &Value) -> Response {
    let code = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Authenticates and authorizes a request (`auth.rs`), answers it ([`answer`]) and records
/// the answer's code and the user.
async fn entry(State(app): State<Arc<App>>, req: axum::extract::Request) -> Response {
    let method = req.method().to_string();
    let path = req.uri().path().to_string();
    let user_agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let (user, response) = match auth::check(&app, &req) {
        Ok(user) => {
            let name = if app.tls.is_some() {
                user.name.clone()
            } else {
                String::new()
            };
            (name, answer(app.clone(), req, user).await)
        }
        Err((name, e)) => (name, respond(e.code, &e.status())),
    };
    app.answered
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(Answered {
            method,
            path,
            code: response.status().as_u16(),
            user_agent,
            user,
        });
    response
}

/// Pod subresources proxied to kubelets keep their request (an upgrade needs it); everything
/// else is read whole and handled.
async fn answer(app: Arc<App>, req: axum::extract::Request, user: auth::User) -> Response {
    if let Some((ns, name, sub)) = proxy::proxied(req.uri().path()) {
        let target = req
            .uri()
            .path_and_query()
            .map_or("", |pq| pq.as_str())
            .to_string();
        app.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!("{} {target}", req.method()));
        return proxy::proxy(&app, &ns, &name, &sub, req).await;
    }
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, 64 << 20).await {
        Ok(b) => b,
        Err(e) => return respond(400, &ApiError::bad_request(e.to_string()).status()),
    };
    handle(app, parts.method, parts.uri, parts.headers, body, &user)
}

fn handle(
    app: Arc<App>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
    user: &auth::User,
) -> Response {
    let target = uri.path_and_query().map_or(uri.path(), |pq| pq.as_str());
    app.requests
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(format!("{method} {target}"));
    let query: HashMap<String, String> = Query::try_from_uri(&uri)
        .map(|Query(q)| q)
        .unwrap_or_default();
    if method == Method::GET
        && let Some(doc) = discovery::discovery(uri.path(), app.addr)
    {
        return respond(200, &doc);
    }
    if method == Method::POST {
        if let Some(r) = review(&app, uri.path(), &body) {
            return r;
        }
    }
    match dispatch(&app, &method, uri.path(), &query, &headers, &body, user) {
        Ok(r) => r,
        Err(e) => respond(e.code, &e.status()),
    }
}

/// TokenReview and SubjectAccessReview (create only, never stored, as kube-apiserver).
fn review(app: &App, path: &str, body: &[u8]) -> Option<Response> {
    let kind = match path {
        "/apis/authentication.k8s.io/v1/tokenreviews" => "TokenReview",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews" => "SubjectAccessReview",
        _ => return None,
    };
    let Ok(mut obj) = serde_json::from_slice::<Value>(body) else {
        return Some(respond(
            400,
            &ApiError::bad_request(format!(
                "the object provided is unrecognized (must be of type {kind})"
            ))
            .status(),
        ));
    };
    let r = app.reviews.lock().unwrap_or_else(|e| e.into_inner());
    let status = if kind == "TokenReview" {
        let token = obj["spec"]["token"].as_str().unwrap_or("");
        match r.tokens.get(token) {
            Some((user, groups)) => json!({"authenticated": true,
                "user": {"username": user, "uid": format!("uid-{user}"), "groups": groups}}),
            None => json!({"authenticated": false, "error": "invalid bearer token"}),
        }
    } else {
        let spec = &obj["spec"];
        let attrs = &spec["resourceAttributes"];
        let key = (
            spec["user"].as_str().unwrap_or("").to_string(),
            attrs["verb"].as_str().unwrap_or("").to_string(),
            attrs["subresource"].as_str().unwrap_or("").to_string(),
        );
        let on_nodes = attrs["resource"] == "nodes";
        if on_nodes && r.allowed.contains(&key) {
            json!({"allowed": true, "reason": "allowed by the test API server"})
        } else {
            json!({"allowed": false})
        }
    };
    obj["status"] = status;
    obj["kind"] = kind.into();
    Some(respond(201, &obj))
}

fn parse_body(body: &[u8], res: &Resource) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the object provided is unrecognized (must be of type {}): couldn't get version/kind; json parse error: {e}",
            res.kind
        ))
    })
}

fn dispatch(
    app: &App,
    method: &Method,
    path: &str,
    q: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &[u8],
    user: &auth::User,
) -> Result<Response, ApiError> {
    let t = parse_target(path)?;
    let (res, ns) = (t.res, t.ns.clone().unwrap_or_default());
    let flag = |k: &str| q.get(k).is_some_and(|v| v == "1" || v == "true");
    let not_allowed = || {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    };
    if method != Method::GET && q.contains_key("dryRun") {
        // Refused rather than silently written.
        return Err(ApiError::bad_request(
            "dryRun is not supported by the test API server",
        ));
    }
    match (method, t.name.as_deref()) {
        (&Method::POST, Some(name)) if t.binding => {
            let done = app.store().bind(res, &ns, name, &parse_body(body, res)?)?;
            Ok(respond(201, &done))
        }
        (_, Some(_)) if t.binding => Err(not_allowed()),
        (&Method::POST, Some(name)) if t.token => {
            let max = *app
                .max_token_expiration
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let (answer, issued) = tokens::issue(&mut app.store(), &ns, name, body, max)?;
            let user = format!("system:serviceaccount:{ns}:{name}");
            let groups = vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".to_string(),
            ];
            app.reviews
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .tokens
                .insert(issued.token.clone(), (user, groups));
            app.issued
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(issued);
            Ok(respond(201, &answer))
        }
        (_, Some(_)) if t.token => Err(not_allowed()),
        (&Method::GET, _) if flag("watch") => watch(app, &t, q),
        (&Method::GET, None) => Ok(respond(200, &list(&app.store(), &t, q)?)),
        (&Method::GET, Some(name)) => Ok(respond(200, &app.store().get(res, &ns, name)?)),
        (&Method::POST, None) if !t.status && (t.ns.is_some() || !res.namespaced) => {
            let mut obj = parse_body(body, res)?;
            if res.kind == "CertificateSigningRequest" {
                csr::prepare_create(user, &mut obj);
            }
            let obj = app.store().create(res, &ns, obj)?;
            if res.kind == "CertificateSigningRequest" {
                signer::created(app, &obj);
            }
            Ok(respond(201, &obj))
        }
        (&Method::PUT, Some(name)) => {
            let (created, obj) =
                app.store()
                    .update(res, &ns, name, parse_body(body, res)?, t.part())?;
            Ok(respond(if created { 201 } else { 200 }, &obj))
        }
        (&Method::PATCH, Some(name)) => {
            let ct = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            Ok(respond(
                200,
                &app.store().patch(res, &ns, name, ct, body, t.part())?,
            ))
        }
        (&Method::DELETE, Some(name)) if !t.status && !t.approval && !t.resize => {
            let opts = delete_options(q, body)?;
            Ok(respond(200, &app.store().delete(res, &ns, name, &opts)?))
        }
        _ => Err(not_allowed()),
    }
}

fn delete_options(q: &HashMap<String, String>, body: &[u8]) -> Result<DeleteOptions, ApiError> {
    let mut opts = DeleteOptions::default();
    if let Some(g) = q.get("gracePeriodSeconds") {
        let g = g
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds: {g}")))?;
        opts.grace_period_seconds = Some(g);
    }
    if body.iter().any(|b| !b.is_ascii_whitespace()) {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
        if let Some(g) = v.get("gracePeriodSeconds").and_then(Value::as_i64) {
            opts.grace_period_seconds = Some(g);
        }
        let pre = |f: &str| {
            v.pointer(&format!("/preconditions/{f}"))
                .and_then(Value::as_str)
                .map(String::from)
        };
        opts.uid = pre("uid");
        opts.resource_version = pre("resourceVersion");
    }
    Ok(opts)
}

fn selector(t: &Target, q: &HashMap<String, String>) -> Result<select::Selector, ApiError> {
    let sel = select::Selector::parse(
        t.res,
        q.get("fieldSelector").map(String::as_str),
        q.get("labelSelector").map(String::as_str),
    )?;
    Ok(match &t.name {
        Some(n) => sel.with_name(n),
        None => sel,
    })
}

/// A list: `kind: <Kind>List`, items in key order without their kind/apiVersion (as
/// kube-apiserver encodes them), `limit`/`continue` pagination.
fn list(store: &Store, t: &Target, q: &HashMap<String, String>) -> Result<Value, ApiError> {
    let sel = selector(t, q)?;
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
    let (list_rv, after) = match q.get("continue").filter(|c| !c.is_empty()) {
        None => (store.rv, None),
        Some(token) => {
            let bad = || ApiError::bad_request("invalid continue token");
            let raw = hex::decode(token).map_err(|_| bad())?;
            let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
            let rv = v["rv"].as_u64().ok_or_else(bad)?;
            if rv < store.floor {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                ));
            }
            let start = (
                v["ns"].as_str().unwrap_or("").to_string(),
                v["name"].as_str().unwrap_or("").to_string(),
            );
            (rv, Some(start))
        }
    };
    let mut items: Vec<_> = store
        .select(t.res, t.ns.as_deref(), &sel)
        .into_iter()
        .filter(|((_, ns, name), _)| after.as_ref().is_none_or(|a| (ns, name) > (&a.0, &a.1)))
        .collect();
    let mut meta = json!({"resourceVersion": list_rv.to_string()});
    if limit > 0 && items.len() > limit {
        let rest = items.len() - limit;
        items.truncate(limit);
        if let Some(((_, ns, name), _)) = items.last() {
            let token = json!({"rv": list_rv, "ns": ns, "name": name});
            meta["continue"] = json!(hex::encode(token.to_string()));
        }
        if !q.contains_key("fieldSelector") && !q.contains_key("labelSelector") {
            meta["remainingItemCount"] = json!(rest);
        }
    }
    let items: Vec<Value> = items
        .into_iter()
        .map(|(_, mut o)| {
            if let Some(m) = o.as_object_mut() {
                m.remove("kind");
                m.remove("apiVersion");
            }
            o
        })
        .collect();
    Ok(
        json!({"kind": format!("{}List", t.res.kind), "apiVersion": t.res.api_version(),
        "metadata": meta, "items": items}),
    )
}

fn watch(app: &App, t: &Target, q: &HashMap<String, String>) -> Result<Response, ApiError> {
    let invalid = |m: &str| {
        ApiError::new(
            422,
            "Invalid",
            format!("ListOptions.meta.k8s.io \"\" is invalid: {m}"),
        )
    };
    let rv = q.get("resourceVersion").map(String::as_str).unwrap_or("");
    let rv_match = q
        .get("resourceVersionMatch")
        .map(String::as_str)
        .unwrap_or("");
    let bookmarks = q
        .get("allowWatchBookmarks")
        .is_some_and(|v| v == "true" || v == "1");
    let start = if q.get("sendInitialEvents").is_some_and(|v| v == "true") {
        if rv_match != "NotOlderThan" {
            return Err(invalid(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ));
        }
        if !bookmarks {
            return Err(invalid(
                "allowWatchBookmarks: Forbidden: sendInitialEvents requires setting allowWatchBookmarks to true",
            ));
        }
        watch::Start::InitialEvents
    } else if !rv_match.is_empty() {
        return Err(invalid(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ));
    } else if rv.is_empty() || rv == "0" {
        watch::Start::Current
    } else {
        let n = rv
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion: {rv}")))?;
        watch::Start::After(n)
    };
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs);
    let w = watch::Watch {
        res: t.res,
        namespace: t.ns.clone(),
        selector: selector(t, q)?,
        start,
        bookmarks,
        timeout,
    };
    let body: Body = w.serve(&app.store, BOOKMARK_INTERVAL);
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}
