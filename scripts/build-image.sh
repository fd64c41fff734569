#!/usr/bin/env bash
# Builds nodelet's minimal OS image: a Debian kernel (linux-image-amd64, fetched with
# `apt-get download`) and an initramfs holding Debian's static busybox, the kernel modules a node
# needs, the static nodelet, a node config, a static pod and its image in the preload dir, with
# deploy/image/init as PID 1. No container runtime, no CNI binaries, no systemd. The initramfs is
# the whole system: the node boots from it straight into the node agent, which serves the static
# pod (a busybox httpd on hostPort 8080).
#
#   bash scripts/build-image.sh [OUT_DIR]     # default: target/image (or $CARGO_TARGET_DIR/image)
#   NODELET_BIN=/path/to/static/nodelet bash scripts/build-image.sh   # skip the static build
#
# Prints the sizes, and as its last line the image's two files: "OUT/vmlinuz OUT/initramfs.img".
# Boot it with scripts/boot-image.sh. Needs root only for apt-get (kmod, cpio, zstd).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUT="${1:-${CARGO_TARGET_DIR:-$PWD/target}/image}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"

# The modules the node needs, loaded in dependency order by the init: overlay (pod rootfs),
# bridge and veth (pod network), nf_tables with NAT (masquerading pod traffic), virtio-net (the
# virtual machine's NIC). Everything else the node uses is built into Debian's kernel.
MODULES="overlay bridge veth nf_tables nft_chain_nat nft_masq virtio_net virtio_pci"

missing=()
command -v depmod >/dev/null || missing+=(kmod)
command -v cpio >/dev/null || missing+=(cpio)
command -v zstd >/dev/null || missing+=(zstd)
command -v readelf >/dev/null || missing+=(binutils)
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-image: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi

NODELET="${NODELET_BIN:-}"
if [ -z "$NODELET" ]; then
  NODELET="$(bash scripts/build-static.sh | tail -n 1)"
fi
if readelf -l "$NODELET" | grep -q INTERP; then
  echo "build-image: $NODELET is dynamically linked; the image has no C library: build it with scripts/build-static.sh" >&2
  exit 1
fi

# Debian packages, downloaded once into OUT/debs (delete it to fetch newer ones).
DEBS="$OUT/debs"
# shellcheck source=scripts/lib/debs.sh
. scripts/lib/debs.sh
KDEB=$(fetch_kernel)
BBDEB=$(fetch busybox-static)

WORK="$OUT/work"
rm -rf "$WORK"
mkdir -p "$WORK/kernel" "$WORK/busybox" "$WORK/root"
dpkg-deb -x "$KDEB" "$WORK/kernel"
dpkg-deb -x "$BBDEB" "$WORK/busybox"
KVER=$(ls "$WORK/kernel/lib/modules" | head -n 1)
depmod -b "$WORK/kernel" "$KVER"

ROOT="$WORK/root"
mkdir -p "$ROOT/bin" "$ROOT/lib/modules/$KVER" "$ROOT/var/lib/nodelet/images-preload" "$ROOT/var/log"
install -m 0755 "$WORK/busybox/bin/busybox" "$ROOT/bin/busybox"
for applet in $("$ROOT/bin/busybox" --list); do
  [ "$applet" = busybox ] || ln -sf busybox "$ROOT/bin/$applet"
done
install -m 0755 "$NODELET" "$ROOT/bin/nodelet"
install -m 0755 deploy/image/init "$ROOT/init"
cp -a deploy/image/etc "$ROOT/etc"

# The modules and their dependencies, each once, in an order that loads (dependencies first).
: > "$ROOT/etc/modules.load"
for m in $MODULES; do
  modprobe -d "$WORK/kernel" -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  name=$(basename "$ko")
  cp "$ko" "$ROOT/lib/modules/$KVER/$name"
  echo "$name" >> "$ROOT/etc/modules.load"
done

# The static pod's image, for the preload dir (built from Debian's busybox, as the tests' is).
bash scripts/build-busybox-image.sh "$ROOT/var/lib/nodelet/images-preload/busybox.tar" >&2

# Fixed timestamps: the image does not change with the time of its build, and the preload dir's
# files are never "still being written" whatever the machine's clock says.
find "$ROOT" -exec touch -h -d @1 {} +
(cd "$ROOT" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0 --reproducible) \
  | zstd -q -T0 -19 -f -o "$OUT/initramfs.img"
cp "$WORK/kernel/boot/vmlinuz-$KVER" "$OUT/vmlinuz"
rm -rf "$WORK"

size() { echo "$(( $(stat -c %s "$1") / 1024 )) KiB"; }
echo "build-image: kernel $KVER ($(basename "$KDEB")): $(size "$OUT/vmlinuz"); initramfs: $(size "$OUT/initramfs.img") (nodelet $(size "$NODELET"))" >&2
total=$(( $(stat -c %s "$OUT/vmlinuz") + $(stat -c %s "$OUT/initramfs.img") ))
echo "build-image: image size $(awk -v b="$total" 'BEGIN {printf "%.1f", b / 1048576}') MiB" >&2
echo "$OUT/vmlinuz $OUT/initramfs.img"
