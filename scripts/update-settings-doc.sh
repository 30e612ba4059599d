#!/usr/bin/env bash
# Regenerates the settings reference in docs/settings.md from the schema (src/config/settings.h):
# the block between the two markers is replaced by `fluxond --settings-reference`.
# Usage: scripts/update-settings-doc.sh [FLUXOND]   (default build/src/fluxond)
set -euo pipefail
cd "$(dirname "$0")/.."
FLUXOND=${1:-build/src/fluxond}
python3 - "$FLUXOND" <<'PY'
import subprocess, sys
ref = subprocess.run([sys.argv[1], "--settings-reference"], capture_output=True, text=True,
                     check=True).stdout
path = "docs/settings.md"
text = open(path).read()
begin = "edit src/config/settings.h, not this table -->\n"
end = "<!-- end of generated reference -->"
b, e = text.index(begin) + len(begin), text.index(end)
open(path, "w").write(text[:b] + ref + text[e:])
PY
