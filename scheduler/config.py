"""The settings sections the scheduler owns: ``[scheduler]``, ``[heartbeats.<agent>]`` and ``[[schedules]]``,
and the triggers they become.

Their models are in :mod:`shared.settings.sections`: every command validates these sections (including
that each heartbeat and schedule names a configured agent) when it loads the settings, so ``agentpost
doctor`` refuses what the scheduler would. Every interval and age the scheduler uses is one of these
settings.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from apscheduler.triggers.base import BaseTrigger  # type: ignore[import-untyped]
from apscheduler.triggers.cron import CronTrigger  # type: ignore[import-untyped]
from apscheduler.triggers.date import DateTrigger  # type: ignore[import-untyped]
from apscheduler.triggers.interval import IntervalTrigger  # type: ignore[import-untyped]

from shared.settings.model import Settings
from shared.settings.sections import (
    DEFAULT_HEARTBEAT_PROMPT,
    DlqConfig,
    HeartbeatConfig,
    Heartbeats,
    ScheduleConfig,
    SchedulerConfig,
    Schedules,
    parse_active_hours,
    zone,
)

__all__ = [
    "DEFAULT_HEARTBEAT_PROMPT",
    "EPOCH",
    "DlqConfig",
    "HeartbeatConfig",
    "Heartbeats",
    "ScheduleConfig",
    "SchedulerConfig",
    "Schedules",
    "heartbeat_trigger",
    "latest_fire_time",
    "load_heartbeats",
    "load_scheduler_config",
    "load_schedules",
    "parse_active_hours",
    "schedule_trigger",
    "within_active_hours",
    "zone",
]

#: Interval heartbeats count their slots from this instant, so every scheduler process computes the same
#: slot times (and therefore the same message ids) no matter when it started.
EPOCH = datetime(1970, 1, 1, tzinfo=ZoneInfo("UTC"))


def within_active_hours(value: str, minute_of_day: int) -> bool:
    """Whether a minute of the day falls in the window (a window may wrap past midnight)."""
    if not value:
        return True
    start, end = parse_active_hours(value)
    if start < end:
        return start <= minute_of_day < end
    return minute_of_day >= start or minute_of_day < end


def load_scheduler_config(settings: Settings) -> SchedulerConfig:
    """``[scheduler]``, validated when the settings were loaded."""
    return settings.scheduler


def load_heartbeats(settings: Settings) -> dict[str, HeartbeatConfig]:
    """The heartbeats, each for a configured agent (checked when the settings were loaded)."""
    return settings.heartbeats


def load_schedules(settings: Settings) -> list[ScheduleConfig]:
    """The user schedules, each for a configured agent or team, names unique (checked at load)."""
    return settings.schedules


def heartbeat_trigger(beat: HeartbeatConfig, tz: ZoneInfo) -> BaseTrigger:
    """The APScheduler trigger of a heartbeat; interval slots are aligned to the epoch."""
    if beat.cron is not None:
        return CronTrigger.from_crontab(beat.cron, timezone=tz)
    assert beat.interval is not None
    return IntervalTrigger(seconds=beat.interval, start_date=EPOCH, timezone=tz)


def schedule_trigger(entry: ScheduleConfig, tz: ZoneInfo) -> BaseTrigger:
    """The APScheduler trigger of a user schedule; a naive ``at`` is read in the scheduler's time zone."""
    if entry.cron is not None:
        return CronTrigger.from_crontab(entry.cron, timezone=tz)
    assert entry.at is not None
    at = entry.at if entry.at.tzinfo is not None else entry.at.replace(tzinfo=tz)
    return DateTrigger(run_date=at, timezone=tz)


def latest_fire_time(
    trigger: BaseTrigger, after: datetime, until: datetime, *, limit: int = 100_000
) -> datetime | None:
    """The latest time ``trigger`` fires in ``(after, until]``, or None (missed slots are coalesced)."""
    current = trigger.get_next_fire_time(None, after + timedelta(microseconds=1))
    found: datetime | None = None
    for _ in range(limit):
        if current is None or current > until:
            break
        if current > after:
            found = current
        nxt = trigger.get_next_fire_time(current, current)
        if nxt is None or nxt <= current:
            break
        current = nxt
    return found
