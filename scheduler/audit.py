"""`agentpost queue audit`: measure the throughput profile before anyone migrates (seed 004: measure first).

The profile comes from the event log (``message_received``, ``message_completed``, ``message_failed``,
``message_dead`` events, kept for ``events.ttl_hours``) and the current queue depth. The verdict compares
the measured peak with the SQLite capacity setting and says plainly whether to stay or move to PostgreSQL.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.clock import now_ms
from shared.queue import Queue

HOUR_MS = 3_600_000
#: Below this share of the capacity a deployment is comfortably within it; above it, plan the move.
HEADROOM = 0.5


@dataclass
class HourRow:
    hour: str
    received: int = 0
    completed: int = 0
    failed: int = 0
    dead: int = 0

    @property
    def per_second(self) -> float:
        return self.received / 3600


@dataclass
class Audit:
    """The measured profile and the verdict."""

    database: str
    window_hours: float
    covered_hours: float
    hours: list[HourRow] = field(default_factory=list)
    received: int = 0
    completed: int = 0
    failed: int = 0
    dead: int = 0
    peak_per_second: int = 0
    peak_second_at: str | None = None
    peak_minute_per_second: float = 0.0
    depth: dict[str, int] = field(default_factory=dict)
    oldest_pending_age_s: float | None = None
    capacity_per_second: float = 0.0
    verdict: str = ""
    move_to_postgresql: bool = False

    def as_dict(self) -> dict[str, Any]:
        data = dict(self.__dict__)
        data["hours"] = [dict(h.__dict__, per_second=round(h.per_second, 4)) for h in self.hours]
        return data


_COLUMN = {"message_received": "received", "message_failed": "failed", "message_dead": "dead"}


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def run_audit(queue: Queue, *, hours: float, capacity_per_second: float, now: int | None = None) -> Audit:
    """Measure the last ``hours`` of traffic and judge it against ``capacity_per_second``."""
    now = now_ms() if now is None else now
    since = now - int(hours * HOUR_MS)
    db = queue.db
    audit = Audit(
        database=db.dialect.name,
        window_hours=hours,
        covered_hours=0.0,
        capacity_per_second=capacity_per_second,
    )
    by_hour: dict[int, HourRow] = {}

    def hour_row(hour: int) -> HourRow:
        return by_hour.setdefault(hour, HourRow(_iso(hour * HOUR_MS)[:13] + ":00"))

    for r in db.read(
        f"SELECT created_at / {HOUR_MS} AS h, type, COUNT(*) AS n FROM events WHERE type IN (:t0, :t1, :t2) "
        f"AND created_at >= :since GROUP BY created_at / {HOUR_MS}, type",
        {"since": since, "t0": "message_received", "t1": "message_failed", "t2": "message_dead"},
    ):
        row = hour_row(int(r["h"]))
        setattr(row, _COLUMN[r["type"]], getattr(row, _COLUMN[r["type"]]) + int(r["n"]))
    # A completion is reported once per group (with the ids of every message in it), so count the ids.
    for r in db.read(
        "SELECT created_at, payload FROM events WHERE type IN ('response_ready', 'message_completed') "
        "AND created_at >= :since",
        {"since": since},
    ):
        try:
            ids = json.loads(r["payload"]).get("message_ids") or []
        except (ValueError, AttributeError):
            ids = []
        if ids:
            hour_row(int(r["created_at"]) // HOUR_MS).completed += len(ids)
    audit.hours = [by_hour[h] for h in sorted(by_hour)]
    for col in (*_COLUMN.values(), "completed"):
        setattr(audit, col, sum(getattr(h, col) for h in audit.hours))
    peak = db.read(
        "SELECT created_at / 1000 AS s, COUNT(*) AS n FROM events WHERE type = 'message_received' "
        "AND created_at >= :since GROUP BY created_at / 1000 ORDER BY COUNT(*) DESC, created_at / 1000 LIMIT 1",
        {"since": since},
    )
    if peak:
        audit.peak_per_second = int(peak[0]["n"])
        audit.peak_second_at = _iso(int(peak[0]["s"]) * 1000)
    minute = db.read_scalar(
        "SELECT MAX(n) FROM (SELECT COUNT(*) AS n FROM events WHERE type = 'message_received' "
        "AND created_at >= :since GROUP BY created_at / 60000) AS per_minute",
        {"since": since},
    )
    audit.peak_minute_per_second = round(int(minute or 0) / 60, 3)
    oldest_event = db.read_scalar("SELECT MIN(created_at) FROM events")
    if oldest_event is not None:
        audit.covered_hours = round(min(hours, (now - max(int(oldest_event), since)) / HOUR_MS), 2)
    audit.depth = queue.queue_status()
    oldest_pending = db.read_scalar("SELECT MIN(created_at) FROM messages WHERE status = 'pending'")
    if oldest_pending is not None:
        audit.oldest_pending_age_s = round((now - int(oldest_pending)) / 1000, 1)
    _judge(audit)
    return audit


def _judge(audit: Audit) -> None:
    sustained = audit.peak_minute_per_second
    share = sustained / audit.capacity_per_second
    failures = audit.failed + audit.dead
    fail_note = (
        f" {failures} failure(s) in the window ({audit.dead} dead letter(s)): failures are agent or provider "
        "errors, which a bigger database does not fix."
        if failures
        else ""
    )
    if audit.database != "sqlite":
        audit.verdict = (
            f"This deployment already runs on {audit.database}; the peak sustained rate was "
            f"{sustained:.2f} msg/s.{fail_note}"
        )
        return
    limits = (
        f"peak sustained {sustained:.2f} msg/s (busiest minute), busiest second {audit.peak_per_second} msg, "
        f"against a SQLite capacity of {audit.capacity_per_second:g} msg/s"
    )
    if share < HEADROOM:
        audit.verdict = (
            f"Within capacity: {limits} ({share:.1%} of it). Stay on SQLite; move to PostgreSQL only to run "
            f"processors on several machines.{fail_note}"
        )
    elif share < 1:
        audit.move_to_postgresql = True
        audit.verdict = (
            f"Approaching capacity: {limits} ({share:.0%} of it). Plan the move to PostgreSQL "
            f"(agentpost migrate --to postgresql://...).{fail_note}"
        )
    else:
        audit.move_to_postgresql = True
        audit.verdict = (
            f"Beyond capacity: {limits} ({share:.0%} of it). Move to PostgreSQL "
            f"(stop the processes, then agentpost migrate --to postgresql://...).{fail_note}"
        )
    if audit.covered_hours < audit.window_hours * 0.5:
        audit.verdict += (
            f" Note: the event log covers only {audit.covered_hours:g} h of the {audit.window_hours:g} h asked "
            "for (events.ttl_hours), so a longer history was not measured."
        )
