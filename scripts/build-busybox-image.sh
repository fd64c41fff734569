#!/usr/bin/env bash
# Builds a small, real container image from Debian's dynamic busybox, for nodelet's tests.
#
#   scripts/build-busybox-image.sh OUT [--format oci|docker] [--name NAME] [--add SRC:DEST]...
#
# The image has one layer: /bin/busybox with every applet hard-linked beside it in /bin, the shared
# libraries busybox needs (at the paths ldd reports) and the dynamic loader, /etc/passwd and
# /etc/group (root and nobody), /tmp (1777), /root and empty /proc /sys /dev dirs.
#   --format oci     (default) an OCI image archive: oci-layout, index.json (the NAME as the
#                    org.opencontainers.image.ref.name annotation), blobs/sha256/...; gzip layer.
#   --format docker  what `docker save` writes: manifest.json with RepoTags, <config>.json, and
#                    <id>/layer.tar (uncompressed, as docker writes it).
#   --add SRC:DEST   also puts the program SRC at DEST (mode 0755, debug info stripped when
#                    strip is there), with the shared libraries it needs: how the tests get
#                    their own programs (the gRPC health server of the probe tests) into an
#                    image. Repeatable.
# NAME defaults to docker.io/library/busybox:latest. Uses only bash, coreutils, tar, gzip, sha256sum
# (and apt-get to install busybox when it is missing). Output is deterministic for a given host.
set -euo pipefail

usage() {
  echo "usage: $0 OUT [--format oci|docker] [--name NAME] [--add SRC:DEST]..." >&2
  exit 2
}

OUT=""
FORMAT=oci
NAME=docker.io/library/busybox:latest
ADDS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --format) [ $# -ge 2 ] || usage; FORMAT=$2; shift 2 ;;
    --format=*) FORMAT=${1#--format=}; shift ;;
    --name) [ $# -ge 2 ] || usage; NAME=$2; shift 2 ;;
    --name=*) NAME=${1#--name=}; shift ;;
    --add) [ $# -ge 2 ] || usage; ADDS+=("$2"); shift 2 ;;
    --add=*) ADDS+=("${1#--add=}"); shift ;;
    -h|--help) usage ;;
    -*) echo "unknown option: $1" >&2; usage ;;
    *) [ -z "$OUT" ] || usage; OUT=$1; shift ;;
  esac
done
[ -n "$OUT" ] || usage
case "$FORMAT" in oci|docker) ;; *) echo "unknown format: $FORMAT" >&2; usage ;; esac

BUSYBOX=/bin/busybox
if [ ! -x "$BUSYBOX" ] || ! dpkg-query -W -f='${Status}' busybox 2>/dev/null | grep -q 'install ok installed'; then
  SUDO=""
  [ "$(id -u)" = 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -qq --no-install-recommends busybox >/dev/null ||
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends busybox >/dev/null; }
fi

case "$(dpkg --print-architecture)" in
  amd64) ARCH=amd64; VARIANT="" ;;
  arm64) ARCH=arm64; VARIANT=v8 ;;
  armhf) ARCH=arm; VARIANT=v7 ;;
  armel) ARCH=arm; VARIANT=v5 ;;
  i386) ARCH=386; VARIANT="" ;;
  ppc64el) ARCH=ppc64le; VARIANT="" ;;
  s390x) ARCH=s390x; VARIANT="" ;;
  riscv64) ARCH=riscv64; VARIANT="" ;;
  mips64el) ARCH=mips64le; VARIANT="" ;;
  *) ARCH=$(dpkg --print-architecture); VARIANT="" ;;
esac

WORK=$(mktemp -d "${TMPDIR:-/tmp}/busybox-image.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ROOTFS=$WORK/rootfs
mkdir -p "$ROOTFS"/{bin,etc,tmp,root,proc,sys,dev}

# busybox and its applets, all one inode.
cp "$BUSYBOX" "$ROOTFS/bin/busybox"
chmod 0755 "$ROOTFS/bin/busybox"
while IFS= read -r applet; do
  case "$applet" in ""|busybox|*/*) continue ;; esac
  ln "$ROOTFS/bin/busybox" "$ROOTFS/bin/$applet"
done < <("$BUSYBOX" --list)

# Programs added with --add.
PROGRAMS=("$BUSYBOX")
for add in "${ADDS[@]}"; do
  src=${add%%:*}
  dest=${add#*:}
  case "$dest" in /*) ;; *) echo "--add $add: DEST must be absolute" >&2; exit 2 ;; esac
  [ -f "$src" ] || { echo "--add $add: no file $src" >&2; exit 2; }
  mkdir -p "$ROOTFS$(dirname "$dest")"
  cp "$src" "$ROOTFS$dest"
  if command -v strip >/dev/null; then strip --strip-debug "$ROOTFS$dest" 2>/dev/null || true; fi
  chmod 0755 "$ROOTFS$dest"
  PROGRAMS+=("$src")
done

# Shared libraries at the paths the loader finds them, and the loader itself (PT_INTERP path).
for program in "${PROGRAMS[@]}"; do
ldd "$program" 2>/dev/null | grep -v 'not a dynamic executable' || true
done | sort -u > "$WORK/libs"
while IFS= read -r line; do
  line=${line#"${line%%[![:space:]]*}"}   # ldd indents with a tab
  lib=""
  case "$line" in
    *"=> /"*) lib=${line#*=> }; lib=${lib%% (*} ;;
    /*) lib=${line%% (*} ;;
  esac
  lib=$(echo "$lib" | tr -d '[:space:]')
  [ -n "$lib" ] || continue
  [ -e "$ROOTFS$lib" ] && continue
  mkdir -p "$ROOTFS$(dirname "$lib")"
  cp -L "$lib" "$ROOTFS$lib"
  chmod 0755 "$ROOTFS$lib"
done < "$WORK/libs"

cat > "$ROOTFS/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat > "$ROOTFS/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
chmod 0644 "$ROOTFS/etc/passwd" "$ROOTFS/etc/group"
chmod 0755 "$ROOTFS"/{bin,etc,proc,sys,dev}
chmod 1777 "$ROOTFS/tmp"
chmod 0700 "$ROOTFS/root"

# The layer: sorted, owned by root, fixed mtimes; hard links stay hard links.
LAYER_TAR=$WORK/layer.tar
tar -C "$ROOTFS" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
  --format=gnu -cf "$LAYER_TAR" .
DIFF_HEX=$(sha256sum "$LAYER_TAR" | cut -d' ' -f1)

platform_json() {
  printf '"architecture":"%s","os":"linux"' "$ARCH"
  [ -z "$VARIANT" ] || printf ',"variant":"%s"' "$VARIANT"
}

CONFIG_JSON=$WORK/config.json
printf '{%s,"created":"1970-01-01T00:00:00Z","config":{"Env":["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["sh"]},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]},"history":[{"created":"1970-01-01T00:00:00Z","created_by":"scripts/build-busybox-image.sh"}]}' \
  "$(platform_json)" "$DIFF_HEX" > "$CONFIG_JSON"
CONFIG_HEX=$(sha256sum "$CONFIG_JSON" | cut -d' ' -f1)
CONFIG_SIZE=$(stat -c %s "$CONFIG_JSON")

json_escape() {
  local s=$1
  s=${s//\\/\\\\}
  s=${s//\"/\\\"}
  printf '%s' "$s"
}

OUTDIR=$WORK/out
mkdir -p "$OUTDIR"
if [ "$FORMAT" = oci ]; then
  mkdir -p "$OUTDIR/blobs/sha256"
  gzip -n -1 -c "$LAYER_TAR" > "$WORK/layer.tar.gz"
  LAYER_HEX=$(sha256sum "$WORK/layer.tar.gz" | cut -d' ' -f1)
  LAYER_SIZE=$(stat -c %s "$WORK/layer.tar.gz")
  mv "$WORK/layer.tar.gz" "$OUTDIR/blobs/sha256/$LAYER_HEX"
  cp "$CONFIG_JSON" "$OUTDIR/blobs/sha256/$CONFIG_HEX"
  MANIFEST=$WORK/manifest.json
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
    "$CONFIG_HEX" "$CONFIG_SIZE" "$LAYER_HEX" "$LAYER_SIZE" > "$MANIFEST"
  MANIFEST_HEX=$(sha256sum "$MANIFEST" | cut -d' ' -f1)
  MANIFEST_SIZE=$(stat -c %s "$MANIFEST")
  cp "$MANIFEST" "$OUTDIR/blobs/sha256/$MANIFEST_HEX"
  printf '{"imageLayoutVersion":"1.0.0"}' > "$OUTDIR/oci-layout"
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"org.opencontainers.image.ref.name":"%s"},"platform":{%s}}]}' \
    "$MANIFEST_HEX" "$MANIFEST_SIZE" "$(json_escape "$NAME")" "$(platform_json)" > "$OUTDIR/index.json"
  ENTRIES=(oci-layout index.json blobs)
else
  # docker save writes familiar names ("busybox:latest") and uncompressed layers.
  TAG=$NAME
  TAG=${TAG#docker.io/library/}
  TAG=${TAG#docker.io/}
  mkdir -p "$OUTDIR/$DIFF_HEX"
  mv "$LAYER_TAR" "$OUTDIR/$DIFF_HEX/layer.tar"
  printf '1.0' > "$OUTDIR/$DIFF_HEX/VERSION"
  cp "$CONFIG_JSON" "$OUTDIR/$CONFIG_HEX.json"
  printf '[{"Config":"%s.json","RepoTags":["%s"],"Layers":["%s/layer.tar"]}]' \
    "$CONFIG_HEX" "$(json_escape "$TAG")" "$DIFF_HEX" > "$OUTDIR/manifest.json"
  ENTRIES=(manifest.json "$CONFIG_HEX.json" "$DIFF_HEX")
fi

mkdir -p "$(dirname "$OUT")"
tar -C "$OUTDIR" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
  -cf "$OUT.tmp.$$" "${ENTRIES[@]}"
mv "$OUT.tmp.$$" "$OUT"
echo "$OUT: $FORMAT image $NAME (config sha256:$CONFIG_HEX, layer diff_id sha256:$DIFF_HEX)"
