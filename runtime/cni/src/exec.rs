//! Running one plugin: finding its executable, its environment and stdin, the deadline, and what
//! its exit means.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use crate::Error;
use crate::config::check_type;
use crate::error::UNPARSABLE;

/// How much of a plugin's stderr is kept: its end.
const STDERR_KEPT: usize = 4096;
/// The most of a plugin's stdout that is read; a result is a few KiB.
const STDOUT_MAX: usize = 4 << 20;
/// How much of a stdout that is not an error object a [`Error::Plugin`] shows.
const STDOUT_SHOWN: usize = 256;
/// PATH for the plugins when we have none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The executable of plugin `plugin_type`: the first regular file of that name in `dirs`.
pub(crate) fn find(plugin_type: &str, dirs: &[PathBuf]) -> Result<PathBuf, Error> {
    if let Err(why) = check_type(plugin_type) {
        return Err(Error::Unsupported {
            plugin: Some(plugin_type.to_string()),
            what: why,
        });
    }
    for dir in dirs {
        let path = dir.join(plugin_type);
        if std::fs::metadata(&path).is_ok_and(|m| m.is_file()) {
            return Ok(path);
        }
    }
    Err(Error::PluginNotFound {
        plugin: plugin_type.to_string(),
        dirs: dirs.to_vec(),
    })
}

/// One run of a plugin.
pub(crate) struct Call<'a> {
    /// The plugin's type, for errors and logs.
    pub plugin: &'a str,
    pub path: &'a Path,
    pub command: &'static str,
    /// `CNI_*` variables besides CNI_COMMAND and CNI_PATH.
    pub env: Vec<(&'static str, String)>,
    pub stdin: Vec<u8>,
    /// CNI_PATH.
    pub cni_path: &'a str,
    pub timeout: Duration,
}

/// What a plugin that succeeded printed.
pub(crate) struct Output {
    pub stdout: Vec<u8>,
    /// The end of its stderr.
    pub stderr: String,
}

/// Runs the plugin and returns its output when it exits with 0.
///
/// Its environment is the `CNI_*` variables and PATH, no more. It runs in a process group of its
/// own; at the deadline (or when this future is dropped) the whole group is killed.
pub(crate) async fn run(call: Call<'_>) -> Result<Output, Error> {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + call.timeout;
    let mut cmd = Command::new(call.path);
    cmd.env_clear()
        .env(
            "PATH",
            std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
        )
        .env("CNI_COMMAND", call.command)
        .env("CNI_PATH", call.cni_path)
        .envs(call.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);

    let mut child = spawn(&mut cmd, &call, deadline).await?;
    // The group's id is the child's pid (process_group(0)).
    let mut group = GroupKiller(child.id().and_then(|id| i32::try_from(id).ok()));

    let (mut stdin, mut stdout, mut stderr) =
        match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
            (Some(i), Some(o), Some(e)) => (i, o, e),
            _ => {
                return Err(Error::io(
                    format!("running CNI plugin {:?}: no pipes", call.plugin),
                    std::io::ErrorKind::BrokenPipe.into(),
                ));
            }
        };
    let mut out = Capped::new(STDOUT_MAX);
    let mut err = Tail::new(STDERR_KEPT);
    let finished = tokio::time::timeout_at(deadline, async {
        let feed = async {
            // A plugin that does not read its stdin closes the pipe: not our failure.
            let _ = stdin.write_all(&call.stdin).await;
            drop(stdin);
        };
        let ((), read_out, read_err) = tokio::join!(
            feed,
            drain(&mut stdout, |b| out.push(b)),
            drain(&mut stderr, |b| err.push(b)),
        );
        read_out?;
        read_err?;
        child.wait().await
    })
    .await;

    let stderr_text = err.text();
    if !stderr_text.is_empty() {
        tracing::debug!(
            plugin = call.plugin,
            command = call.command,
            stderr = %stderr_text,
            "CNI plugin stderr"
        );
    }
    let status = match finished {
        Ok(Ok(status)) => {
            group.disarm();
            status
        }
        Ok(Err(e)) => {
            return Err(Error::io(
                format!("running CNI plugin {:?} {}", call.plugin, call.command),
                e,
            ));
        }
        Err(_elapsed) => {
            group.kill();
            let _ = child.kill().await;
            tracing::warn!(
                plugin = call.plugin,
                command = call.command,
                timeout = ?call.timeout,
                "CNI plugin timed out; killed its process group"
            );
            return Err(Error::Timeout {
                plugin: call.plugin.to_string(),
                command: call.command.to_string(),
                after: call.timeout,
                stderr: stderr_text,
            });
        }
    };
    tracing::debug!(
        plugin = call.plugin,
        command = call.command,
        %status,
        took = ?started.elapsed(),
        "CNI plugin ran"
    );
    if !status.success() {
        return Err(failure(&call, status, &out.buf, stderr_text));
    }
    if out.truncated {
        return Err(Error::BadOutput {
            plugin: call.plugin.to_string(),
            command: call.command.to_string(),
            why: format!("more than {STDOUT_MAX} bytes on stdout"),
            stderr: stderr_text,
        });
    }
    Ok(Output {
        stdout: out.buf,
        stderr: stderr_text,
    })
}

/// Spawns, retrying while the executable is busy being written (as libcni does), until the
/// deadline.
async fn spawn(
    cmd: &mut Command,
    call: &Call<'_>,
    deadline: tokio::time::Instant,
) -> Result<tokio::process::Child, Error> {
    loop {
        match cmd.spawn() {
            Ok(child) => return Ok(child),
            Err(e)
                if e.kind() == std::io::ErrorKind::ExecutableFileBusy
                    && tokio::time::Instant::now() + Duration::from_millis(50) < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => {
                return Err(Error::io(
                    format!(
                        "running CNI plugin {:?} ({}) {}",
                        call.plugin,
                        call.path.display(),
                        call.command
                    ),
                    e,
                ));
            }
        }
    }
}

/// The error of a plugin that exited with a failure: the CNI error object on its stdout, or code
/// [`UNPARSABLE`] when there is none.
fn failure(call: &Call<'_>, status: ExitStatus, stdout: &[u8], stderr: String) -> Error {
    let object = serde_json::from_slice::<Value>(stdout)
        .ok()
        .and_then(|v| match v {
            Value::Object(o)
                if o.get("code").is_some_and(Value::is_u64) || o.contains_key("msg") =>
            {
                Some(o)
            }
            _ => None,
        });
    let (code, msg, details) = match object {
        Some(o) => {
            let text = |key: &str| match o.get(key) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            let code = o
                .get("code")
                .and_then(Value::as_u64)
                .map_or(0, |c| u32::try_from(c).unwrap_or(u32::MAX));
            (code, text("msg"), text("details"))
        }
        None => {
            let shown = &stdout[..stdout.len().min(STDOUT_SHOWN)];
            let how = match status.code() {
                Some(code) => format!("exit status {code}"),
                None => {
                    use std::os::unix::process::ExitStatusExt;
                    format!("signal {}", status.signal().unwrap_or(0))
                }
            };
            let msg = if stdout.is_empty() {
                format!("{how}, nothing on stdout")
            } else {
                format!("{how}, no CNI error object on stdout")
            };
            (UNPARSABLE, msg, String::from_utf8_lossy(shown).into_owned())
        }
    };
    Error::Plugin {
        plugin: call.plugin.to_string(),
        command: call.command.to_string(),
        code,
        msg,
        details,
        stderr,
    }
}

async fn drain(
    pipe: &mut (impl AsyncRead + Unpin),
    mut sink: impl FnMut(&[u8]),
) -> std::io::Result<()> {
    let mut buf = [0u8; 8192];
    loop {
        let n = pipe.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        sink(&buf[..n]);
    }
}

/// The first `max` bytes; the rest is read and dropped.
struct Capped {
    buf: Vec<u8>,
    max: usize,
    truncated: bool,
}

impl Capped {
    fn new(max: usize) -> Self {
        Capped {
            buf: Vec::new(),
            max,
            truncated: false,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        let room = self.max - self.buf.len();
        if bytes.len() > room {
            self.truncated = true;
        }
        self.buf.extend_from_slice(&bytes[..bytes.len().min(room)]);
    }
}

/// The last `keep` bytes.
struct Tail {
    buf: Vec<u8>,
    keep: usize,
}

impl Tail {
    fn new(keep: usize) -> Self {
        Tail {
            buf: Vec::new(),
            keep,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        if self.buf.len() > self.keep {
            let cut = self.buf.len() - self.keep;
            self.buf.drain(..cut);
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.buf).into_owned()
    }
}

/// Kills the plugin's process group when dropped, unless disarmed: what a cancelled call or a
/// timeout leaves is killed with it.
struct GroupKiller(Option<i32>);

impl GroupKiller {
    fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // ESRCH: the group is gone already.
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
    }

    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GroupKiller {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_and_capped_keep_what_they_should() {
        let mut t = Tail::new(4);
        t.push(b"abc");
        t.push(b"defg");
        assert_eq!(t.text(), "defg");
        let mut c = Capped::new(4);
        c.push(b"abc");
        assert!(!c.truncated);
        c.push(b"defg");
        assert_eq!(c.buf, b"abcd");
        assert!(c.truncated);
    }

    #[test]
    fn find_takes_the_first_dir_and_refuses_paths() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        std::fs::write(b.path().join("p"), "").unwrap();
        std::fs::write(a.path().join("p"), "").unwrap();
        std::fs::create_dir(b.path().join("d")).unwrap();
        let dirs = vec![a.path().to_path_buf(), b.path().to_path_buf()];
        assert_eq!(find("p", &dirs).unwrap(), a.path().join("p"));
        assert!(matches!(
            find("d", &dirs),
            Err(Error::PluginNotFound { .. })
        ));
        assert!(matches!(
            find("q", &dirs),
            Err(Error::PluginNotFound { .. })
        ));
        for bad in ["../p", "x/p", "..", ""] {
            assert!(
                matches!(find(bad, &dirs), Err(Error::Unsupported { .. })),
                "{bad}"
            );
        }
    }
}
