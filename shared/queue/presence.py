"""Which processors are up, for ``agentpost send --wait`` (:func:`shared.queue.reports.processor_running`).

A processor keeps one row in ``kv`` (scope ``processors``, key = its worker id ``host:pid:start``, value =
JSON of its pid and agents) for as long as it runs: written when it starts, its time refreshed every
:data:`REFRESH_MS`, removed when it stops. A row does not expire with the event log, as the
``processor_start`` event does (``events.ttl_hours``, 72 h by default), and it is in the database whichever
event driver is in use. A processor killed with ``kill -9`` leaves its row behind: on its own host the worker
id tells that its process is gone; from another host a row not refreshed for :data:`STALE_MS` counts as gone.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from shared.clock import now_ms
from shared.storage import kv
from shared.storage.db import Database
from shared.storage.kv import Scope
from shared.worker_identity import Holder, holder_state

#: How often a running processor refreshes its row (one small write a minute, whatever the load).
REFRESH_MS = 60_000
#: A row of another host not refreshed for this long is a processor that died there (three refreshes
#: missed: a database pause of a few seconds does not make a live processor look gone).
STALE_MS = 3 * REFRESH_MS
#: Rows left by processors that died are removed by the next processor to start, after this long.
FORGET_AFTER_MS = 24 * 3_600_000


def announce(db: Database, worker: str, pid: int, agents: Sequence[str]) -> None:
    """Record (or refresh) that ``worker`` runs; forget rows of processors long gone."""
    now = now_ms()
    value = json.dumps({"pid": pid, "agents": list(agents)}, separators=(",", ":"))
    with db.transaction() as tx:
        kv.put(tx, Scope.PROCESSORS, worker, value, now)
        kv.delete_older(tx, Scope.PROCESSORS, now - FORGET_AFTER_MS)


def withdraw(db: Database, worker: str) -> None:
    """``worker`` stops: its row goes."""
    with db.transaction() as tx:
        kv.delete(tx, Scope.PROCESSORS, worker)


def present(db: Database, now: int | None = None) -> list[str]:
    """The worker ids of the processors that run, as far as this host can tell (see the module docstring)."""
    now = now_ms() if now is None else now
    found = []
    for entry in kv.entries(db, Scope.PROCESSORS):
        state = holder_state(entry.key)
        if state is Holder.ALIVE or (state is Holder.UNKNOWN and now - entry.updated_at < STALE_MS):
            found.append(entry.key)
    return found
