"""Files and directories fluxond creates are never another local user's to read or change.

A segment path planted by another user (any mode), a symlink there, a hard-linked or loose-mode
file of our own, or a socket directory another user controls stops the start with an error that
names the setting; nothing is opened, truncated or served. A private file of our own (a previous
run's) is reused and serves the right bytes.
"""

import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest

import fluxon
import kv_pages
from conftest import FLUXOND, Daemon

VALUE_LEN = 64 * 1024
OTHER_UID = 65534  # nobody


def config(sock: str, segment_path: str = "") -> str:
    seg = f"{{size: 1GiB, path: {segment_path}}}" if segment_path else "{size: 1GiB}"
    return f"""
role: embedded
log_level: info
master: {{listen_address: "127.0.0.1:0"}}
admin: {{listen_address: "127.0.0.1:0", metrics_port: 0}}
owner:
  socket_path: {sock}
  segment: {seg}
"""


def start_fails(tmp: Path, text: str) -> str:
    """Runs fluxond on `text`; it must exit non-zero within 20 s. Returns its output."""
    cfg = tmp / "refused.yaml"
    cfg.write_text(text)
    r = subprocess.run([FLUXOND, "--config", str(cfg)], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode != 0, r.stdout + r.stderr
    return r.stdout + r.stderr


@pytest.fixture
def sockdir():
    d = Path(tempfile.mkdtemp(prefix="fxf", dir="/tmp"))
    yield d


def need_root():
    if os.geteuid() != 0:
        pytest.skip("making a file of another uid needs root")


def test_segment_file_of_another_user_is_refused(tmp, sockdir):
    need_root()
    seg = sockdir / "segment"
    seg.write_bytes(b"attacker" * 512)
    os.chown(seg, OTHER_UID, OTHER_UID)
    os.chmod(seg, 0o666)
    out = start_fails(tmp, config(str(sockdir / "o.sock"), str(seg)))
    assert "owner.segment.path" in out and "not a private file" in out, out
    # Neither used nor truncated.
    assert seg.read_bytes() == b"attacker" * 512
    assert not (sockdir / "o.sock").exists()


def test_segment_path_symlink_is_never_followed(tmp, sockdir):
    victim = tmp / "victim"
    victim.write_bytes(b"v" * 8192)
    os.chmod(victim, 0o600)
    seg = sockdir / "segment"
    seg.symlink_to(victim)
    out = start_fails(tmp, config(str(sockdir / "o.sock"), str(seg)))
    assert "owner.segment.path" in out and "symbolic link" in out, out
    assert victim.read_bytes() == b"v" * 8192  # not truncated to the segment's size


@pytest.mark.parametrize("shape", ["loose_mode", "two_links", "directory"])
def test_segment_path_that_is_not_a_private_file_is_refused(tmp, sockdir, shape):
    seg = sockdir / "segment"
    if shape == "directory":
        seg.mkdir()
    else:
        seg.write_bytes(b"x" * 4096)
        os.chmod(seg, 0o644 if shape == "loose_mode" else 0o600)
        if shape == "two_links":
            os.link(seg, sockdir / "another-name")
    out = start_fails(tmp, config(str(sockdir / "o.sock"), str(seg)))
    assert "owner.segment.path" in out, out
    if shape != "directory":
        assert seg.read_bytes() == b"x" * 4096


def test_a_private_segment_file_of_our_own_is_reused_and_serves_the_right_bytes(tmp, sockdir):
    seg = sockdir / "segment"
    seg.write_bytes(b"left over from an earlier run" * 100)
    os.chmod(seg, 0o600)
    sock = str(sockdir / "o.sock")
    d = Daemon(config(sock, str(seg)), tmp)
    try:
        c = fluxon.KvClient(socket_path=sock)
        keys = [f"k{i}" for i in range(8)]
        kv_pages.put_pages(c, keys, seed=17, value_len=VALUE_LEN)
        got = kv_pages.read_hit(c, keys, VALUE_LEN)
        for i in range(len(keys)):
            assert (got[i] == (17 + i) % 251).all()
        st = os.stat(seg)
        assert st.st_mode & 0o777 == 0o600 and st.st_uid == os.geteuid()
    finally:
        assert d.stop() == 0


def test_a_new_segment_file_is_private(tmp, sockdir):
    seg = sockdir / "fresh-segment"
    sock = str(sockdir / "o.sock")
    old = os.umask(0)  # a permissive umask must not widen the file
    try:
        d = Daemon(config(sock, str(seg)), tmp)
    finally:
        os.umask(old)
    try:
        st = os.stat(seg)
        assert st.st_mode & 0o777 == 0o600 and st.st_nlink == 1
    finally:
        d.stop()


def test_socket_directory_another_user_can_change_is_refused(tmp, sockdir):
    open_dir = sockdir / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)  # writable by everyone, not sticky
    out = start_fails(tmp, config(str(open_dir / "o.sock")))
    assert "owner.socket_path" in out and "not safe" in out, out
    assert not (open_dir / "o.sock").exists()


def test_socket_directory_of_another_user_is_refused(tmp, sockdir):
    need_root()
    theirs = sockdir / "theirs"
    theirs.mkdir()
    os.chown(theirs, OTHER_UID, OTHER_UID)
    out = start_fails(tmp, config(str(theirs / "o.sock")))
    assert "owner.socket_path" in out and "not safe" in out, out


def test_a_sticky_shared_directory_is_accepted(tmp, sockdir):
    sticky = sockdir / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    sock = str(sticky / "o.sock")
    d = Daemon(config(sock), tmp)
    try:
        c = fluxon.KvClient(socket_path=sock)
        kv_pages.put_pages(c, ["s"], seed=3, value_len=VALUE_LEN)
        assert (kv_pages.read_hit(c, ["s"], VALUE_LEN)[0] == 3).all()
    finally:
        assert d.stop() == 0
