"""Console entry points `fluxond` and `fluxonctl`: exec the executables bundled in the wheel.

os.execv replaces this Python process with the binary (same pid, same open descriptors), so
signals (SIGTERM, kill -9), the exit status and systemd's notify socket behave exactly as when the
binary is run directly.
"""

import os
import signal
import sys

_BIN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin")


def _exec(name: str) -> None:
    path = os.path.join(_BIN_DIR, name)
    if not os.access(path, os.X_OK):
        sys.stderr.write(f"{name}: the bundled executable {path} is missing\n")
        sys.exit(127)
    # Python ignores SIGPIPE and SIGXFSZ at startup, and an ignored signal stays ignored across
    # exec: give the binary the default dispositions it gets when started directly.
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [sys.argv[0], *sys.argv[1:]])


def fluxond() -> None:
    _exec("fluxond")


def fluxonctl() -> None:
    _exec("fluxonctl")
