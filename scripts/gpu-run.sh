#!/usr/bin/env bash
# Builds, packs and runs the GPU data-plane tests and benchmark.
#
# On the development machine (no GPU needed):
#   scripts/gpu-run.sh pack [DEST]
#     builds the fluxon wheel for Python 3.12 (the GPU machine's) with scripts/build-wheel.sh
#     (auditwheel-repaired, kernels included: nvcc must be here) and the benchmark in $BUILD_DIR
#     (default build-gpu), and copies the wheel, the benchmark with its shared libraries (abseil,
#     numa: the benchmark only), the GPU tests and the pinned SGLang into DEST (default: .gpupack
#     in the repository root, which must be git-ignored). Then prints the command to run on the
#     GPU machine.
#     Env: PYTHON312 (interpreter to build the wheel for), BUILD_DIR, JOBS.
#
# On the GPU machine the tests run from the wheel: `pip install` into a fresh venv (with the
# machine's torch through --system-site-packages), fluxond and fluxonctl from the venv's bin, no
# LD_LIBRARY_PATH and no PYTHONPATH into the pack.
#
# On the GPU machine, from the folder that holds DEST:
#   bash .gpupack/gpu-run.sh device [all|test|bench|bulk|quick]
#     test : GPU tests (tests/gpu/test_kv_kernels.py; again with the bulk-copy kernel),
#            compute-sanitizer memcheck on a small case of every path, and the end-to-end test
#            with a real fluxond and client processes (tests/gpu/test_e2e_fluxond.py)
#     e2e  : only the end-to-end test
#     bench: kv_transfer_bench (tables of GB/s and latency)
#     bulk : kv_transfer_bench --bulk (the experimental cp.async.bulk kernel's tables)
#     sglang: fluxon.sglang inside the real, pinned SGLang with real host pools
#            (tests/gpu/test_sglang_real.py); part of test and all
#     linker: fluxon.sglang_linker.FluxonLinker (SGLang's UnifiedCacheLinker) inside the real SGLang
#            with real device pools (tests/gpu/test_linker_real.py); part of test and all
#     serve: launched SGLang servers (python -m sglang.launch_server) with fluxon as HiCache
#            storage backend and as unified cache linker, checked over HTTP
#            (tests/gpu/test_serve_real.py; part of test and all; SERVE_TIMEOUT_S bounds it)
#     servebench: bench/gpu/serving_bench.py (multi-turn TTFT and throughput of launched servers:
#            GPU cache only, SGLang's host L2, fluxon storage backend and linker, ...;
#            SERVEBENCH_ARGS passes options, e.g. --configs; not part of all)
#     linkerbench: bench/gpu/linker_bench.py (FluxonLinker restore/offload against the pinned
#            memcpy ceiling and the HiCacheStorage path, in the real SGLang; not part of all)
#     replica: bench/replica_bench.py (replicas by pull, one batch's wave and the steady rate of
#            a backlog, against bench_transport's read of the same values, and the put cycle
#            with replicas on and off; CPU only, on the GPU machine's idle cores; REPLICA_ARGS
#            passes options, e.g. "--rounds 2 --pulls-in-flight 8 --shapes 1024x65536"; not
#            part of all)
#     capacity: bench/capacity_split.py (an owner of L bytes with a remote_cache of R against one
#            owner of L and of L + R; CPU only, on the GPU machine's idle cores); CAPACITY_RUNS
#            lists trace:value_len[:opt,opt] runs (a trace of bench_eviction_policy, or
#            multiturn; the options after the second colon, comma-separated, are that run's own:
#            an option whose value has commas, such as --configs, goes in CAPACITY_ARGS),
#            CAPACITY_ARGS passes options (Mooncake is not in the pack: leave mooncake-L+R out of
#            --configs); not part of all
#     firstput: bench/first_put.py (the first put batches of a fresh owner, idle or with
#            --busy N cores spinning; CPU only; FIRSTPUT_ARGS passes options); not part of all
#     transport: bench_transport (the TCP transport against raw TCP over loopback, CPU per GB and
#            context switches per batch; CPU only; TRANSPORT_ARGS passes options, e.g.
#            --connections=8 --values=1024 --value-len=65536); not part of all
#     recovery: bench/cluster_recovery_bench.py (a master restart: time until the owners'
#            republish routes every value again, the master's CPU and memory meanwhile; CPU only,
#            for route counts whose values this machine's memory can hold; RECOVERY_ARGS passes
#            options, RECOVERY_TIMEOUT_S bounds it); not part of all
#     all  : test and bench (default); quick: tests in quick mode and the benchmark without sweeps
#     Each step runs in its own process (a GPU fault in one cannot hide the others' results).
#     Logs and the benchmark CSV go to $OUT (or ./gpu-out); the short tables are printed last.
set -uo pipefail

mode=${1:-}
SGLANG_VERSION=0.5.23
# Modules SGLang imports on the way to its HiCache classes (flat, no dependency resolution: the
# GPU machine's torch, numpy, transformers and PIL are used as they are).
SGLANG_IMPORT_DEPS="annotated-types asttokens dill executing fastapi gguf interegular ipython
  ipython-pygments-lexers matplotlib-inline msgspec orjson parso pexpect prompt-toolkit ptyprocess
  pure-eval pybase64 pydantic pydantic-core python-multipart pyzmq setproctitle stack-data
  starlette traitlets typing-inspection uvicorn wcwidth apache-tvm-ffi==0.1.11
  compressed-tensors==0.18.0 loguru opentelemetry-api truststore httpx2 httpcore2"
# And what a launched server imports on top (the serve step).
SGLANG_SERVER_DEPS="attrs cffi decorator distro importlib-metadata jedi jiter jsonschema
  jsonschema-specifications openai==2.8.0 partial-json-parser pycparser pygments referencing
  rpds-py sniffio soundfile xgrammar==0.2.7 zipp"
case $mode in
  pack)
    set -e
    cd "$(dirname "$0")/.."
    ROOT=$PWD
    DEST=${2:-$ROOT/.gpupack}
    BUILD_DIR=${BUILD_DIR:-build-gpu}
    # A Python 3.12 that runs (a pyenv shim on PATH may name a version that is not selected).
    PY=${PYTHON312:-}
    if [ -z "$PY" ]; then
      for cand in "$(command -v python3.12 || true)" "$HOME"/.pyenv/versions/3.12*/bin/python3 \
          /usr/bin/python3.12 /usr/local/bin/python3.12; do
        if [ -n "$cand" ] && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' \
            >/dev/null 2>&1; then
          PY=$cand
          break
        fi
      done
    fi
    [ -n "$PY" ] || { echo "gpu-run pack: no Python 3.12 (set PYTHON312)" >&2; exit 1; }
    # pybind11 for the tests' support module and the wheel: the one python3 or the 3.12
    # interpreter has, else installed into the 3.12 interpreter's user site.
    if ! python3 -m pybind11 --version >/dev/null 2>&1 && ! "$PY" -m pybind11 --version >/dev/null 2>&1; then
      "$PY" -m pip install -q --user pybind11 scikit-build-core
    fi
    PYBIND_DIR=$(python3 -m pybind11 --cmakedir 2>/dev/null || "$PY" -m pybind11 --cmakedir)
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLUXON_CUDA=ON \
      -DPython_EXECUTABLE="$PY" -Dpybind11_DIR="$PYBIND_DIR" >/dev/null
    cmake -S . -B "$BUILD_DIR" -DFLUXON_PYTHON=ON >/dev/null
    cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target kv_transfer_bench _fluxon_kernels_testing \
      bench_transport transport_peer bench_eviction_policy
    rm -rf "$DEST"
    mkdir -p "$DEST/bin" "$DEST/lib" "$DEST/wheel" "$DEST/tests"
    # The wheel's kernels module and the tests' support module share a class registration
    # (pybind11 internals), so both are built with the same pybind11: the one found above.
    PYBIND_VERSION=$(python3 -m pybind11 --version 2>/dev/null || "$PY" -m pybind11 --version)
    CONSTRAINTS=$(mktemp)
    echo "pybind11==$PYBIND_VERSION" >"$CONSTRAINTS"
    PIP_CONSTRAINT="$CONSTRAINTS" JOBS=${JOBS:-2} DIST="$DEST/wheel" scripts/build-wheel.sh "$PY"
    rm -f "$CONSTRAINTS"
    WHEEL=$(ls "$DEST"/wheel/fluxon-*-cp312-*.whl)
    "$PY" - "$WHEEL" <<'PY'
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
if not any(n.startswith("fluxon/_fluxon_kernels") for n in names):
    sys.exit(f"{sys.argv[1]} has no fluxon/_fluxon_kernels (was nvcc found?)")
PY
    cp "$BUILD_DIR"/bench/gpu/kv_transfer_bench "$BUILD_DIR"/bench/bench_transport "$DEST/bin/"
    cp "$(find "$BUILD_DIR"/tests -name transport_peer -type f | head -1)" "$DEST/bin/"
    strip "$DEST"/bin/*
    cp tests/gpu/gpu_harness.py tests/gpu/test_kv_kernels.py tests/gpu/test_e2e_fluxond.py \
      tests/gpu/test_sglang_real.py tests/gpu/test_linker_real.py tests/gpu/test_serve_real.py \
      tests/gpu/sglang_launch.py \
      "$DEST/tests/"
    # Test stand-ins for SGLang's kernel wheel and the CUTLASS DSL (harness only).
    cp -r tests/gpu/standins "$DEST/tests/"
    rm -rf "$DEST/tests/standins/__pycache__"
    # The kernel tests' support module (not in the wheel), beside the test that imports it.
    cp "$BUILD_DIR"/tests/kernels/_fluxon_kernels_testing*.so "$DEST/tests/"
    mkdir -p "$DEST/bench"
    cp bench/gpu/linker_bench.py bench/gpu/serving_bench.py bench/replica_bench.py bench/soak_cluster.py \
      bench/capacity_split.py bench/mooncake_compare.py bench/eviction_fluxond_replay.py \
      bench/cluster_recovery_bench.py bench/first_put.py "$DEST/bench/"
    # The eviction traces the capacity split replays (bench/eviction_tables.sh's shapes).
    mkdir -p "$DEST/traces"
    "$BUILD_DIR"/bench/bench_eviction_policy --dump-traces "$DEST/traces" --capacities 25 \
      --reps 1 >/dev/null
    # The pinned SGLang (its Python sources; the compiled extensions are for another Python and
    # are not imported on the HiCache path) and Python 3.12 wheels of the modules it imports at
    # start-up that the GPU machine's torch environment lacks. sgl_kernel (SGLang's CUDA kernel
    # wheel, hundreds of MB) is not carried: the device step stands in an import stub whose
    # functions raise if called, and the HiCache storage path never calls them.
    mkdir -p "$DEST/sglang/wheels"
    W=$(mktemp -d)
    PIPDL=(pip download -q --no-deps --only-binary=:all: --python-version 3.12
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
    # SGLang publishes one wheel (cp311); its Python sources serve 3.12 as they are.
    pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
      --platform manylinux_2_34_x86_64 -d "$W" "sglang==$SGLANG_VERSION"
    (cd "$W" && python3 -m zipfile -e sglang-*.whl src)
    rm -rf "$W"/src/sglang/multimodal_gen "$W"/src/sglang/test
    find "$W"/src -name '*.so' -delete
    tar -C "$W"/src -cJf "$DEST/sglang/sglang.tar.xz" sglang "sglang-$SGLANG_VERSION.dist-info"
    "${PIPDL[@]}" -d "$DEST/sglang/wheels" $SGLANG_IMPORT_DEPS $SGLANG_SERVER_DEPS
    rm -rf "$W"
    cp scripts/gpu-run.sh "$DEST/"
    # The benchmark's non-system shared libraries (abseil, numa); glibc and libstdc++ come from
    # the target. Only the benchmark steps put them on the library path.
    for f in "$DEST"/bin/* "$DEST"/tests/*.so; do
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
    export PYTHONUNBUFFERED=1
    # fluxon from its wheel, pip-installed into a fresh venv that sees the machine's torch.
    VENV=${TMPDIR:-/tmp}/fluxon-venv
    WHEEL=$(ls "$PACK"/wheel/fluxon-*-cp312-*.whl)
    rm -rf "$VENV"
    if python3 -m venv --system-site-packages "$VENV" >"$OUTDIR/venv.log" 2>&1; then
      PIP=("$VENV/bin/python" -m pip)
    else  # no ensurepip on this Python: a venv without pip, filled by the system pip
      rm -rf "$VENV"
      python3 -m venv --without-pip --system-site-packages "$VENV" >>"$OUTDIR/venv.log" 2>&1
      PIP=(python3 -m pip --python "$VENV/bin/python")
    fi
    "${PIP[@]}" install --no-index --no-deps "$WHEEL" >>"$OUTDIR/venv.log" 2>&1 ||
      { cat "$OUTDIR/venv.log"; echo "pip install of $WHEEL failed"; exit 1; }
    PY=$VENV/bin/python
    # The machine's torch (and numpy) may live in python3's own venv, which --system-site-packages
    # does not reach: list python3's site-packages after the venv's own (a .pth file), so fluxon
    # comes from the wheel and torch from the machine.
    python3 -c 'import site, sysconfig; print("\n".join([sysconfig.get_paths()["purelib"]] + site.getsitepackages()))' \
      >"$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/machine-site.pth"
    FLUXOND=$VENV/bin/fluxond
    "$PY" -c "import fluxon, fluxon.kernels, sys; print('fluxon', fluxon.__version__, 'from', fluxon.__file__)" 2>&1 | tee -a "$OUTDIR/venv.log"
    "$FLUXOND" --version | tee -a "$OUTDIR/venv.log"
    ls -la "$WHEEL" | tee -a "$OUTDIR/venv.log"
    BENCH=(env LD_LIBRARY_PATH="$PACK/lib" "$PACK/bin/kv_transfer_bench")
    SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
    rc=0
    step() {  # step NAME LOG COMMAND...: runs one step (bounded), records pass/fail
      local name=$1 log=$2
      shift 2
      if timeout "${STEP_TIMEOUT_S:-420}" "$@" >"$OUTDIR/$log" 2>&1; then
        echo "step $name: ok" | tee -a "$OUTDIR/steps.txt"
      else
        echo "step $name: FAILED (exit $?, see $log)" | tee -a "$OUTDIR/steps.txt"
        rc=1
      fi
    }
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,pcie.link.gen.current,pcie.link.width.current --format=csv >"$OUTDIR/gpu.txt" 2>&1
    cat "$OUTDIR/gpu.txt"
    qflag=""
    [ "$what" = quick ] && qflag=--quick
    case $what in all | test | quick)
      step tests test.log "$PY" "$PACK/tests/test_kv_kernels.py" $qflag
      step tests-bulk test-bulk.log "$PY" "$PACK/tests/test_kv_kernels.py" --quick --bulk
      step e2e e2e.log env FLUXOND="$FLUXOND" "$PY" "$PACK/tests/test_e2e_fluxond.py"
      if [ -n "$SAN" ]; then
        step memcheck memcheck.log env LD_LIBRARY_PATH="$PACK/lib" "$SAN" --tool memcheck \
          --leak-check full --error-exitcode 3 "$PACK/bin/kv_transfer_bench" --verify --small
        step memcheck-bulk memcheck-bulk.log env LD_LIBRARY_PATH="$PACK/lib" "$SAN" --tool memcheck \
          --error-exitcode 3 "$PACK/bin/kv_transfer_bench" --verify --small --bulk
      else
        echo "step memcheck: FAILED (compute-sanitizer not found)" | tee -a "$OUTDIR/steps.txt"; rc=1
      fi
      ;;
    esac
    case $what in all | test | quick | sglang | linker | linkerbench | serve | servebench)
      SGL=${TMPDIR:-/tmp}/fluxon-sglang-env
      rm -rf "$SGL" && mkdir -p "$SGL/src" "$SGL/deps"
      tar -xJf "$PACK/sglang/sglang.tar.xz" -C "$SGL/src"
      "$PY" - "$PACK/sglang/wheels" >"$SGL/need.txt" <<'PY'
import importlib.metadata as md, os, sys
have = {d.metadata["Name"].lower().replace("-", "_") for d in md.distributions()}
for w in sorted(os.listdir(sys.argv[1])):
    if w.split("-")[0].lower() not in have:
        print(os.path.join(sys.argv[1], w))
PY
      [ -s "$SGL/need.txt" ] && pip install -q --no-deps --target "$SGL/deps" $(cat "$SGL/need.txt") \
        >"$OUTDIR/sglang-pip.log" 2>&1
      # sgl_kernel (SGLang's kernel wheel) and the CUTLASS DSL are not carried: the stand-ins
      # (tests/standins/sitecustomize.py) serve them only where no real package is found.
      SGLPATH="$SGL/src:$SGL/deps:$PACK/tests/standins"
      if [ "$what" = serve ] || [ "$what" = all ] || [ "$what" = test ] || [ "$what" = quick ]; then
        STEP_TIMEOUT_S=${SERVE_TIMEOUT_S:-560} step serve serve.log env FLUXOND="$FLUXOND" \
          SERVE_KEEP="$OUTDIR/serve-logs" PYTHONPATH="$SGLPATH" "$PY" "$PACK/tests/test_serve_real.py"
      fi
      if [ "$what" = serve ]; then
        :
      elif [ "$what" = servebench ]; then
        STEP_TIMEOUT_S=${SERVE_TIMEOUT_S:-560} step servebench servebench.log env \
          FLUXOND="$FLUXOND" SERVE_KEEP="$OUTDIR/serve-logs" PYTHONPATH="$SGLPATH" "$PY" \
          "$PACK/bench/serving_bench.py" ${SERVEBENCH_ARGS:-} --csv "$OUTDIR/servebench.csv" \
          --json "$OUTDIR/servebench.json" --plot "$OUTDIR/servebench.png"
      elif [ "$what" = linkerbench ]; then
        step linkerbench linkerbench.log env FLUXOND="$FLUXOND" \
          PYTHONPATH="$SGLPATH" "$PY" "$PACK/bench/linker_bench.py" \
          ${LINKERBENCH_ARGS:-} --csv "$OUTDIR/linkerbench.csv"
      elif [ "$what" != linker ]; then
        step sglang sglang.log env FLUXOND="$FLUXOND" \
          PYTHONPATH="$SGLPATH" "$PY" "$PACK/tests/test_sglang_real.py"
      fi
      if [ "$what" != sglang ] && [ "$what" != linkerbench ] && [ "$what" != serve ] &&
        [ "$what" != servebench ]; then
        step linker linker.log env FLUXOND="$FLUXOND" \
          PYTHONPATH="$SGLPATH" "$PY" "$PACK/tests/test_linker_real.py"
      fi
      ;;
    esac
    if [ "$what" = e2e ]; then
      step e2e e2e.log env FLUXOND="$FLUXOND" "$PY" "$PACK/tests/test_e2e_fluxond.py"
    fi
    case $what in all | bench | quick)
      bflag=""
      [ "$what" = quick ] && bflag="--quick --no-sweep"
      step bench bench.log "${BENCH[@]}" $bflag --csv "$OUTDIR/bench.csv"
      ;;
    esac
    if [ "$what" = replica ]; then
      step replica replica.log "$PY" "$PACK/bench/replica_bench.py" --fluxond "$FLUXOND" \
        --bench-transport "env LD_LIBRARY_PATH=$PACK/lib $PACK/bin/bench_transport" \
        --transport-peer "$PACK/bin/transport_peer" ${REPLICA_ARGS:-}
      cat "$OUTDIR/replica.log"
    fi
    if [ "$what" = firstput ]; then
      step firstput first_put.log "$PY" "$PACK/bench/first_put.py" --fluxond "$FLUXOND" \
        ${FIRSTPUT_ARGS:-}
      cat "$OUTDIR/first_put.log"
    fi
    if [ "$what" = transport ]; then
      step transport transport.log env LD_LIBRARY_PATH="$PACK/lib" "$PACK/bin/bench_transport" \
        --peer="$PACK/bin/transport_peer" ${TRANSPORT_ARGS:-}
      cat "$OUTDIR/transport.log"
    fi
    if [ "$what" = recovery ]; then
      STEP_TIMEOUT_S=${RECOVERY_TIMEOUT_S:-560} step recovery recovery.log "$PY" \
        "$PACK/bench/cluster_recovery_bench.py" --fluxond "$FLUXOND" ${RECOVERY_ARGS:-}
      cat "$OUTDIR/recovery.log"
    fi
    if [ "$what" = capacity ]; then
      n=0  # runs of one trace with other options get their own logs
      for run in ${CAPACITY_RUNS:-cyclic:614400 mix:565248}; do
        IFS=: read -r trace vlen extra <<<"$run"
        n=$((n + 1))
        targs=(--value-len "$vlen")
        [ "$trace" = multiturn ] || targs+=(--trace "$PACK/traces/$trace.trace")
        step "capacity-$n-$trace" "capacity-$n-$trace.log" env PYTHONPATH="$PACK/bench" "$PY" \
          "$PACK/bench/capacity_split.py" --fluxond "$FLUXOND" "${targs[@]}" ${CAPACITY_ARGS:-} \
          ${extra//,/ } --json "$OUTDIR/capacity-$n-$trace.json"
        echo "capacity run $n: $run ${CAPACITY_ARGS:-}"
        sed -n '/^| configuration/,$p' "$OUTDIR/capacity-$n-$trace.log"
      done
    fi
    if [ "$what" = bulk ]; then
      step bench-bulk bench-bulk.log "${BENCH[@]}" --quick --bulk --csv "$OUTDIR/bench-bulk.csv"
    fi
    echo
    [ -f "$OUTDIR/bench.log" ] && cat "$OUTDIR/bench.log"
    [ -f "$OUTDIR/bench-bulk.log" ] && cat "$OUTDIR/bench-bulk.log"
    [ -f "$OUTDIR/e2e.log" ] && sed -n '/^## fluxond end-to-end/,$p' "$OUTDIR/e2e.log"
    [ -f "$OUTDIR/e2e.log" ] && grep -E "Error|Traceback" "$OUTDIR/e2e.log" | head -10
    [ -f "$OUTDIR/sglang.log" ] && sed -n '/^## fluxon.sglang/,$p' "$OUTDIR/sglang.log"
    [ -f "$OUTDIR/sglang.log" ] && grep -E "Error|Traceback" "$OUTDIR/sglang.log" | head -10
    [ -f "$OUTDIR/linker.log" ] && sed -n '/^## fluxon.sglang_linker/,$p' "$OUTDIR/linker.log"
    [ -f "$OUTDIR/linker.log" ] && grep -E "Error|Traceback" "$OUTDIR/linker.log" | head -10
    [ -f "$OUTDIR/serve.log" ] && sed -n '/^## launched SGLang/,$p' "$OUTDIR/serve.log"
    [ -f "$OUTDIR/serve.log" ] && grep -E "Error|Traceback" "$OUTDIR/serve.log" | head -10
    [ -f "$OUTDIR/servebench.log" ] && sed -n '/^## Multi-turn serving/,$p' "$OUTDIR/servebench.log"
    [ -f "$OUTDIR/servebench.log" ] && grep -E "FAILED|Traceback" "$OUTDIR/servebench.log" | head -10
    [ -f "$OUTDIR/linkerbench.log" ] && sed -n '/^set-up and checks/p;/^## FluxonLinker/,$p' \
      "$OUTDIR/linkerbench.log"
    [ -f "$OUTDIR/linkerbench.log" ] && grep -E "Error|Traceback" -A3 "$OUTDIR/linkerbench.log" | tail -30
    for t in test test-bulk; do
      [ -f "$OUTDIR/$t.log" ] || continue
      sed -n '/^## GPU data-plane tests/,$p' "$OUTDIR/$t.log"
      grep -E "^FAIL|Error|Traceback" "$OUTDIR/$t.log" | head -10
    done
    for m in memcheck memcheck-bulk; do
      [ -f "$OUTDIR/$m.log" ] && grep -E "ERROR SUMMARY|verify:" "$OUTDIR/$m.log" | sed "s/^/$m: /"
    done
    cat "$OUTDIR/steps.txt"
    echo "gpu-run: $([ $rc = 0 ] && echo PASS || echo FAIL)"
    exit $rc
    ;;
  *)
    sed -n '2,24p' "$0"
    exit 2
    ;;
esac
