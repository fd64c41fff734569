# Sourced by the image scripts (scripts/build-image.sh, scripts/build-systemd-image.sh): Debian
# packages downloaded once into "$DEBS" (the caller sets it; delete the dir to fetch newer ones).

# fetch PACKAGE -> the .deb's path
fetch() {
  local f
  mkdir -p "$DEBS"
  f=$(ls "$DEBS/$1"_*.deb 2>/dev/null | head -n 1 || true)
  if [ -z "$f" ]; then
    (cd "$DEBS" && apt-get download "$1" 2>&1 | grep -v "^W: Download is performed unsandboxed" >&2)
    f=$(ls "$DEBS/$1"_*.deb | head -n 1)
  fi
  echo "$f"
}

# fetch_kernel -> the .deb of Debian's kernel: the one linux-image-amd64 (or $KERNEL_PACKAGE)
# depends on.
fetch_kernel() {
  local meta pkg
  meta=$(fetch "${KERNEL_PACKAGE:-linux-image-amd64}")
  pkg=$(dpkg-deb -f "$meta" Depends | tr ',' '\n' | grep -o 'linux-image-[0-9][^ ]*' | head -n 1 || true)
  fetch "${pkg:-${KERNEL_PACKAGE:-linux-image-amd64}}"
}
