#!/usr/bin/env bash
# Sets up, builds and runs every test that needs no GPU:
#   1. installs the Debian/PyPI packages (scripts/install-deps.sh),
#   2. builds everything (CUDA kernels too when nvcc exists) and runs ctest,
#   3. checks every lock annotation in the tree with clang -Wthread-safety (syntax only),
#   4. builds the memory core under ThreadSanitizer (clang, which also checks the lock
#      annotations) and AddressSanitizer+UBSan and runs its unit and stress tests,
#   5. builds and installs the fluxon wheel in a venv and runs the Python tests against it; then
#      builds the auditwheel-repaired wheel (scripts/build-wheel.sh), installs it into a clean venv
#      and runs the Python tests that reach every part of the package against its
#      fluxond/fluxonctl, away from the build tree (the binaries are the same as the installed
#      wheel's; this checks how they are packaged: bundled libraries, TLS, etcd, libsystemd,
#      kernels, the SGLang integration).
#   6. starts a master and two owners, checks their /metrics pages with promtool and the Grafana
#      dashboard's metric names against them (scripts/check-metrics.sh).
#   7. verifies the systemd units (systemd/) with systemd-analyze (scripts/check-systemd-units.sh).
#      Before the build: every invariant ID cited in src/, include/ and tests/ is defined in
#      docs/invariants.md (scripts/check-invariants.sh).
#   8. builds the libFuzzer targets (fuzz/, clang, ASan+UBSan) and runs each for FUZZ_SECONDS
#      (default 15) from its seed corpus (scripts/run-fuzzers.sh); skipped with the sanitizers.
# Usage: scripts/test.sh [--skip-deps] [--skip-sanitizers]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
SKIP_DEPS=0
SKIP_SAN=0
for a in "$@"; do
  case $a in
    --skip-deps) SKIP_DEPS=1 ;;
    --skip-sanitizers) SKIP_SAN=1 ;;
    *) echo "unknown option $a" >&2; exit 2 ;;
  esac
done

[ $SKIP_DEPS = 1 ] || bash scripts/install-deps.sh

step() { echo; echo "=== $* ==="; }

step "invariant IDs cited in the code are defined (docs/invariants.md)"
bash scripts/check-invariants.sh

step "build (RelWithDebInfo)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLUXON_PYTHON=ON \
  -DPython_EXECUTABLE="$(command -v python3)" >/dev/null
cmake --build build -j "$JOBS"

step "ctest"
(cd build && ctest --output-on-failure -j "$JOBS")

step "lock annotations of the whole tree (clang -Wthread-safety, syntax only)"
bash scripts/check-thread-safety.sh build-tsa

step "python wheel (scikit-build-core) and pytest against the installed wheel"
# The wheel is built in the build directory above, with its type and options: its targets are
# up to date there, so scikit-build-core only packages them (a build directory of its own would
# compile the whole tree a second time).
WHEEL_SETTINGS="build-dir=build cmake.build-type=RelWithDebInfo cmake.define.FLUXON_BUILD_TESTS=ON
  cmake.define.FLUXON_BUILD_BENCH=ON"
python3 -m venv --system-site-packages build/venv
# shellcheck disable=SC2046
build/venv/bin/python -m pip install -q --no-deps --no-build-isolation --force-reinstall \
  $(printf -- '--config-settings=%s ' $WHEEL_SETTINGS) "$ROOT"
(cd tests/python && FLUXOND="$ROOT/build/src/fluxond" "$ROOT/build/venv/bin/python" -m pytest -q -p no:cacheprovider --durations=12)

step "repaired wheel (scripts/build-wheel.sh, python3) in a clean venv, pytest against its executables"
# Reuses the same build directory: only the packaging and auditwheel run again.
CONFIG_SETTINGS="$WHEEL_SETTINGS" DIST=build/dist bash scripts/build-wheel.sh python3
PYTAG=$(python3 -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
WV="$ROOT/build/venv-wheel"
rm -rf "$WV"
python3 -m venv "$WV"
"$WV/bin/python" -m pip install -q build/dist/fluxon-*-"$PYTAG"-"$PYTAG"-*.whl numpy pytest pytest-timeout pyyaml
"$WV/bin/python" -m pip install -q --no-deps sglang==0.5.23  # the pin of scripts/install-deps.sh
# Neither the build tree nor LD_LIBRARY_PATH: the installed package and its executables only.
WSITE=$("$WV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
for b in "$WSITE"/fluxon/_bin/* "$WSITE"/fluxon/*.so; do
  if env -u LD_LIBRARY_PATH ldd "$b" | grep "not found"; then echo "$b: unresolved" >&2; exit 1; fi
done
# Every part of the package: the client and its module, fluxonctl, the data plane between
# processes, TLS (security), the etcd client (with TLS), libsystemd, the CPU kernels, the SGLang
# backend and linker. The fault and soak suites run the same binaries in the step above.
PACKAGE_TESTS=(test_client.py test_fluxonctl.py test_cluster_remote_get.py test_security.py
  "test_cluster_failover.py::test_tls_to_etcd_with_the_nodes_certificates"
  test_systemd_notify.py test_kernels_cpu.py test_gpu_standins.py test_local_files.py
  test_sglang_backend.py test_sglang_linker.py test_hicache.py)
WTMP=$(mktemp -d)
cp -r tests/python "$WTMP/tests"
(cd "$WTMP/tests" && unset LD_LIBRARY_PATH PYTHONPATH &&
  export FLUXOND="$WV/bin/fluxond" FLUXONCTL="$WV/bin/fluxonctl" &&
  "$WV/bin/python" -c 'import fluxon, sys; assert fluxon.__file__.startswith(sys.prefix), fluxon.__file__' &&
  "$WV/bin/python" -m pytest -q -p no:cacheprovider --durations=5 "${PACKAGE_TESTS[@]}")
rm -rf "$WTMP"

step "/metrics of a loopback cluster (promtool) and the Grafana dashboard's metrics"
FLUXOND="$ROOT/build/src/fluxond" PYTHON="$ROOT/build/venv/bin/python" bash scripts/check-metrics.sh build

step "systemd units (systemd-analyze verify and security)"
bash scripts/check-systemd-units.sh build/src/fluxond

if [ $SKIP_SAN = 0 ]; then
  step "core under ThreadSanitizer (clang, -Wthread-safety)"
  CC=clang CXX=clang++ cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFLUXON_CORE_ONLY=ON -DFLUXON_SANITIZER=thread >/dev/null
  cmake --build build-tsan -j "$JOBS"
  (cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
    ctest --output-on-failure -j "$JOBS")

  step "core under AddressSanitizer + UBSan"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DFLUXON_CORE_ONLY=ON -DFLUXON_SANITIZER=address >/dev/null
  cmake --build build-asan -j "$JOBS"
  (cd build-asan && ASAN_OPTIONS="detect_leaks=1" ctest --output-on-failure -j "$JOBS")

  step "fuzzers (libFuzzer, ${FUZZ_SECONDS:-15}s each)"
  JOBS="$JOBS" bash scripts/run-fuzzers.sh "${FUZZ_SECONDS:-15}"
fi

echo
echo "all tests passed"
