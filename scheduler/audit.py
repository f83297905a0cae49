"""`agentpost queue audit`: measure the throughput profile before anyone migrates (measure before moving).

The profile comes from the event log (``message_received``, ``message_completed``, ``message_failed``,
``message_dead`` events, kept for ``events.ttl_hours``) and the current queue depth. The verdict compares
the measured peak with the SQLite capacity setting and says plainly whether to stay or move to PostgreSQL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from shared.clock import now_ms
from shared.queue.core import Queue
from shared.queue.reports import (
    HOUR_MS,
    busiest_minute_count,
    busiest_second,
    hourly_completed_messages,
    hourly_event_counts,
    oldest_event_at,
    oldest_pending_at,
)

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

    for count in hourly_event_counts(db, tuple(_COLUMN), since):
        row = hour_row(count.hour)
        setattr(row, _COLUMN[count.type], getattr(row, _COLUMN[count.type]) + count.count)
    for hour, completed in hourly_completed_messages(db, since).items():
        hour_row(hour).completed += completed
    audit.hours = [by_hour[h] for h in sorted(by_hour)]
    for col in (*_COLUMN.values(), "completed"):
        setattr(audit, col, sum(getattr(h, col) for h in audit.hours))
    peak = busiest_second(db, since)
    if peak is not None:
        audit.peak_per_second = peak[1]
        audit.peak_second_at = _iso(peak[0] * 1000)
    audit.peak_minute_per_second = round(busiest_minute_count(db, since) / 60, 3)
    oldest_event = oldest_event_at(db)
    if oldest_event is not None:
        audit.covered_hours = round(min(hours, (now - max(oldest_event, since)) / HOUR_MS), 2)
    audit.depth = queue.admin.queue_status()
    oldest_pending = oldest_pending_at(db)
    if oldest_pending is not None:
        audit.oldest_pending_age_s = round((now - oldest_pending) / 1000, 1)
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
