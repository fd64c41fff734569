//! The HTTP GET of probes and lifecycle hooks (upstream `pkg/probe/http`): a new HTTP/1.1
//! connection per request, `http` or `https` (whose certificate is not verified, as upstream),
//! the action's headers (`Host` sets the request's host), `User-Agent: kube-probe/<major>.<minor>`
//! and `Accept: */*` unless given, redirects followed up to 10 times while they stay on the same
//! host, and at most 10 KiB of the body read.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use k8s_openapi::api::core::v1::{Container, HTTPGetAction};
use tokio::io::{AsyncRead, AsyncWrite};

pub use super::target::join_host_port;
use super::target::{PortError, io_text, resolve_port};

/// How much of a response body is read.
pub const MAX_BODY: usize = 10 * 1024;

/// How many redirects are followed.
const MAX_REDIRECTS: usize = 10;

/// One GET.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub https: bool,
    /// Where to connect: an IP or a name.
    pub host: String,
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
    /// Headers in order, including `Host`, `User-Agent` and `Accept`.
    pub headers: Vec<(String, String)>,
}

/// What came back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// At most [`MAX_BODY`] bytes of it, as text.
    pub body: String,
}

/// Why an `httpGet` action cannot be sent, or got no answer (in the words of Go's HTTP
/// client, as upstream's messages read).
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("unsupported scheme {0:?}")]
    Scheme(String),
    #[error(transparent)]
    Port(#[from] PortError),
    #[error("the pod has no IP yet")]
    NoPodIp,
    /// The request to `url` failed.
    #[error("Get {url:?}: {source}")]
    Get {
        url: String,
        #[source]
        source: ConnError,
    },
    #[error("Get {url:?}: stopped after 10 redirects")]
    Redirects { url: String },
}

/// Why one request on one connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    #[error("dial tcp {addr}: connect: {}", io_text(source))]
    Dial {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Http(#[from] hyper::Error),
    #[error("bad request: {0}")]
    Request(#[from] http::Error),
    #[error("{0}")]
    TlsConfig(#[from] rustls::Error),
    #[error("bad server name {host:?}: {source}")]
    ServerName {
        host: String,
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("tls: {0}")]
    Handshake(#[source] std::io::Error),
}

impl Request {
    /// The request an `httpGet` action describes for the container, sent to `pod_ip` unless the
    /// action names a host. `user_agent_kind` is `probe` or `lifecycle` (`kube-probe/1.37`,
    /// `kube-lifecycle/1.37`).
    pub fn for_action(
        a: &HTTPGetAction,
        c: &Container,
        pod_ip: &str,
        user_agent_kind: &str,
    ) -> Result<Request, HttpError> {
        let https = match a.scheme.as_deref() {
            None | Some("") => false,
            Some(s) if s.eq_ignore_ascii_case("http") => false,
            Some(s) if s.eq_ignore_ascii_case("https") => true,
            Some(s) => return Err(HttpError::Scheme(s.to_string())),
        };
        let port = resolve_port(&a.port, c)?;
        let host = a
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| pod_ip.to_string());
        if host.is_empty() {
            return Err(HttpError::NoPodIp);
        }
        let mut path = a.path.clone().unwrap_or_default();
        if !path.starts_with('/') {
            path.insert(0, '/');
        }
        let mut headers: Vec<(String, String)> = Vec::new();
        let given = |name: &str| {
            a.http_headers
                .iter()
                .flatten()
                .any(|h| h.name.eq_ignore_ascii_case(name))
        };
        if !given("host") {
            headers.push(("Host".into(), join_host_port(&host, port)));
        }
        if !given("user-agent") {
            let agent =
                super::user_agent().replacen("kube-probe", &format!("kube-{user_agent_kind}"), 1);
            headers.push(("User-Agent".into(), agent));
        }
        if !given("accept") {
            headers.push(("Accept".into(), "*/*".into()));
        }
        for h in a.http_headers.iter().flatten() {
            headers.push((h.name.clone(), h.value.clone()));
        }
        Ok(Request {
            https,
            host,
            port,
            path,
            headers,
        })
    }

    /// The URL, as errors name it.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!(
            "{scheme}://{}{}",
            join_host_port(&self.host, self.port),
            self.path
        )
    }

    /// The host the request is for: its `Host` header without the port, else where it connects.
    fn host_name(&self) -> String {
        let h = self
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("host"))
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| self.host.clone());
        strip_port(&h)
    }
}

fn strip_port(h: &str) -> String {
    if let Some(rest) = h.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest).to_string();
    }
    if h.matches(':').count() == 1 {
        return h.split(':').next().unwrap_or(h).to_string();
    }
    h.to_string()
}

/// Sends `req`, following same-host redirects. A redirect to another host is not followed: its
/// 3xx response is returned. Errors read like Go's (`Get "url": dial tcp ...`).
pub async fn get(req: &Request) -> Result<Response, HttpError> {
    let mut req = req.clone();
    for _ in 0..=MAX_REDIRECTS {
        let (status, location, body) = get_once(&req).await.map_err(|source| HttpError::Get {
            url: req.url(),
            source,
        })?;
        let Some(location) = location.filter(|_| (300..400).contains(&status)) else {
            return Ok(Response { status, body });
        };
        match redirect(&req, &location) {
            Some(next) => req = next,
            None => return Ok(Response { status, body }),
        }
    }
    Err(HttpError::Redirects { url: req.url() })
}

/// The request a redirect to `location` makes, when it stays on the request's host.
fn redirect(req: &Request, location: &str) -> Option<Request> {
    let uri: http::Uri = location.parse().ok()?;
    let mut next = req.clone();
    next.path = uri
        .path_and_query()
        .map_or_else(|| "/".to_string(), |p| p.as_str().to_string());
    if let Some(authority) = uri.authority() {
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host != req.host_name() {
            return None;
        }
        next.https = uri.scheme_str() == Some("https");
        next.port = authority
            .port_u16()
            .unwrap_or(if next.https { 443 } else { 80 });
        for (n, v) in next.headers.iter_mut() {
            if n.eq_ignore_ascii_case("host") {
                *v = authority.as_str().to_string();
            }
        }
    }
    Some(next)
}

/// One request on a new connection: the status, the `Location` header, the body's start.
async fn get_once(req: &Request) -> Result<(u16, Option<String>, String), ConnError> {
    let addr = join_host_port(&req.host, req.port);
    let tcp = match tokio::net::TcpStream::connect(&addr).await {
        Ok(tcp) => tcp,
        Err(source) => return Err(ConnError::Dial { addr, source }),
    };
    if req.https {
        let tls = tls_connect(tcp, &req.host).await?;
        send(tls, req).await
    } else {
        send(tcp, req).await
    }
}

async fn send<S>(io: S, req: &Request) -> Result<(u16, Option<String>, String), ConnError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(io)).await?;
    let conn = tokio::spawn(conn);
    let mut builder = hyper::Request::get(req.path.as_str());
    for (n, v) in &req.headers {
        builder = builder.header(n.as_str(), v.as_str());
    }
    builder = builder.header("Connection", "close");
    let request = builder.body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(request).await.map_err(ConnError::Http);
    let result = match resp {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let location = resp
                .headers()
                .get("location")
                .and_then(|l| l.to_str().ok())
                .map(str::to_string);
            let mut body = resp.into_body();
            let mut buf: Vec<u8> = Vec::new();
            while buf.len() < MAX_BODY {
                match body.frame().await {
                    Some(Ok(f)) => {
                        if let Ok(data) = f.into_data() {
                            buf.extend_from_slice(&data);
                        }
                    }
                    Some(Err(e)) => return Err(e.into()),
                    None => break,
                }
            }
            buf.truncate(MAX_BODY);
            Ok((status, location, String::from_utf8_lossy(&buf).into_owned()))
        }
        Err(e) => Err(e),
    };
    conn.abort();
    result
}

/// A TLS client handshake that accepts any certificate (probes skip verification, as upstream),
/// still checking the handshake's signatures.
async fn tls_connect(
    tcp: tokio::net::TcpStream,
    host: &str,
) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>, ConnError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|source| {
        ConnError::ServerName {
            host: host.to_string(),
            source,
        }
    })?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(ConnError::Handshake)
}

#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests;
