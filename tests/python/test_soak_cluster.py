"""The cluster soak (bench/soak_cluster.py) in CI: a master and two owners as real processes
under put/get traffic while the master is killed and restarted, an owner is SIGSTOPped past its
lease + grace, and an owner is killed and restarted — every restored byte verified, every
acknowledged value still held found again from the other owner, temporary state back to zero."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FLUXOND

ROOT = Path(__file__).resolve().parents[2]
SOAK = ROOT / "bench" / "soak.py"
FLUXONCTL = os.environ.get("FLUXONCTL", str(Path(FLUXOND).parent / "fluxonctl"))


@pytest.mark.skipif(not SOAK.exists(),
                    reason="bench/ is not beside these tests (the installed-wheel run copies only "
                           "tests/python; the build-tree run covers the soak)")
def test_cluster_soak_with_master_restart_sigstop_and_kill():
    r = subprocess.run(
        [sys.executable, str(SOAK), "--cluster", "--fluxond", FLUXOND,
         "--fluxonctl", FLUXONCTL, "--duration", "40s", "--fault-interval", "9s", "--seed", "3"],
        capture_output=True, text=True, timeout=240)
    print(r.stdout[-4000:], r.stderr[-4000:])
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "PASS" in r.stdout
    assert "master-restart" in r.stdout and "owner-sigstop" in r.stdout and "owner-kill" in r.stdout
