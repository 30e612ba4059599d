"""fluxond's allocator: where the build links mimalloc (FLUXON_MIMALLOC), symbol interposition
must make it the process's malloc, and the daemon's first log line says which shared object
serves malloc. A link order that let the C library's malloc win would leave the library loaded
and unused; this test fails then."""

import re
import subprocess

import pytest

from conftest import FLUXOND, embedded_config


def started_allocator(tmp, env=None):
    """The allocator fluxond's first log line names, from a daemon on ephemeral ports and a
    socket of its own (the default ports may be taken on a shared machine)."""
    cfg = tmp / "once.yaml"
    cfg.write_text(embedded_config(str(tmp / "owner.sock"), log_level="info"))
    r = subprocess.run([FLUXOND, "--config", str(cfg), "--once"], capture_output=True, text=True,
                       timeout=30, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    m = re.search(r"allocator=(\S+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    return m.group(1)


def linked_libraries():
    r = subprocess.run(["ldd", FLUXOND], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        pytest.skip(f"{FLUXOND} is not an ELF executable here (a wrapper script)")
    return r.stdout


def test_the_allocator_fluxond_links_is_the_one_that_serves_malloc(tmp_path):
    allocator = started_allocator(tmp_path)
    if "libmimalloc" in linked_libraries():
        assert allocator.startswith("libmimalloc"), allocator
    else:
        assert allocator.startswith("libc"), allocator
