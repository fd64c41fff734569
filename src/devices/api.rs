//! The generated code of the device plugin API (`v1beta1`) and the pod-resources API (`v1`),
//! from `src/devices/proto/` (build.rs): messages, clients and servers.

/// The device plugin API: `Registration` (the kubelet serves it) and `DevicePlugin` (each
/// plugin serves it).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1beta1 {
    tonic::include_proto!("v1beta1");
}

/// The pod-resources API: `PodResourcesLister` (the kubelet serves it).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod podresources {
    tonic::include_proto!("v1");
}
