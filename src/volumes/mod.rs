//! Volumes whose content the kubelet writes: the atomic writer and the payloads.

pub mod atomic_writer;
pub mod projection;
