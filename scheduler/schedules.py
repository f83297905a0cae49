"""User schedules (``[[schedules]]``): a message to an agent or team on a cron expression or once at a time.

The message goes to channel ``schedule`` from sender ``System``; its id is derived from the schedule's
identity and the slot, so each slot fires once even with several schedulers running.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from scheduler.config import ScheduleConfig, SchedulerConfig, schedule_trigger, zone
from scheduler.timed import Fired, TimedJob
from shared.chat.address import ChatAddress
from shared.ids import derived_id
from shared.queue.core import Queue

CHANNEL = "schedule"
SENDER = "System"


def fire_schedule(queue: Queue, entry: ScheduleConfig, slot: datetime) -> Fired:
    """Enqueue ``entry``'s message for ``slot`` (a duplicate if that slot was fired already)."""
    slot_text = slot.isoformat()
    message_id = derived_id("schedule", entry.key, slot_text)
    result = queue.intake.enqueue_message(
        ChatAddress(CHANNEL, SENDER, sender_id="system", conversation=f"schedule:{entry.key}"),
        entry.message,
        message_id=message_id,
        agent=entry.agent,
        metadata={"kind": "schedule", "schedule": entry.key, "slot": slot_text},
    )
    return Fired(
        job=f"schedule:{entry.key}", slot=slot, message_id=result.message_id, duplicate=result.duplicate
    )


def schedule_jobs(
    queue: Queue, config: SchedulerConfig, entries: list[ScheduleConfig], *, start: datetime
) -> list[TimedJob]:
    """One :class:`TimedJob` per enabled schedule."""
    tz = zone(config.timezone)
    jobs = []
    for entry in entries:
        if not entry.enabled:
            continue

        def fire(slot: datetime, entry: ScheduleConfig = entry) -> Fired:
            return fire_schedule(queue, entry, slot)

        jobs.append(
            TimedJob(
                f"schedule:{entry.key}",
                schedule_trigger(entry, tz),
                fire,
                start=start,
                catchup=timedelta(seconds=config.catchup_seconds),
            )
        )
    return jobs
