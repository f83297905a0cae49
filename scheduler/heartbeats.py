"""Heartbeats: a periodic prompt to each configured agent, read from ``heartbeat.md`` in its workspace.

The message goes to channel ``heartbeat`` from sender ``System``; its id is derived from the agent and the
slot, so a slot fires once even with several schedulers running.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from pathlib import Path

from scheduler.config import HeartbeatConfig, SchedulerConfig, heartbeat_trigger, within_active_hours, zone
from scheduler.timed import Fired, TimedJob
from shared import safe_files
from shared.chat.address import ChatAddress
from shared.events.log import SqlEventLog
from shared.ids import derived_id
from shared.queue.core import Queue
from shared.queue.reports import open_message_count
from shared.settings.model import Settings

CHANNEL = "heartbeat"
SENDER = "System"
PROMPT_FILE = "heartbeat.md"
#: A heartbeat prompt larger than this is not read (the default one is sent).
PROMPT_LIMIT = 64 * 1024

log = logging.getLogger("agentpost.scheduler")


def heartbeat_prompt(settings: Settings, agent: str, default: str) -> str:
    """The agent's ``heartbeat.md`` (read at each slot, so edits apply without a restart), else ``default``.

    The workspace is the agent's: the file is read without following a link, from a regular file with one
    name, at most :data:`PROMPT_LIMIT` bytes (shared/safe_files.py). Anything else — a link to a host file,
    a FIFO, a hard link, a file too large — is not read, the default prompt is sent and a warning says why."""
    workspace: Path = settings.workspace(agent)
    try:
        text = safe_files.read_text_under(workspace, PROMPT_FILE, PROMPT_LIMIT).strip()
    except (FileNotFoundError, NotADirectoryError):
        return default
    except safe_files.Refused as exc:
        log.warning(
            "heartbeat of %s: %s not read (%s); the default heartbeat prompt is sent instead",
            agent,
            workspace / PROMPT_FILE,
            exc.reason,
        )
        return default
    except (OSError, UnicodeDecodeError):
        return default
    return text or default


def agent_is_busy(queue: Queue, agent: str) -> bool:
    """True while the agent runs or has messages waiting (its own heartbeats included)."""
    return open_message_count(queue.db, agent) > 0


def skip_reason(queue: Queue, beat: HeartbeatConfig, agent: str, slot: datetime) -> str:
    """Why this slot should not fire ("" to fire it)."""
    if not within_active_hours(beat.active_hours, slot.hour * 60 + slot.minute):
        return f"outside active hours {beat.active_hours}"
    if beat.skip_when_busy and agent_is_busy(queue, agent):
        return "the agent is busy"
    return ""


def fire_heartbeat(
    queue: Queue,
    settings: Settings,
    config: SchedulerConfig,
    agent: str,
    slot: datetime,
    beat: HeartbeatConfig | None = None,
) -> Fired:
    """Enqueue the heartbeat of ``agent`` for ``slot`` (a duplicate if that slot was fired already).

    With ``beat``, a slot outside its active hours or while the agent is busy is skipped (and logged as an
    event, so `agentpost trace`-style questions about a missing heartbeat have an answer)."""
    slot_text = slot.isoformat()
    message_id = derived_id("heartbeat", agent, slot_text)
    # A slot another scheduler fired already is a duplicate, whatever the agent is doing now.
    reason = (
        "" if beat is None or queue.admin.get_message(message_id) else skip_reason(queue, beat, agent, slot)
    )
    if reason:
        SqlEventLog(queue.db).append(
            "scheduler", "heartbeat_skipped", {"agent": agent, "slot": slot_text, "reason": reason}
        )
        return Fired(
            job=f"heartbeat:{agent}", slot=slot, message_id=message_id, duplicate=False, skipped=reason
        )
    result = queue.intake.enqueue_message(
        ChatAddress(CHANNEL, SENDER, sender_id="system", conversation=f"heartbeat:{agent}"),
        heartbeat_prompt(settings, agent, config.default_heartbeat_prompt),
        message_id=message_id,
        agent=agent,
        metadata={"kind": "heartbeat", "slot": slot_text},
    )
    return Fired(
        job=f"heartbeat:{agent}", slot=slot, message_id=result.message_id, duplicate=result.duplicate
    )


def heartbeat_jobs(
    queue: Queue,
    settings: Settings,
    config: SchedulerConfig,
    beats: dict[str, HeartbeatConfig],
    *,
    start: datetime,
) -> list[TimedJob]:
    """One :class:`TimedJob` per enabled heartbeat."""
    tz = zone(config.timezone)
    jobs = []
    for agent, beat in sorted(beats.items()):
        if not beat.enabled:
            continue

        def fire(slot: datetime, agent: str = agent, beat: HeartbeatConfig = beat) -> Fired:
            return fire_heartbeat(queue, settings, config, agent, slot, beat)

        jobs.append(
            TimedJob(
                f"heartbeat:{agent}",
                heartbeat_trigger(beat, tz),
                fire,
                start=start,
                catchup=timedelta(seconds=config.catchup_seconds),
            )
        )
    return jobs
