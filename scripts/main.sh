#!/usr/bin/env bash
# The main job on a fresh machine: install what is needed, build nodelet, build a busybox image
# from Debian's packages, import it into nodelet's image store, and run a container from it with
# the built-in runtime (no containerd, no shims, no CNI). Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh
cargo build --release
NODELET=target/release/nodelet
ROOT=${NODELET_ROOT:-/var/lib/nodelet}

bash scripts/build-busybox-image.sh target/busybox-oci.tar
"$NODELET" --root-dir "$ROOT" images import target/busybox-oci.tar
"$NODELET" --root-dir "$ROOT" images list
"$NODELET" --root-dir "$ROOT" run --name hello docker.io/library/busybox:latest -- \
  sh -c 'echo "hello from a nodelet container: hostname $(hostname), PID $$, user $(id -un)"; ls /'
