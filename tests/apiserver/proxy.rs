//! What kube-apiserver does for `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward`:
//! it finds the pod's node, its InternalIP and kubelet port (`daemonEndpoints`), and proxies the
//! request to the kubelet's `/containerLogs`, `/exec`, `/attach` or `/portForward` over HTTPS,
//! as the client certificate it was given (`--kubelet-client-certificate`), trusting the
//! kubelet's serving certificate it was given (`--kubelet-certificate-authority`). Upgrades
//! (SPDY, WebSocket) are joined and copied both ways; logs stream.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;

use super::App;
use super::store::ApiError;

/// How the API server reaches kubelets.
pub struct KubeletClient {
    pub config: Arc<rustls::ClientConfig>,
}

impl KubeletClient {
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
        trusted: Vec<CertificateDer<'static>>,
    ) -> KubeletClient {
        let mut roots = rustls::RootCertStore::empty();
        for c in trusted {
            roots.add(c).expect("a trusted kubelet certificate");
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .expect("the kubelet client certificate");
        KubeletClient {
            config: Arc::new(config),
        }
    }
}

/// `(namespace, pod, subresource)` when `path` is a pod subresource the API server proxies.
pub fn proxied(path: &str) -> Option<(String, String, String)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segs.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name, sub]
            if ["log", "exec", "attach", "portforward"].contains(sub) =>
        {
            Some((ns.to_string(), name.to_string(), sub.to_string()))
        }
        _ => None,
    }
}

fn error(e: ApiError) -> Response {
    super::respond(e.code, &e.status())
}

/// The kubelet path and query for the subresource, as kube-apiserver builds them.
fn kubelet_path(
    pod: &Value,
    ns: &str,
    name: &str,
    sub: &str,
    query: &[(String, String)],
) -> Result<String, ApiError> {
    let containers: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .map(|cs| cs.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    let container = match query.iter().find(|(k, _)| k == "container") {
        Some((_, c)) => c.clone(),
        None if sub == "portforward" => String::new(),
        None if containers.len() == 1 => containers[0].to_string(),
        None => {
            return Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: {containers:?}"
            )));
        }
    };
    let mut out: Vec<(String, String)> = Vec::new();
    for (k, v) in query {
        let truthy = v == "true" || v == "1";
        let renamed = match (sub, k.as_str()) {
            (_, "container") => continue,
            ("exec" | "attach", "stdin") => "input",
            ("exec" | "attach", "stdout") => "output",
            ("exec" | "attach", "stderr") => "error",
            (_, other) => other,
        };
        let value = if ["input", "output", "error", "tty"].contains(&renamed) {
            if !truthy {
                continue;
            }
            "1".to_string()
        } else {
            v.clone()
        };
        out.push((renamed.to_string(), value));
    }
    let q: String = out
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&");
    let path = match sub {
        "log" => format!("/containerLogs/{ns}/{name}/{container}"),
        "exec" => format!("/exec/{ns}/{name}/{container}"),
        "attach" => format!("/attach/{ns}/{name}/{container}"),
        _ => format!("/portForward/{ns}/{name}"),
    };
    Ok(if q.is_empty() {
        path
    } else {
        format!("{path}?{q}")
    })
}

fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn decode(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                    out.push(v);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Proxies the request for the pod subresource to the pod's kubelet.
pub async fn proxy(app: &App, ns: &str, name: &str, sub: &str, mut req: Request) -> Response {
    let Some(client) = app
        .kubelet_client
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|c| c.config.clone())
    else {
        return error(ApiError::new(
            503,
            "ServiceUnavailable",
            "the test API server was given no kubelet client certificate",
        ));
    };
    let query: Vec<(String, String)> = req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect();
    let (pod, node) = {
        let store = app.store();
        let pods = super::store::find_resource("", "v1", "pods").expect("pods");
        let nodes = super::store::find_resource("", "v1", "nodes").expect("nodes");
        let pod = match store.get(pods, ns, name) {
            Ok(p) => p,
            Err(e) => return error(e),
        };
        let node_name = pod["spec"]["nodeName"].as_str().unwrap_or("").to_string();
        let node = store.get(nodes, "", &node_name).ok();
        (pod, node)
    };
    let Some(node) = node else {
        return error(ApiError::bad_request(format!(
            "pod {name} does not have a host assigned"
        )));
    };
    let ip = node["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
        .and_then(|a| a["address"].as_str())
        .unwrap_or("")
        .to_string();
    let port = node["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"]
        .as_u64()
        .unwrap_or(10250);
    let path = match kubelet_path(&pod, ns, name, sub, &query) {
        Ok(p) => p,
        Err(e) => return error(e),
    };
    let tcp = match tokio::net::TcpStream::connect((ip.as_str(), port as u16)).await {
        Ok(t) => t,
        Err(e) => {
            return error(ApiError::new(
                502,
                "InternalError",
                format!("dialing the kubelet {ip}:{port}: {e}"),
            ));
        }
    };
    let server_name = match rustls::pki_types::ServerName::try_from(ip.clone()) {
        Ok(n) => n,
        Err(e) => return error(ApiError::bad_request(e.to_string())),
    };
    let tls = match tokio_rustls::TlsConnector::from(client)
        .connect(server_name, tcp)
        .await
    {
        Ok(t) => t,
        Err(e) => {
            return error(ApiError::new(
                502,
                "InternalError",
                format!("TLS with the kubelet: {e}"),
            ));
        }
    };
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await {
            Ok(x) => x,
            Err(e) => return error(ApiError::new(502, "InternalError", e.to_string())),
        };
    tokio::spawn(conn.with_upgrades());
    let mut out = hyper::Request::builder()
        .method(req.method().clone())
        .uri(&path);
    for (k, v) in req.headers() {
        if k == header::HOST || k == header::AUTHORIZATION {
            continue;
        }
        out = out.header(k, v);
    }
    out = out.header(header::HOST, format!("{ip}:{port}"));
    let client_upgrade = hyper::upgrade::on(&mut req);
    let out = match out.body(req.into_body()) {
        Ok(r) => r,
        Err(e) => return error(ApiError::bad_request(e.to_string())),
    };
    let mut resp = match sender.send_request(out).await {
        Ok(r) => r,
        Err(e) => return error(ApiError::new(502, "InternalError", e.to_string())),
    };
    let status = resp.status();
    let headers = resp.headers().clone();
    // As kube-apiserver's response checker for pods/log: a kubelet's refusal becomes a Status
    // whose message is what the kubelet said (BadRequest for a 400, InternalError for a 500).
    if sub == "log" && !(200..=206).contains(&status.as_u16()) {
        use http_body_util::BodyExt;
        let body = match resp.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return error(ApiError::new(502, "InternalError", e.to_string())),
        };
        let text = String::from_utf8_lossy(&body[..body.len().min(4096)]).into_owned();
        return error(match status.as_u16() {
            400 => ApiError::bad_request(text),
            500 => ApiError::new(500, "InternalError", text),
            404 => ApiError::new(404, "NotFound", text),
            code => ApiError::new(code, "Unknown", text),
        });
    }
    if status == StatusCode::SWITCHING_PROTOCOLS {
        let kubelet_upgrade = hyper::upgrade::on(&mut resp);
        tokio::spawn(async move {
            let (Ok(a), Ok(b)) = (client_upgrade.await, kubelet_upgrade.await) else {
                return;
            };
            let (mut a, mut b) = (
                hyper_util::rt::TokioIo::new(a),
                hyper_util::rt::TokioIo::new(b),
            );
            let _ = tokio::io::copy_bidirectional(&mut a, &mut b).await;
        });
    }
    let mut r = (status, Body::new(resp.into_body())).into_response();
    *r.headers_mut() = headers;
    r
}
