#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, clang, ASan + UBSan) in build-fuzz and runs each for
# SECONDS (default 20), starting from the seed corpus in fuzz/corpus/<target>/. Fails when any
# target crashes, leaks, trips a sanitizer or an assertion of its own; the crashing input is
# then in build-fuzz/artifacts/<target>/ (replay: build-fuzz/fuzz/<target> <file>).
# Usage: scripts/run-fuzzers.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-20}
JOBS=${JOBS:-$(nproc)}
B=build-fuzz
TARGETS=(frame_fuzzer plan_blob_fuzzer config_fuzzer tcp_wire_fuzzer)

CC=clang CXX=clang++ cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFLUXON_FUZZ=ON -DFLUXON_CUDA=OFF -DFLUXON_BUILD_TESTS=OFF -DFLUXON_BUILD_BENCH=OFF >/dev/null
cmake --build $B -j "$JOBS" --target "${TARGETS[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
failed=()
for t in "${TARGETS[@]}"; do
  work=$B/corpus/$t       # grows as the fuzzer finds new coverage; the seeds stay untouched
  art=$B/artifacts/$t
  mkdir -p "$work" "$art"
  extra=()
  [ "$t" = frame_fuzzer ] && extra=(-max_len=70000)  # room for frames over the Hello limit
  echo "--- $t: ${SECONDS_EACH}s"
  if ! "$B/fuzz/$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$art/" "${extra[@]}" "$work" "fuzz/corpus/$t" \
      > "$B/$t.log" 2>&1; then
    tail -60 "$B/$t.log"
    echo "FAILED: $t (log $B/$t.log, input in $art/)" >&2
    failed+=("$t")
  else
    grep -E "^(Done|stat::number_of_executed_units)" "$B/$t.log" || true
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzzers failed: ${failed[*]}" >&2
  exit 1
fi
echo "all fuzzers ran ${SECONDS_EACH}s each without a crash"
