"""Pieces several statements share."""

from __future__ import annotations

from shared.storage.statuses import MessageStatus

#: A message row's chat: the conversation, else the sender id, else the sender. The same rule as
#: :attr:`shared.chat.address.ChatAddress.chat`, which the queue groups a run's messages by.
CHAT_KEY = (
    "(CASE WHEN conversation <> '' THEN conversation WHEN sender_id <> '' THEN sender_id ELSE sender END)"
)

PENDING = f"'{MessageStatus.PENDING}'"
PROCESSING = f"'{MessageStatus.PROCESSING}'"
#: ``status IN (...)`` of a message still to be answered.
OPEN = f"({PENDING}, {PROCESSING})"
