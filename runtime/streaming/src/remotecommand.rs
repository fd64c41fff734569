//! Exec and attach over WebSocket: the `v4.channel.k8s.io` and `v5.channel.k8s.io`
//! subprotocols of Kubernetes' remotecommand.
//!
//! Every binary message starts with its channel: 0 stdin, 1 stdout, 2 stderr, 3 error (one
//! `metav1.Status` JSON when the process ends), 4 resize (`{"Width":..,"Height":..}`). v5 adds
//! channel 255: `[255, 0]` from the client closes stdin. Before anything else the server sends
//! an empty message on the lowest channel it writes to, telling the client it is ready.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::{Backend, StreamIo, TermSize};
use runtime_types::Result;

pub const V5_PROTOCOL: &str = "v5.channel.k8s.io";
pub const V4_PROTOCOL: &str = "v4.channel.k8s.io";

pub const STDIN: u8 = 0;
pub const STDOUT: u8 = 1;
pub const STDERR: u8 = 2;
pub const ERROR: u8 = 3;
pub const RESIZE: u8 = 4;
/// v5: the client closes one of its streams (the payload is the channel, only stdin is).
pub const CLOSE: u8 = 255;

/// How much a duplex between the socket and the backend buffers.
const PIPE_BUFFER: usize = 64 * 1024;

/// Which streams the request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Streams {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// What a connection runs.
#[derive(Debug, Clone, PartialEq)]
pub enum Session {
    Exec {
        container_id: String,
        cmd: Vec<String>,
        streams: Streams,
    },
    Attach {
        container_id: String,
        streams: Streams,
    },
}

impl Session {
    /// Which streams it asked for.
    pub(crate) fn streams(&self) -> Streams {
        match self {
            Session::Exec { streams, .. } | Session::Attach { streams, .. } => *streams,
        }
    }
}

/// A message on `channel`.
pub fn frame(channel: u8, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(data.len() + 1);
    v.push(channel);
    v.extend_from_slice(data);
    v
}

/// The channel and payload of a message; `None` for an empty one.
pub fn parse(msg: &[u8]) -> Option<(u8, &[u8])> {
    msg.split_first().map(|(c, rest)| (*c, rest))
}

/// The `metav1.Status` the error channel carries when an exec ended with `code`, as upstream
/// writes it: Success, or Failure with reason NonZeroExitCode and the code as an ExitCode cause.
pub fn exit_status(code: i32) -> serde_json::Value {
    if code == 0 {
        return success();
    }
    serde_json::json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("command terminated with non-zero exit code: exit status {code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

/// The `metav1.Status` of a session that ended well.
pub(crate) fn success() -> serde_json::Value {
    serde_json::json!({"metadata": {}, "status": "Success"})
}

/// The status of a session the runtime could not run.
pub fn internal_error(message: &str) -> serde_json::Value {
    let message = format!("error executing command in container: {message}");
    serde_json::json!({
        "metadata": {},
        "status": "Failure",
        "message": format!("Internal error occurred: {message}"),
        "reason": "InternalError",
        "details": {"causes": [{"message": message}]},
        "code": 500,
    })
}

/// Completes the upgrade on v5 or v4 (preferring v5) and serves `session` on the socket.
pub fn upgrade(ws: WebSocketUpgrade, session: Session, backend: Arc<dyn Backend>) -> Response {
    let ws = ws.protocols([V5_PROTOCOL, V4_PROTOCOL]);
    let v5 = match ws.selected_protocol().and_then(|p| p.to_str().ok()) {
        Some(V5_PROTOCOL) => true,
        Some(V4_PROTOCOL) => false,
        _ => {
            return (
                StatusCode::BAD_REQUEST,
                format!("supported subprotocols: {V5_PROTOCOL}, {V4_PROTOCOL}\n"),
            )
                .into_response();
        }
    };
    ws.on_upgrade(move |socket| serve(socket, v5, session, backend))
}

/// Copies `r` to the socket as messages on `channel` until end of file.
pub(super) async fn forward(mut r: impl AsyncRead + Unpin, channel: u8, tx: mpsc::Sender<Message>) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match r.read(&mut buf[1..]).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                buf[0] = channel;
                let msg = Message::Binary(Bytes::copy_from_slice(&buf[..=n]));
                if tx.send(msg).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Writes queued messages to the socket, then closes it once every sender is gone.
pub(super) fn writer(
    mut sink: futures::stream::SplitSink<WebSocket, Message>,
) -> (mpsc::Sender<Message>, tokio::task::JoinHandle<()>) {
    let (tx, mut rx) = mpsc::channel::<Message>(32);
    let task = tokio::spawn(async move {
        while let Some(m) = rx.recv().await {
            if sink.send(m).await.is_err() {
                return;
            }
        }
        // A normal closure with its code: clients (Go's gorilla/websocket in kubectl) read a
        // close frame without one as an error (1005) and lose the exit status before it.
        let normal = axum::extract::ws::CloseFrame {
            code: axum::extract::ws::close_code::NORMAL,
            reason: "".into(),
        };
        let _ = sink.send(Message::Close(Some(normal))).await;
        let _ = sink.close().await;
    });
    (tx, task)
}

async fn serve(socket: WebSocket, v5: bool, session: Session, backend: Arc<dyn Backend>) {
    let streams = session.streams();
    let (sink, mut source) = socket.split();
    let (tx, writer) = writer(sink);
    let ready = if streams.stdout {
        STDOUT
    } else if streams.stderr && !streams.tty {
        STDERR
    } else {
        ERROR
    };
    let _ = tx.send(Message::Binary(frame(ready, &[]).into())).await;

    let mut forwarders = Vec::new();
    let mut output = |wanted: bool, channel: u8| {
        wanted.then(|| {
            let (w, r) = tokio::io::duplex(PIPE_BUFFER);
            forwarders.push(tokio::spawn(forward(r, channel, tx.clone())));
            Box::new(w) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>
        })
    };
    let stdout = output(streams.stdout, STDOUT);
    let stderr = output(streams.stderr && !streams.tty, STDERR);
    let (stdin_w, stdin_r) = if streams.stdin {
        let (w, r) = tokio::io::duplex(PIPE_BUFFER);
        (
            Some(w),
            Some(Box::new(r) as Box<dyn AsyncRead + Send + Unpin>),
        )
    } else {
        (None, None)
    };
    let (resize_tx, resize) = mpsc::channel::<TermSize>(16);
    let io = StreamIo {
        stdin: stdin_r,
        stdout,
        stderr,
        tty: streams.tty,
        resize,
    };

    let mut reader = tokio::spawn(async move {
        let mut stdin = stdin_w;
        while let Some(Ok(msg)) = source.next().await {
            let data = match msg {
                Message::Binary(d) => d,
                Message::Close(_) => break,
                _ => continue,
            };
            match parse(&data) {
                Some((STDIN, payload)) => {
                    if let Some(w) = stdin.as_mut() {
                        if w.write_all(payload).await.is_err() {
                            stdin = None;
                        }
                    }
                }
                Some((RESIZE, payload)) if streams.tty => {
                    match serde_json::from_slice::<TermSize>(payload) {
                        Ok(size) => {
                            let _ = resize_tx.send(size).await;
                        }
                        Err(e) => tracing::debug!("bad resize message: {e}"),
                    }
                }
                Some((CLOSE, [STDIN, ..])) if v5 => stdin = None,
                _ => {}
            }
        }
    });

    let mut client_gone = false;
    let result: Result<Option<i32>> = match session {
        Session::Exec {
            container_id, cmd, ..
        } => backend.exec(&container_id, cmd, io).await.map(Some),
        // An attach also ends when the client goes (the container runs on).
        Session::Attach { container_id, .. } => tokio::select! {
            r = backend.attach(&container_id, io) => r.map(|()| None),
            _ = &mut reader => {
                client_gone = true;
                Ok(None)
            }
        },
    };
    for f in forwarders {
        let _ = f.await;
    }
    let status = match result {
        Ok(Some(code)) => exit_status(code),
        Ok(None) => success(),
        Err(e) => {
            tracing::warn!("streaming session failed: {e}");
            internal_error(e.message())
        }
    };
    let status = serde_json::to_vec(&status).unwrap_or_default();
    let _ = tx.send(Message::Binary(frame(ERROR, &status).into())).await;
    drop(tx);
    let _ = writer.await;
    // The client answers the close frame with its own (RFC 6455, 7.1.1): what it sent until
    // then is read, so the connection does not close with unread data, which the kernel turns
    // into a reset. A reset can overtake the exit status on its way through a proxy (the
    // kubelet's, the API server's), and the client then sees an abnormal closure (1006).
    if !client_gone && tokio::time::timeout(CLOSE_WAIT, &mut reader).await.is_err() {
        reader.abort();
    }
}

/// How long a session waits for the client's close frame after its own.
const CLOSE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_carry_their_channel_first() {
        assert_eq!(frame(STDOUT, b"hi"), b"\x01hi");
        assert_eq!(parse(b"\x00typed"), Some((STDIN, &b"typed"[..])));
        assert_eq!(parse(b"\x04"), Some((RESIZE, &b""[..])));
        assert_eq!(parse(b""), None);
    }

    #[test]
    fn resize_messages_use_upstream_field_names() {
        let size: TermSize = serde_json::from_slice(br#"{"Width":120,"Height":40}"#).unwrap();
        assert_eq!(
            size,
            TermSize {
                width: 120,
                height: 40
            }
        );
    }

    #[test]
    fn exit_codes_become_upstream_statuses() {
        assert_eq!(
            exit_status(0),
            serde_json::json!({"metadata": {}, "status": "Success"})
        );
        let failed = exit_status(3);
        assert_eq!(failed["status"], "Failure");
        assert_eq!(failed["reason"], "NonZeroExitCode");
        assert_eq!(
            failed["details"]["causes"],
            serde_json::json!([{"reason": "ExitCode", "message": "3"}])
        );
        let internal = internal_error("no such container");
        assert_eq!(internal["reason"], "InternalError");
        assert_eq!(internal["code"], 500);
    }
}
