"""Read-only statistics over the queue and the event log: how busy an agent is, what traffic the event log
recorded (for ``agentpost queue audit``), whether any processor runs (for ``agentpost send --wait``).

Nothing here writes or takes a write lock; every function is one or a few plain reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from shared.clock import now_ms
from shared.queue import presence
from shared.storage.db import Database
from shared.storage.queries import reports as q
from shared.worker_identity import Holder, holder_state

#: An hour in epoch ms, the unit of the hourly counts.
HOUR_MS = q.HOUR_MS
#: How many of the newest processor start and stop events are read to find the processors that run now
#: (two per processor life: enough for many restarts in a row).
PROCESSOR_EVENTS_READ = 1000


@dataclass(frozen=True)
class HourCount:
    """How many events of one type the event log holds for one hour (``hour``: epoch ms // ``HOUR_MS``)."""

    hour: int
    type: str
    count: int


def open_message_count(db: Database, agent: str) -> int:
    """Messages of ``agent`` waiting or running (``pending`` or ``processing``): few rows, counted through
    the index of open messages."""
    return int(db.read_scalar(q.OPEN_OF_AGENT_COUNT, {"a": agent}) or 0)


def hourly_event_counts(db: Database, types: tuple[str, ...], since: int) -> list[HourCount]:
    """Events of each of ``types`` per hour, from ``since`` (epoch ms) on."""
    if not types:
        return []
    keys = {f"t{i}": t for i, t in enumerate(types)}
    rows = db.read(q.hourly_event_counts(len(keys)), {"since": since, **keys})
    return [HourCount(int(r["h"]), str(r["type"]), int(r["n"])) for r in rows]


def hourly_completed_messages(db: Database, since: int) -> dict[int, int]:
    """Messages completed per hour from ``since`` on (hour: epoch ms // ``HOUR_MS``).

    A completion is reported once per group, with the ids of every message in it, so the ids are counted."""
    per_hour: dict[int, int] = {}
    for r in db.read(q.COMPLETIONS_SINCE, {"since": since}):
        try:
            ids = json.loads(r["payload"]).get("message_ids") or []
        except (ValueError, AttributeError):
            ids = []
        if ids:
            hour = int(r["created_at"]) // HOUR_MS
            per_hour[hour] = per_hour.get(hour, 0) + len(ids)
    return per_hour


def busiest_second(db: Database, since: int) -> tuple[int, int] | None:
    """The second (epoch s) from ``since`` on with the most received messages and their count; the earliest
    of equals. ``None`` when nothing was received."""
    rows = db.read(q.BUSIEST_SECOND, {"since": since})
    return (int(rows[0]["s"]), int(rows[0]["n"])) if rows else None


def busiest_minute_count(db: Database, since: int) -> int:
    """Messages received in the busiest clock minute from ``since`` on (0 when none)."""
    value = db.read_scalar(q.BUSIEST_MINUTE_COUNT, {"since": since})
    return int(value or 0)


def oldest_event_at(db: Database) -> int | None:
    """When the oldest event still in the log was written (epoch ms); ``None`` for an empty log."""
    value = db.read_scalar(q.OLDEST_EVENT_AT)
    return None if value is None else int(value)


def oldest_pending_at(db: Database) -> int | None:
    """When the oldest pending message was queued (epoch ms); ``None`` when none waits."""
    value = db.read_scalar(q.OLDEST_PENDING_AT)
    return None if value is None else int(value)


def message_metadata(db: Database, message_id: str) -> str | None:
    """The stored metadata (JSON text) of one message, or None when there is no such message."""
    raw = db.read_scalar(q.MESSAGE_METADATA, {"m": message_id})
    return None if raw is None else str(raw)


def processor_running(db: Database, now: int | None = None) -> bool:
    """Whether some processor may be running: one whose presence row is there
    (:mod:`shared.queue.presence`: it lasts as long as the processor does), one whose ``processor_start``
    event has no ``processor_stop`` after it (a processor of an earlier release writes no row), or one
    holding an agent's unexpired lease, unless its process is known to be gone. Only the processor's own
    host can tell that (:mod:`shared.worker_identity`), so one on another host counts as running.
    """
    if presence.present(db, now):
        return True
    rows = db.read(q.PROCESSOR_EVENTS, {"topic": "processor", "n": PROCESSOR_EVENTS_READ})
    latest: dict[str, bool] = {}  # worker -> its newest event is a start
    for row in rows:
        try:
            payload = json.loads(str(row["payload"]))
        except ValueError:
            continue
        worker = str(payload.get("worker") or "") if isinstance(payload, dict) else ""
        if worker:
            latest.setdefault(worker, row["type"] == "processor_start")
    workers = {worker for worker, started in latest.items() if started}
    holders = db.read(q.LIVE_LEASE_HOLDERS, {"now": now_ms() if now is None else now})
    workers.update(str(row["holder"]) for row in holders)
    return any(holder_state(worker) is not Holder.GONE for worker in workers)
