//! Exec and attach over SPDY (`v4.channel.k8s.io`): the client opens one stream per kind,
//! named by its `streamType` header (error, stdin, stdout, stderr, resize); the server waits
//! for those the request needs, runs the session, writes the `metav1.Status` on the error
//! stream and closes. Resize messages are consecutive `{"Width":..,"Height":..}` JSON values.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::header;
use super::session::{Incoming, Sender, Session};
use crate::remotecommand::{Session as Request, Streams, exit_status, internal_error, success};
use crate::{Backend, Result, StreamIo, TermSize};

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
    let streams = request.streams();
    let Some(mut opened) = open_streams(&mut session, &wanted(streams)).await else {
        tracing::debug!("spdy remotecommand: the client did not open its streams");
        session.close().await;
        return;
    };
    let error = opened.take("error");
    let sender = session.sender.clone();
    let (io, forwarders) = pipes(&mut opened, streams.tty, &sender);
    let result = run(request, &*backend, io, &mut session).await;
    for f in forwarders {
        let _ = f.await;
    }
    if let Some(error) = error {
        let status = match result {
            Ok(Some(code)) => exit_status(code),
            Ok(None) => success(),
            Err(e) => internal_error(e.message()),
        };
        let status = serde_json::to_vec(&status).unwrap_or_default();
        sender.data(error.id, &status).await;
        sender.fin(error.id).await;
    }
    drop(sender);
    session.close().await;
}

/// The kinds of stream a session with `streams` needs the client to open.
fn wanted(streams: Streams) -> Vec<&'static str> {
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
    wanted
}

/// The streams the client opened, by kind.
struct Opened(Vec<(String, Incoming)>);

impl Opened {
    fn take(&mut self, kind: &str) -> Option<Incoming> {
        let i = self.0.iter().position(|(k, _)| k == kind)?;
        Some(self.0.swap_remove(i).1)
    }
}

/// Waits (for [`STREAM_CREATION_TIMEOUT`] at most) until the client has opened a stream of
/// each `wanted` kind; `None` if it does not. Streams of other kinds, and second ones of a
/// kind, are ignored.
async fn open_streams(session: &mut Session, wanted: &[&str]) -> Option<Opened> {
    let mut got: Vec<(String, Incoming)> = Vec::new();
    let collect = async {
        while got.len() < wanted.len() {
            let s = session.incoming.recv().await?;
            let kind = header(&s.headers, "streamtype")
                .unwrap_or("")
                .to_ascii_lowercase();
            if wanted.contains(&kind.as_str()) && !got.iter().any(|(k, _)| *k == kind) {
                got.push((kind, s));
            }
        }
        Some(())
    };
    match tokio::time::timeout(STREAM_CREATION_TIMEOUT, collect).await {
        Ok(Some(())) => Some(Opened(got)),
        _ => None,
    }
}

/// The backend's side of the opened stdio streams: output written to it is copied onto the
/// client's streams by the forwarders returned (done once the output ends), what the client
/// sends on stdin and resize is read from it.
fn pipes(opened: &mut Opened, tty: bool, sender: &Sender) -> (StreamIo, Vec<JoinHandle<()>>) {
    let stdin = opened.take("stdin");
    let stdout = opened.take("stdout");
    let stderr = opened.take("stderr");
    let resize = opened.take("resize");
    let mut forwarders = Vec::new();
    let mut output = |s: Option<Incoming>| {
        s.map(|s| {
            let (w, r) = tokio::io::duplex(PIPE_BUFFER);
            forwarders.push(tokio::spawn(forward(r, s.id, sender.clone())));
            Box::new(w) as Box<dyn AsyncWrite + Send + Unpin>
        })
    };
    let stdout = output(stdout);
    let stderr = output(stderr);
    let io = StreamIo {
        stdin: stdin.map(stdin_pipe),
        stdout,
        stderr,
        tty,
        resize: resize_messages(resize),
    };
    (io, forwarders)
}

/// What the client sends on its stdin stream, as a reader.
fn stdin_pipe(mut s: Incoming) -> Box<dyn AsyncRead + Send + Unpin> {
    let (mut w, r) = tokio::io::duplex(PIPE_BUFFER);
    tokio::spawn(async move {
        while let Some(d) = s.data.recv().await {
            if w.write_all(&d).await.is_err() {
                return;
            }
        }
    });
    Box::new(r)
}

/// The terminal sizes the client sends on its resize stream (consecutive JSON values, split
/// anywhere); none without one.
fn resize_messages(stream: Option<Incoming>) -> mpsc::Receiver<TermSize> {
    let (resize_tx, resize) = mpsc::channel::<TermSize>(16);
    if let Some(mut s) = stream {
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
    resize
}

/// Runs the exec (its exit code) or the attach (`None`) on `io`.
async fn run(
    request: Request,
    backend: &dyn Backend,
    io: StreamIo,
    session: &mut Session,
) -> Result<Option<i32>> {
    match request {
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
    }
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
