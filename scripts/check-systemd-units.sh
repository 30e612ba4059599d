#!/usr/bin/env bash
# Checks every unit in systemd/ with `systemd-analyze verify` (and its hardening with
# `systemd-analyze security --offline`).
#
# verify fails a unit whose ExecStart= binary does not exist, and /usr/bin/fluxond exists only
# once Fluxon is installed. So it checks copies in a temporary directory whose /usr/bin/fluxond
# points at the built binary (everything else unchanged); the binary must therefore be built.
# Template units (name@.service) are verified through an instance (name@check.service), so that
# %i is expanded as systemd would. verify exits 0 on some warnings: any output line naming one of
# our units fails the check too. The fluxon user need not exist (verify does not resolve User=).
#
# security --offline scores the sandboxing of each unit (0 = locked down, 10 = none) without a
# running manager; a unit above MAX_EXPOSURE (default 5.0, "medium") fails.
#
# Usage: scripts/check-systemd-units.sh [FLUXOND]   (default build/src/fluxond)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
FLUXOND=$(realpath "${1:-build/src/fluxond}")
MAX_EXPOSURE=${MAX_EXPOSURE:-5.0}
command -v systemd-analyze >/dev/null || { echo "systemd-analyze not found (apt-get install systemd)" >&2; exit 1; }
[ -x "$FLUXOND" ] || { echo "$FLUXOND is not built" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
units=()
for u in "$ROOT"/systemd/*.service; do
  name=$(basename "$u")
  sed "s|/usr/bin/fluxond|$FLUXOND|g" "$u" > "$tmp/$name"
  if [[ $name == *@.service ]]; then
    instance=${name%@.service}@check.service
    ln -s "$name" "$tmp/$instance"
    units+=("$instance")
  else
    units+=("$name")
  fi
done
[ ${#units[@]} -gt 0 ] || { echo "no units in systemd/" >&2; exit 1; }

failed=0
for name in "${units[@]}"; do
  # The directory of the unit is searched for the template (and nothing else outside the system's
  # unit path is needed: the units depend only on network-online.target and each other).
  if ! out=$(cd "$tmp" && SYSTEMD_UNIT_PATH="$tmp:" systemd-analyze verify "$tmp/$name" 2>&1) ||
     grep -q "fluxond" <<<"$out"; then
    echo "FAILED verify $name"; echo "$out"; failed=1; continue
  fi
  # The overall exposure is the last line: "→ Overall exposure level for NAME: 2.1 OK :-)".
  sec=$(cd "$tmp" && SYSTEMD_UNIT_PATH="$tmp:" systemd-analyze security --offline=yes --no-pager \
        "$tmp/$name" 2>&1) || true
  level=$(grep -o 'Overall exposure level for [^:]*: [0-9.]*' <<<"$sec" | awk '{print $NF}')
  if [ -z "$level" ]; then
    echo "FAILED security $name"; echo "$sec"; failed=1; continue
  fi
  if awk -v l="$level" -v m="$MAX_EXPOSURE" 'BEGIN { exit !(l > m) }'; then
    echo "FAILED security $name: exposure $level > $MAX_EXPOSURE"; echo "$sec"; failed=1; continue
  fi
  echo "ok $name (exposure $level)"
done
exit $failed
