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
from typing import Any

from shared.chat.address import ChatAddress
from shared.clock import now_ms
from shared.reads.conversation_status import conversation_status, current_run
from shared.storage.db import Database
from shared.storage.queries import conversations as q
from shared.storage.statuses import MessageStatus

#: Channels whose messages are the system's own (not chats a person has with an agent).
HIDDEN_CHANNELS = ("chatroom",)


def list_conversations(db: Database, *, limit: int = 50) -> list[dict[str, Any]]:
    """The most recently active chats, newest first: channel, chat key, who wrote, the agent, the last
    message (a user's or a reply's), its time, how many messages, and what is going on (``working``,
    ``waiting``, ``failed`` when its latest message is a dead letter, else ``idle``)."""
    limit = max(1, min(limit, 500))
    hidden = {f"h{n}": c for n, c in enumerate(HIDDEN_CHANNELS)}
    chats = db.read(q.recent_chats(len(HIDDEN_CHANNELS)), {"l": limit, **hidden})
    out: list[dict[str, Any]] = []
    for chat in chats:
        last = db.read(q.LAST_MESSAGE, {"i": chat["last_id"]})
        if not last:
            continue
        row = last[0]
        reply = db.read(q.LAST_REPLY, {"c": chat["channel"], "v": chat["chat"]})
        text, at, by = str(row["message"]), int(row["created_at"]), str(row["sender"] or row["sender_id"])
        if reply and int(reply[0]["created_at"]) >= at:
            text, at, by = str(reply[0]["message"]), int(reply[0]["created_at"]), str(reply[0]["agent"])
        if int(chat["busy"] or 0):
            state = "working"
        elif int(chat["waiting"] or 0):
            state = "waiting"
        elif row["status"] == MessageStatus.DEAD:
            state = "failed"
        else:
            state = "idle"
        out.append(
            {
                "channel": str(chat["channel"]),
                "conversation": str(chat["chat"]),
                "sender": str(row["sender"] or ""),
                "senderId": str(row["sender_id"] or ""),
                "agent": str(row["agent"]),
                "lastMessage": text[:300],
                "lastFrom": by,
                "lastAt": at,
                "messages": int(chat["n"]),
                "state": state,
            }
        )
    return out


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
