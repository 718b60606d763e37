#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) into build-fuzz/ and runs each for
# FUZZ_SECONDS (default 300) from its seed corpus. scripts/test.sh runs it briefly.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_EACH="${FUZZ_SECONDS:-300}"
# FUZZ_SEED fixes libFuzzer's seed (scripts/test.sh does, so CI runs repeat); unset: random.
SEED_ARG=()
[[ -n "${FUZZ_SEED:-}" ]] && SEED_ARG=(-seed="$FUZZ_SEED")
BUILD="${FUZZ_BUILD_DIR:-$ROOT/build-fuzz}"
CLANG="$(command -v clang++-14 || command -v clang++)"
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  CC="${CLANG/++/}" CXX="$CLANG" cmake -S "$ROOT" -B "$BUILD" -G Ninja -DLEANTRON_FUZZ=ON \
    -DLEANTRON_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
targets=$(sed -n 's/^leantron_fuzzer(\([a-z0-9_]*\) .*/\1/p' "$ROOT/tests/fuzz/CMakeLists.txt")
cmake --build "$BUILD" -j"$(nproc)" --target $targets
for t in $targets; do
  corpus="$(mktemp -d)"
  cp -r "$ROOT/tests/fuzz/corpus/$t/." "$corpus/" 2>/dev/null || true
  echo "fuzz: $t for ${SECONDS_EACH}s"
  log="$corpus.log"
  if ! "$BUILD/bin/$t" -max_total_time="$SECONDS_EACH" -max_len=65536 -print_final_stats=1 "${SEED_ARG[@]}" \
      "$corpus" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    echo "fuzz: $t found a failure (reproducer saved in the working directory)" >&2
    exit 1
  fi
  grep -E "^stat::number_of_executed_units" "$log" || true
  rm -rf "$corpus" "$log"
done
echo "fuzz: all targets clean"
