"""Where a message came from and where its reply goes: one immutable type from inbound message to send.

A chat is named by its channel and the first of *conversation*, *sender id*, *sender* that is set — a
platform's chat id when it has one, else the user. That rule lives in :attr:`ChatAddress.chat` (and its SQL
form :data:`shared.storage.queries.common.CHAT_KEY`) and nowhere else: the queue groups a run's messages by it, delivery keeps a chat's
replies in order by it, rate-limit notices and handoffs address the chat through it, and every row kept per
chat (busy policy, sticky agent, the agents that answered, cursors, run status) is keyed by it
(:attr:`ChatAddress.row_key` where one table holds every channel's chats).

Earlier releases keyed the per-chat ``kv`` rows by the conversation alone, also when it was empty; such a
row is still read for a chat without a conversation (:attr:`ChatAddress.earlier_chat`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class ChatAddress(NamedTuple):
    """A chat on a channel, and who in it (for a reply by sender id alone).

    Immutable; a named tuple rather than a frozen dataclass because every message builds one on the hot path
    and a tuple is built at a third of the cost (``_replace`` gives a changed copy)."""

    channel: str
    sender: str = ""
    sender_id: str = ""
    #: The platform's chat id. A platform with topics inside a chat appends ``:<topic>`` (Telegram forums).
    conversation: str = ""

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> ChatAddress:
        """The address held by a message or response row, an origin record or a request body (missing or
        ``None`` fields read as empty)."""
        return cls(
            channel=str(fields.get("channel") or ""),
            sender=str(fields.get("sender") or ""),
            sender_id=str(fields.get("sender_id") or ""),
            conversation=str(fields.get("conversation") or ""),
        )

    @property
    def chat(self) -> str:
        """The chat within the channel: the conversation, else the sender id, else the sender."""
        return self.conversation or self.sender_id or self.sender

    @property
    def key(self) -> tuple[str, str]:
        """Messages with the same key belong to one chat (one run answers them; replies keep their order)."""
        return (self.channel, self.chat)

    @property
    def row_key(self) -> str:
        """``channel:chat``: the key of a row kept per chat in a table or ``kv`` scope shared by every channel
        (busy policy, agents that answered, sessions); also what ``/stop`` requests and people see."""
        return f"{self.channel}:{self.chat}"

    @property
    def label(self) -> str:
        """``channel:chat``, the form people and logs see (the same string as :attr:`row_key`)."""
        return self.row_key

    @property
    def earlier_chat(self) -> str | None:
        """The chat as rows written by earlier releases named it, when that differs from :attr:`chat`: those keyed a
        chat's ``kv`` rows by the conversation alone, so a chat without one wrote under the empty string.
        ``None`` when both rules agree (a chat with a conversation). A read that finds no row under
        :attr:`chat` tries this one."""
        return "" if not self.conversation and self.chat else None

    @property
    def earlier_row_key(self) -> str | None:
        """:attr:`row_key` as earlier releases wrote it, when that differs (see :attr:`earlier_chat`)."""
        return None if self.earlier_chat is None else f"{self.channel}:{self.earlier_chat}"

    @property
    def thread(self) -> str:
        """The topic inside the chat, for platforms that write ``chat:topic`` (else empty)."""
        return self.conversation.partition(":")[2]

    def fields(self) -> dict[str, str]:
        """The routing fields as a message or response row stores them."""
        return {
            "channel": self.channel,
            "sender": self.sender,
            "sender_id": self.sender_id,
            "conversation": self.conversation,
        }
