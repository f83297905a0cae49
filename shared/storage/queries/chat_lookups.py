"""The reads chat adapters make about one channel's chats: who is busy, where typing shows
(:mod:`shared.chat.lookups`)."""

from __future__ import annotations

from shared.storage.queries.common import CHAT_KEY, OPEN, PENDING, PROCESSING

#: Agents with a message of the chat pending or processing, and whether one is processing.
BUSY_AGENTS = (
    f"SELECT agent, MAX(CASE WHEN status = {PROCESSING} THEN 1 ELSE 0 END) AS running FROM messages "
    f"WHERE channel = :c AND {CHAT_KEY} = :chat AND status IN {OPEN} GROUP BY agent"
)
#: Chats of the channel with a message processing, or pending and due by ``:horizon`` for an agent not
#: paused at ``:now``.
BUSY_CONVERSATIONS = (
    "SELECT DISTINCT m.conversation FROM messages m LEFT JOIN agent_leases a ON a.agent = m.agent "
    f"WHERE m.channel = :c AND m.status IN {OPEN} AND m.conversation <> '' "
    f"AND (m.status = {PROCESSING} OR "
    f"(m.status = {PENDING} AND m.available_at <= :horizon AND COALESCE(a.paused_until, 0) <= :now))"
)
NEWEST_WAITING_EXTERNAL_ID = (
    f"SELECT external_id FROM messages WHERE channel = :c AND {CHAT_KEY} = :chat "
    f"AND status IN {OPEN} AND external_id IS NOT NULL ORDER BY id DESC LIMIT 1"
)


def processing_among(count: int) -> str:
    """Which of the messages ``:m0`` … ``:m{count-1}`` (by message id) are processing."""
    marks = ", ".join(f":m{i}" for i in range(count))
    return f"SELECT message_id FROM messages WHERE status = {PROCESSING} AND message_id IN ({marks})"
