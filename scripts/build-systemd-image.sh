#!/usr/bin/env bash
# Builds a Debian machine with systemd as PID 1 (systemd-logind, D-Bus, systemd-networkd, udev),
# the static nodelet as /usr/local/bin/nodelet and deploy/systemd/nodelet.service enabled: the
# machine the tests of nodelet on a systemd host boot under qemu (graceful node shutdown through
# logind's inhibitor lock; tests/systemd_node.rs). Unlike the minimal OS image
# (scripts/build-image.sh) it is a whole Debian system, made by debootstrap (bookworm, minbase).
#
# The image is a Debian kernel and an initramfs holding the whole root filesystem; its /init
# copies the files into a tmpfs and switches to it (every container's rootfs is entered with
# pivot_root, which the kernel's initial rootfs refuses), then runs systemd. A test adds its own
# files (the node's config, kubeconfig, units) as a plain cpio archive put before the
# initramfs, as early microcode is: the kernel unpacks each archive in turn.
#
#   bash scripts/build-systemd-image.sh [OUT_DIR]   # default: target/systemd-image
#   NODELET_BIN=/path/to/nodelet bash scripts/build-systemd-image.sh   # skip the static build
#
# The Debian root (OUT/debian-root.tar) and packages (OUT/debs) are kept between builds; delete
# them to fetch newer ones. Prints as its last line "OUT/vmlinuz OUT/initramfs.img". Needs root
# (debootstrap, apt-get).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-${CARGO_TARGET_DIR:-$PWD/target}/systemd-image}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# libseccomp2: a dynamically linked nodelet runs here too (the guest's glibc is the build
# machine's, both bookworm).
# containerd, runc and the CNI plugins: the same machine with nodelet driving containerd
# (containerRuntimeEndpoint) instead of its built-in runtime.
PACKAGES=systemd,systemd-sysv,dbus,udev,kmod,iproute2,libseccomp2,containerd,runc,containernetworking-plugins

# The modules the node needs, as in the minimal image, and the virtual machine's devices.
MODULES="overlay bridge br_netfilter veth nf_tables nft_chain_nat nft_masq virtio_net virtio_pci"

missing=()
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v depmod >/dev/null || missing+=(kmod)
command -v cpio >/dev/null || missing+=(cpio)
command -v zstd >/dev/null || missing+=(zstd)
# (and what boots it)
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-systemd-image: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2
fi

NODELET="${NODELET_BIN:-}"
if [ -z "$NODELET" ]; then
  NODELET="$(bash scripts/build-static.sh | tail -n 1)"
fi

# The Debian root, made once.
BASE="$OUT/debian-root.tar"
if [ ! -f "$BASE" ] || [ "$(cat "$BASE.packages" 2>/dev/null)" != "$SUITE $PACKAGES" ]; then
  echo "build-systemd-image: debootstrap $SUITE ($PACKAGES)" >&2
  rm -rf "$OUT/debootstrap"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$OUT/debootstrap" "$MIRROR" >&2
  rm -rf "$OUT/debootstrap/var/cache/apt/archives/"*.deb "$OUT/debootstrap/var/lib/apt/lists/"*
  tar -C "$OUT/debootstrap" -cf "$BASE.tmp" .
  mv "$BASE.tmp" "$BASE"
  echo "$SUITE $PACKAGES" > "$BASE.packages"
  rm -rf "$OUT/debootstrap"
fi

# The kernel, as the minimal image's.
DEBS="$OUT/debs"
# shellcheck source=scripts/lib/debs.sh
. scripts/lib/debs.sh
KDEB=$(fetch_kernel)

WORK="$OUT/work"
rm -rf "$WORK"
mkdir -p "$WORK/kernel" "$WORK/root"
ROOT="$WORK/root"
tar -C "$ROOT" -xf "$BASE"
dpkg-deb -x "$KDEB" "$WORK/kernel"
KVER=$(ls "$WORK/kernel/lib/modules" | head -n 1)
depmod -b "$WORK/kernel" "$KVER"
# The modules and their dependencies at their own paths, so that udev and modprobe find them.
for m in $MODULES; do
  modprobe -d "$WORK/kernel" -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" {print $2}'
done | awk '!seen[$0]++' | while read -r ko; do
  rel=${ko#"$WORK/kernel/"}
  mkdir -p "$ROOT/$(dirname "$rel")"
  cp "$ko" "$ROOT/$rel"
done
cp "$WORK/kernel/lib/modules/$KVER/modules.order" "$WORK/kernel/lib/modules/$KVER/modules.builtin"* \
  "$ROOT/lib/modules/$KVER/"
depmod -b "$ROOT" "$KVER"

# The node: nodelet, its unit (enabled), the busybox image in the preload dir.
install -m 0755 "$NODELET" "$ROOT/usr/local/bin/nodelet"
install -m 0644 deploy/systemd/nodelet.service "$ROOT/etc/systemd/system/nodelet.service"
mkdir -p "$ROOT/var/lib/nodelet/images-preload" "$ROOT/etc/nodelet"
bash scripts/build-busybox-image.sh "$ROOT/var/lib/nodelet/images-preload/busybox.tar" >&2

# The machine: its name, DHCP on the virtual NIC (qemu's user network), the journal on the
# serial console (what the tests read), no root password prompt in the way.
echo nodelet-systemd > "$ROOT/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 nodelet-systemd\n' > "$ROOT/etc/hosts"
mkdir -p "$ROOT/etc/systemd/network" "$ROOT/etc/systemd/journald.conf.d"
printf '[Match]\nName=en* eth*\n\n[Network]\nDHCP=ipv4\n' > "$ROOT/etc/systemd/network/10-nic.network"
printf '[Journal]\nForwardToConsole=yes\nTTYPath=/dev/ttyS0\nMaxLevelConsole=info\n' \
  > "$ROOT/etc/systemd/journald.conf.d/console.conf"
# containerd: its CRI plugin with the sandbox image a test puts in nodelet's preload dir
# (conf.d: where a test adds its own settings, such as runc's SystemdCgroup)
# (nodelet imports that dir into containerd), and a bridge pod network from Debian's plugins
# (no masquerading or hostPorts: they would need iptables).
mkdir -p "$ROOT/etc/containerd" "$ROOT/etc/cni/net.d"
cat > "$ROOT/etc/containerd/config.toml" <<'EOF'
version = 2
imports = ["/etc/containerd/conf.d/*.toml"]
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:nodelet-busybox"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "/etc/cni/net.d"
EOF
cat > "$ROOT/etc/cni/net.d/10-containerd.conflist" <<'EOF'
{
  "cniVersion": "1.0.0",
  "name": "containerd-pods",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.22.0.0/16"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
EOF
systemctl --root="$ROOT" enable systemd-networkd.service nodelet.service containerd.service >&2
systemctl --root="$ROOT" mask serial-getty@ttyS0.service getty@tty1.service \
  systemd-networkd-wait-online.service >&2 || true
# network-online.target without wait-online: the unit starts once networkd runs; the agent
# waits for the API server itself.

cat > "$ROOT/init" <<'EOF'
#!/bin/sh
# Copies the root filesystem from the initramfs into a tmpfs and runs systemd there
# (scripts/build-systemd-image.sh).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mkdir -p /dev /proc /newroot
mount -t devtmpfs -o mode=0755 dev /dev
exec < /dev/console > /dev/console 2>&1
mount -t tmpfs -o mode=0755 root /newroot
for d in $(ls -A / | grep -v -x -e dev -e proc -e sys -e newroot -e init); do
  cp -a "/$d" /newroot/
done
mkdir -p /newroot/dev /newroot/proc /newroot/sys /newroot/run /newroot/tmp
echo "nodelet-systemd-image: root copied to a tmpfs; starting systemd"
mount --move /dev /newroot/dev
exec switch_root /newroot /lib/systemd/systemd
EOF
chmod 0755 "$ROOT/init"

(cd "$ROOT" && find . -mindepth 1 | LC_ALL=C sort | cpio --quiet -o -H newc -R 0:0) \
  | zstd -q -T0 -3 -f -o "$OUT/initramfs.img"
cp "$WORK/kernel/boot/vmlinuz-$KVER" "$OUT/vmlinuz"
rm -rf "$WORK"

size() { echo "$(( $(stat -c %s "$1") / 1048576 )) MiB"; }
echo "build-systemd-image: kernel $KVER; initramfs $(size "$OUT/initramfs.img")" >&2
echo "$OUT/vmlinuz $OUT/initramfs.img"
