//! Port-forward over SPDY (`portforward.k8s.io`): for each forwarded connection the client
//! opens an error stream and a data stream with the same `requestID` and `port` headers; the
//! server connects to the port inside the pod and copies both ways (the client's FIN
//! half-closes the connection; the pod's end of file ends the data stream). Failures are
//! written as text on the error stream. The session lasts until the client closes it.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::header;
use super::remotecommand::forward;
use super::session::{Incoming, Session};
use crate::Backend;

/// The subprotocol served over SPDY.
pub const PROTOCOL: &str = "portforward.k8s.io";

#[derive(Default)]
struct Pair {
    error: Option<Incoming>,
    data: Option<Incoming>,
}

/// Serves port-forwarding for the pod `sandbox_id` on an upgraded connection.
pub async fn serve(
    io: impl AsyncRead + AsyncWrite + Send + 'static,
    sandbox_id: String,
    backend: Arc<dyn Backend>,
) {
    let mut session = Session::start(io);
    let mut pairs: HashMap<String, Pair> = HashMap::new();
    let mut tasks = Vec::new();
    while let Some(s) = session.incoming.recv().await {
        let kind = header(&s.headers, "streamtype")
            .unwrap_or("")
            .to_ascii_lowercase();
        // Old clients send no request id: the error stream is opened first, two ids before
        // its data stream.
        let request_id = match header(&s.headers, "requestid") {
            Some(r) => r.to_string(),
            None if kind == "data" => s.id.saturating_sub(2).to_string(),
            None => s.id.to_string(),
        };
        let pair = pairs.entry(request_id.clone()).or_default();
        match kind.as_str() {
            "error" => pair.error = Some(s),
            "data" => pair.data = Some(s),
            _ => continue,
        }
        if pair.error.is_none() || pair.data.is_none() {
            continue;
        }
        let Some(Pair {
            error: Some(error),
            data: Some(data),
        }) = pairs.remove(&request_id)
        else {
            continue;
        };
        let (sender, backend, sandbox_id) =
            (session.sender.clone(), backend.clone(), sandbox_id.clone());
        tasks.push(tokio::spawn(async move {
            let port = header(&data.headers, "port").and_then(|p| p.parse::<u16>().ok());
            let conn = match port {
                None => Err(format!(
                    "invalid port {:?} in the data stream",
                    header(&data.headers, "port")
                )),
                Some(port) => backend.port_forward(&sandbox_id, port).await.map_err(|e| {
                    format!(
                        "error forwarding port {port} to pod {sandbox_id}: {}",
                        e.message()
                    )
                }),
            };
            let conn = match conn {
                Ok(c) => c,
                Err(msg) => {
                    sender.data(error.id, msg.as_bytes()).await;
                    sender.fin(error.id).await;
                    sender.fin(data.id).await;
                    return;
                }
            };
            let (r, mut w) = tokio::io::split(conn);
            let mut input = data.data;
            let up = tokio::spawn(async move {
                while let Some(d) = input.recv().await {
                    if w.write_all(&d).await.is_err() {
                        return;
                    }
                }
                let _ = w.shutdown().await;
            });
            forward(r, data.id, sender.clone()).await;
            sender.fin(error.id).await;
            let _ = up.await;
        }));
    }
    for t in tasks {
        t.abort();
    }
    session.close().await;
}
