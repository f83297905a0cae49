"""Files only the service user may read: the home folder, settings, the database with its WAL and SHM, the
dead-letter archive, logs and uploads hold chat content and secrets.

Every agentpost process sets the umask ``077`` at start (:func:`private_umask`), so what it creates is
``0700``/``0600`` whatever the shell's umask was; files made before that (or by hand) are tightened where
agentpost opens them (:func:`tighten`), and ``agentpost doctor`` names any that are still looser
(:func:`loose_modes`).
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

PRIVATE_UMASK = 0o077


def private_umask() -> None:
    """Make everything this process creates from now on private to its user."""
    os.umask(PRIVATE_UMASK)


PR_SET_DUMPABLE = 4


def not_dumpable() -> bool:
    """Make this process non-dumpable: another process of the same user (an agent's command, say) can then
    read neither its environment (``/proc/<pid>/environ``: channel tokens, app secrets) nor its memory, nor
    attach a debugger to it. Children get the flag back at ``exec``, so the agent CLIs are unaffected. Returns
    whether it took effect (False off Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) if needed and make it ``0700``."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    tighten([path])
    return path


def tighten(paths: Iterable[Path]) -> None:
    """Drop group and other permissions from the existing ones of ``paths`` that this user owns."""
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            continue
        if st.st_uid != os.geteuid() or not stat.S_IMODE(st.st_mode) & 0o077:
            continue
        try:
            path.chmod(stat.S_IMODE(st.st_mode) & 0o700)
        except OSError:
            continue


def sqlite_files(db_file: Path) -> list[Path]:
    """A SQLite database file with its WAL and shared-memory companions."""
    return [db_file, db_file.with_name(db_file.name + "-wal"), db_file.with_name(db_file.name + "-shm")]


def loose_modes(paths: Iterable[Path]) -> list[tuple[Path, int]]:
    """The existing paths group or others may read, write or enter, with their modes."""
    loose = []
    for path in paths:
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except OSError:
            continue
        if mode & 0o077:
            loose.append((path, mode))
    return loose
