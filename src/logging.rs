//! Logging set-up for the agent and for sandbox processes (whose stderr is their log file).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Logs to stderr, filtered by `NODELET_LOG` (default `info`, with libcgroups' per-call
/// notices about absent v1 controllers left out), in colour only when stderr is a terminal.
pub fn init() {
    init_verbosity(None)
}

/// Like [`init`], the default level from the kubelet's `--v` when given (0-2 info, 3-4 debug,
/// 5 and more trace); `NODELET_LOG` still wins.
pub fn init_verbosity(v: Option<u8>) {
    let level = match v.unwrap_or(0) {
        0..=2 => "info",
        3..=4 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_env("NODELET_LOG")
        .unwrap_or_else(|_| EnvFilter::new(format!("{level},libcgroups=error,libcontainer=warn")));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only on a terminal: a log file, the journal or a console gets plain lines.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        // A log that cannot be written (a full disk) must not take the agent down.
        .log_internal_errors(false)
        .try_init();
}

/// Logging for a sandbox process: plain lines to stderr (its `sandbox.log`), no colours.
pub fn init_sandbox() {
    let filter = EnvFilter::try_from_env("NODELET_LOG")
        .unwrap_or_else(|_| EnvFilter::new("warn,libcgroups=error"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        // Its log is on the node's disk: a full disk must not kill the pod's sandbox (the
        // default reports a failed write by printing, which panics when stderr fails too).
        .log_internal_errors(false)
        .try_init();
}
