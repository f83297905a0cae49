"""Where a chat channel left off: the newest platform message id it has taken in, per chat, kept durably.

Discord's gateway replays nothing to a fresh session, so a message sent while the adapter was down is seen
only if the adapter asks for the history of that chat after the last message it took in. These records say
which chats to ask and from where. Rows live in ``kv`` (scope ``cursor:<channel>``, key = the chat
(:attr:`ChatAddress.chat`), value = the message id zero-padded to 20 digits, then ``|`` and a free-form note
such as the guild id), so comparing two values as text compares the ids, and a record only ever moves forward
— also when two messages of one chat are handled out of order. When a late message was sent is read by
:mod:`shared.reads.late_messages`.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.chat.address import ChatAddress
from shared.storage import kv
from shared.storage.db import Database, Tx
from shared.storage.kv import Scope, scoped

_WIDTH = 20


@dataclass(frozen=True)
class Cursor:
    """The newest message id taken in from one chat, with its note, and when it was recorded (ms)."""

    conversation: str
    last_id: int
    note: str
    updated_at: int


def note_seen(db: Database, chat: ChatAddress, message_id: int, note: str = "") -> None:
    """Record that ``message_id`` of ``chat`` was taken in (kept only if newer than the record)."""
    with db.transaction() as tx:
        note_seen_in(tx, chat, message_id, note)


def note_seen_in(tx: Tx, chat: ChatAddress, message_id: int, note: str = "") -> None:
    """:func:`note_seen` inside the caller's transaction (the one that takes the message in)."""
    if message_id < 0 or len(str(message_id)) > _WIDTH:
        raise ValueError(f"message id {message_id} does not fit a cursor")
    value = f"{message_id:0{_WIDTH}d}|{note}"
    kv.put_max(tx, scoped(Scope.CURSOR, chat.channel), chat.chat, value)


def cursors(db: Database, channel: str) -> list[Cursor]:
    """Every chat of ``channel`` with a record, by chat."""
    found = []
    for e in kv.entries(db, scoped(Scope.CURSOR, channel)):
        digits, _, note = e.value.partition("|")
        if digits.isdigit():
            found.append(Cursor(e.key, int(digits), note, e.updated_at))
    return found
