//! nodelet: a Kubernetes node agent with a built-in container runtime, in one binary.
//!
//! The kubelet logic talks to containers only through `runtime`'s CRI-shaped traits; the
//! built-in runtime and the remote CRI backend are interchangeable behind them.

pub mod admission;
pub mod api;
pub mod certificate;
pub mod cli;
pub mod cm;
pub mod commands;
pub mod config;
pub mod crilog;
pub mod devices;
pub mod inputs;
pub mod kubelet;
pub mod logging;
pub mod metrics;
pub mod model;
pub mod node;
pub mod pod;
pub mod pod_workers;
pub mod prober;
pub mod server;
pub mod sources;
pub mod status_manager;
pub mod util;
pub mod version;
pub mod volumes;
