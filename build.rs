//! Links the nodelet binary (and the benchmarks, which re-execute themselves as sandbox
//! processes) as a non-PIE executable: its relocations are then resolved at link time, so the
//! read-only-after-relocation data (vtables, string tables: about 1 MiB in a release build) stays
//! clean file-backed memory shared by every sandbox process, instead of a private dirty copy in
//! each of them. The price is a fixed load address for the binary itself (shared libraries,
//! heap and stacks stay randomised), as with Go's default builds, which is what the upstream
//! kubelet and containerd's shims are.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-link-arg-bins=-no-pie");
    println!("cargo:rustc-link-arg-benches=-no-pie");
}
