//! `/exec`, `/attach` and `/portForward` (upstream `getExec`, `getAttach`, `getPortForward` with
//! the kubelet proxying the stream): the runtime is asked for a streaming URL (CRI `Exec`,
//! `Attach`, `PortForward`) and the client's upgrade request is passed on to it; once the
//! runtime's streaming server switches protocols (WebSocket or SPDY), bytes are copied both
//! ways until either side closes. The client's credentials are not passed on.

use std::sync::Arc;

use axum::extract::{Path as UrlPath, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use runtime::cri;

use super::{Ctx, find_pod, instances_of, text};

/// The query's values, repeated keys kept (`command=sh&command=-c`).
type Params = Vec<(String, String)>;

fn flag(q: &Params, names: &[&str]) -> bool {
    q.iter()
        .any(|(k, v)| names.contains(&k.as_str()) && (v == "1" || v.eq_ignore_ascii_case("true")))
}

/// The running container `container` of the pod `ns/name`, or the response saying why not.
async fn running_container(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    container: &str,
) -> Result<String, Response> {
    let pod = find_pod(ctx, ns, name).ok_or_else(|| {
        text(
            StatusCode::NOT_FOUND,
            format!("pod \"{ns}/{name}\" does not exist"),
        )
    })?;
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let instances = instances_of(ctx.deps.rt.as_ref(), &uid, container)
        .await
        .map_err(|e| text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    instances
        .into_iter()
        .find(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .map(|c| c.id)
        .ok_or_else(|| {
            text(
                StatusCode::NOT_FOUND,
                format!(
                    "container \"{container}\" not found in pod \"{ns}/{name}\" or not running"
                ),
            )
        })
}

/// `/exec/{ns}/{pod}/{container}?command=...` and `/attach/{ns}/{pod}/{container}`: the
/// runtime's streaming URL for an exec of the command or an attach, with the streams the
/// query asks for, and the request proxied to it.
pub(super) async fn exec_attach_handler(
    State(ctx): State<Arc<Ctx>>,
    UrlPath((ns, name, container)): UrlPath<(String, String, String)>,
    Query(q): Query<Params>,
    req: Request,
) -> Response {
    let attach = req.uri().path().starts_with("/attach/");
    let cmd: Vec<String> = q
        .iter()
        .filter(|(k, _)| k == "command")
        .map(|(_, v)| v.clone())
        .collect();
    if !attach && cmd.is_empty() {
        return text(StatusCode::BAD_REQUEST, "exec: no command given");
    }
    let id = match running_container(&ctx, &ns, &name, &container).await {
        Ok(id) => id,
        Err(r) => return r,
    };
    let exec = cri::ExecRequest {
        container_id: id,
        cmd,
        tty: flag(&q, &["tty"]),
        stdin: flag(&q, &["input", "stdin"]),
        stdout: flag(&q, &["output", "stdout"]),
        stderr: flag(&q, &["error", "stderr"]),
    };
    let rt = &ctx.deps.rt;
    let url = if attach {
        rt.attach(attach_of(exec)).await.map(|r| r.url)
    } else {
        rt.exec(exec).await.map(|r| r.url)
    };
    proxy_to(url, req).await
}

/// The attach to the container of `exec`, with its streams.
fn attach_of(exec: cri::ExecRequest) -> cri::AttachRequest {
    cri::AttachRequest {
        container_id: exec.container_id,
        tty: exec.tty,
        stdin: exec.stdin,
        stdout: exec.stdout,
        stderr: exec.stderr,
    }
}

/// Proxies `req` to the streaming URL the runtime gave, or says why it gave none.
async fn proxy_to(url: runtime::Result<String>, req: Request) -> Response {
    match url {
        Ok(url) => proxy(&url, req).await,
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

pub(super) async fn port_forward_handler(
    State(ctx): State<Arc<Ctx>>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    req: Request,
) -> Response {
    let Some(pod) = find_pod(&ctx, &ns, &name) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod \"{ns}/{name}\" does not exist"),
        );
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let sandboxes = ctx
        .deps
        .rt
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: [(crate::pod::LABEL_POD_UID.to_string(), uid)].into(),
                state: Some(cri::PodSandboxStateValue {
                    state: cri::PodSandboxState::SandboxReady as i32,
                }),
                ..Default::default()
            }),
        })
        .await;
    let sandbox = match sandboxes {
        Ok(l) => l.items.into_iter().max_by_key(|s| s.created_at),
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let Some(sandbox) = sandbox else {
        return text(
            StatusCode::NOT_FOUND,
            format!("pod \"{ns}/{name}\" has no ready sandbox"),
        );
    };
    let asked = ctx
        .deps
        .rt
        .port_forward(cri::PortForwardRequest {
            pod_sandbox_id: sandbox.id,
            port: Vec::new(),
        })
        .await;
    // WebSocket clients name their ports in the query; the runtime's server reads them.
    let query = req.uri().query().map(str::to_string);
    let url = asked.map(|r| match query {
        Some(q) if !r.url.contains('?') => format!("{}?{q}", r.url),
        _ => r.url,
    });
    proxy_to(url, req).await
}

/// Passes `req` on to the streaming `url` and, when it switches protocols, joins the two
/// upgraded connections.
async fn proxy(url: &str, mut req: Request) -> Response {
    let uri: http::Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => {
            return text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the runtime's streaming URL {url:?}: {e}"),
            );
        }
    };
    if uri.scheme_str() != Some("http") {
        return text(
            StatusCode::NOT_IMPLEMENTED,
            format!("streaming URL {url:?}: only http:// streaming servers are proxied"),
        );
    }
    let Some(authority) = uri.authority().cloned() else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the runtime's streaming URL {url:?} has no host"),
        );
    };
    let backend = match tokio::net::TcpStream::connect(authority.as_str()).await {
        Ok(s) => s,
        Err(e) => {
            return text(
                StatusCode::BAD_GATEWAY,
                format!("connecting to the runtime's streaming server {authority}: {e}"),
            );
        }
    };
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(backend)).await {
            Ok(x) => x,
            Err(e) => return text(StatusCode::BAD_GATEWAY, e.to_string()),
        };
    tokio::spawn(conn.with_upgrades());
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = hyper::Request::builder()
        .method(req.method().clone())
        .uri(path);
    for (k, v) in req.headers() {
        if k == header::HOST || k == header::AUTHORIZATION {
            continue;
        }
        out = out.header(k, v);
    }
    out = out.header(header::HOST, authority.as_str());
    let client_upgrade = hyper::upgrade::on(&mut req);
    let body = req.into_body();
    let out = match out.body(body) {
        Ok(r) => r,
        Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let mut resp = match sender.send_request(out).await {
        Ok(r) => r,
        Err(e) => return text(StatusCode::BAD_GATEWAY, e.to_string()),
    };
    let status = resp.status();
    let headers = resp.headers().clone();
    if status != StatusCode::SWITCHING_PROTOCOLS {
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let mut r = (status, body).into_response();
        *r.headers_mut() = headers;
        return r;
    }
    let backend_upgrade = hyper::upgrade::on(&mut resp);
    tokio::spawn(async move {
        let (Ok(client), Ok(backend)) = (client_upgrade.await, backend_upgrade.await) else {
            return;
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut backend = hyper_util::rt::TokioIo::new(backend);
        let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
    });
    let mut r = StatusCode::SWITCHING_PROTOCOLS.into_response();
    *r.headers_mut() = headers;
    r
}

/// `/run/{ns}/{pod}/{container}?cmd=...`: runs the command (split at whitespace, as upstream)
/// in the container through ExecSync and answers with its output.
pub(super) async fn run_handler(
    State(ctx): State<Arc<Ctx>>,
    UrlPath((ns, name, container)): UrlPath<(String, String, String)>,
    Query(q): Query<Params>,
) -> Response {
    let cmd: Vec<String> = q
        .iter()
        .find(|(k, _)| k == "cmd")
        .map(|(_, v)| v.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    if cmd.is_empty() {
        return text(StatusCode::BAD_REQUEST, "run: no cmd given");
    }
    let id = match running_container(&ctx, &ns, &name, &container).await {
        Ok(id) => id,
        Err(r) => return r,
    };
    match crate::prober::exec(ctx.deps.rt.as_ref(), &id, &cmd, None).await {
        Ok((_, out)) => (StatusCode::OK, out).into_response(),
        Err(why) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            why.unwrap_or_else(|| "timed out".into()),
        ),
    }
}

/// `/logs/...` with `enableSystemLogHandler`: the node's `/var/log`, files and directory
/// listings (as Go's file server writes them), never outside it.
pub(super) async fn system_logs_handler(
    State(ctx): State<Arc<Ctx>>,
    uri: axum::http::Uri,
) -> Response {
    if !ctx.deps.cfg.system_log_handler {
        return text(StatusCode::NOT_FOUND, "404 page not found");
    }
    let rel = uri
        .path()
        .trim_start_matches("/logs")
        .trim_start_matches('/');
    let rel = std::path::Path::new(rel);
    if rel
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return text(StatusCode::BAD_REQUEST, "invalid path");
    }
    let path = ctx.deps.system_log_dir.join(rel);
    let read = tokio::task::spawn_blocking(move || -> std::io::Result<(bool, Vec<u8>)> {
        let meta = std::fs::metadata(&path)?;
        if meta.is_dir() {
            let mut names: Vec<String> = std::fs::read_dir(&path)?
                .filter_map(|e| e.ok())
                .map(|e| {
                    let mut n = e.file_name().to_string_lossy().into_owned();
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        n.push('/');
                    }
                    n
                })
                .collect();
            names.sort();
            let mut html = String::from("<pre>\n");
            for n in names {
                let escaped = n
                    .replace('&', "&amp;")
                    .replace('<', "&lt;")
                    .replace('>', "&gt;")
                    .replace('"', "&quot;");
                html.push_str(&format!("<a href=\"{escaped}\">{escaped}</a>\n"));
            }
            html.push_str("</pre>\n");
            Ok((true, html.into_bytes()))
        } else {
            Ok((false, std::fs::read(&path)?))
        }
    })
    .await;
    match read {
        Ok(Ok((true, html))) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            html,
        )
            .into_response(),
        Ok(Ok((false, data))) => (StatusCode::OK, data).into_response(),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            text(StatusCode::NOT_FOUND, "404 page not found")
        }
        Ok(Err(e)) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
