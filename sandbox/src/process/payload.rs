//! A container's own program: how its init finds and executes it, and how a failure to
//! execute it reaches `start` instead of the container's log.
//!
//! libcontainer's default executor checks the program at create time and, when the `execvp`
//! after start fails, logs its error lines on the init's stderr (the container's log) and
//! exits: the start looked successful. Here the init looks the program up and executes it
//! itself after the start signal, as runc does, and writes a failure, in runc's words, to a
//! close-on-exec pipe the sandbox reads at start: end of file without a word means the program
//! runs.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::unistd::pipe2;
use oci_spec::runtime::Spec;

use super::containers::internal;
use crate::Result;

/// The exit code of an init whose program could not be executed (what runc's users see too).
pub const START_ERROR_EXIT_CODE: i32 = 128;
/// The reason of a container whose program could not be executed (containerd's).
pub const START_ERROR_REASON: &str = "StartError";

/// How long `start` waits for the init to execute its program or report why it could not. The
/// init only has the OCI start hooks and the exec itself left to do; past this the container
/// counts as started, as it would have before.
const REPORT_WAIT: Duration = Duration::from_secs(10);

/// The executor of a container's init: looks the program up and executes it, reporting a
/// failure on `report` (the write end of the pipe [`report_pipe`] made).
#[derive(Clone)]
pub struct Payload {
    report: Arc<OwnedFd>,
}

/// A pipe for the failure report of one container's init: the read end for the sandbox (kept
/// until `start`), the executor holding the write end (dropped with libcontainer's builder once
/// the container is created, so that only the init holds it).
pub fn report_pipe() -> Result<(OwnedFd, Payload)> {
    let (r, w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| internal("pipe", e))?;
    Ok((
        r,
        Payload {
            report: Arc::new(w),
        },
    ))
}

/// Waits for the init behind `report` to execute its program: `None` when it did (the pipe
/// closed without a word, or nothing came within [`REPORT_WAIT`]), else why it could not.
pub fn read_report(report: &OwnedFd) -> Option<String> {
    let mut text = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = std::time::Instant::now() + REPORT_WAIT;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut fds = [PollFd::new(report.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(ms)) {
            Ok(0) => break,
            Ok(_) => {}
            Err(Errno::EINTR) => continue,
            Err(_) => break,
        }
        match nix::unistd::read(report.as_raw_fd(), &mut buf) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&buf[..n]),
            Err(Errno::EINTR) => {}
            Err(_) => break,
        }
        if text.len() > 64 * 1024 {
            break;
        }
    }
    (!text.is_empty()).then(|| String::from_utf8_lossy(&text).into_owned())
}

impl Executor for Payload {
    fn exec(&self, spec: &Spec) -> std::result::Result<(), ExecutorError> {
        let args: Vec<&str> = spec
            .process()
            .as_ref()
            .and_then(|p| p.args().as_ref())
            .map(|a| a.iter().map(String::as_str).collect())
            .unwrap_or_default();
        let why = match exec(&args) {
            Ok(never) => match never {},
            Err(why) => why,
        };
        // Not returned to libcontainer, which would log it into the container's output: the
        // sandbox reads it at start and records it as the container's status.
        let _ = nix::unistd::write(self.report.as_fd(), why.as_bytes());
        // SAFETY: `_exit` ends this (single-threaded, forked) init without running anything
        // of the process it was forked from.
        #[allow(unsafe_code)]
        unsafe {
            libc::_exit(START_ERROR_EXIT_CODE)
        }
    }

    fn validate(&self, _spec: &Spec) -> std::result::Result<(), ExecutorValidationError> {
        // The program is looked up once the container starts; a missing one fails the start.
        Ok(())
    }
}

/// Executes `args` with the process's environment; returns only on failure, with the reason.
fn exec(args: &[&str]) -> std::result::Result<std::convert::Infallible, String> {
    let Some(&name) = args.first() else {
        return Err("exec: no program: the process has no args".into());
    };
    let path = look_path(name, std::env::var("PATH").ok().as_deref())?;
    let cstr = |s: &str| {
        std::ffi::CString::new(s).map_err(|_| format!("exec: {s:?}: contains a NUL byte"))
    };
    let prog = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| format!("exec: {name:?}: contains a NUL byte"))?;
    let argv = args
        .iter()
        .map(|a| cstr(a))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    match nix::unistd::execv(&prog, &argv) {
        Ok(never) => match never {},
        Err(e) => Err(format!("exec {}: {}", path.display(), errno_text(e))),
    }
}

/// Finds the program `name` as runc does (Go's `exec.LookPath`): a name with a slash is taken
/// as it is, any other is searched in `path_var`; the program must be a file someone may
/// execute. The error reads as runc's.
pub fn look_path(name: &str, path_var: Option<&str>) -> std::result::Result<PathBuf, String> {
    if name.contains('/') {
        return executable(Path::new(name))
            .map(|()| PathBuf::from(name))
            .map_err(|e| match e {
                NotExecutable::Stat(errno) => {
                    format!("exec: {name:?}: stat {name}: {}", errno_text(errno))
                }
                NotExecutable::Mode => format!("exec: {name:?}: permission denied"),
            });
    }
    // No PATH (or an empty one) is searched nowhere, as Go splits it.
    let dirs = path_var.filter(|p| !p.is_empty()).map(|p| p.split(':'));
    for dir in dirs.into_iter().flatten() {
        let dir = if dir.is_empty() { "." } else { dir };
        let candidate = Path::new(dir).join(name);
        if executable(&candidate).is_ok() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "exec: {name:?}: executable file not found in $PATH"
    ))
}

enum NotExecutable {
    Stat(Errno),
    Mode,
}

/// Whether `path` is a file with an execute bit (what Go's `findExecutable` checks).
fn executable(path: &Path) -> std::result::Result<(), NotExecutable> {
    let meta = std::fs::metadata(path)
        .map_err(|e| NotExecutable::Stat(Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))))?;
    if meta.is_dir() || meta.permissions().mode() & 0o111 == 0 {
        return Err(NotExecutable::Mode);
    }
    Ok(())
}

/// An errno as Go prints it: "no such file or directory", "permission denied".
pub(super) fn errno_text(e: Errno) -> String {
    let desc = e.desc();
    let mut chars = desc.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => format!("errno {}", e as i32),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_looked_up_as_runc_does() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let prog = bin.join("prog");
        std::fs::write(&prog, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
        let data = bin.join("data");
        std::fs::write(&data, "").unwrap();
        std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path_var = format!("/nonexistent:{}", bin.display());

        assert_eq!(look_path("prog", Some(&path_var)), Ok(prog.clone()));
        let abs = prog.to_string_lossy().into_owned();
        assert_eq!(look_path(&abs, None), Ok(prog.clone()));
        assert_eq!(
            look_path("/nonexistent", Some(&path_var)),
            Err(r#"exec: "/nonexistent": stat /nonexistent: no such file or directory"#.into())
        );
        let data_s = data.to_string_lossy().into_owned();
        assert_eq!(
            look_path(&data_s, Some(&path_var)),
            Err(format!("exec: {data_s:?}: permission denied"))
        );
        let bin_s = bin.to_string_lossy().into_owned();
        assert_eq!(
            look_path(&bin_s, Some(&path_var)),
            Err(format!("exec: {bin_s:?}: permission denied"))
        );
        // Found only where it may be executed; a name without a slash is never taken as a path.
        for name in ["data", "nosuch"] {
            assert_eq!(
                look_path(name, Some(&path_var)),
                Err(format!(
                    "exec: {name:?}: executable file not found in $PATH"
                ))
            );
        }
        assert!(look_path("prog", None).is_err());
        assert!(look_path("prog", Some("")).is_err());
    }

    #[test]
    fn errnos_read_as_go_prints_them() {
        assert_eq!(errno_text(Errno::ENOENT), "no such file or directory");
        assert_eq!(errno_text(Errno::EACCES), "permission denied");
        assert_eq!(errno_text(Errno::ENOEXEC), "exec format error");
    }
}
