//! The async client of a sandbox process, used by the built-in runtime inside the agent's tokio
//! process, and [`launch`], which starts a sandbox process by re-executing the agent's binary.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

use crate::protocol::{MAX_MESSAGE, Request, Response};
use crate::spec::{
    ContainerSpec, ContainerStatus, Event, ExecResult, ExecSpec, Layout, SandboxState, Spec,
    StreamExecSpec,
};
use crate::{Error, Kind, Result, fdpass};

/// How long a plain request may take before the sandbox counts as unresponsive.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts the sandbox process for `spec` in `state_dir` by running `program args... state_dir`
/// (the agent's own binary with its hidden sandbox subcommand). Returns the sandbox's PID once it
/// serves. The state dir is created; a failed start leaves the dir for the caller to remove.
pub async fn launch(program: &Path, args: &[&str], state_dir: &Path, spec: &Spec) -> Result<i32> {
    let layout = Layout::new(state_dir);
    tokio::fs::create_dir_all(state_dir)
        .await
        .map_err(|e| Error::io("creating", state_dir, e))?;
    let text = serde_json::to_vec_pretty(spec)?;
    tokio::fs::write(layout.spec(), text)
        .await
        .map_err(|e| Error::io("writing", layout.spec(), e))?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(layout.log())
        .map_err(|e| Error::io("opening", layout.log(), e))?;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .arg(state_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .kill_on_drop(false)
        .spawn()
        .map_err(|e| Error::io("starting sandbox process", program, e))?;
    let mut out = String::new();
    if let Some(mut stdout) = child.stdout.take() {
        stdout
            .read_to_string(&mut out)
            .await
            .map_err(|e| Error::io("reading from sandbox process", program, e))?;
    }
    let _ = child.wait().await;
    let out = out.trim();
    if let Some(pid) = out.strip_prefix("ok ") {
        return pid
            .parse()
            .map_err(|_| Error::new(Kind::Internal, format!("sandbox reported {out:?}")));
    }
    let (kind, msg) = setup_failure(out.strip_prefix("err ").unwrap_or(out));
    Err(Error::new(
        kind,
        format!("starting sandbox {}: {msg}", spec.id),
    ))
}

/// The kind and message of a failed sandbox set-up, reported as `<Kind> <message>` (or, from
/// the launcher side, a bare message). Only `InvalidArgument` and `FailedPrecondition` are
/// passed on: a sandbox that could not be set up is an internal failure unless its spec was at
/// fault or the node was not in a state to take it (a node port in use, a broken bridge).
fn setup_failure(reported: &str) -> (Kind, &str) {
    match reported.split_once(' ') {
        Some(("InvalidArgument", msg)) => (Kind::InvalidArgument, msg),
        Some(("FailedPrecondition", msg)) => (Kind::FailedPrecondition, msg),
        Some((k, msg)) if serde_json::from_str::<Kind>(&format!("{k:?}")).is_ok() => {
            (Kind::Internal, msg)
        }
        _ => (Kind::Internal, reported),
    }
}

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

    /// Kills every container, releases the pod and ends the sandbox process.
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

    /// Container statuses persisted on disk: what is known of a sandbox whose process is gone.
    pub fn persisted(&self) -> Vec<ContainerStatus> {
        crate::process::read_persisted(&self.layout)
    }

    /// Whether the sandbox process is alive: the process its pid file names exists and serves
    /// this state dir (a PID another process reuses does not count). Before its pid file is
    /// written (during set-up) it counts as alive.
    pub fn process_alive(&self) -> bool {
        match std::fs::read_to_string(self.layout.pid_file()) {
            Ok(text) => self.serving(&text).is_some(),
            Err(_) => !self.is_stopped(),
        }
    }

    /// The sandbox process's PID, while it is alive.
    pub fn pid(&self) -> Option<i32> {
        let text = std::fs::read_to_string(self.layout.pid_file()).ok()?;
        self.serving(&text)
    }

    /// SIGKILLs every process serving this state dir, whatever its pid file says (a sandbox
    /// whose launch was cut short may not have written it yet), and waits (a few seconds at
    /// most) until they are gone. For a sandbox being discarded. Returns how many there were.
    pub fn kill_serving(&self) -> usize {
        use std::os::unix::fs::MetadataExt;
        let Ok(ours) = std::fs::metadata(&self.layout.dir) else {
            return 0;
        };
        let me = std::process::id() as i32;
        let pids: Vec<i32> = std::fs::read_dir("/proc")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                    .filter(|&pid| pid != me && self.serves(pid, ours.dev(), ours.ino()))
                    .collect()
            })
            .unwrap_or_default();
        for &pid in &pids {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::time::Instant::now() < deadline
            && pids.iter().any(|&p| self.serves(p, ours.dev(), ours.ino()))
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        pids.len()
    }

    /// Whether any process serves this state dir, whatever its pid file says.
    pub fn served(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let Ok(ours) = std::fs::metadata(&self.layout.dir) else {
            return false;
        };
        let me = std::process::id() as i32;
        std::fs::read_dir("/proc").is_ok_and(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .any(|pid| pid != me && self.serves(pid, ours.dev(), ours.ino()))
        })
    }

    /// The PID in the pid file's `text`, if that process serves this state dir: its last
    /// argument is its state dir, however spelled (compared as the same directory).
    fn serving(&self, text: &str) -> Option<i32> {
        use std::os::unix::fs::MetadataExt;
        let pid: i32 = text.trim().parse().ok()?;
        let ours = std::fs::metadata(&self.layout.dir).ok()?;
        self.serves(pid, ours.dev(), ours.ino()).then_some(pid)
    }

    /// Whether process `pid` serves the state dir `(dev, ino)`: its last argument names it.
    fn serves(&self, pid: i32, dev: u64, ino: u64) -> bool {
        self.serves_dir(pid, dev, ino).unwrap_or(false)
    }

    fn serves_dir(&self, pid: i32, dev: u64, ino: u64) -> Option<bool> {
        use std::os::unix::fs::MetadataExt;
        // A zombie has no command line: it serves nothing.
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let last = cmd.split(|b| *b == 0).rfind(|arg| !arg.is_empty())?;
        let arg = Path::new(std::ffi::OsStr::from_bytes(last));
        let dir = if arg.is_absolute() {
            arg.to_path_buf()
        } else {
            Path::new(&format!("/proc/{pid}/cwd")).join(arg)
        };
        let m = std::fs::metadata(dir).ok()?;
        Some(m.dev() == dev && m.ino() == ino)
    }

    /// The spec the sandbox was launched with.
    pub fn spec(&self) -> Result<crate::Spec> {
        let path = self.layout.spec();
        let text = std::fs::read(&path).map_err(|e| Error::io("reading", &path, e))?;
        Ok(serde_json::from_slice(&text)?)
    }

    /// After the sandbox process died without shutting down: see [`crate::process::reap_dead`].
    /// Blocks (kills and waits, at most seconds).
    pub fn reap_dead(&self, cgroup_parent: &str) -> Result<Vec<ContainerStatus>> {
        crate::process::reap_dead(&self.layout, cgroup_parent)
    }

    /// For a sandbox whose state dir is gone while its process is too (the dir was on a tmpfs
    /// that a reboot emptied): makes the state dir again as a shut-down sandbox's, holding
    /// `containers` as their persisted statuses (what the caller still knows of them), so that
    /// they read, are reaped ([`Self::reap_dead`]) and removed as any stopped sandbox's.
    pub fn restore_lost(&self, containers: &[ContainerStatus]) -> Result<()> {
        let dir = self.layout.status_dir();
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("creating", &dir, e))?;
        for status in containers {
            crate::process::persist(&self.layout, status);
        }
        let marker = self.layout.stopped_marker();
        std::fs::write(&marker, b"").map_err(|e| Error::io("writing", &marker, e))
    }

    /// Whether the sandbox has been shut down (its process ended after cleaning up).
    pub fn is_stopped(&self) -> bool {
        self.layout.stopped_marker().exists()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setup_failures_keep_invalid_argument_only() {
        assert_eq!(
            setup_failure("InvalidArgument setting sysctl a.b=1: No such file"),
            (Kind::InvalidArgument, "setting sysctl a.b=1: No such file")
        );
        assert_eq!(
            setup_failure("NotFound reading spec.json: gone"),
            (Kind::Internal, "reading spec.json: gone")
        );
        assert_eq!(
            setup_failure("the sandbox process died during set-up"),
            (Kind::Internal, "the sandbox process died during set-up")
        );
    }

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
