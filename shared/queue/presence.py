"""Which processors are up, for ``agentpost send --wait`` (:func:`shared.queue.reports.processor_running`),
and which scheduler processes (for /metrics: their jobs stop when they are gone).

A processor keeps one row in ``kv`` (scope ``processors``, key = its worker id ``host:pid:start``, value =
JSON of its pid, agents and warm pool: which chats' CLIs it keeps and why recent ones were closed) for as long
as it runs: written when it starts, its time refreshed every
:data:`REFRESH_MS`, removed when it stops. A row does not expire with the event log, as the
``processor_start`` event does (``events.ttl_hours``, 72 h by default), and it is in the database whichever
event driver is in use. A processor killed with ``kill -9`` leaves its row behind: on its own host the worker
id tells that its process is gone; from another host a row not refreshed for :data:`STALE_MS` counts as gone.
A scheduler keeps a row the same way in scope ``schedulers`` (value: its pid).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

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


def announce(
    db: Database, worker: str, pid: int, agents: Sequence[str], warm: Mapping[str, object] | None = None
) -> None:
    """Record (or refresh) that ``worker`` runs, with what its warm pool keeps (``warm``:
    :meth:`workers.providers.claude_warm.WarmPool.snapshot`); forget rows of processors long gone."""
    now = now_ms()
    data: dict[str, object] = {"pid": pid, "agents": list(agents)}
    if warm is not None:
        data["warm"] = dict(warm)
    _write(db, Scope.PROCESSORS, worker, json.dumps(data, separators=(",", ":")), now)


def announce_scheduler(db: Database, worker: str, pid: int) -> None:
    """Record (or refresh) that the scheduler process ``worker`` runs; forget rows of schedulers long gone."""
    _write(db, Scope.SCHEDULERS, worker, json.dumps({"pid": pid}), now_ms())


def _write(db: Database, scope: Scope, worker: str, value: str, now: int) -> None:
    with db.transaction() as tx:
        kv.put(tx, scope, worker, value, now)
        kv.delete_older(tx, scope, now - FORGET_AFTER_MS)


#: The process kinds that keep a presence row, and the scope of their rows.
Kind = Literal["processor", "scheduler"]
_SCOPES: dict[Kind, Scope] = {"processor": Scope.PROCESSORS, "scheduler": Scope.SCHEDULERS}


def withdraw(db: Database, worker: str, kind: Kind = "processor") -> None:
    """``worker`` stops: its row goes."""
    with db.transaction() as tx:
        kv.delete(tx, _SCOPES[kind], worker)


def present(db: Database, now: int | None = None) -> list[str]:
    """The worker ids of the processors that run, as far as this host can tell (see the module docstring)."""
    now = now_ms() if now is None else now
    return [entry.key for entry in kv.entries(db, Scope.PROCESSORS) if _alive(entry, now)]


@dataclass(frozen=True)
class Beat:
    """One processor's presence row: its worker id, when it last refreshed the row, and whether it runs as
    far as this host can tell (see the module docstring)."""

    worker: str
    updated_at: int
    alive: bool


def beats(db: Database, now: int | None = None, kind: Kind = "processor") -> list[Beat]:
    """Every presence row of ``kind``, the processes that stopped cleanly excepted (their rows are gone)."""
    now = now_ms() if now is None else now
    return [Beat(e.key, e.updated_at, _alive(e, now)) for e in kv.entries(db, _SCOPES[kind])]


def _alive(entry: kv.Entry, now: int) -> bool:
    state = holder_state(entry.key)
    return state is Holder.ALIVE or (state is Holder.UNKNOWN and now - entry.updated_at < STALE_MS)


def warm_state(db: Database, agent: str, session_key: str, now: int | None = None) -> tuple[int, str | None]:
    """For ``/status``: how many CLIs the running processors keep in all, and for ``agent``'s chat
    (``session_key``: the chat's row key, or the agent's scope) ``"kept"``, why its process was closed, or
    None (nothing known: it never ran warm, or warm sessions are off)."""
    kept_in_all, state = 0, None
    for warm in _warm_pools(db, now):
        kept = [tuple(pair) for pair in warm.get("kept", [])]
        kept_in_all += len(kept)
        if (agent, session_key) in kept:
            state = "kept"
        elif state is None:
            state = next((str(c[2]) for c in warm.get("closed", []) if c[:2] == [agent, session_key]), None)
    return kept_in_all, state


def warm_summary(db: Database, now: int | None = None) -> tuple[int, str | None]:
    """For doctor: how many CLIs the running processors keep now, and the most recent reason one was
    closed or not kept (None: none known)."""
    kept_in_all, latest = 0, None
    for warm in _warm_pools(db, now):
        kept_in_all += len(warm.get("kept", []))
        if warm.get("closed"):
            latest = str(warm["closed"][-1][2])
    return kept_in_all, latest


def _warm_pools(db: Database, now: int | None) -> list[dict[str, Any]]:
    """The warm pool of each running processor, as its presence row says."""
    now = now_ms() if now is None else now
    pools = []
    for entry in kv.entries(db, Scope.PROCESSORS):
        if not _alive(entry, now):
            continue
        try:
            warm = json.loads(str(entry.value)).get("warm")
        except (ValueError, AttributeError):
            continue
        if isinstance(warm, dict):
            pools.append(warm)
    return pools
