"""Operator views and repairs: dead letters, counts per status and agent, pruning; and the statements of the
dead-letter archive (:mod:`scheduler.dlq`), which works on one transaction of its own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events
from shared.ids import is_message_id
from shared.queue.records import (
    Directory,
    InvalidInput,
    NotFound,
    QueuedMessage,
    QueuedResponse,
    RetryBudgetExhausted,
)
from shared.queue.retention import FAILED_REPLIES_MS, RetentionPolicy, prune_queue
from shared.settings.model import QueueSettings
from shared.storage import kv
from shared.storage.db import Database, Row, Tx
from shared.storage.kv import Scope
from shared.storage.queries import queue_admin as q
from shared.storage.statuses import MessageStatus, ResponseStatus

#: ``queue_status`` counts the messages completed within this window.
COMPLETED_WINDOW_MS = 86_400_000


class Admin:
    """Dead letters, views and pruning for operators: the part ``Queue.admin`` (``directory`` lists every
    configured agent in the depths per agent)."""

    def __init__(self, db: Database, config: QueueSettings, directory: Directory) -> None:
        self.db = db
        self.config = config
        self.directory = directory

    def _dead_ref(self, ref: int | str) -> tuple[bool, dict[str, Any]]:
        """Whether ``ref`` is a row id (else a message id), and the statement's parameters."""
        if isinstance(ref, int) or (isinstance(ref, str) and ref.isdigit()):
            return True, {"ref": int(ref)}
        if isinstance(ref, str) and is_message_id(ref):
            return False, {"ref": ref}
        raise InvalidInput(f"{ref!r} is neither a row id nor a message id")

    def list_dead(self, limit: int = 100, offset: int = 0) -> list[QueuedMessage]:
        """Dead letters, newest first."""
        rows = self.db.read(
            q.LIST_DEAD,
            {"l": max(1, min(limit, 10_000)), "o": max(0, offset)},
        )
        return [QueuedMessage.from_row(r) for r in rows]

    def retry_dead(self, ref: int | str) -> QueuedMessage:
        """Put a dead letter back to ``pending`` with fresh attempts, within the manual-retry budget.

        Raises :class:`NotFound` for an unknown id and :class:`RetryBudgetExhausted` past the budget.
        """
        with self.db.transaction() as tx:
            return self.retry_dead_in(tx, ref)

    def retry_dead_in(self, tx: Tx, ref: int | str) -> QueuedMessage:
        """:meth:`retry_dead` inside the caller's transaction (a chat's ``/retry`` commits its answer with
        it). Raises before writing anything, so a caller may catch the refusal and go on in ``tx``."""
        by_id, params = self._dead_ref(ref)
        now = now_ms()
        # Locked (PostgreSQL) so that a retry racing this one waits, then finds the row no longer dead;
        # SQLite's write transaction already excludes it.
        row = tx.one(q.DEAD_BY_ID_LOCKED if by_id else q.DEAD_BY_MESSAGE_ID_LOCKED, params)
        if row is None:
            raise NotFound(f"no dead letter {ref}")
        if int(row["manual_retries"]) >= self.config.manual_retry_budget:
            raise RetryBudgetExhausted(
                f"dead letter {row['message_id']} was already retried {row['manual_retries']} times "
                f"(budget {self.config.manual_retry_budget}); delete it or archive it"
            )
        updated = tx.one(q.RETRY_DEAD, {"now": now, "id": row["id"]})
        append_events(
            tx,
            [
                PendingEvent(
                    "message_retried",
                    {"manual_retries": int(row["manual_retries"]) + 1},
                    row["message_id"],
                )
            ],
            now,
        )
        tx.signal("messages")
        assert updated is not None
        return QueuedMessage.from_row(updated)

    def retry_dead_automatically(self, *, died_before_ms: int, budget: int, limit: int = 100) -> list[str]:
        """The dead-letter queue's opt-in automatic retry (seed 004's retry budget): put back to ``pending``
        every dead letter that died before ``died_before_ms`` and was retried automatically fewer than
        ``budget`` times (counted in ``kv`` scope ``dlq.auto_retries``, apart from the manual budget).
        Returns the message ids put back."""
        now = now_ms()
        retried: list[str] = []
        with self.db.transaction() as tx:
            # Locked (PostgreSQL; SQLite's write transaction excludes every other writer): a hand retry or
            # delete racing this waits for it, and another scheduler passes these rows by.
            rows = tx.rows(
                q.DEAD_BEFORE_LOCKED,
                {"cut": died_before_ms, "l": max(1, min(limit, 10_000))},
            )
            done_by_id = kv.get_many(tx, Scope.DLQ_AUTO_RETRIES, [str(r["message_id"]) for r in rows])
            events: list[PendingEvent] = []
            for row in rows:
                done = int(done_by_id.get(str(row["message_id"]), "0"))
                if done >= budget:
                    continue
                tx.execute(q.RETRY_DEAD_AUTOMATICALLY, {"now": now, "id": row["id"]})
                kv.put(tx, Scope.DLQ_AUTO_RETRIES, str(row["message_id"]), str(done + 1), now)
                events.append(
                    PendingEvent(
                        "message_retried", {"automatic": True, "auto_retries": done + 1}, row["message_id"]
                    )
                )
                retried.append(str(row["message_id"]))
            append_events(tx, events, now)
            if retried:
                tx.signal("messages")
        return retried

    def dead_count(self) -> int:
        """How many dead letters the database holds."""
        return int(self.db.read_scalar(q.DEAD_COUNT) or 0)

    def retry_last_failed(self, chat: ChatAddress) -> QueuedMessage:
        """``/retry`` in a chat: put the most recent dead letter of ``chat`` (its channel and conversation)
        back, within the manual-retry budget (:meth:`retry_dead`); a teammate's handoff in a chain this
        chat started counts as the chat's (the chat was told of it, and its answer comes back here).
        Raises :class:`NotFound` when the chat has none."""
        with self.db.transaction() as tx:
            return self.retry_last_failed_in(tx, chat)

    def retry_last_failed_in(self, tx: Tx, chat: ChatAddress) -> QueuedMessage:
        """:meth:`retry_last_failed` inside the caller's transaction: a chat adapter queues the answer to
        ``/retry`` in it, so a crash leaves both or neither (a retried message the chat was never told
        about, or a second ``/retry`` reaching an older dead letter, cannot happen). Raises before writing
        anything."""
        # A chain's handoffs share the internal conversation named after the chat it started from (see
        # workers/teams.py), which a chat without a conversation id names by its sender.
        ref = tx.scalar(
            q.LAST_DEAD_OF_CHAT,
            {"c": chat.channel, "conv": chat.conversation, "chain": chat.row_key},
        )
        if ref is None:
            raise NotFound(f"no failed message in {chat.channel}:{chat.conversation}")
        return self.retry_dead_in(tx, str(ref))

    def delete_dead(self, ref: int | str) -> QueuedMessage:
        """Delete one dead letter for good. Raises :class:`NotFound` for an unknown id."""
        by_id, params = self._dead_ref(ref)
        now = now_ms()
        with self.db.transaction() as tx:
            row = tx.one(q.DELETE_DEAD_BY_ID if by_id else q.DELETE_DEAD_BY_MESSAGE_ID, params)
            if row is None:
                raise NotFound(f"no dead letter {ref}")
            append_events(tx, [PendingEvent("message_deleted", {}, row["message_id"])], now)
        return QueuedMessage.from_row(row)

    # -- views -------------------------------------------------------------------------------------------
    def queue_status(self) -> dict[str, int]:
        """Counts of messages per status (``completed``: in the last 24 hours) and of undelivered responses
        (each count reads a partial index)."""
        db = self.db
        since = {"since": now_ms() - COMPLETED_WINDOW_MS}
        counts = {
            status.value: int(db.read_scalar(q.count_with_status(status), since) or 0)
            for status in MessageStatus
        }
        responses = {"responses_pending": 0, "responses_delivering": 0, "cli_replies_unread": 0}
        for r in db.read(q.UNDELIVERED_BY_STATUS):
            # CLI replies wait for `agentpost replies` or a waiting `send`: unread, not stuck in delivery.
            key = (
                "cli_replies_unread"
                if r["cli"] and r["status"] == ResponseStatus.PENDING
                else f"responses_{r['status']}"
            )
            responses[key] = responses.get(key, 0) + int(r["n"])
        return counts | responses

    def agent_queue_depths(self) -> list[dict[str, Any]]:
        """Pending and processing counts per agent (every configured agent listed)."""
        depths = {
            a: {"agent": a, MessageStatus.PENDING.value: 0, MessageStatus.PROCESSING.value: 0}
            for a in sorted(self.directory.agents)
        }
        for r in self.db.read(q.OPEN_BY_AGENT):
            depths.setdefault(
                r["agent"],
                {"agent": r["agent"], MessageStatus.PENDING.value: 0, MessageStatus.PROCESSING.value: 0},
            )[r["status"]] = int(r["n"])
        return list(depths.values())

    def waiting_messages(self, agent: str) -> list[QueuedMessage]:
        """The messages waiting for ``agent`` (pending or being processed), oldest first: the chats a pause
        of the agent keeps waiting."""
        rows = self.db.read(q.WAITING_FOR_AGENT, {"a": agent})
        return [QueuedMessage.from_row(r) for r in rows]

    def list_processing(self) -> list[QueuedMessage]:
        rows = self.db.read(q.PROCESSING_MESSAGES)
        return [QueuedMessage.from_row(r) for r in rows]

    def list_responses(
        self, limit: int = 20, channel: str | None = None, pending_only: bool = False
    ) -> list[QueuedResponse]:
        params: dict[str, Any] = {"l": max(1, min(limit, 1000))}
        if channel is not None:
            params["channel"] = channel
        rows = self.db.read(q.list_responses(channel=channel is not None, pending_only=pending_only), params)
        return [QueuedResponse.from_row(r) for r in rows]

    def chat_responses(self, chat: ChatAddress, *, limit: int = 100) -> list[QueuedResponse]:
        """Replies waiting to be read in ``chat`` (its channel and conversation) on a channel that is read on
        demand (the CLI), oldest first."""
        rows = self.db.read(
            q.CHAT_RESPONSES,
            {"c": chat.channel, "v": chat.conversation, "l": max(1, min(limit, 1000))},
        )
        return [QueuedResponse.from_row(r) for r in rows]

    def get_message(self, message_id: str) -> QueuedMessage | None:
        rows = self.db.read(q.MESSAGE, {"m": message_id})
        return QueuedMessage.from_row(rows[0]) if rows else None

    def prune(
        self,
        *,
        completed_older_ms: int = 86_400_000,
        acked_older_ms: int = 86_400_000,
        failed_older_ms: int = FAILED_REPLIES_MS,
    ) -> dict[str, int]:
        """Delete completed messages and acked responses older than the given ages, in small batches
        (:func:`shared.queue.retention.prune_queue`). Never touches pending, processing or dead rows. The
        delivery-attempt counts of the responses removed go with them."""
        policy = RetentionPolicy(
            messages_ms=completed_older_ms, replies_ms=acked_older_ms, failed_replies_ms=failed_older_ms
        )
        return prune_queue(self.db, policy)


# -- the dead-letter archive ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeadLetterStats:
    """Dead letters in the database: how many, how many died before a cut, and when the oldest died."""

    total: int
    due: int
    oldest_died_at: int | None


def dead_letter_stats(db: Database, died_before: int) -> DeadLetterStats:
    """Count the dead letters, and those that died before ``died_before`` (epoch ms), in one read."""
    row = db.read(q.DEAD_LETTER_STATS, {"cut": died_before})[0]
    oldest = row["oldest"]
    return DeadLetterStats(int(row["n"] or 0), int(row["due"] or 0), None if oldest is None else int(oldest))


def dead_letter_cut_keeping(db: Database, keep: int) -> int | None:
    """When the newest dead letter beyond the newest ``keep`` died (epoch ms), or ``None`` when there are
    ``keep`` or fewer: archiving what died at or before it keeps at most ``keep``."""
    value = db.read_scalar(q.DEAD_LETTER_CUT_KEEPING, {"n": keep})
    return None if value is None else int(value)


def any_dead_before(db: Database, died_before: int) -> bool:
    """Whether a dead letter died before ``died_before`` (epoch ms): a cheap read before a write lock."""
    return db.read_scalar(q.ANY_DEAD_BEFORE, {"cut": died_before}) is not None


def dead_letters_before(tx: Tx, died_before: int, limit: int) -> list[Row]:
    """Whole rows of up to ``limit`` dead letters that died before ``died_before`` (epoch ms), by row id.
    On PostgreSQL they stay locked until ``tx`` ends and rows another transaction holds are skipped, so two
    archivers never take the same row (SQLite has one writer at a time anyway)."""
    return tx.rows(q.DEAD_LETTERS_BEFORE_LOCKED, {"cut": died_before, "n": limit})


def delete_dead_letters(tx: Tx, row_ids: Sequence[int]) -> int:
    """Delete the dead letters with these row ids (a row no longer dead is left alone); returns how many."""
    if not row_ids:
        return 0
    params = {f"i{i}": row_id for i, row_id in enumerate(row_ids)}
    return int(tx.execute(q.delete_dead_letters(len(params)), params).rowcount)


def insert_restored_message(tx: Tx, values: Mapping[str, Any]) -> int | None:
    """Queue an archived message again as ``pending``, due at ``values["now"]``, with its original message
    id (``values`` names every column of the insert). Returns the new row id, or ``None`` when a message
    with that id (or platform id) is in the queue already."""
    new_id = tx.scalar(q.INSERT_RESTORED, dict(values))
    return None if new_id is None else int(new_id)
