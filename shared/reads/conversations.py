"""Read views of chats for the dashboard: the chats across channels, one chat's history (the user's messages
and every reply, notes included) page by page, and each agent's state (idle, running, paused, queue depth,
last error).

A chat is a channel plus its chat key (the conversation, else the sender id, else the sender: as the queue
groups messages, see :data:`shared.storage.queries.common.CHAT_KEY`). Every function takes the
:class:`~shared.storage.db.Database`, so the web adapter calls named operations and holds no SQL of its own.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.reads.conversation_status import conversation_status, current_run
from shared.storage.db import Database
from shared.storage.queries import conversations as q
from shared.storage.statuses import MessageStatus

#: Channels whose messages are the system's own (not chats a person has with an agent).
HIDDEN_CHANNELS = ("chatroom",)


#: The most chats one page of the chat list holds.
MAX_PAGE = 500


@dataclass(frozen=True)
class ChatPage:
    """One page of the chat list: the chats, most recent first, and the cursor of the next page (``None``
    on the last page). A cursor is opaque to clients: give it back as ``before``."""

    chats: list[dict[str, Any]]
    next: str | None


def parse_cursor(text: str | None) -> int | None:
    """A chat-list cursor as :func:`list_conversations` takes it (``None`` for none); raises ValueError
    for text that is not one."""
    if text is None or text == "":
        return None
    if not text.isdigit() or len(text) > 19:
        raise ValueError(f"{text!r} is not a cursor this list gave out")
    return int(text)


def list_conversations(db: Database, *, limit: int = 50, before: int | None = None) -> ChatPage:
    """A page of chats, most recently active first (by their newest message), those older than the
    cursor ``before`` when given: channel, chat key, who wrote, the agent, the last message (a user's or a
    reply's), its time, how many messages, and what is going on (``working``, ``waiting``, ``failed`` when
    its latest message is a dead letter, else ``idle``). Its cost follows the page, not the history."""
    limit = max(1, min(limit, MAX_PAGE))
    hidden = {f"h{n}": c for n, c in enumerate(HIDDEN_CHANNELS)}
    heads = db.read(
        q.recent_chats(len(HIDDEN_CHANNELS)),
        {"l": limit + 1, "before": before if before is not None else 2**62, **hidden},
    )
    more = len(heads) > limit
    heads = heads[:limit]
    reply_ids = [int(h["reply_id"]) for h in heads if h["reply_id"] is not None]
    replies = (
        {
            int(r["id"]): r
            for r in db.read(q.replies_by_id(len(reply_ids)), {f"r{n}": i for n, i in enumerate(reply_ids)})
        }
        if reply_ids
        else {}
    )
    # Open messages are few whatever the history (finished ones leave the index they are read from).
    open_chats = {(str(r["channel"]), str(r["chat"])): r for r in db.read(q.OPEN_CHATS)} if heads else {}
    out: list[dict[str, Any]] = []
    for row in heads:
        reply = replies.get(int(row["reply_id"])) if row["reply_id"] is not None else None
        live = open_chats.get((str(row["channel"]), str(row["chat"])))
        text, at, by = str(row["message"]), int(row["created_at"]), str(row["sender"] or row["sender_id"])
        if reply is not None and int(reply["created_at"]) >= at:
            text, at, by = str(reply["message"]), int(reply["created_at"]), str(reply["agent"])
        if live is not None and int(live["busy"] or 0):
            state = "working"
        elif live is not None and int(live["waiting"] or 0):
            state = "waiting"
        elif row["status"] == MessageStatus.DEAD:
            state = "failed"
        else:
            state = "idle"
        out.append(
            {
                "channel": str(row["channel"]),
                "conversation": str(row["chat"]),
                "sender": str(row["sender"] or ""),
                "senderId": str(row["sender_id"] or ""),
                "agent": str(row["agent"]),
                "lastMessage": text[:300],
                "lastFrom": by,
                "lastAt": at,
                "messages": int(row["n"]),
                "state": state,
            }
        )
    return ChatPage(out, str(heads[-1]["id"]) if more and heads else None)


def conversation_history(
    db: Database,
    chat: ChatAddress,
    *,
    before: int = 0,
    before_kind: str = "",
    before_id: int = 0,
    limit: int = 50,
) -> dict[str, Any]:
    """One chat's messages and replies, oldest first: the newest ``limit`` items before the item
    (``before`` epoch ms, ``before_kind``, ``before_id``) — ``before`` 0: the newest items. Items are ordered
    by (time, messages before replies, id), so a page never skips items written in the same millisecond.
    ``more`` says whether older items exist (ask again with the first item's ``at``, ``kind`` and ``id``).
    Each item is ``{"kind": "message" | "reply", ...}``; a reply's ``note`` is ``progress`` for a "trying
    again" or "still working" note, ``dead_notice`` for the explanation of a message that will not be
    answered, ``stopped`` for a run stopped on request, ``approval`` for an agent's question before a tool runs and
    ``approval_closed`` for what became of it (both name the request in ``approvalId``), and its ``editKey``
    names the note it replaces.
    ``status`` is the chat's live state (:func:`shared.reads.conversation_status.conversation_status`)."""
    limit = max(1, min(limit, 200))
    cut = before if before > 0 else 2**62
    cursor = (cut, _KIND_ORDER.get(before_kind, 2), before_id if before_kind else 0)
    params = {"c": chat.channel, "v": chat.chat, "b": cut, "l": limit + 1}
    messages = db.read(q.MESSAGES_BEFORE, params) + db.read(q.MESSAGES_AT, params)
    replies = db.read(q.REPLIES_BEFORE, params) + db.read(q.REPLIES_AT, params)
    items: list[dict[str, Any]] = [_message_item(r) for r in messages] + [_reply_item(r) for r in replies]
    items = [i for i in items if _key(i) < cursor]
    items.sort(key=_key)
    more = len(items) > limit
    items = items[-limit:]
    status = conversation_status(db, None, chat)
    return {"items": items, "more": more, "status": status}


_KIND_ORDER = {"message": 0, "reply": 1}


def _key(item: dict[str, Any]) -> tuple[int, int, int]:
    return (int(item["at"]), _KIND_ORDER[str(item["kind"])], int(item["id"]))


def _message_item(r: Any) -> dict[str, Any]:
    return {
        "kind": "message",
        "id": int(r["id"]),
        "messageId": str(r["message_id"]),
        "sender": str(r["sender"] or r["sender_id"] or ""),
        "text": str(r["message"]),
        "agent": str(r["agent"]),
        "status": str(r["status"]),
        "retries": int(r["retry_count"]),
        "manualRetries": int(r["manual_retries"]),
        "error": str(r["last_error"] or ""),
        "at": int(r["created_at"]),
        "updatedAt": int(r["updated_at"]),
    }


def _reply_item(r: Any) -> dict[str, Any]:
    meta = _json(r["metadata"], {})
    files = _json(r["files"], [])
    return {
        "kind": "reply",
        "id": int(r["id"]),
        "messageId": str(r["message_id"]),
        "text": str(r["message"]),
        "agent": str(r["agent"] or meta.get("agent") or ""),
        "note": str(meta.get("kind") or ""),
        "editKey": str(meta.get("edit_key") or ""),
        "approvalId": str(meta.get("approval_id") or ""),
        "files": [str(f) for f in files] if isinstance(files, list) else [],
        "status": str(r["status"]),
        "at": int(r["created_at"]),
    }


def _json(raw: Any, default: Any) -> Any:
    try:
        value = json.loads(str(raw or ""))
    except ValueError:
        return default
    return value if isinstance(value, type(default)) else default


def agent_overview(db: Database, agents: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Each agent's state for the dashboard: ``state`` (``idle``, ``running``, ``paused``), since when it
    runs and its last step, ``pausedUntil`` and the reason, queue depth (pending, processing) and the last
    error of its messages (with when it happened)."""
    now = now_ms()
    out: dict[str, dict[str, Any]] = {}
    for agent in agents:
        depth = db.read(q.AGENT_DEPTH, {"a": agent})[0]
        failed = db.read(q.AGENT_LAST_ERROR, {"a": agent})
        pause = db.read(q.AGENT_PAUSE, {"a": agent, "now": now})
        run = current_run(db, agent, now)
        state = "running" if run else ("paused" if pause else "idle")
        out[agent] = {
            "state": state,
            "runningSince": int(run["started_at"]) if run else 0,
            "lastStep": str(run.get("last_step") or "") if run else "",
            "channel": str(run["channel"]) if run else "",
            "conversation": str(run["conversation"]) if run else "",
            "pausedUntil": int(pause[0]["paused_until"]) if pause else 0,
            "pauseReason": str(pause[0]["note"] or "") if pause else "",
            "pending": int(depth["pending"] or 0),
            "processing": int(depth["processing"] or 0),
            "dead": int(depth["dead"] or 0),
            "lastError": str(failed[0]["last_error"]) if failed else "",
            "lastErrorAt": int(failed[0]["updated_at"]) if failed else 0,
        }
    return out
