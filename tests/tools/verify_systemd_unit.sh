#!/usr/bin/env bash
# Checks configs/fluxond.service with `systemd-analyze verify`, with the unit's /usr/local/bin
# binaries pointed at the build tree (verify requires ExecStart binaries to exist).
# Usage: verify_systemd_unit.sh UNIT_FILE BIN_DIR
set -euo pipefail
unit=$1
bin_dir=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
sed "s|/usr/local/bin/|$bin_dir/|g" "$unit" > "$tmp/fluxond.service"
out=$(systemd-analyze verify "$tmp/fluxond.service" 2>&1) || { echo "$out"; exit 1; }
# verify exits 0 on some warnings; any line naming the unit is a problem.
if echo "$out" | grep -q "fluxond.service"; then echo "$out"; exit 1; fi
echo "fluxond.service verified"
