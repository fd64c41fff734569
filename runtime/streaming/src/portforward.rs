//! Port-forward over WebSocket (`v4.channel.k8s.io`, or no subprotocol), as upstream's
//! websocket port-forward: the ports come as `?port=` query parameters (repeated or
//! comma-separated); port i gets data channel 2i and error channel 2i+1, and the server's first
//! message on each is the port as two little-endian bytes. Each port is one connection into the
//! pod; the socket closes once every connection has ended.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::Backend;
use super::remotecommand::{forward, frame, parse, writer};

pub const V4_PROTOCOL: &str = "v4.channel.k8s.io";

/// The ports a request asks for, from its query string (`port=80&port=8080,9090`).
pub fn query_ports(query: &str) -> Result<Vec<u16>, String> {
    let mut ports = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "port" {
            continue;
        }
        let value = value.replace("%2C", ",").replace("%2c", ",");
        if value.is_empty() {
            return Err("query parameter \"port\" cannot be empty".into());
        }
        for p in value.split(',') {
            match p.parse::<u16>() {
                Ok(0) => return Err(format!("port {p:?} must be > 0")),
                Ok(port) => ports.push(port),
                Err(e) => return Err(format!("unable to parse {p:?} as a port: {e}")),
            }
        }
    }
    if ports.is_empty() {
        return Err("query parameter \"port\" is required".into());
    }
    if ports.len() > MAX_PORTS {
        return Err(format!("at most {MAX_PORTS} ports at once"));
    }
    Ok(ports)
}

/// Completes the upgrade and forwards `ports` of the pod `sandbox_id` over the socket.
pub fn upgrade(
    ws: WebSocketUpgrade,
    sandbox_id: String,
    ports: Vec<u16>,
    backend: Arc<dyn Backend>,
) -> Response {
    ws.protocols([V4_PROTOCOL])
        .on_upgrade(move |socket| serve(socket, sandbox_id, ports, backend))
}

async fn serve(socket: WebSocket, sandbox_id: String, ports: Vec<u16>, backend: Arc<dyn Backend>) {
    let (sink, mut source) = socket.split();
    let (tx, writer) = writer(sink);
    let mut inputs = Vec::new();
    let mut tasks = Vec::new();
    for (i, port) in ports.into_iter().enumerate() {
        let (data, error) = (channel(2 * i), channel(2 * i + 1));
        for ch in [data, error] {
            let _ = tx
                .send(Message::Binary(frame(ch, &port.to_le_bytes()).into()))
                .await;
        }
        let (in_tx, mut in_rx) = mpsc::channel::<Bytes>(32);
        inputs.push(in_tx);
        let (tx, backend, sandbox_id) = (tx.clone(), backend.clone(), sandbox_id.clone());
        tasks.push(tokio::spawn(async move {
            let conn = match backend.port_forward(&sandbox_id, port).await {
                Ok(c) => c,
                Err(e) => {
                    let msg = format!(
                        "error forwarding port {port} to pod {sandbox_id}: {}",
                        e.message()
                    );
                    let _ = tx
                        .send(Message::Binary(frame(error, msg.as_bytes()).into()))
                        .await;
                    return;
                }
            };
            let (r, mut w) = tokio::io::split(conn);
            let up = tokio::spawn(async move {
                while let Some(d) = in_rx.recv().await {
                    if w.write_all(&d).await.is_err() {
                        return;
                    }
                }
                let _ = w.shutdown().await;
            });
            forward(r, data, tx).await;
            up.abort();
        }));
    }
    let reader = tokio::spawn(async move {
        while let Some(Ok(msg)) = source.next().await {
            let data = match msg {
                Message::Binary(d) => d,
                Message::Close(_) => break,
                _ => continue,
            };
            if let Some((ch, payload)) = parse(&data) {
                let ch = usize::from(ch);
                if ch % 2 == 0 && !payload.is_empty() {
                    if let Some(input) = inputs.get(ch / 2) {
                        let _ = input.send(Bytes::copy_from_slice(payload)).await;
                    }
                }
            }
        }
    });
    for t in tasks {
        let _ = t.await;
    }
    drop(tx);
    reader.abort();
    let _ = writer.await;
}

/// Channel numbers are one byte: two per port.
pub const MAX_PORTS: usize = 128;

fn channel(n: usize) -> u8 {
    u8::try_from(n).unwrap_or(u8::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_come_from_repeated_and_comma_separated_parameters() {
        assert_eq!(query_ports("port=80").unwrap(), vec![80]);
        assert_eq!(
            query_ports("port=80&x=1&port=8080,9090").unwrap(),
            vec![80, 8080, 9090]
        );
        assert_eq!(query_ports("port=1%2C2").unwrap(), vec![1, 2]);
    }

    #[test]
    fn bad_ports_are_refused() {
        assert!(query_ports("").unwrap_err().contains("required"));
        assert!(query_ports("port=").unwrap_err().contains("empty"));
        assert!(query_ports("port=0").unwrap_err().contains("> 0"));
        assert!(query_ports("port=70000").is_err());
        assert!(query_ports("port=http").is_err());
        let many = vec!["port=1"; MAX_PORTS + 1].join("&");
        assert!(query_ports(&many).unwrap_err().contains("at most"));
    }
}
