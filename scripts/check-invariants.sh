#!/usr/bin/env bash
# Every invariant ID cited in src/, include/ and tests/ (V1, G10, S2, T1, ... in comments, test
# comments and docstrings) must be defined in docs/invariants.md. Prints the undefined IDs with
# where they are cited and exits 1 when there are any.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - <<'PY'
import pathlib, re, sys

ID = re.compile(r"(?<![A-Za-z0-9_-])([VGASTPE][0-9]{1,2})(?![A-Za-z0-9_])")
# Names that look like IDs but are not: the S3-FIFO policy, ARC's T1/T2/B1/B2 lists.
NOT_IDS = re.compile(r"S3-FIFO|S3FIFO|ARC'?s? T[12]|\bT[12] \((seen|recency|frequency)")
defined = set(re.findall(r"^\| ([VGASTPE][0-9]{1,2}) \|", pathlib.Path("docs/invariants.md")
                         .read_text(), re.M))
cited = {}
for root in ("src", "include", "tests"):
    for p in pathlib.Path(root).rglob("*"):
        if p.suffix not in (".cc", ".h", ".py", ".cu", ".cuh") or not p.is_file():
            continue
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            line = NOT_IDS.sub("", line)
            for m in ID.finditer(line):
                cited.setdefault(m.group(1), []).append(f"{p}:{n}")
missing = sorted(set(cited) - defined)
for i in missing:
    print(f"{i} is cited but not defined in docs/invariants.md: {', '.join(cited[i][:5])}")
print(f"invariants: {len(cited)} IDs cited in src/, include/, tests/; {len(defined)} defined; "
      f"{len(missing)} undefined")
sys.exit(1 if missing else 0)
PY
