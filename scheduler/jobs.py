"""Maintenance jobs. Each is a plain function over the runtime, callable directly (tests, `run-once`) and
safe when two schedulers run it at once: every one is a single idempotent transaction or a sequence of them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from scheduler.config import SchedulerConfig
from shared.chat import previews
from shared.clock import now_ms
from shared.events.log import SqlEventLog
from shared.queue import approvals, retention, unserved
from shared.queue.core import Queue
from shared.settings.model import Settings
from shared.storage.db import Database

log = logging.getLogger("agentpost.scheduler")


@dataclass(frozen=True)
class UnservedResult:
    """Responses acknowledged because no adapter serves their channel."""

    acked: int
    response_ids: list[int]


def recover_expired_leases(queue: Queue) -> dict[str, int]:
    """Return messages whose worker's lease expired to ``pending`` (or ``dead`` at the retry limit)."""
    outcome = queue.failures.recover_stale_messages()
    if outcome.retried or outcome.dead:
        log.info(
            "recovered %d message(s) with expired leases, %d became dead letters",
            len(outcome.retried),
            len(outcome.dead),
        )
    return {"retried": len(outcome.retried), "dead": len(outcome.dead)}


def end_overdue_approvals(queue: Queue) -> int:
    """Close the approval requests a processor that is gone left waiting past their time (the chat is told
    no answer came in time and the tool did not run)."""
    ended = approvals.end_overdue(queue.db, queue.responses)
    if ended:
        log.info("ended %d approval request(s) left waiting past their time", ended)
    return ended


def prune_finished(db: Database, settings: Settings) -> dict[str, int]:
    """Delete the finished history older than ``[retention]`` says, kind by kind, in small batches:
    completed messages, delivered replies, team chat-room posts, agents' turns and run costs."""
    result = retention.prune_history(db, retention.RetentionPolicy.from_settings(settings))
    if any(result.values()):
        log.info("pruned old history: %s", ", ".join(f"{n} {kind}" for kind, n in result.items() if n))
    return result


def prune_previews(db: Database) -> int:
    """Remove the live-preview texts no run will finish: those of runs whose messages are no longer
    processing (a crashed run whose messages were dead-lettered, completed by an operator or taken back)
    and those not written for a day; a chat showing such a preview gets it closed as interrupted by its
    adapter. Returns how many texts were removed."""
    removed = previews.prune_partials(db)
    if removed:
        log.info("removed %d live-preview text(s) of runs that are gone", removed)
    return removed


def ack_unserved_responses(
    db: Database, config: SchedulerConfig, *, now: int | None = None
) -> UnservedResult:
    """Acknowledge replies waiting on channels no adapter serves (heartbeat, schedule) once they are older
    than ``unserved_response_age_seconds``, recording each reply's text in the event log; pruning then
    removes them like any acked response. A reply another process is delivering right now is left alone."""
    channels = list(config.unserved_channels)
    if not channels:
        return UnservedResult(0, [])
    now = now_ms() if now is None else now
    cut = now - int(config.unserved_response_age_seconds * 1000)
    ids = unserved.ack_unserved_responses(db, channels, created_before=cut, now=now)
    if ids:
        log.info("acknowledged %d reply(ies) on unserved channels %s", len(ids), ", ".join(channels))
    return UnservedResult(len(ids), ids)


def clean_events(events: SqlEventLog, settings: Settings) -> int:
    """Drop events past their retention or past the per-topic cap (once every durable consumer acked
    them), in small batches."""
    policy = retention.RetentionPolicy.from_settings(settings)
    removed = events.cleanup(
        ttl_ms=retention.events_ttl_ms(settings),
        max_per_topic=settings.events.max_per_topic,
        batch=policy.batch,
        pause_seconds=policy.pause_seconds,
    )
    if removed:
        log.info("cleaned %d event(s) from the event log", removed)
    return removed
