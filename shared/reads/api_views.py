"""Read views and small writes the web API needs beyond the queue itself: agent history, team chat rooms,
the replies waiting in one chat, busy conversations, a database ping and the tail of the process logs.

Every function takes the :class:`~shared.storage.db.Database` (or the :class:`~shared.queue.core.Queue`, or the home folder
for logs), so the web adapter calls named operations and holds no SQL of its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.events.log import PendingEvent, append_events
from shared.queue.core import Queue
from shared.queue.records import MAX_MESSAGE_CHARS, InvalidInput, MessageDraft, QueuedResponse
from shared.storage.db import Database
from shared.storage.queries import api_views as q

#: The most lines :func:`tail_logs` reads from one file (it reads from the end).
_TAIL_BYTES = 256 * 1024


def agent_history(db: Database, agent: str, *, limit: int = 100, since_id: int = 0) -> list[dict[str, Any]]:
    """An agent's turns (``agent_messages`` rows) with id above ``since_id``, newest first."""
    rows = db.read(q.AGENT_TURNS, {"a": agent, "s": max(0, since_id), "l": max(1, min(limit, 1000))})
    return [dict(r) for r in rows]


def chat_room_posts(db: Database, team: str, *, since_id: int = 0, limit: int = 100) -> list[dict[str, Any]]:
    """A team chat room's posts with id above ``since_id``: the newest ``limit`` of them, newest first."""
    rows = db.read(q.CHAT_ROOM_POSTS, {"t": team, "s": max(0, since_id), "l": max(1, min(limit, 1000))})
    return [dict(r) for r in rows]


@dataclass(frozen=True)
class ChatRoomPost:
    """What :func:`post_to_chat_room` wrote: the post's id and the message queued for each member."""

    id: int
    queued: list[str]


def post_to_chat_room(
    queue: Queue, team: str, sender: str, message: str, members: Sequence[str]
) -> ChatRoomPost:
    """Post a user's ``message`` to ``team``'s chat room: one message per member (channel ``chatroom``, chat
    ``team:<team>``), the ``chat_messages`` row and its ``chatroom_post`` event, in one transaction — a
    failure anywhere leaves neither a post nobody was told of nor messages about a post that is not there.

    Each member's message is recorded as :meth:`Queue.intake.enqueue_message` with ``agent=`` would
    (``message_received`` with ``"named": true``). Raises :class:`InvalidInput` (nothing written) when the
    text with its chat-room heading is too long or a member is no known agent."""
    text = f"[Chat room #{team} — {sender or 'user'}]: {message}"
    if len(text) > MAX_MESSAGE_CHARS:
        raise InvalidInput(f"message is longer than {MAX_MESSAGE_CHARS} characters")
    known = queue.directory.agents
    for agent in members:
        if agent not in known and agent not in queue.directory.teams:
            names = ", ".join(sorted(known | set(queue.directory.teams)))
            raise InvalidInput(f"unknown agent or team {agent!r} (known: {names})")
    now = now_ms()
    queued: list[str] = []
    with queue.db.transaction() as tx:
        for agent in members:
            draft = MessageDraft(
                channel="chatroom",
                sender=sender,
                message=text,
                agent=agent,
                prefix="chatroom",
                conversation=f"team:{team}",
                named=True,
            )
            queued.extend(queue.intake.insert_drafts(tx, [draft], now))
        row_id = tx.scalar(q.ADD_CHAT_ROOM_POST, {"t": team, "f": f"user:{sender}", "m": message, "now": now})
        append_events(tx, [PendingEvent("chatroom_post", {"team": team, "id": row_id, "queued": queued})])
    return ChatRoomPost(int(row_id), queued)


def pending_chat_replies(db: Database, chat: ChatAddress, limit: int = 100) -> list[QueuedResponse]:
    """The replies to ``chat`` still to deliver (``pending`` or ``delivering``; a ``failed``
    one waits for nobody), oldest first, at most ``limit``. Filtered in the query, however many replies other
    chats of the channel have waiting."""
    rows = db.read(q.PENDING_CHAT_REPLIES, {"c": chat.channel, "v": chat.chat, "l": max(1, min(limit, 1000))})
    return [QueuedResponse.from_row(r) for r in rows]


def ping(db: Database) -> None:
    """One round trip to the database; raises what the driver raises when it cannot answer."""
    db.read_scalar(q.PING)


def active_conversations(db: Database) -> int:
    """How many chats have a message being processed now."""
    value = db.read_scalar(q.ACTIVE_CONVERSATIONS)
    return int(value or 0)


def processing_message(db: Database, row_id: int) -> dict[str, Any] | None:
    """The ``messages`` row ``row_id`` if it is being processed now."""
    rows = db.read(q.PROCESSING_MESSAGE, {"i": row_id})
    return dict(rows[0]) if rows else None


def tail_logs(logs_dir: Path, limit: int = 100) -> list[str]:
    """The last ``limit`` lines over the ``*.log`` files in ``logs_dir`` (each line prefixed with its file's
    name, files ordered by last change, the most recent last). Missing folder: no lines."""
    try:
        files = sorted(
            (p for p in logs_dir.glob("*.log") if p.is_file()), key=lambda p: (p.stat().st_mtime, p.name)
        )
    except OSError:
        return []
    lines: list[str] = []
    for path in files:
        try:
            with path.open("rb") as fh:
                size = fh.seek(0, 2)
                fh.seek(max(0, size - _TAIL_BYTES))
                data = fh.read().decode("utf-8", errors="replace")
        except OSError:
            continue
        text_lines = data.splitlines()
        if size > _TAIL_BYTES and text_lines:
            text_lines = text_lines[1:]  # the first line was cut in the middle
        lines.extend(f"[{path.stem}] {line}" for line in text_lines[-limit:] if line.strip())
    return lines[-max(1, limit) :]


#: Channels whose private chat with a user has the user's id as its address (a Telegram private chat's id is
#: the user's id; a WhatsApp chat is the phone number).
SENDER_ID_IS_CHAT = frozenset({"telegram", "whatsapp"})


def chat_of_sender(db: Database, channel: str, sender_id: str) -> str | None:
    """Where a reply addressed to a user by id alone goes: their private chat on channels where its address
    is their id, else the chat they last wrote in (or were last answered in) on ``channel``; ``None`` when
    no such chat is known."""
    if channel in SENDER_ID_IS_CHAT:
        return sender_id
    rows = db.read(q.SENDER_RECENT_CHATS, {"c": channel, "s": sender_id})
    # A private chat first (a message with no guild/group), then a private chat the adapter opened for them
    # (``dm_channel``), then wherever they last wrote.
    found = [(str(r["conversation"]), _metadata(r["metadata"])) for r in rows]
    for conversation, meta in found:
        if "guild_id" in meta and not meta["guild_id"]:
            return conversation
    for _, meta in found:
        if meta.get("dm_channel"):
            return str(meta["dm_channel"])
    if found:
        return found[0][0]
    value = db.read_scalar(q.SENDER_LAST_ANSWERED_CHAT, {"c": channel, "s": sender_id})
    return str(value) if value else None


def _metadata(raw: Any) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def last_heartbeats(db: Database) -> dict[str, int]:
    """When each agent's latest heartbeat message was queued (epoch ms), for the ones still stored."""
    rows = db.read(q.LAST_HEARTBEATS)
    return {str(r["agent"]): int(r["at"]) for r in rows}
