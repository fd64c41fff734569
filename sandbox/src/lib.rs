//! nodelet's per-pod sandbox: a small synchronous process (the nodelet binary re-executed) that
//! holds a pod's namespaces and parents its containers through youki's libcontainer, and the
//! async [`Client`] the built-in runtime uses to drive it.
//!
//! This crate knows nothing of CRI, gRPC or images: it takes its own [`Spec`] and
//! [`ContainerSpec`] (an OCI bundle prepared by the caller).

pub mod cgroup;
mod client;
mod error;
pub mod fdpass;
mod fds;
pub mod files;
pub mod logs;
pub mod net;
pub mod process;
pub mod protocol;
pub mod sockpath;
mod spec;

pub use client::{Attach, Client, Output, REQUEST_TIMEOUT, StdinDone, StreamExec, launch};
pub use error::{Error, Kind, Result};
pub use spec::{
    ContainerSpec, ContainerStatus, Dns, Event, ExecResult, ExecSpec, IdMappings, IdRange, Layout,
    NamespaceMode, Namespaces, PodAddress, PodNetwork, PortMapping, Protocol, SandboxState, Spec,
    State, StreamExecSpec, now_ns,
};

pub use oci_spec;

/// Tests: says that `test` cannot run on this machine because of `why`: a loud `SKIP (why): test` line
/// on stderr, and the test passes. Under CI (`CI` set to `true` or `1`) the test fails with that
/// line instead: CI never passes a test it did not run.
#[cfg(test)]
pub(crate) fn skip(why: &str, test: &str) {
    let line = format!("SKIP ({why}): {test}");
    if std::env::var("CI").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        panic!("{line}");
    }
    eprintln!("{line}");
}
