//! Exec and attach over SPDY (`v4.channel.k8s.io`): the client opens one stream per kind,
//! named by its `streamType` header (error, stdin, stdout, stderr, resize); the server waits
//! for those the request needs, runs the session, writes the `metav1.Status` on the error
//! stream and closes. Resize messages are consecutive `{"Width":..,"Height":..}` JSON values.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

use super::header;
use super::session::{Incoming, Sender, Session};
use crate::remotecommand::{Session as Request, exit_status, internal_error};
use crate::{Backend, StreamIo, TermSize};

/// The subprotocol served over SPDY.
pub const PROTOCOL: &str = "v4.channel.k8s.io";

/// How long the client has to open every stream it needs (upstream's default).
const STREAM_CREATION_TIMEOUT: Duration = Duration::from_secs(30);

const PIPE_BUFFER: usize = 64 * 1024;

/// Serves one exec or attach on an upgraded connection.
pub async fn serve(
    io: impl AsyncRead + AsyncWrite + Send + 'static,
    request: Request,
    backend: Arc<dyn Backend>,
) {
    let mut session = Session::start(io);
    let streams = match &request {
        Request::Exec { streams, .. } | Request::Attach { streams, .. } => *streams,
    };
    let mut wanted = vec!["error"];
    if streams.stdin {
        wanted.push("stdin");
    }
    if streams.stdout {
        wanted.push("stdout");
    }
    if streams.stderr && !streams.tty {
        wanted.push("stderr");
    }
    if streams.tty {
        wanted.push("resize");
    }
    let mut got: Vec<(String, Incoming)> = Vec::new();
    let collect = async {
        while got.len() < wanted.len() {
            let Some(s) = session.incoming.recv().await else {
                return false;
            };
            let kind = header(&s.headers, "streamtype")
                .unwrap_or("")
                .to_ascii_lowercase();
            if wanted.contains(&kind.as_str()) && !got.iter().any(|(k, _)| *k == kind) {
                got.push((kind, s));
            }
        }
        true
    };
    match tokio::time::timeout(STREAM_CREATION_TIMEOUT, collect).await {
        Ok(true) => {}
        _ => {
            tracing::debug!("spdy remotecommand: the client did not open its streams");
            session.close().await;
            return;
        }
    }
    let mut take = |kind: &str| {
        got.iter()
            .position(|(k, _)| k == kind)
            .map(|i| got.swap_remove(i).1)
    };
    let error = take("error");
    let stdin = take("stdin");
    let stdout = take("stdout");
    let stderr = take("stderr");
    let resize_stream = take("resize");
    let sender = session.sender.clone();

    let mut forwarders = Vec::new();
    let mut output = |s: Option<Incoming>| {
        s.map(|s| {
            let (w, r) = tokio::io::duplex(PIPE_BUFFER);
            forwarders.push(tokio::spawn(forward(r, s.id, sender.clone())));
            Box::new(w) as Box<dyn AsyncWrite + Send + Unpin>
        })
    };
    let stdout_w = output(stdout);
    let stderr_w = output(stderr);
    let stdin_r = stdin.map(|mut s| {
        let (mut w, r) = tokio::io::duplex(PIPE_BUFFER);
        tokio::spawn(async move {
            while let Some(d) = s.data.recv().await {
                if w.write_all(&d).await.is_err() {
                    return;
                }
            }
        });
        Box::new(r) as Box<dyn AsyncRead + Send + Unpin>
    });
    let (resize_tx, resize) = mpsc::channel::<TermSize>(16);
    if let Some(mut s) = resize_stream {
        tokio::spawn(async move {
            let mut pending = Vec::new();
            while let Some(d) = s.data.recv().await {
                pending.extend_from_slice(&d);
                let mut values =
                    serde_json::Deserializer::from_slice(&pending).into_iter::<TermSize>();
                let mut used = 0;
                while let Some(Ok(size)) = values.next() {
                    used = values.byte_offset();
                    let _ = resize_tx.send(size).await;
                }
                pending.drain(..used);
            }
        });
    }
    let io = StreamIo {
        stdin: stdin_r,
        stdout: stdout_w,
        stderr: stderr_w,
        tty: streams.tty,
        resize,
    };
    let result = match request {
        Request::Exec {
            container_id, cmd, ..
        } => backend.exec(&container_id, cmd, io).await.map(Some),
        Request::Attach { container_id, .. } => {
            // The client going away (the connection's end) ends an attach.
            let mut gone =
                std::pin::pin!(async { while session.incoming.recv().await.is_some() {} });
            tokio::select! {
                r = backend.attach(&container_id, io) => r.map(|()| None),
                _ = &mut gone => Ok(None),
            }
        }
    };
    for f in forwarders {
        let _ = f.await;
    }
    let status = match result {
        Ok(Some(code)) => exit_status(code),
        Ok(None) => serde_json::json!({"metadata": {}, "status": "Success"}),
        Err(e) => internal_error(e.message()),
    };
    if let Some(error) = error {
        let status = serde_json::to_vec(&status).unwrap_or_default();
        sender.data(error.id, &status).await;
        sender.fin(error.id).await;
    }
    drop(sender);
    session.close().await;
}

/// Copies `r` onto stream `id` until end of file, then ends the stream.
pub(super) async fn forward(mut r: impl AsyncRead + Unpin, id: u32, sender: Sender) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if !sender.data(id, &buf[..n]).await {
                    return;
                }
            }
        }
    }
    sender.fin(id).await;
}
