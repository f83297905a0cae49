"""Operator views and repairs: dead letters, counts per status and agent, pruning."""

from __future__ import annotations

from typing import Any

from shared.chain_budget import prune_chain_budgets
from shared.clock import now_ms
from shared.events import PendingEvent, append_events
from shared.ids import is_message_id
from shared.queue_types import (
    InvalidInput,
    NotFound,
    QueuedMessage,
    QueuedResponse,
    QueueState,
    RetryBudgetExhausted,
)

#: How often each dead letter was retried automatically (``kv`` scope; key: the message id).
AUTO_RETRY_SCOPE = "dlq.auto_retries"


class AdminOps(QueueState):
    """Dead-letter, view and pruning operations of :class:`shared.queue.Queue`."""

    def _dead_where(self, ref: int | str) -> tuple[str, dict[str, Any]]:
        if isinstance(ref, int) or (isinstance(ref, str) and ref.isdigit()):
            return "id = :ref", {"ref": int(ref)}
        if isinstance(ref, str) and is_message_id(ref):
            return "message_id = :ref", {"ref": ref}
        raise InvalidInput(f"{ref!r} is neither a row id nor a message id")

    def list_dead(self, limit: int = 100, offset: int = 0) -> list[QueuedMessage]:
        """Dead letters, newest first."""
        rows = self.db.read(
            "SELECT * FROM messages WHERE status = 'dead' ORDER BY updated_at DESC, id DESC LIMIT :l OFFSET :o",
            {"l": max(1, min(limit, 10_000)), "o": max(0, offset)},
        )
        return [QueuedMessage.from_row(r) for r in rows]

    def retry_dead(self, ref: int | str) -> QueuedMessage:
        """Put a dead letter back to ``pending`` with fresh attempts, within the manual-retry budget.

        Raises :class:`NotFound` for an unknown id and :class:`RetryBudgetExhausted` past the budget.
        """
        where, params = self._dead_where(ref)
        now = now_ms()
        with self.db.transaction() as tx:
            row = tx.one(f"SELECT * FROM messages WHERE status = 'dead' AND {where}", params)
            if row is None:
                raise NotFound(f"no dead letter {ref}")
            if int(row["manual_retries"]) >= self.config.manual_retry_budget:
                raise RetryBudgetExhausted(
                    f"dead letter {row['message_id']} was already retried {row['manual_retries']} times "
                    f"(budget {self.config.manual_retry_budget}); delete it or archive it"
                )
            updated = tx.one(
                "UPDATE messages SET status = 'pending', retry_count = 0, manual_retries = manual_retries + 1, "
                "available_at = :now, updated_at = :now, claimed_by = NULL, lease_until = NULL WHERE id = :id "
                "RETURNING *",
                {"now": now, "id": row["id"]},
            )
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
            rows = tx.rows(
                "SELECT m.id, m.message_id, COALESCE(k.value, '0') AS n FROM messages m "
                "LEFT JOIN kv k ON k.scope = :scope AND k.key = m.message_id "
                "WHERE m.status = 'dead' AND m.updated_at < :cut ORDER BY m.updated_at, m.id LIMIT :l",
                {"scope": AUTO_RETRY_SCOPE, "cut": died_before_ms, "l": max(1, min(limit, 10_000))},
            )
            events: list[PendingEvent] = []
            for row in rows:
                done = int(row["n"])
                if done >= budget:
                    continue
                tx.execute(
                    "UPDATE messages SET status = 'pending', retry_count = 0, available_at = :now, "
                    "updated_at = :now, claimed_by = NULL, lease_until = NULL WHERE id = :id AND status = 'dead'",
                    {"now": now, "id": row["id"]},
                )
                tx.execute(
                    "INSERT INTO kv (scope, key, value, updated_at) VALUES (:s, :k, :v, :now) "
                    "ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                    {"s": AUTO_RETRY_SCOPE, "k": row["message_id"], "v": str(done + 1), "now": now},
                )
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
        return int(self.db.read_scalar("SELECT COUNT(*) FROM messages WHERE status = 'dead'") or 0)

    def retry_last_failed(self, channel: str, conversation: str) -> QueuedMessage:
        """``/retry`` in a chat: put the chat's most recent dead letter back, within the manual-retry budget
        (:meth:`retry_dead`). Raises :class:`NotFound` when the chat has none."""
        ref = self.db.read_scalar(
            "SELECT message_id FROM messages WHERE status = 'dead' AND channel = :c AND conversation = :conv "
            "ORDER BY updated_at DESC, id DESC LIMIT 1",
            {"c": channel, "conv": conversation},
        )
        if ref is None:
            raise NotFound(f"no failed message in {channel}:{conversation}")
        return self.retry_dead(str(ref))

    def delete_dead(self, ref: int | str) -> QueuedMessage:
        """Delete one dead letter for good. Raises :class:`NotFound` for an unknown id."""
        where, params = self._dead_where(ref)
        now = now_ms()
        with self.db.transaction() as tx:
            row = tx.one(f"DELETE FROM messages WHERE status = 'dead' AND {where} RETURNING *", params)
            if row is None:
                raise NotFound(f"no dead letter {ref}")
            append_events(tx, [PendingEvent("message_deleted", {}, row["message_id"])], now)
        return QueuedMessage.from_row(row)

    # -- views -------------------------------------------------------------------------------------------
    def queue_status(self) -> dict[str, int]:
        """Counts of messages per status and of undelivered responses (each count reads a partial index)."""
        db = self.db
        counts = {
            status: int(db.read_scalar(f"SELECT COUNT(*) FROM messages WHERE status = '{status}'") or 0)
            for status in ("pending", "processing", "completed", "dead")
        }
        responses = {"responses_pending": 0, "responses_delivering": 0, "cli_replies_unread": 0}
        for r in db.read(
            "SELECT status, channel = 'cli' AS cli, COUNT(*) AS n FROM responses WHERE status <> 'acked' "
            "GROUP BY status, channel = 'cli'"
        ):
            # CLI replies wait for `agentpost replies` or a waiting `send`: unread, not stuck in delivery.
            key = (
                "cli_replies_unread" if r["cli"] and r["status"] == "pending" else f"responses_{r['status']}"
            )
            responses[key] = responses.get(key, 0) + int(r["n"])
        return counts | responses

    def agent_queue_depths(self) -> list[dict[str, Any]]:
        """Pending and processing counts per agent (every configured agent listed)."""
        depths = {a: {"agent": a, "pending": 0, "processing": 0} for a in sorted(self.directory.agents)}
        for r in self.db.read(
            "SELECT agent, status, COUNT(*) AS n FROM messages WHERE status IN ('pending', 'processing') "
            "GROUP BY agent, status"
        ):
            depths.setdefault(r["agent"], {"agent": r["agent"], "pending": 0, "processing": 0})[
                r["status"]
            ] = int(r["n"])
        return list(depths.values())

    def list_processing(self) -> list[QueuedMessage]:
        rows = self.db.read("SELECT * FROM messages WHERE status = 'processing' ORDER BY id")
        return [QueuedMessage.from_row(r) for r in rows]

    def list_responses(
        self, limit: int = 20, channel: str | None = None, pending_only: bool = False
    ) -> list[QueuedResponse]:
        where = []
        params: dict[str, Any] = {"l": max(1, min(limit, 1000))}
        if channel is not None:
            where.append("channel = :channel")
            params["channel"] = channel
        if pending_only:
            where.append("status IN ('pending', 'delivering')")  # failed replies are not waiting
        clause = ("WHERE " + " AND ".join(where)) if where else ""
        order = "ASC" if pending_only else "DESC"
        rows = self.db.read(f"SELECT * FROM responses {clause} ORDER BY id {order} LIMIT :l", params)
        return [QueuedResponse.from_row(r) for r in rows]

    def chat_responses(self, channel: str, conversation: str, *, limit: int = 100) -> list[QueuedResponse]:
        """Replies waiting to be read in one chat of a channel that is read on demand (the CLI), oldest first."""
        rows = self.db.read(
            "SELECT * FROM responses WHERE status = 'pending' AND channel = :c AND conversation = :v "
            "ORDER BY id LIMIT :l",
            {"c": channel, "v": conversation, "l": max(1, min(limit, 1000))},
        )
        return [QueuedResponse.from_row(r) for r in rows]

    def get_message(self, message_id: str) -> QueuedMessage | None:
        rows = self.db.read("SELECT * FROM messages WHERE message_id = :m", {"m": message_id})
        return QueuedMessage.from_row(rows[0]) if rows else None

    def prune(
        self,
        *,
        completed_older_ms: int = 86_400_000,
        acked_older_ms: int = 86_400_000,
        failed_older_ms: int = 7 * 86_400_000,
    ) -> dict[str, int]:
        """Delete completed messages and acked responses older than the given ages. Never touches pending,
        processing or dead rows."""
        now = now_ms()
        with self.db.transaction() as tx:
            responses = tx.execute(
                "DELETE FROM responses WHERE status = 'acked' AND acked_at < :cut",
                {"cut": now - acked_older_ms},
            ).rowcount
            # Failed deliveries stay a week for trace, doctor and the user's notice, then go; so do CLI
            # replies nobody read (`agentpost replies` shows them until then).
            responses += tx.execute(
                "DELETE FROM responses WHERE (status = 'failed' OR (status = 'pending' AND channel = 'cli')) "
                "AND updated_at < :cut",
                {"cut": now - failed_older_ms},
            ).rowcount
            messages = tx.execute(
                "DELETE FROM messages WHERE status = 'completed' AND updated_at < :cut",
                {"cut": now - completed_older_ms},
            ).rowcount
            prune_chain_budgets(tx, now - completed_older_ms)
        return {"messages": messages, "responses": responses}
