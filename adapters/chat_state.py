"""Small durable state of the channel adapters in the ``kv`` table.

- A chat's sticky default agent: ``@agent`` alone or ``/agent NAME`` sets it, ``@default`` clears it; while
  set, messages that name no agent go to it (scope ``chat_agent:<channel>``, key = the chat,
  :attr:`ChatAddress.chat`; one an earlier release stored under an empty conversation is still read).
- A channel's own cursors, such as Telegram's update offset (:func:`kv_get` / :func:`kv_set`).

Each call is one autocommit read or one short transaction, for adapters that have no transaction open; the
statements themselves are :mod:`shared.storage.kv`'s.
"""

from __future__ import annotations

from shared.chat.address import ChatAddress
from shared.storage import kv
from shared.storage.db import Database
from shared.storage.kv import Scope, scoped


def kv_get(db: Database, scope: str, key: str) -> str | None:
    """The stored value, or None."""
    return kv.get(db, scope, key)


def kv_set(db: Database, scope: str, key: str, value: str) -> None:
    """Store ``value`` (insert or replace)."""
    with db.transaction() as tx:
        kv.put(tx, scope, key, value)


def kv_delete(db: Database, scope: str, key: str) -> bool:
    """Remove a value; returns whether there was one."""
    with db.transaction() as tx:
        return kv.delete(tx, scope, key) > 0


def sticky_agent(db: Database, chat: ChatAddress) -> str | None:
    """The chat's default agent or team, or None when messages follow the normal routing."""
    scope = scoped(Scope.CHAT_AGENT, chat.channel)
    found = kv_get(db, scope, chat.chat)
    if found is None and chat.earlier_chat is not None:
        found = kv_get(db, scope, chat.earlier_chat)
    return found


def set_sticky_agent(db: Database, chat: ChatAddress, agent: str) -> None:
    """Make ``agent`` (an agent or team name, already validated) the chat's default."""
    kv_set(db, scoped(Scope.CHAT_AGENT, chat.channel), chat.chat, agent)


def clear_sticky_agent(db: Database, chat: ChatAddress) -> bool:
    """Go back to normal routing in this chat (also a default an earlier release stored under its empty
    conversation); returns whether a default was set."""
    scope = scoped(Scope.CHAT_AGENT, chat.channel)
    cleared = kv_delete(db, scope, chat.chat)
    if chat.earlier_chat is not None:
        cleared = kv_delete(db, scope, chat.earlier_chat) or cleared
    return cleared
