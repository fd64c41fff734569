#!/usr/bin/env bash
# Boots nodelet's minimal OS image (scripts/build-image.sh; built first when missing) under
# qemu-system-x86_64, KVM when /dev/kvm is usable and software emulation otherwise, with the
# static pod's hostPort 8080 forwarded to a free port on 127.0.0.1, and waits until the pod
# answers HTTP. Prints, from power-on (qemu's start):
#   agent started: N.N s        the init starts nodelet
#   pod running: N.N s          the agent reports the pod's container Started
#   first HTTP answer: N.N s    the pod's page comes back through the hostPort
# and the image's size; exits 0, or non-zero with the console's tail when the pod does not
# answer within the time limit.
#
#   bash scripts/boot-image.sh [IMAGE_DIR]          # default: target/image
#   BOOT_ACCEL=tcg bash scripts/boot-image.sh       # force software emulation
#   BOOT_TIMEOUT=120 ...                            # seconds (default 60 with KVM, 300 without)
#   BOOT_KEEP=1 ...                                 # leave the VM running (prints how to stop it)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR="${1:-${CARGO_TARGET_DIR:-$PWD/target}/image}"
if [ ! -f "$DIR/vmlinuz" ] || [ ! -f "$DIR/initramfs.img" ]; then
  bash scripts/build-image.sh "$DIR" >&2
fi
for tool in qemu-system-x86_64:qemu-system-x86 curl:curl ss:iproute2; do
  if ! command -v "${tool%%:*}" >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${tool#*:}" >&2
  fi
done

ACCEL="${BOOT_ACCEL:-}"
PROBE=0
if [ -z "$ACCEL" ]; then
  if [ -r /dev/kvm ] && [ -w /dev/kvm ]; then
    # A /dev/kvm can be there and still not work (nested, with no hardware virtualisation
    # under it: a guest that crawls, or qemu aborting on an MSR the hypervisor refuses): KVM
    # must show the first console line within the probe time without qemu exiting, or the boot
    # is done again under software emulation.
    ACCEL=kvm
    PROBE="${BOOT_KVM_PROBE:-10}"
  else
    ACCEL=tcg
  fi
fi
limit_for() { if [ "$1" = kvm ]; then echo "${BOOT_TIMEOUT:-60}"; else echo "${BOOT_TIMEOUT:-300}"; fi; }
ACCEL_NOTE=""
KVM_WHY=""

# A free port on the loopback for the forwarded hostPort.
PORT=""
for _ in $(seq 1 50); do
  p=$(( 20000 + RANDOM % 20000 ))
  if ! ss -Htln "sport = :$p" | grep -q .; then PORT=$p; break; fi
done
[ -n "$PORT" ] || { echo "boot-image: no free port found" >&2; exit 1; }

CONSOLE="$(mktemp /tmp/nodelet-boot-console.XXXXXX)"
BODY="$(mktemp /tmp/nodelet-boot-answer.XXXXXX)"
QEMU=""
cleanup() {
  if [ "${BOOT_KEEP:-0}" != 1 ] || [ -z "${answer:-}" ]; then
    [ -n "$QEMU" ] && kill "$QEMU" 2>/dev/null && wait "$QEMU" 2>/dev/null
    rm -f "$CONSOLE"
  fi
  rm -f "$BODY"
}
trap cleanup EXIT
now_ns() { date +%s%N; }
secs() { awk -v a="$1" -v b="$T0" 'BEGIN {printf "%.2f", (a - b) / 1e9}'; }

# boot ACCEL LIMIT PROBE: powers the machine on and waits for the pod's answer (at most LIMIT
# seconds; with PROBE > 0, gives up when the console stays empty for PROBE seconds). Sets T0
# and the times agent, running, answer; returns 2 when the probe gave up, 1 on no answer.
boot() {
  local accel=$1 limit=$2 probe=$3 cpu=max network="" t deadline probe_deadline
  [ "$accel" = kvm ] && cpu=host
  : > "$CONSOLE"
  agent="" running="" answer=""
  T0=$(now_ns)
  qemu-system-x86_64 -accel "$accel" -cpu "$cpu" -smp 2 -m 1024 \
    -nodefaults -no-user-config -display none -no-reboot \
    -serial "file:$CONSOLE" \
    -kernel "$DIR/vmlinuz" -initrd "$DIR/initramfs.img" \
    -append "console=ttyS0 quiet panic=-1" \
    -netdev "user,id=net0,hostfwd=tcp:127.0.0.1:$PORT-:8080" -device virtio-net-pci,netdev=net0 &
  QEMU=$!
  deadline=$(( T0 + limit * 1000000000 ))
  probe_deadline=$(( T0 + probe * 1000000000 ))
  while [ "$(now_ns)" -lt "$deadline" ]; do
    t=$(now_ns)
    [ -z "$agent" ] && grep -q "nodelet-image: agent started" "$CONSOLE" && agent=$t
    [ -z "$running" ] && grep -q "nodelet-image: pod running" "$CONSOLE" && running=$t
    [ -z "$network" ] && grep -q "nodelet-image: network ready" "$CONSOLE" && network=$t
    # Asked only once the guest has an address: before that, a connection through qemu's
    # forwarding would hang rather than fail.
    if [ -n "$network" ] && curl -fsS --max-time 2 -o "$BODY" "http://127.0.0.1:$PORT/" 2>/dev/null; then
      answer=$(now_ns)
      break
    fi
    if ! kill -0 "$QEMU" 2>/dev/null; then
      echo "boot-image: qemu exited" >&2
      # Under KVM before the guest said anything: KVM cannot run it here (e.g. qemu aborting
      # on an MSR the nested hypervisor refuses).
      if [ "$probe" -gt 0 ] && ! grep -q "nodelet-image:" "$CONSOLE"; then
        wait "$QEMU" 2>/dev/null || true
        QEMU=""
        KVM_WHY="qemu exited before the guest's first console line"
        return 2
      fi
      break
    fi
    if [ "$probe" -gt 0 ] && [ "$t" -gt "$probe_deadline" ] && ! grep -q "nodelet-image:" "$CONSOLE"; then
      kill "$QEMU" 2>/dev/null; wait "$QEMU" 2>/dev/null || true
      QEMU=""
      KVM_WHY="no console output within ${probe} s"
      return 2
    fi
    sleep 0.02
  done
  # The marker may land between the last look and the answer.
  [ -z "$running" ] && grep -q "nodelet-image: pod running" "$CONSOLE" && running=${answer:-$(now_ns)}
  [ -n "$answer" ]
}

rc=0
boot "$ACCEL" "$(limit_for "$ACCEL")" "$PROBE" || rc=$?
if [ "$rc" = 2 ]; then
  ACCEL_NOTE=" (KVM tried first: $KVM_WHY, so /dev/kvm cannot be used here)"
  echo "boot-image: under KVM, $KVM_WHY; booting again under software emulation" >&2
  ACCEL=tcg
  rc=0
  boot tcg "$(limit_for tcg)" 0 || rc=$?
fi

size=$(( $(stat -c %s "$DIR/vmlinuz") + $(stat -c %s "$DIR/initramfs.img") ))
echo "accel: $ACCEL$ACCEL_NOTE"
echo "image: $(awk -v b="$size" 'BEGIN {printf "%.1f", b / 1048576}') MiB (vmlinuz + initramfs.img in $DIR)"
grep "nodelet-image:" "$CONSOLE" | sed 's/^/guest: /' || true
if [ -z "$answer" ]; then
  echo "boot-image: no HTTP answer from the static pod within $(limit_for "$ACCEL") s ($ACCEL); the console's tail:" >&2
  tail -n 40 "$CONSOLE" >&2
  exit 1
fi
echo "answer: $(head -c 200 "$BODY")"
[ -n "$agent" ] && echo "agent started: $(secs "$agent") s"
[ -n "$running" ] && echo "pod running: $(secs "$running") s"
echo "first HTTP answer: $(secs "$answer") s"
if [ "${BOOT_KEEP:-0}" = 1 ]; then
  echo "the VM runs on (pid $QEMU): curl http://127.0.0.1:$PORT/; console: $CONSOLE; stop: kill $QEMU"
fi
