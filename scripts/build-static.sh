#!/usr/bin/env bash
# Builds one statically linked nodelet: the release profile, glibc linked in statically
# (`crt-static`), libseccomp from Debian's libseccomp-dev linked in (`LIBSECCOMP_LINK_TYPE=static`,
# as youki's static builds do), and every other native part (ring, zstd) compiled from source as in
# the dynamic build. The binary is stripped and checked to need no shared library; its path is the
# last line printed.
#
#   bash scripts/build-static.sh              # target/static/x86_64-unknown-linux-gnu/release/nodelet
#   CARGO_TARGET_DIR=/somewhere bash scripts/build-static.sh
#
# Why static glibc and not musl: the same C library (and allocator) as the dynamic build, so the
# two can be compared as they are; Debian ships libseccomp.a for glibc only. Since glibc 2.34 the
# `files` and `dns` name services are part of libc itself, so a static binary still resolves names
# from /etc/hosts and DNS without loading any NSS module.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh >&2

TARGET=x86_64-unknown-linux-gnu
# Its own target dir: the flags below change every crate's build, and sharing a dir with the
# dynamic build would rebuild one over the other each time.
OUT="${CARGO_TARGET_DIR:-$PWD/target}/static"
LIBDIR="$(pkg-config --variable=libdir libseccomp 2>/dev/null || echo /usr/lib/x86_64-linux-gnu)"
[ -f "$LIBDIR/libseccomp.a" ] || { echo "build-static: $LIBDIR/libseccomp.a is missing (libseccomp-dev)" >&2; exit 1; }

# --target keeps the flags off build scripts and proc macros, which stay ordinary host programs.
# relocation-model=static: a plain static executable, not static-pie, so that its pages stay
# clean and shared between the agent and every sandbox process, as the dynamic build's non-PIE
# link does (build.rs).
CARGO_TARGET_DIR="$OUT" \
LIBSECCOMP_LINK_TYPE=static LIBSECCOMP_LIB_PATH="$LIBDIR" \
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static -C relocation-model=static" \
  cargo build --release --locked --bin nodelet --target "$TARGET" >&2

BIN="$OUT/$TARGET/release/nodelet"
strip "$BIN"
if ldd "$BIN" >/dev/null 2>&1; then
  echo "build-static: $BIN has dynamic dependencies:" >&2
  ldd "$BIN" >&2
  exit 1
fi
# No program interpreter and no needed library (binutils' readelf: the linker's own package).
if readelf -l "$BIN" | grep -q "INTERP" || readelf -d "$BIN" | grep -q "(NEEDED)"; then
  echo "build-static: $BIN is not statically linked:" >&2
  readelf -d "$BIN" >&2
  exit 1
fi
echo "build-static: $(stat -c %s "$BIN") bytes, statically linked" >&2
echo "$BIN"
