//! What crosses nodelet's CRI seam, shared by the `runtime` crate and the crates nested under it
//! (`runtime/streaming`): the CRI v1 messages ([`cri`]) and the error ([`Error`], with its
//! gRPC-style [`Code`]). The `runtime` crate re-exports all of it; use it from there.

pub use k8s_cri::v1 as cri;

pub mod error;

pub use error::{Code, Error, Result};
