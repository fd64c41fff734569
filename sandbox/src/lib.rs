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
    NamespaceMode, Namespaces, PodNetwork, PortMapping, Protocol, SandboxState, Spec, State,
    StreamExecSpec, now_ns,
};

pub use oci_spec;
