//! The minimal OS image boots into a node serving its static pod: scripts/boot-image.sh builds
//! the image (scripts/build-image.sh: a Debian kernel, busybox, the static nodelet, a static pod
//! and its image in the preload dir) and boots it under qemu (KVM when usable), and the pod's
//! page comes back through the hostPort forwarded to the loopback.
//!
//! Ignored in plain `cargo test`: the image needs the static binary. scripts/test.sh builds it
//! and runs this test with `NODELET_BIN=<static nodelet> cargo test --test boot_image -- --ignored`.

mod common;

use common::*;

/// The value of the `what: N.N s` line of the script's output, in seconds.
fn seconds(out: &str, what: &str) -> f64 {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{what}: ")))
        .unwrap_or_else(|| panic!("no {what:?} line in:\n{out}"));
    line.trim_end_matches(" s")
        .parse()
        .unwrap_or_else(|e| panic!("{what}: {line:?}: {e}"))
}

#[test]
#[ignore = "needs the static binary: scripts/test.sh runs it with NODELET_BIN and --ignored"]
fn the_image_boots_into_a_node_serving_its_static_pod() {
    if !root_or_skip("the_image_boots_into_a_node_serving_its_static_pod") {
        return;
    }
    let Some(bin) = std::env::var_os("NODELET_BIN").filter(|b| !b.is_empty()) else {
        panic!("NODELET_BIN must name a static nodelet (scripts/build-static.sh)");
    };
    let dir = tempfile::Builder::new()
        .prefix("nl-image")
        .tempdir()
        .unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("bash")
        .arg(repo.join("scripts/boot-image.sh"))
        .arg(dir.path())
        .env("NODELET_BIN", &bin)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "boot-image.sh failed:\n{stdout}\n{stderr}"
    );
    eprintln!("{stdout}");
    // The page is the pod's own: written by its container, with the pod's address.
    let answer = stdout
        .lines()
        .find_map(|l| l.strip_prefix("answer: "))
        .unwrap_or_else(|| panic!("no answer line:\n{stdout}"));
    assert!(
        answer.starts_with("hello from a nodelet static pod at 10.88."),
        "{answer}"
    );
    // The steps came in their order: the agent, the pod, its first answer.
    let agent = seconds(&stdout, "agent started");
    let running = seconds(&stdout, "pod running");
    let answered = seconds(&stdout, "first HTTP answer");
    assert!(
        0.0 < agent && agent <= running && running <= answered,
        "{stdout}"
    );
    // The guest's own marker: its agent logged the container's Started event.
    assert!(
        stdout.contains("guest: nodelet-image: pod running"),
        "{stdout}"
    );
}
