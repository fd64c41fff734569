//! The request/response protocol between the sandbox process and its client: one JSON object
//! per line over a unix socket. A connection carries one request and its response, except
//! `Subscribe`, after which the sandbox writes one [`Event`](crate::Event) per line until either
//! side closes.

use serde::{Deserialize, Serialize};

use crate::error::Kind;
use crate::spec::{
    ContainerSpec, ContainerStatus, ExecResult, ExecSpec, SandboxState, StreamExecSpec,
};

/// Longest request or response line accepted (exec output is bounded below this).
pub const MAX_MESSAGE: usize = 64 << 20;

/// An attach frame is the stream (this or [`ATTACH_STDERR`]), the length of the data (u32,
/// little-endian) and the data.
pub const ATTACH_STDOUT: u8 = 1;
pub const ATTACH_STDERR: u8 = 2;
/// The most data one attach frame carries: the sandbox sends what one read of a container's
/// output gave (64 KiB at most); a reader refuses a frame that claims more.
pub const MAX_ATTACH_FRAME: usize = 64 * 1024;

/// Most bytes of each output stream an exec keeps.
pub const MAX_EXEC_OUTPUT: usize = 16 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Request {
    /// The sandbox and all its containers.
    State,
    /// Create a container from an OCI bundle (its init waits for `Start`).
    Create(ContainerSpec),
    Start {
        id: String,
    },
    /// Send `signal`, then SIGKILL after `timeout_ms`; answered once the container has exited.
    Stop {
        id: String,
        signal: i32,
        timeout_ms: u64,
    },
    /// Delete a container that is not running; unknown ids succeed.
    Delete {
        id: String,
    },
    /// Run a process in a container and return its output.
    Exec(ExecSpec),
    /// Run a process in a container on the caller's stdio: without a terminal the request
    /// carries three descriptors (stdin, stdout, stderr); with one, none, and the
    /// `ExecStarted` answer carries the terminal's master side. `Exec` (exit code only, no
    /// output) follows when the process has exited.
    ExecStream(StreamExecSpec),
    /// Follow a running container's output: after the `Attached` answer (carrying a
    /// descriptor of the container's stdin when `stdin` was asked and the container has one)
    /// the connection carries [`attach frames`](ATTACH_STDOUT) until the container exits.
    /// Closing the connection detaches.
    Attach {
        id: String,
        stdin: bool,
    },
    /// Close and reopen a container's log file (after rotation).
    ReopenLog {
        id: String,
    },
    /// Apply new cgroup resources (an OCI `LinuxResources` JSON) to a container.
    UpdateResources {
        id: String,
        resources: serde_json::Value,
    },
    /// Stream container events on this connection.
    Subscribe,
    /// Kill every container, delete them, release the pod's namespaces and exit.
    Shutdown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Response {
    Ok,
    State(SandboxState),
    Container(ContainerStatus),
    Exec(ExecResult),
    /// An attach follows (see [`Request::Attach`]).
    Attached,
    /// A streaming exec's process runs (see [`Request::ExecStream`]).
    ExecStarted {
        pid: i32,
    },
    Error {
        kind: Kind,
        message: String,
    },
}
