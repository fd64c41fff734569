//! [`launch`]: starting a sandbox process by re-executing the agent's binary, and reading what
//! its set-up reported.

use std::path::Path;
use std::process::Stdio;

use tokio::io::AsyncReadExt;

use crate::spec::{Layout, Spec};
use crate::{Error, Kind, Result};

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
}
