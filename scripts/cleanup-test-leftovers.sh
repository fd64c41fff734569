#!/usr/bin/env bash
# Developer aid: stops sandbox processes, unmounts rootfs mounts and removes cgroups that an
# interrupted test run left under /tmp (test roots are /tmp/nl*, /tmp/sbx*) and in their state
# dirs under /run/nodelet/state, and the bridges
# (ctdt<N>) of test containerds (tests/common/containerd.rs). Never touches /var/lib/nodelet.
set -u
pkill -9 -f "nodelet --root-dir /tmp/nl" 2>/dev/null
# The built-in runtime's state dirs (/run/nodelet/state/<hash>, their `root` file naming the
# root dir) of test roots, and those of test roots already deleted.
states=()
for d in /run/nodelet/state/*/; do
  [ -f "$d/root" ] || continue
  case "$(cat "$d/root")" in
    /tmp/nl*|/tmp/sbx*|/tmp/nodelet-e2e-*) states+=("${d%/}") ;;
  esac
done
socks=(/tmp/nl*/sandboxes/*/sandbox.sock /tmp/sbx*/sb/sandbox.sock)
for d in "${states[@]}"; do socks+=("$d"/sandboxes/*/sandbox.sock); done
for s in "${socks[@]}"; do
  [ -S "$s" ] || continue
  python3 - "$s" <<'PY' 2>/dev/null
import os, socket, sys
os.chdir(os.path.dirname(sys.argv[1]))  # a path too long for sun_path is reached relative
c = socket.socket(socket.AF_UNIX); c.settimeout(10); c.connect(os.path.basename(sys.argv[1]))
c.sendall(b'"Shutdown"\n'); c.recv(100)
PY
done
for d in "${states[@]}"; do
  pkill -9 -f "__sandbox $d/" 2>/dev/null
  grep -oE " $d/[^ ]*" /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l
done
pkill -9 -f "__sandbox /tmp/(nl|sbx)" 2>/dev/null
grep -oE " /tmp/(nl|sbx)[^ ]*" /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l
rm -rf /tmp/nl* /tmp/sbx* /tmp/nodelet-e2e-* "${states[@]}"
for c in /sys/fs/cgroup/*/; do
  for d in "$c"nodelet-e2e-* "$c"nodelet-test "$c"nodelet; do
    [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
done
# The pod networks of the network and kill -9 tests (bridges nlt<pid>, nlk<pid>, their nftables tables) and their
# outside hosts (namespaces nlout<n>, links nloh<n>); a bridge goes only once no veth is on it.
for b in $(ls /sys/class/net | grep -E "^nl[tk][0-9]+$"); do
  ls /sys/class/net/$b/brif 2>/dev/null | grep -q . && continue
  ip link del "$b" 2>/dev/null
done
if command -v nft >/dev/null; then
  for t in $(nft list tables 2>/dev/null | awk '$2 == "ip" && $3 ~ /^nodelet-nl[tk][0-9]+$/ {print $3}'); do
    [ -e "/sys/class/net/${t#nodelet-}" ] || nft delete table ip "$t" 2>/dev/null
  done
fi
for n in $(ip netns list 2>/dev/null | awk '$1 ~ /^nlout[0-9]+$/ {print $1}'); do ip netns del "$n"; done
for l in $(ls /sys/class/net | grep -E '^nloh[0-9]+$'); do ip link del "$l" 2>/dev/null; done
# The private containerds' CNI bridges.
for b in /sys/class/net/ctdt*; do
  [ -e "$b" ] && ip link del "$(basename "$b")" 2>/dev/null
done
exit 0
