//! Links the nodelet binary (and the benchmarks, which re-execute themselves as sandbox
//! processes) as a non-PIE executable: its relocations are then resolved at link time, so the
//! read-only-after-relocation data (vtables, string tables: about 1 MiB in a release build) stays
//! clean file-backed memory shared by every sandbox process, instead of a private dirty copy in
//! each of them. The price is a fixed load address for the binary itself (shared libraries,
//! heap and stacks stay randomised), as with Go's default builds, which is what the upstream
//! kubelet and containerd's shims are.
//!
//! A static build (`scripts/build-static.sh`: `crt-static` with `relocation-model=static`) is
//! non-PIE already: rustc links it with `-static`, and `-no-pie` on top would turn it into a
//! static binary that still names a program interpreter.
//!
//! It also generates the gRPC code of the device plugin API (v1beta1) and the pod-resources API
//! (v1) from the protos in `src/devices/proto/` (both sides: the kubelet serves registration and
//! pod-resources and is a client of each plugin; the tests' sample plugin is the other side).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/devices/proto");
    if let Err(e) = tonic_prost_build::configure().compile_protos(
        &[
            "src/devices/proto/deviceplugin_v1beta1.proto",
            "src/devices/proto/podresources_v1.proto",
        ],
        &["src/devices/proto"],
    ) {
        panic!("generating the device plugin and pod-resources APIs: {e}");
    }
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    if features.split(',').any(|f| f == "crt-static") {
        return;
    }
    println!("cargo:rustc-link-arg-bins=-no-pie");
    println!("cargo:rustc-link-arg-benches=-no-pie");
}
