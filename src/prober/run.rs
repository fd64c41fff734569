//! Running one probe attempt (upstream `prober.go` and `pkg/probe`): exec through the runtime's
//! ExecSync, HTTP GET, a TCP connect, or the gRPC health checking protocol, all from the
//! kubelet's own network namespace to the pod's IP (the node's for hostNetwork pods).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use runtime::{Code, RuntimeService, cri};

use super::http;
pub use super::target::resolve_port;
use super::target::{io_text, join_host_port};

/// The outcome of one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// Passed; the output (an HTTP body, a command's output).
    Success(String),
    /// Passed, with something worth an event (`ProbeWarning`): a redirect to another host.
    Warning(String),
    /// Failed; why.
    Failure(String),
    /// Could not be run (no pod IP, an unknown port name, a runtime error); counts neither way.
    Error(String),
}

/// What a probe is aimed at.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub pod: &'a Pod,
    pub container: &'a Container,
    /// The runtime's container ID (without the `<runtime>://` scheme).
    pub container_id: &'a str,
    /// The pod's IP; the node's for hostNetwork pods.
    pub pod_ip: &'a str,
}

/// Runs probe attempts. The kubelet's is [`RuntimeProber`]; tests script their own.
#[async_trait::async_trait]
pub trait Prober: Send + Sync {
    async fn probe(&self, probe: &Probe, timeout: Duration, target: &Target<'_>) -> Attempt;
}

/// The kubelet's prober: exec probes through the runtime, the others over the network.
pub struct RuntimeProber {
    rt: Arc<dyn RuntimeService>,
}

impl RuntimeProber {
    pub fn new(rt: Arc<dyn RuntimeService>) -> Self {
        RuntimeProber { rt }
    }
}

/// Runs `cmd` in the container through ExecSync, bounded by `timeout` (also on the kubelet's
/// side, so a runtime that ignores the timeout cannot hang the caller). `Ok` holds the exit
/// code and the combined output; a timeout is `Err(None)`, another failure `Err(Some(why))`.
pub async fn exec(
    rt: &dyn RuntimeService,
    container_id: &str,
    cmd: &[String],
    timeout: Option<Duration>,
) -> Result<(i32, String), Option<String>> {
    let req = cri::ExecSyncRequest {
        container_id: container_id.to_string(),
        cmd: cmd.to_vec(),
        timeout: timeout.map_or(0, |t| i64::try_from(t.as_secs()).unwrap_or(i64::MAX)),
    };
    let call = rt.exec_sync(req);
    let res = match timeout {
        // A second of slack for the runtime to report its own timeout first.
        Some(t) => match tokio::time::timeout(t + Duration::from_secs(1), call).await {
            Ok(r) => r,
            Err(_) => return Err(None),
        },
        None => call.await,
    };
    match res {
        Ok(r) => {
            let mut out = String::from_utf8_lossy(&r.stdout).into_owned();
            out.push_str(&String::from_utf8_lossy(&r.stderr));
            Ok((r.exit_code, out))
        }
        Err(e) if e.code() == Code::DeadlineExceeded => Err(None),
        Err(e) => Err(Some(e.to_string())),
    }
}

#[async_trait::async_trait]
impl Prober for RuntimeProber {
    async fn probe(&self, probe: &Probe, timeout: Duration, t: &Target<'_>) -> Attempt {
        if let Some(e) = &probe.exec {
            let cmd = e.command.clone().unwrap_or_default();
            return match exec(self.rt.as_ref(), t.container_id, &cmd, Some(timeout)).await {
                Ok((0, out)) => Attempt::Success(out),
                Ok((_, out)) => Attempt::Failure(out),
                Err(None) => Attempt::Failure(format!("command {:?} timed out", cmd.join(" "))),
                Err(Some(why)) => Attempt::Error(why),
            };
        }
        if let Some(h) = &probe.http_get {
            let req = match http::Request::for_action(h, t.container, t.pod_ip, "probe") {
                Ok(r) => r,
                Err(e) => return Attempt::Error(e.to_string()),
            };
            return match tokio::time::timeout(timeout, http::get(&req)).await {
                Err(_) => Attempt::Failure(format!(
                    "Get {:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)",
                    req.url()
                )),
                Ok(Err(e)) => Attempt::Failure(e.to_string()),
                Ok(Ok(resp)) if (200..300).contains(&resp.status) => Attempt::Success(resp.body),
                Ok(Ok(resp)) if (300..400).contains(&resp.status) => Attempt::Warning(format!(
                    "Probe terminated redirects, Response body: {}",
                    resp.body
                )),
                Ok(Ok(resp)) => Attempt::Failure(format!(
                    "HTTP probe failed with statuscode: {}",
                    resp.status
                )),
            };
        }
        if let Some(tcp) = &probe.tcp_socket {
            let port = match resolve_port(&tcp.port, t.container) {
                Ok(p) => p,
                Err(e) => return Attempt::Error(e.to_string()),
            };
            let host = tcp
                .host
                .as_deref()
                .filter(|h| !h.is_empty())
                .unwrap_or(t.pod_ip);
            if host.is_empty() {
                return Attempt::Error("the pod has no IP yet".into());
            }
            let addr = join_host_port(host, port);
            return match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&addr)).await
            {
                Ok(Ok(_)) => Attempt::Success(String::new()),
                Ok(Err(e)) => {
                    Attempt::Failure(format!("dial tcp {addr}: connect: {}", io_text(&e)))
                }
                Err(_) => Attempt::Failure(format!("dial tcp {addr}: i/o timeout")),
            };
        }
        if let Some(g) = &probe.grpc {
            if t.pod_ip.is_empty() {
                return Attempt::Error("the pod has no IP yet".into());
            }
            let Some(port) = u16::try_from(g.port).ok().filter(|p| *p > 0) else {
                return Attempt::Error(format!("invalid port number: {}", g.port));
            };
            return grpc(
                t.pod_ip,
                port,
                g.service.clone().unwrap_or_default(),
                timeout,
            )
            .await;
        }
        Attempt::Error("the probe has no handler".into())
    }
}

/// The gRPC health checking protocol (`grpc.health.v1.Health/Check`): SERVING passes, every
/// other answer or failure fails, in upstream's words.
async fn grpc(ip: &str, port: u16, service: String, timeout: Duration) -> Attempt {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let addr = join_host_port(ip, port);
    let secs = timeout.as_secs();
    let endpoint = match tonic::transport::Endpoint::from_shared(format!("http://{addr}")) {
        Ok(e) => e.connect_timeout(timeout).timeout(timeout),
        Err(e) => return Attempt::Error(format!("bad address {addr}: {e}")),
    };
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            return Attempt::Failure(format!(
                "timeout: failed to connect service {addr:?} within {secs}s: {e}"
            ));
        }
        Err(_) => {
            return Attempt::Failure(format!(
                "timeout: failed to connect service {addr:?} within {secs}s"
            ));
        }
    };
    let mut client = HealthClient::new(channel);
    let call = client.check(HealthCheckRequest { service });
    match tokio::time::timeout(timeout, call).await {
        Err(_) => Attempt::Failure(format!(
            "timeout: health rpc did not complete within {secs}s"
        )),
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Attempt::Failure(format!(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
            s.message()
        )),
        Ok(Err(s)) if s.code() == tonic::Code::DeadlineExceeded => Attempt::Failure(format!(
            "timeout: health rpc did not complete within {secs}s"
        )),
        Ok(Err(s)) => Attempt::Failure(format!(
            "error: health rpc probe failed: code = {:?} desc = {}",
            s.code(),
            s.message()
        )),
        Ok(Ok(resp)) => {
            let status = resp.into_inner().status;
            if status == ServingStatus::Serving as i32 {
                Attempt::Success(String::new())
            } else {
                let name = ServingStatus::try_from(status)
                    .map(|s| s.as_str_name().to_string())
                    .unwrap_or_else(|_| status.to_string());
                Attempt::Failure(format!("service unhealthy (responded with {name:?})"))
            }
        }
    }
}
