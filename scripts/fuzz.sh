#!/usr/bin/env bash
# Builds the fuzz targets (tests/fuzz, cargo-fuzz + libFuzzer) and runs each for a bounded
# time, starting from a copy of its checked-in seed corpus (tests/fuzz/corpus/<target>) in a
# scratch directory, so the checked-in corpus never grows by itself. Fails when a target
# crashes (a panic, a failed property, a timeout, running out of memory) and says where the
# input that did it is. docs/FUZZING.md describes the targets.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]     (default: 60 s, every target)
#
# Environment: FUZZ_SCRATCH keeps the grown corpora and logs there instead of a temporary
# directory; FUZZ_BUILD=dev builds without optimisation (what CI does: the build takes much less
# time, the targets run slower), the default is release (opt-level 1, tests/fuzz/Cargo.toml).
#
# Toolchain: cargo-fuzz passes nightly-only flags to rustc (`-Z...`); the stable toolchain
# accepts them with RUSTC_BOOTSTRAP=1. The targets are built without a sanitizer (`-s none`,
# which builds and runs on stable that way; ASan was not tried): every crate under test denies
# `unsafe` code, so ASan would have little to find that Rust's own checks (bounds, overflow
# with `-a`, debug assertions) do not, while it makes the build slower and each run about twice
# as slow. libFuzzer itself still reports memory growth (-rss_limit_mb) and hangs (-timeout).
set -euo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
fuzz_dir=tests/fuzz
export RUSTC_BOOTSTRAP=1

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install cargo-fuzz --locked
fi

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list --fuzz-dir "$fuzz_dir")
fi
if [ "${#targets[@]}" -eq 0 ]; then
  echo "FAIL: no fuzz targets found in $fuzz_dir" >&2
  exit 1
fi

echo "== building the fuzz targets (${targets[*]})"
start=$(date +%s)
profile=${FUZZ_BUILD:-release}
case $profile in
  release) build_flags=(-a) ;;
  dev) build_flags=(--dev) ;;
  *) echo "FUZZ_BUILD must be release or dev, not $profile" >&2; exit 2 ;;
esac
build() { cargo fuzz build --fuzz-dir "$fuzz_dir" -s none "${build_flags[@]}" "$@"; }
if [ "$#" -gt 0 ]; then
  for t in "${targets[@]}"; do build "$t"; done
else
  build
fi
host=$(rustc -vV | sed -n 's/^host: //p')
bin_dir=$fuzz_dir/target/$host/$( [ "$profile" = dev ] && echo debug || echo release )
for t in "${targets[@]}"; do
  if [ ! -x "$bin_dir/$t" ]; then
    echo "FAIL: fuzz target $t did not build" >&2
    exit 1
  fi
done
echo "   built in $(( $(date +%s) - start )) s"

scratch=${FUZZ_SCRATCH:-$(mktemp -d)}
artifacts=$fuzz_dir/artifacts
mkdir -p "$scratch" "$artifacts"
failed=()
for t in "${targets[@]}"; do
  corpus=$scratch/corpus/$t
  mkdir -p "$corpus" "$artifacts/$t"
  if [ -d "$fuzz_dir/corpus/$t" ]; then
    cp -r "$fuzz_dir/corpus/$t/." "$corpus/"
  fi
  log=$scratch/$t.log
  echo "== fuzzing $t for ${secs} s (corpus $(ls "$corpus" | wc -l) inputs)"
  if "$bin_dir/$t" "$corpus" \
      -max_total_time="$secs" -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$artifacts/$t/" >"$log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^Done' "$log" | tr '\n' ' ' || true
    echo
  else
    failed+=("$t")
    echo "FAIL: $t crashed; the end of its log ($log):" >&2
    grep -vE '^#[0-9]+' "$log" | tail -n 40 >&2
    crash=$(grep -oE "Test unit written to \S+" "$log" | tail -n 1 | cut -d' ' -f5 || true)
    if [ -n "$crash" ]; then
      echo "FAIL: $t: the input is $crash; replay it with: $bin_dir/$t $crash" >&2
    fi
  fi
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "FAIL: fuzz targets crashed: ${failed[*]}" >&2
  exit 1
fi
echo "== fuzzing: every target ran ${secs} s without a crash"
