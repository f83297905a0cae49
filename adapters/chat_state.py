"""Small durable state of the channel adapters in the ``kv`` table.

- A chat's sticky default agent: ``@agent`` alone or ``/agent NAME`` sets it, ``@default`` clears it; while
  set, messages that name no agent go to it (scope ``chat_agent:<channel>``, key = the conversation).
- A channel's own cursors, such as Telegram's update offset (:func:`kv_get` / :func:`kv_set`).
"""

from __future__ import annotations

from shared.clock import now_ms
from shared.db import Database


def kv_get(db: Database, scope: str, key: str) -> str | None:
    """The stored value, or None."""
    value = db.read_scalar("SELECT value FROM kv WHERE scope = :s AND key = :k", {"s": scope, "k": key})
    return None if value is None else str(value)


def kv_set(db: Database, scope: str, key: str, value: str) -> None:
    """Store ``value`` (insert or replace)."""
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO kv (scope, key, value, updated_at) VALUES (:s, :k, :v, :now) "
            "ON CONFLICT (scope, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            {"s": scope, "k": key, "v": value, "now": now_ms()},
        )


def kv_delete(db: Database, scope: str, key: str) -> bool:
    """Remove a value; returns whether there was one."""
    with db.transaction() as tx:
        n = tx.execute("DELETE FROM kv WHERE scope = :s AND key = :k", {"s": scope, "k": key}).rowcount
    return bool(n)


def _scope(channel: str) -> str:
    return f"chat_agent:{channel}"


def sticky_agent(db: Database, channel: str, conversation: str) -> str | None:
    """The chat's default agent or team, or None when messages follow the normal routing."""
    return kv_get(db, _scope(channel), conversation)


def set_sticky_agent(db: Database, channel: str, conversation: str, agent: str) -> None:
    """Make ``agent`` (an agent or team name, already validated) the chat's default."""
    kv_set(db, _scope(channel), conversation, agent)


def clear_sticky_agent(db: Database, channel: str, conversation: str) -> bool:
    """Go back to normal routing in this chat; returns whether a default was set."""
    return kv_delete(db, _scope(channel), conversation)
