//! The built-in runtime behind the streaming server: exec on the client's stdio through the
//! sandbox process (descriptors passed over its socket, or a terminal made in the container),
//! and port-forward by connecting from inside the pod's network namespace.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Weak};

use nix::fcntl::OFlag;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{BuiltinRuntime, Inner, sandbox_error};
use crate::streaming::{Backend, Duplex, StreamIo, TermSize};
use crate::{Error, Result, cri};

/// The streaming server's way back to the runtime (weak: the runtime owns the server).
pub(super) struct StreamBackend {
    pub(super) inner: Weak<Inner>,
}

impl StreamBackend {
    fn runtime(&self) -> Result<BuiltinRuntime> {
        self.inner
            .upgrade()
            .map(|inner| BuiltinRuntime { inner })
            .ok_or_else(|| Error::unavailable("the runtime is shutting down"))
    }
}

#[async_trait::async_trait]
impl Backend for StreamBackend {
    async fn exec(&self, container_id: &str, cmd: Vec<String>, io: StreamIo) -> Result<i32> {
        self.runtime()?.exec_streaming(container_id, cmd, io).await
    }

    async fn attach(&self, container_id: &str, io: StreamIo) -> Result<()> {
        self.runtime()?.attach_streaming(container_id, io).await
    }

    async fn port_forward(&self, pod_sandbox_id: &str, port: u16) -> Result<Box<dyn Duplex>> {
        self.runtime()?.connect_in_pod(pod_sandbox_id, port).await
    }
}

impl BuiltinRuntime {
    /// The streaming server, started on first use at the configured address.
    pub async fn streaming_server(&self) -> Result<&crate::streaming::Server> {
        self.inner
            .streaming
            .get_or_try_init(|| {
                let backend = Arc::new(StreamBackend {
                    inner: Arc::downgrade(&self.inner),
                });
                crate::streaming::Server::start(self.inner.cfg.streaming.clone(), backend)
            })
            .await
    }

    pub(super) async fn exec_url(&self, req: cri::ExecRequest) -> Result<cri::ExecResponse> {
        self.need_running(&req.container_id).await?;
        self.streaming_server().await?.get_exec(req)
    }

    /// A container that exists and runs (as containerd checks before Exec and Attach).
    async fn need_running(&self, id: &str) -> Result<()> {
        let rec = self.inner.records.need_container(id)?;
        match self.status_of(&rec).await.map(|s| s.state) {
            Some(sandbox::State::Running) => Ok(()),
            state => Err(Error::failed_precondition(format!(
                "container {} is not running ({state:?})",
                rec.id
            ))),
        }
    }

    pub(super) async fn attach_url(&self, req: cri::AttachRequest) -> Result<cri::AttachResponse> {
        self.need_running(&req.container_id).await?;
        self.streaming_server().await?.get_attach(req)
    }

    pub(super) async fn port_forward_url(
        &self,
        req: cri::PortForwardRequest,
    ) -> Result<cri::PortForwardResponse> {
        self.inner.records.need_sandbox(&req.pod_sandbox_id)?;
        self.streaming_server().await?.get_port_forward(req)
    }

    async fn exec_streaming(
        &self,
        container_id: &str,
        cmd: Vec<String>,
        io: StreamIo,
    ) -> Result<i32> {
        let rec = self.inner.records.need_container(container_id)?;
        let client = self.client(&rec.sandbox_id);
        let spec = sandbox::StreamExecSpec {
            container_id: rec.id.clone(),
            args: cmd,
            tty: io.tty,
        };
        if io.tty {
            let started = client
                .exec_stream(spec, None)
                .await
                .map_err(sandbox_error)?;
            let master = started
                .master
                .as_ref()
                .ok_or_else(|| Error::internal("the sandbox sent no terminal"))?
                .try_clone()
                .map_err(|e| Error::internal(format!("duplicating the terminal: {e}")))?;
            return on_terminal(master, io, started.wait()).await;
        }
        let (stdin_r, stdin_w) = match &io.stdin {
            Some(_) => {
                let (r, w) = pipe()?;
                (r, Some(w))
            }
            None => {
                let null = std::fs::File::open("/dev/null")
                    .map_err(|e| Error::internal(format!("opening /dev/null: {e}")))?;
                (OwnedFd::from(null), None)
            }
        };
        let (stdout_r, stdout_w) = pipe()?;
        let (stderr_r, stderr_w) = pipe()?;
        let started = client
            .exec_stream(spec, Some([stdin_r, stdout_w, stderr_w]))
            .await
            .map_err(sandbox_error)?;
        let StreamIo {
            stdin,
            stdout,
            stderr,
            ..
        } = io;
        let input = match (stdin, stdin_w) {
            (Some(from), Some(to)) => {
                let to = tokio::net::unix::pipe::Sender::from_owned_fd(to)
                    .map_err(|e| Error::internal(format!("stdin pipe: {e}")))?;
                Some(tokio::spawn(copy_in(from, to)))
            }
            _ => None,
        };
        let out = copy_out(stdout_r, stdout);
        let err = copy_out(stderr_r, stderr);
        let (code, (), ()) = tokio::join!(started.wait(), out, err);
        if let Some(t) = input {
            t.abort();
        }
        code.map_err(sandbox_error)
    }

    /// Follows a container's output (and feeds its stdin) until it exits or the client goes.
    async fn attach_streaming(&self, container_id: &str, io: StreamIo) -> Result<()> {
        let rec = self.inner.records.need_container(container_id)?;
        let terminal = rec.config.tty;
        // A terminal's master comes back as the container's stdin (also for resizing).
        let mut att = self
            .client(&rec.sandbox_id)
            .attach(&rec.id, io.stdin.is_some() || terminal)
            .await
            .map_err(sandbox_error)?;
        let StreamIo {
            stdin,
            mut stdout,
            mut stderr,
            mut resize,
            ..
        } = io;
        let mut sizer = None;
        let input = match (stdin, att.stdin.take()) {
            (stdin, Some(master)) if terminal => {
                let master = Arc::new(master);
                let m = master.clone();
                sizer = Some(tokio::spawn(async move {
                    while let Some(size) = resize.recv().await {
                        set_size(&m, size);
                    }
                }));
                stdin.map(|mut from| {
                    // The master is non-blocking (the sandbox reads it): writes go through a
                    // blocking task that waits for room.
                    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
                    tokio::task::spawn_blocking(move || {
                        while let Some(d) = rx.blocking_recv() {
                            if write_nonblocking(&master, &d).is_err() {
                                return;
                            }
                        }
                    });
                    tokio::spawn(async move {
                        let mut buf = vec![0u8; 8192];
                        while let Ok(n @ 1..) = from.read(&mut buf).await {
                            if tx.send(buf[..n].to_vec()).await.is_err() {
                                break;
                            }
                        }
                    })
                })
            }
            (Some(from), Some(to)) => {
                let to = tokio::net::unix::pipe::Sender::from_owned_fd(to)
                    .map_err(|e| Error::internal(format!("stdin pipe: {e}")))?;
                let done = att.stdin_done();
                Some(tokio::spawn(async move {
                    copy_in(from, to).await;
                    drop(done);
                }))
            }
            _ => None,
        };
        while let Some((which, data)) = att.next().await.map_err(sandbox_error)? {
            let to = match which {
                sandbox::Output::Stdout => stdout.as_mut(),
                sandbox::Output::Stderr => stderr.as_mut(),
            };
            if let Some(to) = to {
                if to.write_all(&data).await.is_err() {
                    break;
                }
            }
        }
        for to in [stdout.as_mut(), stderr.as_mut()].into_iter().flatten() {
            let _ = to.shutdown().await;
        }
        if let Some(t) = input {
            t.abort();
        }
        if let Some(t) = sizer {
            t.abort();
        }
        Ok(())
    }

    /// A TCP connection to `port` on the loopback address in the pod's network namespace.
    async fn connect_in_pod(&self, sandbox_id: &str, port: u16) -> Result<Box<dyn Duplex>> {
        let rec = self.inner.records.need_sandbox(sandbox_id)?;
        let state = self.client(&rec.id).state().await.map_err(sandbox_error)?;
        let netns = format!("/proc/{}/ns/net", state.pid);
        let (tx, rx) = tokio::sync::oneshot::channel();
        // setns changes the calling thread only: a thread of its own, which then ends, keeps
        // the pod's namespace away from every other task.
        std::thread::Builder::new()
            .name("port-forward".into())
            .spawn(move || {
                let _ = tx.send(connect_in(&netns, port));
            })
            .map_err(|e| Error::internal(format!("starting a port-forward thread: {e}")))?;
        let stream = rx
            .await
            .map_err(|_| Error::internal("the port-forward thread died"))??;
        let stream = tokio::net::TcpStream::from_std(stream)
            .map_err(|e| Error::internal(format!("registering the connection: {e}")))?;
        Ok(Box::new(stream))
    }
}

/// Joins the network namespace at `netns` (this thread only) and connects to `port` on its
/// loopback, IPv4 first as containerd does.
fn connect_in(netns: &str, port: u16) -> Result<std::net::TcpStream> {
    let ns = std::fs::File::open(netns)
        .map_err(|e| Error::unavailable(format!("opening {netns}: {e}")))?;
    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| Error::internal(format!("joining {netns}: {e}")))?;
    let stream = std::net::TcpStream::connect(("127.0.0.1", port))
        .or_else(|_| std::net::TcpStream::connect(("::1", port)))
        .map_err(|e| Error::unavailable(format!("connecting to localhost:{port}: {e}")))?;
    stream
        .set_nonblocking(true)
        .map_err(|e| Error::internal(format!("configuring the connection: {e}")))?;
    Ok(stream)
}

/// Writes all of `data` to a non-blocking descriptor (a terminal's master), waiting for room.
fn write_nonblocking(fd: &OwnedFd, mut data: &[u8]) -> std::io::Result<()> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    while !data.is_empty() {
        match rustix::io::write(fd, data) {
            Ok(n) => data = &data[n..],
            Err(rustix::io::Errno::AGAIN) => {
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLOUT)];
                let _ = poll(&mut fds, PollTimeout::from(1000u16));
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Applies a client's terminal size to a terminal.
fn set_size(master: &OwnedFd, TermSize { width, height }: TermSize) {
    let size = rustix::termios::Winsize {
        ws_row: height,
        ws_col: width,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    if let Err(e) = rustix::termios::tcsetwinsize(master, size) {
        tracing::debug!("resizing the terminal: {e}");
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::internal(format!("pipe: {e}")))
}

/// Copies the client's stdin into the process; its end closes the process's stdin.
async fn copy_in(mut from: Box<dyn AsyncRead + Send + Unpin>, mut to: impl AsyncWrite + Unpin) {
    let _ = tokio::io::copy(&mut from, &mut to).await;
    let _ = to.shutdown().await;
}

/// Copies a pipe's read end to the client (or drops the output when the client did not ask
/// for it) until every writer has closed it.
async fn copy_out(from: OwnedFd, to: Option<Box<dyn AsyncWrite + Send + Unpin>>) {
    let Ok(mut from) = tokio::net::unix::pipe::Receiver::from_owned_fd(from) else {
        return;
    };
    let result = match to {
        Some(mut to) => {
            let r = tokio::io::copy(&mut from, &mut to).await;
            let _ = to.shutdown().await;
            r
        }
        None => tokio::io::copy(&mut from, &mut tokio::io::sink()).await,
    };
    if let Err(e) = result {
        tracing::debug!("exec output: {e}");
    }
}

/// Runs a terminal exec: the client's stdin into the terminal's master, its output to stdout,
/// resizes applied to it, until the process has exited and the terminal is drained.
async fn on_terminal(
    master: OwnedFd,
    io: StreamIo,
    exited: impl Future<Output = sandbox::Result<i32>>,
) -> Result<i32> {
    let StreamIo {
        stdin,
        stdout,
        mut resize,
        ..
    } = io;
    let dup = |fd: &OwnedFd| {
        fd.try_clone()
            .map_err(|e| Error::internal(format!("duplicating the terminal: {e}")))
    };
    let reader = tokio::fs::File::from_std(std::fs::File::from(dup(&master)?));
    let writer = tokio::fs::File::from_std(std::fs::File::from(dup(&master)?));
    let input = stdin.map(|from| tokio::spawn(copy_in(from, writer)));
    let sizer = tokio::spawn(async move {
        while let Some(size) = resize.recv().await {
            set_size(&master, size);
        }
    });
    // The master reads EIO once the last process holding the terminal has exited: that ends
    // the copy.
    let output = async move {
        let mut reader = reader;
        match stdout {
            Some(mut to) => {
                let _ = tokio::io::copy(&mut reader, &mut to).await;
                let _ = to.shutdown().await;
            }
            None => {
                let _ = tokio::io::copy(&mut reader, &mut tokio::io::sink()).await;
            }
        }
    };
    let (code, ()) = tokio::join!(exited, output);
    if let Some(t) = input {
        t.abort();
    }
    sizer.abort();
    code.map_err(sandbox_error)
}
