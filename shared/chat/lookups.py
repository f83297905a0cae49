"""Named reads the chat adapters make about one channel's chats: who is busy, where typing shows.

The channel adapters (:mod:`adapters.runner` and the platforms) hold no SQL; what they need to know about the
queue's rows beyond the queue operations is asked here. Every function is one read-only statement on an
autocommit snapshot (or in the caller's transaction, where it takes one), cheap enough for the typing loop's
pace (a few seconds).
"""

from __future__ import annotations

from collections.abc import Collection

from shared.chat.address import ChatAddress
from shared.storage.db import Database, Tx
from shared.storage.queries import chat_lookups as q


def busy_agents(db: Database, chat: ChatAddress) -> list[str]:
    """Agents with a message of ``chat`` pending or processing: those with one processing first, then by name
    (the agents a ``/stop`` in that chat asks to stop)."""
    rows = db.read(q.BUSY_AGENTS, {"c": chat.channel, "chat": chat.chat})
    ordered = sorted(rows, key=lambda r: (-int(r["running"]), str(r["agent"])))
    return [str(r["agent"]) for r in ordered]


def busy_conversations(db: Database, channel: str, now: int, horizon_ms: int) -> list[str]:
    """Chats of ``channel`` where an agent is at work: a message processing, or one pending that is due
    within ``horizon_ms`` of ``now`` (epoch ms) for an agent not paused then. A chat whose next try is
    further off (a long backoff) or whose agent is paused (a rate limit) is not busy."""
    rows = db.read(q.BUSY_CONVERSATIONS, {"c": channel, "now": now, "horizon": now + horizon_ms})
    return [str(r["conversation"]) for r in rows]


def newest_waiting_external_id(db: Database, chat: ChatAddress) -> str | None:
    """The platform's id of the chat's newest message still pending or processing (``None``: none, or none
    with a platform id). WhatsApp shows its typing indicator on that message."""
    value = db.read_scalar(q.NEWEST_WAITING_EXTERNAL_ID, {"c": chat.channel, "chat": chat.chat})
    return str(value) if value else None


def processing_among(src: Database | Tx, message_ids: Collection[str]) -> set[str]:
    """Which of ``message_ids`` are processing (a run holds them), in one read per 500 ids."""
    unique, found = sorted(set(message_ids)), set[str]()
    for start in range(0, len(unique), 500):
        chunk = unique[start : start + 500]
        params = {f"m{i}": m for i, m in enumerate(chunk)}
        sql = q.processing_among(len(chunk))
        rows = src.rows(sql, params) if isinstance(src, Tx) else src.read(sql, params)
        found.update(str(r["message_id"]) for r in rows)
    return found
