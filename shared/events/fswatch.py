"""A minimal Linux inotify watch on one folder, through libc (no dependency).

Used by :mod:`shared.events.wake`: a process blocked on it costs no CPU while idle and wakes as soon as another
process writes the SQLite write-ahead log. Where inotify is unavailable, :func:`open_watch` returns None
and the caller falls back to polling.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import select
import struct
from pathlib import Path

IN_MODIFY = 0x00000002
IN_CREATE = 0x00000100
IN_MOVED_TO = 0x00000080
IN_NONBLOCK = 0o4000
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")


class FolderWatch:
    """Modification events of files in one folder, filtered by file name."""

    def __init__(self, fd: int, names: frozenset[str]) -> None:
        self.fd = fd
        self.names = names

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True when one of the watched files changed meanwhile."""
        readable, _, _ = select.select([self.fd], [], [], timeout)
        if not readable:
            return False
        hit = False
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return hit
            offset = 0
            while offset + _EVENT.size <= len(data):
                _wd, _mask, _cookie, length = _EVENT.unpack_from(data, offset)
                raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
                offset += _EVENT.size + length
                if raw.rstrip(b"\0").decode(errors="replace") in self.names:
                    hit = True

    def close(self) -> None:
        os.close(self.fd)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    # find_library may run ldconfig: once per process is enough.
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name, use_errno=True) if name else None
    except OSError:
        return None


def open_watch(folder: Path, names: set[str]) -> FolderWatch | None:
    """Watch ``folder`` for writes to files named in ``names``; None where inotify is not available."""
    libc = _libc()
    if libc is None:
        return None
    try:
        fd = int(libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    wd = int(libc.inotify_add_watch(fd, os.fsencode(str(folder)), IN_MODIFY | IN_CREATE | IN_MOVED_TO))
    if wd < 0:
        os.close(fd)
        return None
    return FolderWatch(fd, frozenset(names))
