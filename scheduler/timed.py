"""Timed messages (heartbeats and user schedules) that fire once per time slot, however many schedulers run.

A slot is a fire time of the item's APScheduler trigger. The message enqueued for a slot has an id derived
from the item and the slot (:func:`shared.ids.derived_id`), so when two schedulers fire the same slot the
queue stores the first and reports the second as a duplicate. A job looks at the window since it last
looked (at start: ``catchup_seconds`` back) and fires only the latest slot in it: missed slots coalesce.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from apscheduler.triggers.base import BaseTrigger  # type: ignore[import-untyped]

from scheduler.config import latest_fire_time

log = logging.getLogger("agentpost.scheduler")


@dataclass(frozen=True)
class Fired:
    """What firing one slot did. ``duplicate``: another scheduler had already fired that slot."""

    job: str
    slot: datetime
    message_id: str
    duplicate: bool
    skipped: str = ""  # why the slot was deliberately not fired (outside active hours, agent busy)


class TimedJob:
    """One heartbeat or schedule: its trigger, and how to enqueue the message of one slot."""

    def __init__(
        self,
        name: str,
        trigger: BaseTrigger,
        fire: Callable[[datetime], Fired | None],
        *,
        start: datetime,
        catchup: timedelta,
    ) -> None:
        self.name = name
        self.trigger = trigger
        self._fire = fire
        self._cursor = start - catchup
        self._lock = threading.Lock()

    def run(self, now: datetime) -> Fired | None:
        """Fire the latest slot in ``(last look, now]`` if there is one; safe to call at any time."""
        with self._lock:
            slot = latest_fire_time(self.trigger, self._cursor, now)
            if slot is None:
                self._cursor = max(self._cursor, now)
                return None
            result = self._fire(slot)
            # Move on only after the enqueue committed: a failed enqueue is retried at the next look.
            self._cursor = max(self._cursor, now)
        if result is not None:
            if result.skipped:
                log.info("%s slot %s skipped: %s", self.name, slot.isoformat(), result.skipped)
            elif result.duplicate:
                log.info(
                    "%s slot %s already fired by another scheduler (%s)",
                    self.name,
                    slot.isoformat(),
                    result.message_id,
                )
            else:
                log.info("%s slot %s fired as %s", self.name, slot.isoformat(), result.message_id)
        return result
