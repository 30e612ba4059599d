#!/usr/bin/env bash
# Builds, packs and runs the GPU data-plane tests and benchmark.
#
# On the development machine (no GPU needed):
#   scripts/gpu-run.sh pack [DEST]
#     builds the Python module (for Python 3.12, the GPU machine's) and the benchmark in
#     $BUILD_DIR (default build-gpu), and copies them with their non-system shared libraries, the
#     Python package and the GPU tests into DEST (default: .gpupack in the repository root, which
#     must be git-ignored). Then prints the command to run on the GPU machine.
#     Env: PYTHON312 (interpreter to build the module for), BUILD_DIR, JOBS.
#
# On the GPU machine, from the folder that holds DEST:
#   bash .gpupack/gpu-run.sh device [all|test|bench|quick]
#     test : GPU tests (tests/gpu/test_kv_kernels.py) and compute-sanitizer memcheck on a small case
#     bench: kv_transfer_bench (tables of GB/s and latency)
#     all  : both (default); quick: tests in quick mode and the benchmark without sweeps
#     Logs and the benchmark CSV go to $OUT (or ./gpu-out); the short tables are printed last.
set -uo pipefail

mode=${1:-}
case $mode in
  pack)
    set -e
    cd "$(dirname "$0")/.."
    ROOT=$PWD
    DEST=${2:-$ROOT/.gpupack}
    BUILD_DIR=${BUILD_DIR:-build-gpu}
    PY=${PYTHON312:-/root/.pyenv/versions/3.12.1/bin/python3}
    PYBIND_DIR=$(python3 -m pybind11 --cmakedir 2>/dev/null || "$PY" -m pybind11 --cmakedir)
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLUXON_CUDA=ON \
      -DPython_EXECUTABLE="$PY" -Dpybind11_DIR="$PYBIND_DIR" >/dev/null
    cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target _fluxon_kernels kv_transfer_bench
    rm -rf "$DEST"
    mkdir -p "$DEST/bin" "$DEST/lib" "$DEST/python/fluxon" "$DEST/tests"
    cp "$BUILD_DIR"/bench/gpu/kv_transfer_bench "$DEST/bin/"
    cp "$BUILD_DIR"/kernels/_fluxon_kernels*.so python/fluxon/kernels.py "$DEST/python/fluxon/"
    cp tests/gpu/test_kv_kernels.py "$DEST/tests/"
    cp scripts/gpu-run.sh "$DEST/"
    # Non-system shared libraries (abseil, numa, ...); glibc and libstdc++ come from the target.
    for f in "$DEST"/bin/kv_transfer_bench "$DEST"/python/fluxon/_fluxon_kernels*.so; do
      ldd "$f" | awk '/=> \//{print $3}'
    done | sort -u | grep -vE '/(libc|libm|libdl|librt|libpthread|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
      xargs -r cp -L -t "$DEST/lib/"
    du -sh "$DEST"
    echo "run on the GPU machine (device tool, carry [\"$(basename "$DEST")\"]):"
    echo "  bash $(basename "$DEST")/gpu-run.sh device all"
    ;;
  device)
    what=${2:-all}
    PACK=$(cd "$(dirname "$0")" && pwd)
    OUTDIR=${OUT:-$PWD/gpu-out}
    mkdir -p "$OUTDIR"
    export LD_LIBRARY_PATH=$PACK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PYTHONPATH=$PACK/python${PYTHONPATH:+:$PYTHONPATH}
    export PYTHONUNBUFFERED=1
    rc=0
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv 2>&1 | tee "$OUTDIR/gpu.txt"
    if [ "$what" = all ] || [ "$what" = test ] || [ "$what" = quick ]; then
      qflag=""
      [ "$what" = quick ] && qflag=--quick
      echo "=== GPU tests"
      python3 "$PACK/tests/test_kv_kernels.py" $qflag >"$OUTDIR/test.log" 2>&1 || rc=1
      echo "=== compute-sanitizer memcheck (small case, every path)"
      SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
      if [ -n "$SAN" ]; then
        "$SAN" --tool memcheck --leak-check full --error-exitcode 3 \
          "$PACK/bin/kv_transfer_bench" --verify --small >"$OUTDIR/memcheck.log" 2>&1 || rc=1
        tail -n 4 "$OUTDIR/memcheck.log"
      else
        echo "compute-sanitizer not found" | tee "$OUTDIR/memcheck.log"; rc=1
      fi
    fi
    if [ "$what" = all ] || [ "$what" = bench ] || [ "$what" = quick ]; then
      echo "=== benchmark"
      bflag=""
      [ "$what" = quick ] && bflag="--quick --no-sweep"
      "$PACK/bin/kv_transfer_bench" $bflag --csv "$OUTDIR/bench.csv" >"$OUTDIR/bench.log" 2>&1 || rc=1
    fi
    echo
    [ -f "$OUTDIR/bench.log" ] && cat "$OUTDIR/bench.log"
    [ -f "$OUTDIR/test.log" ] && sed -n '/^## GPU data-plane tests/,$p' "$OUTDIR/test.log"
    [ -f "$OUTDIR/test.log" ] && grep -E "^FAIL|Error|Traceback" "$OUTDIR/test.log" | head -20
    [ -f "$OUTDIR/memcheck.log" ] && grep -E "ERROR SUMMARY|verify:" "$OUTDIR/memcheck.log"
    echo "gpu-run: $([ $rc = 0 ] && echo PASS || echo FAIL)"
    exit $rc
    ;;
  *)
    sed -n '2,20p' "$0"
    exit 2
    ;;
esac
