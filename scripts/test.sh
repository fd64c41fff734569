#!/usr/bin/env bash
# Runs every check and test of nodelet: formatting, lints, the dependency arrows, then the whole
# test suite. Installs the system packages it needs first (scripts/setup.sh). Tests that need
# root (real containers, cgroups, overlayfs mounts) run when this runs as root and skip loudly
# otherwise; with CI=true (set by CI systems) a test that would skip fails instead.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

# CI builds once from a clean checkout: incremental compilation's caches (about 6 GB here) would
# only take disk, and CI's machine once ran out of disk in the fuzz build.
if [ "${CI:-}" = true ]; then
  export CARGO_INCREMENTAL=0
fi

echo "== cargo fmt"
cargo fmt --all -- --check

echo "== dependency arrows"
# sandbox and images know nothing of CRI, gRPC, the runtime crate or each other.
for leaf in sandbox images; do
  other=$([ "$leaf" = sandbox ] && echo images || echo sandbox)
  bad=$(cargo tree -p "$leaf" -e normal --prefix none 2>/dev/null \
    | grep -E "^(k8s-cri|tonic|runtime|nodelet|$other) v" | sort -u || true)
  if [ -n "$bad" ]; then
    echo "FAIL: $leaf depends on: $bad" >&2
    exit 1
  fi
done
# runtime-cni (the CNI plugins' caller) knows nothing of CRI, gRPC, the sandbox or the images.
bad=$(cargo tree -p runtime-cni -e normal --prefix none 2>/dev/null \
  | grep -E "^(k8s-cri|tonic|runtime|sandbox|images|nodelet) v" | sort -u || true)
if [ -n "$bad" ]; then
  echo "FAIL: runtime-cni depends on: $bad" >&2
  exit 1
fi
# the kubelet (src/) reaches containers only through the runtime crate.
if grep -rEn '(^|[^:A-Za-z0-9_])(sandbox|images|libcontainer)::' --include='*.rs' src | grep -vE '^[^:]+:[0-9]+:\s*//'; then
  echo "FAIL: src/ names sandbox, images or libcontainer directly" >&2
  exit 1
fi

echo "== cargo clippy"
cargo clippy --workspace --all-targets --all-features -- -D warnings

echo "== cargo test"
cargo test --workspace --all-features "$@"

# The static binary, built as it ships (scripts/build-static.sh: release profile, static glibc and
# libseccomp) and run through the built-in runtime's (seccomp profiles included) and the standalone
# node's end-to-end suites, as the agent and as every sandbox process, so that it cannot rot. STATIC=0 leaves it out of a
# local run (it is a second, release build); CI always runs it.
if [ "${STATIC:-1}" != 0 ] || [ "${CI:-}" = true ]; then
  echo "== static binary (scripts/build-static.sh)"
  static_bin=$(bash scripts/build-static.sh | tail -n 1)
  NODELET_BIN="$static_bin" cargo test --all-features --test builtin_runtime --test builtin_security \
    --test standalone_node
  # The minimal OS image (scripts/build-image.sh) with that binary, booted under qemu until its
  # static pod answers HTTP (scripts/boot-image.sh).
  echo "== OS image boot (scripts/boot-image.sh)"
  NODELET_BIN="$static_bin" cargo test --all-features --test boot_image -- --ignored --nocapture
  # A Debian machine with systemd as PID 1 (scripts/build-systemd-image.sh) running that binary
  # as nodelet.service: graceful node shutdown through logind's inhibitor lock, and the pods'
  # cgroup tree with the cgroupfs and systemd drivers (the latter on cgroup v1 and v2).
  echo "== systemd host (tests/systemd_node.rs)"
  NODELET_BIN="$static_bin" cargo test --all-features --test systemd_node -- --ignored --nocapture \
    --test-threads 1
fi

# In CI nothing after this point uses the debug or static builds: they go before the fuzz build
# makes its own (peak disk use, measured: 18 GB with them kept and incremental caches on).
if [ "${CI:-}" = true ]; then
  target_dir=${CARGO_TARGET_DIR:-target}
  echo "== freeing disk: $target_dir/debug, $target_dir/static, $target_dir/tmp"
  rm -rf "$target_dir/debug" "$target_dir/static" "$target_dir/tmp"
fi

# Every fuzz target briefly, from its checked-in corpus, built without optimisation: the build
# is most of the time this takes (docs/FUZZING.md).
echo "== fuzzing (scripts/fuzz.sh)"
FUZZ_BUILD=${FUZZ_BUILD:-dev} bash scripts/fuzz.sh "${FUZZ_SECONDS:-15}"
