"""A chat's sticky default agent, kept in the ``kv`` table (scope ``chat_agent:<channel>``, key = the chat,
:attr:`ChatAddress.chat`; value = the agent or team name).

``@agent`` alone or ``/agent NAME`` sets it, ``@default`` clears it; while set, messages of the chat that name
no agent go to it (:mod:`adapters.chat_commands`). A default an earlier release stored under the chat's empty
conversation (:attr:`ChatAddress.earlier_chat`) is still read, and cleared with the chat's own.

Each call is one autocommit read or short transactions of its own: the channel adapters call these with no
transaction open.
"""

from __future__ import annotations

from shared.chat.address import ChatAddress
from shared.storage import kv
from shared.storage.db import Database
from shared.storage.kv import Scope, scoped


def sticky_agent(db: Database, chat: ChatAddress) -> str | None:
    """The chat's default agent or team, or None when messages follow the normal routing."""
    scope = scoped(Scope.CHAT_AGENT, chat.channel)
    found = kv.get(db, scope, chat.chat)
    if found is None and chat.earlier_chat is not None:
        found = kv.get(db, scope, chat.earlier_chat)
    return found


def set_sticky_agent(db: Database, chat: ChatAddress, agent: str) -> None:
    """Make ``agent`` (an agent or team name, already validated) the chat's default."""
    with db.transaction() as tx:
        kv.put(tx, scoped(Scope.CHAT_AGENT, chat.channel), chat.chat, agent)


def clear_sticky_agent(db: Database, chat: ChatAddress) -> bool:
    """Go back to normal routing in this chat (also a default an earlier release stored under its empty
    conversation); returns whether a default was set."""
    scope = scoped(Scope.CHAT_AGENT, chat.channel)
    with db.transaction() as tx:
        cleared = kv.delete(tx, scope, chat.chat) > 0
    if chat.earlier_chat is not None:
        # Its own transaction, as it always was: each delete stands alone, and a clear cut short between
        # the two is finished by the next ``@default``.
        with db.transaction() as tx:
            cleared = kv.delete(tx, scope, chat.earlier_chat) > 0 or cleared
    return cleared
