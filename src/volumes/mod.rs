//! Volumes whose content the kubelet writes: the atomic writer.

pub mod atomic_writer;
