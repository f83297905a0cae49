"""Tiny exec wrapper: make an agent CLI die with the processor, then become that CLI.

Usage: ``python -I -S launch.py PARENT_PID ARGV...``. It asks Linux to send SIGKILL to this process when
its parent (the processor) dies (``PR_SET_PDEATHSIG``, kept across ``execve`` for ordinary binaries),
checks the parent did not die before that took effect, and ``exec``s the CLI in place. Without it, a
``kill -9`` of the processor would leave the CLI running (it lives in its own session so that timeouts can
kill its whole process group) while a restarted processor runs the same agent again.

Only the standard library, no project imports: it runs with ``-S`` to start fast.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(args: list[str]) -> int:
    """Arm the parent-death signal and exec ``args[1:]``; exit 127 when that cannot be run."""
    if len(args) < 2:
        sys.stderr.write("usage: launch.py PARENT_PID ARGV...\n")
        return 2
    parent, argv = int(args[0]), args[1:]
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no prctl: the processor still kills the group on timeout and on clean shutdown
        if os.getppid() != parent:
            return 137  # the processor died before the signal was armed: do not start an orphan
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"cannot run {argv[0]}: {exc.strerror}\n")
        return 127
    return 0  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
