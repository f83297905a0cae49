"""Who holds a claim: worker ids that let a process on the same host tell a dead holder from a live one.

A worker id is ``host:pid:start`` where ``start`` is the process's start time in clock ticks since boot
(``/proc/<pid>/stat`` field 22). Together they name one process life: a recycled pid has another start
time. A restarted processor on the same host can therefore see at once that its predecessor is gone and take
its claims back without waiting out the lease, and it can see that a holder whose lease lapsed during a
database stall is still alive (a stall is not a failure of the message). For a holder on another host, or an
id of another form, only the lease says anything.
"""

from __future__ import annotations

import os
import secrets
import socket
from enum import Enum
from functools import cache


class Holder(Enum):
    """What can be known about a claim's holder from this process."""

    ALIVE = "alive"
    GONE = "gone"
    UNKNOWN = "unknown"  # another host, or an id that is not ``host:pid:start``


@cache
def this_host() -> str:
    """The host name used in worker ids (``:`` replaced, so an id always splits into three parts)."""
    return socket.gethostname().replace(":", "_")


def process_start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot, or ``None`` when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its closing one.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 overall; fields[0] is field 3
    except (IndexError, ValueError):
        return None


def new_worker_id(pid: int | None = None) -> str:
    """``host:pid:start`` for this process (or ``pid``); a random suffix stands in where /proc is missing."""
    pid = os.getpid() if pid is None else pid
    start = process_start_ticks(pid)
    return f"{this_host()}:{pid}:{start if start is not None else 'r' + secrets.token_hex(3)}"


def holder_state(worker: str) -> Holder:
    """Whether the process named by ``worker`` still runs, as far as this host can tell."""
    parts = worker.split(":")
    if len(parts) != 3 or parts[0] != this_host() or not parts[1].isdigit() or not parts[2].isdigit():
        return Holder.UNKNOWN
    start = process_start_ticks(int(parts[1]))
    return Holder.ALIVE if start is not None and start == int(parts[2]) else Holder.GONE
