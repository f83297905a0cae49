"""Retention: how long each kind of finished history stays, and the pruning that enforces it.

Every table that grows with use is pruned by age (``[retention]`` in settings.toml, run by the scheduler):
completed messages, delivered (and long-failed) replies, team chat-room posts, agents' turns and what runs
cost; the event log has its own cleanup (:meth:`shared.events.log.SqlEventLog.cleanup`), batched the same
way. Rows are deleted in batches of a few hundred, one short transaction each, with a pause between them:
SQLite has one writer at a time, and an enqueue waiting behind a prune of 50,000 rows in one transaction
would wait seconds, while behind one batch it waits milliseconds. Nothing unfinished is ever pruned.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from shared.chain_budget import prune_chain_budgets
from shared.clock import now_ms
from shared.settings.model import Settings
from shared.storage import kv
from shared.storage.db import Database, Row, Tx
from shared.storage.kv import Scope
from shared.storage.queries import retention as q

DAY_MS = 86_400_000
#: Failed deliveries (and CLI replies nobody read) stay a week for trace, doctor and the user's notice.
FAILED_REPLIES_MS = 7 * DAY_MS


@dataclass(frozen=True)
class RetentionPolicy:
    """Ages in milliseconds past which each kind of finished history is pruned, and the batching."""

    messages_ms: int = DAY_MS
    replies_ms: int = DAY_MS
    failed_replies_ms: int = FAILED_REPLIES_MS
    chat_room_ms: int = 90 * DAY_MS
    agent_history_ms: int = 90 * DAY_MS
    usage_ms: int = 730 * DAY_MS
    batch: int = 500
    pause_seconds: float = 0.02

    @classmethod
    def from_settings(cls, settings: Settings) -> RetentionPolicy:
        """``[retention]``, with the older ``[scheduler]`` ages where it leaves one unset."""
        r, s = settings.retention, settings.scheduler

        def days(value: float | None, fallback_hours: float) -> int:
            return round(value * DAY_MS) if value is not None else round(fallback_hours * 3_600_000)

        return cls(
            messages_ms=days(r.messages_days, s.completed_max_age_hours),
            replies_ms=days(r.replies_days, s.acked_max_age_hours),
            chat_room_ms=round(r.chat_room_days * DAY_MS),
            agent_history_ms=round(r.agent_history_days * DAY_MS),
            usage_ms=round(r.usage_days * DAY_MS),
            batch=r.batch_rows,
            pause_seconds=r.pause_seconds,
        )


def events_ttl_ms(settings: Settings) -> int:
    """How long the event log keeps events: ``[retention] events_days``, else ``[events] ttl_hours``."""
    days = settings.retention.events_days
    return round(days * DAY_MS) if days is not None else round(settings.events.ttl_hours * 3_600_000)


def delete_in_batches(
    db: Database,
    statement: str,
    params: dict[str, object],
    *,
    batch: int,
    pause_seconds: float,
    with_deleted: Callable[[Tx, list[Row]], None] | None = None,
) -> int:
    """Run a batched ``DELETE`` (``statement`` deletes at most ``:n`` rows) until a batch comes back short,
    each batch its own transaction, ``pause_seconds`` between batches so other writers get the lock.
    ``with_deleted`` (for a statement ending in ``RETURNING``) runs in each batch's transaction with the
    rows it deleted. Returns how many rows went."""
    total = 0
    while True:
        with db.transaction() as tx:
            if with_deleted is None:
                n = int(tx.execute(statement, {**params, "n": batch}).rowcount)
            else:
                rows = tx.rows(statement, {**params, "n": batch})
                with_deleted(tx, rows)
                n = len(rows)
        total += n
        if n < batch:
            return total
        time.sleep(pause_seconds)


def _forget_delivery_attempts(tx: Tx, rows: list[Row]) -> None:
    # Acking and failing drop a response's count already; a reply settled another way (the scheduler
    # acknowledging replies on unserved channels) would otherwise leave it for ever.
    kv.delete_keys(tx, Scope.DELIVERY_ATTEMPTS, [str(r["id"]) for r in rows])


def prune_queue(db: Database, policy: RetentionPolicy, *, now: int | None = None) -> dict[str, int]:
    """Delete completed messages and settled replies older than the policy's ages. Pending, processing
    and dead messages and undelivered replies are never touched."""
    now = now_ms() if now is None else now
    b, pause = policy.batch, policy.pause_seconds
    forget = _forget_delivery_attempts
    responses = delete_in_batches(
        db,
        q.PRUNE_ACKED_RESPONSES,
        {"cut": now - policy.replies_ms},
        batch=b,
        pause_seconds=pause,
        with_deleted=forget,
    )
    responses += delete_in_batches(
        db,
        q.PRUNE_FAILED_RESPONSES,
        {"cut": now - policy.failed_replies_ms},
        batch=b,
        pause_seconds=pause,
        with_deleted=forget,
    )
    messages = delete_in_batches(
        db, q.PRUNE_COMPLETED_MESSAGES, {"cut": now - policy.messages_ms}, batch=b, pause_seconds=pause
    )
    with db.transaction() as tx:
        prune_chain_budgets(tx, now - policy.messages_ms)
    return {"messages": messages, "responses": responses}


def prune_history(db: Database, policy: RetentionPolicy, *, now: int | None = None) -> dict[str, int]:
    """Everything :func:`prune_queue` prunes, then team chat-room posts, agents' turns and run costs past
    their ages, and settled questions to a person (approvals) as old as pruned messages. Returns how many
    rows went, by kind (``messages``, ``responses``, ``chat_messages``, ``agent_messages``, ``run_usage``,
    ``approvals``)."""
    now = now_ms() if now is None else now
    result = prune_queue(db, policy, now=now)
    ages: dict[q.HistoryTable, int] = {
        "chat_messages": policy.chat_room_ms,
        "agent_messages": policy.agent_history_ms,
        "run_usage": policy.usage_ms,
    }
    for table, age in ages.items():
        result[table] = delete_in_batches(
            db,
            q.prune_oldest(table),
            {"cut": now - age},
            batch=policy.batch,
            pause_seconds=policy.pause_seconds,
        )
    # A settled question to a person belongs to its message's story (trace): kept as long as messages.
    result["approvals"] = delete_in_batches(
        db,
        q.PRUNE_SETTLED_APPROVALS,
        {"cut": now - policy.messages_ms},
        batch=policy.batch,
        pause_seconds=policy.pause_seconds,
    )
    return result
