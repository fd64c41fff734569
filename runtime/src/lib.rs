//! The CRI seam of nodelet.
//!
//! The kubelet half of nodelet talks to containers only through the two
//! traits defined here, [`RuntimeService`] and [`ImageService`]. They mirror
//! the Kubernetes Container Runtime Interface (CRI v1) one method per RPC,
//! taking and returning the generated CRI messages re-exported as [`cri`].
//! Implementations are:
//!
//! * the built-in runtime ([`builtin::BuiltinRuntime`], feature `builtin`): sandboxes and
//!   containers run by nodelet itself through the `sandbox` and `images` crates,
//! * an in-memory fake for tests ([`fake::FakeRuntime`], feature `fake`),
//! * a remote CRI v1 runtime reached over a unix socket ([`remote::RemoteRuntime`], feature
//!   `remote`): containerd, CRI-O or another nodelet.
//!
//! [`server`] (feature `server`) goes the other way: it exposes any implementation as a CRI v1
//! gRPC server on a unix socket, for crictl or a kubelet. [`Instrumented`] is the seam's one
//! decorator: it wraps an implementation and tells an [`Observer`] of every call.
//!
//! The CRI method list is written twice: in the traits, which carry the contract, and in
//! `rpcs`, from which the remote client, the server adapter and [`Instrumented`] are expanded.
//!
//! Errors cross the seam as [`Error`], which carries a gRPC-style [`Code`]
//! and converts losslessly to and from [`tonic::Status`], so a remote CRI
//! backend or a CRI gRPC server can be layered on top without translation
//! tables.

pub use runtime_types::{cri, error};

pub mod clock;
pub mod instrument;
mod rpcs;
pub mod service;

#[cfg(feature = "fake")]
pub mod fake;

#[cfg(feature = "builtin")]
pub mod builtin;

#[cfg(any(feature = "builtin", feature = "remote"))]
pub mod preload;

#[cfg(any(feature = "server", feature = "remote"))]
pub mod endpoint;

#[cfg(feature = "server")]
pub mod server;

#[cfg(feature = "remote")]
pub mod remote;

/// The CRI streaming server (the `runtime/streaming` crate).
#[cfg(feature = "streaming")]
pub use runtime_streaming as streaming;

pub use error::{Code, Error, Result};
pub use instrument::{Instrumented, Observer};
pub use service::{EventStream, ImageService, RuntimeService};
