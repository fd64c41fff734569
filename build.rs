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
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let features = std::env::var("CARGO_CFG_TARGET_FEATURE").unwrap_or_default();
    if features.split(',').any(|f| f == "crt-static") {
        return;
    }
    println!("cargo:rustc-link-arg-bins=-no-pie");
    println!("cargo:rustc-link-arg-benches=-no-pie");
}
