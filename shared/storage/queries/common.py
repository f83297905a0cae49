"""Pieces several statements share."""

from __future__ import annotations

from shared.storage.statuses import MessageStatus

#: A message row's chat: the conversation, else the sender id, else the sender. The same rule as
#: :attr:`shared.chat.address.ChatAddress.chat`, which the queue groups a run's messages by.
CHAT_KEY = (
    "(CASE WHEN conversation <> '' THEN conversation WHEN sender_id <> '' THEN sender_id ELSE sender END)"
)


def chat_key_of(alias: str) -> str:
    """:data:`CHAT_KEY` of the row named ``alias`` (in a query over ``messages`` twice)."""
    a = alias
    return (
        f"(CASE WHEN {a}.conversation <> '' THEN {a}.conversation WHEN {a}.sender_id <> '' THEN {a}.sender_id "
        f"ELSE {a}.sender END)"
    )


PENDING = f"'{MessageStatus.PENDING}'"
PROCESSING = f"'{MessageStatus.PROCESSING}'"
#: ``status IN (...)`` of a message still to be answered.
OPEN = f"({PENDING}, {PROCESSING})"
