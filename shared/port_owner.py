"""Who is listening on a TCP port, read from ``/proc`` (Linux), so a message about a taken port can name the
process to stop instead of only saying ``[Errno 98]``.

``/proc/net/tcp`` and ``/proc/net/tcp6`` list every socket with its state, owner uid and inode; the process
holding the socket is the one with ``socket:[inode]`` among its ``/proc/<pid>/fd`` links. Another user's
process hides its descriptors, so then only the owning user can be named. Elsewhere than Linux nothing is
found and the callers say only that the port is taken.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path

_LISTEN = "0A"
_PROC = Path("/proc")


@dataclass(frozen=True)
class Listener:
    """A process listening on the port; ``pid`` is None when its descriptors cannot be read."""

    pid: int | None
    uid: int
    command: str

    def describe(self) -> str:
        """``pid 123 (python3 -m http.server 3777)``, or the owning user when the pid is hidden."""
        if self.pid is not None:
            return f"pid {self.pid} ({self.command})" if self.command else f"pid {self.pid}"
        try:
            user = pwd.getpwuid(self.uid).pw_name
        except KeyError:
            user = str(self.uid)
        return f"a process of user {user}"


def _listening_inodes(port: int) -> dict[int, int]:
    """inode -> uid of every socket in LISTEN state on ``port`` (any address, IPv4 or IPv6)."""
    found: dict[int, int] = {}
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] != "0":
                found[int(fields[9])] = int(fields[7])
    return found


def _command(pid: int, limit: int = 200) -> str:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    # One line whatever the arguments hold (a `python -c` script spans several).
    text = " ".join(raw.replace(b"\0", b" ").decode(errors="replace").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def listeners(port: int) -> list[Listener]:
    """Every process listening on ``port``, lowest pid first (several when a listener forked)."""
    inodes = _listening_inodes(port)
    if not inodes:
        return []
    targets = {f"socket:[{inode}]": inode for inode in inodes}
    seen: dict[int, int] = {}  # pid -> inode
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(entry / "fd")
        except OSError:
            continue  # another user's process, or one that just ended
        for fd in fds:
            try:
                link = os.readlink(entry / "fd" / fd)
            except OSError:
                continue
            if link in targets:
                seen[int(entry.name)] = targets[link]
                break
    out = [Listener(pid, inodes[inode], _command(pid)) for pid, inode in sorted(seen.items())]
    hidden = set(inodes) - set(seen.values())
    out += [Listener(None, inodes[inode], "") for inode in sorted(hidden)]
    return out


def describe_holder(port: int) -> str:
    """Who holds ``port`` in a few words: ``pid 123 (cmd)``, ``a process of user bob``, or
    ``another program`` when /proc says nothing (not Linux, or it has just let go)."""
    found = listeners(port)
    return found[0].describe() if found else "another program"
