//! The async client of a sandbox process, used by the built-in runtime inside the agent's tokio
//! process: requests and answers over the sandbox's socket, exec and attach streams. What the
//! sandbox left on disk is read in `disk`, whether its process is alive is told in `liveness`,
//! and [`launch`] (in `launch`) starts a sandbox process by re-executing the agent's binary.

mod disk;
mod launch;
mod liveness;

pub use launch::launch;

use std::path::PathBuf;
use std::time::Duration;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::protocol::{MAX_MESSAGE, Request, Response};
use crate::spec::{
    ContainerSpec, ContainerStatus, Event, ExecResult, ExecSpec, Layout, SandboxState,
    StreamExecSpec,
};
use crate::{Error, Kind, Result, fdpass};

/// How long a plain request may take before the sandbox counts as unresponsive.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// A process started by [`Client::exec_stream`].
#[derive(Debug)]
pub struct StreamExec {
    /// Its PID in the sandbox's PID namespace.
    pub pid: i32,
    /// The master side of its terminal, for a terminal exec.
    pub master: Option<OwnedFd>,
    stream: UnixStream,
    buf: Vec<u8>,
}

impl StreamExec {
    /// Waits for the process to exit; its exit code (128 + signal when killed).
    pub async fn wait(self) -> Result<i32> {
        let mut buf = self.buf;
        let mut reader = BufReader::new(self.stream).take(MAX_MESSAGE as u64);
        if !buf.contains(&b'\n') {
            reader
                .read_until(b'\n', &mut buf)
                .await
                .map_err(|e| Error::new(Kind::Unavailable, format!("reading from sandbox: {e}")))?;
        }
        if buf.is_empty() {
            return Err(Error::new(
                Kind::Unavailable,
                "the sandbox closed the connection before the exec ended",
            ));
        }
        match serde_json::from_slice::<Response>(buf.trim_ascii_end())? {
            Response::Exec(r) => Ok(r.exit_code),
            Response::Error { kind, message } => Err(Error::new(kind, message)),
            r => Err(Client::unexpected(r)),
        }
    }
}

/// A container's output followed by [`Client::attach`].
pub struct Attach {
    /// The write side of the container's stdin, if asked for and it has one.
    pub stdin: Option<OwnedFd>,
    stream: BufReader<tokio::io::Chain<std::io::Cursor<Vec<u8>>, OwnedReadHalf>>,
    done: Option<OwnedWriteHalf>,
}

impl std::fmt::Debug for Attach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attach")
            .field("stdin", &self.stdin)
            .finish()
    }
}

/// See [`Attach::stdin_done`].
#[derive(Debug)]
pub struct StdinDone {
    _write_half: OwnedWriteHalf,
}

/// Which output stream a chunk of attached output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    Stdout,
    Stderr,
}

impl Attach {
    /// What tells the sandbox, when dropped, that this follower's stdin is done (for a
    /// container that takes stdin once). Dropping the `Attach` tells it too.
    pub fn stdin_done(&mut self) -> Option<StdinDone> {
        self.done.take().map(|w| StdinDone { _write_half: w })
    }

    /// The next chunk of output; `None` once the container has exited (or the sandbox went).
    pub async fn next(&mut self) -> Result<Option<(Output, Vec<u8>)>> {
        let mut head = [0u8; 5];
        if let Err(e) = self.stream.read_exact(&mut head).await {
            return match e.kind() {
                std::io::ErrorKind::UnexpectedEof => Ok(None),
                _ => Err(Error::new(Kind::Unavailable, format!("attach: {e}"))),
            };
        }
        let which = match head[0] {
            crate::protocol::ATTACH_STDOUT => Output::Stdout,
            crate::protocol::ATTACH_STDERR => Output::Stderr,
            t => return Err(Error::new(Kind::Internal, format!("bad attach frame {t}"))),
        };
        let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
        if len > crate::protocol::MAX_ATTACH_FRAME {
            return Err(Error::new(
                Kind::Internal,
                format!(
                    "attach frame of {len} bytes (at most {} expected)",
                    crate::protocol::MAX_ATTACH_FRAME
                ),
            ));
        }
        let mut data = vec![0u8; len];
        self.stream
            .read_exact(&mut data)
            .await
            .map_err(|e| Error::new(Kind::Unavailable, format!("attach: {e}")))?;
        Ok(Some((which, data)))
    }
}

/// A handle on one sandbox process, addressed by its state directory. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    layout: Layout,
}

impl Client {
    pub fn new(state_dir: impl Into<PathBuf>) -> Self {
        Client {
            layout: Layout::new(state_dir),
        }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    async fn connect(&self) -> Result<UnixStream> {
        let path = self.layout.socket();
        let short = match crate::sockpath::SocketPath::new(&path) {
            Ok(s) => s,
            Err(source) => return Err(Error::Unreachable { path, source }),
        };
        UnixStream::connect(short.path())
            .await
            .map_err(|source| Error::Unreachable { path, source })
    }

    async fn call(&self, req: &Request, timeout: Duration) -> Result<Response> {
        let work = async {
            let mut stream = self.connect().await?;
            let mut line = serde_json::to_vec(req)?;
            line.push(b'\n');
            let path = self.layout.socket();
            stream
                .write_all(&line)
                .await
                .map_err(|e| Error::io("writing to sandbox", &path, e))?;
            let mut reader = BufReader::new(stream).take(MAX_MESSAGE as u64);
            let mut buf = Vec::new();
            reader
                .read_until(b'\n', &mut buf)
                .await
                .map_err(|e| Error::io("reading from sandbox", &path, e))?;
            if buf.is_empty() {
                return Err(Error::new(
                    Kind::Unavailable,
                    format!("sandbox at {} closed the connection", path.display()),
                ));
            }
            let resp: Response = serde_json::from_slice(&buf)?;
            if matches!(req, Request::Shutdown) && matches!(resp, Response::Ok) {
                // The sandbox holds this connection until its process exits.
                let mut rest = Vec::new();
                let _ = reader.read_to_end(&mut rest).await;
            }
            match resp {
                Response::Error { kind, message } => Err(Error::new(kind, message)),
                r => Ok(r),
            }
        };
        tokio::time::timeout(timeout, work).await.map_err(|_| {
            Error::new(
                Kind::DeadlineExceeded,
                format!("sandbox request timed out after {timeout:?}"),
            )
        })?
    }

    fn unexpected(r: Response) -> Error {
        Error::new(Kind::Internal, format!("unexpected sandbox response {r:?}"))
    }

    /// The sandbox's PID and every container's status.
    pub async fn state(&self) -> Result<SandboxState> {
        match self.call(&Request::State, REQUEST_TIMEOUT).await? {
            Response::State(s) => Ok(s),
            r => Err(Self::unexpected(r)),
        }
    }

    async fn container_call(&self, req: Request, timeout: Duration) -> Result<ContainerStatus> {
        match self.call(&req, timeout).await? {
            Response::Container(s) => Ok(s),
            r => Err(Self::unexpected(r)),
        }
    }

    async fn ok_call(&self, req: Request) -> Result<()> {
        match self.call(&req, REQUEST_TIMEOUT).await? {
            Response::Ok => Ok(()),
            r => Err(Self::unexpected(r)),
        }
    }

    pub async fn create(&self, spec: ContainerSpec) -> Result<ContainerStatus> {
        self.container_call(Request::Create(spec), REQUEST_TIMEOUT)
            .await
    }

    pub async fn start(&self, id: &str) -> Result<ContainerStatus> {
        self.container_call(Request::Start { id: id.into() }, REQUEST_TIMEOUT)
            .await
    }

    /// Sends `signal`, then SIGKILL after `timeout`; returns once the container has exited.
    pub async fn stop(&self, id: &str, signal: i32, timeout: Duration) -> Result<ContainerStatus> {
        let req = Request::Stop {
            id: id.into(),
            signal,
            timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
        };
        self.container_call(req, timeout + REQUEST_TIMEOUT).await
    }

    /// Deletes a container (killing it if needed). Unknown ids succeed.
    pub async fn delete(&self, id: &str) -> Result<()> {
        self.ok_call(Request::Delete { id: id.into() }).await
    }

    /// Runs a process in a container and returns its exit code and output.
    pub async fn exec(&self, spec: ExecSpec) -> Result<ExecResult> {
        let timeout = if spec.timeout_ms == 0 {
            Duration::from_secs(24 * 3600)
        } else {
            Duration::from_millis(spec.timeout_ms) + REQUEST_TIMEOUT
        };
        match self.call(&Request::Exec(spec), timeout).await? {
            Response::Exec(r) => Ok(r),
            r => Err(Self::unexpected(r)),
        }
    }

    /// Sends `req` with `fds` attached and reads the first answer line, keeping the
    /// connection (and anything read past that line) for what follows.
    async fn stream_call(
        &self,
        req: &Request,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(Response, Option<OwnedFd>, UnixStream, Vec<u8>)> {
        let path = self.layout.socket();
        let io_err = |what: &'static str| {
            let path = path.clone();
            move |e: std::io::Error| Error::io(what, &path, e)
        };
        let work = async {
            let mut stream = self.connect().await?;
            let mut line = serde_json::to_vec(req)?;
            line.push(b'\n');
            let sent = stream
                .async_io(Interest::WRITABLE, || fdpass::send(&stream, &line, fds))
                .await
                .map_err(io_err("writing to sandbox"))?;
            stream
                .write_all(&line[sent..])
                .await
                .map_err(io_err("writing to sandbox"))?;
            let mut buf = Vec::new();
            let mut received = Vec::new();
            let mut chunk = [0u8; 4096];
            let end = loop {
                if let Some(end) = buf.iter().position(|&b| b == b'\n') {
                    break end;
                }
                let n = stream
                    .async_io(Interest::READABLE, || {
                        fdpass::recv(&stream, &mut chunk, &mut received)
                    })
                    .await
                    .map_err(io_err("reading from sandbox"))?;
                if n == 0 {
                    return Err(Error::new(
                        Kind::Unavailable,
                        format!("sandbox at {} closed the connection", path.display()),
                    ));
                }
                buf.extend_from_slice(&chunk[..n]);
            };
            let rest = buf.split_off(end + 1);
            match serde_json::from_slice::<Response>(&buf)? {
                Response::Error { kind, message } => Err(Error::new(kind, message)),
                r => Ok((r, received.pop(), stream, rest)),
            }
        };
        tokio::time::timeout(REQUEST_TIMEOUT, work)
            .await
            .map_err(|_| {
                Error::new(
                    Kind::DeadlineExceeded,
                    format!("sandbox request timed out after {REQUEST_TIMEOUT:?}"),
                )
            })?
    }

    /// Starts a process in a container on the caller's stdio: `stdio` (stdin, stdout, stderr)
    /// without a terminal, nothing with one (the terminal's master comes back instead).
    pub async fn exec_stream(
        &self,
        spec: StreamExecSpec,
        stdio: Option<[OwnedFd; 3]>,
    ) -> Result<StreamExec> {
        let fds: Vec<BorrowedFd<'_>> = stdio.iter().flatten().map(|f| f.as_fd()).collect();
        let (r, master, stream, buf) = self.stream_call(&Request::ExecStream(spec), &fds).await?;
        match r {
            Response::ExecStarted { pid } => Ok(StreamExec {
                pid,
                master,
                stream,
                buf,
            }),
            r => Err(Self::unexpected(r)),
        }
    }

    /// Follows a running container's output, with a descriptor of its stdin when `stdin` is
    /// asked and the container was created with one.
    pub async fn attach(&self, id: &str, stdin: bool) -> Result<Attach> {
        let req = Request::Attach {
            id: id.into(),
            stdin,
        };
        match self.stream_call(&req, &[]).await? {
            (Response::Attached, stdin, stream, buf) => {
                let (read, write) = stream.into_split();
                Ok(Attach {
                    stdin,
                    stream: BufReader::new(std::io::Cursor::new(buf).chain(read)),
                    done: Some(write),
                })
            }
            (r, ..) => Err(Self::unexpected(r)),
        }
    }

    pub async fn reopen_log(&self, id: &str) -> Result<()> {
        self.ok_call(Request::ReopenLog { id: id.into() }).await
    }

    /// Applies OCI `LinuxResources` to a container's cgroup.
    pub async fn update_resources(
        &self,
        id: &str,
        resources: &oci_spec::runtime::LinuxResources,
    ) -> Result<()> {
        let resources = serde_json::to_value(resources)?;
        self.ok_call(Request::UpdateResources {
            id: id.into(),
            resources,
        })
        .await
    }

    /// Kills every container, releases the pod and ends the sandbox process; returns once the
    /// process has exited.
    pub async fn shutdown(&self) -> Result<()> {
        self.ok_call(Request::Shutdown).await
    }

    /// Container events from now on, until the sandbox goes away (then the receiver closes).
    pub async fn subscribe(&self) -> Result<tokio::sync::mpsc::Receiver<Event>> {
        let mut stream = self.connect().await?;
        let mut line = serde_json::to_vec(&Request::Subscribe)?;
        line.push(b'\n');
        stream
            .write_all(&line)
            .await
            .map_err(|e| Error::io("writing to sandbox", self.layout.socket(), e))?;
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<Event>(&line) {
                    Ok(ev) => {
                        if tx.send(ev).await.is_err() {
                            break;
                        }
                    }
                    Err(e) => tracing::warn!("bad sandbox event: {e}"),
                }
            }
        });
        Ok(rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An attach frame claiming more than a sandbox ever sends is refused before anything is
    /// allocated for it; a normal one reads.
    #[tokio::test]
    async fn an_oversized_attach_frame_is_refused() {
        use tokio::io::AsyncWriteExt;
        let (ours, mut theirs) = tokio::net::UnixStream::pair().unwrap();
        let (read, write) = ours.into_split();
        let mut attach = Attach {
            stdin: None,
            stream: BufReader::new(std::io::Cursor::new(Vec::new()).chain(read)),
            done: Some(write),
        };
        theirs
            .write_all(&[crate::protocol::ATTACH_STDOUT, 2, 0, 0, 0, b'h', b'i'])
            .await
            .unwrap();
        let (which, data) = attach.next().await.unwrap().unwrap();
        assert_eq!((which, data.as_slice()), (Output::Stdout, &b"hi"[..]));
        theirs
            .write_all(&[crate::protocol::ATTACH_STDERR, 0xff, 0xff, 0xff, 0xff])
            .await
            .unwrap();
        let err = attach.next().await.unwrap_err();
        assert!(
            err.to_string().contains("attach frame of 4294967295 bytes"),
            "{err}"
        );
    }
}
