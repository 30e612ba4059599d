#!/usr/bin/env bash
# Checks every lock annotation (ABSL_GUARDED_BY, ABSL_EXCLUSIVE_LOCKS_REQUIRED, ...) in the whole
# tree — daemon, client, tools, tests, benchmarks, Python binding — with clang's
# -Wthread-safety, as errors. Syntax-only: nothing is linked, so it is quick and needs no GPU.
# (The sanitizer builds compile only the core with clang; this covers the rest.)
# Usage: scripts/check-thread-safety.sh [BUILD_DIR]   (default build-tsa)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-build-tsa}
JOBS=${JOBS:-$(nproc)}
CC=clang CXX=clang++ cmake -S . -B "$DIR" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DFLUXON_CUDA=OFF \
  -DFLUXON_PYTHON=ON -DPython_EXECUTABLE="$(command -v python3)" \
  -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
# Generated headers (protobuf, gRPC, version) must exist before anything includes them.
cmake --build "$DIR" -j "$JOBS" --target fluxon_proto_grpc fluxon_proto_etcd >/dev/null
python3 - "$DIR" "$JOBS" <<'PY'
import json, os, re, shlex, subprocess, sys
from concurrent.futures import ThreadPoolExecutor

build, jobs = sys.argv[1], int(sys.argv[2])
root = os.getcwd()
entries = json.load(open(os.path.join(build, "compile_commands.json")))
mine = [e for e in entries
        if e["file"].startswith(root) and "/proto/" not in e["file"]
        and os.path.splitext(e["file"])[1] in (".cc", ".cpp")
        and f"/{build}/" not in e["file"]]

def check(e):
    args = shlex.split(e["command"])
    out = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a == "-o":
            skip = True
            continue
        if a == "-c":
            continue
        out.append(a)
    out += ["-fsyntax-only", "-Wthread-safety", "-Werror=thread-safety"]
    r = subprocess.run(out, cwd=e["directory"], capture_output=True, text=True)
    return e["file"], r.returncode, r.stderr

failed = 0
with ThreadPoolExecutor(jobs) as pool:
    for f, rc, err in pool.map(check, mine):
        if rc != 0:
            failed += 1
            print(f"FAILED {os.path.relpath(f, root)}\n{err}", file=sys.stderr)
print(f"thread-safety analysis: {len(mine) - failed} files clean, {failed} failed")
sys.exit(1 if failed else 0)
PY
