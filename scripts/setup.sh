#!/usr/bin/env bash
# Installs every system package nodelet's build, main job and tests need on a fresh Debian machine.
# Idempotent: packages already present are left alone. Needs root (or sudo).
set -euo pipefail
PKGS=(
  protobuf-compiler   # k8s-cri / tonic code generation
  libseccomp-dev      # libcontainer's seccomp support
  pkg-config
  busybox             # the dynamic busybox with hard-linked applets: our test image
  runc                # the benchmark's baseline runtime
  containerd          # a real CRI v1 runtime for the remote backend test (tests/remote_containerd.rs)
  docker-registry     # a local OCI registry on 127.0.0.1 for pull tests (and containerd's images)
  containernetworking-plugins  # bridge, host-local, portmap, loopback in /usr/lib/cni: containerd's pod network in tests
  iptables            # portmap's hostPort rules
  apache2-utils       # htpasswd, for the registry basic-auth pull test
  iproute2
  e2fsprogs
  curl
  openssl             # a self-signed certificate for the HTTPS probe test
)
# kubectl, for the kubectl test against the test API server (tests/apiserver_semantics.rs): Debian's
# kubernetes-client, unless a kubectl (another vendor's package) is already on PATH.
command -v kubectl >/dev/null || PKGS+=(kubernetes-client)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# docker-registry's package starts a service on :5000 through systemd where systemd runs; tests start their own.
