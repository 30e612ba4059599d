#!/usr/bin/env bash
# Installs every Debian and PyPI package that building and testing Fluxon needs.
# Idempotent: packages already present are left alone. Run as root (or with sudo).
set -euo pipefail

DEBIAN_PACKAGES=(
  build-essential cmake ninja-build pkg-config git clang clang-format libclang-rt-14-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libboost1.81-dev libabsl-dev libspdlog-dev libfmt-dev libyaml-cpp-dev
  libibverbs-dev rdma-core libnuma-dev
  libgtest-dev libgmock-dev libbenchmark-dev pybind11-dev nlohmann-json3-dev libcli11-dev
  curl procps
  prometheus  # only its promtool: scripts/check-metrics.sh checks the /metrics format with it
  prometheus-cpp-dev  # fluxond's /metrics: text exposition and HTTP server (Registry, Exposer)
  libsystemd-dev  # fluxond speaks the systemd notify protocol (sd_notify, the watchdog)
  libsodium-dev  # the master names a route by a keyed SipHash-128 of its key (src/route/route_key.h)
  libmimalloc-dev  # fluxond's allocator (FLUXON_MIMALLOC): the request path allocates per key
  libssl-dev  # libcrypto: the data plane's HMAC-SHA256 handshake, PEM checks of the TLS files
  openssl  # only its CLI: the TLS tests make a throw-away CA and certificates with it
  systemd  # only its systemd-analyze: scripts/check-systemd-units.sh verifies systemd/*.service
  faketime  # its libfaketime: a cluster test restarts an owner with its wall clock stepped back
  etcd-server  # the masters' election (src/ha/) is tested against a real etcd (tests/ha/)
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[install-deps] apt-get install ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
# prometheus_client: its parser validates fluxond's /metrics page in the tests.
# pytest-timeout: every Python test has a time limit (tests/python/pytest.ini), so a hang fails
# with a traceback instead of running into CI's limit.
PY_PACKAGES=(pytest pytest-timeout pybind11 scikit-build-core numpy pyyaml prometheus_client)
if ! "$PYTHON" -c "import pytest, pytest_timeout, pybind11, scikit_build_core, numpy, yaml, prometheus_client" \
    2>/dev/null; then
  echo "[install-deps] pip install ${PY_PACKAGES[*]}"
  "$PYTHON" -m pip install -q "${PY_PACKAGES[@]}"
fi
# SGLang's HiCache interface, pinned for the fluxon.sglang tests. --no-deps: the tests read its
# source; importing it needs torch, whose PyPI build pulls several GB of CUDA libraries.
SGLANG_VERSION=0.5.23
if ! "$PYTHON" -c "from importlib.metadata import version as v; assert v('sglang') == '$SGLANG_VERSION'" 2>/dev/null; then
  echo "[install-deps] pip install --no-deps sglang==$SGLANG_VERSION"
  "$PYTHON" -m pip install -q --no-deps "sglang==$SGLANG_VERSION"
fi
echo "[install-deps] done"
