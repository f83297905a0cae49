"""Outgoing responses: claimed with a lease per channel, delivered chunk by chunk, acked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from shared.clock import now_ms
from shared.db import Row, Tx
from shared.events import PendingEvent, append_events
from shared.ids import new_id
from shared.queue_types import (
    CHANNEL_RE,
    InvalidInput,
    NotFound,
    QueuedResponse,
    QueueState,
    ResponseDraft,
)
from shared.queue_types import to_json as _json
from shared.routing import AGENT_NAME_RE

_INSERT_RESPONSE = (
    "INSERT INTO responses (message_id, channel, sender, sender_id, message, original_message, agent, files, "
    "metadata, status, created_at, updated_at, conversation, delivered) VALUES (:message_id, :channel, "
    ":sender, :sender_id, :message, :original_message, :agent, :files, :metadata, 'pending', :now, :now, "
    ":conversation, 0) RETURNING id"
)


class ResponseOps(QueueState):
    """Response operations of :class:`shared.queue.Queue`."""

    _sql_claim_responses: str

    def _insert_response(self, tx: Tx, primary: Row, draft: ResponseDraft, now: int) -> int:
        return int(
            tx.scalar(
                _INSERT_RESPONSE,
                {
                    "message_id": primary["message_id"],
                    "channel": draft.channel or primary["channel"],
                    "sender": primary["sender"] if draft.sender is None else draft.sender,
                    "sender_id": primary["sender_id"] if draft.sender_id is None else draft.sender_id,
                    "message": draft.message,
                    "original_message": primary["message"],
                    "agent": primary["agent"],
                    "files": _json(list(draft.files)),
                    "metadata": _json(dict(draft.metadata)),
                    "conversation": primary["conversation"]
                    if draft.conversation is None
                    else draft.conversation,
                    "now": now,
                },
            )
        )

    def claim_responses_for_channel(
        self, channel: str, worker: str, *, limit: int = 10, lease_ms: int | None = None
    ) -> list[QueuedResponse]:
        """Claim up to ``limit`` undelivered responses of a channel (also ones whose deliverer died)."""
        now = now_ms()
        probe = self.db.read_scalar(
            "SELECT 1 FROM responses WHERE status <> 'acked' AND channel = :channel "
            "AND (status = 'pending' OR lease_until < :now) LIMIT 1",
            {"channel": channel, "now": now},
        )
        if probe is None:
            return []
        lease = now + (lease_ms or self.config.lease_ms)
        with self.db.transaction() as tx:
            rows = tx.rows(
                self._sql_claim_responses,
                {"worker": worker, "lease": lease, "now": now, "channel": channel, "limit": max(1, limit)},
            )
        return sorted((QueuedResponse.from_row(r) for r in rows), key=lambda r: r.id)

    def mark_chunk_delivered(
        self, response_id: int, worker: str, chunk_index: int, *, lease_ms: int | None = None
    ) -> bool:
        """Record that chunk ``chunk_index`` (0-based) was sent, so a restart resumes after it.

        Returns False when the worker no longer holds the response or the chunk was already recorded.
        """
        now = now_ms()
        with self.db.transaction() as tx:
            n = tx.execute(
                "UPDATE responses SET delivered = :next, lease_until = :lease, updated_at = :now WHERE id = :id "
                "AND claimed_by = :worker AND status = 'delivering' AND delivered = :index",
                {
                    "next": chunk_index + 1,
                    "lease": now + (lease_ms or self.config.lease_ms),
                    "now": now,
                    "id": response_id,
                    "worker": worker,
                    "index": chunk_index,
                },
            ).rowcount
            if n:
                mid = tx.scalar("SELECT message_id FROM responses WHERE id = :id", {"id": response_id})
                append_events(
                    tx,
                    [
                        PendingEvent(
                            "chunk_delivered", {"response_id": response_id, "chunk": chunk_index}, mid
                        )
                    ],
                    now,
                )
        return bool(n)

    def ack_response(self, response_id: int, worker: str | None = None) -> bool:
        """Mark a response delivered. With ``worker``, only if that worker holds it. Idempotent."""
        now = now_ms()
        fence = " AND claimed_by = :worker" if worker is not None else ""
        with self.db.transaction() as tx:
            row = tx.one(
                f"UPDATE responses SET status = 'acked', acked_at = :now, updated_at = :now, lease_until = NULL "
                f"WHERE id = :id AND status <> 'acked'{fence} RETURNING message_id",
                {"now": now, "id": response_id, "worker": worker},
            )
            if row is None:
                exists = tx.scalar("SELECT status FROM responses WHERE id = :id", {"id": response_id})
                if exists is None:
                    raise NotFound(f"no response with id {response_id}")
                return exists == "acked" and worker is None
            append_events(
                tx, [PendingEvent("response_acked", {"response_id": response_id}, row["message_id"])], now
            )
        return True

    def enqueue_response(
        self,
        channel: str,
        sender: str,
        message: str,
        *,
        sender_id: str = "",
        conversation: str = "",
        agent: str = "",
        files: Sequence[str] = (),
        metadata: Mapping[str, Any] | None = None,
        message_id: str | None = None,
    ) -> QueuedResponse:
        """Queue an outgoing message nobody asked for (a proactive message, a progress note)."""
        if not isinstance(message, str) or not message.strip():
            raise InvalidInput("message is empty")
        if not CHANNEL_RE.match(channel or ""):
            raise InvalidInput(f"channel {channel!r} must match {CHANNEL_RE.pattern}")
        if agent and not AGENT_NAME_RE.match(agent):
            raise InvalidInput(f"agent name {agent!r} must match {AGENT_NAME_RE.pattern}")
        now = now_ms()
        primary = {
            "message_id": message_id or new_id("proactive"),
            "channel": channel,
            "sender": sender,
            "sender_id": sender_id,
            "message": "",
            "agent": agent,
            "conversation": conversation,
        }
        with self.db.transaction() as tx:
            rid = self._insert_response(
                tx, primary, ResponseDraft(message=message, files=files, metadata=metadata or {}), now
            )
            append_events(
                tx,
                [
                    PendingEvent(
                        "response_ready", {"response_id": rid, "proactive": True}, primary["message_id"]
                    )
                ],
                now,
            )
            tx.signal("responses")
            row = tx.one("SELECT * FROM responses WHERE id = :id", {"id": rid})
        assert row is not None
        return QueuedResponse.from_row(row)
